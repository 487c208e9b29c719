//! Dynamic → typed: a serde `Deserializer` over an owned [`Value`].
//!
//! The inverse of [`to_value`](super::to_value)'s mapping. The `Value` was already decoded
//! within budgets. This step gives the target type no size hints (see [`Unsized`]), so its
//! containers grow as elements really convert: it allocates what the typed result holds, never
//! capacity sized from a list's length for a larger element type.

use alloc::string::String;
use serde::de::value::{MapDeserializer, SeqDeserializer, StringDeserializer};
use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};
use serde::forward_to_deserialize_any;

use super::{Key, Value};
use crate::DecodeError;

/// Converts a [`Value`] into any type that deserializes from the conventional mapping (see
/// [`to_value`](crate::to_value)).
///
/// Refuses shape mismatches with [`DecodeError::Custom`] naming what was expected, and enum
/// values that are neither a variant name nor a one-entry map.
///
/// ```
/// use airlock_codec::{from_value, to_value};
/// #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
/// enum Shape { Dot, Circle { r: u32 } }
/// let v = to_value(&Shape::Circle { r: 3 }).unwrap();
/// assert_eq!(from_value::<Shape>(v).unwrap(), Shape::Circle { r: 3 });
/// ```
pub fn from_value<T: DeserializeOwned>(value: Value) -> Result<T, DecodeError> {
    T::deserialize(value)
}

impl<'de> IntoDeserializer<'de, DecodeError> for Value {
    type Deserializer = Value;
    fn into_deserializer(self) -> Value {
        self
    }
}

impl<'de> IntoDeserializer<'de, DecodeError> for Key {
    type Deserializer = Key;
    fn into_deserializer(self) -> Key {
        self
    }
}

impl<'de> de::Deserializer<'de> for Key {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self {
            Key::I64(v) => visitor.visit_i64(v),
            Key::U64(v) => visitor.visit_u64(v),
            Key::Str(s) => visitor.visit_string(s),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

/// An iterator that does not tell its length. serde sizes a `Vec<T>` from the length hint of
/// the elements it converts from, up to 1 MiB per container: a list of 255 small `Value`s
/// would reserve 255 elements of whatever `T` is, at every level of nesting.
struct Unsized<I>(I);

impl<I: Iterator> Iterator for Unsized<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        self.0.next()
    }
}

impl<'de> de::Deserializer<'de> for Value {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self {
            Value::Null => visitor.visit_unit(),
            Value::Bool(v) => visitor.visit_bool(v),
            Value::I64(v) => visitor.visit_i64(v),
            Value::U64(v) => visitor.visit_u64(v),
            Value::F64(v) => visitor.visit_f64(v),
            Value::Str(v) => visitor.visit_string(v),
            Value::Bytes(v) => visitor.visit_byte_buf(v),
            Value::List(items) => {
                let mut seq = SeqDeserializer::new(Unsized(items.into_iter()));
                let out = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(out)
            }
            Value::Map(map) => {
                let mut entries = MapDeserializer::new(Unsized(map.into_iter()));
                let out = visitor.visit_map(&mut entries)?;
                entries.end()?;
                Ok(out)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DecodeError> {
        match self {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(other),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        match self {
            Value::Str(name) => {
                let name: StringDeserializer<DecodeError> = name.into_deserializer();
                visitor.visit_enum(name)
            }
            Value::Map(map) if map.len() == 1 => {
                let mut entries = map.into_iter();
                match entries.next() {
                    Some((Key::Str(name), content)) => {
                        visitor.visit_enum(Variant { name, content })
                    }
                    _ => Err(de::Error::custom("enum variant name must be a string")),
                }
            }
            _ => Err(de::Error::custom(
                "expected an enum: a variant name or a one-entry map",
            )),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

/// A variant given as `{name: content}`.
struct Variant {
    name: String,
    content: Value,
}

impl<'de> de::EnumAccess<'de> for Variant {
    type Error = DecodeError;
    type Variant = Value;

    fn variant_seed<V: de::DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Value), DecodeError> {
        let name: StringDeserializer<DecodeError> = self.name.into_deserializer();
        Ok((seed.deserialize(name)?, self.content))
    }
}

impl<'de> de::VariantAccess<'de> for Value {
    type Error = DecodeError;

    fn unit_variant(self) -> Result<(), DecodeError> {
        match self {
            Value::Null => Ok(()),
            _ => Err(de::Error::custom("unit variant carries no content")),
        }
    }

    fn newtype_variant_seed<T: de::DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, DecodeError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, DecodeError> {
        de::Deserializer::deserialize_seq(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DecodeError> {
        de::Deserializer::deserialize_map(self, visitor)
    }
}
