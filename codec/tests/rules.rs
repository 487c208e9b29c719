//! One test per decoding rule. Each first shows that its input is hostile — a plain decoder
//! accepts it, does unbounded work on it, or the bytes really break the rule — and then that
//! airlock's decoder refuses it with the specific error.

use airlock_codec::{from_slice, to_vec, DecodeError, Key, Limits, Value};
use serde::{Deserialize, Serialize};

use airlock_test_support::alloc::{peak_allocated, CountingAlloc};
use airlock_test_support::varint;

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

// Trusting decoders, written the way hand-rolled parsers commonly are (their varints read with
// `varint::read_unchecked`), so each rule's test can show what its hostile bytes do when nothing
// checks them.

/// Reads a string by reserving the length its prefix claims, then copying what follows.
fn naive_string(bytes: &[u8]) -> Option<String> {
    let (len, rest) = varint::read_unchecked(bytes)?;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(rest.get(..len as usize)?);
    String::from_utf8(out).ok()
}

/// Any non-zero byte is `true`.
fn naive_bool(byte: u8) -> bool {
    byte != 0
}

/// Any non-zero tag is `Some`.
fn naive_option_u8(bytes: &[u8]) -> Option<Option<u8>> {
    match bytes {
        [0] => Some(None),
        [_, value] => Some(Some(*value)),
        _ => None,
    }
}

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Colour {
    Red,
    Green,
    Blue,
}

#[test]
fn input_over_max_bytes_is_refused_unread() {
    let bytes = to_vec(&vec![7u8; 100]).unwrap();
    // Hostile only by size: a plain decoder reads it all.
    assert_eq!(postcard::from_bytes::<Vec<u8>>(&bytes).unwrap().len(), 100);
    let limits = Limits::default().max_bytes(50);
    assert_eq!(
        from_slice::<Vec<u8>>(&bytes, &limits),
        Err(DecodeError::InputTooLong { len: 101, max: 50 })
    );
}

#[test]
fn string_over_max_len_is_refused() {
    let bytes = to_vec("a string of thirty-two bytes....").unwrap();
    assert_eq!(postcard::from_bytes::<String>(&bytes).unwrap().len(), 32);
    let limits = Limits::default().max_len(31);
    assert_eq!(
        from_slice::<String>(&bytes, &limits),
        Err(DecodeError::LengthLimit { len: 32, max: 31 })
    );
    // The same budget applies to byte strings and to borrowed strings.
    let raw = to_vec(&serde_bytes::Bytes::new(&[0u8; 32])).unwrap();
    assert_eq!(
        from_slice::<&serde_bytes::Bytes>(&raw, &limits),
        Err(DecodeError::LengthLimit { len: 32, max: 31 })
    );
    assert_eq!(
        from_slice::<&str>(&bytes, &limits.max_len(32))
            .unwrap()
            .len(),
        32
    );
}

#[test]
fn string_length_prefix_beyond_input_is_refused() {
    // The attack is live: an 8 MiB string (under `max_len`) claimed in five bytes makes a
    // decoder that trusts the prefix reserve 8 MiB before it finds one byte behind it.
    let mut claim = varint::encode(1 << 23);
    claim.push(b'x');
    let (naive, naive_peak) = peak_allocated(|| naive_string(&claim));
    assert_eq!(naive, None);
    assert!(naive_peak >= 1 << 23, "reserved {naive_peak} bytes");
    // airlock refuses the same bytes without allocating.
    let (ours, our_peak) = peak_allocated(|| from_slice::<String>(&claim, &Limits::default()));
    assert_eq!(
        ours,
        Err(DecodeError::UnexpectedEnd {
            needed: 1 << 23,
            remaining: 1
        })
    );
    assert_eq!(our_peak, 0);

    // Claims a 1 TiB string in six bytes (too large to demonstrate: the naive reservation would
    // abort the test process).
    let mut bomb = varint::encode(1 << 40);
    bomb.push(b'x');
    assert_eq!(
        from_slice::<String>(&bomb, &Limits::default().max_len(usize::MAX)),
        Err(DecodeError::UnexpectedEnd {
            needed: 1 << 40,
            remaining: 1
        })
    );
    assert!(matches!(
        from_slice::<String>(&bomb, &Limits::default()),
        Err(DecodeError::LengthLimit { len, .. }) if len == 1 << 40
    ));
}

