//! Call outcomes in the runtime, in process (the same codec, sessions and supervisor as a real
//! worker, no process): an oversized response is answered, an expired call neither kills its
//! worker nor spends the restart budget, a panicking decoder is that call's `Panic`, a liar is
//! cut off before it answers a sibling, cancelled blocking handlers keep their slot, an
//! out-of-range duration is a configuration error, and a call made while a lost worker is
//! reaped is answered at its own deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_host::{CallError, Host, InProcess};
use airlock_protocol::{ErrorKind, HostConfig};
use airlock_worker::builtin::{builtin_worker, Sleep, Sum};
use airlock_worker::Worker;
use serde::{Deserialize, Deserializer, Serialize};
use serde_bytes::ByteBuf;

airlock_host::method!(
    /// A method whose handler answers `n` zero bytes.
    Big, "big", u32 => ByteBuf
);

fn sleep_method(worker: Worker) -> Worker {
    worker.method::<Sleep, _, _>(|millis| async move {
        tokio::time::sleep(Duration::from_millis(millis)).await;
        Ok(millis)
    })
}

/// A handler whose encoded response does not fit in `max_frame` cannot be answered with it
/// (`WorkerSession::reply_return` fails with `TooLarge`); the worker answers the call with a
/// `Fail` at once. No call is left without a terminal frame: one would hold its caller to the
/// deadline, and then the worker would be killed with every sibling call on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_handler_response_is_answered_not_dropped() {
    let builder = Host::builder("in-process")
        .protocol(HostConfig::default().max_frame(64 * 1024).unwrap())
        .call_timeout(Duration::from_secs(3));
    let host = InProcess::with_builder(builder, || {
        sleep_method(
            Worker::new()
                .method::<Big, _, _>(|n| async move { Ok(ByteBuf::from(vec![0u8; n as usize])) }),
        )
    })
    .await
    .unwrap();
    let sibling = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Sleep>(&1_000).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;

    let started = Instant::now();
    let big = host.call::<Big>(&100_000).await;
    let took = started.elapsed();
    assert!(
        matches!(big, Err(CallError::Remote(_))),
        "an oversized response must fail as data, got {big:?} after {took:?}"
    );
    assert!(took < Duration::from_secs(1), "the call hung for {took:?}");
    assert_eq!(
        sibling.await.unwrap(),
        Ok(1_000),
        "a sibling call was lost with it"
    );
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}

/// A call whose deadline has already passed when it reaches a ready worker is `Timeout` and is
/// never sent. With no cancel grace, a call that did reach the worker would time out there at
/// once and take the worker down with the sibling call beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_already_expired_call_does_not_kill_the_worker_under_its_siblings() {
    let builder = Host::builder("in-process")
        .protocol(HostConfig::default().cancel_grace(Duration::ZERO).unwrap());
    let host = InProcess::with_builder(builder, builtin_worker)
        .await
        .unwrap();
    let sibling = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Sleep>(&300).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let expired = host
        .call_with_deadline::<Sum>(&vec![1], Instant::now())
        .await;
    assert_eq!(expired, Err(CallError::Timeout));
    assert_eq!(
        sibling.await.unwrap(),
        Ok(300),
        "a call that was never going to run killed the worker under its sibling"
    );
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}

/// A request that takes 50 ms to encode, and encodes as the `u64` that `sleep` takes.
struct SlowToEncode(u64);
impl Serialize for SlowToEncode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        std::thread::sleep(Duration::from_millis(50));
        self.0.serialize(s)
    }
}
impl<'de> Deserialize<'de> for SlowToEncode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        u64::deserialize(d).map(SlowToEncode)
    }
}
airlock_host::method!(
    /// `sleep`, with a request slow to encode.
    SlowSleep, "sleep", SlowToEncode => u64
);

