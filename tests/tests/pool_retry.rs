//! A `Pool` may retry, once and on another worker, a call lost to another call's failure, when
//! it is asked to (`PoolBuilder::retry_lost_calls`) and the method declares itself safe to run
//! twice (`Method::IDEMPOTENT`). Shown with the rogue worker: a victim call stops its worker
//! for good (`hang`) and times out; when the cancel grace ends the worker is killed, and the
//! neighbour call that was on it is lost with `OtherCallTimedOut`.

use std::time::{Duration, Instant};

use airlock_host::{CallError, HostConfig, LostReason, Pool, PoolStats};
use airlock_tests::e2e::rogue_host;
use airlock_worker::builtin::Sleep;

airlock_host::method!(
    /// The rogue's `misbehave`, declared idempotent: even so, a call that times out itself
    /// is never retried.
    Misbehave, "misbehave", String => (), idempotent
);
airlock_host::method!(
    /// The rogue's honest `sleep`, declared safe to run twice.
    IdempotentSleep, "sleep", u64 => u64, idempotent
);

/// What one run of the scenario ended with.
struct Run {
    victim: Result<(), CallError>,
    neighbour: Result<u64, CallError>,
    stats: PoolStats,
}

/// A pool of two rogue workers (`chaos`: honest until a `misbehave` call). Worker 1 is kept
/// busy with two slow honest calls, so the pool sends both the victim and then the neighbour
/// (`M`, a 10 ms sleep) to worker 0, which the victim makes hang.
async fn run<M>(retry: bool) -> Run
where
    M: airlock_host::Method<Request = u64, Response = u64>,
{
    let grace = Duration::from_millis(200);
    let builder = rogue_host()
        .arg("chaos")
        .protocol(HostConfig::default().cancel_grace(grace).unwrap());
    let pool = Pool::builder(builder)
        .size(2)
        .retry_lost_calls(retry)
        .spawn()
        .await
        .expect("spawn the pool");
    let (hang, busy) = (pool.hosts()[0].clone(), pool.hosts()[1].clone());
    let busy_calls: Vec<_> = (0..2)
        .map(|_| {
            let busy = busy.clone();
            tokio::spawn(async move { busy.call::<Sleep>(&400).await })
        })
        .collect();
    // On this single-threaded runtime a spawned call begins (its frame is queued in order)
    // in the same poll that counts it in flight.
    while busy.in_flight() < 2 {
        tokio::task::yield_now().await;
    }
    let victim = {
        let pool = pool.clone();
        let deadline = Instant::now() + Duration::from_millis(100);
        tokio::spawn(async move {
            pool.call_with_deadline::<Misbehave>(&"hang".to_owned(), deadline)
                .await
        })
    };
    while hang.in_flight() < 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(busy.in_flight(), 2, "the victim went to worker 0");
    let neighbour = pool.call::<M>(&10).await;
    let victim = victim.await.expect("the victim's task");
    for call in busy_calls {
        assert_eq!(call.await.expect("a busy call's task"), Ok(400));
    }
    let stats = pool.stats();
    pool.shutdown().await;
    Run {
        victim,
        neighbour,
        stats,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn without_the_option_a_neighbour_lost_to_another_calls_timeout_fails() {
    let run = run::<IdempotentSleep>(false).await;
    assert_eq!(run.victim, Err(CallError::Timeout));
    assert_eq!(
        run.neighbour,
        Err(CallError::WorkerLost(LostReason::OtherCallTimedOut))
    );
    let sleeps = &run.stats.workers[1].methods["sleep"];
    assert_eq!(sleeps.calls(), 2, "nothing more reached worker 1");
}

#[tokio::test(flavor = "current_thread")]
async fn with_the_option_an_idempotent_neighbour_is_retried_once_on_the_other_worker() {
    let run = run::<IdempotentSleep>(true).await;
    assert_eq!(
        run.victim,
        Err(CallError::Timeout),
        "a call that timed out itself is not retried, idempotent or not"
    );
    assert_eq!(run.neighbour, Ok(10), "the retry succeeded");
    let [lost_on, retried_on] = &run.stats.workers[..] else {
        panic!("two workers: {:?}", run.stats);
    };
    let first = &lost_on.methods["sleep"];
    assert_eq!(
        (first.ok, first.failed),
        (0, 1),
        "the first attempt was lost"
    );
    assert_eq!(lost_on.calls_failed.worker_lost, 1);
    assert_eq!(
        retried_on.methods["sleep"].ok, 3,
        "the two busy calls and the retry"
    );
    assert!(
        !retried_on.methods.contains_key("misbehave"),
        "the victim was not retried"
    );
    assert_eq!(run.stats.total.methods["sleep"].calls(), 4);
}

#[tokio::test(flavor = "current_thread")]
async fn with_the_option_a_method_not_declared_idempotent_is_not_retried() {
    let run = run::<Sleep>(true).await;
    assert_eq!(run.victim, Err(CallError::Timeout));
    assert_eq!(
        run.neighbour,
        Err(CallError::WorkerLost(LostReason::OtherCallTimedOut))
    );
    assert_eq!(run.stats.workers[1].methods["sleep"].calls(), 2);
}
