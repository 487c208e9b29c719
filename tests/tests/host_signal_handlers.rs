//! A signal handler the host installed never runs in a strict worker's keeper.
//!
//! The keeper is a fork of the host that never `exec`s, so it inherits the host's signal
//! handlers, and once only its wait is left it unmaps its copy of the host's heap. A handler
//! run there (tokio's reads its registry on the heap) would fault, and the keeper would end
//! by SIGSEGV instead of as its worker did, or take a running worker with it.
//!
//! Its own test binary: the handlers installed here are process-wide.

use std::time::{Duration, Instant};

use airlock_host::{CallError, Host, LostReason};
use airlock_tests::attack::a_call_whose_worker_is_signalled;
use airlock_tests::e2e::{attack_bin, parent_of};
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

/// True if `pid` runs a handler for `signal` (its bit in `SigCgt:` of `/proc/<pid>/status`).
fn catches(pid: u32, signal: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no SigCgt in the status of {pid}: {status}"));
    caught & (1 << (signal - 1)) != 0
}

fn cgroup_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap()
}

/// tokio handles SIGCHLD for the rest of the process's life once it holds a child that was
/// dropped before it ended (as a `Host` dropped without `shutdown` leaves its worker). The
/// keeper, told SIGCHLD when init ends, must still end as the worker did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_reports_its_workers_end_when_the_host_handles_sigchld() {
    // An orphan in tokio's queue: the runtime installs its SIGCHLD handler to reap it.
    let orphan = tokio::process::Command::new("/bin/sleep")
        .arg("1")
        .spawn()
        .unwrap();
    drop(orphan);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !catches(std::process::id(), libc::SIGCHLD) {
        assert!(
            Instant::now() < deadline,
            "tokio installed no SIGCHLD handler"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let host = Host::builder(attack_bin()).spawn().await.unwrap();
    match a_call_whose_worker_is_signalled(&host, rustix::process::Signal::KILL).await {
        Err(CallError::WorkerLost(LostReason::Exited(exit))) => {
            assert_eq!(exit.signal, Some(libc::SIGKILL), "{exit}")
        }
        other => panic!("expected the worker's exit, got {other:?}"),
    }
    host.shutdown().await;
}

/// A service manager stops a service by sending SIGTERM to every process in its cgroup (systemd's
/// default `KillMode=control-group`), the keepers included. A host that handles SIGTERM to
/// drain its calls first must find its workers still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_the_host_handles_leaves_its_workers_running() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).unwrap();
    assert!(catches(std::process::id(), libc::SIGTERM));

    let host = Host::builder(attack_bin()).spawn().await.unwrap();
    let echo = |text: &'static [u8]| {
        let host = host.clone();
        async move { host.call::<Echo>(&ByteBuf::from(text.to_vec())).await }
    };
    assert_eq!(echo(b"before").await.unwrap().as_slice(), b"before");
    let worker = host.worker_pid().unwrap();
    let keeper = parent_of(parent_of(worker));
    assert_eq!(
        parent_of(keeper),
        std::process::id(),
        "worker → init → keeper"
    );
    // The service's stop reaches the keeper: it stays in its host's cgroup.
    assert_eq!(cgroup_of(keeper), cgroup_of(std::process::id()));
    for pid in [std::process::id(), keeper] {
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).unwrap(),
            rustix::process::Signal::TERM,
        )
        .unwrap();
    }
    // The host's handler ran: the signal was delivered, and the keeper had it as well.
    tokio::time::timeout(Duration::from_secs(10), terminate.recv())
        .await
        .expect("the host received its SIGTERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    match echo(b"after").await {
        Ok(echoed) => assert_eq!(echoed.as_slice(), b"after"),
        Err(err) => panic!("the worker did not survive a SIGTERM its host handles: {err}"),
    }
    // The same worker answered, not a replacement.
    assert_eq!(host.worker_pid(), Some(worker));
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}
