//! A host runs under valgrind: it spawns an unconfined worker and calls it.
//!
//! valgrind does not map the vDSO it reports to its guest, so a library that parses that ELF
//! image itself (rustix does, unless it reads aux values through libc's `getauxval`) faults
//! the first time it looks at it: the host died with SIGSEGV in its first spawn. The test runs
//! its own binary again under `valgrind --tool=none`, as the child half named by
//! `AIRLOCK_UNDER_VALGRIND`. Confinement is `none()`: valgrind implements neither Landlock's
//! nor seccomp's system calls, so a `strict()` worker is refused under it (by a
//! `Confinement` error), as on any kernel without them.

use std::process::Command;

use airlock_host::{blocking, Confinement, Host};
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::Sum;

const CHILD: &str = "AIRLOCK_UNDER_VALGRIND";
const ANSWER: &str = "valgrind child: the worker answered 6";

/// The child half: spawns, calls, shuts down, and prints what it got.
fn spawn_and_call() {
    let builder = Host::builder(worker_bin()).confinement(Confinement::none());
    let host = blocking::Host::spawn(builder).expect("spawn under valgrind");
    let sum = host
        .call::<Sum>(&vec![1, 2, 3])
        .expect("call under valgrind");
    println!("valgrind child: the worker answered {sum}");
    host.shutdown();
}

#[test]
fn a_host_spawns_and_calls_an_unconfined_worker_under_valgrind() {
    if std::env::var_os(CHILD).is_some() {
        spawn_and_call();
        return;
    }
    let probe = Command::new("valgrind").arg("--version").output();
    if !probe.is_ok_and(|out| out.status.success()) {
        eprintln!("skipped: valgrind is not installed");
        return;
    }
    let this = std::env::current_exe().unwrap();
    let out = Command::new("valgrind")
        .args(["--tool=none", "--quiet"])
        .arg(this)
        .args([
            "--exact",
            "a_host_spawns_and_calls_an_unconfined_worker_under_valgrind",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(ANSWER),
        "under valgrind: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}
