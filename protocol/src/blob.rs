//! [`Blob`]: a byte string that a large body's decode takes out of the frame that carried it,
//! without copying it.
//!
//! A `serde_bytes::ByteBuf` in a request or response is copied out of the received frame as
//! it is decoded: for a 16 MiB body, one more pass over all of it on each side. A `Blob` in
//! its place is encoded the same way (the wire cannot tell them apart), but where a host
//! decodes a `Return` or a worker decodes a `Call`, a large `Blob` is a view into the frame's
//! own buffer instead: no copy, and no fresh buffer to fault in.
//!
//! ```
//! use airlock_protocol::blob::{lending, Blob, LENT_FROM};
//! use bytes::Bytes;
//!
//! let large = Blob::from(vec![7u8; LENT_FROM]);
//! let frame = Bytes::from(airlock_codec::to_vec(&large).unwrap());
//! let limits = airlock_codec::Limits::default().max_bytes(2 * LENT_FROM).max_len(2 * LENT_FROM);
//! let decoded: Blob = lending(&frame, || airlock_codec::from_slice(&frame, &limits)).unwrap();
//! assert_eq!(decoded, large);
//! // The bytes are the frame's own (past the length prefix), not a copy.
//! assert_eq!(decoded.as_ptr(), frame[3..].as_ptr());
//! ```
//!
//! # What a lent `Blob` holds
//! A `Blob` is lent the frame's buffer only when that costs no more memory than a copy would
//! within a small factor: when it is at least [`LENT_FROM`] bytes long and at least half the
//! body being decoded. A frame that long is read into a buffer of its own, which holds no
//! other frame and is at most about twice the frame
//! ([`FrameDecoder`](crate::FrameDecoder)), so a lent `Blob` keeps at most about four times its
//! own length alive, for as long as it lives; anything smaller is copied, as a `ByteBuf` is.
//! Outside [`lending`] (decoded from a plain slice, from a progress update, or by another
//! deserializer) a `Blob` is always a copy. The bytes a `Blob` shows are exactly its own: the
//! rest of its frame stays in memory with it, out of reach.

use std::cell::Cell;

use bytes::Bytes;
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Shortest byte string a decode under [`lending`] takes from the frame rather than copying:
/// 64 KiB, the size from which a frame is read into a buffer of its own
/// ([`OWN_BUFFER_FROM`](crate::OWN_BUFFER_FROM)), so a lent `Blob` never shares its buffer with
/// another frame. A shorter one is cheap to copy.
pub const LENT_FROM: usize = crate::framing::OWN_BUFFER_FROM;

/// A byte string, encoded as `serde_bytes::ByteBuf` is, that a large body's decode takes from
/// the received frame without copying (see the [module docs](self)).
///
/// It dereferences to `[u8]`; [`into_bytes`](Self::into_bytes) gives the underlying
/// [`Bytes`], and `From` makes one from a `Vec<u8>`, a `Bytes` or a static slice without
/// copying.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Blob(Bytes);

impl Blob {
    /// An empty blob.
    pub const fn new() -> Self {
        Self(Bytes::new())
    }

    /// The blob's bytes as a [`Bytes`] (no copy).
    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    /// A blob holding a copy of `bytes`.
    pub fn copy_from_slice(bytes: &[u8]) -> Self {
        Self(Bytes::copy_from_slice(bytes))
    }
}

impl std::fmt::Debug for Blob {
    /// The length only: a body can be megabytes long.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl std::ops::Deref for Blob {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for Blob {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Bytes> for Blob {
    fn from(bytes: Bytes) -> Self {
        Self(bytes)
    }
}

impl From<Vec<u8>> for Blob {
    fn from(bytes: Vec<u8>) -> Self {
        Self(Bytes::from(bytes))
    }
}

impl From<&'static [u8]> for Blob {
    fn from(bytes: &'static [u8]) -> Self {
        Self(Bytes::from_static(bytes))
    }
}

impl From<Blob> for Bytes {
    fn from(blob: Blob) -> Self {
        blob.0
    }
}

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Inside `reuse::encode_body`, a large blob's bytes may stay in its buffer.
        crate::body::offer(&self.0);
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_byte_buf(BlobVisitor)
    }
}

struct BlobVisitor;

impl<'de> Visitor<'de> for BlobVisitor {
    type Value = Blob;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_borrowed_bytes<E: serde::de::Error>(self, bytes: &'de [u8]) -> Result<Blob, E> {
        Ok(Blob(
            lent(bytes).unwrap_or_else(|| Bytes::copy_from_slice(bytes)),
        ))
    }

    fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Blob, E> {
        Ok(Blob::copy_from_slice(bytes))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Blob, E> {
        Ok(Blob::from(bytes))
    }

    /// A deserializer without byte strings gives a sequence of `u8`: collected, with no
    /// capacity reserved from its size hint (a peer's claim).
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Blob, A::Error> {
        let mut bytes = Vec::new();
        while let Some(byte) = seq.next_element::<u8>()? {
            bytes.push(byte);
        }
        Ok(Blob::from(bytes))
    }
}

thread_local! {
    /// The body [`lending`] is decoding on this thread, if any.
    static LENDING: Cell<Option<Bytes>> = const { Cell::new(None) };
}

/// Runs `decode` (a decode of `body`'s bytes) with `body` lent to the [`Blob`]s it decodes: a
/// `Blob` of at least [`LENT_FROM`] bytes that is at least half of `body`, and lies within it,
/// shares `body`'s buffer instead of copying. Nests: the body lent before is lent again when
/// `decode` returns or unwinds.
pub fn lending<R>(body: &Bytes, decode: impl FnOnce() -> R) -> R {
    if body.len() < LENT_FROM {
        // No blob of it could be lent: the usual small call pays nothing here.
        return decode();
    }
    /// Puts back what was lent before, however `decode` ends.
    struct Restore(Option<Bytes>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let before = self.0.take();
            let _ = LENDING.try_with(|lending| lending.set(before));
        }
    }
    let before = LENDING
        .try_with(|lending| lending.replace(Some(body.clone())))
        .ok()
        .flatten();
    let _restore = Restore(before);
    decode()
}

