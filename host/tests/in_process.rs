//! The host runtime driven against an in-process worker: same codec, same sessions, no process.

use std::time::{Duration, Instant};

use airlock_host::{CallError, HostConfig, InProcess, LostReason, RestartPolicy};
use airlock_protocol::ErrorKind;
use airlock_worker::builtin::{builtin_worker, Echo, Fail, Panic, Sleep, Sum};
use serde_bytes::ByteBuf;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_return_typed_results() {
    let host = InProcess::new(builtin_worker).await.unwrap();
    assert_eq!(host.call::<Sum>(&vec![1, 2, 3]).await, Ok(6));
    let echoed = host
        .call::<Echo>(&ByteBuf::from(b"hello".to_vec()))
        .await
        .unwrap();
    assert_eq!(echoed.as_ref(), b"hello");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_errors_and_panics_arrive_as_data() {
    let host = InProcess::new(builtin_worker).await.unwrap();
    match host.call::<Fail>(&"nope".to_string()).await {
        Err(CallError::Remote(e)) => {
            assert_eq!(e.kind(), ErrorKind::Handler);
            assert_eq!(e.message(), "nope");
        }
        other => panic!("unexpected {other:?}"),
    }
    match host.call::<Panic>(&"boom".to_string()).await {
        Err(CallError::Remote(e)) => assert_eq!(e.kind(), ErrorKind::Panic),
        other => panic!("unexpected {other:?}"),
    }
    // The worker keeps serving after a panic.
    assert_eq!(host.call::<Sum>(&vec![2, 2]).await, Ok(4));
    host.shutdown().await;
}

/// A host whose cancel grace is zero: a call past its deadline takes its worker down at once.
fn no_grace() -> airlock_host::HostBuilder {
    airlock_host::Host::builder("unused")
        .protocol(HostConfig::default().cancel_grace(Duration::ZERO).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_call_whose_handler_honours_the_cancel_leaves_the_worker_serving() {
    let host = InProcess::new(builtin_worker).await.unwrap();
    let deadline = Instant::now() + Duration::from_millis(100);
    let slow = host.call_with_deadline::<Sleep>(&10_000, deadline).await;
    assert_eq!(slow, Err(CallError::Timeout));
    assert_eq!(host.call::<Sum>(&vec![1]).await, Ok(1));
    // The async handler was dropped on the Cancel and the worker said so within the grace.
    tokio::time::sleep(airlock_host::DEFAULT_CANCEL_GRACE + Duration::from_millis(200)).await;
    assert_eq!(host.call::<Sum>(&vec![2]).await, Ok(2));
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_grace_a_deadline_kills_the_worker_and_a_fresh_one_serves_next() {
    let host = InProcess::with_builder(no_grace(), builtin_worker)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_millis(100);
    let slow = host.call_with_deadline::<Sleep>(&10_000, deadline).await;
    assert_eq!(slow, Err(CallError::Timeout));
    assert_eq!(host.call::<Sum>(&vec![1]).await, Ok(1));
    assert!(host.stats().restarts >= 1);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_calls_each_get_their_own_answer() {
    let host = InProcess::new(builtin_worker).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..500i64 {
        let host = host.clone();
        tasks.push(tokio::spawn(async move {
            (i, host.call::<Sum>(&vec![i, 1000]).await)
        }));
    }
    for task in tasks {
        let (i, result) = task.await.unwrap();
        assert_eq!(result, Ok(i + 1000));
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_call_cancels_it() {
    let host = InProcess::new(builtin_worker).await.unwrap();
    let call = host.call::<Sleep>(&10_000);
    let _ = tokio::time::timeout(Duration::from_millis(50), call).await;
    // The cancelled call does not hold a slot, and the worker still serves.
    assert_eq!(host.call::<Sum>(&vec![5]).await, Ok(5));
    assert_eq!(host.stats().restarts, 0);
    assert_eq!(host.stats().calls_failed.cancelled, 1);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_pending_calls_and_refuses_new_ones() {
    let host = InProcess::new(builtin_worker).await.unwrap();
    let pending = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Sleep>(&50).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    host.shutdown().await;
    assert_eq!(pending.await.unwrap(), Ok(50));
    assert_eq!(host.call::<Sum>(&vec![1]).await, Err(CallError::Shutdown));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_budget_exhaustion_fails_fast() {
    let builder = no_grace().restart_policy(RestartPolicy {
        max_restarts: 1,
        window: Duration::from_secs(60),
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(1),
    });
    let host = InProcess::with_builder(builder, builtin_worker)
        .await
        .unwrap();
    for _ in 0..2 {
        let deadline = Instant::now() + Duration::from_millis(20);
        assert_eq!(
            host.call_with_deadline::<Sleep>(&10_000, deadline).await,
            Err(CallError::Timeout)
        );
    }
    let started = Instant::now();
    assert_eq!(
        host.call::<Sum>(&vec![1]).await,
        Err(CallError::WorkerLost(LostReason::RestartBudgetExhausted))
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "did not fail fast"
    );
    assert!(!host.host().is_alive());
}
