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

#[test]
fn length_prefix_over_cap_allocates_nothing() {
    let mut decoder = FrameDecoder::new(1024);
    // The attack: 4 bytes asking the receiver to hold 4 GiB.
    let claimed = u32::MAX;
    assert!(claimed as usize > 1024 * 1024);
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
