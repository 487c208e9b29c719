//! Hostile encodings against the codec: nothing preallocates beyond what the input backs, the
//! item budget covers the whole value, accepted input is canonical, varints are strict, error
//! messages carry no control characters, and no input makes it panic. Each test asserts the
//! safe behaviour; where an attack needs proof that it is live, it first runs on a trusting path.

use airlock_codec::{from_slice, from_value, to_vec, DecodeError, Limits, Value};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

use airlock_test_support::alloc::{peak_allocated, CountingAlloc};
use airlock_test_support::varint;

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

// ---------------------------------------------------------------------------------------------
// Containers open at once share what the remaining input can back: their pre-allocation is
// bounded by the input once, not once per open container.

/// 64 nested list headers, each claiming `count` elements, followed by `pad` bytes of input that
/// no list ever gets to read (the innermost list's first element is a bad tag). Every one of the
/// 64 open lists sizes its `Vec<Value>` from `min(count, remaining)`, and they all see the same
/// remaining bytes, so pre-allocation is depth × remaining × size_of::<Value>().
#[test]
fn value_open_lists_do_not_preallocate_depth_times_the_input() {
    let depth = airlock_codec::DEFAULT_MAX_DEPTH;
    let count = 16_000u64; // 64 × 16,000 = 1,024,000 ≤ DEFAULT_MAX_ITEMS
    let mut bytes = Vec::new();
    for _ in 0..depth {
        bytes.push(0x08);
        bytes.extend(varint::encode(count));
    }
    bytes.extend(std::iter::repeat_n(0xffu8, 16_000));

    let (result, peak) = peak_allocated(|| Value::from_slice(&bytes, &Limits::default()));
    assert_eq!(result, Err(DecodeError::BadValueTag(0xff)));
    // The same generous bound tests/allocation.rs uses for typed nested sequences.
    let bound = 64 * bytes.len();
    assert!(
        peak <= bound,
        "Value::from_slice allocated {peak} bytes ({}x) for a {}-byte input that failed to decode",
        peak / bytes.len(),
        bytes.len()
    );
}

/// A recursive response type: `struct Tree(Vec<Tree>)`. 32 nested `Vec`s are open at once (each
/// level costs two depth units: newtype + seq); each pre-allocates min(count, remaining) slots of
/// 24 bytes (serde caps one Vec's pre-allocation at 1 MiB, not the sum over open Vecs).
#[derive(Deserialize, Serialize, Debug)]
struct Tree(Vec<Tree>);

#[test]
fn typed_open_vecs_do_not_preallocate_depth_times_the_input() {
    let levels = airlock_codec::DEFAULT_MAX_DEPTH / 2; // 32 open Vecs
    let count = 32_000u64; // 32 × 32,000 = 1,024,000 ≤ DEFAULT_MAX_ITEMS
    let mut bytes = Vec::new();
    for _ in 0..levels {
        bytes.extend(varint::encode(count));
    }
    bytes.extend(std::iter::repeat_n(0u8, 32_000));

    let (result, peak) = peak_allocated(|| from_slice::<Tree>(&bytes, &Limits::default()));
    assert!(
        matches!(result, Err(DecodeError::DepthLimit { .. })),
        "{result:?}"
    );
    let bound = 64 * bytes.len();
    assert!(
        peak <= bound,
        "from_slice::<Tree> allocated {peak} bytes ({}x) for a {}-byte input that failed to decode",
        peak / bytes.len(),
        bytes.len()
    );
}

// ---------------------------------------------------------------------------------------------
// An error that quotes the input (`DecodeError::Custom`) carries no control characters from it.

#[derive(Deserialize, Debug, PartialEq)]
enum Shape {
    Dot,
    Circle,
}

