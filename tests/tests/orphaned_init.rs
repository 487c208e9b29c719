//! A host process killed while it spawns a confined worker leaves the sandbox's init (PID 1 of
//! the worker's namespaces) without its host. Init must then end by its parent-death signal or
//! by its own exit, never by a fault.
//!
//! Init runs the host's code from a fork: had it returned a failed step into `std`'s code after
//! the fork, that code would write the error to the spawn's exec pipe and abort when the write
//! fails, as it does once the host is gone. A PID namespace's init ignores its own `SIGABRT`,
//! so `abort` would end at its last resort, a faulting instruction: the kernel logs a general
//! protection trap and the process dies by `SIGSEGV`. Init reports a failure on its own pipe
//! and exits with 125 instead (`INIT_SET_UP_FAILED`), a code of its own: 127 is also what
//! init exits with when its worker died by a signal.
//!
//! The host runs in a separate process (this test binary in child mode), spawning and shutting
//! down confined workers in a loop; the test SIGKILLs it at staggered moments. This process
//! is a child subreaper, so each orphaned keeper and init becomes its child, and the test
//! reads how each ended. Init is told apart by its `NSpid` (1 in its own namespace), read
//! while it is a zombie, before it is reaped.

use std::io::BufRead;
use std::process::Stdio;
use std::time::{Duration, Instant};

use airlock_host::Host;
use airlock_test_support::ChildMode;
use airlock_tests::e2e::{children_of_this_process, remove_cgroups_left_since, worker_bin};
use airlock_tests::support::current_thread_runtime;
use rustix::process::{Pid, WaitOptions};

/// Init's exit code when its set-up failed (`INIT_SET_UP_FAILED` in `airlock-host`).
const INIT_SET_UP_FAILED: i32 = 125;

/// What the host process prints once its first spawn is done and the loop runs.
const LOOPING: &str = "orphaned-init-host-looping";

/// The host process's part: spawn a confined worker, shut it down, again, until killed (at most
/// a minute, should the test that started it be gone).
fn run_as_the_host_process() {
    let runtime = current_thread_runtime();
    runtime.block_on(async {
        let started = Instant::now();
        let mut first = true;
        while started.elapsed() < Duration::from_secs(60) {
            let host = Host::builder(worker_bin()).spawn().await.unwrap();
            host.shutdown().await;
            if first {
                println!("{LOOPING}");
                first = false;
            }
        }
    });
}

/// How one orphan of a killed host ended.
#[derive(Debug)]
struct Ended {
    /// PID 1 of its own namespace: a sandbox's init.
    init: bool,
    exit_code: Option<i32>,
    signal: Option<i32>,
}

/// What `/proc/<pid>/status` says of `pid`, a child of this process (a zombie's is still
/// there until it is reaped): whether it has ended, and whether it is PID 1 of a namespace of
/// its own (its `NSpid` ends in 1).
fn state_of(pid: u32) -> Option<(bool, bool)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::split_whitespace)
    };
    let zombie = field("State:")?.next() == Some("Z");
    let ids: Vec<&str> = field("NSpid:")?.collect();
    Some((zombie, ids.len() > 1 && ids.last() == Some(&"1")))
}

/// Reaps this process's children as they end, saying how each ended; panics if any is left
/// after `limit`.
fn reap_orphans(limit: Duration) -> Vec<Ended> {
    let deadline = Instant::now() + limit;
    let mut ended = Vec::new();
    loop {
        let children = children_of_this_process();
        if children.is_empty() {
            return ended;
        }
        assert!(
            Instant::now() < deadline,
            "orphans of the killed host still there after {limit:?}: {children:?}"
        );
        for pid in children {
            let Some((true, init)) = state_of(pid) else {
                continue;
            };
            let pid = Pid::from_raw(pid as i32).expect("a child's pid is positive");
            if let Ok(Some((_, status))) = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG)
            {
                ended.push(Ended {
                    init,
                    exit_code: status.exit_status(),
                    signal: status.terminating_signal(),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_init_orphaned_mid_spawn_ends_by_its_exit_or_its_parent_death_signal_never_a_fault() {
    let role = ChildMode::of(
        module_path!(),
        "an_init_orphaned_mid_spawn_ends_by_its_exit_or_its_parent_death_signal_never_a_fault",
    );
    if role.in_child() {
        run_as_the_host_process();
        return;
    }
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).unwrap();
    let began = std::time::SystemTime::now();
    let mut inits = 0;
    let mut inits_that_exited = 0;
    let mut trials: u32 = 0;
    let started = Instant::now();
    // Until two inits took their failure path once their host was gone, or 300 trials.
    while trials < 300 && inits_that_exited < 2 && started.elapsed() < Duration::from_secs(120) {
        trials += 1;
        let mut host = role
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = host.stdout.take().unwrap();
        let looping = std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains(LOOPING));
        assert!(looping, "the host process never reached its spawn loop");
        // Staggered over a spawn and its shutdown (a few to a few tens of milliseconds).
        std::thread::sleep(Duration::from_micros(u64::from(trials) * 2_300 % 23_000));
        host.kill().unwrap();
        host.wait().unwrap();
        for orphan in reap_orphans(Duration::from_secs(10)) {
            assert!(
                !matches!(
                    orphan.signal,
                    Some(libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGTRAP)
                ),
                "an orphan of the killed host died of a fault: {orphan:?}"
            );
            if orphan.init {
                inits += 1;
                // Its own exit: `INIT_SET_UP_FAILED` from its failure path, or the worker's
                // status once the worker ran and ended.
                assert!(
                    orphan.signal.is_none() || orphan.signal == Some(libc::SIGKILL),
                    "init ended other than by its parent-death signal or its own exit: {orphan:?}"
                );
                if orphan.exit_code == Some(INIT_SET_UP_FAILED) {
                    inits_that_exited += 1;
                }
            }
        }
    }
    remove_cgroups_left_since(began);
    eprintln!(
        "orphaned_init: {trials} trials, {inits} inits orphaned, \
         {inits_that_exited} failed their set-up"
    );
    // The situation arose: the kill left inits without their host, and (for a root host, where
    // it comes within a few dozen kills; an unprivileged host's init takes it about once in
    // two hundred) some of them took their failure path, the one that ended in a fault when
    // it returned into `std`, rather than dying of the signal.
    assert!(inits > 0, "no kill in {trials} trials left an init behind");
    if rustix::process::geteuid().is_root() {
        assert!(
            inits_that_exited > 0,
            "in {trials} trials, none of {inits} orphaned inits took its failure path"
        );
    }
}
