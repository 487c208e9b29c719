//! Typed encoding: exactly postcard's bytes, with this crate's error type.
//!
//! Encoding runs on data the caller already holds, so it needs no budget; it is the decoder on
//! the other side that enforces [`Limits`](crate::Limits). Delegating to postcard keeps the two
//! byte-identical by construction, which the golden-vector tests pin.

use alloc::string::String;
use alloc::vec::Vec;
use core::cell::Cell;
use serde::Serialize;

use crate::EncodeError;

/// Encodes `value` in the postcard wire format.
///
/// Refuses only what the format cannot express: a sequence or map of unknown length, or a
/// failure reported by the value's own `Serialize`.
///
/// ```
/// assert_eq!(airlock_codec::to_vec(&(1u8, "hi")).unwrap(), [1, 2, b'h', b'i']);
/// ```
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, EncodeError> {
    // Measured first (a pass that copies nothing), then written into a buffer of exactly that
    // size: one allocation, and a buffer whose length is its capacity, which becomes `Bytes`
    // without another.
    append_to_vec(value, Vec::with_capacity(encoded_len(value)?))
}

/// Appends the encoding of `value` to `out` and returns it: [`to_extend`] for a `Vec`, but
/// byte strings are copied whole (`memcpy`) rather than byte by byte, which for a large body is
/// the difference between one fast copy and a loop (about a quarter of its time, measured on
/// a 16 MiB body).
///
/// On error, the buffer is lost with the partial encoding in it.
///
/// ```
/// let out = airlock_codec::append_to_vec(&(1u8, "hi"), vec![9]).unwrap();
/// assert_eq!(out, [9, 1, 2, b'h', b'i']);
/// ```
pub fn append_to_vec<T: Serialize + ?Sized>(
    value: &T,
    out: Vec<u8>,
) -> Result<Vec<u8>, EncodeError> {
    postcard::serialize_with_flavor(value, VecFlavor(out)).map_err(map_postcard)
}

/// postcard's output into a `Vec`, with slices appended by `extend_from_slice`. postcard's own
/// `AllocVec` does the same but cannot start from a buffer the caller already has.
struct VecFlavor(Vec<u8>);

impl postcard::ser_flavors::Flavor for VecFlavor {
    type Output = Vec<u8>;

    #[inline]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// An encoding split by [`encode_lead`]: the bytes before one byte string that ends it, and
/// that string's length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lead {
    /// Every byte of the encoding before the tail.
    pub bytes: Vec<u8>,
    /// Length of the tail: the byte string left out, whose bytes end the encoding.
    pub tail_len: usize,
}

/// Encodes `value` into at most `max_lead` bytes followed by one byte string chosen by
/// `is_tail`, which is left out so that the caller can write it from where it already is: the
/// encoding is then exactly `lead.bytes` followed by that string's bytes. `is_tail` is asked
/// about every slice the encoding copies whole (byte strings, strings, varints), in order; the
/// first it accepts becomes the tail.
///
/// `Ok(None)` when the encoding does not have that shape: more than `max_lead` bytes come
/// before any accepted slice, or anything follows it. The attempt then stops as soon as it
/// knows, having written at most `max_lead` bytes; encode the value whole instead.
///
/// ```
/// let big = vec![7u8; 1000];
/// let value = (1u8, serde_bytes::Bytes::new(&big));
/// let lead = airlock_codec::encode_lead(&value, 16, |s| s.len() == 1000).unwrap().unwrap();
/// assert_eq!(lead.tail_len, 1000);
/// let whole = airlock_codec::to_vec(&value).unwrap();
/// assert_eq!([&lead.bytes[..], &big[..]].concat(), whole);
/// // Something after the string: no tail.
/// let after = (serde_bytes::Bytes::new(&big), 1u8);
/// assert_eq!(airlock_codec::encode_lead(&after, 16, |s| s.len() == 1000).unwrap(), None);
/// ```
pub fn encode_lead<T: Serialize + ?Sized>(
    value: &T,
    max_lead: usize,
    is_tail: impl FnMut(&[u8]) -> bool,
) -> Result<Option<Lead>, EncodeError> {
    let misfit = Cell::new(false);
    let flavor = LeadFlavor {
        bytes: Vec::with_capacity(max_lead),
        max_lead,
        is_tail,
        tail_len: None,
        misfit: &misfit,
    };
    match postcard::serialize_with_flavor(value, flavor) {
        Ok(lead) => Ok(lead),
        // The flavor refused a write that does not fit the shape: not an error of the value's,
        // whatever error it became on its way out (postcard's `collect_str` turns it into a
        // formatting error; a `Serialize` may wrap it in one of its own).
        Err(_) if misfit.get() => Ok(None),
        Err(err) => Err(map_postcard(err)),
    }
}

