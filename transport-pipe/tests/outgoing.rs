//! `Outgoing` over a stream transport: a write cut off by its deadline leaves the stream
//! unframed, so nothing may follow it.

use std::time::Duration;

use airlock_protocol::transport::{Outgoing, Transport};
use airlock_protocol::{Transmit, TransportError};
use airlock_transport_pipe::{StreamConfig, StreamTransport};
use bytes::Bytes;
use tokio::io::AsyncReadExt;

/// A raw frame: a 4-byte big-endian length prefix, then `len` bytes of `fill`.
fn frame(len: u32, fill: u8) -> Transmit {
    Transmit {
        head: Bytes::copy_from_slice(&len.to_be_bytes()),
        body: Bytes::from(vec![fill; len as usize]),
    }
}

#[tokio::test]
async fn nothing_is_written_behind_a_frame_cut_off_by_its_send_deadline() {
    // A peer that never reads: the 256-byte buffer fills inside frame A.
    let (ours, mut peer) = tokio::io::duplex(256);
    let (reader, writer) = tokio::io::split(ours);
    let config = StreamConfig {
        send_timeout: Duration::from_millis(100),
        ..StreamConfig::default()
    };
    let (sender, receiver) = StreamTransport::new(reader, writer, config).split();
    let mut outgoing = Outgoing::new(Box::new(sender));

    assert!(
        outgoing.start(vec![frame(4096, b'A')]).await.is_none(),
        "A must be left in flight"
    );
    let cut_off = outgoing.finish().await;
    assert!(
        matches!(cut_off, Err(TransportError::SendTimeout)),
        "{cut_off:?}"
    );

    // Frame B would land right behind A's first bytes and be read as the rest of A.
    let after = outgoing.start(vec![frame(8, b'B')]).await;
    assert!(
        matches!(after, Some(Err(TransportError::Closed))),
        "{after:?}"
    );
    assert!(matches!(
        outgoing.close().await,
        Err(TransportError::Closed)
    ));
    // Both halves gone: the peer reads to the end of what was written.
    drop(outgoing);
    drop(receiver);

    let mut wire = Vec::new();
    peer.read_to_end(&mut wire).await.expect("read the wire");
    assert!(wire.len() < 4 + 4096, "A was cut off: {} bytes", wire.len());
    assert!(
        !wire.contains(&b'B'),
        "a frame was written behind the cut-off one"
    );
}
