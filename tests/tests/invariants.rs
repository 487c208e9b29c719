//! One test per invariant in ARCHITECTURE.md's table, named for it, each against the real
//! worker binary or the rogue worker. The exhaustive suites (adversarial, lifecycle, the
//! protocol's unit tests) go further; these say, in one place, where each promise is checked
//! end to end.

use std::time::{Duration, Instant};

use airlock_codec::{from_slice, DecodeError, Limits, Value};
use airlock_host::{CallError, HandshakeError, Host, LostReason, SpawnError};
use airlock_protocol::{CallId, ErrorKind, RefuseReason, ViolationCode};
use airlock_tests::e2e::{
    fast_restarts, process_present, rogue_host, rogue_host_in, worker_bin, ScratchDir, SumOfBytes,
};
use airlock_worker::builtin::{Echo, Fail, Sleep, Sum};
use serde_bytes::ByteBuf;

fn rogue(scenario: &str) -> airlock_host::HostBuilder {
    rogue_with(rogue_host(), scenario)
}

/// A rogue that leaves its evidence in `dir`.
fn rogue_in(dir: &std::path::Path, scenario: &str) -> airlock_host::HostBuilder {
    rogue_with(rogue_host_in(dir), scenario)
}

fn rogue_with(host: airlock_host::HostBuilder, scenario: &str) -> airlock_host::HostBuilder {
    host.arg(scenario).restart_policy(fast_restarts(3))
}

fn payload(text: &str) -> ByteBuf {
    ByteBuf::from(text.as_bytes().to_vec())
}

fn violation_of(result: &Result<ByteBuf, CallError>) -> Option<ViolationCode> {
    match result {
        Err(CallError::WorkerLost(reason)) => reason.violation_code(),
        _ => None,
    }
}

/// Invariant 1: no input from the worker makes the host run code other than airlock's decoder
/// and the declared type's `Deserialize`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_01_worker_bytes_reach_only_the_decoder() {
    // The payload that made Python sandboxes run code: a pickle calling os.system.
    let pickle = b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.";
    assert_eq!(
        Value::from_slice(pickle, &Limits::default()),
        Err(DecodeError::BadValueTag(b'c'))
    );
    // As a typed answer it is just bytes: they can become a `ByteBuf` and nothing else.
    assert!(from_slice::<u64>(pickle, &Limits::default()).is_err());
    // End to end: a body valid for another method's type is a decode failure, not a cast.
    let host = rogue("wrong_type_body").spawn().await.unwrap();
    assert!(matches!(
        host.call::<Echo>(&payload("x")).await,
        Err(CallError::Decode(_))
    ));
    host.shutdown().await;
}

/// Invariant 2: decoding allocates O(frame length), honours every budget, never panics, never
/// overflows the stack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_02_decoding_is_bounded() {
    let host = rogue("return_len_bomb").spawn().await.unwrap();
    match host.call::<Echo>(&payload("x")).await {
        Err(CallError::Decode(DecodeError::LengthLimit { len, .. })) => assert_eq!(len, 1 << 60),
        other => panic!("expected the 2^60-byte claim refused, got {other:?}"),
    }
    host.shutdown().await;
    let deep = rogue("deep_nesting").spawn().await.unwrap();
    // `echo` is not recursive; the deep body fails as whatever it cannot be, without recursion.
    assert!(deep.call::<Echo>(&payload("x")).await.is_err());
    deep.shutdown().await;
}

/// Invariant 3: a frame reaches a call only if `(id, phase, name)` matches it and its state
/// admits the phase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_03_frames_bind_to_id_phase_and_name() {
    for (scenario, code) in [
        ("random_id", ViolationCode::UnknownCallId),
        ("swapped_name", ViolationCode::MethodMismatch),
        ("progress_after_return", ViolationCode::FinishedCallId),
    ] {
        // Only the first worker strikes, so the violations counted are exactly its own.
        let scratch = ScratchDir::new("inv3");
        let host = rogue_in(&scratch, scenario)
            .env("ROGUE_ONCE", scratch.join("once"))
            .spawn()
            .await
            .unwrap();
        let mut result = host.call::<Echo>(&payload("victim")).await;
        if scenario == "progress_after_return" {
            // The first answer is honest; the late Progress kills the worker before the next.
            assert_eq!(result, Ok(payload("victim")));
            tokio::time::sleep(Duration::from_millis(50)).await;
            result = host.call::<Echo>(&payload("next")).await;
            if result.is_ok() {
                assert_eq!(host.stats().violations.get(&code), Some(&1), "{scenario}");
                host.shutdown().await;
                continue;
            }
        }
        assert_eq!(violation_of(&result), Some(code), "{scenario}: {result:?}");
        host.shutdown().await;
    }
}

