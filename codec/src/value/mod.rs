//! The closed dynamic model: [`Value`] and its map [`Key`].
//!
//! A `Value` is data and nothing else: there is no variant that names a type, a class, a
//! function or a module, and the wire tags are a fixed set of ten (see [`wire`](self) and
//! `PROTOCOL.md`). Decoding one can only ever produce these variants.

mod de;
mod ser;
mod wire;

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

pub use de::from_value;
pub use ser::to_value;

/// A dynamically typed value, closed to exactly these variants.
///
/// ```
/// use airlock_codec::{Limits, Value, Key};
/// let v = Value::Map([(Key::from("n"), Value::U64(3))].into_iter().collect());
/// let bytes = v.to_vec();
/// assert_eq!(bytes, [0x09, 0x01, 0x06, 0x01, b'n', 0x04, 0x03]);
/// assert_eq!(Value::from_slice(&bytes, &Limits::default()).unwrap(), v);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// No value (`()`, `None`, a unit struct).
    Null,
    /// A boolean.
    Bool(bool),
    /// A signed integer (what signed Rust integers become).
    I64(i64),
    /// An unsigned integer (what unsigned Rust integers become).
    U64(u64),
    /// A 64-bit float, bit-exact on the wire (NaN payloads included).
    F64(f64),
    /// A UTF-8 string.
    Str(String),
    /// A byte string.
    Bytes(Vec<u8>),
    /// An ordered list.
    List(Vec<Value>),
    /// A map with unique keys, ordered by [`Key`]'s `Ord`. The wire may list entries in any
    /// order, but a key that appears twice is refused ([`DecodeError::DuplicateMapKey`](crate::DecodeError::DuplicateMapKey)).
    Map(BTreeMap<Key, Value>),
}

/// A map key: a string or an integer, nothing else.
///
/// `Key::I64(1)` and `Key::U64(1)` are different keys, as their wire tags differ.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// A signed integer key.
    I64(i64),
    /// An unsigned integer key.
    U64(u64),
    /// A string key (struct field names become these).
    Str(String),
}

impl From<&str> for Key {
    fn from(s: &str) -> Self {
        Key::Str(s.into())
    }
}

impl From<String> for Key {
    fn from(s: String) -> Self {
        Key::Str(s)
    }
}
