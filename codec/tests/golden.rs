//! Golden vectors: the exact bytes of the wire formats. `PROTOCOL.md` quotes these tables; if a
//! test here fails, the wire format changed and the spec (and every peer) must change with it.

use std::collections::BTreeMap;

use airlock_codec::{from_slice, to_value, to_vec, Key, Limits, Value};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Meters(u32);

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Marker;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Point {
    x: i32,
    y: i32,
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Shape {
    Dot,
    Circle(u32),
    Line(Point, Point),
    Rect { w: u16, h: u16 },
}

/// Checks `value` encodes to exactly `bytes` and that `bytes` decodes back to `value`.
fn typed<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: T, bytes: &[u8]) {
    assert_eq!(to_vec(&value).unwrap(), bytes, "encoding of {value:?}");
    assert_eq!(
        postcard::to_allocvec(&value).unwrap(),
        bytes,
        "postcard's encoding of {value:?}"
    );
    assert_eq!(
        from_slice::<T>(bytes, &Limits::default()).unwrap(),
        value,
        "decoding {bytes:02x?}"
    );
}

#[test]
fn typed_golden_vectors() {
    typed(false, &[0x00]);
    typed(true, &[0x01]);
    typed(0u8, &[0x00]);
    typed(255u8, &[0xff]);
    typed(-1i8, &[0xff]);
    typed(127u32, &[0x7f]);
    typed(128u32, &[0x80, 0x01]);
    typed(300u32, &[0xac, 0x02]);
    typed(u16::MAX, &[0xff, 0xff, 0x03]);
    typed(u32::MAX, &[0xff, 0xff, 0xff, 0xff, 0x0f]);
    typed(
        u64::MAX,
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    );
    typed(0i32, &[0x00]);
    typed(-1i32, &[0x01]);
    typed(1i32, &[0x02]);
    typed(-64i64, &[0x7f]);
    typed(64i64, &[0x80, 0x01]);
    typed(
        i64::MIN,
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    );
    typed(-2i16, &[0x03]);
    typed(i16::MIN, &[0xff, 0xff, 0x03]);
    typed(i16::MAX, &[0xfe, 0xff, 0x03]);
    // 128-bit integers have their own decoder path (`varint_u128`): 19 bytes at most.
    typed(0u128, &[0x00]);
    typed(
        1u128 << 64,
        &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02],
    );
    let mut max128 = vec![0xff; 18];
    max128.push(0x03);
    typed(u128::MAX, &max128);
    typed(-1i128, &[0x01]);
    typed(i128::MIN, &max128);
    max128[0] = 0xfe;
    typed(i128::MAX, &max128);
    typed(1.0f32, &[0x00, 0x00, 0x80, 0x3f]);
    typed(-2.5f64, &[0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0xc0]);
    typed('é', &[0x02, 0xc3, 0xa9]);
    typed(String::from("hi"), &[0x02, b'h', b'i']);
    typed(String::new(), &[0x00]);
    typed(
        serde_bytes::ByteBuf::from(vec![1, 2, 3]),
        &[0x03, 0x01, 0x02, 0x03],
    );
    typed(None::<u8>, &[0x00]);
    typed(Some(5u8), &[0x01, 0x05]);
    typed((), &[]);
    typed(vec![1u16, 2, 3], &[0x03, 0x01, 0x02, 0x03]);
    typed((1u8, 2u16, "a".to_string()), &[0x01, 0x02, 0x01, b'a']);
    typed([1u8, 2, 3], &[0x01, 0x02, 0x03]);
    typed([300u16, 1], &[0xac, 0x02, 0x01]);
    typed([[1u8; 2]; 2], &[0x01, 0x01, 0x01, 0x01]);
    typed(Point { x: 1, y: -1 }, &[0x02, 0x01]);
    typed(Meters(300), &[0xac, 0x02]);
    typed(Marker, &[]);
    typed(Shape::Dot, &[0x00]);
    typed(Shape::Circle(7), &[0x01, 0x07]);
    typed(
        Shape::Line(Point { x: 0, y: 1 }, Point { x: 2, y: 3 }),
        &[0x02, 0x00, 0x02, 0x04, 0x06],
    );
    typed(Shape::Rect { w: 2, h: 300 }, &[0x03, 0x02, 0xac, 0x02]);
    typed(
        BTreeMap::from([(1u8, true), (2u8, false)]),
        &[0x02, 0x01, 0x01, 0x02, 0x00],
    );
}

/// Checks `value` encodes to exactly `bytes` and that `bytes` decodes back to `value`.
fn dynamic(value: Value, bytes: &[u8]) {
    assert_eq!(value.to_vec(), bytes, "encoding of {value:?}");
    assert_eq!(
        Value::from_slice(bytes, &Limits::default()).unwrap(),
        value,
        "decoding {bytes:02x?}"
    );
}

#[test]
fn value_golden_vectors() {
    dynamic(Value::Null, &[0x00]);
    dynamic(Value::Bool(false), &[0x01]);
    dynamic(Value::Bool(true), &[0x02]);
    dynamic(Value::I64(0), &[0x03, 0x00]);
    dynamic(Value::I64(-1), &[0x03, 0x01]);
    dynamic(Value::I64(1), &[0x03, 0x02]);
    dynamic(
        Value::I64(i64::MIN),
        &[
            0x03, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ],
    );
    dynamic(Value::U64(300), &[0x04, 0xac, 0x02]);
    dynamic(
        Value::F64(1.0),
        &[0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf0, 0x3f],
    );
    dynamic(Value::Str("hi".into()), &[0x06, 0x02, b'h', b'i']);
    dynamic(Value::Bytes(vec![0xde, 0xad]), &[0x07, 0x02, 0xde, 0xad]);
    dynamic(Value::List(vec![]), &[0x08, 0x00]);
    dynamic(
        Value::List(vec![Value::Null, Value::U64(1)]),
        &[0x08, 0x02, 0x00, 0x04, 0x01],
    );
    dynamic(Value::Map(BTreeMap::new()), &[0x09, 0x00]);
    // Keys are encoded in `Key` order: signed, unsigned, then strings.
    dynamic(
        Value::Map(BTreeMap::from([
            (Key::Str("a".into()), Value::Bool(true)),
            (Key::U64(2), Value::Null),
            (Key::I64(-1), Value::Null),
        ])),
        &[
            0x09, 0x03, 0x03, 0x01, 0x00, 0x04, 0x02, 0x00, 0x06, 0x01, b'a', 0x02,
        ],
    );
}

#[test]
fn typed_to_value_golden_mapping() {
    let v = to_value(&Shape::Rect { w: 2, h: 3 }).unwrap();
    assert_eq!(
        v.to_vec(),
        [
            0x09, 0x01, 0x06, 0x04, b'R', b'e', b'c', b't', 0x09, 0x02, 0x06, 0x01, b'h', 0x04,
            0x03, 0x06, 0x01, b'w', 0x04, 0x02
        ]
    );
    assert_eq!(to_value(&Shape::Dot).unwrap(), Value::Str("Dot".into()));
    assert_eq!(to_value(&Some(())).unwrap(), Value::Null);
}
