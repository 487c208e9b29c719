//! Frames: the messages of the protocol, one file per kind.
//!
//! A frame's payload is the airlock-codec (postcard) encoding of [`Frame`]: a one-byte kind tag
//! (the variant index) followed by that kind's fields in order. Bodies are the last field and
//! length-prefixed, so a frame's head (everything before the body) can be written separately
//! from the body and the body is never copied to build a frame. `PROTOCOL.md` gives every byte.

mod call;
mod cancel;
mod fail;
mod fast;
mod hello;
mod progress;
mod refuse;
mod ret;
mod shutdown;
mod welcome;

use airlock_codec::Limits;
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

pub use call::Call;
pub use cancel::Cancel;
pub use fail::Fail;
pub use hello::{token_matches, Hello, MAX_HELLO_METHODS, TOKEN_LEN};
pub use progress::Progress;
pub use refuse::{Refuse, RefuseReason};
pub use ret::Return;
pub use shutdown::Shutdown;
pub use welcome::Welcome;

use crate::{Body, CallId, DecodeFrameError};

/// One frame, borrowing its strings and body from the received buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame<'a> {
    /// Tag 0, worker → host.
    #[serde(borrow)]
    Hello(Hello<'a>),
    /// Tag 1, host → worker.
    Welcome(Welcome),
    /// Tag 2, host → worker.
    Refuse(Refuse),
    /// Tag 3, host → worker.
    #[serde(borrow)]
    Call(Call<'a>),
    /// Tag 4, host → worker.
    Cancel(Cancel),
    /// Tag 5, worker → host.
    #[serde(borrow)]
    Progress(Progress<'a>),
    /// Tag 6, worker → host.
    #[serde(borrow)]
    Return(Return<'a>),
    /// Tag 7, worker → host.
    #[serde(borrow)]
    Fail(Fail<'a>),
    /// Tag 8, host → worker.
    Shutdown(Shutdown),
}

/// A frame's kind, without its fields: what logs and violations name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FrameKind {
    /// [`Hello`].
    Hello,
    /// [`Welcome`].
    Welcome,
    /// [`Refuse`].
    Refuse,
    /// [`Call`].
    Call,
    /// [`Cancel`].
    Cancel,
    /// [`Progress`].
    Progress,
    /// [`Return`].
    Return,
    /// [`Fail`].
    Fail,
    /// [`Shutdown`].
    Shutdown,
}

impl Frame<'_> {
    /// This frame's kind.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Hello(_) => FrameKind::Hello,
            Frame::Welcome(_) => FrameKind::Welcome,
            Frame::Refuse(_) => FrameKind::Refuse,
            Frame::Call(_) => FrameKind::Call,
            Frame::Cancel(_) => FrameKind::Cancel,
            Frame::Progress(_) => FrameKind::Progress,
            Frame::Return(_) => FrameKind::Return,
            Frame::Fail(_) => FrameKind::Fail,
            Frame::Shutdown(_) => FrameKind::Shutdown,
        }
    }
}

/// Nesting a frame header can need: enum → struct → option/vec → value.
const HEADER_MAX_DEPTH: usize = 4;

/// Decodes one frame payload (without its length prefix), strictly: the codec's rules plus
/// trailing bytes refused. Field rules (names, tokens, messages) are the sessions' to check.
pub fn decode_frame(payload: &[u8]) -> Result<Frame<'_>, DecodeFrameError> {
    // A call's own frames, read directly; the codec decides everything else (see `fast`).
    match fast::body_frame(payload) {
        Some(frame) => Ok(frame),
        None => decode_with_codec(payload),
    }
}

/// [`decode_frame`] by the codec alone: every kind, every rule, every error named.
fn decode_with_codec(payload: &[u8]) -> Result<Frame<'_>, DecodeFrameError> {
    let limits = Limits::default()
        .max_bytes(payload.len())
        .max_len(payload.len())
        .max_depth(HEADER_MAX_DEPTH)
        .max_items(MAX_HELLO_METHODS);
    airlock_codec::from_slice(payload, &limits).map_err(DecodeFrameError)
}

/// The protocol version a `Hello` payload states, read from its first field alone, or `None`
/// if the payload is not a `Hello` or its version varint is malformed.
///
/// The version is the one field every future `Hello` layout keeps in place (tag 0, then a
/// varint `u32`), so a host can refuse a peer of another version cleanly even when the rest
/// of its `Hello` would not decode with this version's layout.
pub fn peek_hello_version(payload: &[u8]) -> Option<u32> {
    let (&tag, rest) = payload.split_first()?;
    if tag != 0 {
        return None;
    }
    let mut value: u64 = 0;
    for (i, &byte) in rest.iter().take(5).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return u32::try_from(value).ok();
        }
    }
    None
}

/// Encodes `frame` with its length prefix, ready for the wire.
///
/// The sessions build their frames themselves (without copying bodies); this is for peers
/// written by hand — test doubles, the rogue worker, tools — and for the golden vectors.
///
/// ```
/// use airlock_protocol::frame::{encode_frame, Frame, Shutdown};
/// assert_eq!(encode_frame(&Frame::Shutdown(Shutdown)), [1, 0, 0, 0, 8]);
/// ```
pub fn encode_frame(frame: &Frame<'_>) -> Vec<u8> {
    Encoder::default().whole(frame).to_vec()
}

