//! [`Body`]: an encoded request, update or response as the sessions take it. Either one run of
//! bytes, or a short lead followed by a large [`Blob`]'s bytes, which are then written to the
//! peer straight from the `Blob`'s own buffer instead of being copied into the body first.
//!
//! [`encode_body`](crate::reuse::encode_body) makes the second kind when a value's encoding
//! ends with a `Blob` of at least [`SPLICED_FROM`] bytes and at most [`MAX_LEAD`] bytes come
//! before it, as for a `Blob` alone or a struct whose last field is one. The bytes on the wire
//! are the same either way. A `Blob` cannot change once made, so the bytes written are the
//! ones the value held when it was encoded.
//!
//! ```
//! use airlock_protocol::{reuse::encode_body, Blob};
//!
//! let large = Blob::from(vec![7u8; 1 << 20]);
//! let body = encode_body(&large).unwrap();
//! assert_eq!(body.len(), airlock_codec::encoded_len(&large).unwrap());
//! assert_eq!(body.tail().as_ptr(), large.as_ptr(), "the blob's own buffer, not a copy");
//! assert_eq!(body.to_vec(), airlock_codec::to_vec(&large).unwrap());
//! ```
//!
//! [`Blob`]: crate::Blob

use std::cell::{Cell, RefCell};

use bytes::Bytes;
use serde::Serialize;

/// Shortest `Blob` whose bytes a body leaves in the `Blob`'s buffer: 64 KiB. A shorter one
/// costs less to copy than a piece of its own in the write.
pub const SPLICED_FROM: usize = 64 * 1024;

/// Most bytes of a body that may come before a `Blob` left in its buffer: they are written
/// into the frame's head, which is meant to stay small.
pub const MAX_LEAD: usize = 256;

/// An encoded body (see the [module docs](self)): the bytes [`front`](Self::front), then the
/// bytes [`tail`](Self::tail). Made from bytes (`From<Bytes>`, `From<Vec<u8>>`,
/// `From<&'static [u8]>`, `From<&'static str>`), it is those bytes and has no tail. It is no
/// larger than a `Bytes`: every call carries one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Body(Repr);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Repr {
    /// One run of bytes.
    Whole(Bytes),
    /// A lead of at most [`MAX_LEAD`] bytes, then a tail of at least [`SPLICED_FROM`]: boxed,
    /// so that the usual body stays the size of one `Bytes`.
    Spliced(Box<(Bytes, Bytes)>),
}

impl Default for Repr {
    fn default() -> Self {
        Self::Whole(Bytes::new())
    }
}

/// The tail of a body that has none.
static NO_TAIL: Bytes = Bytes::new();

impl Body {
    /// A lead and the large byte string that follows it, kept in its own buffer.
    fn spliced(lead: Vec<u8>, tail: Bytes) -> Self {
        Self(Repr::Spliced(Box::new((Bytes::from(lead), tail))))
    }

    /// Length of the whole body in bytes.
    pub fn len(&self) -> usize {
        self.front().len() + self.tail().len()
    }

    /// True if the body has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The body's bytes before its tail: all of them, if it has none.
    pub fn front(&self) -> &Bytes {
        match &self.0 {
            Repr::Whole(bytes) => bytes,
            Repr::Spliced(parts) => &parts.0,
        }
    }

    /// The bytes that end the body from a buffer of their own; empty if it has none.
    pub fn tail(&self) -> &Bytes {
        match &self.0 {
            Repr::Whole(_) => &NO_TAIL,
            Repr::Spliced(parts) => &parts.1,
        }
    }

    /// The body in one run of bytes: without a copy if it has no tail.
    pub fn into_bytes(self) -> Bytes {
        match self.0 {
            Repr::Whole(bytes) => bytes,
            Repr::Spliced(parts) => Bytes::from([&parts.0[..], &parts.1[..]].concat()),
        }
    }

    /// The body's bytes, copied into one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        [&self.front()[..], &self.tail()[..]].concat()
    }

    /// The body as a frame writes it: the short lead that goes into the frame's head (empty
    /// if the body has no tail), then the bytes written from their own buffer (the tail, or
    /// the whole body).
    pub(crate) fn into_lead_and_rest(self) -> (Bytes, Bytes) {
        match self.0 {
            Repr::Whole(bytes) => (Bytes::new(), bytes),
            Repr::Spliced(parts) => *parts,
        }
    }
}

/// [`Body::into_bytes`]: a copy only if the body has a tail.
impl From<Body> for Bytes {
    fn from(body: Body) -> Self {
        body.into_bytes()
    }
}

impl From<Bytes> for Body {
    fn from(bytes: Bytes) -> Self {
        Self(Repr::Whole(bytes))
    }
}

