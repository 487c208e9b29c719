//! Property tests: round trips in both encodings, and that no byte string makes a decoder panic.

use std::collections::BTreeMap;

use airlock_codec::{
    append_to_vec, from_slice, from_value, to_extend, to_value, to_vec, Key, Limits, Value,
};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Kind {
    Plain,
    Tagged(u16),
    Pair(i64, String),
    Named { flag: bool, score: Option<i32> },
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Record {
    id: u64,
    delta: i64,
    small: i8,
    name: String,
    tags: Vec<String>,
    kinds: Vec<Kind>,
    extra: Option<Box<Record>>,
    blob: serde_bytes::ByteBuf,
    table: BTreeMap<String, u32>,
    wide: u128,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Plain),
        any::<u16>().prop_map(Kind::Tagged),
        (any::<i64>(), ".{0,8}").prop_map(|(a, b)| Kind::Pair(a, b)),
        (any::<bool>(), any::<Option<i32>>()).prop_map(|(flag, score)| Kind::Named { flag, score }),
    ]
}

fn record() -> impl Strategy<Value = Record> {
    let leaf = (
        any::<u64>(),
        any::<i64>(),
        any::<i8>(),
        ".{0,16}",
        prop::collection::vec(".{0,6}", 0..4),
        prop::collection::vec(kind(), 0..4),
        prop::collection::vec(any::<u8>(), 0..32),
        prop::collection::btree_map(".{0,4}", any::<u32>(), 0..4),
        any::<u128>(),
    )
        .prop_map(
            |(id, delta, small, name, tags, kinds, blob, table, wide)| Record {
                id,
                delta,
                small,
                name,
                tags,
                kinds,
                extra: None,
                blob: serde_bytes::ByteBuf::from(blob),
                table,
                wide,
            },
        );
    leaf.prop_recursive(3, 8, 1, |inner| {
        (inner.clone(), inner).prop_map(|(mut outer, nested)| {
            outer.extra = Some(Box::new(nested));
            outer
        })
    })
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        any::<i64>().prop_map(Key::I64),
        any::<u64>().prop_map(Key::U64),
        ".{0,8}".prop_map(Key::Str),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::I64),
        any::<u64>().prop_map(Value::U64),
        // NaN never equals itself; bit-exactness of NaN is pinned by `value_f64_is_bit_exact`.
        any::<f64>()
            .prop_filter("not NaN", |f| !f.is_nan())
            .prop_map(Value::F64),
        ".{0,12}".prop_map(Value::Str),
        prop::collection::vec(any::<u8>(), 0..16).prop_map(Value::Bytes),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::List),
            prop::collection::btree_map(key(), inner, 0..8).prop_map(Value::Map),
        ]
    })
}

/// Clamps every `wide` field to 64 bits; true if any was wider.
fn narrow_to_64_bits(r: &mut Record) -> bool {
    let wide = r.wide > u128::from(u64::MAX);
    r.wide %= 1 << 64;
    let nested = r.extra.as_deref_mut().is_some_and(narrow_to_64_bits);
    wide || nested
}

impl Record {
    /// A copy whose outermost `wide` is beyond 64 bits.
    fn clone_wide(&self) -> Record {
        Record {
            wide: u128::MAX,
            ..self.clone()
        }
    }
}

fn tight() -> Limits {
    Limits::default()
        .max_bytes(4096)
        .max_depth(8)
        .max_items(256)
        .max_len(64)
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn typed_round_trip(r in record()) {
        let bytes = to_vec(&r).unwrap();
        prop_assert_eq!(from_slice::<Record>(&bytes, &Limits::default()).unwrap(), r);
    }

    /// The three ways to encode into a buffer write the same bytes: `to_vec` and
    /// `append_to_vec` (whole-slice copies) are postcard's own encoding, as `to_extend` is.
    #[test]
    fn every_encoder_writes_postcards_bytes(r in record(), before in proptest::collection::vec(any::<u8>(), 0..8)) {
        let postcard = to_extend(&r, before.clone()).unwrap();
        prop_assert_eq!(&append_to_vec(&r, before.clone()).unwrap(), &postcard);
        prop_assert_eq!(&to_vec(&r).unwrap(), &postcard[before.len()..]);
    }

    #[test]
    fn typed_through_value_round_trip(mut r in record()) {
        // The dynamic model is 64-bit: a wider u128 is refused, not truncated.
        if narrow_to_64_bits(&mut r) {
            prop_assert_eq!(to_value(&r.clone_wide()), Err(airlock_codec::EncodeError::IntegerOutOfRange));
        }
        let v = to_value(&r).unwrap();
        let bytes = v.to_vec();
        let back = Value::from_slice(&bytes, &Limits::default()).unwrap();
        prop_assert_eq!(&back, &v);
        prop_assert_eq!(from_value::<Record>(back).unwrap(), r);
    }

    #[test]
    fn value_round_trip(v in value()) {
        let bytes = v.to_vec();
        prop_assert_eq!(Value::from_slice(&bytes, &Limits::default()).unwrap(), v);
    }

    #[test]
    fn arbitrary_bytes_never_panic_typed(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = from_slice::<Record>(&bytes, &tight());
        let _ = from_slice::<Vec<Kind>>(&bytes, &tight());
        let _ = from_slice::<(String, Option<u64>, char, f32)>(&bytes, &tight());
    }

    #[test]
    fn arbitrary_bytes_never_panic_value(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(v) = Value::from_slice(&bytes, &tight()) {
            // Whatever decodes is canonical enough to re-encode and decode to the same value.
            let again = Value::from_slice(&v.to_vec(), &Limits::default()).unwrap();
            prop_assert_eq!(again.to_vec(), v.to_vec());
        }
    }

    #[test]
    fn mutated_valid_encodings_never_panic(r in record(), flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let mut bytes = to_vec(&r).unwrap();
        for (at, byte) in flips {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        let _ = from_slice::<Record>(&bytes, &tight());
        let _ = from_slice::<Record>(&bytes, &Limits::default());
    }
}

#[test]
fn value_f64_is_bit_exact() {
    let nan = f64::from_bits(0x7ff8_dead_beef_0001);
    let bytes = Value::F64(nan).to_vec();
    match Value::from_slice(&bytes, &Limits::default()).unwrap() {
        Value::F64(back) => assert_eq!(back.to_bits(), nan.to_bits()),
        other => panic!("expected F64, got {other:?}"),
    }
}
