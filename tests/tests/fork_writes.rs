//! A host used in a process forked from its own, whose write has to wait for room there,
//! leaves its parent's runtime whole: nothing the child does registers a descriptor with the
//! event loop (the `epoll` instance) the two processes share.
//!
//! A registration the child made would carry a token that points into the child's memory;
//! once the child is gone the parent's runtime would be handed events with that token and
//! follow it (a review found the parent crashing or hanging in 10 of 11 runs when pipe
//! writers registered only once full). A pipe writer is registered when it is made, before
//! any fork; a socket writer, registered only while its buffer is full, refuses to register
//! in a process other than the one that made it, and its write fails there instead.
//!
//! Its own test binary, with one test: `fork` in a process whose other threads run tests could
//! copy a lock one of them holds. `fork` has no safe wrapper here: this file allows `unsafe`
//! for it alone.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use airlock_host::{Host, TransportChoice};
use airlock_test_support::child::wait_for_forked;
use airlock_tests::e2e::worker_bin;
use airlock_tests::support::current_thread_runtime;
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

/// Larger than any pipe or socket buffer the host sets up: its write has to wait for room.
const MORE_THAN_A_BUFFER: usize = 16 << 20;

/// The child begins a call whose request the channel cannot take at once, lets its runtime
/// turn a few times (the write waits for room) and leaves with `_exit`; the parent then drives
/// its own runtime and makes a call. The parent must get that call's outcome, whatever it is
/// (the child's partial frame has broken the stream the two shared), within its deadline.
fn a_forked_child_waiting_for_room_leaves_the_parents_runtime_whole(transport: TransportChoice) {
    let runtime = current_thread_runtime();
    let host = runtime
        .block_on(
            Host::builder(worker_bin())
                .transport(transport)
                .send_timeout(Duration::from_secs(2))
                .protocol(
                    airlock_host::HostConfig::default()
                        .max_frame(MORE_THAN_A_BUFFER as u32 + 4096)
                        .unwrap(),
                )
                .spawn(),
        )
        .unwrap();
    let small = ByteBuf::from(b"before the fork".to_vec());
    let deadline = Instant::now() + Duration::from_secs(5);
    assert_eq!(
        runtime.block_on(host.call_with_deadline::<Echo>(&small, deadline)),
        Ok(small.clone())
    );

    // SAFETY: the child only drives this thread's current-thread runtime for a few turns and
    // leaves with `_exit`; glibc's malloc is fork-safe, and this binary runs no other test
    // whose threads could hold a lock.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(async {
                let host = host.clone();
                let big = ByteBuf::from(vec![1u8; MORE_THAN_A_BUFFER]);
                let _call = tokio::spawn(async move {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    host.call_with_deadline::<Echo>(&big, deadline).await
                });
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
            });
            0
        }))
        .unwrap_or(2);
        // SAFETY: ends the forked child without running the parent's destructors or atexit
        // handlers (the worker is the parent's to shut down).
        unsafe { libc::_exit(code) };
    }
    assert_eq!(
        wait_for_forked(pid, Duration::from_secs(30), "the forked host's turns"),
        Some(0)
    );

    // A runtime handed the child's events crashes this process or never comes back: the
    // watchdog turns a hang into a failure.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(60);
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if Instant::now() > until {
                    eprintln!("the parent's runtime hung after its forked child left");
                    std::process::abort();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(300)).await });
    let began = Instant::now();
    let deadline = began + Duration::from_secs(2);
    let outcome = runtime
        .block_on(host.call_with_deadline::<Echo>(&ByteBuf::from(vec![2u8; 4 << 20]), deadline));
    // Any outcome will do (the stream the child broke may have cost the worker), so long as
    // it came by the deadline and the send deadline after it.
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "the parent's call took {:?}: {:?}",
        began.elapsed(),
        outcome.map(|body| body.len())
    );
    runtime.block_on(host.shutdown());
    done.store(true, std::sync::atomic::Ordering::Release);
    watchdog.join().unwrap();
}

#[test]
fn a_forked_child_waiting_for_room_leaves_the_parents_runtime_whole_on_either_transport() {
    a_forked_child_waiting_for_room_leaves_the_parents_runtime_whole(TransportChoice::Pipe);
    a_forked_child_waiting_for_room_leaves_the_parents_runtime_whole(
        TransportChoice::SocketInherited,
    );
}
