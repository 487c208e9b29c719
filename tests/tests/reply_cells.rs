//! The recycled reply cells (`host/src/reply.rs`): many callers on a multi-thread
//! runtime, typed and dynamic calls of the same method, cancellations at random points,
//! `select!` between two replies, a task that moves its future; every answer must be its own
//! call's, and nobody may hang.

use std::sync::Arc;
use std::time::Duration;

use airlock_codec::Value;
use airlock_host::{CallError, Host};
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{Echo, Sleep};
use serde_bytes::ByteBuf;

/// Six bytes: as a `Value::Bytes` request its encoding (tag 7, length 6, the bytes) is a valid
/// `ByteBuf` of 7 bytes for `echo`, whose echo decodes back to the same `Value`.
fn tag6(task: u64, round: u64) -> Vec<u8> {
    let mut t = (task as u16).to_le_bytes().to_vec();
    t.extend((round as u16).to_le_bytes());
    t.extend(*b"dv");
    t
}

fn tag(task: u64, round: u64) -> Vec<u8> {
    format!("t{task}-r{round}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_answer_is_its_own_calls_under_cancels_and_reuse() {
    let host = Arc::new(Host::builder(worker_bin()).spawn().await.unwrap());
    let mut tasks = Vec::new();
    for task in 0..48u64 {
        let host = Arc::clone(&host);
        tasks.push(tokio::spawn(async move {
            let mut seed = task.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            for round in 0..150u64 {
                let mine = tag(task, round);
                match next() % 6 {
                    0 => {
                        let got = host.call::<Echo>(&ByteBuf::from(mine.clone())).await;
                        assert_eq!(got.map(ByteBuf::into_vec), Ok(mine));
                    }
                    1 => {
                        let mine = tag6(task, round);
                        let got = host.call_value("echo", &Value::Bytes(mine.clone())).await;
                        assert_eq!(got, Ok(Value::Bytes(mine)));
                    }
                    2 => {
                        // Cancelled at a random point: before, during or after its answer.
                        let wait = Duration::from_micros(next() % 400);
                        let _ = tokio::time::timeout(wait, host.call::<Echo>(&ByteBuf::from(mine)))
                            .await;
                    }
                    3 => {
                        let mine = tag6(task, round);
                        let wait = Duration::from_micros(next() % 400);
                        let _ = tokio::time::timeout(
                            wait,
                            host.call_value("echo", &Value::Bytes(mine)),
                        )
                        .await;
                    }
                    4 => {
                        // Two replies raced; the loser is dropped, maybe after its answer.
                        let other = tag(task + 1000, round);
                        let (a, b) = (ByteBuf::from(mine.clone()), ByteBuf::from(other.clone()));
                        tokio::select! {
                            got = host.call::<Echo>(&a) => {
                                assert_eq!(got.map(ByteBuf::into_vec), Ok(mine));
                            }
                            got = host.call::<Echo>(&b) => {
                                assert_eq!(got.map(ByteBuf::into_vec), Ok(other));
                            }
                        }
                    }
                    _ => {
                        // Polled in one task, finished in another.
                        let mut call = Box::pin({
                            let host = Arc::clone(&host);
                            let mine = mine.clone();
                            async move { host.call::<Echo>(&ByteBuf::from(mine)).await }
                        });
                        let got = match futures_poll_once(call.as_mut()).await {
                            Some(got) => got,
                            None => tokio::spawn(call).await.unwrap(),
                        };
                        assert_eq!(got.map(ByteBuf::into_vec), Ok(mine));
                    }
                }
            }
        }));
    }
    let all = async {
        for task in tasks {
            task.await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("a caller hung");
    // The worker still answers, and a sleep's outcome is its own.
    assert_eq!(host.call::<Sleep>(&3).await, Ok(3));
    assert!(!matches!(
        host.call::<Echo>(&ByteBuf::new()).await,
        Err(CallError::WorkerLost(_))
    ));
    host.shutdown().await;
}

async fn futures_poll_once<F: std::future::Future + Unpin>(fut: F) -> Option<F::Output> {
    let mut fut = fut;
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut fut).poll(cx) {
        std::task::Poll::Ready(v) => std::task::Poll::Ready(Some(v)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

/// A cancelled call whose worker still answers it (a blocking `crunch` stops early and returns
/// the milliseconds worked): the late answer must not reach the next call of the same type,
/// which may take a recycled cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_answer_to_a_cancelled_call_never_reaches_the_next() {
    use airlock_worker::builtin::{Crunch, CrunchesCancelled};
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    for round in 0..40u64 {
        assert_eq!(host.call::<Sleep>(&0).await, Ok(0), "round {round}");
        let cut = Duration::from_millis(2 + round % 7);
        assert!(tokio::time::timeout(cut, host.call::<Crunch>(&300))
            .await
            .is_err());
        // Same response type (u64): its cell may be the one `Sleep` just gave back.
        assert_eq!(
            host.call::<Sleep>(&(20 + round % 5)).await,
            Ok(20 + round % 5)
        );
        assert_eq!(host.call::<Crunch>(&0).await, Ok(0));
    }
    assert_eq!(host.stats().restarts, 0);
    // The attack was live: the worker saw the cancels and answered them early.
    assert!(host.call::<CrunchesCancelled>(&()).await.unwrap() > 0);
    host.shutdown().await;
}
