//! An unconfined worker (`Confinement::none()`, started without a fork: cloned sharing the
//! host's memory, then `exec`ed) starts as a forked one would: holding only its stdio (and
//! the channel at fd 3 on the inherited socket) even when the host holds a descriptor that
//! is not close-on-exec, with only the environment it was given, in the directory it was
//! given, its program found in its own `PATH`, with blocking stdio, nothing blocked and
//! SIGPIPE at its default; a program that cannot be run fails with execve's reason (`ENOENT`,
//! `EACCES`, `ENOEXEC`, `ENOTDIR`) and leaves no zombie; how it ended (a code, a signal, a
//! core dump) comes back as the `ExitInfo` of the handshake failure; its descendants die
//! with it; and a spawn given up midway, or a runtime shut down under it, leaves no worker.
//!
//! The worker program is `sleep` with an argument unique to the test, found among this
//! process's children by its command line and inspected from outside through `/proc` while
//! the host waits for a `Hello` that never comes.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::time::Duration;

use airlock_host::{Confinement, ExitInfo, Host, HostBuilder, LostReason, SpawnError};
use airlock_tests::e2e::{
    all_pids, children, has_argument, process_alive, wait_until, zombie_children,
};

/// A `sleep` argument no other process has: 1000 seconds and a fraction naming the test.
fn unique_sleep(test: u32) -> String {
    format!("1000.{}{test:03}", std::process::id())
}

/// The unconfined `sleep` worker, sleeping `argument` seconds.
fn sleeper(program: impl Into<PathBuf>, argument: &str) -> HostBuilder {
    Host::builder(program.into())
        .confinement(Confinement::none())
        .arg(argument)
}

/// What a default host tells every worker of its own besides what it was given: the polling
/// window under load (`PROTOCOL.md`), unless the worker may run on one CPU only.
fn advice() -> Vec<OsString> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let window = airlock_protocol::spin::DEFAULT_LOAD_POLL.as_micros();
    let name = airlock_protocol::spin::LOAD_POLL_ENV;
    (cpus > 1)
        .then(|| OsString::from(format!("{name}={window}")))
        .into_iter()
        .collect()
}

/// The pid of this process's child whose command line is `sleep argument`.
fn child_sleeping(argument: &str) -> Option<u32> {
    children()
        .into_iter()
        .find(|pid| has_argument(*pid, argument))
}

/// Starts the spawn of `builder` (whose worker runs `sleep argument`) in a task of its own, and
/// returns it with the worker's pid once the `sleep` runs.
async fn start_sleeping(
    builder: HostBuilder,
    argument: &str,
) -> (tokio::task::JoinHandle<Result<Host, SpawnError>>, u32) {
    let spawning = tokio::spawn(builder.spawn());
    let mut pid = None;
    wait_until("the sleeping worker", Duration::from_secs(10), || {
        pid = child_sleeping(argument);
        pid.is_some()
    })
    .await;
    (spawning, pid.expect("found"))
}

/// An unconfined worker started by a shell that first leaves `sleep argument` running in the
/// background: a descendant in the worker's process group.
fn worker_leaving_a_sleep(argument: &str) -> HostBuilder {
    Host::builder("/bin/sh")
        .confinement(Confinement::none())
        .arg("-c")
        .arg(format!(
            "sleep {argument} </dev/null >/dev/null 2>&1 & exec {}",
            airlock_tests::e2e::worker_bin().display()
        ))
        .env("PATH", "/usr/bin:/bin")
}

/// What a started worker holds, read from outside.
struct Seen {
    descriptors: Vec<u32>,
    environment: Vec<OsString>,
    cwd: PathBuf,
}

