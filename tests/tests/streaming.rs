//! Streaming calls: a worker's typed progress updates reach the caller in order, every one
//! before the call's answer, over every transport, in-process and through a `Pool`; the
//! per-call quota and the deadline still hold; an update that does not decode ends the worker.

use std::time::{Duration, Instant};

use airlock_host::{
    method, CallError, Host, HostConfig, InProcess, LostReason, Pool, TransportChoice,
};
use airlock_tests::e2e::{rogue_host, worker_bin};
use airlock_worker::builtin::{builtin_worker, CountRequest, CountTo, Echo};
use serde_bytes::ByteBuf;

fn count(count: u32, pause_ms: u64) -> CountRequest {
    CountRequest { count, pause_ms }
}

async fn updates_then_answer(host: &Host, n: u32) {
    let mut call = host.call_streaming::<CountTo>(&count(n, 0));
    let mut seen = Vec::new();
    while let Some(step) = call.next().await {
        seen.push(step);
    }
    assert_eq!(call.result().await, Ok(n));
    assert_eq!(seen, (1..=n).collect::<Vec<_>>(), "every update, in order");
}

#[tokio::test(flavor = "current_thread")]
async fn updates_arrive_in_order_before_the_answer_over_every_transport() {
    for transport in [
        TransportChoice::Pipe,
        TransportChoice::SocketInherited,
        TransportChoice::SocketNamed,
    ] {
        let host = Host::builder(worker_bin())
            .transport(transport)
            .spawn()
            .await
            .unwrap_or_else(|e| panic!("{transport:?}: {e}"));
        // More updates than the host's buffer and the worker's queue hold at once.
        updates_then_answer(&host, 200).await;
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_arrive_in_process_and_through_a_pool() {
    let in_process = InProcess::new(builtin_worker).await.unwrap();
    let mut call = in_process.call_streaming::<CountTo>(&count(50, 0));
    let mut last = 0;
    while let Some(step) = call.next().await {
        assert_eq!(step, last + 1);
        last = step;
    }
    assert_eq!((call.result().await, last), (Ok(50), 50));
    in_process.shutdown().await;

    let pool = Pool::builder(Host::builder(worker_bin()))
        .size(2)
        .spawn()
        .await
        .unwrap();
    let streams = (0..4).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut call = pool.call_streaming::<CountTo>(&count(30, 1)).unwrap();
            let mut steps = 0;
            while call.next().await.is_some() {
                steps += 1;
            }
            (steps, call.result().await)
        })
    });
    for stream in streams {
        assert_eq!(stream.await.unwrap(), (30, Ok(30)));
    }
    pool.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_quota_holds_and_the_worker_says_so_as_data() {
    let host = Host::builder(worker_bin())
        .protocol(HostConfig::default().max_progress_per_call(5))
        .spawn()
        .await
        .unwrap();
    let mut call = host.call_streaming::<CountTo>(&count(8, 0));
    let mut seen = 0;
    while call.next().await.is_some() {
        seen += 1;
    }
    match call.result().await {
        Err(CallError::Remote(err)) => {
            assert!(err.message().contains("max_progress_per_call"), "{err}");
        }
        other => panic!("expected the worker's quota error, got {other:?}"),
    }
    assert_eq!(seen, 5, "exactly the quota's updates");
    // The worker kept to the quota: nothing was a violation, and it serves on.
    assert_eq!(host.stats().restarts, 0);
    updates_then_answer(&host, 5).await;
    host.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_deadline_holds_for_a_streaming_call() {
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    let started = Instant::now();
    let mut call = host.call_streaming_with_deadline::<CountTo>(
        &count(1000, 20),
        started + Duration::from_millis(300),
    );
    let mut seen = 0;
    while call.next().await.is_some() {
        seen += 1;
    }
    assert_eq!(call.result().await, Err(CallError::Timeout));
    assert!(
        seen > 0 && seen < 1000,
        "some updates came before the deadline: {seen}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    host.shutdown().await;
}

method!(
    /// `echo` called as if it streamed `String` updates: the rogue's `b"p"` progress bodies
    /// are not a valid `String` encoding (a length of 112 with no bytes behind it).
    EchoWithText, "echo", ByteBuf => ByteBuf, progress String
);

#[tokio::test(flavor = "current_thread")]
async fn an_update_that_does_not_decode_ends_the_worker() {
    let host = rogue_host()
        .arg("progress_flood")
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    // Live: a caller that does not stream is not handed the updates at all; the flood ends
    // the worker only when it passes the quota.
    let plain = host.call::<Echo>(&ByteBuf::from(b"x".to_vec())).await;
    assert!(
        matches!(&plain, Err(CallError::WorkerLost(LostReason::Violation(_)))),
        "{plain:?}"
    );
    let violations_before = host.stats().violations.values().sum::<u64>();
    // Streaming: the first update fails to decode, and the worker is cut off there.
    let mut call = host.call_streaming::<EchoWithText>(&ByteBuf::from(b"x".to_vec()));
    assert_eq!(
        call.next().await,
        None,
        "no update that does not decode is delivered"
    );
    assert_eq!(
        call.result().await,
        Err(CallError::WorkerLost(LostReason::UndecodableResponse))
    );
    assert_eq!(
        host.stats().violations.values().sum::<u64>(),
        violations_before,
        "cut off for the lie, before the flood reached the quota"
    );
    host.shutdown().await;
}
