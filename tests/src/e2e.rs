//! Locating and building the binaries the end-to-end suites spawn, and reading what became of
//! the processes they started.
//!
//! Integration tests of this crate cannot name another package's binary with
//! `CARGO_BIN_EXE_*`, so the bundled `airlock-worker` is found beside the test executable
//! (`target/<profile>/`). `cargo xtask test` builds every binary first; a binary that is
//! missing (a bare `cargo test -p airlock-tests` on a fresh tree) is built here. After changing
//! the worker, run `cargo xtask test` (or `cargo build --bins`) so the binary is not stale.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The directory cargo puts binaries in for the profile this test runs under.
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(PathBuf::from)
        .expect("test executable lives in target/<profile>/deps")
}

/// The path of `bin` of `package`, built first if it is missing (offline: every dependency is
/// already local).
fn built(package: &str, bin: &str, cell: &'static OnceLock<PathBuf>) -> PathBuf {
    cell.get_or_init(|| {
        let path = bin_dir().join(bin);
        if path.exists() {
            return path;
        }
        let profile_release = bin_dir().ends_with("release");
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cargo.args(["build", "--quiet", "--offline", "-p", package, "--bin", bin]);
        if profile_release {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("run cargo build");
        assert!(
            status.success(),
            "cargo build -p {package} --bin {bin} failed"
        );
        assert!(path.exists(), "{} missing after build", path.display());
        path
    })
    .clone()
}

airlock_host::method!(
    /// The bundled worker's `sum` (of a list of `i64`) with a byte string for its request, so a
    /// test can send bytes that do not decode as the list (the worker answers `BadRequest`).
    pub SumOfBytes, "sum", serde_bytes::ByteBuf => i64
);

/// The bundled `airlock-worker` binary.
pub fn worker_bin() -> PathBuf {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    built("airlock-worker", "airlock-worker", &CELL)
}

/// `thumbnail-worker`, the example of a worker of one's own (`examples/worker`).
pub fn example_worker_bin() -> PathBuf {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    built("airlock-example-worker", "thumbnail-worker", &CELL)
}

/// `thumbnail-host`, the example of an async host of one's own (`examples/host`).
pub fn example_host_bin() -> PathBuf {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    built("airlock-example-host", "thumbnail-host", &CELL)
}

/// `thumbnail-batch`, the example of a `Pool` batch with a progress bar (`examples/host`).
pub fn example_batch_bin() -> PathBuf {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    built("airlock-example-host", "thumbnail-batch", &CELL)
}

/// `json-call`, the example of a dynamic call read from JSON (`examples/host`).
pub fn example_json_call_bin() -> PathBuf {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    built("airlock-example-host", "json-call", &CELL)
}

/// `thumbnail-blocking`, the example of a host without an async runtime (`examples/host`).
pub fn example_blocking_bin() -> PathBuf {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    built("airlock-example-host", "thumbnail-blocking", &CELL)
}

/// The `rogue-worker` binary of this crate, which misbehaves on request.
pub fn rogue_bin() -> PathBuf {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    built("airlock-tests", "rogue-worker", &CELL)
}

/// The fields of `/proc/<pid>/stat` after the command name (state, ppid, pgrp, session, ...),
/// or `None` if there is no such process. The name is skipped by its last closing parenthesis:
/// it may hold spaces and parentheses.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    stat_fields_in(std::path::Path::new(&format!("/proc/{pid}")))
}

/// The same for the process or thread whose `/proc` directory is `dir` (`/proc/<pid>` or
/// `/proc/<pid>/task/<tid>`).
fn stat_fields_in(dir: &std::path::Path) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    Some(after_name.split_whitespace().map(str::to_owned).collect())
}

