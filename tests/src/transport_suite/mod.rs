//! The transport conformance suite: every transport, in every mode, must pass all of it.
//!
//! A [`Fixture`] yields a connected transport and the raw byte stream at its other end; each
//! case below drives one through the other. [`transport_suite!`](crate::transport_suite!)
//! turns a fixture into one `#[tokio::test]` per case; the test binary must install
//! [`CountingAlloc`] as its global allocator (the allocation case
//! checks that it is there, so it cannot pass vacuously).

mod fixtures;

use std::future::Future;
use std::time::{Duration, Instant};

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_protocol::{FrameError, TransportError, DEFAULT_MAX_FRAME};
use airlock_transport_pipe::{ReadWindow, StreamConfig, StreamTransport};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

pub use fixtures::{InheritedFixture, NamedFixture, PipeFixture};

use airlock_test_support::alloc::{self, CountingAlloc};

use crate::support::{pattern, raw_frame};

/// The peer's raw read half.
pub type PeerRead = Box<dyn AsyncRead + Unpin + Send>;
/// The peer's raw write half.
pub type PeerWrite = Box<dyn AsyncWrite + Unpin + Send>;

/// A transport under test and the raw stream at its other end.
pub struct Connected<T> {
    /// The transport under test.
    pub transport: T,
    /// Bytes the transport sent arrive here.
    pub peer_read: PeerRead,
    /// Bytes written here arrive at the transport.
    pub peer_write: PeerWrite,
}

impl<T> std::fmt::Debug for Connected<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connected").finish_non_exhaustive()
    }
}

/// How to connect one kind of transport.
pub trait Fixture: Sync {
    /// The transport under test.
    type Transport: Transport + 'static;

    /// A fresh connected transport with `config`, and its raw peer.
    fn connect(
        &self,
        config: StreamConfig,
    ) -> impl Future<Output = Connected<Self::Transport>> + Send;
}

/// Payload sizes every transport must carry intact, both ways: the smallest frame, a small
/// one, a large one, and the largest the default cap admits in round numbers (16 MiB).
pub const ROUND_TRIP_SIZES: [usize; 4] = [1, 1024, 1 << 20, 16 << 20];

/// Longest any case may take before it counts as a hang.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(30);

/// The send deadline for the stalled-reader case.
pub const SHORT_SEND_TIMEOUT: Duration = Duration::from_millis(200);

async fn bounded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(CASE_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no result within {CASE_TIMEOUT:?}"))
}

/// Frames of 1 B, 1 KiB, 1 MiB and 16 MiB, then a batch of 64 mixed frames in one `send`,
/// go out through the transport, are echoed by a peer, and come back byte-identical and in
/// order. Dropping the sender then ends both streams cleanly.
pub async fn frames_of_every_size_round_trip<F: Fixture>(fixture: &F) {
    let config = StreamConfig::default();
    assert!(ROUND_TRIP_SIZES
        .iter()
        .all(|&s| s <= DEFAULT_MAX_FRAME as usize));
    let connected = fixture.connect(config).await;
    let (mut send, mut recv) = connected.transport.split();
    let (mut peer_send, mut peer_recv) =
        StreamTransport::new(connected.peer_read, connected.peer_write, config).split();
    let echo = tokio::spawn(async move {
        let mut echoed = 0usize;
        while let Some(frame) = peer_recv.recv().await.expect("peer recv") {
            peer_send
                .send(&[raw_frame(frame)])
                .await
                .expect("peer send");
            echoed += 1;
        }
        echoed
    });

    let mut expected: Vec<Bytes> = ROUND_TRIP_SIZES.iter().map(|&s| pattern(s)).collect();
    let batch: Vec<Bytes> = (1..=64).map(|i| pattern(i * 37)).collect();
    expected.extend(batch.iter().cloned());
    let outbound = async move {
        for &size in &ROUND_TRIP_SIZES {
            send.send(&[raw_frame(pattern(size))]).await.expect("send");
        }
        let frames: Vec<_> = batch.iter().cloned().map(raw_frame).collect();
        send.send(&frames).await.expect("send batch");
        drop(send); // end of stream for the echo, which then ends ours
    };
    let inbound = async {
        for (i, want) in expected.iter().enumerate() {
            let got = recv.recv().await.expect("recv").expect("frame");
            assert_eq!(got.len(), want.len(), "frame {i}: length");
            assert!(
                got == *want,
                "frame {i} ({} bytes): content differs",
                want.len()
            );
        }
        assert_eq!(recv.recv().await.expect("recv at end"), None, "clean end");
    };
    bounded("round trip", async { tokio::join!(outbound, inbound) }).await;
    assert_eq!(
        bounded("echo", echo).await.expect("echo task"),
        expected.len()
    );
}

