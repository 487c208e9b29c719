//! Decoding allocates in proportion to the input: no length prefix or count is trusted to size an
//! allocation before the input proves it, and the capacity reserved ahead of elements is at most
//! one element slot per `INPUT_BYTES_PER_PREALLOC_SLOT` input bytes over the whole decode.
//! Measured with a counting global allocator that records each thread's peak live bytes, so
//! parallel tests do not disturb each other.
//!
//! Each test first runs the same bytes through a decoder that trusts them (a tiny naive decoder
//! written here, or plain postcard) and measures the harm, so the attack is shown to be live;
//! then it measures airlock on the identical bytes.

use airlock_codec::{from_slice, DecodeError, Limits, Value, INPUT_BYTES_PER_PREALLOC_SLOT};
use serde::Deserialize;

use airlock_test_support::alloc::{peak_allocated, CountingAlloc};
use airlock_test_support::varint;

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// The decoder an allocation bomb is aimed at: it sizes its buffer from the count prefix, the
/// way a hand-rolled parser does (`Vec::with_capacity(len)`), then reads the elements.
fn naive_vec_u64(bytes: &[u8]) -> Option<(Vec<u64>, &[u8])> {
    let (count, mut rest) = varint::read_unchecked(bytes)?;
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (v, r) = varint::read_unchecked(rest)?;
        out.push(v);
        rest = r;
    }
    Some((out, rest))
}

/// [`naive_vec_u64`] for `Vec<Vec<u64>>`.
fn naive_vec_vec_u64(bytes: &[u8]) -> Option<Vec<Vec<u64>>> {
    let (count, mut rest) = varint::read_unchecked(bytes)?;
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (v, r) = naive_vec_u64(rest)?;
        out.push(v);
        rest = r;
    }
    Some(out)
}

#[test]
fn length_prefix_beyond_input_allocates_nothing() {
    // A million u64s promised in three bytes.
    let bomb = varint::encode(1_000_000);
    assert_eq!(bomb.len(), 3);

    // The attack is live: a decoder that trusts the prefix reserves 8 MB for three bytes.
    let (naive, naive_peak) = peak_allocated(|| naive_vec_u64(&bomb));
    assert!(naive.is_none());
    assert!(
        naive_peak >= 1_000_000 * std::mem::size_of::<u64>(),
        "the naive decoder reserved only {naive_peak} bytes"
    );

    // airlock sizes nothing from the prefix.
    let (ours, our_peak) = peak_allocated(|| from_slice::<Vec<u64>>(&bomb, &Limits::default()));
    assert_eq!(
        ours,
        Err(DecodeError::UnexpectedEnd {
            needed: 1,
            remaining: 0
        })
    );
    assert_eq!(
        our_peak, 0,
        "airlock allocated {our_peak} bytes for a 3-byte input"
    );
}

#[test]
fn nested_count_bombs_allocate_in_proportion_to_input() {
    // Every inner list claims 100,000 elements and delivers one.
    let mut bytes = varint::encode(1000);
    for _ in 0..1000 {
        bytes.extend(varint::encode(100_000));
        bytes.push(7);
    }

    // The attack is live: a trusting decoder reserves the outer list and the first inner list
    // (it then reads the following prefixes as that list's elements until the input runs out):
    // about 200 times the input.
    let (naive, naive_peak) = peak_allocated(|| naive_vec_vec_u64(&bytes));
    assert!(naive.is_none());
    assert!(
        naive_peak >= 100_000 * std::mem::size_of::<u64>(),
        "the naive decoder reserved only {naive_peak} bytes for {} input bytes",
        bytes.len()
    );
    assert!(naive_peak > 100 * bytes.len());

    let (ours, our_peak) =
        peak_allocated(|| from_slice::<Vec<Vec<u64>>>(&bytes, &Limits::default()));
    assert!(ours.is_err());
    // Pre-allocation: one 24-byte slot (a `Vec<u64>`) per 16 input bytes. Plus the value the
    // bytes really encode: airlock, like the naive decoder, reads the later prefixes as elements
    // of the first inner list, at most one 8-byte u64 per input byte, grown by doubling (up to
    // twice the length, and the old buffer alongside the new while it is copied).
    let bound = bytes.len() / INPUT_BYTES_PER_PREALLOC_SLOT * std::mem::size_of::<Vec<u64>>()
        + 4 * bytes.len() * std::mem::size_of::<u64>();
    assert!(
        our_peak <= bound,
        "allocated {our_peak} bytes for {} input bytes (bound {bound})",
        bytes.len()
    );
}

