//! The incremental frame decoder.

use airlock_protocol::{FrameDecoder, FrameError, OWN_BUFFER_FROM};
use airlock_test_support::alloc::{self, CountingAlloc};
use proptest::prelude::*;

#[path = "support/frame_feeding.rs"]
mod frame_feeding;
use frame_feeding::{reference, run, Feed, Step};

// Counts are per thread: a test reads what its own decoder holds.
#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

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
/// the bytes arrive: a view kept into it holds that frame's buffer and nothing else, and a
/// frame kept after it holds none of its buffer.
#[test]
fn a_large_frame_shares_its_buffer_with_no_other_frame() {
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
    let mut decoder = FrameDecoder::new(1 << 20);
    let wire = |len: usize, byte: u8| framed(&[vec![byte; len]]);
    let (first, second, third, fourth) = (
        wire(2 * OWN_BUFFER_FROM, 1),
        wire(2 * OWN_BUFFER_FROM, 2),
        wire(3 * OWN_BUFFER_FROM, 3),
        wire(OWN_BUFFER_FROM, 4),
    );
    drop(receive_counting(&mut decoder, &first).0);
    let (second, made) = receive_counting(&mut decoder, &second);
    assert!(
        made < OWN_BUFFER_FROM,
        "the dropped frame's buffer, reused: {made} bytes allocated at once"
    );
    let (third, made) = receive_counting(&mut decoder, &third);
    assert!(
        made >= 2 * OWN_BUFFER_FROM,
        "a kept frame's buffer is not reused: {made} bytes allocated at once"
    );
    assert!(second.iter().all(|&b| b == 2) && third.iter().all(|&b| b == 3));
    drop((second, third));
    let (fourth, made) = receive_counting(&mut decoder, &fourth);
    assert!(
        made >= OWN_BUFFER_FROM / 2,
        "a buffer over twice the frame is not reused for it: {made} bytes allocated at once"
    );
    assert!(fourth.iter().all(|&b| b == 4));
}

/// Receives `wire`, one frame, as a transport reads it (the prefix and a little into the
/// shared buffer, the rest straight into the frame's own); gives the frame and the largest
/// single allocation this thread made meanwhile.
fn receive_counting(decoder: &mut FrameDecoder, wire: &[u8]) -> (bytes::Bytes, usize) {
    assert!(
        CountingAlloc::is_installed() || {
            drop(vec![0u8; 1]);
            CountingAlloc::is_installed()
        }
    );
    alloc::reset_largest();
    decoder.extend(&wire[..16]);
    assert_eq!(decoder.next_frame(), Ok(None));
    decoder.read_buffer().extend_from_slice(&wire[16..]);
    let frame = decoder.next_frame().unwrap().unwrap();
    assert_eq!(frame.len(), wire.len() - 4);
    (frame, alloc::largest())
}

/// Bytes read into `read_buffer` after an `extend` that completed a large frame and carried
/// bytes behind it come after those bytes, not before.
#[test]
fn bytes_read_after_bytes_behind_a_large_frame_keep_their_order() {
    let big = vec![1u8; OWN_BUFFER_FROM];
    let wire = framed(&[big, b"AAAA".to_vec(), b"BBBB".to_vec()]);
    let mut decoder = FrameDecoder::new(1 << 20);
    decoder.extend(&wire[..100]);
    assert_eq!(decoder.next_frame(), Ok(None));
    let frame_end = 4 + OWN_BUFFER_FROM;
    decoder.extend(&wire[100..frame_end + 8]);
    decoder
        .read_buffer()
        .extend_from_slice(&wire[frame_end + 8..]);
    let mut frames = Vec::new();
    while let Some(frame) = decoder.next_frame().unwrap() {
        frames.push(frame);
    }
    assert_eq!(frames.len(), 3);
    assert_eq!(
        (&frames[1][..], &frames[2][..]),
        (&b"AAAA"[..], &b"BBBB"[..])
    );
}

