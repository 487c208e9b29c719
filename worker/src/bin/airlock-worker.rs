//! The bundled worker: serves the built-in methods (see `airlock_worker::builtin`) over the
//! transport its host set up.
//!
//! One optional argument, `--max-concurrency N`, sets `Worker::max_concurrency` (default 64);
//! with 1, blocking handlers run on the serving thread. An idle worker waits for the host in
//! the OS (`Worker::idle_wait_in_os`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The built-in handlers use the runtime only from its own tasks, so an idle worker may wait
    // for the host in the OS (`Worker::idle_wait_in_os`).
    let mut worker = airlock_worker::builtin::builtin_worker().idle_wait_in_os(true);
    match args.as_slice() {
        [] => {}
        [flag, n] if flag == "--max-concurrency" => match n.parse::<usize>() {
            Ok(n) if n > 0 => worker = worker.max_concurrency(n),
            _ => {
                return usage(&format!(
                    "--max-concurrency needs a positive number, not {n:?}"
                ))
            }
        },
        _ => return usage(&format!("unexpected arguments {args:?}")),
    }
    match worker.serve_blocking() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("airlock-worker: {err}");
            ExitCode::FAILURE
        }
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("airlock-worker: {problem}; usage: airlock-worker [--max-concurrency N]");
    ExitCode::from(2)
}