/// Two frames written one byte per write (the first with a pause after every byte, so each
/// byte is a separate read) arrive whole and in order.
pub async fn frame_split_into_single_byte_writes_arrives_intact<F: Fixture>(fixture: &F) {
    let connected = fixture.connect(StreamConfig::default()).await;
    let (_send, mut recv) = connected.transport.split();
    let mut peer = connected.peer_write;
    let first = pattern(33);
    let second = pattern(700);
    let wire_first = raw_frame(first.clone()).to_vec();
    let wire_second = raw_frame(second.clone()).to_vec();
    let writer = async move {
        for byte in wire_first {
            peer.write_all(&[byte]).await.expect("write");
            peer.flush().await.expect("flush");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for byte in wire_second {
            peer.write_all(&[byte]).await.expect("write");
            tokio::task::yield_now().await;
        }
        peer
    };
    let reader = async {
        let a = recv.recv().await.expect("recv").expect("frame");
        let b = recv.recv().await.expect("recv").expect("frame");
        (a, b)
    };
    let (_peer, (a, b)) = bounded("byte-wise frames", async { tokio::join!(writer, reader) }).await;
    assert_eq!(a, first);
    assert_eq!(b, second);
}

/// The stream ending inside a frame is a `Truncated` error naming how much was promised and
/// how much came, inside the prefix too; ending between frames is a clean `None`.
pub async fn eof_mid_frame_is_truncated<F: Fixture>(fixture: &F) {
    async fn ends_after<F: Fixture>(
        fixture: &F,
        wire: &[u8],
    ) -> Vec<Result<Option<Bytes>, String>> {
        let connected = fixture.connect(StreamConfig::default()).await;
        let (_send, mut recv) = connected.transport.split();
        let mut peer = connected.peer_write;
        peer.write_all(wire).await.expect("write");
        peer.shutdown().await.expect("shutdown");
        drop(peer); // the write end closes: the transport sees end of stream
        let mut seen = Vec::new();
        loop {
            let next = bounded("recv at eof", recv.recv()).await;
            let stop = !matches!(next, Ok(Some(_)));
            seen.push(next.map_err(|e| format!("{e:?}")));
            if stop {
                return seen;
            }
        }
    }
    let truncated = |expected, received| {
        format!(
            "{:?}",
            TransportError::Frame(FrameError::Truncated { expected, received })
        )
    };

    let mut body = 100u32.to_le_bytes().to_vec();
    body.extend_from_slice(&[7; 10]);
    assert_eq!(ends_after(fixture, &body).await, [Err(truncated(100, 10))]);

    assert_eq!(ends_after(fixture, &[5, 0]).await, [Err(truncated(4, 2))]);

    let whole = raw_frame(pattern(9)).to_vec();
    assert_eq!(
        ends_after(fixture, &whole).await,
        [Ok(Some(pattern(9))), Ok(None)]
    );
}

/// A length prefix over `max_frame` is refused from the prefix alone: `recv` fails with
/// `TooLarge` at once (the claimed bytes never come and are not waited for), and no allocation
/// anywhere near the claimed size is made.
pub async fn length_prefix_over_cap_allocates_nothing<F: Fixture>(fixture: &F) {
    const MAX: u32 = 1 << 20;
    // Reads may reserve a chunk ahead (64 KiB); reserving for the claimed frame would be 1 MiB+.
    const ALLOWED: usize = 256 * 1024;
    assert!(
        CountingAlloc::is_installed(),
        "install CountingAlloc as the global allocator"
    );
    // Prove the tripwire works before relying on it: a big allocation shows up in the peak.
    alloc::reset_largest();
    drop(std::hint::black_box(vec![0u8; 3 << 20]));
    assert!(
        alloc::largest() >= 3 << 20,
        "CountingAlloc does not see this thread"
    );

    for claimed in [MAX + 1, u32::MAX] {
        let config = StreamConfig {
            max_frame: MAX,
            ..StreamConfig::default()
        };
        let connected = fixture.connect(config).await;
        let (_send, mut recv) = connected.transport.split();
        let mut peer = connected.peer_write; // kept open: the claimed bytes never come
        peer.write_all(&claimed.to_le_bytes()).await.expect("write");
        peer.write_all(&[1; 16]).await.expect("write");
        peer.flush().await.expect("flush");

        alloc::reset_largest();
        let started = Instant::now();
        let result = tokio::time::timeout(Duration::from_secs(2), recv.recv())
            .await
            .expect("recv waited for bytes that a refused prefix promised");
        let peak = alloc::largest();
        let elapsed = started.elapsed();
        match result {
            Err(TransportError::Frame(FrameError::TooLarge { len, max })) => {
                assert_eq!((len, max), (claimed, MAX));
            }
            other => panic!("prefix {claimed} over cap {MAX}: got {other:?}"),
        }
        assert!(
            peak < ALLOWED,
            "receiver allocated {peak} bytes for a refused {claimed}-byte prefix"
        );
        assert!(elapsed < Duration::from_secs(1), "refusal took {elapsed:?}");
        // The error is final: the stream cannot be resynchronised.
        assert!(matches!(
            recv.recv().await,
            Err(TransportError::Frame(FrameError::TooLarge { .. }))
        ));
        drop(peer);
    }
}

/// A peer that stops reading makes `send` fail with `SendTimeout` within its deadline instead
/// of blocking: 8 MiB cannot fit in any pipe or socket buffer.
pub async fn stalled_reader_fails_sender_within_deadline<F: Fixture>(fixture: &F) {
    let config = StreamConfig {
        send_timeout: SHORT_SEND_TIMEOUT,
        ..StreamConfig::default()
    };
    let connected = fixture.connect(config).await;
    let (mut send, _recv) = connected.transport.split();
    let _stalled = (connected.peer_read, connected.peer_write); // open, never read
    let started = Instant::now();
    let result = bounded("stalled send", send.send(&[raw_frame(pattern(8 << 20))])).await;
    let elapsed = started.elapsed();
    assert!(
        matches!(result, Err(TransportError::SendTimeout)),
        "got {result:?}"
    );
    assert!(
        elapsed >= SHORT_SEND_TIMEOUT && elapsed < SHORT_SEND_TIMEOUT * 5,
        "send failed after {elapsed:?}, deadline {SHORT_SEND_TIMEOUT:?}"
    );
}

/// `close` ends the write direction: the peer sees end of stream while the transport (and
/// its receiver) are still alive, as the `FrameSender::close` contract says.
pub async fn close_ends_the_peer_stream<F: Fixture>(fixture: &F) {
    let config = StreamConfig::default();
    let connected = fixture.connect(config).await;
    let (mut send, _recv) = connected.transport.split();
    let (_peer_send, mut peer_recv) =
        StreamTransport::new(connected.peer_read, connected.peer_write, config).split();
    send.send(&[raw_frame(pattern(5))]).await.expect("send");
    send.close().await.expect("close");
    assert_eq!(
        bounded("peer recv", peer_recv.recv()).await.expect("recv"),
        Some(pattern(5))
    );
    let end = tokio::time::timeout(Duration::from_secs(2), peer_recv.recv()).await;
    assert!(
        matches!(end, Ok(Ok(None))),
        "peer did not see end of stream after close: {end:?}"
    );
    drop(send);
}

/// A read never blocks the thread, also where the channel's description is left blocking for a
/// worker's wait in the OS (the pipe fixture's, `StreamTransport::with_blocking_read`): after a
/// read that filled the receiver's room exactly, the reader keeps the channel's readiness (more
/// may have come), and its next read meets an empty channel.
pub async fn a_read_of_an_empty_channel_never_blocks_the_thread<F: Fixture>(fixture: &F) {
    let mut connected = fixture.connect(StreamConfig::default()).await;
    let (_send, mut recv) = connected.transport.split();
    // Exactly a fresh reader's first window (the pipe's and the socket's readers share it).
    let frame = raw_frame(pattern(ReadWindow::FIRST - 4));
    let mut bytes = frame.head.to_vec();
    bytes.extend_from_slice(&frame.body);
    connected.peer_write.write_all(&bytes).await.expect("write");
    connected.peer_write.flush().await.expect("flush");
    // The runtime turns and learns that the channel is readable.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match recv.poll_recv(&mut cx) {
        std::task::Poll::Ready(Ok(Some(got))) => assert_eq!(got, frame.body),
        other => panic!(
            "the frame was not read at once: {:?}",
            other.map(|r| r.map(|_| ()))
        ),
    }
    let pending = off_the_thread("a read of an empty channel", move |cx| {
        recv.poll_recv(cx).is_pending()
    });
    assert!(pending, "a read of an empty channel gave something");
    drop(connected.peer_write);
}