impl From<Vec<u8>> for Body {
    fn from(bytes: Vec<u8>) -> Self {
        Bytes::from(bytes).into()
    }
}

impl From<&'static [u8]> for Body {
    fn from(bytes: &'static [u8]) -> Self {
        Bytes::from_static(bytes).into()
    }
}

impl From<&'static str> for Body {
    fn from(text: &'static str) -> Self {
        Bytes::from_static(text.as_bytes()).into()
    }
}

thread_local! {
    /// Whether [`encode_spliced`] is running on this thread: only then does a `Blob` offer
    /// its bytes.
    static SPLICING: Cell<bool> = const { Cell::new(false) };
    /// The `Blob` last offered while [`SPLICING`].
    static OFFERED: RefCell<Option<Bytes>> = const { RefCell::new(None) };
}

/// Called by a `Blob` about to serialize its bytes: while [`encode_spliced`] runs, a long
/// enough one is remembered, so that the encoding can leave its bytes where they are.
pub(crate) fn offer(bytes: &Bytes) {
    if bytes.len() < SPLICED_FROM || !SPLICING.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    // `replace` ends the borrow before the blob offered before is dropped: dropping it may
    // run an owner's `Drop` (`Bytes::from_owner`), which may serialize a blob of its own.
    let _before = OFFERED.try_with(|offered| offered.replace(Some(bytes.clone())));
}

/// The last offered `Blob`, if `slice` is exactly its bytes (same place, same length).
fn offered_as(slice: &[u8]) -> Option<Bytes> {
    OFFERED
        .try_with(|offered| {
            offered
                .borrow()
                .as_ref()
                .filter(|bytes| bytes.as_ptr() == slice.as_ptr() && bytes.len() == slice.len())
                .cloned()
        })
        .ok()
        .flatten()
}

