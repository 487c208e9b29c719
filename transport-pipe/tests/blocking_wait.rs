//! `FrameReceiver::wait_blocking` on a stream receiver over a real pipe: it waits in the OS
//! until the peer writes or goes away, takes what came without the runtime, and never waits
//! when a frame is buffered already or the rest of a large frame is due (which `poll_recv`
//! reads into the frame's own buffer).

use std::io::Write;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use airlock_protocol::transport::{FrameReceiver, Transport};
use airlock_protocol::TransportError;
use airlock_transport_pipe::{
    kernel_honours_nowait_on_pipes, PipeReader, ReadWindow, StreamConfig, StreamReceiver,
    StreamTransport,
};

/// How long a helper thread waits before it writes the bytes that end a wait the receiver
/// should never have started: a test that blocks fails after this long instead of hanging.
const RESCUE_AFTER: Duration = Duration::from_secs(10);

fn framed(payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// How a receiver under test may wait for the peer in the OS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// Not made able to (`wait_blocking` returns `false` at once).
    Never,
    /// `with_blocking_wait`: `ppoll`, then `read`.
    Poll,
    /// `with_blocking_read`: one blocking `read`, where the kernel allows.
    Read,
}

/// The two ways a receiver waits, which the tests below each run through.
const WAITS: [Wait; 2] = [Wait::Poll, Wait::Read];

/// A receiver reading a fresh pipe, waiting as `wait` says, and the pipe's write end.
fn receiver(wait: Wait) -> (StreamReceiver<PipeReader>, std::fs::File) {
    let (read, write) = rustix::pipe::pipe().unwrap();
    // Only the read half is under test; its writer is the test's own blocking file.
    let transport = StreamTransport::new(
        PipeReader::new(read).unwrap(),
        tokio::io::sink(),
        StreamConfig::default(),
    );
    let transport = match wait {
        Wait::Never => transport,
        Wait::Poll => transport.with_blocking_wait().unwrap(),
        Wait::Read => transport.with_blocking_read().unwrap(),
    };
    (transport.split().1, std::fs::File::from(write))
}

