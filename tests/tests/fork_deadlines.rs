//! A host used in a process forked from its own keeps its calls' deadlines there, although
//! the thread that keeps deadlines in the parent (so its runtime parks without a timeout) did
//! not come with the fork.
//!
//! Its own test binary: `fork` in a process whose other threads run tests could copy a lock
//! one of them holds.
//!
//! `fork` has no safe wrapper here: this file allows `unsafe` for it alone.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use airlock_host::{CallError, Host};
use airlock_test_support::child::wait_for_forked;
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{Echo, Sleep};
use serde_bytes::ByteBuf;

/// A call made in the child with a deadline later than the one the parent's deadline thread
/// was keeping cannot wake the supervisor by being earlier: without the child's own timer it
/// would hang past its deadline (child exit code 3).
#[test]
fn a_host_used_in_a_forked_child_still_times_out_its_calls() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let host = runtime
        .block_on(Host::builder(worker_bin()).spawn())
        .unwrap();
    // The supervisor's timer is now armed for this call's deadline, on the deadline thread,
    // and stays there once the call is answered.
    let soon = Instant::now() + Duration::from_secs(1);
    let request = ByteBuf::from(b"before the fork".to_vec());
    let answer = runtime.block_on(host.call_with_deadline::<Echo>(&request, soon));
    assert_eq!(answer, Ok(request));

    // SAFETY: the child only drives this thread's runtime (its supervisor task included) for
    // one call under a timeout, and leaves with `_exit`; glibc's malloc is fork-safe, and this
    // binary runs no other test whose threads could hold a lock.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let deadline = soon + Duration::from_millis(500);
            let outcome = runtime.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(10),
                    host.call_with_deadline::<Sleep>(&60_000, deadline),
                )
                .await
            });
            match outcome {
                Ok(Err(CallError::Timeout)) => 0,
                Ok(_) => 1,
                // The deadline passed unseen: the call hung.
                Err(_) => 3,
            }
        })
        .unwrap_or(2);
        // SAFETY: ends the forked child without running the parent's destructors or atexit
        // handlers (the worker is the parent's to shut down).
        unsafe { libc::_exit(code) };
    }
    let code = wait_for_forked(pid, Duration::from_secs(30), "the forked host's call");
    assert_eq!(
        code,
        Some(0),
        "the forked host's call did not time out (3: it hung past its deadline)"
    );
    runtime.block_on(host.shutdown());
}
