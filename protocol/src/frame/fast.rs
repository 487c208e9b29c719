//! The frames of a call's traffic (`Call`, `Progress`, `Return`) read without the codec's
//! general machinery: one per call on each side, so their decoding is on every call's path.
//!
//! The rule this file keeps: [`body_frame`] accepts a payload only if the codec
//! ([`decode_with_codec`](super::decode_with_codec)) would accept it as the same [`Frame`].
//! Anything it is unsure of (another kind, a length of more than four varint bytes, any fault)
//! it leaves to the codec, which then decides and names the error. A differential test holds
//! it to that over every truncation, byte flip and extension of valid frames.

use super::{Call, Frame, Progress, Return, TAG_CALL, TAG_PROGRESS, TAG_RETURN};
use crate::CallId;

/// `payload` as a `Call`, `Progress` or `Return` frame: the tag, the 16-byte id, the method
/// name (varint length, UTF-8), the body (varint length, to the end of the payload). `None`
/// when it is anything else or anything is off.
pub(super) fn body_frame(payload: &[u8]) -> Option<Frame<'_>> {
    let (&tag, rest) = payload.split_first()?;
    if !matches!(tag, TAG_CALL | TAG_PROGRESS | TAG_RETURN) {
        return None;
    }
    let (id, rest) = rest.split_first_chunk::<16>()?;
    let (name_len, rest) = length(rest)?;
    let (method, rest) = rest.split_at_checked(name_len)?;
    let method = core::str::from_utf8(method).ok()?;
    let (body_len, body) = length(rest)?;
    if body.len() != body_len {
        return None;
    }
    let id = CallId::from_bytes(*id);
    Some(match tag {
        TAG_CALL => Frame::Call(Call { id, method, body }),
        TAG_PROGRESS => Frame::Progress(Progress { id, method, body }),
        _ => Frame::Return(Return { id, method, body }),
    })
}

/// A length: a canonical LEB128 varint of at most four bytes (below 2^28, beyond any frame
/// this reads), and what follows it. An overlong one (a final zero group) is left to the
/// codec, which refuses it.
fn length(input: &[u8]) -> Option<(usize, &[u8])> {
    let mut value = 0usize;
    for (i, &byte) in input.iter().take(4).enumerate() {
        value |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return None;
            }
            return Some((value, input.get(i + 1..)?));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_with_codec, BodyTag, Encoder};
    use bytes::Bytes;

    /// Valid frames of every body-carrying kind, names and bodies across the varint steps.
    fn valid_payloads() -> Vec<Vec<u8>> {
        let mut encoder = Encoder::default();
        let mut out = Vec::new();
        let names: [&[u8]; 4] = [b"e", b"echo", "m\u{e9}thode".as_bytes(), &[b'n'; 64]];
        for (k, tag) in [BodyTag::Call, BodyTag::Progress, BodyTag::Return]
            .into_iter()
            .enumerate()
        {
            for (n, name) in names.iter().enumerate() {
                for len in [0usize, 1, 127, 128, 300, 16_383, 16_384] {
                    let id = CallId::from_bytes([(k * 16 + n) as u8; 16]);
                    let body = Bytes::from(vec![(len % 251) as u8; len]);
                    let t = encoder.with_body(tag, id, name, body);
                    // Without the 4-byte length prefix.
                    out.push([&t.head[4..], &t.body[..]].concat());
                }
            }
        }
        out
    }

    /// Holds the rule for one payload: accepted here only as the codec accepts it.
    fn agrees(payload: &[u8]) {
        if let Some(fast) = body_frame(payload) {
            assert_eq!(
                decode_with_codec(payload).ok(),
                Some(fast),
                "{payload:02x?}"
            );
        }
    }

    #[test]
    fn every_valid_call_progress_and_return_frame_takes_the_fast_path() {
        for payload in valid_payloads() {
            let fast = body_frame(&payload).expect("a valid frame the fast path refused");
            assert_eq!(decode_with_codec(&payload).ok(), Some(fast));
        }
    }

    #[test]
    fn the_fast_path_accepts_nothing_the_codec_refuses_or_reads_otherwise() {
        for payload in valid_payloads().into_iter().filter(|p| p.len() < 400) {
            for end in 0..payload.len() {
                agrees(&payload[..end]);
            }
            for at in 0..payload.len() {
                for flip in [0x01u8, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xff] {
                    let mut mutated = payload.clone();
                    mutated[at] ^= flip;
                    agrees(&mutated);
                }
            }
            for extra in [&[0u8][..], &[0x80], &[1, 2, 3]] {
                agrees(&[&payload[..], extra].concat());
            }
        }
    }

    #[test]
    fn overlong_and_invalid_pieces_are_left_to_the_codec() {
        let id = [7u8; 16];
        let frame = |name_len: &[u8], name: &[u8], body_len: &[u8], body: &[u8]| {
            [&[TAG_RETURN][..], &id, name_len, name, body_len, body].concat()
        };
        let cases = [
            // An overlong name length (0x81 0x00 is 1 in two bytes).
            frame(&[0x81, 0x00], b"e", &[1], b"x"),
            // An overlong body length.
            frame(&[1], b"e", &[0x80, 0x00], b""),
            // A name that is not UTF-8.
            frame(&[1], &[0xff], &[1], b"x"),
            // A body length longer than four varint bytes.
            frame(&[1], b"e", &[0x80, 0x80, 0x80, 0x80, 0x01], b""),
        ];
        for payload in cases {
            assert_eq!(body_frame(&payload), None, "{payload:02x?}");
            agrees(&payload);
        }
    }
}