/// `value` encoded as a lead of at most [`MAX_LEAD`] bytes and a `Blob`'s bytes left in the
/// `Blob`'s buffer, if its encoding has that shape; `None` if not, having written at most
/// [`MAX_LEAD`] bytes. An error is `None` too: encoded whole, the value meets it again and
/// reports it.
///
/// The tail shares the `Blob`'s buffer through an owner of its own (`Bytes::from_owner`), so
/// it is never unique: once written, it is not taken into [`crate::reuse`]'s kept buffers,
/// which hold only buffers this process encoded into.
pub(crate) fn encode_spliced<T: Serialize + ?Sized>(value: &T) -> Option<Body> {
    /// Ends the splicing however the encoding ends, dropping what was offered.
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            let _ = SPLICING.try_with(|splicing| splicing.set(false));
            let _ = OFFERED.try_with(|offered| offered.borrow_mut().take());
        }
    }
    if SPLICING.try_with(|splicing| splicing.replace(true)) != Ok(false) {
        // Already splicing on this thread (a `Serialize` that encodes a body itself), or the
        // thread is ending: no splice.
        return None;
    }
    let _done = Done;
    let mut tail = None;
    let lead = airlock_codec::encode_lead(value, MAX_LEAD, |slice| {
        tail = (slice.len() >= SPLICED_FROM)
            .then(|| offered_as(slice))
            .flatten();
        tail.is_some()
    });
    match (lead, tail) {
        (Ok(Some(lead)), Some(tail)) if lead.tail_len == tail.len() => {
            Some(Body::spliced(lead.bytes, Bytes::from_owner(tail)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Blob;

    fn blob(len: usize) -> Blob {
        Blob::from((0..len).map(|i| i as u8).collect::<Vec<u8>>())
    }

    #[test]
    fn a_body_is_no_larger_than_bytes() {
        assert_eq!(std::mem::size_of::<Body>(), std::mem::size_of::<Bytes>());
    }

    #[test]
    fn a_large_blob_that_ends_the_encoding_stays_in_its_buffer() {
        let data = blob(SPLICED_FROM);
        for value in [
            (0u8, String::new(), data.clone()),
            (9, "x".repeat(MAX_LEAD - 8), data.clone()),
        ] {
            let body = encode_spliced(&value).expect("spliced");
            assert_eq!(body.tail().as_ptr(), data.as_ptr());
            assert_eq!(body.to_vec(), airlock_codec::to_vec(&value).unwrap());
        }
    }

    #[test]
    fn other_shapes_are_not_spliced() {
        let data = blob(SPLICED_FROM);
        // Something after the blob; a lead too long; a blob too short; no blob at all.
        assert_eq!(encode_spliced(&(data.clone(), 1u8)), None);
        assert_eq!(encode_spliced(&("x".repeat(MAX_LEAD), data.clone())), None);
        assert_eq!(encode_spliced(&blob(SPLICED_FROM - 1)), None);
        let bytes = serde_bytes::ByteBuf::from(vec![1u8; SPLICED_FROM]);
        assert_eq!(encode_spliced(&bytes), None);
        // The thread is left as it was: no blob is offered outside an encoding.
        offer(&data.clone().into_bytes());
        assert!(OFFERED.with(|offered| offered.borrow().is_none()));
    }

    #[test]
    fn of_two_large_blobs_neither_is_spliced_unless_the_first_leads_short() {
        let (first, second) = (blob(SPLICED_FROM), blob(SPLICED_FROM + 1));
        // The first is taken as the tail, then the second follows it: no splice.
        assert_eq!(encode_spliced(&(first, second)), None);
    }

    /// A value shown through `Display` (`collect_str`), as `chrono`'s timestamps serialize.
    struct Shown(&'static str);
    impl Serialize for Shown {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(self.0)
        }
    }

    /// A value whose `Serialize` wraps any error of its field's in one of its own.
    struct Wrapping<T>(T);
    impl<T: Serialize> Serialize for Wrapping<T> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            self.0
                .serialize(serializer)
                .map_err(|err| serde::ser::Error::custom(format_args!("in a wrapper: {err}")))
        }
    }

    /// The splice's refusal of a write past the lead reaches it as another error through
    /// `collect_str` and through a `Serialize` that wraps errors; either way the value is
    /// encoded whole, as `to_vec` encodes it.
    #[test]
    fn a_value_whose_serialize_turns_the_refusal_into_another_error_is_encoded_whole() {
        let stamps: Vec<Shown> = (0..3000)
            .map(|_| Shown("2026-12-05T23:30:00.000000+00:00"))
            .collect();
        let straddling = (
            "x".repeat(MAX_LEAD - 10),
            Shown("a timestamp of 30 characters.."),
            blob(SPLICED_FROM),
        );
        let wrapped = Wrapping(serde_bytes::ByteBuf::from(vec![3u8; 2 * SPLICED_FROM]));
        assert_eq!(encode_spliced(&stamps), None);
        assert_eq!(encode_spliced(&straddling), None);
        assert_eq!(encode_spliced(&wrapped), None);
        for (body, whole) in [
            (
                crate::reuse::encode_body(&stamps),
                airlock_codec::to_vec(&stamps),
            ),
            (
                crate::reuse::encode_body(&straddling),
                airlock_codec::to_vec(&straddling),
            ),
            (
                crate::reuse::encode_body(&wrapped),
                airlock_codec::to_vec(&wrapped),
            ),
        ] {
            assert_eq!(body.unwrap().to_vec(), whole.unwrap());
        }
    }

    /// A spliced tail is never unique, so a written one is not kept by `reuse`: a blob's
    /// buffer is its owner's, and may be far larger than the blob.
    #[test]
    fn a_written_tail_is_not_kept_for_reuse() {
        let data = Blob::from(vec![5u8; 2 * crate::reuse::REUSED_FROM]);
        let at = data.as_ptr();
        let body = encode_spliced(&data).expect("spliced");
        drop(data);
        let (_, tail) = body.into_lead_and_rest();
        assert_eq!(tail.as_ptr(), at);
        assert!(
            tail.try_into_mut().is_err(),
            "the tail's buffer could be taken"
        );
    }

    /// Owns a blob's buffer and, when dropped, measures a large blob of its own (so offers it
    /// while a splice runs).
    struct OffersWhenDropped(Vec<u8>);
    impl AsRef<[u8]> for OffersWhenDropped {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    impl Drop for OffersWhenDropped {
        fn drop(&mut self) {
            let _ = airlock_codec::encoded_len(&blob(SPLICED_FROM));
        }
    }

    /// Offers a blob whose buffer only the offer then holds, and then serializes `.0`, whose
    /// offer drops it.
    struct DropsTheOffered(Blob);
    impl Serialize for DropsTheOffered {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            let owned = OffersWhenDropped(vec![1u8; SPLICED_FROM]);
            let _ = airlock_codec::encoded_len(&Blob::from(Bytes::from_owner(owned)));
            self.0.serialize(serializer)
        }
    }

    /// An offer that drops the blob offered before it, whose owner offers another while being
    /// dropped, neither panics nor changes the bytes.
    #[test]
    fn an_owner_that_offers_a_blob_while_dropped_is_encoded_as_to_vec_encodes_it() {
        let value = DropsTheOffered(blob(SPLICED_FROM));
        let body = crate::reuse::encode_body(&value).unwrap();
        assert_eq!(body.to_vec(), airlock_codec::to_vec(&value).unwrap());
    }
}
