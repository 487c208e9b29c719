//! The self-describing encoding of [`Value`]: one tag byte, then the payload.
//!
//! | tag | variant | payload |
//! |-----|---------|---------|
//! | `0x00` | `Null` | none |
//! | `0x01` | `Bool(false)` | none |
//! | `0x02` | `Bool(true)` | none |
//! | `0x03` | `I64` | zigzag varint |
//! | `0x04` | `U64` | varint |
//! | `0x05` | `F64` | 8 bytes, little-endian IEEE 754 |
//! | `0x06` | `Str` | varint length, UTF-8 bytes |
//! | `0x07` | `Bytes` | varint length, bytes |
//! | `0x08` | `List` | varint count, then that many values |
//! | `0x09` | `Map` | varint count, then that many (key, value) pairs; a key is tag `0x03`, `0x04` or `0x06` with its payload |
//!
//! Any other tag byte is refused. Varints are the same strict LEB128 as the typed format.
//!
//! Decoding is iterative, with an explicit stack bounded by `max_depth`, so it needs the same
//! small amount of machine stack at any nesting depth.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

use super::{Key, Value};
use crate::reader::Reader;
use crate::{DecodeError, Limits};

const TAG_NULL: u8 = 0x00;
const TAG_FALSE: u8 = 0x01;
const TAG_TRUE: u8 = 0x02;
const TAG_I64: u8 = 0x03;
const TAG_U64: u8 = 0x04;
const TAG_F64: u8 = 0x05;
const TAG_STR: u8 = 0x06;
const TAG_BYTES: u8 = 0x07;
const TAG_LIST: u8 = 0x08;
const TAG_MAP: u8 = 0x09;

impl Value {
    /// Encodes this value with the closed-tag encoding. Cannot fail.
    ///
    /// Recursive: a value built by hand thousands of levels deep would use that much stack (and
    /// so would dropping it); values from [`Value::from_slice`] are at most `max_depth` deep.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// Appends this value's encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Value::Null => out.push(TAG_NULL),
            Value::Bool(false) => out.push(TAG_FALSE),
            Value::Bool(true) => out.push(TAG_TRUE),
            Value::I64(v) => {
                out.push(TAG_I64);
                put_varint(out, zigzag(*v));
            }
            Value::U64(v) => {
                out.push(TAG_U64);
                put_varint(out, *v);
            }
            Value::F64(v) => {
                out.push(TAG_F64);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Value::Str(s) => put_bytes(out, TAG_STR, s.as_bytes()),
            Value::Bytes(b) => put_bytes(out, TAG_BYTES, b),
            Value::List(items) => {
                out.push(TAG_LIST);
                put_varint(out, items.len() as u64);
                for item in items {
                    item.encode_into(out);
                }
            }
            Value::Map(map) => {
                out.push(TAG_MAP);
                put_varint(out, map.len() as u64);
                for (key, value) in map {
                    key.encode_into(out);
                    value.encode_into(out);
                }
            }
        }
    }

    /// Decodes one value from the whole of `input` within `limits`.
    ///
    /// Refuses: unknown tags, map keys that are not strings or integers, duplicate map keys,
    /// and everything [`from_slice`](crate::from_slice) refuses (budgets, truncation, invalid
    /// UTF-8, overlong or overflowing varints, trailing bytes). `max_depth` counts lists and
    /// maps; `max_items` counts list elements and map entries over the whole value, a map of
    /// n ≥ 1 entries costing 6n + 23 items for its tree nodes (`PROTOCOL.md` §4).
    ///
    /// Memory: the decoded value holds at most about `max_items` × 32 bytes, plus its strings'
    /// and byte strings' bytes (each no longer than the input that carried it). While a list
    /// grows, it may briefly take up to three times its final size.
    ///
    /// ```
    /// use airlock_codec::{DecodeError, Limits, Value};
    /// assert_eq!(Value::from_slice(&[0x02], &Limits::default()), Ok(Value::Bool(true)));
    /// assert_eq!(Value::from_slice(&[0x0a], &Limits::default()), Err(DecodeError::BadValueTag(0x0a)));
    /// ```
    pub fn from_slice(input: &[u8], limits: &Limits) -> Result<Value, DecodeError> {
        let mut reader = Reader::new(input, limits)?;
        let value = decode(&mut reader)?;
        reader.finish()?;
        Ok(value)
    }
}

