//! The committed seed corpus: a few valid encodings and a few hostile ones per target.
//!
//! Hostile seeds are made by splicing a valid encoding, so everything before the fault is
//! well-formed and the decoder really reaches the fault the seed is named after.

use std::collections::BTreeMap;

use airlock_codec::{to_vec, DecodeError, Key, Value};
use serde_bytes::ByteBuf;

use crate::message::{Kind, Message, Tree, WireMap};

/// One seed file: `corpus/<target>/seed-<name>`.
#[derive(Debug)]
pub struct Seed {
    /// The file name after `seed-`.
    pub name: &'static str,
    /// The file's contents.
    pub bytes: Vec<u8>,
    /// `None` if the seed must decode; otherwise a test the refusal must pass.
    pub refused_with: Option<fn(&DecodeError) -> bool>,
}

fn valid(name: &'static str, bytes: Vec<u8>) -> Seed {
    Seed {
        name,
        bytes,
        refused_with: None,
    }
}

fn hostile(name: &'static str, bytes: Vec<u8>, refused_with: fn(&DecodeError) -> bool) -> Seed {
    Seed {
        name,
        bytes,
        refused_with: Some(refused_with),
    }
}

/// Replaces the single occurrence of `needle` in `bytes`.
fn splice(bytes: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let at: Vec<usize> = (0..=bytes.len() - needle.len())
        .filter(|&i| bytes[i..].starts_with(needle))
        .collect();
    assert_eq!(
        at.len(),
        1,
        "needle {needle:02x?} must occur once in {bytes:02x?}"
    );
    [&bytes[..at[0]], with, &bytes[at[0] + needle.len()..]].concat()
}

const LEN_BOMB: [u8; 5] = [0xff, 0xff, 0xff, 0xff, 0x0f]; // varint 2^32 - 1

fn small() -> Message {
    Message {
        id: 5,
        small: 0,
        delta: 0,
        wide: 0,
        ratio: 0.0,
        flag: false,
        letter: 'a',
        name: "NAME".into(),
        note: None,
        blob: ByteBuf::new(),
        counts: vec![],
        matrix: vec![],
        pair: (0, None),
        attrs: WireMap(vec![]),
        kind: Kind::Empty,
        tree: Tree::Leaf(0),
        marker: (),
    }
}

fn full() -> Message {
    Message {
        id: u64::MAX,
        small: 200,
        delta: -70_000,
        wide: i128::MIN,
        ratio: f32::NAN,
        flag: true,
        letter: 'é',
        name: "airlock ✓".into(),
        note: Some("NOTE".into()),
        blob: ByteBuf::from(vec![0, 1, 2, 0xff]),
        counts: vec![77, 77, 77],
        matrix: vec![vec![1, -1], vec![], vec![i16::MIN]],
        pair: (65535, Some(true)),
        attrs: WireMap(vec![
            ("b".into(), Some(-1)),
            ("a".into(), None),
            ("b".into(), Some(i64::MAX)),
        ]),
        kind: Kind::Code(987_654),
        tree: Tree::Node(
            Box::new(Tree::Leaf(-1)),
            Box::new(Tree::Branches(vec![Tree::Leaf(1), Tree::Leaf(2)])),
        ),
        marker: (),
    }
}

fn named() -> Message {
    Message {
        kind: Kind::Many(vec![
            Kind::Named {
                label: "x".into(),
                weight: -0.5,
            },
            Kind::Span(1, u64::MAX),
        ]),
        ..small()
    }
}

