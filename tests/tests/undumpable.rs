//! A serving `airlock-worker` is non-dumpable: another process of its own uid (a hostile
//! sibling worker, SECURITY.md's first residual) cannot list its descriptors through
//! `/proc/<pid>/fd`, and so cannot reach them to reopen. (The host's copies of the same channel are another matter; see
//! SECURITY.md.)
//!
//! The worker and the "sibling" both run as uid 65534 through `setpriv`, so the test needs
//! root to switch uids (as root, `CAP_SYS_PTRACE` would bypass the check being tested). It
//! skips with a printed reason where it cannot.

use std::process::{Command, Stdio};

use airlock_host::Host;
use airlock_tests::e2e::{call_pid, rogue_bin, worker_bin};
use airlock_tests::support::{setpriv, AS_NOBODY};
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

/// Runs `program args` as uid/gid 65534.
fn as_nobody(setpriv: &str, program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(setpriv);
    cmd.args(AS_NOBODY)
        .arg(program)
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// Can a process of uid 65534 list `pid`'s open descriptors?
fn nobody_lists_fds_of(setpriv: &str, pid: u32) -> bool {
    as_nobody(setpriv, "ls", &[&format!("/proc/{pid}/fd")])
        .status()
        .is_ok_and(|status| status.success())
}

/// A host whose worker is `program args` run as uid 65534.
async fn host_as_nobody(setpriv: &str, program: &str, args: &[&str]) -> Host {
    // setpriv changes uid itself, which no confined worker may do: this test is about the
    // worker's own non-dumpable defence, which holds unconfined too.
    let mut builder = Host::builder(setpriv).confinement(airlock_host::Confinement::none());
    for arg in AS_NOBODY.iter().chain([&program]).chain(args) {
        builder = builder.arg(*arg);
    }
    builder
        .spawn()
        .await
        .expect("the worker, run as uid 65534, completes its handshake")
}

/// The real uid of `pid`, from `/proc/<pid>/status`.
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_uid_sibling_cannot_reach_a_serving_workers_descriptors() {
    let name = "a_same_uid_sibling_cannot_reach_a_serving_workers_descriptors";
    let setpriv = match setpriv() {
        Ok(path) => path,
        Err(reason) => return println!("SKIPPED {name}: {reason}"),
    };
    let worker = worker_bin().to_string_lossy().into_owned();
    let runnable = as_nobody(setpriv, "test", &["-x", &worker]).status();
    if !runnable.as_ref().is_ok_and(|s| s.success()) {
        return println!("SKIPPED {name}: uid 65534 cannot execute {worker} ({runnable:?})");
    }

    // Live: a worker that does not harden itself (the rogue, honest here, speaking the same
    // protocol on its stdin and stdout) is open to another process of its uid. (Only listing is
    // probed: this host runs as root, so its pipes are root's, mode 0600, and reopening them
    // would fail on their permissions whatever the worker does; with the host running as the
    // workers' uid they reopen.)
    let rogue = rogue_bin().to_string_lossy().into_owned();
    let plain = host_as_nobody(setpriv, &rogue, &["honest"]).await;
    let plain_pid = call_pid(&plain).await.unwrap();
    assert_eq!(
        uid_of(plain_pid),
        Some(65534),
        "the rogue runs as uid 65534"
    );
    assert!(
        nobody_lists_fds_of(setpriv, plain_pid),
        "the probe is broken: uid 65534 could not reach a dumpable worker of its own uid"
    );
    plain.shutdown().await;

    // The airlock worker, started the same way and serving.
    let host = host_as_nobody(setpriv, &worker, &[]).await;
    let pid = call_pid(&host).await.unwrap();
    assert_eq!(uid_of(pid), Some(65534), "the worker runs as uid 65534");
    assert!(
        !nobody_lists_fds_of(setpriv, pid),
        "a process of the worker's own uid listed its descriptors through /proc/{pid}/fd"
    );
    // Still serving, of course.
    let payload = ByteBuf::from(b"undumpable".to_vec());
    assert_eq!(host.call::<Echo>(&payload).await, Ok(payload));
    host.shutdown().await;
}