/// The parent of `pid`, numbered as this process sees it (`/proc/<pid>/stat`).
pub fn parent_of(pid: u32) -> u32 {
    stat_fields(pid)
        .and_then(|fields| fields.get(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no parent for {pid} in /proc"))
}

/// Removes the empty `airlock-*` cgroups made since `since` beside this process's own (where a
/// host it started makes its workers'): those of hosts the test SIGKILLed, which could not.
/// A host removes such leftovers only once they are a minute old. The kernel refuses to
/// remove a cgroup that still holds a task, so no live worker's is touched.
pub fn remove_cgroups_left_since(since: std::time::SystemTime) {
    let Ok(own) = std::fs::read_to_string("/proc/self/cgroup") else {
        return;
    };
    for line in own.lines() {
        // `hierarchy:controllers:path`; v2 has no controllers and lives at the mount's root.
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let root = match controllers {
            "" => "/sys/fs/cgroup".to_string(),
            "memory" | "pids" => format!("/sys/fs/cgroup/{controllers}"),
            _ => continue,
        };
        let Ok(entries) = std::fs::read_dir(format!("{root}{path}")) else {
            continue;
        };
        for entry in entries.flatten() {
            let ours = entry.file_name().to_string_lossy().starts_with("airlock-")
                && entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|made| made >= since);
            if ours {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

/// This process's children, of all its threads (a confined worker's keeper is the child of a
/// spawner thread).
pub fn children_of_this_process() -> Vec<u32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|pid| pid.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Waits up to `limit` for this process to have no child left; the children still there.
pub async fn children_left_after(limit: std::time::Duration) -> Vec<u32> {
    let until = std::time::Instant::now() + limit;
    loop {
        let left = children_of_this_process();
        if left.is_empty() || std::time::Instant::now() >= until {
            return left;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Whether a spawn failed because the keeper gave up waiting for the sandbox's init to start
/// the worker (`ConfinementStep::Synchronise`, timed out).
pub fn the_keeper_gave_up_on_init<T>(spawned: &Result<T, airlock_host::SpawnError>) -> bool {
    use airlock_host::{ConfinementError, ConfinementStep, SpawnError};
    matches!(
        spawned,
        Err(SpawnError::Confinement(ConfinementError::Step {
            step: ConfinementStep::Synchronise,
            source,
        })) if source.kind() == std::io::ErrorKind::TimedOut
    )
}

/// Every process `/proc` lists now, by pid (as this process numbers them).
pub fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// This process's children in any state, zombies included (`/proc/<pid>/stat`).
pub fn children() -> Vec<u32> {
    let me = std::process::id().to_string();
    all_pids()
        .into_iter()
        .filter(|pid| stat_fields(*pid).is_some_and(|f| f.get(1) == Some(&me)))
        .collect()
}

/// This process's children that are zombies (ended, not reaped), from `/proc`.
pub fn zombie_children() -> Vec<u32> {
    children()
        .into_iter()
        .filter(|pid| is_zombie(*pid))
        .collect()
}

/// True if the command line of `pid` holds `argument` as a whole argument (not its first).
pub fn has_argument(pid: u32, argument: &str) -> bool {
    let wanted = format!("\0{argument}\0");
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&wanted))
}

/// True if `pid` has ended and is not yet reaped (state `Z` in `/proc/<pid>/stat`).
fn is_zombie(pid: u32) -> bool {
    stat_fields(pid).is_some_and(|fields| fields.first().is_some_and(|state| state == "Z"))
}

/// The command name of `pid` (`/proc/<pid>/comm`), if it is still there.
fn command_name(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end().to_owned())
}

/// The highest pid Linux can hand out (`PID_MAX_LIMIT`, 2^22): a larger worker identity is the
/// name a confined rogue took (`air-<hex>`; its pid inside its own PID namespace names nothing here).
pub const PID_MAX_LIMIT: u32 = 1 << 22;

/// True if a process with this pid exists and is not a zombie (from `/proc/<pid>/stat`); for
/// an identity above [`PID_MAX_LIMIT`], true if a live process took that name.
pub fn process_alive(pid: u32) -> bool {
    if pid >= PID_MAX_LIMIT {
        return named_process(pid).is_some();
    }
    stat_fields(pid).is_some() && !is_zombie(pid)
}

/// True while `/proc` still holds the process, a zombie included (killed but not yet reaped):
/// by its pid, or for an identity above [`PID_MAX_LIMIT`] by the name it took (`air-<hex>`).
pub fn process_present(pid: u32) -> bool {
    if pid < PID_MAX_LIMIT {
        return std::path::Path::new(&format!("/proc/{pid}")).exists();
    }
    let name = format!("air-{pid:08x}");
    all_pids()
        .into_iter()
        .any(|pid| command_name(pid).is_some_and(|comm| comm == name))
}

/// The pid of a process with a live thread named `air-<id in hex>`, if there is one: also one
/// whose first thread has exited (a zombie in `/proc/<pid>/stat`) while the named thread runs
/// on. Threads take their creator's name, so every thread of a named rogue has it.
pub fn named_process(id: u32) -> Option<u32> {
    let name = format!("air-{id:08x}");
    let live_and_named = |thread: &std::path::Path| {
        std::fs::read_to_string(thread.join("comm")).is_ok_and(|comm| comm.trim_end() == name)
            && stat_fields_in(thread).is_some_and(|fields| {
                fields
                    .first()
                    .is_some_and(|state| state != "Z" && state != "X")
            })
    };
    all_pids().into_iter().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .is_ok_and(|threads| threads.flatten().any(|t| live_and_named(&t.path())))
    })
}

/// Makes the call at which a `fork_grandchild` rogue (run with `ROGUE_MARK` = `<dir>/mark`)
/// exits, which must fail, and returns the name its descendant took, checked to have run
/// under it out of the worker's session (`<dir>/mark.up`).
pub async fn the_escaped_descendant(host: &airlock_host::Host, dir: &std::path::Path) -> u32 {
    let outcome = host
        .call::<airlock_worker::builtin::Echo>(&serde_bytes::ByteBuf::from(b"x".to_vec()))
        .await;
    assert!(outcome.is_err(), "the rogue exits at the call: {outcome:?}");
    let name = std::fs::read_to_string(dir.join("mark"))
        .expect("the rogue started its descendant")
        .trim()
        .parse()
        .expect("the mark is the descendant's name");
    assert!(
        dir.join("mark.up").exists(),
        "the descendant ran under its name, out of the worker's session"
    );
    name
}

/// SIGKILLs the process with a live thread named `air-<id in hex>`, if there is one: what a
/// test that let such a process outlive its worker cleans up.
pub fn kill_named(id: u32) {
    if let Some(pid) = named_process(id).and_then(|pid| rustix::process::Pid::from_raw(pid as i32))
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// The session id of a process, from `/proc/<pid>/stat`. Read there rather than with
/// `getsid`: inside a PID namespace whose session leader lives outside it, the kernel reports
/// session 0, which rustix's `getsid` cannot represent (it panics).
pub fn session_of(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(3)?.parse().ok()
}

/// Pins the calling thread, and so the workers it spawns from now on, to the first CPU it may
/// run on: a worker then shares its host's CPU, and the kernel usually runs it as the host's
/// write wakes it (as `taskset -c 0` does for a whole benchmark). Returns that CPU.
pub fn pin_to_one_cpu() -> usize {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let allowed = sched_getaffinity(None).expect("the thread's affinity");
    let cpu = (0..CpuSet::MAX_CPU)
        .find(|&cpu| allowed.is_set(cpu))
        .expect("a CPU the thread may run on");
    let mut one = CpuSet::new();
    one.set(cpu);
    sched_setaffinity(None, &one).expect("pinning the thread");
    cpu
}

/// An instant `ms` milliseconds from now: a short call deadline.
pub fn soon(ms: u64) -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_millis(ms)
}

/// A restart policy that replaces a lost worker at once (backoff 5 to 20 ms), up to
/// `max_restarts` times a minute, so a test does not wait on restarts.
pub fn fast_restarts(max_restarts: u32) -> airlock_host::RestartPolicy {
    airlock_host::RestartPolicy {
        max_restarts,
        window: std::time::Duration::from_secs(60),
        initial_backoff: std::time::Duration::from_millis(5),
        max_backoff: std::time::Duration::from_millis(20),
    }
}

/// Polls `done` every 5 ms until it is true; panics naming `what` once `limit` has passed.
pub async fn wait_until(what: &str, limit: std::time::Duration, mut done: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "gave up waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A fresh, empty directory for one test's files under the system temp directory, named
/// `airlock-<label>-<random>`, removed with everything in it when dropped, except while the
/// test panics: then it stays for the post-mortem and its path is printed. Named at random
/// rather than by process id: inside a PID namespace every test binary may be pid 1, and two
/// such runs sharing `/tmp` must not share a directory.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates the directory (never reusing one that exists).
    pub fn new(label: &str) -> Self {
        use rand_core::{OsRng, TryRngCore};
        loop {
            let tag = OsRng.try_next_u64().expect("the OS random source");
            let dir = std::env::temp_dir().join(format!("airlock-{label}-{tag:016x}"));
            match std::fs::create_dir(&dir) {
                Ok(()) => return Self(dir),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create {}: {e}", dir.display()),
            }
        }
    }
}

impl std::ops::Deref for ScratchDir {
    type Target = std::path::Path;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl AsRef<std::path::Path> for ScratchDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for the post-mortem: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The pid, as this host sees it, of the worker that answers a `Pid` call now: the call
/// proves that worker is up and serving, and the host says which process it is (a confined
/// worker is pid 2 in its own PID namespace, so its own answer names nothing out here).
pub async fn call_pid(host: &airlock_host::Host) -> Result<u32, airlock_host::CallError> {
    host.call::<airlock_worker::builtin::Pid>(&())
        .await
        .map(|_| host.worker_pid().unwrap_or(0))
}

airlock_host::method!(
    /// The `rogue-worker`'s honest `echo` on a `u64`.
    pub RogueEcho, "echo", u64 => u64
);

/// Whether a thread of process `pid` sleeps in the kernel function `wchan` (a prefix of it).
pub fn sleeps_in(pid: u32, wchan: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|task| {
            std::fs::read_to_string(task.path().join("wchan")).is_ok_and(|at| at.contains(wchan))
        })
}

/// Runs `work` on a thread of its own and gives its outcome, or `None` if it has not ended
/// within `limit` (a host stuck in the kernel never returns; the thread is left behind). A
/// panic in `work` is the caller's.
pub fn within<T: Send + 'static>(
    limit: std::time::Duration,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (done, outcome) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let _ = done.send(work());
    });
    match outcome.recv_timeout(limit) {
        Ok(outcome) => Some(outcome),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match thread.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread ended without its outcome"),
        },
    }
}

