//! A host used in a process forked from its own keeps its calls' deadlines there: whatever
//! keeps the supervisor's timer must come with the fork (a timer kept by a thread of the
//! parent, for one, would not).
//!
//! Its own test binary, with one test: `fork` in a process whose other threads run tests could
//! copy a lock one of them holds.
//!
//! `fork` has no safe wrapper here: this file allows `unsafe` for it alone.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use airlock_host::{CallError, Host};
use airlock_test_support::child::wait_for_forked;
use airlock_tests::e2e::worker_bin;
use airlock_tests::support::current_thread_runtime;
use airlock_worker::builtin::{Echo, Sleep};
use serde_bytes::ByteBuf;

/// The outcome of a call the child awaited, as its exit code: 0 timed out, 1 anything else,
/// 2 a panic, 3 still running 10 s on (it hung past its deadline).
fn exit_code<T>(outcome: Result<Result<T, CallError>, tokio::time::error::Elapsed>) -> i32 {
    match outcome {
        Ok(Err(CallError::Timeout)) => 0,
        Ok(_) => 1,
        Err(_) => 3,
    }
}

/// Forks; the child runs `child` (its exit code) and leaves with `_exit`. Returns the child's
/// exit code.
fn in_forked_child(child: impl FnOnce() -> i32) -> Option<i32> {
    // SAFETY: the child only drives the test thread's current-thread runtime (its supervisor
    // task included) for one call under a timeout, and leaves with `_exit`; glibc's malloc is
    // fork-safe, and this binary runs no other test whose threads could hold a lock.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(2);
        // SAFETY: ends the forked child without running the parent's destructors or atexit
        // handlers (the worker is the parent's to shut down).
        unsafe { libc::_exit(code) };
    }
    wait_for_forked(pid, Duration::from_secs(30), "the forked host's call")
}

#[test]
fn a_host_used_in_a_forked_child_still_times_out_its_calls() {
    let runtime = current_thread_runtime();

    // 1. A new call in the child, with a deadline later than the one the supervisor's timer
    // was left armed for in the parent: the call cannot wake the supervisor by being earlier.
    let host = runtime
        .block_on(Host::builder(worker_bin()).spawn())
        .unwrap();
    // Room for the echo on a loaded machine; the child's call below waits this long too.
    let soon = Instant::now() + Duration::from_secs(2);
    let request = ByteBuf::from(b"before the fork".to_vec());
    let answer = runtime.block_on(host.call_with_deadline::<Echo>(&request, soon));
    assert_eq!(answer, Ok(request));
    let code = in_forked_child(|| {
        let deadline = soon + Duration::from_millis(500);
        exit_code(runtime.block_on(async {
            tokio::time::timeout(
                Duration::from_secs(10),
                host.call_with_deadline::<Sleep>(&60_000, deadline),
            )
            .await
        }))
    });
    assert_eq!(code, Some(0), "a new call in the child (3: it hung)");
    runtime.block_on(host.shutdown());

    // 2. A call in flight across the fork, awaited in the child, and in the parent after it.
    let host = runtime
        .block_on(Host::builder(worker_bin()).spawn())
        .unwrap();
    let deadline = Instant::now() + Duration::from_millis(800);
    let caller = host.clone();
    let mut call =
        runtime.spawn(async move { caller.call_with_deadline::<Sleep>(&60_000, deadline).await });
    // In flight by the fork (or, on a machine stalled past the deadline, already over: the
    // child and the parent then both find its timeout at once).
    runtime.block_on(async {
        while host.in_flight() == 0 && !call.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let in_child = in_forked_child(|| {
        exit_code(runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), &mut call)
                .await
                .map(|joined| joined.expect("the call's task"))
        }))
    });
    assert_eq!(
        in_child,
        Some(0),
        "the call in flight, in the child (3: it hung)"
    );
    let in_parent = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .map(|joined| joined.expect("the call's task"))
    });
    assert_eq!(exit_code(in_parent), 0, "the call in flight, in the parent");
    runtime.block_on(host.shutdown());
}
