//! A worker can make a system call on its channel sleep inside the kernel, and can leave a
//! write half done for as long as it likes. The host's deadlines, its send deadline and its
//! shutdown must hold whoever started the write that sleeps and wherever the caller runs.

use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use airlock_host::{CallError, Confinement, Host, LostReason};
use airlock_tests::e2e::{
    fast_restarts, process_alive, rogue_bin, share_with_worker, soon, wait_until, ScratchDir,
};
use airlock_tests::support::current_thread_runtime;
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// SIGKILLs `pid` from outside the host (the test's own way out of a stall it caused).
fn kill(pid: u32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// This process's threads that sleep in the kernel anywhere but the usual waits (futex,
/// epoll), by name and where they sleep.
fn sleeping_threads() -> Vec<(String, String)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| {
            let wchan = read(&task.path().join("wchan"));
            let usual = ["futex", "epoll", "nanosleep"];
            if wchan.is_empty() || wchan == "0" || usual.iter().any(|u| wchan.contains(u)) {
                return None;
            }
            Some((read(&task.path().join("comm")).trim_end().to_owned(), wchan))
        })
        .collect()
}

/// A rogue whose next read is stuck in the kernel, holding its input pipe's lock: two calls
/// made with `deadline` (the first arms the trap, the second's frame is read into it), the
/// rogue's pid, and the tasks awaiting those calls. Proves the stall is live before it returns.
async fn stalled_rogue(
    dir: &ScratchDir,
    deadline: Duration,
) -> (
    Host,
    u32,
    Vec<tokio::task::JoinHandle<Result<ByteBuf, CallError>>>,
) {
    share_with_worker(dir);
    let mark = dir.join("mark");
    let host = Host::builder(rogue_bin())
        .arg("stall_read_in_kernel")
        .env("ROGUE_ONCE", dir.join("once"))
        .env("ROGUE_MARK", &mark)
        // `userfaultfd` is denied by the default confinement; the channel must hold without it.
        .confinement(Confinement::none())
        .restart_policy(fast_restarts(5))
        .shutdown_grace(Duration::from_millis(200))
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let pid = host.worker_pid().expect("a worker process");
    let call = |tag: &'static str| {
        let host = host.clone();
        let at = Instant::now() + deadline;
        tokio::spawn(async move {
            host.call_with_deadline::<Echo>(&ByteBuf::from(tag.as_bytes().to_vec()), at)
                .await
        })
    };
    let first = call("first");
    wait_until("the trap to be armed", Duration::from_secs(5), || {
        !read(&mark).is_empty()
    })
    .await;
    assert_eq!(read(&mark), "armed", "the rogue could not set its trap");
    let second = call("second");
    // The attack is live: the rogue sleeps in the kernel on its unserved fault, inside the
    // pipe read (the pipe's lock is held from here on).
    let wchan = format!("/proc/{pid}/wchan");
    wait_until(
        "the rogue's read to sleep on its unserved fault",
        Duration::from_secs(5),
        || read(Path::new(&wchan)).contains("userfault"),
    )
    .await;
    (host, pid, vec![first, second])
}

/// The rogue reads the host's next frame into a `userfaultfd` page it never serves, so its
/// `read(2)` sleeps in the kernel holding the pipe's lock and any `write(2)` the host makes to
/// that pipe sleeps with it. Whatever task makes that write, the supervisor must still see the
/// calls' deadlines pass, kill the worker (which ends the sleep) and finish a shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pipe_write_sleeping_in_the_kernel_does_not_stall_deadlines_or_shutdown() {
    let dir = ScratchDir::new("kernel-stall");
    let (host, pid, calls) = stalled_rogue(&dir, Duration::from_millis(1500)).await;

    // A graceful shutdown: the host says `Shutdown` on the stalled pipe.
    let shutdown = tokio::spawn({
        let host = host.clone();
        async move { host.shutdown().await }
    });
    let started = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(6), async {
        let mut outcomes = Vec::new();
        for call in calls {
            outcomes.push(call.await.unwrap());
        }
        shutdown.await.unwrap();
        outcomes
    })
    .await;
    let waited = started.elapsed();
    let alive_then = process_alive(pid);
    let host_threads = sleeping_threads();
    // The way out if the host is stuck behind the pipe's lock: only the worker's death ends it.
    kill(pid);
    let outcomes = ended.unwrap_or_else(|_| {
        panic!(
            "calls with 1.5 s deadlines and a 200 ms shutdown grace still unanswered after \
             {waited:?}; the worker was {} (the host never killed it); this process's \
             threads sleeping in the kernel: {host_threads:?}",
            if alive_then { "alive" } else { "dead" }
        )
    });
    for outcome in outcomes {
        assert!(
            matches!(
                outcome,
                Err(CallError::Timeout
                    | CallError::WorkerLost(LostReason::OtherCallTimedOut | LostReason::Shutdown))
            ),
            "{outcome:?}"
        );
    }
    assert!(!alive_then, "the host left the stalled worker alive");
}

