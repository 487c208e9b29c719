//! The `frame_decoder` target: the length-prefixed frame decoder fed frames of every size
//! class (tiny, around the 64 KiB at which a frame gets a buffer of its own, large, at and past
//! the cap) in chunks of every size and every way a transport may hand them over, held to a
//! plain parser. A short input describes a long wire, so the fuzzer reaches the large-frame
//! path that the byte-level `frame_stream` target (8 KiB cap) cannot.
//!
//! Input layout (missing bytes read as zero):
//!
//! | bytes | meaning |
//! | --- | --- |
//! | 0 | bits 0–2: frames − 1 (1–8); bit 3: a bad prefix after them (length 0, or past the cap with bit 5); bit 4: the wire cut short |
//! | 1, 2 | where the cut falls (u16, little-endian): that many 65,536ths of the wire's length |
//! | 3 .. 3+3×frames | per frame: a size class byte and a u16 (see [`frame_len`]) |
//! | then, 2 bytes each | steps: how (bits 0–1 of the first: `extend`, a read within `wanted()`, a read past a frame right after a poll) and whether to poll after (bit 7 clear); how many bytes (the second: `(low 5 bits + 1) << 3 × high 3 bits`) |
//!
//! With no step bytes the wire is fed in one `extend`. Frames' bytes depend on their position,
//! so a frame delivered with another's bytes, out of order or shifted is caught.

use airlock_protocol::{FrameError, OWN_BUFFER_FROM};

#[path = "../../protocol/tests/support/frame_feeding.rs"]
mod frame_feeding;
use frame_feeding::{reference, run, Feed, Step};

/// The decoder's cap: three times the own-buffer size and a bit, so frames near it, at it and
/// past it are all a few input bytes away (a size class 3 frame is exactly the cap at
/// `value` 43,697).
pub const MAX: u32 = 3 * OWN_BUFFER_FROM as u32 + 19;

/// Flag bits of the first input byte.
pub const BAD_PREFIX: u8 = 1 << 3;
/// See [`BAD_PREFIX`].
pub const CUT: u8 = 1 << 4;
/// See [`BAD_PREFIX`].
pub const PAST_THE_CAP: u8 = 1 << 5;

/// A frame's length from its size class and a u16: 1–256 bytes, 1–65,536, within 128 of
/// [`OWN_BUFFER_FROM`] either side, or from it up past [`MAX`].
pub fn frame_len(class: u8, value: u16) -> u32 {
    let own = OWN_BUFFER_FROM as u32;
    match class % 4 {
        0 => 1 + u32::from(value % 256),
        1 => 1 + u32::from(value),
        2 => own - 128 + u32::from(value % 257),
        _ => own + u32::from(value) * 3,
    }
}

/// The input, decoded into a wire and the steps that feed it.
#[derive(Debug)]
pub struct Script {
    /// The bytes the "worker" wrote.
    pub wire: Vec<u8>,
    /// How they are handed to the decoder.
    pub steps: Vec<Step>,
}

impl Script {
    /// Decodes `data` as the module docs describe.
    pub fn parse(data: &[u8]) -> Self {
        let byte = |i: usize| data.get(i).copied().unwrap_or(0);
        let u16_at = |i: usize| u16::from_le_bytes([byte(i), byte(i + 1)]);
        let flags = byte(0);
        let frames = usize::from(flags & 7) + 1;
        let mut wire = Vec::new();
        for i in 0..frames {
            let at = 3 + 3 * i;
            let len = frame_len(byte(at), u16_at(at + 1));
            wire.extend_from_slice(&len.to_le_bytes());
            wire.extend((0..len).map(|j| (j as u8) ^ (i as u8).wrapping_mul(37)));
        }
        if flags & BAD_PREFIX != 0 {
            let bad = if flags & PAST_THE_CAP == 0 {
                0
            } else {
                MAX + 1
            };
            wire.extend_from_slice(&bad.to_le_bytes());
            wire.extend_from_slice(&[9; 50]);
        }
        if flags & CUT != 0 {
            // Scaled, not wrapped: a cut can fall anywhere in a wire of any length.
            let at = (wire.len() as u64 * u64::from(u16_at(1))) >> 16;
            wire.truncate(at as usize);
        }
        let step_bytes = data.get(3 + 3 * frames..).unwrap_or(&[]);
        let mut steps: Vec<Step> = step_bytes
            .chunks(2)
            .map(|pair| {
                let how = pair[0];
                let size = pair.get(1).copied().unwrap_or(0);
                let n = (usize::from(size & 31) + 1) << (3 * usize::from(size >> 5));
                let feed = match how % 4 {
                    0 | 3 => Feed::Extend(n),
                    1 => Feed::ReadWithin(n),
                    _ => Feed::ReadPastAfterPoll(n),
                };
                Step {
                    feed,
                    poll: how & 0x80 == 0,
                }
            })
            .collect();
        if steps.is_empty() {
            steps.push(Step {
                feed: Feed::Extend(usize::MAX),
                poll: true,
            });
        }
        Self { wire, steps }
    }

