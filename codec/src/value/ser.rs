//! Typed → dynamic: a serde `Serializer` that builds a [`Value`].
//!
//! The mapping is the conventional one (as in serde_json): structs become maps keyed by field
//! name, unit variants become their name as a string, other variants a one-entry map
//! `{name: content}`, `None` and `()` become `Null`, `Some(x)` becomes `x`.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde::ser::{self, Serialize};

use super::{Key, Value};
use crate::EncodeError;

/// Converts any serializable value to a [`Value`].
///
/// Refuses map keys that are not strings or integers ([`EncodeError::UnsupportedMapKey`]) and
/// 128-bit integers beyond 64 bits ([`EncodeError::IntegerOutOfRange`]). Note the conventional
/// ambiguity: `Some(None)` and `None` both become `Null`.
///
/// ```
/// #[derive(serde::Serialize)]
/// struct Point { x: i32, y: i32 }
/// let v = airlock_codec::to_value(&Point { x: 1, y: -2 }).unwrap();
/// assert_eq!(v.to_vec(), [0x09, 0x02, 0x06, 0x01, b'x', 0x03, 0x02, 0x06, 0x01, b'y', 0x03, 0x03]);
/// ```
pub fn to_value<T: Serialize + ?Sized>(value: &T) -> Result<Value, EncodeError> {
    value.serialize(ValueSerializer)
}

struct ValueSerializer;

fn variant_map(variant: &'static str, content: Value) -> Value {
    let mut map = BTreeMap::new();
    map.insert(Key::Str(variant.into()), content);
    Value::Map(map)
}

impl ser::Serializer for ValueSerializer {
    type Ok = Value;
    type Error = EncodeError;
    type SerializeSeq = ListBuilder;
    type SerializeTuple = ListBuilder;
    type SerializeTupleStruct = ListBuilder;
    type SerializeTupleVariant = ListBuilder;
    type SerializeMap = MapBuilder;
    type SerializeStruct = MapBuilder;
    type SerializeStructVariant = MapBuilder;

