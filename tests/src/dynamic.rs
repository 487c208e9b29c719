//! A [`Value`] as a call body in its own tagged encoding (`PROTOCOL.md` §4), for calling a
//! worker whose methods take and return `Value`s, such as one built on the Python SDK.
//!
//! [`Host::call`](airlock_host::Host::call) encodes a request with the typed encoding of its
//! Rust type. [`DynamicBody`] is a type whose typed encoding *is* the `Value` encoding: each
//! variant is written as an enum variant whose index is the `Value` tag (`Null` 0, `Bool(false)`
//! 1, `Bool(true)` 2, `I64` 3, …, `Map` 9) and whose content is the tag's payload, which the typed
//! encoding writes exactly as §4 does (zigzag and plain varints, eight little-endian bytes,
//! length-prefixed text and bytes, counted lists and maps). The tests below hold it to
//! [`Value::to_vec`] and [`Value::from_slice`].
//!
//! ```
//! use airlock_codec::Value;
//! use airlock_tests::dynamic::DynamicBody;
//! let body = DynamicBody(Value::Str("hi".into()));
//! assert_eq!(airlock_codec::to_vec(&body).unwrap(), body.0.to_vec());
//! ```

use std::collections::BTreeMap;
use std::fmt;

use airlock_codec::{Key, Value};
use serde::de::{self, EnumAccess, MapAccess, VariantAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The `Value` variants by wire tag. The typed encoding writes only a variant's index, so
/// these names never reach the wire; the list's length bounds the tags a decoder accepts.
const TAGS: &[&str] = &[
    "Null", "False", "True", "I64", "U64", "F64", "Str", "Bytes", "List", "Map",
];

const TAG_I64: u32 = 3;
const TAG_U64: u32 = 4;
const TAG_STR: u32 = 6;

/// A [`Value`] whose typed encoding is its `Value` encoding: use it as a [`Method`]'s request
/// and response type to call a worker that speaks `Value` bodies.
///
/// [`Method`]: airlock_protocol::Method
#[derive(Clone, Debug, PartialEq)]
pub struct DynamicBody(pub Value);

impl Serialize for DynamicBody {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ValueRef(&self.0).serialize(serializer)
    }
}

struct ValueRef<'a>(&'a Value);

impl Serialize for ValueRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Null => s.serialize_unit_variant("Value", 0, TAGS[0]),
            Value::Bool(false) => s.serialize_unit_variant("Value", 1, TAGS[1]),
            Value::Bool(true) => s.serialize_unit_variant("Value", 2, TAGS[2]),
            Value::I64(v) => s.serialize_newtype_variant("Value", 3, TAGS[3], v),
            Value::U64(v) => s.serialize_newtype_variant("Value", 4, TAGS[4], v),
            Value::F64(v) => s.serialize_newtype_variant("Value", 5, TAGS[5], v),
            Value::Str(v) => s.serialize_newtype_variant("Value", 6, TAGS[6], v),
            Value::Bytes(v) => {
                s.serialize_newtype_variant("Value", 7, TAGS[7], serde_bytes::Bytes::new(v))
            }
            Value::List(items) => s.serialize_newtype_variant("Value", 8, TAGS[8], &Items(items)),
            Value::Map(map) => s.serialize_newtype_variant("Value", 9, TAGS[9], &Entries(map)),
        }
    }
}

struct Items<'a>(&'a [Value]);

impl Serialize for Items<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&ValueRef(item))?;
        }
        seq.end()
    }
}

struct Entries<'a>(&'a BTreeMap<Key, Value>);

impl Serialize for Entries<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (key, value) in self.0 {
            map.serialize_entry(&KeyRef(key), &ValueRef(value))?;
        }
        map.end()
    }
}

struct KeyRef<'a>(&'a Key);

impl Serialize for KeyRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Key::I64(v) => s.serialize_newtype_variant("Key", TAG_I64, TAGS[3], v),
            Key::U64(v) => s.serialize_newtype_variant("Key", TAG_U64, TAGS[4], v),
            Key::Str(v) => s.serialize_newtype_variant("Key", TAG_STR, TAGS[6], v),
        }
    }
}

