//! Unconfined workers are cloned sharing the host's memory (`CLONE_VM | CLONE_VFORK`) until
//! they `exec`. A child that touched the allocator, a lock or any other shared state there
//! would corrupt the host while its other threads run. This pins that it does not: 200
//! unconfined spawns from several tasks at once (both spawner threads busy), while one thread
//! allocates, checks and frees memory without pause and another forks the host without pause,
//! leave every allocation intact, every spawn with its expected outcome, no zombie and no
//! descriptor behind.
//!
//! Its own test binary: it forks, and it counts this process's children and descriptors.
//!
//! `fork`, `_exit` and `waitpid` have no safe wrapper here: this file allows `unsafe` for them
//! alone.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use airlock_host::{Confinement, ExitInfo, Host, LostReason, SpawnError};
use airlock_tests::e2e::{call_pid, wait_until, worker_bin, zombie_children};

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Allocates, fills, checks and frees blocks of many sizes until `stop`; counts the blocks it
/// checked in `checked` and panics on the first one whose contents changed under it.
fn churn_the_heap(stop: Arc<AtomicBool>, checked: Arc<AtomicU64>) {
    let mut live: Vec<Vec<u64>> = (0..256).map(|_| Vec::new()).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    while !stop.load(Ordering::Relaxed) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let slot = (seed % 256) as usize;
        let old = std::mem::take(&mut live[slot]);
        if let Some(first) = old.first() {
            assert!(
                old.iter()
                    .enumerate()
                    .all(|(i, word)| *word == first.wrapping_add(i as u64)),
                "a block of the host's heap changed under it"
            );
            checked.fetch_add(1, Ordering::Relaxed);
        }
        drop(old);
        let len = 1 + (seed >> 20) as usize % 4096;
        live[slot] = (0..len as u64).map(|i| seed.wrapping_add(i)).collect();
        // Formatting allocates through another path (String growth).
        let text = format!("{seed:x}-{len}");
        assert!(text.len() > 2);
    }
}

/// Forks this process until `stop`; each copy exits at once, and is reaped here.
fn fork_repeatedly(stop: Arc<AtomicBool>, forks: Arc<AtomicU64>) {
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: the copy only calls `_exit`, which is async-signal-safe: nothing it inherits
        // from the other threads (their locks, their half-done allocations) is touched.
        let pid = unsafe { libc::fork() };
        match pid {
            0 => unsafe { libc::_exit(0) },
            pid if pid > 0 => {
                let mut status = 0;
                // SAFETY: waits for the child forked just above; `status` is a live int.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                forks.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// One unconfined spawn of a kind chosen by `n`, checked for the outcome that kind must have.
async fn spawn_one(n: u32) {
    match n % 4 {
        // A program that exits at once with a code of its own.
        0 | 1 => {
            let code = 1 + (n % 100) as i32;
            let outcome = Host::builder("/bin/sh")
                .confinement(Confinement::none())
                .arg("-c")
                .arg(format!("exit {code}"))
                .spawn()
                .await;
            match outcome {
                Err(SpawnError::Handshake(failure)) => assert_eq!(
                    failure.reason,
                    LostReason::Exited(ExitInfo {
                        code: Some(code),
                        signal: None
                    }),
                    "spawn {n}"
                ),
                other => panic!("spawn {n}: {:?}", other.map(|_| ())),
            }
        }
        // A program that is not there.
        2 => {
            let outcome = Host::builder(format!("/nonexistent/airlock/{n}"))
                .confinement(Confinement::none())
                .spawn()
                .await;
            match outcome {
                Err(SpawnError::Exec { source, .. }) => {
                    assert_eq!(source.raw_os_error(), Some(libc::ENOENT), "spawn {n}")
                }
                other => panic!("spawn {n}: {:?}", other.map(|_| ())),
            }
        }
        // A real worker that answers a call.
        _ => {
            let host = Host::builder(worker_bin())
                .confinement(Confinement::none())
                .spawn()
                .await
                .unwrap_or_else(|err| panic!("spawn {n}: {err}"));
            let pid = call_pid(&host).await.expect("the worker answers");
            assert_ne!(pid, std::process::id());
            host.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unconfined_spawns_beside_heap_churn_and_forks_leave_the_host_intact() {
    // Warm up: the spawner threads, the runtime and the first worker start.
    spawn_one(3).await;
    let descriptors_before = open_descriptors();
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let forks = Arc::new(AtomicU64::new(0));
    let churn = {
        let (stop, checked) = (stop.clone(), checked.clone());
        std::thread::spawn(move || churn_the_heap(stop, checked))
    };
    let forker = {
        let (stop, forks) = (stop.clone(), forks.clone());
        std::thread::spawn(move || fork_repeatedly(stop, forks))
    };
    // At least 200 spawns, and on until the heap thread and the forker have done enough
    // beside them, however a loaded machine schedules the three (bounded).
    let spawned = Arc::new(AtomicU64::new(0));
    let concurrent_enough = {
        let (spawned, checked, forks) = (spawned.clone(), checked.clone(), forks.clone());
        move || {
            spawned.load(Ordering::Relaxed) >= 200
                && checked.load(Ordering::Relaxed) >= 100
                && forks.load(Ordering::Relaxed) >= 10
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let tasks: Vec<_> = (0..8u32)
        .map(|task| {
            let (spawned, done) = (spawned.clone(), concurrent_enough.clone());
            tokio::spawn(async move {
                let mut round = 0u32;
                while !done() && std::time::Instant::now() < deadline {
                    spawn_one(task * 1000 + round).await;
                    spawned.fetch_add(1, Ordering::Relaxed);
                    round += 1;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("every spawn had its expected outcome");
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().expect("the heap stayed intact");
    forker.join().expect("the forks went through");
    assert!(
        concurrent_enough(),
        "within two minutes: {} spawns, {} heap blocks checked, {} forks",
        spawned.load(Ordering::Relaxed),
        checked.load(Ordering::Relaxed),
        forks.load(Ordering::Relaxed)
    );
    wait_until("every child reaped", Duration::from_secs(5), || {
        zombie_children().is_empty()
    })
    .await;
    wait_until(
        "the host's descriptors back to where they were",
        Duration::from_secs(5),
        || open_descriptors() <= descriptors_before,
    )
    .await;
}