#[test]
fn decode_error_messages_carry_no_control_characters_from_the_input() {
    let hostile = "x`\n2026-01-01T00:00:00Z INFO audit: admin login ok\u{202e}";
    let err = from_value::<Shape>(Value::Str(hostile.into())).unwrap_err();
    let text = err.to_string();
    // The attack is live: the input reaches the message.
    assert!(text.contains("admin login ok"), "{text}");
    assert!(
        !text
            .chars()
            .any(|c| c.is_control() || c == '\u{202e}' || c == '\u{2028}'),
        "DecodeError quotes hostile control/bidi characters verbatim: {text:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Typed maps follow the target type (serde: the last duplicate wins); `Value` maps refuse
// duplicates. Documented in the crate docs; pinned here.

#[test]
fn typed_map_duplicate_keys_follow_the_target_type_and_value_refuses_them() {
    use std::collections::BTreeMap;
    // {"k": 1, "k": 2}
    let bytes = [2, 1, b'k', 1, 1, b'k', 2];
    let typed = from_slice::<BTreeMap<String, u8>>(&bytes, &Limits::default()).unwrap();
    assert_eq!(typed, BTreeMap::from([("k".to_string(), 2)]));
    let dynamic = [0x09, 2, 0x06, 1, b'k', 0x04, 1, 0x06, 1, b'k', 0x04, 2];
    assert_eq!(
        airlock_codec::Value::from_slice(&dynamic, &Limits::default()),
        Err(airlock_codec::DecodeError::DuplicateMapKey)
    );
}

// ---------------------------------------------------------------------------------------------
// Other hostile inputs, each refused.

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Tag {
    A,
    B(u16),
    C { x: i32 },
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Canon {
    a: u16,
    b: i16,
    c: u32,
    d: i32,
    e: u64,
    f: i64,
    g: u128,
    h: i128,
    i: char,
    j: String,
    k: Option<bool>,
    l: Vec<u8>,
    m: Tag,
    #[serde(with = "serde_bytes")]
    n: Vec<u8>,
    o: (u8, i8),
    p: f64,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, .. ProptestConfig::default() })]

    /// Canonicity: anything the typed decoder accepts re-encodes to exactly the input. Mutated
    /// encodings (flipped/inserted/removed bytes) probe overlong varints, wide tags, etc.
    #[test]
    fn accepted_typed_input_is_canonical(
        seed in any::<(u16, i16, u32, i32, u64, i64, u128, i128, char)>(),
        j in ".{0,4}", k in any::<Option<bool>>(), l in prop::collection::vec(any::<u8>(), 0..4),
        tag in 0u8..3, p in any::<u64>(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), 0..4),
    ) {
        let (a, b, c, d, e, f, g, h, i) = seed;
        let m = match tag { 0 => Tag::A, 1 => Tag::B(a), _ => Tag::C { x: d } };
        let v = Canon { a, b, c, d, e, f, g, h, i, j, k, l: l.clone(), m, n: l, o: (a as u8, b as i8), p: f64::from_bits(p) };
        let mut bytes = to_vec(&v).unwrap();
        for (at, byte, op) in edits {
            let at = if bytes.is_empty() { 0 } else { at % bytes.len() };
            match op {
                0 if !bytes.is_empty() => bytes[at] = byte,
                1 => bytes.insert(at, byte),
                _ if !bytes.is_empty() => { bytes.remove(at); }
                _ => {}
            }
        }
        if let Ok(decoded) = from_slice::<Canon>(&bytes, &Limits::default()) {
            prop_assert_eq!(to_vec(&decoded).unwrap(), bytes);
        }
    }

    /// Value: no panics on arbitrary bytes under tight budgets.
    #[test]
    fn arbitrary_bytes_never_panic_value(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let _ = Value::from_slice(&bytes, &Limits::default().max_depth(8).max_items(64));
    }
}