/// Spawns `builder` (whose worker runs `sleep argument`), reads what the worker holds, then
/// kills it with `signal`; returns what was seen and how the spawn failed.
async fn inspect_then_kill(
    builder: HostBuilder,
    argument: &str,
    signal: rustix::process::Signal,
) -> (Seen, SpawnError) {
    let (spawning, pid) = start_sleeping(builder, argument).await;
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let mut descriptors: Vec<u32> = std::fs::read_dir(proc_dir.join("fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    descriptors.sort_unstable();
    let mut environment: Vec<OsString> = std::fs::read(proc_dir.join("environ"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| OsString::from_vec(v.to_vec()))
        .collect();
    environment.sort();
    let cwd = std::fs::read_link(proc_dir.join("cwd")).unwrap();
    let target = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(target, signal).unwrap();
    let err = match spawning.await.unwrap() {
        Ok(host) => {
            host.shutdown().await;
            panic!("sleep said hello");
        }
        Err(err) => err,
    };
    let seen = Seen {
        descriptors,
        environment,
        cwd,
    };
    (seen, err)
}

fn exited(err: &SpawnError) -> Option<ExitInfo> {
    match err {
        SpawnError::Handshake(failure) => match failure.reason {
            LostReason::Exited(info) => Some(info),
            _ => None,
        },
        _ => None,
    }
}

/// Asserts that the spawn failed because its worker ended with exit `code` or by `signal`.
fn assert_ended(err: &SpawnError, code: Option<i32>, signal: Option<i32>) {
    assert_eq!(exited(err), Some(ExitInfo { code, signal }), "{err:?}");
}

/// A descriptor the host opened without close-on-exec, as code that is not airlock's may.
fn leaky_descriptor() -> std::os::fd::OwnedFd {
    // `open` without O_CLOEXEC: rustix adds nothing of its own.
    let fd = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let flags = rustix::io::fcntl_getfd(&fd).unwrap();
    assert!(
        !flags.contains(rustix::io::FdFlags::CLOEXEC),
        "the leaky descriptor must stay open across exec unless the spawn closes it"
    );
    fd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_holds_only_its_stdio_though_the_host_leaks_a_descriptor() {
    let leaked = leaky_descriptor();
    let argument = unique_sleep(1);
    let (seen, err) = inspect_then_kill(
        sleeper("/bin/sleep", &argument),
        &argument,
        rustix::process::Signal::KILL,
    )
    .await;
    drop(leaked);
    assert_eq!(seen.descriptors, [0, 1, 2]);
    assert_ended(&err, None, Some(libc::SIGKILL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_on_the_inherited_socket_holds_only_stdio_and_the_channel() {
    let leaked = leaky_descriptor();
    let argument = unique_sleep(2);
    let (seen, err) = inspect_then_kill(
        sleeper("/bin/sleep", &argument)
            .transport(airlock_host::TransportChoice::SocketInherited)
            .protocol(
                airlock_protocol::HostConfig::default()
                    .handshake_timeout(Duration::from_secs(30))
                    .unwrap(),
            ),
        &argument,
        rustix::process::Signal::TERM,
    )
    .await;
    drop(leaked);
    assert_eq!(seen.descriptors, [0, 1, 2, 3]);
    assert_eq!(
        seen.environment,
        [advice(), vec![OsString::from("AIRLOCK_SOCKET_FD=3")]].concat(),
        "only the channel's variable and airlock's advice"
    );
    assert_ended(&err, None, Some(libc::SIGTERM));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_has_only_the_environment_and_directory_it_was_given() {
    let dir = std::env::temp_dir()
        .canonicalize()
        .unwrap()
        .join(format!("airlock-unconfined-cwd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(
        std::env::vars_os().next().is_some(),
        "the host has an environment of its own to leak"
    );
    let argument = unique_sleep(3);
    // By name: found in the worker's own PATH, which is not the host's.
    let (seen, _) = inspect_then_kill(
        sleeper("sleep", &argument)
            .env("PATH", "/nonexistent/airlock:/usr/bin:/bin")
            .env("AIRLOCK_GIVEN", "first")
            .env("AIRLOCK_GIVEN", "given")
            .current_dir(&dir),
        &argument,
        rustix::process::Signal::KILL,
    )
    .await;
    let _ = std::fs::remove_dir(&dir);
    let given = [
        vec![OsString::from("AIRLOCK_GIVEN=given")],
        advice(),
        vec![OsString::from("PATH=/nonexistent/airlock:/usr/bin:/bin")],
    ];
    assert_eq!(seen.environment, given.concat());
    assert_eq!(seen.cwd, dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_whose_program_is_missing_fails_with_enoent() {
    for program in ["/nonexistent/airlock/worker", "airlock-no-such-program"] {
        let err = spawn_error(
            sleeper(program, "1").env("PATH", "/usr/bin:/bin"),
            &format!("{program} started"),
        )
        .await;
        match &err {
            SpawnError::Exec { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT), "{program}")
            }
            other => panic!("{program}: expected Exec, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_that_cannot_enter_its_directory_fails_with_the_reason() {
    let err = spawn_error(
        sleeper("/bin/sleep", "1").current_dir("/nonexistent/airlock/dir"),
        "started in a missing directory",
    )
    .await;
    assert!(
        matches!(&err, SpawnError::Exec { source, .. } if source.raw_os_error() == Some(libc::ENOENT)),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_exit_code_is_reported() {
    let err = spawn_error(
        Host::builder("/bin/sh")
            .confinement(Confinement::none())
            .arg("-c")
            .arg("exit 42"),
        "sh said hello",
    )
    .await;
    assert_ended(&err, Some(42), None);
}

/// Why a spawn of `builder` failed; panics, saying `started`, if it started.
async fn spawn_error(builder: HostBuilder, started: &str) -> SpawnError {
    match builder.spawn().await {
        Ok(host) => {
            host.shutdown().await;
            panic!("{started}");
        }
        Err(err) => err,
    }
}

/// The `errno` an unconfined spawn of `builder` failed with; panics if it started.
async fn exec_errno(builder: HostBuilder, what: &str) -> Option<i32> {
    match spawn_error(builder, &format!("{what} started")).await {
        SpawnError::Exec { source, .. } => source.raw_os_error(),
        other => panic!("{what}: expected Exec, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_that_cannot_exec_fails_with_the_reason_and_leaves_no_zombie() {
    use std::os::unix::fs::PermissionsExt;
    let dir = airlock_tests::e2e::ScratchDir::new("unconfined-exec-errors");
    // Readable but not executable (even root needs one execute bit).
    let not_executable = dir.join("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&not_executable, std::fs::Permissions::from_mode(0o644)).unwrap();
    // Executable, but neither a binary the kernel knows nor a script.
    let not_a_program = dir.join("not-a-program");
    std::fs::write(&not_a_program, b"\x7fXYZ not a program\n").unwrap();
    std::fs::set_permissions(&not_a_program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cases = [
        (
            sleeper(&not_executable, "1"),
            libc::EACCES,
            "a file without execute permission",
        ),
        (
            sleeper(&not_a_program, "1"),
            libc::ENOEXEC,
            "a file of no known format",
        ),
        (
            sleeper("/etc/passwd/worker", "1"),
            libc::ENOTDIR,
            "a path through a file",
        ),
        (
            // execvp's rule: a refused candidate in PATH is reported over later missing ones.
            sleeper("not-executable", "1").env("PATH", format!("{}:/nonexistent", dir.display())),
            libc::EACCES,
            "a refused candidate in PATH",
        ),
    ];
    for (builder, expected, what) in cases {
        assert_eq!(exec_errno(builder, what).await, Some(expected), "{what}");
    }
    wait_until("no zombie child", Duration::from_secs(5), || {
        zombie_children().is_empty()
    })
    .await;
}

/// The signal sets of `/proc/<pid>/status` (`SigBlk`, `SigIgn`, `SigCgt`), as bit masks.
fn signal_sets(pid: u32) -> [u64; 3] {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    ["SigBlk:", "SigIgn:", "SigCgt:"].map(|name| {
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim();
        u64::from_str_radix(hex, 16).unwrap()
    })
}

/// The bit of `signal` in a `/proc` signal set.
fn bit(signal: i32) -> u64 {
    1 << (signal - 1)
}

/// The spawner thread blocks every signal around the clone and the host ignores SIGPIPE
/// (Rust's runtime does): the worker still starts with nothing blocked and SIGPIPE at its
/// default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_starts_with_no_signal_blocked_and_sigpipe_at_default() {
    let [_, host_ignored, _] = signal_sets(std::process::id());
    assert_ne!(
        host_ignored & bit(libc::SIGPIPE),
        0,
        "the host ignores SIGPIPE, for the worker to inherit unless the spawn resets it"
    );
    let argument = unique_sleep(4);
    let (spawning, pid) = start_sleeping(sleeper("/bin/sleep", &argument), &argument).await;
    let [blocked, ignored, caught] = signal_sets(pid);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    assert!(spawning.await.unwrap().is_err(), "sleep said hello");
    assert_eq!(blocked, 0, "blocked in the worker: {blocked:x}");
    assert_eq!(
        ignored & bit(libc::SIGPIPE),
        0,
        "SIGPIPE ignored in the worker"
    );
    assert_eq!(caught, 0, "the worker caught {caught:x}");
}

/// The live processes whose command line holds `argument` as a whole argument.
fn processes_with_argument(argument: &str) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|pid| has_argument(*pid, argument) && process_alive(*pid))
        .collect()
}

/// A worker that dies on its own takes its process group with it: a descendant it started
/// (still in its group) is killed when the host reaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_that_dies_takes_its_descendants_with_it() {
    let argument = unique_sleep(5);
    let host = worker_leaving_a_sleep(&argument)
        .restart_policy(airlock_host::RestartPolicy {
            max_restarts: 0,
            ..Default::default()
        })
        .spawn()
        .await
        .unwrap();
    let worker = airlock_tests::e2e::call_pid(&host).await.unwrap();
    // The shell forks the `sleep` before it execs the worker, but the `sleep` may exec later.
    wait_until(
        "the worker's descendant runs",
        Duration::from_secs(5),
        || processes_with_argument(&argument).len() == 1,
    )
    .await;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(worker as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    wait_until("the descendant killed", Duration::from_secs(5), || {
        processes_with_argument(&argument).is_empty()
    })
    .await;
    host.shutdown().await;
}

/// A spawn given up at any point (its future dropped while the spawner thread clones, or
/// while the host waits for the `Hello`) leaves no worker running and no zombie.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_spawn_dropped_midway_leaves_no_worker_and_no_zombie() {
    let argument = unique_sleep(6);
    let mut given_up_running = 0;
    // 40 points through a spawn's first 6 ms, then on with doubling delays (a loaded machine
    // spawns slower) until one was given up with its worker running.
    let delays = (0..40u64)
        .map(|n| n * 150)
        .chain(std::iter::successors(Some(8_000u64), |d| {
            (*d < 4_000_000).then_some(d * 2)
        }));
    for delay_us in delays {
        if delay_us >= 6_000 && given_up_running > 0 {
            break;
        }
        let spawning = tokio::spawn(sleeper("/bin/sleep", &argument).spawn());
        tokio::time::sleep(Duration::from_micros(delay_us)).await;
        given_up_running += usize::from(!processes_with_argument(&argument).is_empty());
        spawning.abort();
        let _ = spawning.await;
        // Each attempt alone: the next one's count must not see this one's worker.
        wait_until("no worker left running", Duration::from_secs(5), || {
            processes_with_argument(&argument).is_empty()
        })
        .await;
    }
    assert!(
        given_up_running > 0,
        "some spawns were given up with a worker running"
    );
    wait_until("no worker left running", Duration::from_secs(5), || {
        processes_with_argument(&argument).is_empty()
    })
    .await;
    wait_until("no zombie child", Duration::from_secs(5), || {
        zombie_children().is_empty()
    })
    .await;
}

/// A host whose runtime shuts down without `shutdown` still kills and reaps its worker.
#[test]
fn an_unconfined_worker_of_a_runtime_that_shuts_down_is_killed_and_reaped() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let pid = runtime.block_on(async {
        let host = Host::builder(airlock_tests::e2e::worker_bin())
            .confinement(Confinement::none())
            .spawn()
            .await
            .unwrap();
        let pid = airlock_tests::e2e::call_pid(&host).await.unwrap();
        std::mem::forget(host);
        pid
    });
    assert!(process_alive(pid));
    drop(runtime);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while airlock_tests::e2e::process_present(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !airlock_tests::e2e::process_present(pid),
        "worker {pid} is still there (alive: {})",
        process_alive(pid)
    );
}

/// A host whose runtime ends without `shutdown` (the `Host` forgotten) takes its unconfined
/// worker's descendants with the worker: its whole process group is killed, as when the host
/// reaps a worker that died.
#[test]
fn an_unconfined_worker_of_a_runtime_that_shuts_down_takes_its_descendants_with_it() {
    let argument = unique_sleep(8);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let host = worker_leaving_a_sleep(&argument).spawn().await.unwrap();
        airlock_tests::e2e::call_pid(&host).await.unwrap();
        // The shell forks the `sleep` before it execs the worker, but the `sleep` may exec
        // later.
        wait_until(
            "the worker's descendant runs",
            Duration::from_secs(5),
            || processes_with_argument(&argument).len() == 1,
        )
        .await;
        std::mem::forget(host);
    });
    drop(runtime);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !processes_with_argument(&argument).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        processes_with_argument(&argument).is_empty(),
        "the worker's descendant outlived its host's runtime"
    );
}

/// A worker that dies by a signal and dumps core is reported with that signal (the core
/// flag of the wait status does not turn it into an exit code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_that_dumps_core_reports_its_signal() {
    let dir = airlock_tests::e2e::ScratchDir::new("unconfined-core");
    let err = spawn_error(
        Host::builder("/bin/sh")
            .confinement(Confinement::none())
            .arg("-c")
            .arg("ulimit -c unlimited && kill -SEGV $$")
            .current_dir(dir.join("")),
        "sh said hello",
    )
    .await;
    let dumped = std::fs::read_dir(dir.join(""))
        .unwrap()
        .flatten()
        .any(|entry| entry.file_name().to_string_lossy().starts_with("core"));
    let core_pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    assert!(
        dumped || !core_pattern.starts_with("core"),
        "the worker dumped core into its directory"
    );
    assert_ended(&err, None, Some(libc::SIGSEGV));
}

/// The worker's ends of its stdio pipes block, as a program expects of its stdio; only the
/// host's ends are non-blocking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_gets_blocking_stdio() {
    let argument = unique_sleep(7);
    let (spawning, pid) = start_sleeping(sleeper("/bin/sleep", &argument), &argument).await;
    let flags: Vec<u32> = (0..3)
        .map(|fd| {
            let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap();
            let octal = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .unwrap()
                .trim();
            u32::from_str_radix(octal, 8).unwrap()
        })
        .collect();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    assert!(spawning.await.unwrap().is_err(), "sleep said hello");
    for (fd, flags) in flags.iter().enumerate() {
        assert_eq!(
            flags & libc::O_NONBLOCK as u32,
            0,
            "the worker's fd {fd} is non-blocking"
        );
    }
}
