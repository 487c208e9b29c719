//! A root host makes its worker's user namespace owned by the worker's own uid, through
//! children of its keeper that live in that namespace for a moment, and init lives there. A
//! process of that uid in the machine's namespace (only root can start one) may signal them
//! (it owns the namespace), so it can stop them. The keeper never waits for its children
//! without a limit: for the child that makes init 5 s, for init to start the worker 20 s,
//! and then it kills what it made. The spawn ends, with nothing of the attempt left.
//!
//! Alone in its binary: it predicts the uid of the next `Host` this process makes (they are
//! handed out in turn), which another test's spawn in between would take.

use std::time::Duration;

use airlock_host::{Host, HostConfig};
use airlock_tests::e2e::{attack_bin, children_left_after, the_keeper_gave_up_on_init};

/// The processes on the machine with `uid` as any of their uids (real, effective, saved or
/// filesystem: the child that makes the namespace has it only as its effective one).
fn processes_of(uid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
                status
                    .lines()
                    .find(|l| l.starts_with("Uid:"))
                    .is_some_and(|l| l.split_whitespace().skip(1).any(|u| u == uid.to_string()))
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_of_the_workers_uid_stopping_its_namespace_cannot_hang_the_spawn() {
    if !rustix::process::geteuid().is_root() {
        println!(
            "SKIPPED a_process_of_the_workers_uid_stopping_its_namespace_cannot_hang_the_spawn: \
             an unprivileged host's workers run as its own uid"
        );
        return;
    }
    let first = Host::builder(attack_bin()).spawn().await.unwrap();
    let uid = first.worker_info().confinement.uid;
    first.shutdown().await;
    assert!(airlock_host::WORKER_UIDS.contains(&uid), "{uid}");
    // The next host's uid, and a process of it that stops everything it may signal.
    let next = uid + 1;
    let mut stopper = std::process::Command::new("setpriv")
        .arg(format!("--reuid={next}"))
        .args(["--regid=65534", "--clear-groups", "sh", "-c"])
        .arg("while :; do kill -STOP -1 2>/dev/null; done")
        .current_dir("/")
        .spawn()
        .expect("setpriv (util-linux)");
    let started = std::time::Instant::now();
    let spawned = tokio::time::timeout(
        Duration::from_secs(60),
        Host::builder(attack_bin())
            .protocol(
                HostConfig::default()
                    .handshake_timeout(Duration::from_secs(3))
                    .unwrap(),
            )
            .spawn(),
    )
    .await;
    let took = started.elapsed();
    let _ = stopper.kill();
    let _ = stopper.wait();
    let spawned = spawned.expect("the spawn must end, not wait on a stopped child");
    // Live: the stopper held the new worker's namespace (its maker, init or the worker), so
    // the spawn failed; one that succeeded would prove nothing.
    assert!(
        spawned.is_err(),
        "the stopper must have stopped the spawn, or this test proves nothing"
    );
    assert!(took < Duration::from_secs(28), "the spawn took {took:?}");
    if took > Duration::from_secs(10) {
        // Init was stopped once the keeper knew it: the keeper gave up on it, and said so.
        assert!(the_keeper_gave_up_on_init(&spawned), "{spawned:?}");
    }
    // Nothing of the attempt is left: no process of the worker's uid but what ends with it.
    let mut left = processes_of(next);
    for _ in 0..100 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = processes_of(next);
    }
    assert!(left.is_empty(), "processes of uid {next} left: {left:?}");
    // Nor a keeper waiting on an init stopped while it was still root (so not of that uid).
    let children = children_left_after(Duration::from_secs(5)).await;
    assert!(
        children.is_empty(),
        "children of the host left: {children:?}"
    );
}