#[test]
fn varint_edges_are_strict() {
    let l = Limits::default();
    // u16: 0xffff ok, 0x1_0000 overflow, overlong zero group refused.
    assert_eq!(from_slice::<u16>(&[0xff, 0xff, 0x03], &l), Ok(u16::MAX));
    assert_eq!(
        from_slice::<u16>(&[0x80, 0x80, 0x04], &l),
        Err(DecodeError::VarintOverflow)
    );
    assert_eq!(
        from_slice::<u16>(&[0x81, 0x00], &l),
        Err(DecodeError::OverlongVarint)
    );
    // u32 / u64 at their last group.
    assert_eq!(
        from_slice::<u32>(&[0xff, 0xff, 0xff, 0xff, 0x0f], &l),
        Ok(u32::MAX)
    );
    assert_eq!(
        from_slice::<u32>(&[0xff, 0xff, 0xff, 0xff, 0x1f], &l),
        Err(DecodeError::VarintOverflow)
    );
    let mut max64 = vec![0xffu8; 9];
    max64.push(0x01);
    assert_eq!(from_slice::<u64>(&max64, &l), Ok(u64::MAX));
    *max64.last_mut().unwrap() = 0x02;
    assert_eq!(
        from_slice::<u64>(&max64, &l),
        Err(DecodeError::VarintOverflow)
    );
    // u128 / i128 extremes round-trip; one bit more overflows; zero group is overlong.
    for v in [0u128, 1, u64::MAX as u128 + 1, u128::MAX] {
        assert_eq!(from_slice::<u128>(&to_vec(&v).unwrap(), &l), Ok(v));
    }
    for v in [i128::MIN, -1, 0, i128::MAX] {
        assert_eq!(from_slice::<i128>(&to_vec(&v).unwrap(), &l), Ok(v));
    }
    let mut max128 = to_vec(&u128::MAX).unwrap();
    *max128.last_mut().unwrap() = 0x04;
    assert_eq!(
        from_slice::<u128>(&max128, &l),
        Err(DecodeError::VarintOverflow)
    );
    assert_eq!(
        from_slice::<u128>(&[0x80, 0x00], &l),
        Err(DecodeError::OverlongVarint)
    );
    // Enum tag == variant count, and a tag beyond u32.
    assert!(matches!(
        from_slice::<Tag>(&[3], &l),
        Err(DecodeError::BadEnumTag {
            tag: 3,
            variants: 3
        })
    ));
    assert_eq!(
        from_slice::<Tag>(&[0xff, 0xff, 0xff, 0xff, 0x1f], &l),
        Err(DecodeError::VarintOverflow)
    );
    // char: two scalars, surrogate bytes, empty.
    assert_eq!(
        from_slice::<char>(&[2, b'a', b'b'], &l),
        Err(DecodeError::InvalidChar)
    );
    assert_eq!(
        from_slice::<char>(&[3, 0xed, 0xa0, 0x80], &l),
        Err(DecodeError::InvalidUtf8)
    );
    assert_eq!(from_slice::<char>(&[0], &l), Err(DecodeError::InvalidChar));
    // Vec<()> with a huge count only costs item budget, refused up front.
    assert!(matches!(
        from_slice::<Vec<()>>(&varint::encode(DEFAULT_ITEMS_PLUS_ONE), &l),
        Err(DecodeError::ItemLimit { .. })
    ));
}

const DEFAULT_ITEMS_PLUS_ONE: u64 = airlock_codec::DEFAULT_MAX_ITEMS as u64 + 1;

#[test]
fn items_budget_is_whole_value_and_deserialize_any_is_refused() {
    let l = Limits::default().max_items(10);
    // 2 lists of 5 unit elements = 10 items + 2 for the outer list = 12 > 10.
    let bytes = [2, 5, 5];
    assert!(matches!(
        from_slice::<Vec<Vec<()>>>(&bytes, &l),
        Err(DecodeError::ItemLimit { max: 10 })
    ));
    // Untagged enums need deserialize_any: refused, nothing guessed from the input.
    #[derive(Deserialize, Debug)]
    #[serde(untagged)]
    #[allow(dead_code)]
    enum Either {
        A(u8),
        B(String),
    }
    assert_eq!(
        from_slice::<Either>(&[1], &Limits::default()).unwrap_err(),
        DecodeError::SelfDescribingUnsupported
    );
}
