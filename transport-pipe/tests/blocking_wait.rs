//! `FrameReceiver::wait_blocking` on a stream receiver over a real pipe: it waits in the OS
//! until the peer writes or goes away, takes what came without the runtime, and never waits
//! when a frame is buffered already or the rest of a large frame is due (which `poll_recv`
//! reads into the frame's own buffer).

use std::io::Write;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use airlock_protocol::transport::{FrameReceiver, Transport};
use airlock_protocol::TransportError;
use airlock_transport_pipe::{StreamConfig, StreamReceiver, StreamTransport};
use tokio::net::unix::pipe;

/// How long a helper thread waits before it writes the bytes that end a wait the receiver
/// should never have started: a test that blocks fails after this long instead of hanging.
const RESCUE_AFTER: Duration = Duration::from_secs(10);

fn framed(payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// A receiver reading a fresh pipe, optionally able to wait blocking, and the pipe's write end.
fn receiver(waits: bool) -> (StreamReceiver<pipe::Receiver>, std::fs::File) {
    let (read, write) = rustix::pipe::pipe().unwrap();
    // Only the read half is under test; its writer is the test's own blocking file.
    let transport = StreamTransport::new(
        pipe::Receiver::from_owned_fd(read).unwrap(),
        tokio::io::sink(),
        StreamConfig::default(),
    );
    let transport = if waits {
        transport.with_blocking_wait().unwrap()
    } else {
        transport
    };
    (transport.split().1, std::fs::File::from(write))
}

/// The receiver's next frame if it is ready without the runtime doing anything (a poll with a
/// waker that nobody wakes, on a runtime that has not turned since the bytes were written).
fn ready_frame(receiver: &mut StreamReceiver<pipe::Receiver>) -> Poll<Option<Vec<u8>>> {
    let mut cx = Context::from_waker(Waker::noop());
    receiver
        .poll_recv(&mut cx)
        .map(|frame| frame.unwrap().map(|bytes| bytes.to_vec()))
}

/// Writes `bytes` to `writer` from another thread after `delay`.
fn write_later(mut writer: std::fs::File, delay: Duration, bytes: Vec<u8>) {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        // The receiver may be gone by then (the test passed): nothing to report.
        let _ = writer.write_all(&bytes);
    });
}

/// Asserts that `receiver` does not wait; if it did, a byte written to `rescue` after
/// [`RESCUE_AFTER`] ends the wait and the test fails instead of hanging.
fn does_not_wait(receiver: &mut StreamReceiver<pipe::Receiver>, rescue: std::fs::File, with: &str) {
    write_later(rescue, RESCUE_AFTER, vec![0; 1]);
    let started = Instant::now();
    assert!(!receiver.wait_blocking(), "waited with {with}");
    assert!(started.elapsed() < RESCUE_AFTER, "waited with {with}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_receiver_not_made_to_wait_never_waits() {
    let (mut receiver, mut writer) = receiver(false);
    writer.write_all(&framed(b"hello")).unwrap();
    assert!(!receiver.wait_blocking());
    // Nothing took the bytes: they wait for the runtime to report the pipe readable. (This is
    // also what makes `ready_frame` a proof, in the tests below, that a wait read them.)
    assert_eq!(ready_frame(&mut receiver), Poll::Pending);
    assert_eq!(receiver.recv().await.unwrap().unwrap(), &b"hello"[..]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_wait_lasts_until_the_peer_writes_and_takes_its_bytes_without_the_runtime() {
    let (mut receiver, writer) = receiver(true);
    let delay = Duration::from_millis(100);
    let started = Instant::now();
    write_later(writer, delay, framed(b"late"));
    assert!(receiver.wait_blocking());
    assert!(
        started.elapsed() >= delay,
        "the wait ended before the peer wrote"
    );
    // The bytes are in the receiver already: the runtime has not run since they came.
    assert_eq!(
        ready_frame(&mut receiver),
        Poll::Ready(Some(b"late".to_vec()))
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_buffered_frame_is_not_waited_for() {
    let (mut receiver, mut writer) = receiver(true);
    let mut two = framed(b"first");
    two.extend(framed(b"second"));
    writer.write_all(&two).unwrap();
    assert!(receiver.wait_blocking());
    assert_eq!(
        ready_frame(&mut receiver),
        Poll::Ready(Some(b"first".to_vec()))
    );
    // "second" is buffered: a wait now would block until the rescue writes.
    does_not_wait(&mut receiver, writer, "a frame buffered");
    assert_eq!(
        ready_frame(&mut receiver),
        Poll::Ready(Some(b"second".to_vec()))
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_rest_of_a_large_frame_is_left_to_poll_recv() {
    let (mut receiver, mut writer) = receiver(true);
    let payload = vec![7u8; 1 << 20];
    let whole = framed(&payload);
    let (head, rest) = whole.split_at(1000);
    writer.write_all(head).unwrap();
    assert!(receiver.wait_blocking());
    // The prefix is decoded (nothing of the frame is whole yet): from here on, far more than
    // one read's worth is due, which `poll_recv` reads into the frame's buffer.
    assert_eq!(ready_frame(&mut receiver), Poll::Pending);
    does_not_wait(
        &mut receiver,
        writer.try_clone().unwrap(),
        "the rest of a large frame due",
    );
    let rest = rest.to_vec();
    let writing = std::thread::spawn(move || writer.write_all(&rest).unwrap());
    assert_eq!(receiver.recv().await.unwrap().unwrap(), payload);
    writing.join().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn the_end_of_the_stream_ends_a_wait() {
    let (mut receiver, writer) = receiver(true);
    let delay = Duration::from_millis(50);
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        drop(writer);
    });
    assert!(receiver.wait_blocking());
    assert_eq!(receiver.recv().await.unwrap(), None);
}

#[tokio::test(flavor = "current_thread")]
async fn a_read_error_a_wait_met_is_reported_after_the_frames_before_it() {
    // A Unix socket whose peer closes with bytes of ours unread reports `ECONNRESET` to one
    // read only; later reads see the end of the stream. The error must not turn into a clean
    // end.
    let (ours, mut peer) = std::os::unix::net::UnixStream::pair().unwrap();
    (&ours).write_all(b"never read by the peer").unwrap();
    peer.write_all(&framed(b"last words")).unwrap();
    drop(peer);
    ours.set_nonblocking(true).unwrap();
    let transport = StreamTransport::new(
        tokio::net::UnixStream::from_std(ours).unwrap(),
        tokio::io::sink(),
        StreamConfig::default(),
    );
    let mut receiver = transport.with_blocking_wait().unwrap().split().1;
    assert!(receiver.wait_blocking());
    assert_eq!(receiver.recv().await.unwrap().unwrap(), &b"last words"[..]);
    assert!(receiver.wait_blocking());
    // Kept for `poll_recv`: no second wait, then the error.
    assert!(!receiver.wait_blocking());
    match receiver.recv().await {
        Err(TransportError::Io(err)) => {
            let kind = err
                .downcast_ref::<std::io::Error>()
                .map(std::io::Error::kind);
            assert_eq!(kind, Some(std::io::ErrorKind::ConnectionReset), "{err}");
        }
        other => panic!("the reset became {other:?}"),
    }
}