/// A frame ready to write: its head (length prefix, tag, fields) and its body, kept apart so
/// that a large body is written straight from the caller's buffer (a vectored write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Length prefix and every field before the body (or the whole frame, if it has none);
    /// for a [`Body`] with a tail, also the body's short front.
    pub head: Bytes,
    /// The body, or a [`Body`]'s tail; empty for kinds without one.
    pub body: Bytes,
}

impl Transmit {
    /// Total bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// True if nothing would be written (never the case for a real frame).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame's bytes in one buffer (copies the body; for tests and small frames).
    pub fn to_vec(&self) -> Vec<u8> {
        [&self.head[..], &self.body[..]].concat()
    }
}

/// Postcard's variant indices for the kinds that carry a body.
const TAG_CALL: u8 = 3;
const TAG_PROGRESS: u8 = 5;
const TAG_RETURN: u8 = 6;

/// Builds frames into a reused buffer, so steady-state encoding allocates nothing per frame.
///
/// Heads are cut from chunks of at least [`HEAD_CHUNK`] bytes: while earlier heads are still
/// queued (calls or answers in flight), later ones share their chunk instead of each taking a
/// buffer of its own; once they are all written, the chunk is reused from its start.
#[derive(Debug, Default)]
pub(crate) struct Encoder {
    buf: BytesMut,
}

/// The least room the encoder's buffer is grown by: about forty heads of typical calls.
const HEAD_CHUNK: usize = 4096;

impl Encoder {
    /// Room for at least `len` more bytes, in a chunk of at least [`HEAD_CHUNK`].
    fn room(&mut self, len: usize) {
        if self.buf.capacity() - self.buf.len() < len {
            self.buf.reserve(len.max(HEAD_CHUNK));
        }
    }

    /// A frame without a body: length prefix, then the codec encoding of `frame`.
    pub(crate) fn whole(&mut self, frame: &Frame<'_>) -> Transmit {
        self.room(HEAD_CAPACITY);
        let mut buf = core::mem::take(&mut self.buf);
        buf.put_u32_le(0); // patched below, once the length is known
                           // Encoding a frame we built ourselves cannot fail: every field is plain data, and
                           // `to_extend` only fails for unknown-length sequences or failing `Serialize` impls.
        buf = airlock_codec::to_extend(frame, buf).unwrap_or_default();
        let len = buf.len().saturating_sub(4) as u32;
        if let Some(prefix) = buf.get_mut(..4) {
            prefix.copy_from_slice(&len.to_le_bytes());
        }
        self.buf = buf;
        Transmit {
            head: self.buf.split().freeze(),
            body: Bytes::new(),
        }
    }

    /// A `Call`, `Progress` or `Return` frame: the head is written here, the body is shared.
    /// Byte-identical to encoding the whole [`Frame`] (a golden test pins this). A body with
    /// a tail ([`Body`]) has its short front written into the head, and its tail is the
    /// transmit's body.
    pub(crate) fn with_body(
        &mut self,
        tag: BodyTag,
        id: CallId,
        method: &[u8],
        body: impl Into<Body>,
    ) -> Transmit {
        let body = body.into();
        let body_len = body.len();
        let (lead, body) = body.into_lead_and_rest();
        // Prefix, tag, id, name length (one byte: names are at most 64), name, body length.
        let mut head = [0u8; HEAD_CAPACITY];
        debug_assert!(
            method.len() <= crate::MAX_METHOD_NAME,
            "unvalidated method name"
        );
        let mut at = 4;
        let mut put = |bytes: &[u8]| {
            if let Some(dst) = head.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
            at += bytes.len();
        };
        put(&[tag as u8]);
        put(&id.to_bytes());
        put(varint(method.len() as u64).as_slice());
        put(method);
        put(varint(body_len as u64).as_slice());
        let frame_len = (at - 4 + body_len) as u32;
        if let Some(prefix) = head.get_mut(..4) {
            prefix.copy_from_slice(&frame_len.to_le_bytes());
        }
        self.room(at + lead.len());
        self.buf
            .extend_from_slice(head.get(..at).unwrap_or_default());
        self.buf.extend_from_slice(&lead);
        Transmit {
            head: self.buf.split().freeze(),
            body,
        }
    }
}

/// The largest head `Encoder::with_body` can write: every caller passes a validated name.
const HEAD_CAPACITY: usize = 4 + 1 + 16 + 1 + crate::MAX_METHOD_NAME + 10;

/// The kinds whose frames carry a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum BodyTag {
    Call = TAG_CALL,
    Progress = TAG_PROGRESS,
    Return = TAG_RETURN,
}

/// A LEB128 varint in a small inline buffer.
struct Varint {
    bytes: [u8; 10],
    len: usize,
}

impl Varint {
    fn as_slice(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }
}

fn varint(mut v: u64) -> Varint {
    let mut out = Varint {
        bytes: [0; 10],
        len: 0,
    };
    for slot in out.bytes.iter_mut() {
        out.len += 1;
        if v < 0x80 {
            *slot = v as u8;
            break;
        }
        *slot = (v as u8) | 0x80;
        v >>= 7;
    }
    out
}

/// Length of a `Call`/`Progress`/`Return` frame's payload (what its length prefix says).
pub(crate) const fn body_frame_len(method_len: usize, body_len: usize) -> usize {
    1 + 16 + varint_len(method_len as u64) + method_len + varint_len(body_len as u64) + body_len
}

const fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}