impl Key {
    fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Key::I64(v) => {
                out.push(TAG_I64);
                put_varint(out, zigzag(*v));
            }
            Key::U64(v) => {
                out.push(TAG_U64);
                put_varint(out, *v);
            }
            Key::Str(s) => put_bytes(out, TAG_STR, s.as_bytes()),
        }
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(raw: u64) -> i64 {
    ((raw >> 1) as i64) ^ -((raw & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A container being filled while the decoder reads its children.
enum Open {
    List {
        items: Vec<Value>,
        left: usize,
    },
    Map {
        map: BTreeMap<Key, Value>,
        left: usize,
        key: Option<Key>,
    },
}

/// What one tag turned into: a finished value, or a container whose children follow.
enum Step {
    Done(Value),
    Open(Open),
}

fn decode(reader: &mut Reader<'_>) -> Result<Value, DecodeError> {
    let mut stack: Vec<Open> = Vec::new();
    loop {
        // A map awaiting its next key reads a key, not a value.
        if let Some(Open::Map {
            left,
            key: key @ None,
            ..
        }) = stack.last_mut()
        {
            if *left > 0 {
                *key = Some(decode_key(reader)?);
            }
        }
        let mut finished = match stack.last() {
            Some(Open::List { left: 0, .. }) | Some(Open::Map { left: 0, .. }) => {
                reader.leave();
                close(stack.pop())
            }
            _ => match decode_step(reader)? {
                Step::Done(value) => value,
                Step::Open(open) => {
                    stack.push(open);
                    continue;
                }
            },
        };
        // Hand the finished value to its parent, closing parents that are now full.
        loop {
            match stack.last_mut() {
                None => return Ok(finished),
                Some(Open::List { items, left }) => {
                    items.push(finished);
                    *left -= 1;
                }
                Some(Open::Map { map, left, key }) => {
                    let Some(k) = key.take() else {
                        // Unreachable by construction: a map child is read only after its key.
                        return Err(DecodeError::BadKeyTag(TAG_NULL));
                    };
                    if map.insert(k, finished).is_some() {
                        return Err(DecodeError::DuplicateMapKey);
                    }
                    *left -= 1;
                }
            }
            match stack.last() {
                Some(Open::List { left: 0, .. }) | Some(Open::Map { left: 0, .. }) => {
                    reader.leave();
                    finished = close(stack.pop());
                }
                _ => break,
            }
        }
    }
}

fn close(open: Option<Open>) -> Value {
    match open {
        Some(Open::List { mut items, .. }) => {
            // A list grew by doubling from a partial hint (and a `Vec` never grows to fewer
            // than four slots): give the slack back, so the value keeps only its elements.
            items.shrink_to_fit();
            Value::List(items)
        }
        Some(Open::Map { map, .. }) => Value::Map(map),
        None => Value::Null,
    }
}

fn decode_step(reader: &mut Reader<'_>) -> Result<Step, DecodeError> {
    let tag = reader.byte()?;
    let value = match tag {
        TAG_NULL => Value::Null,
        TAG_FALSE => Value::Bool(false),
        TAG_TRUE => Value::Bool(true),
        TAG_I64 => Value::I64(unzigzag(reader.varint_u64()?)),
        TAG_U64 => Value::U64(reader.varint_u64()?),
        TAG_F64 => Value::F64(f64::from_le_bytes(reader.array()?)),
        TAG_STR => Value::Str(String::from(reader.str()?)),
        TAG_BYTES => Value::Bytes(Vec::from(reader.length_prefixed()?)),
        TAG_LIST | TAG_MAP => {
            let count = reader.varint_u64()?;
            let left = reader.reserve_items(count)?;
            if tag == TAG_MAP {
                reader.reserve_items(map_overhead_items(left))?;
            }
            // Enter before allocating anything for the container. Paired with the `leave`
            // when the container closes.
            reader.enter()?;
            let open = if tag == TAG_LIST {
                Open::List {
                    items: Vec::with_capacity(reader.cautious_hint(left)),
                    left,
                }
            } else {
                Open::Map {
                    map: BTreeMap::new(),
                    left,
                    key: None,
                }
            };
            return Ok(Step::Open(open));
        }
        other => return Err(DecodeError::BadValueTag(other)),
    };
    Ok(Step::Done(value))
}

/// Items a non-empty `Value` map is charged for its root node, beyond its entries
/// (`PROTOCOL.md` §4): std's `BTreeMap` allocates a whole node, room for eleven entries, even
/// for one entry, so a five-byte one-entry map would otherwise hold some 700 bytes of memory
/// for one item, and a list of them 130 times their input. Fixed numbers, not computed from
/// this build's layout, so that what is accepted on the wire is the same everywhere; the
/// `map_charges_cover_the_tree_layout` test checks they cover the layout here.
pub(crate) const MAP_ROOT_ITEMS: u64 = 23;
/// Items each entry of a `Value` map is charged beyond its own one: a node other than the root
/// may be as little as five-elevenths full.
pub(crate) const MAP_ENTRY_EXTRA_ITEMS: u64 = 5;

/// What a map of `entries` entries costs beyond one item per entry, so that a decoded `Value`,
/// maps included, holds at most about `max_items` times the size of a `Value`.
fn map_overhead_items(entries: usize) -> u64 {
    if entries == 0 {
        return 0; // an empty BTreeMap allocates nothing
    }
    // Saturating: a count this large is refused by the item budget either way.
    MAP_ROOT_ITEMS.saturating_add(MAP_ENTRY_EXTRA_ITEMS.saturating_mul(entries as u64))
}

fn decode_key(reader: &mut Reader<'_>) -> Result<Key, DecodeError> {
    match reader.byte()? {
        TAG_I64 => Ok(Key::I64(unzigzag(reader.varint_u64()?))),
        TAG_U64 => Ok(Key::U64(reader.varint_u64()?)),
        TAG_STR => Ok(Key::Str(String::from(reader.str()?))),
        other => Err(DecodeError::BadKeyTag(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::{MAP_ENTRY_EXTRA_ITEMS, MAP_ROOT_ITEMS};
    use crate::value::{Key, Value};
    use core::mem::size_of;

    #[test]
    fn map_charges_cover_the_tree_layout() {
        // std's B-tree: nodes hold at most 11 entries (2B - 1, B = 6), and any node but the
        // root at least 5; a leaf is its keys, its values and a 16-byte header.
        let node = 11 * (size_of::<Key>() + size_of::<Value>()) + 16;
        let value = size_of::<Value>();
        assert!(
            node.div_ceil(value) as u64 <= MAP_ROOT_ITEMS,
            "node {node} B"
        );
        assert!(
            (node / 5).div_ceil(value) as u64 <= MAP_ENTRY_EXTRA_ITEMS,
            "node {node} B"
        );
    }
}