/// Traffic alternating a large frame and a smaller large one does not free and regrow the
/// large one's buffer each time: it is kept aside while the smaller frame is read, and the next
/// large frame reuses it. Beside a frame of a megabyte or more it is not kept: the decoder
/// never holds two large buffers.
#[test]
fn a_buffer_too_large_for_a_small_frame_is_kept_aside_for_the_next_large_one() {
    let mut decoder = FrameDecoder::new(8 << 20);
    let large = framed(&[vec![9u8; 4 << 20]]);
    let small = framed(&[vec![8u8; 100 * 1024]]);
    let megabyte = framed(&[vec![7u8; 1 << 20]]);
    drop(receive_counting(&mut decoder, &large).0);
    for _ in 0..3 {
        drop(receive_counting(&mut decoder, &small).0);
        let (_, made) = receive_counting(&mut decoder, &large);
        assert!(
            made < 1 << 20,
            "the large buffer, kept aside and reused: {made} bytes allocated at once"
        );
    }
    drop(receive_counting(&mut decoder, &small).0);
    // The 4 MiB buffer is kept aside now. Beside a 1 MiB frame it is freed.
    let before = alloc::live();
    drop(receive_counting(&mut decoder, &megabyte).0);
    let after = alloc::live();
    assert!(
        after + (2 << 20) < before,
        "the decoder held {before} bytes before the 1 MiB frame and {after} after it"
    );
}

const MAX: u32 = 3 * OWN_BUFFER_FROM as u32 + 17;

fn frame_len() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => 1u32..300,
        2 => (OWN_BUFFER_FROM as u32 - 5)..(OWN_BUFFER_FROM as u32 + 5),
        1 => (OWN_BUFFER_FROM as u32)..MAX,
        1 => Just(MAX),
    ]
}

fn chunk() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => 1usize..8,
        1 => 1usize..5000,
        1 => (OWN_BUFFER_FROM - 8)..(OWN_BUFFER_FROM + 8),
        1 => 1usize..(4 * OWN_BUFFER_FROM),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![
            3 => chunk().prop_map(Feed::Extend),
            2 => chunk().prop_map(Feed::ReadWithin),
            1 => chunk().prop_map(Feed::ReadPastAfterPoll),
        ],
        prop::bool::weighted(0.8),
    )
        .prop_map(|(feed, poll)| Step { feed, poll })
}

/// The wire: frames, then optionally a bad prefix, then optionally cut short.
fn wire() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(frame_len(), 1..8),
        prop::option::weighted(0.2, prop_oneof![Just(0u32), (MAX + 1)..u32::MAX]),
        prop::option::weighted(0.3, any::<prop::sample::Index>()),
    )
        .prop_map(|(lens, bad, cut)| {
            let mut wire = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                wire.extend_from_slice(&len.to_le_bytes());
                wire.extend((0..*len).map(|j| (j as u8) ^ (i as u8).wrapping_mul(37)));
            }
            if let Some(bad) = bad {
                wire.extend_from_slice(&bad.to_le_bytes());
                wire.extend_from_slice(&[9; 50]);
            }
            if let Some(cut) = cut {
                let at = cut.index(wire.len() + 1);
                wire.truncate(at);
            }
            wire
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]
    /// However the bytes arrive (`extend`, reads into `read_buffer` within `wanted`, reads past
    /// a large frame, polls between them or not), with frames around `OWN_BUFFER_FROM` and at
    /// the cap, a bad prefix or a cut anywhere: the frames and the end are a plain parser's.
    #[test]
    fn decoder_matches_a_plain_parser(wire in wire(), steps in prop::collection::vec(step(), 1..12)) {
        let (want_frames, want_end) = reference(&wire, MAX);
        let (got_frames, got_end) = run(&wire, &steps, MAX);
        prop_assert_eq!(got_frames.len(), want_frames.len());
        prop_assert!(got_frames == want_frames, "frames differ");
        prop_assert_eq!(got_end, want_end);
    }
}

/// Between frames the decoder keeps at most one free buffer: while a large one is kept aside,
/// the buffers of the smaller frames read meanwhile go when their frames do.
#[test]
fn the_decoder_keeps_at_most_one_free_buffer_between_frames() {
    let start = alloc::live();
    let mut decoder = FrameDecoder::new(8 << 20);
    // As a transport reads: the prefix and a little into the shared buffer, the rest of a
    // large frame straight into its own.
    let mut receive = |len: usize| {
        let wire = framed(&[vec![7u8; len]]);
        decoder.extend(&wire[..16]);
        assert_eq!(decoder.next_frame(), Ok(None));
        decoder.read_buffer().extend_from_slice(&wire[16..]);
        decoder.next_frame().unwrap().unwrap()
    };
    drop(receive(4 << 20));
    let one_large = alloc::live() - start;
    for _ in 0..3 {
        drop(receive(200 * 1024));
    }
    let after = alloc::live() - start;
    assert!(CountingAlloc::is_installed());
    assert!(
        after <= one_large + 1024,
        "{one_large} bytes held after the large frame, {after} after the smaller ones"
    );
}
