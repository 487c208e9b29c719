//! Feeding a [`FrameDecoder`] every way a transport may (`extend`, reads into `read_buffer()`
//! within `wanted()`, reads past a large frame right after a poll, polls between them or not),
//! and a plain parser to hold its frames and its end to. Shared by path (`#[path = ...] mod
//! frame_feeding;`) with `protocol/tests/framing.rs` (a proptest) and
//! `fuzz/src/frame_decoder.rs` (the `frame_decoder` fuzz target).

use airlock_protocol::{FrameDecoder, FrameError};

/// What a correct decoder returns for `wire` then EOF, with frames capped at `max`.
pub fn reference(wire: &[u8], max: u32) -> (Vec<Vec<u8>>, Result<(), FrameError>) {
    let mut frames = Vec::new();
    let mut at = 0;
    loop {
        let rest = &wire[at..];
        if rest.is_empty() {
            return (frames, Ok(()));
        }
        let Some(prefix) = rest.first_chunk::<4>() else {
            let received = rest.len() as u32;
            return (
                frames,
                Err(FrameError::Truncated {
                    expected: 4,
                    received,
                }),
            );
        };
        let len = u32::from_le_bytes(*prefix);
        if len == 0 {
            return (frames, Err(FrameError::Empty));
        }
        if len > max {
            return (frames, Err(FrameError::TooLarge { len, max }));
        }
        let body = &rest[4..];
        if body.len() < len as usize {
            let received = body.len() as u32;
            return (
                frames,
                Err(FrameError::Truncated {
                    expected: len,
                    received,
                }),
            );
        }
        frames.push(body[..len as usize].to_vec());
        at += 4 + len as usize;
    }
}

/// How one step hands bytes to the decoder.
#[derive(Clone, Copy, Debug)]
pub enum Feed {
    /// `extend` with up to n bytes.
    Extend(usize),
    /// Append up to n bytes to `read_buffer()`, but never more than `wanted()` (if it is > 0;
    /// when it is 0, fall back to extend): what the doc allows.
    ReadWithin(usize),
    /// Append n bytes to `read_buffer()` regardless of `wanted()`, but only directly after a
    /// poll (`next_frame` returned None): what a transport's read past a frame's end does.
    ReadPastAfterPoll(usize),
}

/// One step: some bytes fed, then frames polled for or not.
#[derive(Clone, Debug)]
pub struct Step {
    /// How the bytes are fed.
    pub feed: Feed,
    /// Whether `next_frame` is called until it has nothing more, after the feed.
    pub poll: bool,
}

/// Feeds `wire` to a decoder capped at `max`, taking `steps` in turn (repeated as needed), then
/// polls and finishes: the frames it gave and its end. Checks on the way that an error, once
/// returned, is returned again. `steps` must not be empty.
pub fn run(wire: &[u8], steps: &[Step], max: u32) -> (Vec<Vec<u8>>, Result<(), FrameError>) {
    assert!(!steps.is_empty(), "at least one step");
    let mut decoder = FrameDecoder::new(max);
    let mut frames = Vec::new();
    let mut err = None;
    let mut at = 0;
    let mut just_polled = false;
    let poll =
        |decoder: &mut FrameDecoder, frames: &mut Vec<Vec<u8>>, err: &mut Option<FrameError>| {
            loop {
                match decoder.next_frame() {
                    Ok(Some(f)) => frames.push(f.to_vec()),
                    Ok(None) => return,
                    Err(e) => {
                        if err.is_none() {
                            *err = Some(e);
                        }
                        // Errors are final and repeat.
                        assert_eq!(decoder.next_frame(), Err(e));
                        return;
                    }
                }
            }
        };
    let mut steps = steps.iter().cycle();
    while at < wire.len() {
        let Some(step) = steps.next() else { break };
        let rest = &wire[at..];
        match step.feed {
            Feed::Extend(n) => {
                let n = n.min(rest.len());
                decoder.extend(&rest[..n]);
                at += n;
            }
            Feed::ReadWithin(n) => {
                let wanted = decoder.wanted();
                let n = if wanted > 0 { n.min(wanted) } else { n };
                let n = n.min(rest.len());
                if wanted > 0 && err.is_none() {
                    decoder.read_buffer().extend_from_slice(&rest[..n]);
                } else {
                    decoder.extend(&rest[..n]);
                }
                at += n;
            }
            Feed::ReadPastAfterPoll(n) => {
                let n = n.min(rest.len());
                if just_polled && err.is_none() {
                    decoder.read_buffer().extend_from_slice(&rest[..n]);
                } else {
                    decoder.extend(&rest[..n]);
                }
                at += n;
            }
        }
        just_polled = false;
        if step.poll {
            poll(&mut decoder, &mut frames, &mut err);
            just_polled = true;
        }
    }
    poll(&mut decoder, &mut frames, &mut err);
    let end = match err {
        Some(e) => Err(e),
        None => decoder.finish(),
    };
    if let Some(e) = err {
        assert_eq!(decoder.finish(), Err(e));
    }
    (frames, end)
}
