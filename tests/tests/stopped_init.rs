//! The keeper waits at most 20 s for the sandbox's init to start the worker. An init stopped
//! once the keeper knows its pid (by a process of the worker's uid, which owns a root host's
//! worker namespace; here by this test, which finds init among its descendants, to make the
//! stop certain) holds the spawn no longer than that: the keeper kills it, the spawn fails
//! saying why, and nothing of it is left.
//!
//! Alone in its binary: it finds init among every descendant of this process.

use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use airlock_host::{Confinement, Host};
use airlock_tests::e2e::{
    attack_bin, children_left_after, children_of_this_process, the_keeper_gave_up_on_init,
    ScratchDir,
};

/// A process whose pid in its own PID namespace is 1: a sandbox's init.
fn is_a_namespace_init(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status.lines().any(|line| {
            line.strip_prefix("NSpid:").is_some_and(|pids| {
                let pids: Vec<&str> = pids.split_whitespace().collect();
                pids.len() > 1 && pids.last() == Some(&"1")
            })
        })
    })
}

/// Stops the first init that appears among the children of this process's children (the
/// keepers'), within `limit`: a pidfd of it, which names that process and no other once it
/// has been reaped and its pid reused.
fn stop_the_next_init(limit: Duration) -> Option<OwnedFd> {
    use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
    let until = Instant::now() + limit;
    while Instant::now() < until {
        for keeper in children_of_this_process() {
            let children =
                std::fs::read_to_string(format!("/proc/{keeper}/task/{keeper}/children"))
                    .unwrap_or_default();
            for child in children.split_whitespace().filter_map(|p| p.parse().ok()) {
                let Some(pidfd) =
                    Pid::from_raw(child).and_then(|pid| pidfd_open(pid, PidfdFlags::empty()).ok())
                else {
                    continue;
                };
                // Checked once the pidfd is held: the pid still names the process it opened.
                if is_a_namespace_init(child as u32)
                    && pidfd_send_signal(&pidfd, Signal::STOP).is_ok()
                {
                    return Some(pidfd);
                }
            }
        }
    }
    None
}

/// Whether the process `pidfd` names has ended (a pidfd polls readable then).
fn has_ended(pidfd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&now)).is_ok_and(|ready| ready == 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_stopped_before_it_starts_the_worker_is_ended_by_its_keeper() {
    // Many grants: init copies and mounts each before it starts the worker, which leaves the
    // stopper far more time than it needs to find init.
    let scratch = ScratchDir::new("stopped-init");
    let mut policy = Confinement::strict();
    for i in 0..200 {
        let path = scratch.join(format!("grant-{i}"));
        std::fs::write(&path, b"granted").unwrap();
        policy = policy.read_only(path);
    }
    let stopper = std::thread::spawn(|| stop_the_next_init(Duration::from_secs(10)));
    let started = Instant::now();
    let spawned = tokio::time::timeout(
        Duration::from_secs(60),
        Host::builder(attack_bin()).confinement(policy).spawn(),
    )
    .await
    .expect("the spawn must end, not wait on a stopped init");
    let took = started.elapsed();
    let stopped = stopper.join().unwrap();
    // Live: init was stopped before it started the worker, or the spawn would have succeeded.
    assert!(stopped.is_some(), "no init was found to stop");
    assert!(the_keeper_gave_up_on_init(&spawned), "{spawned:?}");
    assert!(
        took >= Duration::from_secs(19) && took < Duration::from_secs(28),
        "the keeper gives init 20 s: the spawn took {took:?}"
    );
    // Nothing is left: not the stopped init, not its keeper.
    let left = children_left_after(Duration::from_secs(5)).await;
    assert!(left.is_empty(), "children of the host left: {left:?}");
    let init = stopped.unwrap();
    assert!(has_ended(&init), "the stopped init is still there");
}
