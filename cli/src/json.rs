//! JSON on the command line ↔ airlock's closed [`Value`] model.
//!
//! JSON → `Value` (a request):
//! - `null`, `true`/`false`, strings and arrays become `Null`, `Bool`, `Str` and `List`.
//! - An object becomes a `Map` with string keys. A key given twice is refused, as the `Value`
//!   encoding refuses it.
//! - An integer becomes `I64` when it fits, `U64` when it is above `i64::MAX` and fits 64 bits.
//!   Any other number becomes `F64`. **Lossy:** JSON has no integer limit, and an integer
//!   beyond `u64::MAX` (or below `i64::MIN`) is read as the nearest `F64`.
//! - **Not expressible:** `Bytes`, `U64` values up to `i64::MAX`, and map keys that are
//!   integers; a method that wants those cannot be given them from JSON.
//!
//! `Value` → JSON (an answer):
//! - `I64`, `U64`, `Bool`, `Str`, `List` and `Null` exactly. Characters that could forge or
//!   hide text on a terminal (C1 controls, DEL, bidi overrides, invisible characters) print
//!   as `\uXXXX` escapes, which JSON reads back as the same characters.
//! - **Lossy:** `Bytes` print as an array of numbers 0–255 (like a `List` of integers);
//!   integer map keys print as strings (like `Str` keys); `F64` NaN and infinities print as
//!   `null`, which JSON has instead; a finite `F64` prints in its shortest exact form.
//!
//! The request's nesting is bounded by serde_json's recursion limit (128); an answer's by the
//! host's decoding budget, so neither direction can exhaust the stack.

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;

use airlock_host::{Key, Value};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// Parses a JSON text into a [`Value`], as the module docs describe.
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<FromJson>(text).map(|parsed| parsed.0)
}

/// `value` as one line of JSON, as the module docs describe, with every character that could
/// forge or hide text on a terminal escaped (see [`escape_unsafe_text`]).
pub fn render(value: &Value) -> String {
    // Serializing a `Value` cannot fail: every map key is a string or an integer, which
    // serde_json's map-key serializer accepts.
    let json = serde_json::to_string(&ToJson(value)).unwrap_or_else(|_| String::from("null"));
    escape_unsafe_text(&json)
}

/// Writes every character of `json` that `airlock_codec::is_unsafe_in_text` refuses (C1
/// controls such as CSI, DEL, bidi overrides, zero-width and other invisible characters) as a
/// `\uXXXX` escape, a surrogate pair above U+FFFF.
///
/// An answer's strings come from the worker, and serde_json escapes only `"`, `\` and
/// U+0000–U+001F: a C1 CSI (U+009B) would reach the terminal as a control sequence, a bidi
/// override would reorder what the user reads. Outside strings JSON holds only ASCII
/// punctuation, digits and literals, so every such character is inside a string, where the
/// escape means the same character: the output stays valid JSON of the same value.
fn escape_unsafe_text(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if airlock_codec::is_unsafe_in_text(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                // Writing to a `String` cannot fail.
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A `Value` read from JSON.
struct FromJson(Value);

impl<'de> Deserialize<'de> for FromJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor).map(FromJson)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::I64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::U64(v), Value::I64))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::F64(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(FromJson(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            let FromJson(value) = map.next_value()?;
            if entries.insert(Key::Str(key), value).is_some() {
                return Err(de::Error::custom("an object has the same key twice"));
            }
        }
        Ok(Value::Map(entries))
    }
}

/// A `Value` written as JSON.
struct ToJson<'a>(&'a Value);