#[test]
fn value_count_bomb_allocates_in_proportion_to_input() {
    let bomb = [&[0x08][..], &varint::encode(1_000_000)].concat();
    assert!(matches!(
        Value::from_slice(&[0x08, 0x01, 0x00], &Limits::default()),
        Ok(Value::List(_))
    ));

    // The attack is live: a list decoder that trusts the count reserves a million values.
    let (_, naive_peak) = peak_allocated(|| {
        let (count, _) = varint::read_unchecked(&bomb[1..]).unwrap();
        Vec::<Value>::with_capacity(count as usize)
    });
    assert!(naive_peak >= 1_000_000 * std::mem::size_of::<Value>());

    // airlock reserves no element for the count; what it allocates is its own stack of open
    // containers (one entry here), whose size the depth budget bounds.
    let (ours, our_peak) = peak_allocated(|| Value::from_slice(&bomb, &Limits::default()));
    assert!(ours.is_err());
    assert!(
        our_peak <= 256,
        "allocated {our_peak} bytes for a {}-byte input",
        bomb.len()
    );
}

/// A 4 KiB element: the amplification a slot-counted budget has to face.
type Big = [[u64; 32]; 16];

/// Capacity airlock may reserve ahead of elements for `input_len` bytes whose largest element
/// type is `slot` bytes: the documented bound.
fn prealloc_bound(input_len: usize, slot: usize) -> usize {
    input_len / INPUT_BYTES_PER_PREALLOC_SLOT * slot
}

#[test]
fn large_elements_preallocate_at_most_one_slot_per_sixteen_input_bytes() {
    // 300 elements of 4 KiB claimed, 300 bytes delivered: not even one element's worth (an
    // element takes at least 512 bytes), so an honest decode would hold nothing.
    let mut bomb = varint::encode(300);
    bomb.resize(302, 0);
    assert_eq!(std::mem::size_of::<Big>(), 4096);

    // The attack is live against a slot-per-byte hint: postcard offers the claimed count
    // whenever that many bytes remain, and serde's `Vec` reserves up to 1 MiB from it. This is
    // what airlock's own decoder did before its budget became one slot per 16 bytes.
    let (plain, plain_peak) = peak_allocated(|| postcard::from_bytes::<Vec<Big>>(&bomb));
    assert!(plain.is_err());
    assert!(
        plain_peak >= 1024 * 1024,
        "postcard reserved {plain_peak} bytes"
    );
    assert!(plain_peak > 3000 * bomb.len());

    let (ours, our_peak) = peak_allocated(|| from_slice::<Vec<Big>>(&bomb, &Limits::default()));
    assert!(matches!(ours, Err(DecodeError::UnexpectedEnd { .. })));
    let bound = prealloc_bound(bomb.len(), std::mem::size_of::<Big>());
    assert!(
        our_peak <= bound,
        "allocated {our_peak} bytes for {} input bytes (bound {bound})",
        bomb.len()
    );
    assert!(our_peak * 10 < plain_peak);

    // Boxing the element makes a slot 8 bytes: pre-allocation falls below the input length.
    let (boxed, boxed_peak) =
        peak_allocated(|| from_slice::<Vec<Box<Big>>>(&bomb, &Limits::default()));
    assert!(boxed.is_err());
    assert!(
        boxed_peak < bomb.len(),
        "boxed elements: {boxed_peak} bytes"
    );
}

/// A recursive type whose every level both nests and holds a 4 KiB element, so each nested
/// container can ask for its own 1 MiB.
#[derive(Deserialize, Debug)]
#[allow(dead_code)]
struct Node(Vec<(Option<Box<Node>>, Big)>);