/// Polls once with `poll` on a thread of its own, inside the current runtime (a send deadline
/// is one of its timers), and returns its answer: a poll that blocked the thread would never
/// answer, and fails the case after 5 s instead of hanging it.
fn off_the_thread<T: Send + 'static>(
    what: &str,
    poll: impl FnOnce(&mut std::task::Context<'_>) -> T + Send + 'static,
) -> T {
    let runtime = tokio::runtime::Handle::current();
    let (answer, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _inside = runtime.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let _ = answer.send(poll(&mut cx));
    });
    answered
        .recv_timeout(Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("{what} blocked its thread"))
}

/// A write never blocks the thread either: a frame larger than the channel holds, to a peer
/// that reads nothing, is written as far as the channel takes it, then waits for room as a
/// pending future (the send deadline keeps it).
pub async fn a_write_to_a_full_channel_never_blocks_the_thread<F: Fixture>(fixture: &F) {
    let connected = fixture.connect(StreamConfig::default()).await;
    let (mut send, _recv) = connected.transport.split();
    let body_len = 8 << 20;
    let batch = vec![raw_frame(pattern(body_len))];
    let (pending, written) = off_the_thread("a write to a full channel", move |cx| {
        let mut progress = airlock_protocol::transport::SendProgress::default();
        let pending = send.poll_send(cx, &batch, &mut progress).is_pending();
        (pending, progress.written)
    });
    assert!(pending, "a frame larger than the channel was written whole");
    assert!(
        written < body_len,
        "{written} bytes written to a peer reading none"
    );
    drop(connected.peer_read);
}