/// [`encode_lead`]'s output: a lead of bounded length, then at most one slice left out, after
/// which any write is refused. A refusal is recorded in `misfit`, which outlives the flavor:
/// the error it returns may reach [`encode_lead`] as another error, or not at all.
struct LeadFlavor<'m, F> {
    bytes: Vec<u8>,
    max_lead: usize,
    is_tail: F,
    /// Length of the slice left out, once one is.
    tail_len: Option<usize>,
    /// A write the shape does not allow was refused.
    misfit: &'m Cell<bool>,
}

impl<F> LeadFlavor<'_, F> {
    /// Appends `bytes` to the lead, if it is still open and they fit.
    fn lead(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        if self.tail_len.is_some() || self.bytes.len() + bytes.len() > self.max_lead {
            self.misfit.set(true);
            return Err(postcard::Error::SerializeBufferFull);
        }
        self.bytes.extend_from_slice(bytes);
        Ok(())
    }
}

impl<F: FnMut(&[u8]) -> bool> postcard::ser_flavors::Flavor for LeadFlavor<'_, F> {
    type Output = Option<Lead>;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.lead(&[byte])
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        if self.tail_len.is_none() && (self.is_tail)(bytes) {
            self.tail_len = Some(bytes.len());
            return Ok(());
        }
        self.lead(bytes)
    }

    fn finalize(self) -> postcard::Result<Option<Lead>> {
        Ok(match (self.misfit.get(), self.tail_len) {
            (false, Some(tail_len)) => Some(Lead {
                bytes: self.bytes,
                tail_len,
            }),
            _ => None,
        })
    }
}

/// The length of `value`'s encoding, measured without writing it (a pass that copies
/// nothing), to size a buffer before [`to_extend`].
///
/// ```
/// assert_eq!(airlock_codec::encoded_len(&(1u8, "hi")).unwrap(), 4);
/// ```
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize, EncodeError> {
    postcard::experimental::serialized_size(value).map_err(map_postcard)
}

/// Appends the encoding of `value` to `out` (for example a frame buffer being assembled).
///
/// On error, `out` may hold a partial encoding after its original contents.
pub fn to_extend<T: Serialize + ?Sized, W: Extend<u8>>(
    value: &T,
    out: W,
) -> Result<W, EncodeError> {
    postcard::to_extend(value, out).map_err(map_postcard)
}

/// Encodes `value` into `buf` and returns the used prefix; [`EncodeError::BufferFull`] when it
/// does not fit.
pub fn to_slice<'b, T: Serialize + ?Sized>(
    value: &T,
    buf: &'b mut [u8],
) -> Result<&'b mut [u8], EncodeError> {
    postcard::to_slice(value, buf).map_err(map_postcard)
}

fn map_postcard(err: postcard::Error) -> EncodeError {
    match err {
        postcard::Error::SerializeBufferFull => EncodeError::BufferFull,
        postcard::Error::SerializeSeqLengthUnknown => EncodeError::LengthUnknown,
        // postcard keeps no message for a `Serialize` impl's own error.
        _ => EncodeError::Custom(String::new()),
    }
}