/// A caller whose frame meets the stalled pipe must still be able to give up on its call (a
/// `timeout` around it, a `select!`): its poll of the call may not sleep in the kernel until
/// the supervisor kills the worker at some other call's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_caller_whose_frame_meets_a_stalled_pipe_can_still_give_up() {
    let dir = ScratchDir::new("kernel-stall-caller");
    let (host, pid, calls) = stalled_rogue(&dir, Duration::from_secs(5)).await;
    let third = tokio::spawn({
        let host = host.clone();
        async move {
            let started = Instant::now();
            let outcome = tokio::time::timeout(
                Duration::from_millis(300),
                host.call_with_deadline::<Echo>(&ByteBuf::from(b"third".to_vec()), soon(5000)),
            )
            .await;
            (started.elapsed(), outcome.is_err())
        }
    });
    let given_up = tokio::time::timeout(Duration::from_secs(2), third).await;
    let host_threads = sleeping_threads();
    // A call deadline (5 s) ends the stall in any case; don't wait for it.
    kill(pid);
    let (took, timed_out) = given_up
        .unwrap_or_else(|_| {
            panic!(
                "a caller that gave up after 300 ms was still inside its call after 2 s; this \
                 process's threads sleeping in the kernel: {host_threads:?}"
            )
        })
        .unwrap();
    assert!(timed_out && took < Duration::from_secs(1), "{took:?}");
    for call in calls {
        let _ = call.await;
    }
}

/// A caller may run on a runtime of its own (a short-lived one around a blocking API, say).
/// When its frame does not fit in the pipe, the rest of the write is finished by the host and
/// must stay under the host's send deadline after the caller, and its runtime, are gone: a
/// worker that stops reading is cut off at the send deadline, and the calls behind the stuck
/// write learn it then, not at their own deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_begun_on_a_callers_runtime_that_ended_keeps_the_send_deadline() {
    let dir = ScratchDir::new("foreign-runtime");
    share_with_worker(&dir);
    let pids = dir.join("pids");
    let host = Host::builder(rogue_bin())
        .arg("never_read")
        .env("ROGUE_ONCE", dir.join("once"))
        .env("ROGUE_PIDS", &pids)
        .confinement(Confinement::none())
        .restart_policy(fast_restarts(5))
        .send_timeout(Duration::from_millis(500))
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let rogue = host.worker_pid().expect("a worker process");

    // 4 MiB: more than the pipe holds (1 MiB at most), so the write has to wait.
    let caller = host.clone();
    let gave_up = std::thread::spawn(move || {
        let runtime = current_thread_runtime();
        let outcome = runtime.block_on(async {
            tokio::time::timeout(
                Duration::from_millis(100),
                caller.call_with_deadline::<Echo>(&ByteBuf::from(vec![7u8; 4 << 20]), soon(20_000)),
            )
            .await
        });
        outcome.is_err()
    })
    .join()
    .unwrap();
    assert!(gave_up, "the big call was answered: the rogue read it");

    // A call behind the stuck write, with a deadline far beyond the send deadline.
    let started = Instant::now();
    let behind = host
        .call_with_deadline::<Echo>(&ByteBuf::from(b"behind".to_vec()), soon(8000))
        .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the call behind the stuck write waited {took:?} (outcome {behind:?}) with a 500 ms send \
         deadline; the rogue was {}",
        if process_alive(rogue) {
            "still alive"
        } else {
            "dead"
        }
    );
    assert!(
        matches!(behind, Err(CallError::WorkerLost(_))),
        "{behind:?}"
    );
    let fresh = host
        .call_with_deadline::<Echo>(&ByteBuf::from(b"fresh".to_vec()), soon(5000))
        .await;
    assert_eq!(fresh.unwrap().as_slice(), b"fresh");
    assert_eq!(read(&pids).lines().count(), 2, "one replacement");
    host.shutdown().await;
}