#[test]
fn item_budget_counts_zero_sized_elements() {
    // Ten million unit elements cost the sender three bytes; a plain decoder does ten million
    // steps of work for them.
    let bomb = varint::encode(10_000_000);
    assert_eq!(bomb.len(), 4);
    assert_eq!(
        postcard::from_bytes::<Vec<()>>(&bomb).unwrap().len(),
        10_000_000
    );
    assert_eq!(
        from_slice::<Vec<()>>(&bomb, &Limits::default()),
        Err(DecodeError::ItemLimit { max: 1024 * 1024 })
    );
    // Just under the budget is fine.
    let ok = varint::encode(1000);
    let limits = Limits::default().max_items(1000);
    assert_eq!(from_slice::<Vec<()>>(&ok, &limits).unwrap().len(), 1000);
    assert_eq!(
        from_slice::<Vec<()>>(&varint::encode(1001), &limits),
        Err(DecodeError::ItemLimit { max: 1000 })
    );
}

#[test]
fn item_budget_is_shared_across_the_whole_value() {
    // Two lists of 600 units each: each fits a 1000-item budget alone, together they do not.
    let value = vec![vec![(); 600], vec![(); 600]];
    let bytes = to_vec(&value).unwrap();
    let limits = Limits::default().max_items(1000);
    assert_eq!(
        from_slice::<Vec<Vec<()>>>(&to_vec(&vec![vec![(); 600]]).unwrap(), &limits)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        from_slice::<Vec<Vec<()>>>(&bytes, &limits),
        Err(DecodeError::ItemLimit { max: 1000 })
    );
}

#[test]
fn map_entries_count_against_the_item_budget() {
    use std::collections::BTreeMap;
    let map: BTreeMap<u8, ()> = (0..20).map(|k| (k, ())).collect();
    let bytes = to_vec(&map).unwrap();
    assert_eq!(
        postcard::from_bytes::<BTreeMap<u8, ()>>(&bytes)
            .unwrap()
            .len(),
        20
    );
    assert_eq!(
        from_slice::<BTreeMap<u8, ()>>(&bytes, &Limits::default().max_items(19)),
        Err(DecodeError::ItemLimit { max: 19 })
    );
    assert_eq!(
        from_slice::<BTreeMap<u8, ()>>(&bytes, &Limits::default().max_items(20)).unwrap(),
        map
    );
}

#[test]
fn trailing_bytes_are_refused() {
    let mut bytes = to_vec(&(1u32, "one")).unwrap();
    bytes.extend_from_slice(b"smuggled");
    // postcard's `from_bytes` ignores what follows the value.
    assert_eq!(
        postcard::from_bytes::<(u32, &str)>(&bytes).unwrap(),
        (1, "one")
    );
    assert_eq!(
        from_slice::<(u32, &str)>(&bytes, &Limits::default()),
        Err(DecodeError::TrailingBytes { count: 8 })
    );
}

#[test]
fn truncated_input_is_refused_at_every_cut() {
    let value = (
        Colour::Blue,
        300u64,
        Some("text".to_string()),
        vec![1.5f64, -2.0],
    );
    let bytes = to_vec(&value).unwrap();
    for cut in 0..bytes.len() {
        let err = from_slice::<(Colour, u64, Option<String>, Vec<f64>)>(
            &bytes[..cut],
            &Limits::default(),
        )
        .unwrap_err();
        assert!(
            matches!(err, DecodeError::UnexpectedEnd { .. }),
            "cut at {cut}: {err:?}"
        );
    }
    assert_eq!(
        from_slice::<(Colour, u64, Option<String>, Vec<f64>)>(&bytes, &Limits::default()).unwrap(),
        value
    );
}

