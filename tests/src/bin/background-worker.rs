//! `background-worker [--runtime-wait]`: a worker served by `Worker::serve_blocking` whose
//! handler leaves a task of its own running on the serving runtime after its call is answered.
//! The idle-wait tests use it to show that such a task is not held up while the worker waits
//! for the host. It asks to wait in the OS while idle (`Worker::idle_wait_in_os`) unless
//! `--runtime-wait` is given.
//!
//! Its methods are `airlock_tests::background`'s.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use airlock_tests::background::{BackgroundDone, StartBackground};
use airlock_worker::Worker;

static DONE: AtomicBool = AtomicBool::new(false);

fn main() -> ExitCode {
    let in_os = !std::env::args().skip(1).any(|arg| arg == "--runtime-wait");
    let worker = Worker::new()
        .idle_wait_in_os(in_os)
        .method::<StartBackground, _, _>(|millis| async move {
            DONE.store(false, Ordering::SeqCst);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(millis)).await;
                DONE.store(true, Ordering::SeqCst);
            });
            Ok(())
        })
        .method::<BackgroundDone, _, _>(|()| async { Ok(DONE.load(Ordering::SeqCst)) });
    match worker.serve_blocking() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("background-worker: {err}");
            ExitCode::FAILURE
        }
    }
}
