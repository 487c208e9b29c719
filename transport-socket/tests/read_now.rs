//! `FrameReceiver::read_now` over the socket transport's read half: a read error it meets is
//! kept and reported by `poll_recv`, not lost. A Unix socket reports `ECONNRESET` once (later
//! reads see a plain end of stream), so dropping it would turn a reset into a clean ending.

use std::io::Write;
use std::task::{Context, Poll, Waker};

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_protocol::{Transmit, TransportError};
use airlock_transport_pipe::StreamConfig;
use airlock_transport_socket::inherited_pair;
use bytes::Bytes;

#[tokio::test(flavor = "current_thread")]
async fn a_reset_that_read_now_meets_is_reported_by_poll_recv() {
    let (transport, peer) = inherited_pair(StreamConfig::default()).unwrap();
    let (mut send, mut recv) = transport.with_direct_reads().split();
    assert!(recv.reads_now());
    let mut peer = std::os::unix::net::UnixStream::from(peer);
    // A frame from the peer, then bytes the peer never reads: closing with them unread
    // resets the connection.
    peer.write_all(&[5, 0, 0, 0, b'h', b'e', b'l', b'l', b'o'])
        .unwrap();
    let unread = Transmit {
        head: Bytes::from_static(&[6, 0, 0, 0]),
        body: Bytes::from_static(b"unread"),
    };
    send.send(&[unread]).await.unwrap();
    drop(peer);
    assert!(recv.read_now(), "the peer's frame");
    let mut cx = Context::from_waker(Waker::noop());
    match recv.poll_recv(&mut cx) {
        Poll::Ready(Ok(Some(frame))) => assert_eq!(frame.as_ref(), b"hello"),
        other => panic!("the frame before the reset was not given: {other:?}"),
    }
    assert!(recv.read_now(), "the reset");
    match recv.poll_recv(&mut cx) {
        Poll::Ready(Err(TransportError::Io(err))) => {
            let kind = err
                .downcast_ref::<std::io::Error>()
                .map(std::io::Error::kind);
            assert_eq!(kind, Some(std::io::ErrorKind::ConnectionReset), "{err}");
        }
        other => panic!("the reset was not reported: {other:?}"),
    }
}
