//! Non-executing, budgeted encoding for every byte that crosses the airlock boundary.
//!
//! What a byte string may become is fixed by the caller — a Rust type ([`from_slice`]) or the
//! closed [`Value`] enum ([`Value::from_slice`]) — never by the input: no decoder here can name
//! a type, call a hook or look anything up from the bytes it reads. Every decode runs within
//! [`Limits`] (input bytes, nesting depth, element count, string and byte-buffer length), each
//! checked *before*
//! its cost is paid, and is strict: truncation, trailing bytes, invalid UTF-8, out-of-range
//! tags and overlong or overflowing varints are all errors. No input makes it panic or recurse
//! without bound. Allocation is bounded by the input and the declared type together: strings
//! and byte strings never exceed the bytes that carry them; capacity reserved ahead of elements
//! sums, over a whole decode, to at most one element slot per [`INPUT_BYTES_PER_PREALLOC_SLOT`]
//! (16) input bytes, a slot being one element of the container's type; and the decoded value is
//! what the input encodes times that type's own expansion (a `BTreeMap` node has room for
//! eleven entries however few it holds; a `Vec` grown past its hint may keep room for twice
//! its elements). Maps are given no size hint at all. So memory is a small multiple of the
//! input's length for small element types; box large elements (a `Vec<[u64; 512]>` slot is
//! 4 KiB, a `Vec<Box<[u64; 512]>>` slot 8 bytes); a `HashSet` turns its slots into a bucket
//! table up to about four times their size. A dynamic [`Value`] is charged for its map nodes
//! and gives back its lists' slack, so one decoded `Value` holds at most about `max_items`
//! times 32 bytes plus its strings' bytes.
//!
//! ```
//! use airlock_codec::{from_slice, to_vec, DecodeError, Limits};
//!
//! #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
//! struct Reply { id: u64, name: String, tags: Vec<String> }
//!
//! let reply = Reply { id: 7, name: "seven".into(), tags: vec!["odd".into()] };
//! let bytes = to_vec(&reply).unwrap();
//! assert_eq!(from_slice::<Reply>(&bytes, &Limits::default()).unwrap(), reply);
//!
//! // A hostile peer claims a four-billion-element tag list in a few bytes: refused at once.
//! let bomb = [7, 5, b's', b'e', b'v', b'e', b'n', 0xff, 0xff, 0xff, 0xff, 0x0f];
//! let err = from_slice::<Reply>(&bomb, &Limits::default()).unwrap_err();
//! assert_eq!(err, DecodeError::ItemLimit { max: 1024 * 1024 });
//! ```
//!
//! The typed encoding is postcard's, byte for byte ([`to_vec`] delegates to it); the decoder
//! is this crate's own, because postcard's does not enforce depth or item budgets, and accepts
//! overlong varints. The wire formats are specified in `PROTOCOL.md` at the repository root.
//!
//! ## Byte buffers
//! A plain `Vec<u8>` works at any size the byte budgets allow: a sequence of lone `u8` (or
//! `i8`) elements, each one byte in memory, in a container that keeps them in one buffer
//! (`Vec`, `VecDeque`, `BinaryHeap`: those that ask for the size hint), is budgeted as the
//! byte string it is, by the input's length and [`Limits::max_len`], not element by element
//! against [`Limits::max_items`]. That is sound because each such element is read from
//! exactly one input byte and occupies one byte of the buffer, so the byte budgets already
//! bound its count and its memory; the item budget exists for elements they do not bound
//! (zero-sized ones, and ones larger in memory than on the wire, such as a `Box<u8>` or a
//! `LinkedList<u8>`'s node), and every other element is still charged to it.
//!
//! serde still decodes a `Vec<u8>` one element at a time, which costs about three times as
//! much as a byte string. For bulk data use a byte type: `serde_bytes::ByteBuf`, a
//! `#[serde(with = "serde_bytes")]` field, or a borrowed `&[u8]`/`&serde_bytes::Bytes`. The
//! wire encoding is identical, so either side may switch without the other noticing.
//!
//! ```
//! use airlock_codec::{from_slice, to_vec, DecodeError, Limits};
//!
//! #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
//! struct Image {
//!     name: String,
//!     #[serde(with = "serde_bytes")] // the fast path: one copy, not one step per byte
//!     pixels: Vec<u8>,
//!     thumbnail: Vec<u8>, // also fine: budgeted as bytes, just slower
//! }
//!
//! let image = Image { name: "scan".into(), pixels: vec![0; 4 << 20], thumbnail: vec![0; 2 << 20] };
//! let bytes = to_vec(&image).unwrap();
//! // Six million bytes, far over a budget of ten items: only the bytes are counted.
//! let limits = Limits::default().max_items(10);
//! assert_eq!(from_slice::<Image>(&bytes, &limits).unwrap(), image);
//! // And both kinds of buffer are held to the length budget.
//! let err = from_slice::<Image>(&bytes, &limits.max_len(1 << 20)).unwrap_err();
//! assert_eq!(err, DecodeError::LengthLimit { len: 4 << 20, max: 1 << 20 });
//! ```
//!
//! ## What a target type must be
//! Decoding runs the target type's `Deserialize` and nothing else. Keep message types plain
//! data: a hand-written `Deserialize` with side effects, or a type whose invariants its
//! constructor would normally check, runs or skips that logic on hostile input. Validate
//! after decoding.
//!
//! Typed maps follow the target type's own rules: a `HashMap`/`BTreeMap` keeps the last of
//! duplicate keys, as serde does everywhere. Use [`Value`] (which refuses duplicates) or a
//! validating wrapper where a repeated key must be an error.

#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

extern crate alloc;

mod de;
mod error;
mod limits;
mod reader;
mod ser;
mod value;

pub use de::{from_slice, from_slice_counted};
pub use error::{is_unsafe_in_text, DecodeError, EncodeError, MAX_CUSTOM_MESSAGE};
pub use limits::{
    Limits, DEFAULT_MAX_BYTES, DEFAULT_MAX_DEPTH, DEFAULT_MAX_ITEMS, DEFAULT_MAX_LEN,
    INPUT_BYTES_PER_PREALLOC_SLOT,
};
pub use ser::{append_to_vec, encode_lead, encoded_len, to_extend, to_slice, to_vec, Lead};
pub use value::{from_value, to_value, Key, Value};
