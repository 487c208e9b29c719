//! `FrameReceiver::read_now` on a stream receiver over a real pipe, as a host's reader uses it
//! while it spins on a multi-thread runtime: it takes what the OS holds without the runtime
//! (which has not seen it), keeps it for `poll_recv` under the same cap and in order, leaves the
//! rest of a large frame to `poll_recv` (and sends its caller there), and never reads where it
//! cannot do so without waiting.

use std::io::Write;
use std::task::{Context, Poll, Waker};

use airlock_protocol::transport::{FrameReceiver, Transport};
use airlock_protocol::{FrameError, TransportError};
use airlock_transport_pipe::{
    kernel_honours_nowait_on_pipes, PipeReader, StreamConfig, StreamReceiver, StreamTransport,
    READ_CHUNK,
};
use tokio::net::unix::pipe;

fn framed(payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// A receiver reading a fresh pipe as a host's reader does (tokio's pipe end, non-blocking),
/// able to read now, and the pipe's write end as a blocking file. Inside a runtime.
fn receiver(config: StreamConfig) -> (StreamReceiver<pipe::Receiver>, std::fs::File) {
    let (write, read) = pipe::pipe().unwrap();
    let transport = StreamTransport::new(read, tokio::io::sink(), config).with_direct_reads();
    let write = write.into_blocking_fd().unwrap();
    (transport.split().1, std::fs::File::from(write))
}

/// What `poll_recv` gives without the runtime doing anything (a waker nobody wakes, on a
/// runtime that has not turned since the bytes were written).
fn polled(receiver: &mut StreamReceiver<pipe::Receiver>) -> Poll<Option<Vec<u8>>> {
    let mut cx = Context::from_waker(Waker::noop());
    receiver
        .poll_recv(&mut cx)
        .map(|frame| frame.unwrap().map(|bytes| bytes.to_vec()))
}

/// Bytes written to the pipe behind `writer` and not yet read from it.
fn waiting_in(writer: &std::fs::File) -> u64 {
    rustix::io::ioctl_fionread(writer).unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn read_now_takes_a_frame_the_runtime_has_not_seen() {
    let (mut receiver, mut writer) = receiver(StreamConfig::default());
    assert!(receiver.reads_now());
    assert!(!receiver.read_now(), "nothing written yet");
    writer.write_all(&framed(b"first")).unwrap();
    // The runtime has not turned since: through it, the frame is not there yet.
    assert_eq!(polled(&mut receiver), Poll::Pending);
    assert!(receiver.read_now());
    assert_eq!(polled(&mut receiver), Poll::Ready(Some(b"first".to_vec())));
    assert!(!receiver.read_now(), "the pipe is empty again");
    assert_eq!(polled(&mut receiver), Poll::Pending);
}

#[tokio::test(flavor = "current_thread")]
async fn read_now_keeps_a_frame_whole_across_reads_and_in_order() {
    let (mut receiver, mut writer) = receiver(StreamConfig::default());
    let first = framed(b"one frame, written in two parts");
    let (head, tail) = first.split_at(7);
    writer.write_all(head).unwrap();
    assert!(receiver.read_now());
    assert_eq!(polled(&mut receiver), Poll::Pending, "half a frame");
    let mut rest = tail.to_vec();
    rest.extend_from_slice(&framed(b"and the next"));
    writer.write_all(&rest).unwrap();
    assert!(receiver.read_now());
    assert_eq!(
        polled(&mut receiver),
        Poll::Ready(Some(b"one frame, written in two parts".to_vec()))
    );
    // A whole frame already held: there is something to go on with, and nothing is read.
    assert!(receiver.read_now());
    assert_eq!(
        polled(&mut receiver),
        Poll::Ready(Some(b"and the next".to_vec()))
    );
}

#[tokio::test(flavor = "current_thread")]
async fn read_now_leaves_the_rest_of_a_large_frame_to_poll_recv() {
    let (mut receiver, mut writer) = receiver(StreamConfig::default());
    let body: Vec<u8> = (0..4 * READ_CHUNK).map(|i| (i % 251) as u8).collect();
    let frame = framed(&body);
    writer.write_all(&frame[..100]).unwrap();
    assert!(receiver.read_now(), "the prefix and the first bytes");
    assert_eq!(polled(&mut receiver), Poll::Pending);
    writer.write_all(&frame[100..200]).unwrap();
    // The rest is due: `poll_recv` reads it into the frame's own buffer, so a look here sends
    // the caller to it, and leaves those bytes in the pipe.
    assert!(receiver.read_now());
    assert_eq!(waiting_in(&writer), 100);
    // Through the runtime the frame arrives whole, the bytes left in the pipe included.
    let writing = std::thread::spawn(move || writer.write_all(&frame[200..]).unwrap());
    let got = receiver.recv().await.unwrap().unwrap();
    writing.join().unwrap();
    assert!(got == body, "the large frame came back changed");
}

#[tokio::test(flavor = "current_thread")]
async fn a_length_read_now_is_held_to_the_receivers_cap() {
    let config = StreamConfig {
        max_frame: 64,
        ..StreamConfig::default()
    };
    let (mut receiver, mut writer) = receiver(config);
    writer.write_all(&framed(&[7; 65])).unwrap();
    assert!(receiver.read_now());
    let mut cx = Context::from_waker(Waker::noop());
    match receiver.poll_recv(&mut cx) {
        Poll::Ready(Err(TransportError::Frame(FrameError::TooLarge { .. }))) => {}
        other => panic!("a frame over the cap was not refused: {other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn read_now_meets_the_end_of_the_stream_and_poll_recv_reports_it() {
    let (mut receiver, mut writer) = receiver(StreamConfig::default());
    writer.write_all(&framed(b"last")).unwrap();
    drop(writer);
    assert!(receiver.read_now());
    assert_eq!(polled(&mut receiver), Poll::Ready(Some(b"last".to_vec())));
    assert!(receiver.read_now(), "the end of the stream");
    assert!(matches!(receiver.recv().await, Ok(None)));
}

#[tokio::test(flavor = "current_thread")]
async fn a_receiver_not_made_to_read_now_never_does() {
    // Not asked to: one descriptor, the runtime's.
    let (write, read) = pipe::pipe().unwrap();
    let mut plain = StreamTransport::new(read, tokio::io::sink(), StreamConfig::default())
        .split()
        .1;
    let mut writer = std::fs::File::from(write.into_blocking_fd().unwrap());
    writer.write_all(&framed(b"waiting")).unwrap();
    assert!(!plain.reads_now());
    assert!(!plain.read_now());
    assert_eq!(plain.recv().await.unwrap().unwrap().as_ref(), b"waiting");
}

/// A blocking description (a worker's wait in the OS, `with_blocking_read`) is read now with
/// `RWF_NOWAIT` where the kernel left it blocking because it honours that flag: an empty pipe
/// answers at once, never waits. (Elsewhere the description stays non-blocking.)
#[test]
fn a_blocking_description_reads_now_without_waiting() {
    let (read, write) = rustix::pipe::pipe().unwrap();
    let (done, answered) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _inside = runtime.enter();
        let blocking = StreamTransport::new(
            PipeReader::new(read).unwrap(),
            tokio::io::sink(),
            StreamConfig::default(),
        )
        .with_blocking_read()
        .unwrap();
        let mut blocking = blocking.split().1;
        assert!(blocking.reads_now());
        let empty = blocking.read_now();
        std::fs::File::from(write)
            .write_all(&framed(b"waiting"))
            .unwrap();
        let full = blocking.read_now();
        let frame = runtime.block_on(blocking.recv()).unwrap().unwrap();
        let _ = done.send((empty, full, frame.to_vec()));
    });
    let (empty, full, frame) = answered
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("a read now of an empty pipe waited");
    assert!(!empty, "nothing written yet");
    assert!(full, "the frame was there");
    assert_eq!(frame, b"waiting");
    // The kernel left it blocking (it honours `RWF_NOWAIT` on pipes), or this proves nothing.
    assert!(kernel_honours_nowait_on_pipes().unwrap());
}
