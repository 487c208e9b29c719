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

fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut wire = Vec::new();
    for payload in payloads {
        wire.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        wire.extend_from_slice(payload);
    }
    wire
}

/// Whether nothing but `frame` refers to its buffer.
fn alone_in_its_buffer(frame: bytes::Bytes) -> bool {
    frame.try_into_mut().is_ok()
}

/// A frame of `OWN_BUFFER_FROM` bytes or more shares its buffer with no other frame, however
/// the bytes arrive: a view kept into it holds that frame's buffer and nothing else. (Shared,
/// a small frame kept after a large one would keep the large one's buffer alive.)
#[test]
fn a_large_frame_shares_its_buffer_with_no_other_frame() {
    use airlock_protocol::OWN_BUFFER_FROM;
    let payloads = vec![
        vec![1u8; 10],
        vec![2u8; OWN_BUFFER_FROM + 1000],
        vec![3u8; 20],
        vec![4u8; 3 * OWN_BUFFER_FROM],
        vec![5u8; 30],
        vec![6u8; OWN_BUFFER_FROM],
    ];
    let wire = framed(&payloads);
    for chunk in [1, 7, 4096, OWN_BUFFER_FROM + 3, wire.len()] {
        let mut decoder = FrameDecoder::new(1 << 20);
        let mut frames = Vec::new();
        for piece in wire.chunks(chunk) {
            decoder.extend(piece);
            while let Some(frame) = decoder.next_frame().unwrap() {
                frames.push(frame);
            }
        }
        assert_eq!(frames, payloads, "chunks of {chunk}");
        drop(decoder);
        let (large, small): (Vec<_>, Vec<_>) = frames
            .into_iter()
            .partition(|frame| frame.len() >= OWN_BUFFER_FROM);
        for frame in large {
            assert!(
                alone_in_its_buffer(frame),
                "chunks of {chunk}: a large frame shares"
            );
        }
        drop(small);
    }
}

/// A transport that reads past a large frame into its buffer (more than `wanted`) does not
/// leave what it read there: the bytes behind the frame move out, and come next.
#[test]
fn bytes_read_past_a_large_frame_move_out_of_its_buffer() {
    use airlock_protocol::OWN_BUFFER_FROM;
    let payloads = vec![vec![7u8; 2 * OWN_BUFFER_FROM], vec![8u8; 40]];
    let wire = framed(&payloads);
    let mut decoder = FrameDecoder::new(1 << 20);
    decoder.extend(&wire[..100]);
    assert_eq!(decoder.next_frame(), Ok(None));
    decoder.read_buffer().extend_from_slice(&wire[100..]);
    let large = decoder.next_frame().unwrap().unwrap();
    let small = decoder.next_frame().unwrap().unwrap();
    assert_eq!(
        (&large[..], &small[..]),
        (&payloads[0][..], &payloads[1][..])
    );
    assert_eq!(decoder.next_frame(), Ok(None));
    drop(decoder);
    assert!(alone_in_its_buffer(large));
}

/// The last large frame's buffer is reused for the next one once nothing refers to it, and
/// only then: a frame still kept keeps its bytes.
#[test]
fn a_large_frames_buffer_is_reused_only_once_nothing_refers_to_it() {
    use airlock_protocol::OWN_BUFFER_FROM;
    let mut decoder = FrameDecoder::new(1 << 20);
    let mut receive = |payload: Vec<u8>| {
        decoder.extend(&framed(&[payload])[..]);
        decoder.next_frame().unwrap().unwrap()
    };
    let first = receive(vec![1u8; 2 * OWN_BUFFER_FROM]);
    let at = first.as_ptr();
    drop(first);
    let second = receive(vec![2u8; 2 * OWN_BUFFER_FROM]);
    assert_eq!(second.as_ptr(), at, "the dropped frame's buffer, reused");
    let third = receive(vec![3u8; 3 * OWN_BUFFER_FROM]);
    assert_ne!(
        third.as_ptr(),
        second.as_ptr(),
        "a kept frame's buffer is not reused"
    );
    assert!(second.iter().all(|&b| b == 2) && third.iter().all(|&b| b == 3));
    let at = third.as_ptr();
    drop((second, third));
    let small = receive(vec![4u8; OWN_BUFFER_FROM]);
    assert_ne!(
        small.as_ptr(),
        at,
        "a buffer over twice the frame is not reused for it"
    );
}
