//! The thread that keeps every host's deadlines in a process takes the scheduling of the
//! process's main thread, not that of whichever thread spawned the process's first host: an
//! application's idle-priority, one-CPU background thread must not make every host's
//! deadlines late.
//!
//! Its own test binary: the deadline thread starts with the process's first host.
//!
//! Setting a thread's scheduling policy has no safe wrapper here: this file allows `unsafe`
//! for `sched_setscheduler` alone.
#![allow(unsafe_code)]

use airlock_host::Host;
use airlock_tests::e2e::worker_bin;

/// A thread's scheduling as `/proc` shows it: policy (`stat` field 41), nice value (field 19)
/// and the CPUs it may run on (`Cpus_allowed_list`).
#[derive(Debug, PartialEq, Eq)]
struct Scheduling {
    policy: String,
    nice: String,
    cpus: String,
}

fn scheduling_of(tid: &str) -> Scheduling {
    let task = format!("/proc/self/task/{tid}");
    let stat = std::fs::read_to_string(format!("{task}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after_comm: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let status = std::fs::read_to_string(format!("{task}/status")).unwrap();
    let cpus = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_owned();
    Scheduling {
        // Field n is at index n - 3 once the pid and the name are gone.
        policy: after_comm[41 - 3].to_owned(),
        nice: after_comm[19 - 3].to_owned(),
        cpus,
    }
}

fn thread_named(name: &str) -> Option<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .find(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == name)
        })
        .map(|task| task.file_name().to_string_lossy().into_owned())
}

/// Makes the calling thread a background one: idle policy, nice 10, the last CPU only.
fn demote_this_thread() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call on the calling thread (pid 0) with a parameter it owns.
    assert_eq!(
        unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) },
        0
    );
    rustix::process::setpriority_process(Some(rustix::thread::gettid()), 10).unwrap();
    let mut cpus = rustix::thread::sched_getaffinity(None).unwrap();
    let last = (0..rustix::thread::CpuSet::MAX_CPU)
        .rev()
        .find(|&cpu| cpus.is_set(cpu))
        .unwrap();
    (0..last).for_each(|cpu| cpus.unset(cpu));
    rustix::thread::sched_setaffinity(None, &cpus).unwrap();
}

#[test]
fn the_deadline_thread_takes_the_main_threads_scheduling() {
    let main = scheduling_of(&std::process::id().to_string());
    assert!(thread_named("airlock-timers").is_none(), "no host yet");
    let (inherited, deadlines) = std::thread::spawn(|| {
        demote_this_thread();
        // What a thread made here gets: the demotion is real and inherited.
        let inherited = std::thread::spawn(|| {
            scheduling_of(&rustix::thread::gettid().as_raw_nonzero().to_string())
        })
        .join()
        .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let host = runtime
            .block_on(Host::builder(worker_bin()).spawn())
            .unwrap();
        runtime.block_on(host.shutdown());
        let tid = thread_named("airlock-timers").expect("the deadline thread runs");
        (inherited, scheduling_of(&tid))
    })
    .join()
    .unwrap();
    assert_ne!(
        inherited.policy, main.policy,
        "the demotion was not inherited: {inherited:?}"
    );
    assert_ne!(inherited.nice, main.nice);
    // Affinity is the calling thread's own to set, privileged or not.
    assert_eq!(deadlines.cpus, main.cpus, "{deadlines:?} against {main:?}");
    // Leaving the idle policy and lowering the nice value take a privilege (or `RLIMIT_NICE`).
    if rustix::process::geteuid().is_root() {
        assert_eq!(deadlines, main);
    } else {
        eprintln!(
            "not root: the deadline thread may keep the idle policy and nice value ({deadlines:?}); only its CPUs were checked"
        );
    }
}
