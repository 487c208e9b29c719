//! How a `Pool` routes calls around a worker it is losing.
//!
//! A call goes to a worker taking calls now: not to one being reaped or replaced while a
//! sibling could answer. And a `Pool` may retry, once and on another worker, a call lost to
//! another call's failure, when it is asked to (`PoolBuilder::retry_lost_calls`) and the method
//! declares itself safe to run twice (`Method::IDEMPOTENT`). Shown with the rogue worker: a
//! victim call stops its worker for good (`hang`) and times out; when the cancel grace ends
//! the worker is killed, and the neighbour call that was on it is lost with
//! `OtherCallTimedOut`.

use std::time::{Duration, Instant};

use airlock_host::{CallError, Host, HostConfig, LostReason, Pool, PoolStats, RestartPolicy};
use airlock_tests::e2e::{rogue_host, worker_bin};
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

/// While a worker is replaced (here its replacement waits out a 2 s restart backoff), the
/// pool's calls go to its sibling, which answers at once, instead of waiting for the
/// replacement: the two are equally idle by their calls in flight, and the worker being
/// replaced comes first in the pool.
#[tokio::test(flavor = "current_thread")]
async fn a_call_goes_to_a_worker_taking_calls_not_to_one_being_replaced() {
    let builder = Host::builder(worker_bin())
        .protocol(HostConfig::default().cancel_grace(Duration::ZERO).unwrap())
        .restart_policy(RestartPolicy {
            initial_backoff: Duration::from_secs(2),
            ..RestartPolicy::default()
        });
    let pool = Pool::builder(builder).size(2).spawn().await.unwrap();
    let (replaced, sibling) = (&pool.hosts()[0], &pool.hosts()[1]);
    assert!(replaced.is_taking_calls() && sibling.is_taking_calls());
    let first_pid = replaced.worker_pid();

    // Its call times out and, with no cancel grace, the worker is killed.
    let deadline = Instant::now() + Duration::from_millis(100);
    let lost = replaced.call_with_deadline::<Sleep>(&5_000, deadline).await;
    assert_eq!(lost, Err(CallError::Timeout));
    let waited = Instant::now();
    while replaced.is_taking_calls() {
        assert!(
            waited.elapsed() < Duration::from_secs(1),
            "worker 0 still takes calls"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!((replaced.in_flight(), sibling.in_flight()), (0, 0));
    assert!(replaced.is_alive(), "being replaced, not given up on");

    let started = Instant::now();
    let answer = pool.call::<Sleep>(&10).await;
    let took = started.elapsed();
    assert_eq!(answer, Ok(10));
    assert!(
        took < Duration::from_secs(1),
        "the call waited {took:?}: it went to the worker being replaced"
    );
    let stats = pool.stats();
    assert_eq!(
        stats.workers[1].methods["sleep"].ok, 1,
        "the sibling answered"
    );
    assert_eq!(
        replaced.worker_pid(),
        first_pid,
        "answered before the replacement was started"
    );
    pool.shutdown().await;
    assert!(
        !sibling.is_taking_calls(),
        "a shut-down worker takes no calls"
    );
}

/// A worker taking calls but at its `max_in_flight` is passed over for one being replaced:
/// the call waits for the replacement instead of being refused as `Overloaded` at once.
#[tokio::test(flavor = "current_thread")]
async fn a_call_waits_for_a_replacement_rather_than_be_refused_by_a_full_sibling() {
    let builder = Host::builder(worker_bin())
        .protocol(
            HostConfig::default()
                .cancel_grace(Duration::ZERO)
                .unwrap()
                .max_in_flight(1)
                .unwrap(),
        )
        .restart_policy(RestartPolicy {
            initial_backoff: Duration::from_millis(500),
            ..RestartPolicy::default()
        });
    let pool = Pool::builder(builder).size(2).spawn().await.unwrap();
    let (full, replaced) = (pool.hosts()[0].clone(), &pool.hosts()[1]);
    let deadline = Instant::now() + Duration::from_millis(100);
    let lost = replaced.call_with_deadline::<Sleep>(&5_000, deadline).await;
    assert_eq!(lost, Err(CallError::Timeout));
    while replaced.is_taking_calls() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let busy = tokio::spawn(async move { full.call::<Sleep>(&1_500).await });
    while pool.hosts()[0].in_flight() < 1 {
        tokio::task::yield_now().await;
    }
    let answer = pool.call::<Sleep>(&10).await;
    assert_eq!(answer, Ok(10), "refused by the full worker, or lost");
    assert_eq!(busy.await.unwrap(), Ok(1_500));
    pool.shutdown().await;
}