/// The identity on a large map: its response takes the host a while to decode.
struct BigMap;
impl airlock_protocol::Method for BigMap {
    const NAME: &'static str = "echo";
    type Request = std::collections::BTreeMap<u64, u64>;
    type Response = std::collections::BTreeMap<u64, u64>;
}

/// A worker's reader belongs to that worker: what it reads after its worker is gone must
/// never reach the session of the worker that replaced it. Here the rogue is honest: it
/// answers one large call and exits. The host decodes the answer (about a second in this
/// build) while the supervisor buries the rogue and starts its replacement; the end of stream
/// that follows the answer is the rogue's, and must not end the replacement. Whether the
/// supervisor gets to run during the decode depends on scheduling, so up to five rounds are
/// played, each with a fresh host; every round must see exactly one replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_workers_end_of_stream_never_reaches_its_replacement() {
    let map: std::collections::BTreeMap<u64, u64> = (0..1_000_000).map(|i| (i, i)).collect();
    for round in 1..=5 {
        let dir = ScratchDir::new("stale-reader");
        share_with_worker(&dir);
        let pids = dir.join("pids");
        let host = Host::builder(rogue_bin())
            .arg("return_then_exit")
            .env("ROGUE_ONCE", dir.join("once"))
            .env("ROGUE_PIDS", &pids)
            .confinement(Confinement::none())
            .restart_policy(fast_restarts(5))
            .spawn()
            .await
            .expect("the rogue completes its handshake");
        let answer = host
            .call_with_deadline::<BigMap>(&map, soon(30_000))
            .await
            .expect("the rogue answers honestly before it exits");
        assert_eq!(answer.len(), map.len());
        // The rogue's exit is acted on once its last frames have had their moment (100 ms):
        // wait for its replacement, then give that one time to settle in.
        wait_until("a replacement to start", Duration::from_secs(10), || {
            read(&pids).lines().count() >= 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let fresh = host
            .call_with_deadline::<Echo>(&ByteBuf::from(b"fresh".to_vec()), soon(10_000))
            .await;
        let started_workers = read(&pids).lines().count();
        assert!(
            fresh.is_ok() && started_workers == 2 && host.stats().restarts == 1,
            "round {round}: one replacement expected after the rogue's exit: fresh call \
             {fresh:?}, {started_workers} workers started, stats {:#?}",
            host.stats()
        );
        host.shutdown().await;
    }
}

/// The host's runtime may end while a caller on another runtime waits, and a caller's future
/// may be dropped where there is no runtime at all: the waiting call still gets exactly one
/// outcome (`Shutdown`), promptly, and the drop neither panics nor hangs.
#[test]
fn calls_outlive_the_hosts_runtime_with_one_outcome() {
    let dir = ScratchDir::new("runtime-gone");
    share_with_worker(&dir);
    let host_runtime = current_thread_runtime();
    let host = host_runtime
        .block_on(
            Host::builder(rogue_bin())
                .arg("ignore_cancel")
                .env("ROGUE_MARK", dir.join("mark"))
                .confinement(Confinement::none())
                .spawn(),
        )
        .expect("the rogue completes its handshake");
    let caller_runtime = current_thread_runtime();
    // A call future polled once on the caller's runtime (its frame is out), then dropped
    // outside any runtime: its cancel is queued for a writer that is still alive.
    let mut dropped = Box::pin({
        let host = host.clone();
        async move {
            host.call_with_deadline::<Echo>(&ByteBuf::from(b"dropped".to_vec()), soon(60_000))
                .await
        }
    });
    caller_runtime.block_on(async {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        assert!(dropped.as_mut().poll(&mut cx).is_pending());
    });
    drop(dropped);
    // The cancel reaches the rogue once the host's runtime runs its writer.
    host_runtime.block_on(async {
        wait_until(
            "the rogue to get the Cancel",
            Duration::from_secs(5),
            || read(&dir.join("mark")).starts_with("cancel "),
        )
        .await;
    });
    let waiting = std::thread::spawn({
        let host = host.clone();
        move || {
            caller_runtime.block_on(async {
                let started = Instant::now();
                let outcome = tokio::time::timeout(
                    Duration::from_secs(10),
                    host.call_with_deadline::<Echo>(
                        &ByteBuf::from(b"waiting".to_vec()),
                        soon(60_000),
                    ),
                )
                .await;
                (outcome, started.elapsed())
            })
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    drop(host_runtime);
    let (outcome, took) = waiting.join().unwrap();
    assert!(
        matches!(outcome, Ok(Err(CallError::Shutdown))),
        "{outcome:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
}