/// Frames that came together are given by `recv_buffered` without a read: the whole ones
/// after the first `recv`, then `None` for one only partly arrived (and for the end of the
/// stream, which only a read meets); `recv` then reads the rest.
pub async fn frames_that_came_together_are_given_without_a_read<F: Fixture>(fixture: &F) {
    let config = StreamConfig::default();
    let mut connected = fixture.connect(config).await;
    let (_send, mut recv) = connected.transport.split();
    let mut together = Vec::new();
    for len in [3, 5, 7] {
        together.extend_from_slice(&raw_frame(pattern(len)).to_vec());
    }
    let partial = raw_frame(pattern(11)).to_vec();
    together.extend_from_slice(&partial[..6]);
    connected
        .peer_write
        .write_all(&together)
        .await
        .expect("write");
    connected.peer_write.flush().await.expect("flush");
    assert_eq!(
        bounded("recv", recv.recv()).await.expect("recv"),
        Some(pattern(3))
    );
    for len in [5, 7] {
        assert!(
            matches!(recv.recv_buffered(), Some(Ok(Some(frame))) if frame == pattern(len)),
            "frame of {len} bytes not held"
        );
    }
    assert!(recv.recv_buffered().is_none(), "a partial frame was given");
    connected
        .peer_write
        .write_all(&partial[6..])
        .await
        .expect("write");
    drop(connected.peer_write);
    assert_eq!(
        bounded("recv", recv.recv()).await.expect("recv"),
        Some(pattern(11))
    );
    assert!(
        recv.recv_buffered().is_none(),
        "the end of the stream without a read"
    );
    assert_eq!(bounded("recv", recv.recv()).await.expect("recv"), None);
}

