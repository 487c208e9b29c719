//! Real worker processes end to end: a worker survives the exit of the runtime thread that
//! forked it, an oversized frame before the Hello is refused from its prefix, nothing of a lost
//! worker stays open in the host, a descendant that leaves the process group dies with the
//! worker, a briefly busy honest worker survives a burst of calls, and stderr cannot forge log
//! lines.

use std::time::{Duration, Instant};

use airlock_host::{HandshakeError, Host, LostReason, RestartPolicy, SpawnError};
use airlock_protocol::{HostConfig, ViolationCode};
use airlock_tests::e2e::{call_pid, process_alive, rogue_host, worker_bin, ScratchDir};
use airlock_worker::builtin::{Echo, Sleep};
use serde_bytes::ByteBuf;

fn no_restarts() -> RestartPolicy {
    RestartPolicy {
        max_restarts: 0,
        ..RestartPolicy::default()
    }
}

fn scratch(name: &str) -> ScratchDir {
    ScratchDir::new(&format!("worker-processes-{name}"))
}

/// A worker that is a shell script (it never says hello unless told to).
/// Unconfined: these scripts leave evidence at host paths and name host-visible pids.
fn sh_worker(script: &str) -> airlock_host::HostBuilder {
    Host::builder("/bin/sh")
        .confinement(airlock_host::Confinement::none())
        .arg("-c")
        .arg(script)
        .env("PATH", "/usr/bin:/bin")
}

/// sys.rs: `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the
/// host process. tokio runs the supervisor (which forks every worker) on a runtime worker
/// thread, and runtime threads are retired in normal operation: after `block_in_place` the
/// old worker thread returns to the blocking pool and exits after `thread_keep_alive`. The
/// healthy worker then receives SIGKILL although nothing failed; with a restart budget of 0
/// (or after a few such events) the host is dead for good.
#[test]
fn a_worker_survives_the_exit_of_the_runtime_thread_that_forked_it() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_keep_alive(Duration::from_millis(50))
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let host = Host::builder(worker_bin())
            .restart_policy(no_restarts())
            .spawn()
            .await
            .unwrap();
        let pid = call_pid(&host).await.unwrap();
        // An unrelated task uses block_in_place: its worker thread (the one that ran the
        // supervisor and forked the worker) hands its core over and later exits.
        tokio::spawn(async {
            tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(10)));
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            process_alive(pid),
            "the healthy worker {pid} was killed when a runtime thread exited"
        );
        assert_eq!(call_pid(&host).await, Ok(pid));
        host.shutdown().await;
    });
}

/// HostSession caps frames at HANDSHAKE_MAX_FRAME (128 KiB) until a valid Hello ("an
/// unauthenticated peer cannot make the host buffer more"), but the pipe transport's own
/// decoder (spawn.rs `stream_config`) is built with the full `max_frame` (16 MiB by default),
/// and it is the transport that buffers. A length prefix of 1 MiB before the Hello is not
/// refused: the host waits for (and would buffer) the whole megabyte, and only the handshake
/// deadline ends it. Safe: refused at the prefix with FrameTooLarge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_before_the_hello_is_refused_from_its_prefix() {
    let started = Instant::now();
    let result = sh_worker(r"printf '\000\000\020\000'; exec sleep 30")
        .protocol(
            HostConfig::default()
                .handshake_timeout(Duration::from_secs(3))
                .unwrap(),
        )
        .spawn()
        .await;
    let took = started.elapsed();
    match result {
        Err(SpawnError::Handshake(HandshakeError {
            reason: LostReason::Violation(v),
            ..
        })) => {
            assert_eq!(v.code, ViolationCode::FrameTooLarge)
        }
        other => panic!(
            "a 1 MiB frame before the Hello was not refused from its prefix: {:?} after {took:?}",
            other.map(|_| ())
        ),
    }
    assert!(took < Duration::from_secs(1), "took {took:?}");
}

/// The inode of the pipe `pid`'s descriptor `fd` points at ("pipe:[123]").
fn pipe_of(pid: u32, fd: u32) -> Option<String> {
    let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let target = target.to_string_lossy().into_owned();
    target.starts_with("pipe:").then_some(target)
}

fn host_holds(pipe: &str) -> bool {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|t| t.to_string_lossy() == pipe)
}

/// Starts a worker whose grandchild leaves the process group (setsid), closes stdin/stdout and
/// keeps stderr, printing to it; the worker itself then exits without a Hello. Returns the
/// grandchild's pid.
async fn spawn_with_escaped_grandchild(dir: &std::path::Path) -> u32 {
    let mark = dir.join("grandchild");
    let script = format!(
        "setsid sh -c 'echo $$ > {mark}; exec </dev/null >/dev/null; \
         while :; do echo escaped-tick >&2; sleep 0.05; done' & \
         while [ ! -s {mark} ]; do sleep 0.01; done; exit 0",
        mark = mark.display()
    );
    let result = sh_worker(&script).spawn().await;
    assert!(result.is_err(), "the script never says hello");
    std::fs::read_to_string(&mark)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// supervisor.rs `drive`: the stderr relay gets 50 ms after the worker is reaped, then its
/// JoinHandle is dropped, which detaches the task rather than stopping it. A descendant that
/// escaped the process-group kill keeps the relay (and the host's end of the stderr pipe)
/// alive after the worker is gone — after the host is gone, in fact — logging under the dead
/// worker's label. One leaked task and descriptor per lost worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_a_lost_worker_stays_open_in_the_host() {
    let dir = scratch("relay");
    let grandchild = spawn_with_escaped_grandchild(&dir).await;
    let pipe = pipe_of(grandchild, 2).expect("grandchild stderr is the worker's stderr pipe");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leaked = host_holds(&pipe);
    // Clean up the process this test started, by its id.
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(grandchild as i32).unwrap(),
        rustix::process::Signal::KILL,
    );
    assert!(
        !leaked,
        "the host still reads {pipe}, the stderr of a worker it already lost"
    );
}

