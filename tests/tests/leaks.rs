//! No zombie, no process and no descriptor is left after 200 spawn/kill cycles. Alone in its
//! test binary, so no other test's children or descriptors blur the counts.

use std::time::{Duration, Instant};

use airlock_host::Host;
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{Pid, Sleep};

/// This process's children, in any state (zombies included).
fn children() -> Vec<u32> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            let after = stat.rsplit(')').next().unwrap_or("");
            if after.split_whitespace().nth(1) == Some(me.as_str()) {
                found.push(pid);
            }
        }
    }
    found
}

fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_zombie_or_descriptor_is_left_after_200_spawn_kill_cycles() {
    // Warm up the runtime's own descriptors (epoll, signal pipe for child reaping) first.
    let warm = Host::builder(worker_bin()).spawn().await.unwrap();
    warm.shutdown().await;
    let fds_before = open_fd_count();
    let mut pids = Vec::new();
    for i in 0..200u32 {
        let host = Host::builder(worker_bin()).spawn().await.unwrap();
        pids.push(host.call::<Pid>(&()).await.unwrap());
        if i % 2 == 1 {
            // Killed: the deadline passes, the worker is SIGKILLed and reaped.
            let deadline = Instant::now() + Duration::from_millis(1);
            let _ = host.call_with_deadline::<Sleep>(&60_000, deadline).await;
        }
        host.shutdown().await;
        // The process is gone entirely: not running, not a zombie.
        let pid = *pids.last().unwrap();
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "cycle {i}: worker {pid} was not reaped"
        );
    }
    let left = children();
    assert!(left.is_empty(), "child processes left behind: {left:?}");
    let fds_after = open_fd_count();
    assert!(
        fds_after <= fds_before,
        "descriptors leaked: {fds_before} before, {fds_after} after 200 cycles"
    );
}
