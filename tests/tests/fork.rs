//! Invariant 4 (call ids are fresh, unpredictable randomness) across a `fork` of the host process: call ids stay fresh on both sides.
//!
//! A host that keeps any generator state in memory (a buffer of OS randomness, a seeded CSPRNG)
//! has it copied by `fork`: parent and child would then send the same ids in the same order, and
//! a worker that saw the child's calls would know the parent's next ids before they were sent,
//! free to stage a `Return` for them (the predictable-id attack; `airlock-protocol`'s
//! `predictable_ids.rs` shows such a forgery landing). Any batching of OS randomness must keep
//! this test passing.
//!
//! Its own test binary: `fork` in a process whose other threads run tests could copy a lock
//! one of them holds.
//!
//! `fork` and `waitpid` have no safe wrapper here: this file allows `unsafe` for them alone.
#![allow(unsafe_code)]

use std::time::Duration;

use airlock_host::Host;
use airlock_protocol::frame::{Call, Frame};
use airlock_protocol::{decode_frame, CallId};
use airlock_test_support::child::wait_for_forked;
use airlock_test_support::hex;
use airlock_tests::e2e::{rogue_host_in, ScratchDir};
use airlock_tests::support::current_thread_runtime;
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

/// Each `Call` the worker logged, in the order it received them: (id, request text).
fn calls_received(log: &std::path::Path) -> Vec<(CallId, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|line| line.strip_prefix("< "))
        .filter_map(|digits| {
            let bytes = hex::decode(digits).expect("the rogue logs frames in hex");
            match decode_frame(&bytes) {
                Ok(Frame::Call(Call { id, body, .. })) => {
                    let text: ByteBuf =
                        airlock_codec::from_slice(body, &Default::default()).ok()?;
                    Some((id, String::from_utf8_lossy(&text).into_owned()))
                }
                _ => None,
            }
        })
        .collect()
}

fn echo(runtime: &tokio::runtime::Runtime, host: &Host, text: &str) -> bool {
    let request = ByteBuf::from(text.as_bytes().to_vec());
    runtime
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(5), host.call::<Echo>(&request)).await
        })
        .is_ok_and(|answer| answer.as_ref() == Ok(&request))
}

#[test]
fn invariant_04_ids_stay_fresh_on_both_sides_of_a_fork() {
    let dir = ScratchDir::new("fork");
    let log = dir.join("log");
    let runtime = current_thread_runtime();
    // An honest rogue that logs every frame it receives (no `ROGUE_ONCE`: it "strikes" by
    // serving honestly, which is what turns its log on).
    let host = runtime
        .block_on(
            rogue_host_in(&dir)
                .arg("honest")
                .env("ROGUE_LOG", &log)
                .spawn(),
        )
        .unwrap();
    assert!(echo(&runtime, &host, "before the fork"));

    // SAFETY: the child only drives this thread's runtime (its supervisor task included) for
    // three calls, each under a timeout, and leaves with `_exit`; glibc's malloc is fork-safe,
    // and this binary runs no other test whose threads could hold a lock.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let all_ok = (1..=3).all(|i| echo(&runtime, &host, &format!("child {i}")));
            if all_ok {
                0
            } else {
                1
            }
        })
        .unwrap_or(2);
        // SAFETY: ends the forked child without running the parent's destructors or atexit
        // handlers (the worker is the parent's to shut down).
        unsafe { libc::_exit(code) };
    }
    let code = wait_for_forked(pid, Duration::from_secs(20), "the forked host's calls");
    assert_eq!(code, Some(0), "the forked host's calls failed");
    // The child's calls are all in before the parent sends any: the worker holds their ids.
    let before_parent = calls_received(&log);
    let texts: Vec<&str> = before_parent.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(texts, ["before the fork", "child 1", "child 2", "child 3"]);

    for i in 1..=3 {
        assert!(echo(&runtime, &host, &format!("parent {i}")));
    }
    let received = calls_received(&log);
    assert_eq!(received.len(), 7, "{received:?}");
    let child_ids: Vec<CallId> = received[1..4].iter().map(|(id, _)| *id).collect();
    for (id, text) in &received[4..] {
        assert!(text.starts_with("parent"), "{text}");
        assert!(
            !child_ids.contains(id),
            "{text} went out under an id the worker had already seen from the forked child"
        );
    }
    let distinct: std::collections::HashSet<CallId> = received.iter().map(|(id, _)| *id).collect();
    assert_eq!(distinct.len(), 7, "an id repeated: {received:?}");
    runtime.block_on(host.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
}
