//! The bundled worker: serves the built-in methods (see `airlock_worker::builtin`) over the
//! transport its host set up.

fn main() -> std::process::ExitCode {
    match airlock_worker::builtin::builtin_worker().serve_blocking() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("airlock-worker: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