#[test]
fn invalid_utf8_is_refused() {
    let bytes = [3, b'a', 0xff, b'b'];
    assert!(
        std::str::from_utf8(&bytes[1..]).is_err(),
        "the payload really is not UTF-8"
    );
    // The same bytes are a fine byte string: only the target type makes them wrong.
    assert_eq!(
        from_slice::<&serde_bytes::Bytes>(&bytes, &Limits::default())
            .unwrap()
            .as_ref(),
        &bytes[1..]
    );
    assert_eq!(
        from_slice::<String>(&bytes, &Limits::default()),
        Err(DecodeError::InvalidUtf8)
    );
    assert_eq!(
        from_slice::<&str>(&bytes, &Limits::default()),
        Err(DecodeError::InvalidUtf8)
    );
    assert_eq!(
        from_slice::<char>(&bytes, &Limits::default()),
        Err(DecodeError::InvalidUtf8)
    );
}

#[test]
fn char_must_be_exactly_one_scalar() {
    assert_eq!(
        from_slice::<char>(&to_vec(&'é').unwrap(), &Limits::default()),
        Ok('é')
    );
    let two = to_vec("ab").unwrap();
    assert_eq!(
        from_slice::<char>(&two, &Limits::default()),
        Err(DecodeError::InvalidChar)
    );
    assert_eq!(
        from_slice::<char>(&[0], &Limits::default()),
        Err(DecodeError::InvalidChar)
    );
}

#[test]
fn bool_byte_other_than_zero_or_one_is_refused() {
    for b in 2..=255u8 {
        // Hostile: a trusting decoder reads the byte as `true`, whose only encoding is `01`, so
        // one value would have 255 encodings and byte-level comparisons (replay caches,
        // deduplication, a digest over the body) would see different messages.
        assert!(naive_bool(b));
        assert_ne!(to_vec(&naive_bool(b)).unwrap(), [b]);
        assert_eq!(
            from_slice::<bool>(&[b], &Limits::default()),
            Err(DecodeError::BadBool(b))
        );
    }
    assert_eq!(from_slice::<bool>(&[1], &Limits::default()), Ok(true));
}

#[test]
fn option_tag_other_than_zero_or_one_is_refused() {
    // Hostile: a trusting decoder reads tag 2 as `Some`, a value whose encoding is `01 05`.
    let decoded = naive_option_u8(&[2, 5]).unwrap();
    assert_eq!(decoded, Some(5));
    assert_ne!(to_vec(&decoded).unwrap(), [2, 5]);
    assert_eq!(
        from_slice::<Option<u8>>(&[2, 5], &Limits::default()),
        Err(DecodeError::BadOptionTag(2))
    );
    assert_eq!(
        from_slice::<Option<u8>>(&[1, 5], &Limits::default()),
        Ok(Some(5))
    );
}

#[test]
fn enum_tag_out_of_range_is_refused() {
    let bytes = varint::encode(3);
    assert!(postcard::from_bytes::<Colour>(&bytes).is_err());
    assert_eq!(
        from_slice::<Colour>(&bytes, &Limits::default()),
        Err(DecodeError::BadEnumTag {
            tag: 3,
            variants: 3
        })
    );
    assert_eq!(
        from_slice::<Colour>(&varint::encode(u64::from(u32::MAX)), &Limits::default()),
        Err(DecodeError::BadEnumTag {
            tag: u32::MAX,
            variants: 3
        })
    );
    assert_eq!(
        from_slice::<Colour>(&varint::encode(1 << 32), &Limits::default()),
        Err(DecodeError::VarintOverflow)
    );
    assert_eq!(
        from_slice::<Colour>(&[2], &Limits::default()),
        Ok(Colour::Blue)
    );
}

#[test]
fn overlong_varint_is_refused() {
    // Zero in two bytes, and 1 in three: both have a trailing zero group.
    for bytes in [&[0x80, 0x00][..], &[0x81, 0x80, 0x00][..]] {
        // postcard accepts the non-canonical form, so one value has several encodings.
        assert!(postcard::from_bytes::<u32>(bytes).is_ok());
        assert_eq!(
            from_slice::<u32>(bytes, &Limits::default()),
            Err(DecodeError::OverlongVarint)
        );
        assert_eq!(
            from_slice::<u64>(bytes, &Limits::default()),
            Err(DecodeError::OverlongVarint)
        );
        assert_eq!(
            from_slice::<i64>(bytes, &Limits::default()),
            Err(DecodeError::OverlongVarint)
        );
        assert_eq!(
            from_slice::<u128>(bytes, &Limits::default()),
            Err(DecodeError::OverlongVarint)
        );
        assert_eq!(
            Value::from_slice(&[&[0x04][..], bytes].concat(), &Limits::default()),
            Err(DecodeError::OverlongVarint)
        );
    }
    // An overlong length prefix is refused too.
    assert_eq!(
        from_slice::<String>(&[0x81, 0x00, b'a'], &Limits::default()),
        Err(DecodeError::OverlongVarint)
    );
}

