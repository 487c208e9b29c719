//! No zombie, no process and no descriptor is left after 200 spawn/kill cycles (and 100
//! spawn/shutdown cycles between them). Alone in its test binary, so no other test's children
//! or descriptors blur the counts.

use std::time::{Duration, Instant};

use airlock_host::{CallError, Host, HostConfig};
use airlock_tests::e2e::{call_pid, children, worker_bin};
use airlock_worker::builtin::Sleep;

fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Cycles whose worker the host SIGKILLs (a missed deadline), and cycles shut down gracefully.
const KILL_CYCLES: u32 = 200;
const GRACEFUL_CYCLES: u32 = 100;

fn is_gone(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_zombie_or_descriptor_is_left_after_200_spawn_kill_cycles() {
    // Warm up the runtime's own descriptors (epoll, signal pipe for child reaping) first.
    let warm = Host::builder(worker_bin()).spawn().await.unwrap();
    warm.shutdown().await;
    let fds_before = open_fd_count();
    let started = Instant::now();
    let mut kills = 0;
    for i in 0..KILL_CYCLES + GRACEFUL_CYCLES {
        // No cancel grace: a missed deadline kills the worker at once, which is the cycle
        // this test repeats.
        let host = Host::builder(worker_bin())
            .protocol(HostConfig::default().cancel_grace(Duration::ZERO).unwrap())
            .spawn()
            .await
            .unwrap();
        let pid = call_pid(&host).await.unwrap();
        // Every third cycle is graceful; the others kill.
        if i % 3 != 2 {
            // The call reaches the worker and outlives its deadline: the host SIGKILLs the
            // worker and reaps it before it reports `Timeout`. (A deadline that passed before
            // the call was sent would not kill, hence the 25 ms.)
            let deadline = Instant::now() + Duration::from_millis(25);
            assert_eq!(
                host.call_with_deadline::<Sleep>(&60_000, deadline).await,
                Err(CallError::Timeout)
            );
            assert!(
                is_gone(pid),
                "cycle {i}: worker {pid} was not killed and reaped"
            );
            kills += 1;
        }
        host.shutdown().await;
        // The process is gone entirely: not running, not a zombie.
        assert!(is_gone(pid), "cycle {i}: worker {pid} was not reaped");
    }
    let took = started.elapsed();
    assert_eq!(kills, KILL_CYCLES);
    let left = children();
    assert!(left.is_empty(), "child processes left behind: {left:?}");
    let fds_after = open_fd_count();
    assert!(
        fds_after <= fds_before,
        "descriptors leaked: {fds_before} before, {fds_after} after {} cycles",
        KILL_CYCLES + GRACEFUL_CYCLES
    );
    eprintln!("{KILL_CYCLES} kill and {GRACEFUL_CYCLES} graceful cycles took {took:?}");
}