/// Invariant 4: call ids are fresh 128-bit CSPRNG values per dispatch; the worker sees an id
/// only once its call has been sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_04_ids_are_fresh_and_unpredictable() {
    let dir = ScratchDir::new("inv4");
    let predicted = dir.join("predicted");
    let host = rogue_in(&dir, "predictable_id")
        .env("ROGUE_PREDICTED", &predicted)
        .spawn()
        .await
        .unwrap();
    assert_eq!(
        host.call::<Echo>(&payload("first")).await,
        Ok(payload("first"))
    );
    // The forgery aimed at the next id lands while no call has it: the worker dies for it,
    // and the next call gets its true answer from a fresh worker.
    let started = Instant::now();
    while !host
        .stats()
        .violations
        .contains_key(&ViolationCode::UnknownCallId)
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the staged frame never landed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(std::fs::read(&predicted).is_ok_and(|b| b.len() == 16));
    assert_eq!(
        host.call::<Echo>(&payload("second")).await,
        Ok(payload("second"))
    );
    host.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    // And the ids themselves: a million draws from the OS generator never repeat.
    let mut rng = rand_core::UnwrapErr(rand_core::OsRng);
    let ids: std::collections::HashSet<CallId> =
        (0..100_000).map(|_| CallId::random(&mut rng)).collect();
    assert_eq!(ids.len(), 100_000);
}

/// Invariant 5: every call ends with exactly one outcome; none is dropped, none answered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_05_every_call_ends_exactly_once() {
    let host = rogue("double_return").spawn().await.unwrap();
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let host = host.clone();
            tokio::spawn(async move { host.call::<Echo>(&payload(&format!("c{i}"))).await })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        // Each task returns exactly once; an `Ok` is always its own payload.
        if let Ok(answer) = call.await.unwrap() {
            assert_eq!(answer, payload(&format!("c{i}")));
        }
    }
    let stats = host.stats();
    assert_eq!(stats.calls_started, stats.calls_ok + failed(&stats));
    host.shutdown().await;
}

fn failed(stats: &airlock_host::HostStats) -> u64 {
    let f = &stats.calls_failed;
    f.remote + f.timeout + f.cancelled + f.worker_lost + f.decode + f.refused + f.shutdown
}

/// Invariant 6: a violation kills and reaps the worker, fails all its calls with the reason,
/// and it is never reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_06_a_violation_kills_reaps_and_replaces() {
    let scratch = ScratchDir::new("inv6");
    let marker = scratch.join("once");
    let host = rogue_in(&scratch, "echo_call")
        .env("ROGUE_ONCE", &marker)
        .spawn()
        .await
        .unwrap();
    let striker = host
        .worker_pid()
        .expect("a spawned host knows its worker's pid");
    let result = host.call::<Echo>(&payload("x")).await;
    assert_eq!(violation_of(&result), Some(ViolationCode::ForbiddenKind));
    // Killed and reaped before its calls were failed.
    assert!(
        !process_present(striker),
        "the call failed while worker {striker} was still there"
    );
    let next = host.call::<Echo>(&payload("y")).await;
    assert_eq!(next, Ok(payload("y")));
    assert_eq!(host.stats().restarts, 1);
    host.shutdown().await;
    let _ = std::fs::remove_file(&marker);
}

/// Invariant 7: every wait is bounded: call deadlines, the handshake, shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_07_every_wait_is_bounded() {
    let started = Instant::now();
    let silent = rogue("no_hello")
        .protocol(
            airlock_protocol::HostConfig::default()
                .handshake_timeout(Duration::from_millis(300))
                .unwrap(),
        )
        .spawn()
        .await;
    assert!(matches!(
        silent,
        Err(SpawnError::Handshake(HandshakeError {
            reason: LostReason::HandshakeTimeout,
            ..
        }))
    ));
    let host = Host::builder(worker_bin())
        .shutdown_grace(Duration::from_millis(200))
        .spawn()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_millis(200);
    assert_eq!(
        host.call_with_deadline::<Sleep>(&60_000, deadline).await,
        Err(CallError::Timeout)
    );
    let pending = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Sleep>(&60_000).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    host.shutdown().await;
    assert!(pending.await.unwrap().is_err());
    // Every wait above is at most a few hundred milliseconds; an unbounded one would be the
    // 60 s sleeps. The margin is for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "a wait was not bounded"
    );
}

/// The latest `Instant` this platform can represent.
fn end_of_time() -> Instant {
    let now = Instant::now();
    let (mut low, mut high) = (0u64, u64::MAX);
    while low < high {
        let mid = low + (high - low) / 2 + 1;
        if now.checked_add(Duration::from_secs(mid)).is_some() {
            low = mid;
        } else {
            high = mid - 1;
        }
    }
    let mut end = now + Duration::from_secs(low);
    for step in [100_000_000, 1_000_000, 10_000, 100, 1] {
        while let Some(later) = end.checked_add(Duration::from_nanos(step)) {
            end = later;
        }
    }
    end
}

