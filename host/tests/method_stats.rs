//! Per-method stats: every call is counted under its method by outcome, and the calls the
//! worker answered are timed into a histogram whose percentiles bracket the durations the
//! callers saw (never below the true value, less than 1.25 times it). Run in process: the
//! same supervisor and counters as a spawned worker.

use std::time::{Duration, Instant};

use airlock_host::{CallError, InProcess, LatencyHistogram, Value};
use airlock_worker::builtin::{builtin_worker, Sleep, Sum, ECHO_VALUE};

/// A bucket's top is less than this many times any duration in it.
const RESOLUTION: f64 = 1.25;

/// Calls `Sleep(millis)` `times` times at once; returns the longest any caller waited.
async fn sleeps(host: &InProcess, millis: u64, times: usize) -> Duration {
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..times {
        let host = host.clone();
        calls.spawn(async move {
            let started = Instant::now();
            assert_eq!(host.call::<Sleep>(&millis).await, Ok(millis));
            started.elapsed()
        });
    }
    let mut longest = Duration::ZERO;
    while let Some(waited) = calls.join_next().await {
        longest = longest.max(waited.expect("no call task panics"));
    }
    longest
}

/// `reported` is within the histogram's resolution of a true value that is at least `floor`
/// and at most `ceiling` (what a caller measured around the call, which contains the host's
/// own measurement).
fn assert_bracketed(name: &str, reported: Duration, floor: Duration, ceiling: Duration) {
    assert!(
        reported >= floor,
        "{name} {reported:?} is below the sleep of {floor:?}"
    );
    assert!(
        reported < ceiling.mul_f64(RESOLUTION),
        "{name} {reported:?} is beyond the resolution of the {ceiling:?} the callers waited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleep_percentiles_are_ordered_and_within_the_bucket_resolution_of_the_sleeps() {
    let host = InProcess::new(builtin_worker).await.expect("start");
    let (fast, slow) = (Duration::from_millis(20), Duration::from_millis(250));
    // 18 fast and 2 slow calls: the 50th and 90th percentiles are fast ones (ranks 10 and
    // 18 of 20), the 99th is a slow one (rank 20).
    let fast_waited = sleeps(&host, 20, 18).await;
    let slow_waited = sleeps(&host, 250, 2).await;

    let stats = host.stats();
    let sleep = &stats.methods["sleep"];
    assert_eq!((sleep.ok, sleep.failed, sleep.calls()), (20, 0, 20));
    let latency: &LatencyHistogram = &sleep.latency;
    assert_eq!(latency.count(), 20);
    let (p50, p90, p99, max) = (
        latency.p50().unwrap(),
        latency.p90().unwrap(),
        latency.p99().unwrap(),
        latency.max().unwrap(),
    );
    assert!(
        p50 <= p90 && p90 <= p99 && p99 <= max,
        "{latency:?} is out of order"
    );
    assert_bracketed("p50", p50, fast, fast_waited);
    assert_bracketed("p90", p90, fast, fast_waited);
    assert_bracketed("p99", p99, slow, slow_waited);
    assert!(
        max >= slow && max <= slow_waited,
        "max {max:?} is exact: between the sleep and what its caller waited ({slow_waited:?})"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_is_counted_under_its_method_and_only_answered_calls_are_timed() {
    let host = InProcess::new(builtin_worker).await.expect("start");
    assert_eq!(host.call::<Sum>(&vec![1, 2]).await, Ok(3));
    let overflow = host.call::<Sum>(&vec![i64::MAX, 1]).await;
    assert!(
        matches!(overflow, Err(CallError::Remote(_))),
        "{overflow:?}"
    );
    // A sleep that outlives its deadline: the handler honours the cancel and the worker lives.
    let deadline = Instant::now() + Duration::from_millis(30);
    assert_eq!(
        host.call_with_deadline::<Sleep>(&5_000, deadline).await,
        Err(CallError::Timeout)
    );
    assert_eq!(host.call::<Sleep>(&1).await, Ok(1));
    // A dropped call is counted as cancelled under its method.
    let dropped = tokio::time::timeout(Duration::from_millis(30), host.call::<Sleep>(&5_000));
    assert!(
        dropped.await.is_err(),
        "the call was still running when dropped"
    );
    let request = Value::Str("hi".into());
    assert_eq!(host.call_value(ECHO_VALUE, &request).await, Ok(request));

    let stats = host.stats();
    let sum = &stats.methods["sum"];
    assert_eq!((sum.ok, sum.failed), (1, 1));
    assert_eq!(
        sum.latency.count(),
        2,
        "the handler's own error is an answer, and timed"
    );
    let sleep = &stats.methods["sleep"];
    assert_eq!((sleep.ok, sleep.failed), (1, 2));
    assert_eq!(
        sleep.latency.count(),
        1,
        "a timeout and a cancellation are counted, not timed"
    );
    assert!(sleep.latency.max().unwrap() < Duration::from_millis(30));
    assert_eq!(stats.methods[ECHO_VALUE].ok, 1);
    assert_eq!(stats.methods.len(), 3);
    assert_eq!(stats.other_methods.calls(), 0);
    assert_eq!(stats.calls_failed.timeout, 1);
    assert_eq!(stats.calls_failed.cancelled, 1);
    let ended: u64 = stats.methods.values().map(|m| m.calls()).sum();
    assert_eq!(ended, stats.calls_started);
    assert_eq!(ended, stats.calls_ok + stats.calls_failed.total());
    host.shutdown().await;
}