/// Spawns the rogue `builder` describes playing `scenario`, its evidence written to `mark`;
/// makes one call, which a striking rogue answers before it strikes; and waits for the mark.
/// Where the rogue marked `armed`, also waits for one of its threads to sleep in the kernel
/// in `wchan` (the attack is live only then). Gives the host and what the rogue marked.
pub async fn rogue_struck(
    builder: airlock_host::HostBuilder,
    scenario: &str,
    mark: &std::path::Path,
    wchan: &str,
) -> (airlock_host::Host, String) {
    let host = builder
        .arg(scenario)
        .env("ROGUE_MARK", mark)
        .restart_policy(fast_restarts(0))
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    assert_eq!(
        host.call_with_deadline::<RogueEcho>(&1, deadline).await,
        Ok(1)
    );
    wait_until(
        "the rogue's mark",
        std::time::Duration::from_secs(5),
        || std::fs::metadata(mark).is_ok(),
    )
    .await;
    let marked = std::fs::read_to_string(mark).unwrap_or_default();
    if marked == "armed" {
        let pid = host.worker_pid().expect("a worker process");
        wait_until(
            &format!("a thread of the rogue to sleep in {wchan}"),
            std::time::Duration::from_secs(5),
            || sleeps_in(pid, wchan),
        )
        .await;
    }
    (host, marked)
}