/// A call's deadline runs from before its request is encoded, and a deadline that passed while
/// the request was encoded is seen before the call is sent: the call is `Timeout` and never
/// reaches the worker. With no cancel grace, a call that did reach it would time out there and
/// take the worker down with the sibling call beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_deadline_passed_while_its_request_was_encoded_is_not_sent() {
    let builder = Host::builder("in-process")
        .protocol(HostConfig::default().cancel_grace(Duration::ZERO).unwrap())
        .call_timeout(Duration::from_millis(20));
    let host = InProcess::with_builder(builder, builtin_worker)
        .await
        .unwrap();
    for round in 0..2 {
        let sibling = {
            let host = host.clone();
            let deadline = Instant::now() + Duration::from_secs(5);
            tokio::spawn(async move { host.call_with_deadline::<Sleep>(&200, deadline).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The host's own 20 ms call deadline, then an explicit one 20 ms away.
        let late = if round == 0 {
            host.call::<SlowSleep>(&SlowToEncode(500)).await
        } else {
            let deadline = Instant::now() + Duration::from_millis(20);
            host.call_with_deadline::<SlowSleep>(&SlowToEncode(500), deadline)
                .await
        };
        assert_eq!(late, Err(CallError::Timeout), "round {round}");
        assert_eq!(
            sibling.await.unwrap(),
            Ok(200),
            "round {round}: a call already over when its request was encoded was sent, and \
             took the worker down under its sibling"
        );
    }
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}

/// Calls whose deadline already passed, each made while a worker is ready, cost no restart:
/// six of them in a row (with no cancel grace, each would kill the worker if it were sent)
/// leave the first worker serving, and the restart budget untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn already_expired_calls_do_not_exhaust_the_restart_budget() {
    let builder = Host::builder("in-process")
        .protocol(HostConfig::default().cancel_grace(Duration::ZERO).unwrap());
    let host = InProcess::with_builder(builder, builtin_worker)
        .await
        .unwrap();
    for round in 0..6 {
        // A worker is ready: the next call finds it so.
        assert_eq!(host.call::<Sum>(&vec![1]).await, Ok(1), "round {round}");
        let expired = host.call_with_deadline::<Sleep>(&20, Instant::now()).await;
        assert_eq!(expired, Err(CallError::Timeout), "round {round}");
    }
    assert!(
        host.host().is_alive(),
        "expired deadlines spent the restart budget: stats {:?}",
        host.stats()
    );
    assert_eq!(
        host.stats().restarts,
        0,
        "an expired call reached the worker"
    );
    assert_eq!(host.call::<Sum>(&vec![2]).await, Ok(2));
    host.shutdown().await;
}

/// A request type whose `Deserialize` panics on 13 (a validating newtype using `assert!`).
#[derive(Serialize)]
struct Trap(u32);
impl<'de> Deserialize<'de> for Trap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = u32::deserialize(d)?;
        assert!(v != 13, "unlucky request");
        Ok(Trap(v))
    }
}
airlock_host::method!(
    TrapHost, "trap", u32 => u32
);
airlock_host::method!(
    TrapWorker, "trap", Trap => u32
);

/// A request type whose `Deserialize` panics fails that call alone, as a `Panic` failure: the
/// worker catches the panic wherever the request is decoded (on the serving loop or in the
/// call's task), lives on, and its sibling calls are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_request_decoder_is_a_panic_failure_not_a_dead_worker() {
    let host = InProcess::new(|| {
        sleep_method(Worker::new().method::<TrapWorker, _, _>(|t: Trap| async move { Ok(t.0) }))
    })
    .await
    .unwrap();
    let sibling = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Sleep>(&300).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    match host.call::<TrapHost>(&13).await {
        Err(CallError::Remote(e)) => assert_eq!(e.kind(), ErrorKind::Panic),
        other => panic!("expected a Panic failure, got {other:?}"),
    }
    assert_eq!(sibling.await.unwrap(), Ok(300), "a sibling call was lost");
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}

airlock_host::method!(
    LieHost, "lie", () => u64
);
airlock_host::method!(
    LieWorker, "lie", () => String
);
airlock_host::method!(
    After, "after", () => u64
);

/// A response that does not decode is caught where its frame is accepted, with the method's
/// own decoder, so the liar is cut off before the host takes another frame from it. Here it
/// answers `lie` with bytes that are not a `u64`, then answers `after` at once; `after` must
/// not be delivered as a success.
#[tokio::test]
async fn a_liar_is_cut_off_before_it_answers_a_sibling() {
    let host = InProcess::new(|| {
        let notify = Arc::new(tokio::sync::Notify::new());
        let signal = Arc::clone(&notify);
        Worker::new()
            .method::<LieWorker, _, _>(move |()| {
                let signal = Arc::clone(&signal);
                async move {
                    signal.notify_one();
                    Ok("xyz".to_string())
                }
            })
            .method::<After, _, _>(move |()| {
                let notify = Arc::clone(&notify);
                async move {
                    notify.notified().await;
                    Ok(7)
                }
            })
    })
    .await
    .unwrap();
    let (after, lie) = tokio::join!(host.call::<After>(&()), async {
        // Let `after` be dispatched first, so both are running when `lie` answers.
        tokio::task::yield_now().await;
        host.call::<LieHost>(&()).await
    });
    assert!(matches!(lie, Err(CallError::Decode(_))), "{lie:?}");
    assert!(
        after.is_err(),
        "the worker that lied was still trusted with the next answer: {after:?}"
    );
    host.shutdown().await;
}

