//! The worker's first frames: whatever the host's first frame is (a Refuse, a malformed frame,
//! a call before Welcome, an invalid Welcome, end of stream, an oversized prefix), serving ends
//! cleanly; frames behind the Welcome in the same read are neither lost nor duplicated, and may
//! be as large as the Welcome allows.

use std::time::Duration;

use airlock_protocol::frame::{encode_frame, Call, Frame, Refuse, Shutdown, Welcome};
use airlock_protocol::{decode_frame, CallId, FrameDecoder, RefuseReason};
use airlock_transport_pipe::{StreamConfig, StreamTransport};
use airlock_worker::builtin::builtin_worker;
use airlock_worker::ServeError;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

const DEADLINE: Duration = Duration::from_secs(5);

/// A worker served over an in-memory pipe; returns the host's ends and the serving task.
fn start(
    initial_cap: u32,
) -> (
    DuplexStream,
    DuplexStream,
    tokio::task::JoinHandle<Result<(), ServeError>>,
) {
    let (host_w, worker_r) = tokio::io::duplex(1 << 20);
    let (worker_w, host_r) = tokio::io::duplex(1 << 20);
    let transport = StreamTransport::new(
        worker_r,
        worker_w,
        StreamConfig {
            max_frame: initial_cap,
            ..StreamConfig::default()
        },
    );
    let task = tokio::spawn(builtin_worker().serve_on(transport));
    (host_w, host_r, task)
}

async fn finishes(task: tokio::task::JoinHandle<Result<(), ServeError>>) -> Result<(), ServeError> {
    tokio::time::timeout(DEADLINE, task)
        .await
        .expect("the worker's serving loop deadlocked")
        .expect("serving task panicked")
}

fn welcome(max_frame: u32) -> Vec<u8> {
    encode_frame(&Frame::Welcome(Welcome {
        max_frame,
        max_in_flight: 64,
        max_progress_per_call: 16,
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refuse_as_first_frame_ends_serving() {
    let (mut to_worker, _from_worker, task) = start(1 << 16);
    let refuse = encode_frame(&Frame::Refuse(Refuse {
        reason: RefuseReason::BadToken,
        host_protocol: airlock_protocol::PROTOCOL_VERSION,
    }));
    to_worker.write_all(&refuse).await.unwrap();
    // Keep the stream open: only the session can end serving.
    assert!(matches!(finishes(task).await, Err(ServeError::Refused(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_first_frame_ends_serving() {
    let (mut to_worker, _from_worker, task) = start(1 << 16);
    to_worker
        .write_all(&[3, 0, 0, 0, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    assert!(matches!(
        finishes(task).await,
        Err(ServeError::Violation(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_before_welcome_ends_serving() {
    let (mut to_worker, _from_worker, task) = start(1 << 16);
    let call = encode_frame(&Frame::Call(Call {
        id: CallId::from_bytes([1; 16]),
        method: "echo",
        body: &[0],
    }));
    to_worker.write_all(&call).await.unwrap();
    assert!(matches!(
        finishes(task).await,
        Err(ServeError::Violation(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_welcome_ends_serving() {
    let (mut to_worker, _from_worker, task) = start(1 << 16);
    // max_frame below MIN_MAX_FRAME: a Welcome the session refuses (no `Welcomed` event).
    to_worker.write_all(&welcome(16)).await.unwrap();
    assert!(matches!(
        finishes(task).await,
        Err(ServeError::Violation(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eof_or_an_oversized_first_frame_ends_serving() {
    let (to_worker, _from_worker, task) = start(1 << 16);
    drop(to_worker);
    let _ = finishes(task).await;

    let (mut to_worker, _from_worker, task) = start(1 << 16);
    to_worker.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
    let _ = finishes(task).await;
}

/// Welcome, then many calls (one larger than the worker's initial cap) and a Shutdown, all in
/// one write: every call is answered exactly once, and serving ends cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_behind_the_welcome_are_neither_lost_nor_duplicated() {
    let initial_cap = 1 << 16;
    let (mut to_worker, mut from_worker, task) = start(initial_cap);
    let mut bytes = welcome(1 << 22);
    let mut ids = Vec::new();
    for i in 0..40u8 {
        let id = CallId::from_bytes([i + 1; 16]);
        ids.push(id);
        let len = if i == 0 { 3 * initial_cap as usize } else { 10 };
        let body = airlock_codec::to_vec(&serde_bytes::ByteBuf::from(vec![i; len])).unwrap();
        bytes.extend(encode_frame(&Frame::Call(Call {
            id,
            method: "echo",
            body: &body,
        })));
    }
    bytes.extend(encode_frame(&Frame::Shutdown(Shutdown)));
    let writer = tokio::spawn(async move {
        to_worker.write_all(&bytes).await.unwrap();
        to_worker
    });
    let mut decoder = FrameDecoder::new(1 << 23);
    let mut answered: Vec<CallId> = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        let mut chunk = vec![0u8; 1 << 16];
        loop {
            let n = from_worker.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            decoder.extend(&chunk[..n]);
            while let Some(frame) = decoder.next_frame().unwrap() {
                match decode_frame(&frame).unwrap() {
                    Frame::Return(r) => answered.push(r.id),
                    Frame::Fail(f) => panic!("call failed: {}", f.message),
                    _ => {}
                }
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the worker never finished: {} answered",
        answered.len()
    );
    let _to_worker = writer.await.unwrap();
    assert!(finishes(task).await.is_ok());
    let mut sorted = answered.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), answered.len(), "a call was answered twice");
    ids.sort();
    assert_eq!(sorted, ids, "calls lost");
}
