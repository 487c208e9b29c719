//! A host process that dies takes its workers with it (`PR_SET_PDEATHSIG`), even a worker that
//! is not reading its channel and so would never notice the host is gone.
//!
//! The host runs in a separate process: the test re-runs its own test binary for itself alone,
//! in child mode ([`ChildMode`]), where it starts the hosts and reports their workers' pids on
//! stdout. The test SIGKILLs that process (so no destructor, no shutdown, no kill of the process
//! group runs) and watches the workers die.

use std::io::BufRead;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use airlock_host::Host;
use airlock_test_support::ChildMode;
use airlock_tests::e2e::{
    call_pid, process_alive, remove_cgroups_left_since, rogue_host, stat_fields, worker_bin,
    ScratchDir,
};

/// Names a scratch directory for the host process.
const HOST_SCRATCH: &str = "AIRLOCK_HOST_DEATH_SCRATCH";
/// The line the host process prints once its workers are ready: `PREFIX <worker> <rogue>`.
const REPORT: &str = "host-death-workers";

/// The host process's part: a real worker, and a rogue that says hello and then never reads
/// again (`never_read`), so the end of its channel cannot be what ends it. Lives until killed
/// (at most a minute, should the test that started it be gone).
fn run_as_the_host_process() {
    let dir = std::env::var_os(HOST_SCRATCH).expect("the test names a scratch directory");
    let pids_file = std::path::Path::new(&dir).join("rogue-pids");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // Unconfined: the workers must be this host's own children for the test to find them
        // (a confined worker's parent is its keeper, which dies with the host the same way).
        let worker = Host::builder(worker_bin())
            .confinement(airlock_host::Confinement::none())
            .spawn()
            .await
            .unwrap();
        let worker_pid = call_pid(&worker).await.unwrap();
        // Unconfined too: the unconfined half of this test, which relies on the
        // parent-death signal alone.
        let _rogue = rogue_host()
            .confinement(airlock_host::Confinement::none())
            .arg("never_read")
            .env("ROGUE_PIDS", &pids_file)
            .spawn()
            .await
            .unwrap();
        // The rogue writes its pid before its hello, so it is there once the spawn returned.
        let rogue_pid: u32 = std::fs::read_to_string(&pids_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Confined (the default): the worker's parent is its keeper, the host's child. The
        // attack worker first tries to clear its parent-death signal, which must not be
        // possible (and which a uid change inside the sandbox set-up must not have done).
        let confined = Host::builder(worker_bin()).spawn().await.unwrap();
        let confined_pid = call_pid(&confined).await.unwrap();
        let attacker = Host::builder(airlock_tests::e2e::attack_bin())
            .arg(airlock_tests::attack::NO_SELF_FILTER)
            .spawn()
            .await
            .unwrap();
        let cleared = attacker
            .call::<airlock_tests::attack::Attack>(&("clear_pdeathsig".into(), String::new()))
            .await;
        assert!(
            cleared.is_err(),
            "a confined worker cleared its parent-death signal"
        );
        let attacker_pid = attacker.worker_pid().unwrap();
        // A handler that keeps it running after its channel ends: only the parent-death
        // signal can end it when the host dies.
        let stall = attacker.clone();
        tokio::spawn(async move {
            let _ = stall
                .call::<airlock_tests::attack::Attack>(&("stall".into(), "60".into()))
                .await;
        });
        // A second attacker becomes `sleep` through a thread's `execve`, which drops the
        // parent-death signal the sandbox set: its PID namespace must still end it.
        let execer = Host::builder(airlock_tests::e2e::attack_bin())
            .arg(airlock_tests::attack::NO_SELF_FILTER)
            .spawn()
            .await
            .unwrap();
        let execer_pid = execer.worker_pid().unwrap();
        let exec = execer.clone();
        tokio::spawn(async move {
            let _ = exec
                .call::<airlock_tests::attack::Attack>(&("exec_from_thread".into(), String::new()))
                .await;
        });
        let mut became_sleep = false;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            became_sleep = std::fs::read_to_string(format!("/proc/{execer_pid}/comm"))
                .is_ok_and(|c| c.trim() == "sleep");
            if became_sleep {
                break;
            }
        }
        assert!(became_sleep, "the attacker did not become sleep");
        tokio::time::sleep(Duration::from_millis(100)).await;
        println!("{REPORT} {worker_pid} {rogue_pid} {confined_pid} {attacker_pid} {execer_pid}");
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
}

/// Kills and reaps the host process if the test ends early.
struct HostProcess(Child);

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reaps `pid` if it became this process's child: inside a PID namespace the test binary may
/// be the init that orphans are handed to.
fn reap_if_ours(pid: u32) {
    let parent = stat_fields(pid).and_then(|f| f.get(1)?.parse::<u32>().ok());
    if parent == Some(std::process::id()) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
        }
    }
}

#[test]
fn a_killed_host_process_takes_its_workers_with_it() {
    let role = ChildMode::of(
        module_path!(),
        "a_killed_host_process_takes_its_workers_with_it",
    );
    if role.in_child() {
        run_as_the_host_process();
        return;
    }
    let scratch = ScratchDir::new("host-death");
    let began = std::time::SystemTime::now();
    let mut child = role
        .command()
        .env(HOST_SCRATCH, &*scratch)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut host = HostProcess(child);

    // Read the report off the host's stdout, with a deadline.
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let workers: Vec<u32> = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .expect("the host process never reported its workers");
        // libtest may have begun the line with the test's name.
        if let Some((_, pids)) = line.split_once(REPORT) {
            break pids
                .split_whitespace()
                .map(|p| p.parse().unwrap())
                .collect();
        }
    };
    assert_eq!(workers.len(), 5);
    let host_pid = host.0.id();
    let parent_of = |pid: u32| -> u32 { stat_fields(pid).unwrap()[1].parse().unwrap() };
    for (i, &pid) in workers.iter().enumerate() {
        // Live: each worker runs, and is the host process's child (unconfined) or its
        // keeper's (confined), not ours.
        assert!(process_alive(pid), "worker {pid} is not running");
        // Confined: worker → init → keeper → host.
        let parent = if i < 2 {
            parent_of(pid)
        } else {
            parent_of(parent_of(parent_of(pid)))
        };
        assert_eq!(parent, host_pid, "worker {pid} is not the host's");
    }

    host.0.kill().unwrap();
    host.0.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut survivors = workers.clone();
    while !survivors.is_empty() && Instant::now() < deadline {
        survivors.iter().copied().for_each(reap_if_ours);
        survivors.retain(|&pid| process_alive(pid));
        std::thread::sleep(Duration::from_millis(10));
    }
    for &pid in &survivors {
        // Do not leave it running: it is a process this test started.
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    remove_cgroups_left_since(began);
    assert!(
        survivors.is_empty(),
        "workers {survivors:?} of {workers:?} outlived their SIGKILLed host"
    );
}