#[test]
fn recursive_large_elements_share_one_preallocation_budget() {
    type Slot = (Option<Box<Node>>, Big);
    let slot = std::mem::size_of::<Slot>();
    // As many elements as serde's `Vec` will pre-allocate for (1 MiB of them) per level.
    let claim = (1024 * 1024 / slot) as u64;
    // Fifteen levels (four nesting levels each, inside the default 64), each claiming `claim`
    // elements and opening the next in its first element's `Some`; then `ff` bytes to 5,000,
    // enough that every claim looks affordable to a slot-per-byte hint. The innermost count is
    // then an overflowing varint, so no element is ever decoded: all that is allocated is
    // pre-allocation.
    let mut bomb = Vec::new();
    for _ in 0..15 {
        bomb.extend(varint::encode(claim));
        bomb.push(1);
    }
    bomb.resize(5000, 0xff);

    // The attack is live: with a hint of one slot per byte every level reserves its 1 MiB.
    let (plain, plain_peak) = peak_allocated(|| postcard::from_bytes::<Node>(&bomb));
    assert!(plain.is_err());
    assert!(
        plain_peak >= 15 * 1024 * 1024 - 15 * slot,
        "postcard reserved {plain_peak} bytes"
    );

    // airlock: all levels together draw from 5000 / 16 = 312 slots.
    let (ours, our_peak) = peak_allocated(|| from_slice::<Node>(&bomb, &Limits::default()));
    assert!(ours.is_err());
    let bound = prealloc_bound(bomb.len(), slot);
    assert!(
        our_peak <= bound,
        "allocated {our_peak} bytes for {} input bytes (bound {bound})",
        bomb.len()
    );
    assert!(our_peak * 10 < plain_peak);
}

#[test]
fn honest_large_sequence_gets_its_whole_hint() {
    // The budget must not starve honest input: 10,000 elements of 40 bytes each (four 10-byte
    // varints) are reserved at once, not grown by doubling.
    let honest: Vec<[u64; 4]> = vec![[u64::MAX; 4]; 10_000];
    let bytes = airlock_codec::to_vec(&honest).unwrap();
    let (decoded, peak) =
        peak_allocated(|| from_slice::<Vec<[u64; 4]>>(&bytes, &Limits::default()).unwrap());
    assert_eq!(decoded, honest);
    assert_eq!(decoded.capacity(), honest.len());
    assert_eq!(peak, honest.len() * std::mem::size_of::<[u64; 4]>());
}

#[test]
fn a_hash_map_reserves_nothing_ahead_of_its_entries() {
    use std::collections::HashMap;
    // 225 entries claimed, room for seven (a key byte and 512 one-byte varints each).
    let mut bomb = varint::encode(225);
    bomb.extend(std::iter::repeat_n(0u8, 3600));

    // Live: given the claimed count as a hint, a hash map reserves a power-of-two bucket table
    // for it at once: over 1 MiB, 290 times the input.
    let (plain, plain_peak) = peak_allocated(|| postcard::from_bytes::<HashMap<u64, Big>>(&bomb));
    assert!(plain.is_err());
    assert!(
        plain_peak >= 1 << 20,
        "postcard reserved {plain_peak} bytes"
    );

    // airlock gives maps no hint: the table grows with the entries that really arrive.
    let (ours, peak) =
        peak_allocated(|| from_slice::<HashMap<u64, Big>>(&bomb, &Limits::default()));
    assert!(
        matches!(ours, Err(DecodeError::UnexpectedEnd { .. })),
        "{ours:?}"
    );
    assert!(peak <= 128 * 1024, "airlock allocated {peak} bytes");
}