#[test]
fn overflowing_varint_is_refused() {
    // u16::MAX + 1 needs 17 bits.
    let over_u16 = varint::encode(1 << 16);
    // Hostile: a trusting decoder narrows it with `as` and gets 0, a value the sender never
    // wrote (its encoding is `00`).
    let (wide, _) = varint::read_unchecked(&over_u16).unwrap();
    assert_eq!(wide as u16, 0);
    assert_ne!(to_vec(&(wide as u16)).unwrap(), over_u16);
    assert_eq!(
        from_slice::<u16>(&over_u16, &Limits::default()),
        Err(DecodeError::VarintOverflow)
    );
    assert_eq!(
        from_slice::<u32>(&over_u16, &Limits::default()),
        Ok(1 << 16)
    );
    let over_u32 = varint::encode(1 << 32);
    assert_eq!(
        from_slice::<u32>(&over_u32, &Limits::default()),
        Err(DecodeError::VarintOverflow)
    );
    assert_eq!(
        from_slice::<i32>(&over_u32, &Limits::default()),
        Err(DecodeError::VarintOverflow)
    );
    // Eleven bytes can never be a u64; nor can ten whose last carries more than one bit.
    let eleven = [0xff; 10].iter().copied().chain([0x01]).collect::<Vec<_>>();
    let mut ten = vec![0xff; 9];
    ten.push(0x02);
    // Hostile: a trusting decoder shifts the excess bits out (or wraps them round) and accepts
    // both as some u64 whose real encoding is other bytes.
    for bytes in [&eleven, &ten] {
        let (value, rest) = varint::read_unchecked(bytes).unwrap();
        assert!(rest.is_empty());
        assert_ne!(&varint::encode(value), bytes, "{value:#x}");
    }
    assert_eq!(
        from_slice::<u64>(&eleven, &Limits::default()),
        Err(DecodeError::VarintOverflow)
    );
    assert_eq!(
        from_slice::<u64>(&ten, &Limits::default()),
        Err(DecodeError::VarintOverflow)
    );
    ten[9] = 0x01;
    assert_eq!(from_slice::<u64>(&ten, &Limits::default()), Ok(u64::MAX));
    let mut u128_max = vec![0xff; 18];
    u128_max.push(0x03);
    assert_eq!(
        from_slice::<u128>(&u128_max, &Limits::default()),
        Ok(u128::MAX)
    );
    u128_max[18] = 0x04;
    assert_eq!(
        from_slice::<u128>(&u128_max, &Limits::default()),
        Err(DecodeError::VarintOverflow)
    );
}

#[test]
fn integer_extremes_round_trip() {
    let value = (
        i8::MIN,
        i16::MIN,
        i32::MIN,
        i64::MIN,
        i128::MIN,
        u16::MAX,
        u32::MAX,
        u64::MAX,
    );
    let bytes = to_vec(&value).unwrap();
    assert_eq!(from_slice::<_>(&bytes, &Limits::default()), Ok(value));
    let value = (
        i8::MAX,
        i16::MAX,
        i32::MAX,
        i64::MAX,
        i128::MAX,
        u128::MAX,
        -1i16,
        f32::NAN.to_bits(),
    );
    let bytes = to_vec(&value).unwrap();
    assert_eq!(from_slice::<_>(&bytes, &Limits::default()), Ok(value));
}

