//! Byte buffers through a real worker at default limits: a plain `Vec<u8>` of 16 MiB, sixteen
//! times the default item budget, crosses in both directions (the codec budgets its elements
//! as bytes), beside the same payload as a byte type, the fast path; and `Blob`s, which each
//! side takes from the frames that carried them.

use std::time::{Duration, Instant};

use airlock_codec::DEFAULT_MAX_ITEMS;
use airlock_host::{Blob, Confinement, Host};
use airlock_protocol::blob::LENT_FROM;
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{Echo, EchoBlob, EchoVec};
use serde_bytes::ByteBuf;

const SIXTEEN_MIB: usize = 16 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sixteen_mib_plain_vec_u8_round_trips_through_a_worker_at_default_limits() {
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    let payload: Vec<u8> = (0..SIXTEEN_MIB).map(|i| (i % 251) as u8).collect();
    // Counted element by element, this request and its response would each be sixteen times
    // over the default item budget.
    assert_eq!(payload.len(), 16 * DEFAULT_MAX_ITEMS);

    let started = Instant::now();
    let echoed = host.call::<EchoVec>(&payload).await.unwrap();
    let plain = started.elapsed();
    assert!(echoed == payload, "the plain Vec<u8> came back changed");

    let started = Instant::now();
    let echoed = host
        .call::<Echo>(&ByteBuf::from(payload.clone()))
        .await
        .unwrap();
    let as_bytes = started.elapsed();
    assert!(echoed.as_slice() == payload.as_slice());
    println!("16 MiB echo: plain Vec<u8> {plain:?}, serde_bytes::ByteBuf {as_bytes:?}");
    host.shutdown().await;
}

/// The host encodes a large request, and the worker a large answer, into the buffer of an
/// earlier one, already written. Large bodies of different sizes and contents, one after another
/// and two at a time, each arrive exactly as sent, both ways: no byte of an earlier body, no
/// stale length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_in_reused_buffers_carry_only_their_own_bytes() {
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    let sizes = [3 << 20, 2 << 20, (3 << 20) - 7, 5 << 20, 1 << 20];
    for (round, len) in sizes.into_iter().enumerate() {
        let payload = ByteBuf::from(
            (0..len)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(round as u8))
                .collect::<Vec<u8>>(),
        );
        assert_eq!(
            host.call::<Echo>(&payload).await.unwrap(),
            payload,
            "round {round}"
        );
    }
    let (a, b) = (
        ByteBuf::from(vec![0xaa; 4 << 20]),
        ByteBuf::from(vec![0x55; (2 << 20) + 3]),
    );
    let (got_a, got_b) = tokio::join!(host.call::<Echo>(&a), host.call::<Echo>(&b));
    assert_eq!(got_a.unwrap(), a);
    assert_eq!(got_b.unwrap(), b);
    host.shutdown().await;
}

/// A large request whose write waits on a worker that stopped reading keeps its buffer, whole,
/// while large requests to another worker of the same process are encoded into reused buffers
/// meanwhile: neither worker receives a byte of the other's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_written_request_keeps_its_buffer_while_another_workers_requests_reuse_theirs() {
    use rustix::process::{kill_process, Pid, Signal};

    // Unconfined, so that its pid is the host's to signal.
    let stalled = Host::builder(worker_bin())
        .confinement(Confinement::none())
        .send_timeout(Duration::from_secs(60))
        .spawn()
        .await
        .unwrap();
    let other = Host::builder(worker_bin()).spawn().await.unwrap();
    let pid = Pid::from_raw(stalled.worker_pid().expect("a worker process") as i32).unwrap();
    // Larger than any pipe's buffer: it cannot be written whole while the worker is stopped.
    let held = ByteBuf::from((0..8 << 20).map(|i| (i % 241) as u8).collect::<Vec<u8>>());
    kill_process(pid, Signal::STOP).unwrap();
    let pending = tokio::spawn({
        let (stalled, held) = (stalled.clone(), held.clone());
        async move { stalled.call::<Echo>(&held).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    for (round, len) in [8 << 20, 3 << 20, (8 << 20) - 5, 2 << 20]
        .into_iter()
        .enumerate()
    {
        let payload = ByteBuf::from(vec![0x5a ^ round as u8; len]);
        assert_eq!(
            other.call::<Echo>(&payload).await.unwrap(),
            payload,
            "round {round}"
        );
    }
    assert!(
        !pending.is_finished(),
        "the stalled worker's request was still being written during the other worker's calls"
    );
    kill_process(pid, Signal::CONT).unwrap();
    assert_eq!(pending.await.unwrap().unwrap(), held);
    stalled.shutdown().await;
    other.shutdown().await;
}

/// `Blob` bodies, which each side's decode takes from the received frame instead of copying:
/// large and small, one after another and several at once, each arrives exactly as sent both
/// ways, and every answer kept keeps its own bytes while later frames are read behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blob_answers_kept_across_later_frames_keep_their_own_bytes() {
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    let payload = |len: usize, seed: u8| {
        Blob::from(
            (0..len)
                .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
                .collect::<Vec<u8>>(),
        )
    };
    let sizes = [
        LENT_FROM,
        3 << 20,
        LENT_FROM - 1,
        (2 << 20) + 5,
        10,
        1 << 20,
    ];
    let mut kept = Vec::new();
    for (seed, len) in sizes.into_iter().enumerate() {
        let sent = payload(len, seed as u8);
        let got = host.call::<EchoBlob>(&sent).await.unwrap();
        kept.push((sent, got));
    }
    let together: Vec<_> = sizes
        .into_iter()
        .enumerate()
        .map(|(seed, len)| payload(len, 100 + seed as u8))
        .collect();
    let calls: Vec<_> = together
        .iter()
        .map(|sent| {
            let (host, sent) = (host.clone(), sent.clone());
            tokio::spawn(async move { host.call::<EchoBlob>(&sent).await })
        })
        .collect();
    for (sent, call) in together.into_iter().zip(calls) {
        kept.push((sent, call.await.unwrap().unwrap()));
    }
    // More frames through the same buffers after all of the above were answered.
    for seed in 0..3u8 {
        let sent = payload(4 << 20, 200 + seed);
        assert_eq!(host.call::<EchoBlob>(&sent).await.unwrap(), sent);
    }
    for (i, (sent, got)) in kept.iter().enumerate() {
        assert!(got == sent, "answer {i} ({} bytes) changed", sent.len());
    }
    host.shutdown().await;
}
