//! A worker starts with nothing in its signal mask, whatever the host's threads block.
//!
//! The spawner thread is made by the first spawn and inherits that thread's mask, and a child
//! inherits the mask of the thread that starts it; `std::process::Command` leaves it as it is.
//! Its own test binary: the spawner thread lives as long as the process, so only a binary whose
//! first spawn is made from a thread that blocks signals shows what the worker inherits.

#![allow(unsafe_code)] // pthread_sigmask: rustix has no safe wrapper for a thread's mask

use airlock_host::{Confinement, Host};
use airlock_tests::e2e::worker_bin;
use airlock_tests::support::current_thread_runtime;

/// The signal sets of `/proc/<pid>/task/<tid>/status` named `field` (`SigBlk:`), as a mask.
fn signal_set(task: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("{task}/status")).unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in {task}/status"))
        .trim();
    u64::from_str_radix(hex, 16).unwrap()
}

/// The bit of `signal` in a `/proc` signal set.
fn bit(signal: i32) -> u64 {
    1 << (signal - 1)
}

/// Under both confinements: the host's threads block SIGUSR2 and SIGTERM (as a program that
/// waits for them with `sigwait` does); the spawner thread inherits that, the worker does not.
#[test]
fn a_worker_starts_with_no_signal_blocked_when_the_hosts_threads_block_some() {
    // SAFETY: `sigset_t` is a plain C struct that `sigemptyset` initialises; the calls only
    // read and write the sets on this stack and this thread's own mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::sigaddset(&mut set, libc::SIGTERM);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()),
            0
        );
    }
    let blocked = bit(libc::SIGUSR2) | bit(libc::SIGTERM);
    let runtime = current_thread_runtime();
    for (mode, confinement) in [
        ("strict", Confinement::strict()),
        ("none", Confinement::none()),
    ] {
        runtime.block_on(async {
            let host = Host::builder(worker_bin())
                .confinement(confinement)
                .spawn()
                .await
                .unwrap();
            // The spawner threads, made from this thread, block what it blocks: the mask the
            // worker would inherit.
            let spawner = std::fs::read_dir("/proc/self/task")
                .unwrap()
                .flatten()
                .map(|task| task.path().display().to_string())
                .find(|task| {
                    std::fs::read_to_string(format!("{task}/comm"))
                        .is_ok_and(|comm| comm.trim_end() == "airlock-spawner")
                })
                .expect("the spawner thread");
            assert_eq!(
                signal_set(&spawner, "SigBlk:") & blocked,
                blocked,
                "{mode}: the spawner thread does not block what its creator blocked"
            );
            let worker = host.worker_pid().unwrap();
            let in_worker = signal_set(&format!("/proc/{worker}"), "SigBlk:");
            assert_eq!(in_worker, 0, "{mode}: blocked in the worker: {in_worker:x}");
            host.shutdown().await;
        });
    }
}
