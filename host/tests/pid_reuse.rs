//! A descendant that reuses the host's pid can still spawn workers: the spawner thread is
//! recognised by its thread id, not by the pid alone.
//!
//! `fork`/`unshare`/`waitpid` have no safe wrapper here: this file allows `unsafe` for them.
#![allow(unsafe_code)]

use std::time::{Duration, Instant};

use airlock_host::Host;

/// Waits for `pid` (a child of this process) at most `limit`; its exit code, or `None`.
fn wait_child(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    let mut status = 0;
    loop {
        // SAFETY: waits for a child this process forked, by its pid.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        if done < 0 || Instant::now() > deadline {
            // SAFETY: kills and reaps the child this process forked, by its pid.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The child's part: one spawn under a short timeout; 0 if it returned, 1 if it hung.
fn spawn_returns() -> i32 {
    std::panic::catch_unwind(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            match tokio::time::timeout(Duration::from_secs(3), Host::builder("/bin/true").spawn())
                .await
            {
                Ok(_) => 0,
                Err(_) => 1,
            }
        })
    })
    .unwrap_or(2)
}

/// A pid is not an identity of a process image: a process forked (directly or through
/// intermediates that never spawned) from a host inherits the host's spawner entry, and may run
/// under the host's pid (pid reuse after the host exited, or a pid namespace, as in any
/// container that forks). A spawner keyed by pid alone would then send the job to a channel
/// whose thread does not exist in this process; `send` would succeed, and every spawn of every
/// host in that process would wait the whole SPAWN_TIMEOUT (30 s) and fail, forever. So
/// host/src/spawner.rs keys its thread by pid and thread id. Reproduced here with a pid
/// namespace (needs CAP_SYS_ADMIN; skipped without it) so that a descendant gets the test
/// process's pid.
#[test]
fn a_descendant_reusing_the_hosts_pid_can_still_spawn() {
    // Start the spawner thread of this process: SPAWNER = (our pid, sender).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert!(runtime
        .block_on(Host::builder("/bin/true").spawn())
        .is_err());
    drop(runtime);
    let host_pid = std::process::id() as libc::pid_t;

    // SAFETY: the forked processes below only make system calls, build a fresh runtime for one
    // spawn, and leave with `_exit`.
    let c = unsafe { libc::fork() };
    assert!(c >= 0);
    if c == 0 {
        let code = unsafe {
            if libc::unshare(libc::CLONE_NEWPID) != 0 {
                libc::_exit(77); // no privilege: skip
            }
            let init = libc::fork();
            if init == 0 {
                // pid 1 of the new namespace: make the next pid the host's, then fork.
                let last = format!("{}", host_pid - 1);
                if std::fs::write("/proc/sys/kernel/ns_last_pid", last).is_err() {
                    libc::_exit(77);
                }
                let d = libc::fork();
                if d == 0 {
                    if std::process::id() as libc::pid_t != host_pid {
                        libc::_exit(78); // could not arrange the pid: skip
                    }
                    libc::_exit(spawn_returns());
                }
                let code = wait_child(d, Duration::from_secs(8)).unwrap_or(3);
                libc::_exit(code);
            }
            wait_child(init, Duration::from_secs(9)).unwrap_or(3)
        };
        // SAFETY: ends the forked child without the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let code = wait_child(c, Duration::from_secs(9));
    if matches!(code, Some(77 | 78)) {
        eprintln!("skipped: cannot arrange pid reuse here (code {code:?})");
        return;
    }
    assert_eq!(
        code,
        Some(0),
        "Host::spawn in a descendant running under the host's pid hung (1), panicked (2) or \
         the child was killed (3/None)"
    );
}