/// Invariant 7, at the edge: a caller's deadline at the end of time means "no deadline" and is
/// held to `MAX_TIMEOUT`. Before, tokio's timer overflowed on it inside the supervisor, and
/// every later call on that host failed with `Shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_07_a_deadline_at_the_end_of_time_is_held_to_max_timeout() {
    let end = end_of_time();
    // Live: that instant really is the last one; one nanosecond more does not exist.
    assert!(end.checked_add(Duration::from_nanos(1)).is_none());
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        host.call_with_deadline::<Sleep>(&5, end),
    )
    .await;
    assert_eq!(answer, Ok(Ok(5)));
    // The supervisor is alive and serving the same worker.
    assert_eq!(host.call::<Sum>(&vec![2, 3]).await, Ok(5));
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}

/// Invariant 8: errors cross as data only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_08_errors_cross_as_data() {
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    match host
        .call::<Fail>(&"line one\nline two\u{1b}[31m".into())
        .await
    {
        Err(CallError::Remote(err)) => {
            assert_eq!(err.kind(), ErrorKind::Handler);
            assert!(
                !err.message().chars().any(char::is_control),
                "{:?}",
                err.message()
            );
        }
        other => panic!("expected a remote error, got {other:?}"),
    }
    host.shutdown().await;
    // A worker claiming an error kind outside the closed set is a violation, not a new type.
    let rogue = rogue("fail_forbidden_kind").spawn().await.unwrap();
    let result = rogue.call::<Echo>(&payload("x")).await;
    assert_eq!(
        violation_of(&result),
        Some(ViolationCode::InvalidErrorDescriptor)
    );
    rogue.shutdown().await;
}

/// Invariant 9: on the socket transport only the spawned child can connect (token and peer
/// credentials). The named listener's refusals are tested process by process in
/// `socket_security.rs`; here a real host's named-socket spawn is attacked: before the worker
/// connects, an impostor (the worker's own child, so it holds the very name and token) connects
/// and says a valid `Hello`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_09_only_the_spawned_child_connects() {
    let scratch = ScratchDir::new("inv9");
    let host = rogue_host_in(&scratch)
        .transport(airlock_host::TransportChoice::SocketNamed)
        .arg("impostor_first")
        .env("ROGUE_MARK", scratch.join("mark"))
        .env("ROGUE_LOG", scratch.join("log"))
        .env("ROGUE_PIDS", scratch.join("pids"))
        .spawn()
        .await
        .unwrap();
    // Live: the impostor connected first, quoting the token the worker then quoted in the Hello
    // the host accepted, so a listener checking the token alone would have taken the impostor.
    // (Read with patience: were the impostor accepted, the spawn would return before it marks.)
    let give_up = Instant::now() + Duration::from_secs(5);
    let mark = loop {
        match std::fs::read_to_string(scratch.join("mark")) {
            Ok(mark) => break mark,
            Err(_) if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => panic!("the impostor left no mark: {e}"),
        }
    };
    let (verdict, impostor_token) = mark
        .strip_prefix("impostor ")
        .and_then(|rest| rest.split_once(' '))
        .unwrap_or_else(|| panic!("the impostor never got a verdict: {mark:?}"));
    let log = std::fs::read_to_string(scratch.join("log")).unwrap_or_default();
    let workers_hello = log
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("> "))
        .unwrap_or_else(|| {
            panic!("the spawned worker never said its Hello (the impostor was {verdict})")
        });
    assert_eq!(impostor_token.len(), 64);
    assert!(
        workers_hello.ends_with(impostor_token),
        "the impostor quoted another token than the worker: {impostor_token} vs {workers_hello}"
    );
    // Refused: the host closed its connection without a word, and serves the spawned child.
    assert_eq!(verdict, "refused");
    let spawned: u32 = std::fs::read_to_string(scratch.join("pids"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The rogue's own identity (its pid, or its PID namespace when confined), as it wrote it.
    assert_eq!(
        host.call::<airlock_worker::builtin::Pid>(&()).await,
        Ok(spawned)
    );
    assert_eq!(
        host.call::<Echo>(&payload("after")).await,
        Ok(payload("after"))
    );
    host.shutdown().await;
}

/// Invariant 10: both directions use the same codec; versions are checked at the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_10_versions_are_checked_at_the_handshake() {
    let spawned = rogue("wrong_version").spawn().await;
    assert!(matches!(
        spawned,
        Err(SpawnError::Handshake(HandshakeError {
            reason: LostReason::Refused(RefuseReason::VersionMismatch),
            ..
        }))
    ));
    // The worker decodes the host's requests with the same codec and budgets: a request that
    // does not decode as the method's type is refused there, as data.
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    match host.call::<SumOfBytes>(&ByteBuf::from(vec![0x80])).await {
        Err(CallError::Remote(err)) => assert_eq!(err.kind(), ErrorKind::BadRequest),
        other => panic!("expected BadRequest, got {other:?}"),
    }
    host.shutdown().await;
}
