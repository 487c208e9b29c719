//! A timeout is not a death sentence for its neighbours. When a call's deadline passes its
//! caller gets `Timeout` at once and the worker is sent `Cancel`; the worker is killed (and its
//! other calls lost) only if the handler is still running when the cancel grace ends.
//!
//! Each test shows the harm first, with the grace set to zero (the kill at the deadline that
//! a grace replaces), then the same scenario with a grace.

use std::time::{Duration, Instant};

use airlock_host::{CallError, Host, HostBuilder, HostConfig, LostReason, Pool};
use airlock_tests::e2e::{rogue_host, worker_bin};
use airlock_worker::builtin::{Echo, Sleep};
use serde_bytes::ByteBuf;

fn with_grace(builder: HostBuilder, grace: Duration) -> HostBuilder {
    builder.protocol(HostConfig::default().cancel_grace(grace).unwrap())
}

/// 1,000 concurrent calls on a `Pool` of three, one of them with a 50 ms deadline on a handler
/// that would sleep for ten seconds. Returns how many of the 999 unrelated calls failed.
async fn unrelated_failures(grace: Duration) -> usize {
    let pool = Pool::builder(with_grace(Host::builder(worker_bin()), grace))
        .size(3)
        .spawn()
        .await
        .expect("spawn the pool");
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..999u64 {
        let caller = pool.clone();
        calls.spawn(async move { caller.call::<Sleep>(&(40 + i % 20)).await });
        if i == 500 {
            let pool = pool.clone();
            calls.spawn(async move {
                let deadline = Instant::now() + Duration::from_millis(50);
                let victim = pool.call_with_deadline::<Sleep>(&10_000, deadline).await;
                assert_eq!(victim, Err(CallError::Timeout), "the victim times out");
                // Marked so it is not counted among the unrelated calls.
                Ok(u64::MAX)
            });
        }
    }
    let mut failed = 0;
    while let Some(joined) = calls.join_next().await {
        match joined.expect("no call task panics") {
            Ok(_) => {}
            Err(err) => {
                assert_eq!(
                    err,
                    CallError::WorkerLost(LostReason::OtherCallTimedOut),
                    "an unrelated call fails only because the victim's worker was killed"
                );
                failed += 1;
            }
        }
    }
    pool.shutdown().await;
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_timeout_in_a_pool_of_three_leaves_the_unrelated_calls_alone() {
    let before = unrelated_failures(Duration::ZERO).await;
    let after = unrelated_failures(airlock_host::DEFAULT_CANCEL_GRACE).await;
    println!(
        "unrelated calls failed of 999: {before} with no grace, {after} with the default grace"
    );
    assert!(
        before >= 50,
        "with no grace the victim's worker takes its neighbours down ({before} failed)"
    );
    assert!(
        after * 100 <= 999,
        "at most 1% of the unrelated calls fail with the grace ({after} failed)"
    );
}

/// A worker that never answers the timed-out call (it reads nothing more) keeps its process
/// only for the grace: the caller has `Timeout` at the deadline, a neighbour call is lost when
/// the grace ends, and a fresh worker replaces it.
#[tokio::test(flavor = "current_thread")]
async fn a_worker_that_ignores_the_cancel_is_killed_when_the_grace_ends() {
    let grace = Duration::from_millis(600);
    let host = with_grace(rogue_host().arg("hang"), grace)
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let started = Instant::now();
    let deadline = started + Duration::from_millis(200);
    let (victim, neighbour) = (
        ByteBuf::from(b"victim".to_vec()),
        ByteBuf::from(b"neighbour".to_vec()),
    );
    let victim = host.call_with_deadline::<Echo>(&victim, deadline);
    let neighbour = host.call_with_deadline::<Echo>(&neighbour, started + Duration::from_secs(10));
    let (victim, neighbour) = tokio::join!(
        async {
            let outcome = victim.await;
            (outcome, started.elapsed(), host.stats().restarts)
        },
        async {
            let outcome = neighbour.await;
            (outcome, started.elapsed())
        }
    );
    let (victim, victim_at, restarts_at_timeout) = victim;
    let (neighbour, neighbour_at) = neighbour;
    assert_eq!(victim, Err(CallError::Timeout));
    assert!(
        victim_at < Duration::from_millis(200) + grace / 2,
        "Timeout comes at the deadline, not after the grace: {victim_at:?}"
    );
    assert_eq!(
        restarts_at_timeout, 0,
        "the worker lives on through the grace"
    );
    assert_eq!(
        neighbour,
        Err(CallError::WorkerLost(LostReason::OtherCallTimedOut))
    );
    assert!(
        neighbour_at >= Duration::from_millis(200) + grace,
        "the worker was killed only once the grace ended: {neighbour_at:?}"
    );
    host.shutdown().await;
}

/// The honest worker's async handler is dropped at the `Cancel` and the worker says so: the
/// calls running beside the timed-out one finish normally and nothing is restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_honours_the_cancel_keeps_its_worker_and_its_neighbours() {
    for (grace, neighbours_survive) in [
        (Duration::ZERO, false),
        (airlock_host::DEFAULT_CANCEL_GRACE, true),
    ] {
        let host = with_grace(Host::builder(worker_bin()), grace)
            .spawn()
            .await
            .expect("spawn");
        let neighbours: Vec<_> = (0..8)
            .map(|_| {
                let host = host.clone();
                tokio::spawn(async move { host.call::<Sleep>(&300).await })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_millis(100);
        assert_eq!(
            host.call_with_deadline::<Sleep>(&10_000, deadline).await,
            Err(CallError::Timeout)
        );
        let mut survived = 0;
        for neighbour in neighbours {
            if neighbour.await.unwrap() == Ok(300) {
                survived += 1;
            }
        }
        if neighbours_survive {
            assert_eq!(survived, 8, "every neighbour finishes");
            tokio::time::sleep(grace + Duration::from_millis(200)).await;
            assert_eq!(host.stats().restarts, 0, "the worker was never killed");
        } else {
            assert_eq!(
                survived, 0,
                "with no grace the neighbours die with the worker"
            );
        }
        host.shutdown().await;
    }
}

/// A blocking handler cannot be dropped like an async one; one registered with
/// `cancellable_blocking_method` sees its token cancelled when its call times out and stops,
/// instead of running out its ten seconds on its thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_handler_that_checks_its_token_stops_when_its_call_times_out() {
    use airlock_worker::builtin::{Crunch, CrunchesCancelled};
    let host = Host::builder(worker_bin()).spawn().await.expect("spawn");
    assert_eq!(host.call::<CrunchesCancelled>(&()).await, Ok(0));
    let deadline = Instant::now() + Duration::from_millis(100);
    assert_eq!(
        host.call_with_deadline::<Crunch>(&10_000, deadline).await,
        Err(CallError::Timeout)
    );
    let started = Instant::now();
    loop {
        if host.call::<CrunchesCancelled>(&()).await == Ok(1) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the handler never saw its token cancelled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(host.stats().restarts, 0, "the worker was never killed");
    host.shutdown().await;
}