/// A large frame (its own buffer) is never given by `recv_buffered`,
/// whole or in part, even when the peer wrote it together with the frame before it; only a
/// read brings it, and nothing follows it in the receiver's buffer.
pub async fn a_large_frame_is_never_given_without_a_read<F: Fixture>(fixture: &F) {
    let config = StreamConfig::default();
    let connected = fixture.connect(config).await;
    let (_send, mut recv) = connected.transport.split();
    let large = pattern(200 * 1024);
    let mut together = raw_frame(pattern(3)).to_vec();
    together.extend_from_slice(&raw_frame(large.clone()).to_vec());
    together.extend_from_slice(&raw_frame(pattern(5)).to_vec());
    let mut peer_write = connected.peer_write;
    let writer = tokio::spawn(async move {
        peer_write.write_all(&together).await.expect("write");
        peer_write.flush().await.expect("flush");
        peer_write
    });
    // Let the writer fill what the channel holds before the first read.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        bounded("recv", recv.recv()).await.expect("recv"),
        Some(pattern(3))
    );
    for _ in 0..4 {
        assert!(
            recv.recv_buffered().is_none(),
            "recv_buffered gave (part of) a frame not yet read"
        );
    }
    assert_eq!(
        bounded("recv", recv.recv())
            .await
            .expect("recv")
            .map(|f| f.len()),
        Some(large.len())
    );
    // The large frame's last read (into the scratch buffer, once at most 64 KiB of it was
    // wanted) may have brought the frame behind it: that one may be given without a read.
    let next = match recv.recv_buffered() {
        Some(item) => item.expect("buffered"),
        None => bounded("recv", recv.recv()).await.expect("recv"),
    };
    assert_eq!(next, Some(pattern(5)));
    let peer_write = bounded("writer", writer).await.expect("writer");
    // Small frames: 200 KiB of them written at once; one read takes at most 64 KiB, and
    // `recv_buffered` gives only what that read brought.
    let mut peer_write = peer_write;
    let frame_len = 1000usize;
    let count = 200usize;
    let mut many = Vec::new();
    for _ in 0..count {
        many.extend_from_slice(&raw_frame(pattern(frame_len)).to_vec());
    }
    let writer = tokio::spawn(async move {
        peer_write.write_all(&many).await.expect("write");
        peer_write.flush().await.expect("flush");
        peer_write
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut got = 0usize;
    assert!(bounded("recv", recv.recv()).await.expect("recv").is_some());
    got += 1;
    while let Some(item) = recv.recv_buffered() {
        assert_eq!(item.expect("buffered").map(|f| f.len()), Some(frame_len));
        got += 1;
    }
    let per_read = 64 * 1024 / (frame_len + 4) + 1;
    assert!(
        got <= per_read,
        "{got} frames given without a read, more than one 64 KiB read holds ({per_read})"
    );
    while got < count {
        assert!(bounded("recv", recv.recv()).await.expect("recv").is_some());
        got += 1;
    }
    drop(bounded("writer", writer).await.expect("writer"));
}

/// One `#[tokio::test]` per case of the suite, against the fixture `$fixture`.
#[macro_export]
macro_rules! transport_suite {
    ($fixture:expr $(,)?) => {
        #[tokio::test]
        async fn frames_of_every_size_round_trip() {
            $crate::transport_suite::frames_of_every_size_round_trip(&$fixture).await;
        }

        #[tokio::test]
        async fn frame_split_into_single_byte_writes_arrives_intact() {
            $crate::transport_suite::frame_split_into_single_byte_writes_arrives_intact(&$fixture)
                .await;
        }

        #[tokio::test]
        async fn eof_mid_frame_is_truncated() {
            $crate::transport_suite::eof_mid_frame_is_truncated(&$fixture).await;
        }

        #[tokio::test]
        async fn length_prefix_over_cap_allocates_nothing() {
            $crate::transport_suite::length_prefix_over_cap_allocates_nothing(&$fixture).await;
        }

        #[tokio::test]
        async fn stalled_reader_fails_sender_within_deadline() {
            $crate::transport_suite::stalled_reader_fails_sender_within_deadline(&$fixture).await;
        }

        #[tokio::test]
        async fn a_read_of_an_empty_channel_never_blocks_the_thread() {
            $crate::transport_suite::a_read_of_an_empty_channel_never_blocks_the_thread(&$fixture)
                .await;
        }

        #[tokio::test]
        async fn a_write_to_a_full_channel_never_blocks_the_thread() {
            $crate::transport_suite::a_write_to_a_full_channel_never_blocks_the_thread(&$fixture)
                .await;
        }

        #[tokio::test]
        async fn frames_that_came_together_are_given_without_a_read() {
            $crate::transport_suite::frames_that_came_together_are_given_without_a_read(&$fixture)
                .await;
        }

        #[tokio::test]
        async fn a_large_frame_is_never_given_without_a_read() {
            $crate::transport_suite::a_large_frame_is_never_given_without_a_read(&$fixture).await;
        }

        #[tokio::test]
        async fn close_ends_the_peer_stream() {
            $crate::transport_suite::close_ends_the_peer_stream(&$fixture).await;
        }
    };
}
