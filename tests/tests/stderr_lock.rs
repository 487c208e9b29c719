//! A worker's stderr is a pipe, and a worker can hold a pipe's lock in the kernel (a `splice`
//! from an empty socket into it, where no filter refuses it) or make a copy into it last
//! seconds (SECURITY.md); a read of the pipe waits for that lock. The host reads a worker's
//! stderr on a thread of its own, so only that thread waits: the runtime, every deadline and
//! the next call go on, even on a current-thread runtime.

use std::time::Duration;

use airlock_host::{CallError, Confinement, Host};
use airlock_tests::e2e::{rogue_bin, rogue_struck, soon, within, RogueEcho, ScratchDir};
use airlock_tests::support::current_thread_runtime;

/// What the rogue marked after trying to hold its stderr (`armed` just before a `splice` that
/// would hold a pipe's lock, or why it could not make one) and what the next call, due in
/// 1.5 s, heard, on a current-thread runtime with the worker unconfined (nothing refuses its
/// `splice`). Run on a thread of its own and given up after 20 s: a host stuck in the kernel
/// never returns.
fn next_call_after_a_stderr_hold() -> Option<(String, Result<u64, CallError>)> {
    within(Duration::from_secs(20), || {
        let runtime = current_thread_runtime();
        let dir = ScratchDir::new("stderr-lock");
        let mark = dir.join("mark");
        runtime.block_on(async {
            let unconfined = Host::builder(rogue_bin()).confinement(Confinement::none());
            let (host, marked) =
                rogue_struck(unconfined, "hold_stderr_lock", &mark, "unix_stream_read").await;
            // Time for the relay to meet the held lock.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let next = host.call_with_deadline::<RogueEcho>(&2, soon(1500)).await;
            host.shutdown().await;
            (marked, next)
        })
    })
}

/// The hold is live: a read of a pipe sleeps while a `splice` holds its lock (shown on a pipe
/// of this test's own), and the unconfined rogue makes that splice into its stderr pipe and
/// sleeps in it. The host's relay meets the lock on its own thread: the next call, due in
/// 1.5 s on a current-thread runtime, is answered. With the relay a task on the runtime's
/// thread, the host slept behind the lock for good and this test gave up after 20 s.
#[test]
fn a_worker_cannot_hold_its_stderr_against_the_hosts_relay() {
    assert!(
        a_splice_holds_a_pipe_against_its_reader(),
        "the attack is not live: a read of the pipe went through"
    );
    let (marked, next) =
        next_call_after_a_stderr_hold().expect("the host hung behind the worker's stderr");
    assert_eq!(marked, "armed", "the attack is not live: {marked}");
    assert_eq!(next, Ok(2));
}

/// Whether a non-blocking read of a pipe with data in it still sleeps while a `splice` from an
/// empty socket into the pipe waits: the read is made on a thread of its own and is still
/// asleep after a second.
fn a_splice_holds_a_pipe_against_its_reader() -> bool {
    use std::os::fd::AsFd;
    // The read end alone non-blocking: a `splice` into a non-blocking pipe does not wait.
    let (read, write) = rustix::pipe::pipe().expect("pipe");
    rustix::fs::fcntl_setfl(&read, rustix::fs::OFlags::NONBLOCK).expect("non-blocking read end");
    rustix::io::write(&write, b"x").expect("a byte in the pipe");
    let (empty, _peer) = std::os::unix::net::UnixStream::pair().expect("socket pair");
    // Holds the pipe's lock until `_peer` or the socket is closed: never, here, until the
    // test process ends, which is the point.
    std::thread::spawn(move || {
        let _ = rustix::pipe::splice(
            empty.as_fd(),
            None,
            write.as_fd(),
            None,
            1,
            rustix::pipe::SpliceFlags::empty(),
        );
        drop((empty, write));
    });
    std::thread::sleep(Duration::from_millis(200));
    let (done, read_ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = rustix::io::read(&read, &mut [0u8; 8]);
        let _ = done.send(());
    });
    let held = read_ended.recv_timeout(Duration::from_secs(1)).is_err();
    std::mem::forget(_peer);
    held
}