/// `bytes` as a view into the body being lent, if there is one, `bytes` lies within it, and
/// the rule in [`lending`] allows it.
fn lent(bytes: &[u8]) -> Option<Bytes> {
    if bytes.len() < LENT_FROM {
        return None;
    }
    LENDING
        .try_with(|lending| {
            let body = lending.take()?;
            let start = (bytes.as_ptr() as usize).checked_sub(body.as_ptr() as usize);
            let view = match start {
                Some(start)
                    if start
                        .checked_add(bytes.len())
                        .is_some_and(|end| end <= body.len())
                        && bytes.len().saturating_mul(2) >= body.len() =>
                {
                    Some(body.slice(start..start + bytes.len()))
                }
                _ => None,
            };
            lending.set(Some(body));
            view
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_codec::Limits;

    fn limits() -> Limits {
        Limits::default()
            .max_bytes(64 * LENT_FROM)
            .max_len(64 * LENT_FROM)
    }

    fn frame_of<T: Serialize>(value: &T) -> Bytes {
        Bytes::from(airlock_codec::to_vec(value).unwrap())
    }

    fn within(view: &[u8], body: &Bytes) -> bool {
        let start = view.as_ptr() as usize;
        let body_start = body.as_ptr() as usize;
        start >= body_start && start + view.len() <= body_start + body.len()
    }

    #[test]
    fn a_large_blob_decoded_under_lending_is_a_view_into_the_body() {
        let sent = Blob::from(vec![0x5a; 4 * LENT_FROM]);
        let body = frame_of(&sent);
        let got: Blob = lending(&body, || airlock_codec::from_slice(&body, &limits())).unwrap();
        assert_eq!(got, sent);
        assert!(within(&got, &body));
    }

    #[test]
    fn small_blobs_and_blobs_outside_lending_are_copies() {
        let small = Blob::from(vec![1; LENT_FROM - 1]);
        let body = frame_of(&small);
        let got: Blob = lending(&body, || airlock_codec::from_slice(&body, &limits())).unwrap();
        assert_eq!(got, small);
        assert!(!within(&got, &body), "under LENT_FROM: copied");

        let large = Blob::from(vec![2; 2 * LENT_FROM]);
        let body = frame_of(&large);
        let got: Blob = airlock_codec::from_slice(&body, &limits()).unwrap();
        assert_eq!(got, large);
        assert!(!within(&got, &body), "no lending: copied");
    }

    #[test]
    fn a_blob_less_than_half_its_body_is_copied_so_it_never_holds_much_more_than_itself() {
        let mixed = (
            Blob::from(vec![3; LENT_FROM]),
            serde_bytes::ByteBuf::from(vec![4; 2 * LENT_FROM]),
        );
        let body = frame_of(&mixed);
        let (blob, rest): (Blob, serde_bytes::ByteBuf) =
            lending(&body, || airlock_codec::from_slice(&body, &limits())).unwrap();
        assert_eq!((&blob, &rest), (&mixed.0, &mixed.1));
        assert!(!within(&blob, &body), "a third of the body: copied");
    }

    #[test]
    fn a_slice_outside_the_lent_body_is_copied() {
        let large = Blob::from(vec![5; 2 * LENT_FROM]);
        let other = frame_of(&large);
        let lent_body = frame_of(&Blob::from(vec![6; 2 * LENT_FROM]));
        let got: Blob =
            lending(&lent_body, || airlock_codec::from_slice(&other, &limits())).unwrap();
        assert_eq!(got, large);
        assert!(!within(&got, &lent_body) && !within(&got, &other));
    }

    #[test]
    fn lending_nests_and_ends_even_when_the_decode_panics() {
        let outer = frame_of(&Blob::from(vec![7; 2 * LENT_FROM]));
        let inner = frame_of(&Blob::from(vec![8; 2 * LENT_FROM]));
        lending(&outer, || {
            let got: Blob =
                lending(&inner, || airlock_codec::from_slice(&inner, &limits())).unwrap();
            assert!(within(&got, &inner));
            let got: Blob = airlock_codec::from_slice(&outer, &limits()).unwrap();
            assert!(within(&got, &outer), "the outer body is lent again");
        });
        let panicked =
            std::panic::catch_unwind(|| lending(&outer, || panic!("a hostile Deserialize")));
        assert!(panicked.is_err());
        let got: Blob = airlock_codec::from_slice(&outer, &limits()).unwrap();
        assert!(!within(&got, &outer), "nothing is lent after the panic");
    }

    #[test]
    fn a_blob_encodes_as_a_byte_buf_does() {
        let bytes = vec![9u8; 300];
        assert_eq!(
            airlock_codec::to_vec(&Blob::from(bytes.clone())).unwrap(),
            airlock_codec::to_vec(&serde_bytes::ByteBuf::from(bytes)).unwrap()
        );
        let back: Blob = airlock_codec::from_slice(&[2, 1, 2], &limits()).unwrap();
        assert_eq!(&back[..], &[1, 2]);
        assert_eq!(format!("{back:?}"), "Blob(2 bytes)");
    }
}