airlock_host::method!(
    Busy, "busy", u64 => ()
);

/// A cancelled blocking handler runs on until it returns and keeps its concurrency slot
/// meanwhile: `max_concurrency(1)` never runs a second handler beside it, however often the
/// host cancels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_blocking_handlers_still_count_against_max_concurrency() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (r, m) = (Arc::clone(&running), Arc::clone(&most));
    let host = InProcess::new(move || {
        let (running, most) = (Arc::clone(&r), Arc::clone(&m));
        Worker::new()
            .max_concurrency(1)
            .blocking_method::<Busy, _>(move |millis| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(millis));
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
    })
    .await
    .unwrap();
    // Start a 400 ms handler and drop its call after 50 ms (cancel-on-drop).
    let dropped = tokio::time::timeout(Duration::from_millis(50), host.call::<Busy>(&400)).await;
    assert!(dropped.is_err());
    // The next call waits for the slot the cancelled handler still holds.
    assert_eq!(host.call::<Busy>(&10).await, Ok(()));
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "max_concurrency(1) ran two handlers at once"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    host.shutdown().await;
}

/// A duration too long to add to the clock (a "practically infinite" timeout or grace) is
/// refused as a configuration error before anything starts, never a supervisor that panics
/// when it adds it to `Instant::now()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_range_duration_is_refused_not_a_supervisor_panic() {
    // The protocol's own setter refuses it outright...
    assert!(matches!(
        HostConfig::default().handshake_timeout(Duration::MAX),
        Err(airlock_protocol::ConfigError::TimeoutTooLong(_))
    ));
    // ...and the host's builder settings are checked before anything starts.
    for builder in [
        Host::builder("in-process").shutdown_grace(Duration::MAX),
        Host::builder("in-process").call_timeout(Duration::MAX),
        Host::builder("in-process").send_timeout(Duration::MAX),
    ] {
        match InProcess::with_builder(builder, builtin_worker).await {
            Err(airlock_host::SpawnError::Config(_)) => {}
            Ok(_) => panic!("an out-of-range duration was accepted"),
            Err(other) => panic!("the supervisor died: {other}"),
        }
    }
}

airlock_host::method!(
    /// Blocks the worker's thread for `n` ms, as a handler that never yields would.
    Stall, "stall", u64 => u64
);

/// However long a lost worker takes to die, a call made meanwhile is answered at its own
/// deadline: the supervisor takes calls while it reaps. Here the in-process worker's handler
/// blocks its serving task's thread for 2 s, so after its call times out (with no cancel grace,
/// which takes the worker down) the reap of that task takes as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_call_made_while_a_lost_worker_is_reaped_is_answered_at_its_deadline() {
    let builder = Host::builder("in-process")
        .protocol(HostConfig::default().cancel_grace(Duration::ZERO).unwrap());
    let host = InProcess::with_builder(builder, || {
        Worker::new().method::<Stall, _, _>(|millis| async move {
            std::thread::sleep(Duration::from_millis(millis));
            Ok(millis)
        })
    })
    .await
    .unwrap();
    let started = Instant::now();
    let stalled = {
        let host = host.clone();
        let deadline = started + Duration::from_millis(100);
        tokio::spawn(async move {
            let outcome = host.call_with_deadline::<Stall>(&2_000, deadline).await;
            (outcome, started.elapsed())
        })
    };
    // The stalled call timed out at 100 ms; its worker is being reaped.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let deadline = Instant::now() + Duration::from_millis(200);
    let during = host.call_with_deadline::<Stall>(&0, deadline).await;
    let late = Instant::now().saturating_duration_since(deadline);
    assert_eq!(during, Err(CallError::Timeout));
    assert!(
        late < Duration::from_millis(500),
        "a call made while the lost worker was reaped was answered {late:?} after its deadline"
    );
    // The reap did take the handler's 2 s (the stalled call is answered once it is over), so
    // the call above was made while it ran.
    let (outcome, answered_after) = stalled.await.unwrap();
    assert_eq!(outcome, Err(CallError::Timeout));
    assert!(
        answered_after >= Duration::from_millis(1_500),
        "{answered_after:?}"
    );
    assert_eq!(
        host.call::<Stall>(&1).await,
        Ok(1),
        "the replacement serves"
    );
    host.shutdown().await;
}
