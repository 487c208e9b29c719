//! A host's per-method stats on a multi-thread runtime: counts kept per thread add up to every
//! call, and a call's latency runs from its start to when the host accepted its answer, so it
//! is never shorter than the handler took nor longer than its caller waited.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_host::Host;
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{Echo, Sleep};
use serde_bytes::ByteBuf;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_from_many_tasks_are_all_counted_and_timed_within_what_their_callers_saw() {
    let host = Arc::new(Host::builder(worker_bin()).spawn().await.unwrap());
    let (tasks, rounds) = (32u64, 50u64);
    let mut callers = Vec::new();
    for task in 0..tasks {
        let host = Arc::clone(&host);
        callers.push(tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            for round in 0..rounds {
                let mine = ByteBuf::from(format!("{task}-{round}").into_bytes());
                let started = Instant::now();
                assert_eq!(host.call::<Echo>(&mine).await, Ok(mine));
                longest = longest.max(started.elapsed());
            }
            longest
        }));
    }
    let mut longest_seen = Duration::ZERO;
    for caller in callers {
        longest_seen = longest_seen.max(caller.await.unwrap());
    }
    let stats = host.stats();
    let echo = &stats.methods["echo"];
    assert_eq!((echo.ok, echo.failed), (tasks * rounds, 0));
    assert_eq!(echo.latency.count(), tasks * rounds);
    assert_eq!(
        (stats.calls_started, stats.calls_ok),
        (tasks * rounds, tasks * rounds)
    );
    let longest_timed = echo.latency.max().unwrap();
    // Timed inside each caller's own span (the stats count whole microseconds, rounded down).
    assert!(
        longest_timed <= longest_seen,
        "a call was timed at {longest_timed:?}, longer than any caller waited ({longest_seen:?})"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_timed_at_least_as_long_as_its_handler_ran() {
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    for _ in 0..3 {
        assert_eq!(host.call::<Sleep>(&30).await, Ok(30));
    }
    let sleep = &host.stats().methods["sleep"];
    assert_eq!(sleep.latency.count(), 3);
    let shortest = sleep.latency.percentile(0.0).unwrap();
    assert!(
        shortest >= Duration::from_millis(30),
        "a 30 ms handler's call was timed at {shortest:?}"
    );
    host.shutdown().await;
}