#[test]
fn self_describing_targets_are_refused() {
    // An untagged enum asks the format to describe itself: the input would choose the variant.
    #[derive(Deserialize, Debug)]
    #[serde(untagged)]
    #[allow(dead_code)]
    enum Either {
        Num(u64),
        Text(String),
    }
    assert_eq!(
        from_slice::<Either>(&[1], &Limits::default()).unwrap_err(),
        DecodeError::SelfDescribingUnsupported
    );
}

#[test]
fn custom_error_message_is_bounded() {
    #[derive(Debug)]
    struct Loud;
    impl<'de> Deserialize<'de> for Loud {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let s = String::deserialize(d)?;
            Err(serde::de::Error::custom(format!("refused: {s}")))
        }
    }
    let huge = "é".repeat(10_000);
    let bytes = to_vec(&huge).unwrap();
    match from_slice::<Loud>(&bytes, &Limits::default()).unwrap_err() {
        DecodeError::Custom(msg) => {
            assert!(
                msg.len() <= airlock_codec::MAX_CUSTOM_MESSAGE,
                "{}",
                msg.len()
            );
            assert!(msg.starts_with("refused: é"));
        }
        other => panic!("expected Custom, got {other:?}"),
    }
}

#[test]
fn value_unknown_tag_is_refused() {
    for tag in 0x0a..=0xff_u8 {
        assert_eq!(
            Value::from_slice(&[tag], &Limits::default()),
            Err(DecodeError::BadValueTag(tag))
        );
    }
}

#[test]
fn value_map_key_must_be_string_or_integer() {
    // A map of one entry whose key is a list, a null, a float: none can be a key.
    for key_tag in [0x00, 0x01, 0x02, 0x05, 0x07, 0x08, 0x09, 0x42] {
        let bytes = [0x09, 0x01, key_tag, 0x00, 0x00];
        assert_eq!(
            Value::from_slice(&bytes, &Limits::default()),
            Err(DecodeError::BadKeyTag(key_tag))
        );
    }
}

#[test]
fn value_duplicate_map_key_is_refused() {
    // {"a": null, "a": true}: which one wins would be up to the decoder, so neither does.
    let bytes = [0x09, 0x02, 0x06, 0x01, b'a', 0x00, 0x06, 0x01, b'a', 0x02];
    assert_eq!(
        Value::from_slice(&bytes, &Limits::default()),
        Err(DecodeError::DuplicateMapKey)
    );
    // Integer keys of different signedness are different keys.
    let bytes = [0x09, 0x02, 0x03, 0x02, 0x00, 0x04, 0x01, 0x00];
    let Value::Map(map) = Value::from_slice(&bytes, &Limits::default()).unwrap() else {
        panic!("expected a map");
    };
    assert_eq!(
        map.keys().cloned().collect::<Vec<_>>(),
        [Key::I64(1), Key::U64(1)]
    );
}

#[test]
fn value_list_count_beyond_input_is_refused() {
    let bomb = [&[0x08][..], &varint::encode(1_000_000)].concat();
    assert_eq!(
        Value::from_slice(&bomb, &Limits::default()),
        Err(DecodeError::UnexpectedEnd {
            needed: 1,
            remaining: 0
        })
    );
    let bomb = [&[0x08][..], &varint::encode(u64::MAX)].concat();
    assert_eq!(
        Value::from_slice(&bomb, &Limits::default()),
        Err(DecodeError::ItemLimit { max: 1024 * 1024 })
    );
}

#[test]
fn value_trailing_bytes_and_budgets_apply() {
    assert_eq!(
        Value::from_slice(&[0x00, 0x00], &Limits::default()),
        Err(DecodeError::TrailingBytes { count: 1 })
    );
    let s = Value::Str("x".repeat(10)).to_vec();
    assert_eq!(
        Value::from_slice(&s, &Limits::default().max_len(9)),
        Err(DecodeError::LengthLimit { len: 10, max: 9 })
    );
    assert_eq!(
        Value::from_slice(&s, &Limits::default().max_bytes(5)),
        Err(DecodeError::InputTooLong { len: 12, max: 5 })
    );
    let invalid = [0x06, 0x01, 0xc0];
    assert_eq!(
        Value::from_slice(&invalid, &Limits::default()),
        Err(DecodeError::InvalidUtf8)
    );
}