/// A descendant that calls `setsid()` leaves the worker's process group, so the group kill
/// misses it, and `PR_SET_PDEATHSIG` is not inherited across fork: unconfined, it outlives its
/// worker. Confined, the worker is PID 1 of its own PID namespace, and the kernel kills every
/// member when it dies. The descendant writes nothing (a writer would die of SIGPIPE once the
/// host closes its pipes, which would make this test pass vacuously).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descendant_that_leaves_the_process_group_dies_with_the_worker() {
    use airlock_tests::e2e::{rogue_host_in, the_escaped_descendant, PID_MAX_LIMIT};
    // Live: unconfined, a descendant in a session of its own survives its worker.
    let dir = scratch("setsid");
    let mark = dir.join("grandchild");
    let script = format!(
        "setsid sh -c 'echo $$ > {mark}; exec </dev/null >/dev/null 2>/dev/null; exec sleep 1000' & \
         while [ ! -s {mark} ]; do sleep 0.01; done; exit 0",
        mark = mark.display()
    );
    assert!(sh_worker(&script).spawn().await.is_err());
    let grandchild: u32 = std::fs::read_to_string(&mark)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let survived = process_alive(grandchild);
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(grandchild as i32).unwrap(),
        rustix::process::Signal::KILL,
    );
    assert!(
        survived,
        "unconfined, the descendant {grandchild} must survive, or this proves nothing"
    );

    // Confined (the default): the rogue starts a descendant that leaves its session and takes
    // a name the host can find, then exits; the descendant dies with the PID namespace.
    let dir = scratch("setsid-confined");
    let host = rogue_host_in(&dir)
        .arg("fork_grandchild")
        .env("ROGUE_MARK", dir.join("mark"))
        .spawn()
        .await
        .unwrap();
    let name = the_escaped_descendant(&host, &dir).await;
    assert!(
        name >= PID_MAX_LIMIT,
        "a confined descendant's name: {name}"
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while process_alive(name) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !process_alive(name),
        "a descendant of the dead confined worker lives on"
    );
    host.shutdown().await;
}

/// supervisor.rs: the writer queue (`WRITE_QUEUE` = 1024 batches) overflowing is treated as "the
/// worker stopped reading", but its occupancy depends on how many calls and cancels the
/// *callers* issue while one write is pending, not on how long the worker has not read. An
/// honest worker that is busy for 1.5 s (well under the 5 s send timeout) while callers start
/// 1,000 calls and drop 500 of them is killed with TransportFailed, and every call on it is
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_briefly_busy_honest_worker_is_not_killed_by_a_burst_of_calls() {
    let host = rogue_host()
        .arg("honest")
        .call_timeout(Duration::from_secs(20))
        .spawn()
        .await
        .unwrap();
    // The rogue serves one call at a time and does not read while it sleeps.
    let sleeper = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Sleep>(&1_500).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let body = ByteBuf::from(vec![7u8; 2048]);
    let mut calls: Vec<_> = (0..1000)
        .map(|_| {
            let host = host.clone();
            let body = body.clone();
            tokio::spawn(async move { host.call::<Echo>(&body).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for call in calls.drain(..500) {
        call.abort();
    }
    assert_eq!(
        sleeper.await.unwrap(),
        Ok(1_500),
        "the busy worker was declared dead"
    );
    for call in calls {
        assert_eq!(call.await.unwrap(), Ok(body.clone()));
    }
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}

// ----- stderr relay: log forging with Unicode separators -----

use airlock_tests::capture::captured;

/// stderr.rs `emit` replaces only `char::is_control` characters. U+2028/U+2029 (line and
/// paragraph separators) and the bidi overrides are not controls, so a worker can still split
/// or visually rewrite the host's log lines — the very characters the protocol's error
/// messages refuse (`airlock_codec::is_unsafe_in_text`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_stderr_cannot_forge_log_lines_with_unicode_separators() {
    let captured = captured();
    // U+2028 LINE SEPARATOR, then U+202E RIGHT-TO-LEFT OVERRIDE.
    let _ = sh_worker(
        r"printf 'stderr-marker ok\342\200\250airlock::host: worker healthy \342\200\256gnp.exe\n' >&2; exit 0",
    )
    .spawn()
    .await;
    let line = captured
        .first_line_containing("stderr-marker", Duration::from_secs(2))
        .await;
    let unsafe_chars: Vec<char> = line
        .chars()
        .filter(|c| airlock_codec::is_unsafe_in_text(*c))
        .collect();
    assert!(
        unsafe_chars.is_empty(),
        "relayed to the host log unescaped: {unsafe_chars:?} in {line:?}"
    );
}