airlock_host::method!(
    /// The `rogue-worker`'s `misbehave` method (in its `chaos` mode): the request names the
    /// scenario to play.
    pub Misbehave, "misbehave", String => ()
);

/// A host for the `rogue-worker`, under the default confinement.
pub fn rogue_host() -> airlock_host::HostBuilder {
    airlock_host::Host::builder(rogue_bin())
}

/// A host for the `rogue-worker`, confined, that may write its evidence (`ROGUE_*` files) in
/// `dir`: the directory is granted read-write and opened to every user (a root host's worker
/// runs under a uid of its own).
pub fn rogue_host_in(dir: &std::path::Path) -> airlock_host::HostBuilder {
    share_with_worker(dir);
    airlock_host::Host::builder(rogue_bin())
        .confinement(airlock_host::Confinement::strict().read_write(dir))
}

/// Over `transport`, a `rogue-worker` that exits (code 3) as its first call arrives fails that
/// call with `WorkerLost(Exited)`, within 30 s however the host waits for its frames, and a
/// fresh worker serves the next; `configure` sets the rest of the host (the low-latency mode,
/// say).
pub async fn an_exit_mid_call_fails_the_call_and_a_fresh_worker_serves(
    transport: airlock_host::TransportChoice,
    configure: impl FnOnce(airlock_host::HostBuilder) -> airlock_host::HostBuilder,
) {
    use airlock_host::{CallError, LostReason};
    let scratch = ScratchDir::new("exit-mid-call");
    let marker = scratch.join("exit-once");
    let builder = rogue_host_in(&scratch)
        .transport(transport)
        .arg("exit_mid_call")
        .env("ROGUE_ONCE", &marker)
        .restart_policy(fast_restarts(5));
    let host = configure(builder).spawn().await.unwrap();
    let payload = serde_bytes::ByteBuf::from(b"first".to_vec());
    let call = host.call::<airlock_worker::builtin::Echo>(&payload);
    let exited = tokio::time::timeout(std::time::Duration::from_secs(30), call)
        .await
        .unwrap_or_else(|_| panic!("{transport:?}: the call outlived its worker"));
    match exited {
        Err(CallError::WorkerLost(LostReason::Exited(info))) => {
            assert_eq!(info.code, Some(3), "{transport:?}");
        }
        other => panic!("{transport:?}: expected WorkerLost(Exited), got {other:?}"),
    }
    let next = host.call::<airlock_worker::builtin::Echo>(&payload).await;
    assert_eq!(next.unwrap(), payload, "{transport:?}");
    host.shutdown().await;
}

/// Makes `dir` writable by a worker running under another uid (a uid of its own, for a root
/// host).
pub fn share_with_worker(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
        .expect("the scratch directory can be opened to the worker");
}

/// The `background-worker` binary of this crate, whose handler leaves a task running on the
/// worker's runtime (see `airlock_tests::background`).
pub fn background_bin() -> PathBuf {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    built("airlock-tests", "background-worker", &CELL)
}

/// The `attack-worker` binary of this crate, which tries one sandbox escape per call.
pub fn attack_bin() -> PathBuf {
    static CELL: OnceLock<PathBuf> = OnceLock::new();
    built("airlock-tests", "attack-worker", &CELL)
}