/// The receiver's next frame if it is ready without the runtime doing anything (a poll with a
/// waker that nobody wakes, on a runtime that has not turned since the bytes were written).
fn ready_frame(receiver: &mut StreamReceiver<PipeReader>) -> Poll<Option<Vec<u8>>> {
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
fn does_not_wait(receiver: &mut StreamReceiver<PipeReader>, rescue: std::fs::File, with: &str) {
    write_later(rescue, RESCUE_AFTER, vec![0; 1]);
    let started = Instant::now();
    assert!(!receiver.wait_blocking(), "waited with {with}");
    assert!(started.elapsed() < RESCUE_AFTER, "waited with {with}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_receiver_not_made_to_wait_never_waits() {
    let (mut receiver, mut writer) = receiver(Wait::Never);
    writer.write_all(&framed(b"hello")).unwrap();
    assert!(!receiver.wait_blocking());
    // Nothing took the bytes: they wait for the runtime to report the pipe readable. (This is
    // also what makes `ready_frame` a proof, in the tests below, that a wait read them.)
    assert_eq!(ready_frame(&mut receiver), Poll::Pending);
    assert_eq!(receiver.recv().await.unwrap().unwrap(), &b"hello"[..]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_wait_lasts_until_the_peer_writes_and_takes_its_bytes_without_the_runtime() {
    for wait in WAITS {
        let (mut receiver, writer) = receiver(wait);
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
}

#[tokio::test(flavor = "current_thread")]
async fn a_buffered_frame_is_not_waited_for() {
    for wait in WAITS {
        let (mut receiver, mut writer) = receiver(wait);
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
}

#[tokio::test(flavor = "current_thread")]
async fn the_rest_of_a_large_frame_is_left_to_poll_recv() {
    for wait in WAITS {
        let (mut receiver, mut writer) = receiver(wait);
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
}

#[tokio::test(flavor = "current_thread")]
async fn the_end_of_the_stream_ends_a_wait() {
    for wait in WAITS {
        let (mut receiver, writer) = receiver(wait);
        let delay = Duration::from_millis(50);
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            drop(writer);
        });
        assert!(receiver.wait_blocking());
        assert_eq!(receiver.recv().await.unwrap(), None);
    }
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

/// The system call thread `tid` of this process is blocked in, by number, or `None` while it
/// runs (`/proc/self/task/<tid>/syscall`).
fn blocked_in(tid: &str) -> Option<i64> {
    let line = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).unwrap();
    line.split_whitespace()
        .next()
        .and_then(|nr| nr.parse().ok())
}

/// This thread's id, from `/proc/thread-self` (a link to `<pid>/task/<tid>`).
fn this_thread() -> String {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    link.file_name().unwrap().to_string_lossy().into_owned()
}

#[tokio::test(flavor = "current_thread")]
async fn a_wait_made_to_read_blocking_is_one_read_with_no_poll_before_it() {
    if !kernel_honours_nowait_on_pipes().unwrap() {
        eprintln!("skipped: this kernel refuses RWF_NOWAIT on pipes, so the wait polls first");
        return;
    }
    for (wait, expected) in [(Wait::Poll, libc::SYS_ppoll), (Wait::Read, libc::SYS_read)] {
        let (mut receiver, mut writer) = receiver(wait);
        let waiter = this_thread();
        // Another thread watches where this one blocks, then writes the frame that ends it.
        let watcher = std::thread::spawn(move || {
            let started = Instant::now();
            let seen = loop {
                match blocked_in(&waiter) {
                    Some(nr) if nr == libc::SYS_read || nr == libc::SYS_ppoll => break Some(nr),
                    _ if started.elapsed() > RESCUE_AFTER => break None,
                    _ => std::thread::sleep(Duration::from_millis(2)),
                }
            };
            writer.write_all(&framed(b"woken")).unwrap();
            seen
        });
        assert!(receiver.wait_blocking());
        assert_eq!(watcher.join().unwrap(), Some(expected), "{wait:?}");
        assert_eq!(
            ready_frame(&mut receiver),
            Poll::Ready(Some(b"woken".to_vec()))
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_readers_own_reads_never_block_on_the_description_a_wait_reads_blocking() {
    for wait in WAITS {
        let (mut receiver, mut writer) = receiver(wait);
        // One frame of exactly a fresh reader's first window: the read that takes it fills the
        // window, so the reader keeps the pipe's readiness (more may have come) though the
        // pipe is empty.
        let payload = vec![3u8; ReadWindow::FIRST - 4];
        writer.write_all(&framed(&payload)).unwrap();
        // The runtime turns and learns that the pipe is readable.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(ready_frame(&mut receiver), Poll::Ready(Some(payload)));
        // The next read meets an empty pipe. Had it blocked, it would have ended only once
        // the rescue wrote, with the rescue's frame.
        write_later(writer, RESCUE_AFTER, framed(b"rescue"));
        let started = Instant::now();
        assert_eq!(ready_frame(&mut receiver), Poll::Pending, "{wait:?}");
        assert!(started.elapsed() < RESCUE_AFTER, "{wait:?}: a read blocked");
    }
}

/// A receiver over a pipe holding `bytes` before the blocking read is set up (which may take
/// some of them from the pipe to learn whether the kernel honours `RWF_NOWAIT`), and the
/// pipe's write end.
fn receiver_after(bytes: &[u8]) -> (StreamReceiver<PipeReader>, std::fs::File) {
    let (read, write) = rustix::pipe::pipe().unwrap();
    let mut writer = std::fs::File::from(write);
    writer.write_all(bytes).unwrap();
    let transport = StreamTransport::new(
        PipeReader::new(read).unwrap(),
        tokio::io::sink(),
        StreamConfig::default(),
    );
    (transport.with_blocking_read().unwrap().split().1, writer)
}

#[tokio::test(flavor = "current_thread")]
async fn bytes_in_the_pipe_before_the_wait_is_set_up_are_read_first_and_whole() {
    // Longer than what setting up the blocking read may take from the pipe.
    let first = vec![1u8; 1000];
    let mut bytes = framed(&first);
    bytes.extend(framed(b"second"));
    // Read first by the runtime.
    let (mut receiver, _writer) = receiver_after(&bytes);
    assert_eq!(receiver.recv().await.unwrap().unwrap(), first);
    assert_eq!(receiver.recv().await.unwrap().unwrap(), &b"second"[..]);
    // A wait first, as a worker's loop makes when it is idle right after its `Hello`: it may
    // decline (bytes taken while setting up are for `poll_recv` to decode first) or take
    // the rest, but never reads past them.
    let (mut receiver, _writer) = receiver_after(&bytes);
    receiver.wait_blocking();
    assert_eq!(receiver.recv().await.unwrap().unwrap(), first);
    assert_eq!(receiver.recv().await.unwrap().unwrap(), &b"second"[..]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_frame_taken_whole_while_the_wait_is_set_up_is_not_waited_for() {
    let (mut receiver, writer) = receiver_after(&framed(b"hello"));
    // Setting up took the frame from the pipe where the kernel honours `RWF_NOWAIT` (the wait
    // then declines, the frame being the decoder's already), and left it there elsewhere (the
    // wait reads it at once). Either way a wait that blocked on the empty pipe would end only
    // once the rescue wrote.
    write_later(writer, RESCUE_AFTER, framed(b"rescue"));
    let started = Instant::now();
    receiver.wait_blocking();
    assert!(
        started.elapsed() < RESCUE_AFTER,
        "waited for a frame already here"
    );
    assert_eq!(
        ready_frame(&mut receiver),
        Poll::Ready(Some(b"hello".to_vec()))
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_pipe_reader_refuses_what_is_not_a_pipe() {
    let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    let err = PipeReader::new(socket.into()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
}
