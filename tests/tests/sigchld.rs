//! A host whose process ignores `SIGCHLD` refuses to spawn workers.
//!
//! Its own test binary: the signal disposition is process-wide, and every other test needs the
//! default one.

#![allow(unsafe_code)] // sigaction: no safe wrapper sets a signal's disposition

use std::time::{Duration, Instant};

use airlock_host::{Host, SpawnError};
use airlock_tests::e2e::{process_alive, worker_bin};

/// Sets SIGCHLD's disposition for this whole process.
fn set_sigchld(handler: libc::sighandler_t) {
    // SAFETY: installs SIG_IGN or SIG_DFL, neither of which runs code in this process; the
    // struct is fully initialised (zeroed, then the handler set) before the call.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = handler;
        assert_eq!(
            libc::sigaction(libc::SIGCHLD, &action, std::ptr::null_mut()),
            0
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_host_that_ignores_sigchld_refuses_to_spawn() {
    set_sigchld(libc::SIG_IGN);

    // Live: with SIGCHLD ignored, the kernel reaps a child the moment it exits. Its pid is
    // free again while its parent still holds the number, and `wait` has nothing to report.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let give_up = Instant::now() + Duration::from_secs(5);
    while process_alive(pid) && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        std::fs::metadata(format!("/proc/{pid}")).is_err(),
        "the exited child was not reaped by the kernel"
    );
    assert!(child.wait().is_err(), "wait found a child to report");

    // airlock refuses rather than act later on a pid that may have passed to a stranger.
    match Host::builder(worker_bin()).spawn().await {
        Err(SpawnError::ChildrenReapedByKernel) => {}
        other => panic!(
            "expected ChildrenReapedByKernel, got {:?}",
            other.map(|_| ())
        ),
    }

    // With the default disposition restored, the same host spawns.
    set_sigchld(libc::SIG_DFL);
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    host.shutdown().await;
}
