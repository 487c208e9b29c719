//! Hand-built frames, for peers that speak raw bytes.

use airlock_protocol::frame::{encode_frame, Frame, Hello};
use airlock_protocol::{Transmit, PROTOCOL_VERSION};
use bytes::Bytes;

/// A frame carrying `payload` as-is: the length prefix, then the payload. The framing layer
/// does not look inside, so any non-empty payload is a valid frame for transport tests.
pub fn raw_frame(payload: Bytes) -> Transmit {
    let len = u32::try_from(payload.len()).expect("payload over 4 GiB");
    Transmit {
        head: Bytes::copy_from_slice(&len.to_le_bytes()),
        body: payload,
    }
}

/// A `Hello` frame with its length prefix, quoting `token`.
pub fn hello_frame(token: Option<&[u8]>) -> Vec<u8> {
    encode_frame(&Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        worker_name: "airlock-test-peer",
        worker_version: "0.1.0",
        methods: vec!["echo"],
        token,
    }))
}

/// `len` bytes of a pattern that depends on `len` and on the position, so a frame delivered
/// out of order, shifted or mixed with another is caught by a comparison.
pub fn pattern(len: usize) -> Bytes {
    const BLOCK: usize = 4093; // prime, so blocks do not line up with power-of-two sizes
    let seed = len.wrapping_mul(31);
    let block: Vec<u8> = (0..BLOCK)
        .map(|i| (i.wrapping_mul(7).wrapping_add(seed) % 251) as u8)
        .collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let take = (len - out.len()).min(BLOCK);
        out.extend_from_slice(&block[..take]);
    }
    Bytes::from(out)
}
