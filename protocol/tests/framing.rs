//! The incremental frame decoder.

use airlock_protocol::{FrameDecoder, FrameError};

#[test]
fn frame_split_into_single_bytes_is_reassembled() {
    let mut wire = Vec::new();
    for payload in [&b"first"[..], b"x", &[0u8; 300][..]] {
        wire.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        wire.extend_from_slice(payload);
    }
    let mut decoder = FrameDecoder::new(1024);
    let mut frames = Vec::new();
    for b in &wire {
        decoder.extend(std::slice::from_ref(b));
        while let Some(frame) = decoder.next_frame().unwrap() {
            frames.push(frame);
        }
    }
    assert_eq!(frames, [&b"first"[..], b"x", &[0u8; 300][..]]);
    assert_eq!(decoder.finish(), Ok(()));
}

/// The framer the attack is aimed at: it reads the length and reserves the whole frame before
/// any of it has arrived.
fn naive_frame_buffer(header: [u8; 4]) -> Vec<u8> {
    Vec::with_capacity(u32::from_le_bytes(header) as usize)
}

#[test]
fn length_prefix_over_cap_allocates_nothing() {
    // The attack is live: four bytes make a trusting framer reserve 64 MiB (virtual memory only
    // here, so the test stays cheap; a real one would then fill it as bytes arrive).
    let header = (64u32 << 20).to_le_bytes();
    assert!(naive_frame_buffer(header).capacity() >= 64 << 20);
    // airlock refuses the same four bytes from the header alone.
    let mut decoder = FrameDecoder::new(1024);
    decoder.extend(&header);
    assert_eq!(
        decoder.next_frame(),
        Err(FrameError::TooLarge {
            len: 64 << 20,
            max: 1024
        })
    );
    assert!(decoder.read_buffer().capacity() < 1024);

    // The largest claim, 4 GiB, the same way.
    let mut decoder = FrameDecoder::new(1024);
    let claimed = u32::MAX;
    decoder.extend(&claimed.to_le_bytes());
    assert_eq!(
        decoder.next_frame(),
        Err(FrameError::TooLarge {
            len: u32::MAX,
            max: 1024
        })
    );
    assert!(
        decoder.read_buffer().capacity() < 1024,
        "buffer grew for a refused frame"
    );
    // The error is final; nothing behind it is read.
    decoder.extend(&[1, 0, 0, 0, 0]);
    assert_eq!(decoder.buffered(), 0);
    assert!(decoder.next_frame().is_err());
}

#[test]
fn buffer_grows_only_as_bytes_arrive() {
    let mut decoder = FrameDecoder::new(64 * 1024 * 1024);
    decoder.extend(&(60u32 * 1024 * 1024).to_le_bytes());
    assert_eq!(decoder.next_frame(), Ok(None));
    decoder.extend(&[0; 10]);
    assert_eq!(decoder.next_frame(), Ok(None));
    assert!(
        decoder.read_buffer().capacity() < 4096,
        "reserved for bytes that never came"
    );
    assert_eq!(decoder.wanted(), 60 * 1024 * 1024 - 10);
}

#[test]
fn zero_length_frame_is_refused() {
    let mut decoder = FrameDecoder::new(1024);
    decoder.extend(&[0, 0, 0, 0]);
    assert_eq!(decoder.next_frame(), Err(FrameError::Empty));
}

#[test]
fn eof_mid_frame_is_reported() {
    let mut decoder = FrameDecoder::new(1024);
    decoder.extend(&[2, 0]);
    assert_eq!(
        decoder.finish(),
        Err(FrameError::Truncated {
            expected: 4,
            received: 2
        })
    );
    decoder.extend(&[0, 0, 7]);
    assert_eq!(decoder.next_frame(), Ok(None));
    assert_eq!(
        decoder.finish(),
        Err(FrameError::Truncated {
            expected: 2,
            received: 1
        })
    );
}