    fn serialize_bool(self, v: bool) -> Result<Value, EncodeError> {
        Ok(Value::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Value, EncodeError> {
        Ok(Value::I64(v.into()))
    }
    fn serialize_i16(self, v: i16) -> Result<Value, EncodeError> {
        Ok(Value::I64(v.into()))
    }
    fn serialize_i32(self, v: i32) -> Result<Value, EncodeError> {
        Ok(Value::I64(v.into()))
    }
    fn serialize_i64(self, v: i64) -> Result<Value, EncodeError> {
        Ok(Value::I64(v))
    }
    fn serialize_i128(self, v: i128) -> Result<Value, EncodeError> {
        i64::try_from(v)
            .map(Value::I64)
            .map_err(|_| EncodeError::IntegerOutOfRange)
    }
    fn serialize_u8(self, v: u8) -> Result<Value, EncodeError> {
        Ok(Value::U64(v.into()))
    }
    fn serialize_u16(self, v: u16) -> Result<Value, EncodeError> {
        Ok(Value::U64(v.into()))
    }
    fn serialize_u32(self, v: u32) -> Result<Value, EncodeError> {
        Ok(Value::U64(v.into()))
    }
    fn serialize_u64(self, v: u64) -> Result<Value, EncodeError> {
        Ok(Value::U64(v))
    }
    fn serialize_u128(self, v: u128) -> Result<Value, EncodeError> {
        u64::try_from(v)
            .map(Value::U64)
            .map_err(|_| EncodeError::IntegerOutOfRange)
    }
    fn serialize_f32(self, v: f32) -> Result<Value, EncodeError> {
        Ok(Value::F64(v.into()))
    }
    fn serialize_f64(self, v: f64) -> Result<Value, EncodeError> {
        Ok(Value::F64(v))
    }
    fn serialize_char(self, v: char) -> Result<Value, EncodeError> {
        Ok(Value::Str(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Value, EncodeError> {
        Ok(Value::Str(v.into()))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Value, EncodeError> {
        Ok(Value::Bytes(v.into()))
    }
    fn serialize_none(self) -> Result<Value, EncodeError> {
        Ok(Value::Null)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Value, EncodeError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Value, EncodeError> {
        Ok(Value::Null)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Value, EncodeError> {
        Ok(Value::Null)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<Value, EncodeError> {
        Ok(Value::Str(variant.into()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Value, EncodeError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Value, EncodeError> {
        Ok(variant_map(variant, value.serialize(self)?))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<ListBuilder, EncodeError> {
        Ok(ListBuilder::new(len.unwrap_or(0), None))
    }
    fn serialize_tuple(self, len: usize) -> Result<ListBuilder, EncodeError> {
        Ok(ListBuilder::new(len, None))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        len: usize,
    ) -> Result<ListBuilder, EncodeError> {
        Ok(ListBuilder::new(len, None))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<ListBuilder, EncodeError> {
        Ok(ListBuilder::new(len, Some(variant)))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<MapBuilder, EncodeError> {
        Ok(MapBuilder::new(None))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<MapBuilder, EncodeError> {
        Ok(MapBuilder::new(None))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<MapBuilder, EncodeError> {
        Ok(MapBuilder::new(Some(variant)))
    }
}

/// Collects a sequence, tuple or tuple variant.
struct ListBuilder {
    items: Vec<Value>,
    variant: Option<&'static str>,
}

impl ListBuilder {
    fn new(len: usize, variant: Option<&'static str>) -> Self {
        // `len` comes from the caller's own data, but cap the hint anyway: it is only a hint.
        Self {
            items: Vec::with_capacity(len.min(4096)),
            variant,
        }
    }

    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.items.push(value.serialize(ValueSerializer)?);
        Ok(())
    }

    fn finish(self) -> Result<Value, EncodeError> {
        let list = Value::List(self.items);
        Ok(match self.variant {
            Some(variant) => variant_map(variant, list),
            None => list,
        })
    }
}

impl ser::SerializeSeq for ListBuilder {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.push(value)
    }
    fn end(self) -> Result<Value, EncodeError> {
        self.finish()
    }
}

impl ser::SerializeTuple for ListBuilder {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.push(value)
    }
    fn end(self) -> Result<Value, EncodeError> {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for ListBuilder {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.push(value)
    }
    fn end(self) -> Result<Value, EncodeError> {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for ListBuilder {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        self.push(value)
    }
    fn end(self) -> Result<Value, EncodeError> {
        self.finish()
    }
}

/// Collects a map, struct or struct variant.
struct MapBuilder {
    map: BTreeMap<Key, Value>,
    next_key: Option<Key>,
    variant: Option<&'static str>,
}

impl MapBuilder {
    fn new(variant: Option<&'static str>) -> Self {
        Self {
            map: BTreeMap::new(),
            next_key: None,
            variant,
        }
    }

    fn finish(self) -> Result<Value, EncodeError> {
        let map = Value::Map(self.map);
        Ok(match self.variant {
            Some(variant) => variant_map(variant, map),
            None => map,
        })
    }
}

impl ser::SerializeMap for MapBuilder {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), EncodeError> {
        self.next_key = Some(match key.serialize(ValueSerializer)? {
            Value::Str(s) => Key::Str(s),
            Value::I64(v) => Key::I64(v),
            Value::U64(v) => Key::U64(v),
            _ => return Err(EncodeError::UnsupportedMapKey),
        });
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        let key = self.next_key.take().ok_or(EncodeError::UnsupportedMapKey)?;
        self.map.insert(key, value.serialize(ValueSerializer)?);
        Ok(())
    }
    fn end(self) -> Result<Value, EncodeError> {
        self.finish()
    }
}

impl ser::SerializeStruct for MapBuilder {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), EncodeError> {
        self.map.insert(
            Key::Str(String::from(name)),
            value.serialize(ValueSerializer)?,
        );
        Ok(())
    }
    fn end(self) -> Result<Value, EncodeError> {
        self.finish()
    }
}

impl ser::SerializeStructVariant for MapBuilder {
    type Ok = Value;
    type Error = EncodeError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), EncodeError> {
        ser::SerializeStruct::serialize_field(self, name, value)
    }
    fn end(self) -> Result<Value, EncodeError> {
        self.finish()
    }
}
