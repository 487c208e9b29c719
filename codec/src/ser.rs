//! Typed encoding: exactly postcard's bytes, with this crate's error type.
//!
//! Encoding runs on data the caller already holds, so it needs no budget; it is the decoder on
//! the other side that enforces [`Limits`](crate::Limits). Delegating to postcard keeps the two
//! byte-identical by construction, which the golden-vector tests pin.

use alloc::string::String;
use alloc::vec::Vec;
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