/// Seeds for the `codec_typed` target.
pub fn typed() -> Vec<Seed> {
    let small = to_vec(&small()).unwrap();
    let full = to_vec(&full()).unwrap();
    let name_field = [&[4u8][..], b"NAME"].concat();
    let tree_leaf = [0u8, 0]; // Tree::Leaf(0), the last bytes of `small`
    assert!(small.ends_with(&tree_leaf));
    let deep_tree = [&small[..small.len() - 2], &[1u8; 1000][..]].concat(); // Node(Node(Node(...
    let mut truncated = full.clone();
    truncated.pop();
    vec![
        valid("small", small.clone()),
        valid("full", full.clone()),
        valid("named", to_vec(&named()).unwrap()),
        hostile(
            "name-length-bomb",
            splice(&small, &name_field, &[&LEN_BOMB[..], b"NAME"].concat()),
            |e| {
                matches!(
                    e,
                    DecodeError::LengthLimit { .. } | DecodeError::UnexpectedEnd { .. }
                )
            },
        ),
        hostile(
            "counts-count-bomb",
            splice(
                &full,
                &[3, 77, 77, 77],
                &[&LEN_BOMB[..], &[77, 77, 77]].concat(),
            ),
            |e| {
                matches!(
                    e,
                    DecodeError::ItemLimit { .. } | DecodeError::UnexpectedEnd { .. }
                )
            },
        ),
        hostile("deep-tree", deep_tree, |e| {
            matches!(e, DecodeError::DepthLimit { .. })
        }),
        hostile(
            "invalid-utf8-name",
            splice(&small, &name_field, &[4, 0xff, 0xfe, 0xc3, 0x28]),
            |e| matches!(e, DecodeError::InvalidUtf8),
        ),
        hostile("trailing-byte", [&small[..], &[0]].concat(), |e| {
            matches!(e, DecodeError::TrailingBytes { count: 1 })
        }),
        hostile(
            "overlong-varint-id",
            [&[0x85, 0x00][..], &small[1..]].concat(),
            |e| matches!(e, DecodeError::OverlongVarint),
        ),
        hostile(
            "overflowing-varint-id",
            [&[0xff; 9][..], &[0x02], &small[1..]].concat(),
            |e| matches!(e, DecodeError::VarintOverflow),
        ),
        hostile(
            "bad-enum-tag",
            splice(&full, &[1, 0x86, 0xa4, 0x3c], &[9, 0x86, 0xa4, 0x3c]),
            |e| matches!(e, DecodeError::BadEnumTag { tag: 9, .. }),
        ),
        hostile(
            "bad-option-tag",
            splice(
                &full,
                &[1, 4, b'N', b'O', b'T', b'E'],
                &[2, 4, b'N', b'O', b'T', b'E'],
            ),
            |e| matches!(e, DecodeError::BadOptionTag(2)),
        ),
        hostile("truncated", truncated, |e| {
            matches!(e, DecodeError::UnexpectedEnd { .. })
        }),
    ]
}

/// Seeds for the `codec_value` target.
pub fn value() -> Vec<Seed> {
    let scalars = Value::List(vec![
        Value::Null,
        Value::Bool(false),
        Value::Bool(true),
        Value::I64(-5),
        Value::U64(300),
        Value::F64(1.5),
        Value::F64(f64::NAN),
        Value::Str("héllo".into()),
        Value::Bytes(vec![0, 1, 2]),
    ]);
    let nested = Value::Map(BTreeMap::from([
        (
            Key::I64(-1),
            Value::List(vec![Value::List(vec![]), Value::Map(BTreeMap::new())]),
        ),
        (Key::U64(1), Value::Str(String::new())),
        (
            Key::from("k"),
            Value::Map(BTreeMap::from([(Key::from("inner"), Value::U64(u64::MAX))])),
        ),
    ]));
    // Valid but not canonical: map entries out of key order (re-encoding sorts them).
    let unsorted = vec![0x09, 0x02, 0x06, 0x01, b'b', 0x00, 0x06, 0x01, b'a', 0x01];
    let deep = [&[0x08, 0x01].repeat(1000)[..], &[0x00]].concat();
    vec![
        valid("scalars", scalars.to_vec()),
        valid("nested", nested.to_vec()),
        valid("unsorted-map", unsorted),
        hostile("list-count-bomb", [&[0x08][..], &LEN_BOMB].concat(), |e| {
            matches!(
                e,
                DecodeError::ItemLimit { .. } | DecodeError::UnexpectedEnd { .. }
            )
        }),
        hostile(
            "str-length-bomb",
            [&[0x06][..], &LEN_BOMB, b"abc"].concat(),
            |e| {
                matches!(
                    e,
                    DecodeError::LengthLimit { .. } | DecodeError::UnexpectedEnd { .. }
                )
            },
        ),
        hostile("deep-lists", deep, |e| {
            matches!(e, DecodeError::DepthLimit { .. })
        }),
        hostile("unknown-tag", vec![0x0a, 0x00], |e| {
            matches!(e, DecodeError::BadValueTag(0x0a))
        }),
        hostile("bad-key-tag", vec![0x09, 0x01, 0x00, 0x00], |e| {
            matches!(e, DecodeError::BadKeyTag(0))
        }),
        hostile(
            "duplicate-key",
            vec![0x09, 0x02, 0x06, 0x01, b'a', 0x00, 0x06, 0x01, b'a', 0x00],
            |e| matches!(e, DecodeError::DuplicateMapKey),
        ),
        hostile("invalid-utf8", vec![0x06, 0x02, 0xc3, 0x28], |e| {
            matches!(e, DecodeError::InvalidUtf8)
        }),
        hostile("overlong-varint", vec![0x04, 0x80, 0x00], |e| {
            matches!(e, DecodeError::OverlongVarint)
        }),
        hostile("trailing-byte", vec![0x00, 0x00], |e| {
            matches!(e, DecodeError::TrailingBytes { count: 1 })
        }),
    ]
}