impl Serialize for ToJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Null => serializer.serialize_unit(),
            Value::Bool(v) => serializer.serialize_bool(*v),
            Value::I64(v) => serializer.serialize_i64(*v),
            Value::U64(v) => serializer.serialize_u64(*v),
            Value::F64(v) => serializer.serialize_f64(*v),
            Value::Str(v) => serializer.serialize_str(v),
            Value::Bytes(v) => serializer.serialize_bytes(v),
            Value::List(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&ToJson(item))?;
                }
                seq.end()
            }
            Value::Map(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    match key {
                        Key::I64(k) => map.serialize_key(k)?,
                        Key::U64(k) => map.serialize_key(k)?,
                        Key::Str(k) => map.serialize_key(k)?,
                    }
                    map.serialize_value(&ToJson(value))?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_of_every_kind_becomes_the_matching_value() {
        let value =
            parse(r#"{"n": null, "t": true, "i": -3, "u": 3, "f": 1.5, "s": "x", "l": [[]]}"#)
                .unwrap();
        let expected: BTreeMap<Key, Value> = [
            ("n", Value::Null),
            ("t", Value::Bool(true)),
            ("i", Value::I64(-3)),
            ("u", Value::I64(3)),
            ("f", Value::F64(1.5)),
            ("s", Value::Str("x".into())),
            ("l", Value::List(vec![Value::List(vec![])])),
        ]
        .into_iter()
        .map(|(k, v)| (Key::from(k), v))
        .collect();
        assert_eq!(value, Value::Map(expected));
    }

    #[test]
    fn integers_are_i64_when_they_fit_and_u64_above_it() {
        assert_eq!(parse("9223372036854775807").unwrap(), Value::I64(i64::MAX));
        assert_eq!(parse("9223372036854775808").unwrap(), Value::U64(1 << 63));
        assert_eq!(parse("18446744073709551615").unwrap(), Value::U64(u64::MAX));
        assert_eq!(parse("-9223372036854775808").unwrap(), Value::I64(i64::MIN));
    }

    #[test]
    fn an_integer_beyond_64_bits_is_read_as_the_nearest_float() {
        assert_eq!(
            parse("18446744073709551616").unwrap(),
            Value::F64(18_446_744_073_709_551_616.0)
        );
    }

    #[test]
    fn an_object_with_a_repeated_key_is_refused() {
        let err = parse(r#"{"a": 1, "a": 2}"#).unwrap_err();
        assert!(err.to_string().contains("same key twice"), "{err}");
    }

    #[test]
    fn text_that_is_not_one_json_value_is_refused() {
        assert!(parse("").is_err());
        assert!(parse("[1,").is_err());
        assert!(parse("1 2").is_err());
        assert!(parse("NaN").is_err());
    }

    #[test]
    fn nesting_past_serde_jsons_recursion_limit_is_refused_not_a_stack_overflow() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse(&deep).is_err());
    }

    #[test]
    fn characters_that_forge_or_hide_text_print_escaped_and_read_back_the_same() {
        // CSI as U+009B, DEL, a right-to-left override, a zero-width space, a tag character.
        let hostile = "\u{9b}2J\u{7f}\u{202e}kcatta\u{200b}\u{e0041}";
        let value = Value::Map(
            [(Key::Str(hostile.into()), Value::Str(hostile.into()))]
                .into_iter()
                .collect(),
        );
        let printed = render(&value);
        assert!(
            !printed.chars().any(airlock_codec::is_unsafe_in_text),
            "{printed:?}"
        );
        let escaped = r"\u009b2J\u007f\u202ekcatta\u200b\udb40\udc41";
        assert_eq!(printed, format!(r#"{{"{escaped}":"{escaped}"}}"#));
        assert_eq!(parse(&printed).unwrap(), value);
    }

    #[test]
    fn answers_print_exactly_where_json_can_say_it() {
        let value = Value::List(vec![
            Value::Null,
            Value::Bool(false),
            Value::I64(i64::MIN),
            Value::U64(u64::MAX),
            Value::F64(0.1),
            Value::Str("\"q\"\n".into()),
        ]);
        assert_eq!(
            render(&value),
            r#"[null,false,-9223372036854775808,18446744073709551615,0.1,"\"q\"\n"]"#
        );
        assert_eq!(parse(&render(&value)).unwrap(), value);
    }

    #[test]
    fn the_lossy_edges_print_as_documented() {
        let keys: BTreeMap<Key, Value> = [
            (Key::I64(-1), Value::F64(f64::NAN)),
            (Key::U64(2), Value::F64(f64::INFINITY)),
            (Key::from("b"), Value::Bytes(vec![0, 255])),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            render(&Value::Map(keys)),
            r#"{"-1":null,"2":null,"b":[0,255]}"#
        );
    }
}