#[test]
fn value_maps_are_charged_for_their_tree_nodes() {
    use airlock_codec::Key;
    use std::collections::BTreeMap;
    // A list of 20,000 one-entry maps {0: null}: five bytes each.
    let maps = 20_000;
    let mut bomb = vec![0x08];
    bomb.extend(varint::encode(maps));
    for _ in 0..maps {
        bomb.extend([0x09, 0x01, 0x04, 0x00, 0x00]);
    }
    let limits = Limits::default().max_items(65_536);
    let value_size = std::mem::size_of::<Value>();

    // Live: counting one item per list element and per map entry, the list costs 40,000 of the
    // 65,536 items; but each map is a whole B-tree node in memory, so holding what those bytes
    // describe takes over 100 times the input, and far more than 65,536 Values.
    let (built, built_peak) = peak_allocated(|| {
        (0..maps)
            .map(|_| Value::Map(BTreeMap::from([(Key::U64(0), Value::Null)])))
            .collect::<Vec<_>>()
    });
    assert_eq!(built.len(), maps as usize);
    assert!(built_peak > 100 * bomb.len(), "{built_peak} bytes");
    assert!(built_peak > 65_536 * value_size, "{built_peak} bytes");

    // airlock charges each map for its node: the value is refused within the item budget,
    // having held no more than about that many Values' worth of memory.
    let (ours, peak) = peak_allocated(|| Value::from_slice(&bomb, &limits));
    assert_eq!(ours, Err(DecodeError::ItemLimit { max: 65_536 }));
    assert!(
        peak <= 2 * 65_536 * value_size,
        "airlock allocated {peak} bytes"
    );
}

#[test]
fn from_value_reserves_nothing_from_a_lists_length() {
    use serde::de::value::SeqDeserializer;
    // 255 nulls, converted to `Vec<Big>`: the first element already fails to convert.
    let nulls = || vec![Value::Null; 255];

    // Live: serde sizes the Vec from the list's exact length, at 4 KiB per element, before
    // looking at an element: a megabyte reserved for 255 nulls.
    let (plain, plain_peak) = peak_allocated(|| {
        let seq = SeqDeserializer::<_, DecodeError>::new(nulls().into_iter());
        Vec::<Big>::deserialize(seq)
    });
    assert!(plain.is_err());
    assert!(
        plain_peak >= 255 * 4096,
        "serde reserved {plain_peak} bytes"
    );

    // airlock's from_value hides the length: nothing is reserved for elements never built.
    let list = Value::List(nulls());
    let (ours, peak) = peak_allocated(|| airlock_codec::from_value::<Vec<Big>>(list));
    assert!(ours.is_err());
    assert!(peak <= 16 * 1024, "airlock allocated {peak} bytes");
}

#[test]
fn value_lists_keep_no_growth_slack() {
    use airlock_test_support::alloc::retained_by;
    // 65 chains of 62 one-element lists, each ending in null: 4,095 items, 8,127 bytes.
    let mut bomb = vec![0x08];
    bomb.extend(varint::encode(65));
    for _ in 0..65 {
        for _ in 0..62 {
            bomb.extend([0x08, 0x01]);
        }
        bomb.push(0x00);
    }
    let limits = Limits::default().max_items(4096);
    let bound = 4096 * std::mem::size_of::<Value>();

    // Live: built the way a decoder grows them, one push at a time, each one-element list keeps
    // a Vec's smallest capacity, four slots: over three times the item budget's worth.
    let (grown, grown_bytes) = retained_by(|| {
        (0..65)
            .map(|_| {
                let mut v = Value::Null;
                for _ in 0..62 {
                    // Grown the way a decoder grows it (amortised), not sized exactly.
                    let mut list = Vec::new();
                    list.extend(std::iter::once(v));
                    v = Value::List(list);
                }
                v
            })
            .collect::<Vec<_>>()
    });
    assert_eq!(grown.len(), 65);
    assert!(grown_bytes > 3 * bound, "{grown_bytes} bytes");

    // airlock gives each finished list its slack back: the value keeps about its items' worth.
    let (ours, kept) = retained_by(|| Value::from_slice(&bomb, &limits));
    assert!(ours.is_ok(), "{ours:?}");
    assert!(
        kept <= bound + bound / 8,
        "airlock kept {kept} bytes of a {bound}-byte bound"
    );
}