impl<'de> Deserialize<'de> for DynamicBody {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_enum("Value", TAGS, ValueVisitor)
            .map(DynamicBody)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Value in its tagged encoding")
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        let (tag, variant): (u32, _) = data.variant()?;
        Ok(match tag {
            0 => variant.unit_variant().map(|()| Value::Null)?,
            1 => variant.unit_variant().map(|()| Value::Bool(false))?,
            2 => variant.unit_variant().map(|()| Value::Bool(true))?,
            3 => Value::I64(variant.newtype_variant()?),
            4 => Value::U64(variant.newtype_variant()?),
            5 => Value::F64(variant.newtype_variant()?),
            6 => Value::Str(variant.newtype_variant()?),
            7 => Value::Bytes(
                variant
                    .newtype_variant::<serde_bytes::ByteBuf>()?
                    .into_vec(),
            ),
            8 => Value::List(
                variant
                    .newtype_variant::<Vec<DynamicBody>>()?
                    .into_iter()
                    .map(|item| item.0)
                    .collect(),
            ),
            9 => Value::Map(variant.newtype_variant::<MapBody>()?.0),
            other => return Err(de::Error::custom(format!("no Value tag {other}"))),
        })
    }
}

/// A map's entries, refused if a key repeats.
struct MapBody(BTreeMap<Key, Value>);

impl<'de> Deserialize<'de> for MapBody {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(MapVisitor)
    }
}

struct MapVisitor;

impl<'de> Visitor<'de> for MapVisitor {
    type Value = MapBody;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Value map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<MapBody, A::Error> {
        let mut map = BTreeMap::new();
        while let Some((KeyBody(key), DynamicBody(value))) = entries.next_entry()? {
            if map.insert(key, value).is_some() {
                return Err(de::Error::custom("a map key appears twice"));
            }
        }
        Ok(MapBody(map))
    }
}

struct KeyBody(Key);

impl<'de> Deserialize<'de> for KeyBody {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_enum("Key", TAGS, KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = KeyBody;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Value map key (I64, U64 or Str)")
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<KeyBody, A::Error> {
        let (tag, variant): (u32, _) = data.variant()?;
        Ok(KeyBody(match tag {
            TAG_I64 => Key::I64(variant.newtype_variant()?),
            TAG_U64 => Key::U64(variant.newtype_variant()?),
            TAG_STR => Key::Str(variant.newtype_variant()?),
            other => return Err(de::Error::custom(format!("no map key tag {other}"))),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_codec::Limits;

    fn every_variant() -> Value {
        Value::Map(BTreeMap::from([
            (Key::I64(-1), Value::Null),
            (Key::U64(2), Value::Bool(true)),
            (
                Key::Str("all".into()),
                Value::List(vec![
                    Value::Bool(false),
                    Value::I64(i64::MIN),
                    Value::U64(u64::MAX),
                    Value::F64(-2.5),
                    Value::Str("é".into()),
                    Value::Bytes(vec![0, 255]),
                    Value::List(vec![]),
                    Value::Map(BTreeMap::new()),
                ]),
            ),
        ]))
    }

    #[test]
    fn the_typed_encoding_of_a_dynamic_body_is_the_values_own_encoding() {
        let value = every_variant();
        let typed = airlock_codec::to_vec(&DynamicBody(value.clone())).unwrap();
        assert_eq!(typed, value.to_vec());
        let back: DynamicBody = airlock_codec::from_slice(&typed, &Limits::default()).unwrap();
        assert_eq!(back.0, value);
    }

    #[test]
    fn a_dynamic_body_refuses_what_the_value_decoder_refuses() {
        for bytes in [
            &[0x0a][..],                                                   // no such tag
            &[0x09, 0x01, 0x00, 0x00],                                     // a Null key
            &[0x09, 0x02, 0x06, 0x01, b'a', 0x00, 0x06, 0x01, b'a', 0x00], // a key twice
            &[0x06, 0x01, 0xff],                                           // not UTF-8
        ] {
            assert!(Value::from_slice(bytes, &Limits::default()).is_err());
            assert!(
                airlock_codec::from_slice::<DynamicBody>(bytes, &Limits::default()).is_err(),
                "{bytes:02x?} decoded"
            );
        }
    }
}
