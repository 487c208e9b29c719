//! The runtime the end-to-end tests drive their hosts on, where a test needs one of its own.

/// A current-thread tokio runtime with I/O and timers: one thread, so a test decides when the
/// host's tasks run (a `block_on` drives them; between two, nothing does).
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds")
}