    /// Builds an input: flag bits and the cut, frames as `(class, value)`, steps as byte pairs.
    pub fn encode(flags: u8, cut: u16, frames: &[(u8, u16)], steps: &[[u8; 2]]) -> Vec<u8> {
        assert!((1..=8).contains(&frames.len()));
        let mut data = vec![(frames.len() as u8 - 1) | (flags & !7)];
        data.extend_from_slice(&cut.to_le_bytes());
        for &(class, value) in frames {
            data.push(class);
            data.extend_from_slice(&value.to_le_bytes());
        }
        data.extend(steps.iter().flatten());
        data
    }
}

/// Feeds the script's wire as its steps say; panics unless the frames and the end are the
/// plain parser's. Returns them.
pub fn check_frame_decoder(data: &[u8]) -> (Vec<Vec<u8>>, Result<(), FrameError>) {
    let script = Script::parse(data);
    let want = reference(&script.wire, MAX);
    let got = run(&script.wire, &script.steps, MAX);
    assert_eq!(got.0.len(), want.0.len(), "frame count");
    assert!(got.0 == want.0, "frames differ");
    assert_eq!(got.1, want.1, "end");
    got
}

/// What a seed must end with: how many frames, and the end.
pub type Expect = (usize, Result<(), FrameError>);

/// The committed seeds: each size class, each way of feeding, a bad prefix and a cut.
pub fn seeds() -> Vec<(&'static str, Vec<u8>, Expect)> {
    let own = OWN_BUFFER_FROM as u32;
    // Feeds of 8 KiB (`(15 + 1) << 3 × 3`) and of single bytes, polling after each.
    let extend_8k = [0, 15 | (3 << 5)];
    let within_8k = [1, 15 | (3 << 5)];
    let past_8k = [2, 15 | (3 << 5)];
    let single_bytes = [0, 0];
    vec![
        (
            "small-frames-one-extend",
            Script::encode(0, 0, &[(0, 5), (0, 200), (1, 1000)], &[]),
            (3, Ok(())),
        ),
        (
            "around-own-buffer-read-within",
            Script::encode(
                0,
                0,
                &[(2, 127), (2, 128), (2, 129)],
                &[extend_8k, within_8k],
            ),
            (3, Ok(())),
        ),
        (
            "large-then-small-read-past",
            Script::encode(
                0,
                0,
                &[(3, 100), (0, 3), (3, 0), (0, 9)],
                &[within_8k, past_8k],
            ),
            (4, Ok(())),
        ),
        (
            "at-the-cap",
            Script::encode(0, 0, &[(3, 43_697)], &[extend_8k]),
            (1, Ok(())),
        ),
        (
            "past-the-cap",
            Script::encode(0, 0, &[(0, 1), (3, 43_698)], &[extend_8k]),
            (
                1,
                Err(FrameError::TooLarge {
                    len: MAX + 3,
                    max: MAX,
                }),
            ),
        ),
        (
            "bad-prefix-after-a-large-frame",
            Script::encode(BAD_PREFIX, 0, &[(3, 7)], &[within_8k, past_8k]),
            (1, Err(FrameError::Empty)),
        ),
        (
            "past-the-cap-prefix-after-a-large-frame",
            Script::encode(
                BAD_PREFIX | PAST_THE_CAP,
                0,
                &[(3, 7)],
                &[within_8k, past_8k],
            ),
            (
                1,
                Err(FrameError::TooLarge {
                    len: MAX + 1,
                    max: MAX,
                }),
            ),
        ),
        (
            // 40,000/65,536 of the 125,540-byte wire: 76,623 bytes, 4 of them the prefix.
            "cut-inside-a-large-frame",
            Script::encode(CUT, 40_000, &[(3, 20_000)], &[single_bytes, within_8k]),
            (
                0,
                Err(FrameError::Truncated {
                    expected: own + 60_000,
                    received: 76_619,
                }),
            ),
        ),
        (
            // 60,000/65,536 of 251,080 bytes: 229,870, past the second frame's prefix at
            // 125,540, after the first frame's buffer was handed out.
            "cut-inside-the-second-large-frame",
            Script::encode(
                CUT,
                60_000,
                &[(3, 20_000), (3, 20_000)],
                &[past_8k, within_8k],
            ),
            (
                1,
                Err(FrameError::Truncated {
                    expected: own + 60_000,
                    received: 104_326,
                }),
            ),
        ),
    ]
}
