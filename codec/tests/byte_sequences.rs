//! A plain `Vec<u8>` is budgeted as the byte string it is: its elements cost input bytes and
//! count against `max_len`, not against `max_items`, so a 16 MiB buffer decodes under the
//! default item budget. Every other element still costs an item, and a count that no budget
//! could pay for is refused before anything is decoded or allocated.

use airlock_codec::{from_slice, to_vec, DecodeError, Limits, DEFAULT_MAX_ITEMS};
use serde::{Deserialize, Serialize};

use airlock_test_support::alloc::{peak_allocated, CountingAlloc};
use airlock_test_support::varint::encode as varint;

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// The payload. Its encoding is four bytes longer (the length prefix), so the test raises
/// `max_bytes` by that much, as the host and worker do by deriving their byte budgets from the
/// frame cap; the codec's own default is exactly 16 MiB.
const SIXTEEN_MIB: usize = 16 * 1024 * 1024;

#[test]
fn a_sixteen_mib_byte_vector_decodes_under_the_default_item_budget() {
    let payload: Vec<u8> = (0..SIXTEEN_MIB).map(|i| (i % 251) as u8).collect();
    let bytes = to_vec(&payload).unwrap();
    // Counted element by element, it would be sixteen times over the default item budget.
    assert_eq!(payload.len(), 16 * DEFAULT_MAX_ITEMS);
    let limits = Limits::default().max_bytes(bytes.len());
    let (decoded, peak) = peak_allocated(|| from_slice::<Vec<u8>>(&bytes, &limits).unwrap());
    assert_eq!(decoded, payload);
    // A growing `Vec<u8>` briefly holds its old and new buffers: at most three times the
    // payload, never a per-item multiple.
    assert!(
        peak <= 3 * SIXTEEN_MIB,
        "peak {peak} bytes for {SIXTEEN_MIB}"
    );
}

#[test]
fn byte_vectors_inside_a_message_cost_one_item_each_whatever_their_length() {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Upload {
        name: String,
        chunks: Vec<Vec<u8>>,
        signed: Vec<i8>,
    }
    let upload = Upload {
        name: "scan.tiff".into(),
        chunks: vec![vec![0xab; 5_000]; 4],
        signed: vec![-1; 5_000],
    };
    let bytes = to_vec(&upload).unwrap();
    // Four chunks are four items; their 25,000 bytes are not items at all.
    assert_eq!(
        from_slice::<Upload>(&bytes, &Limits::default().max_items(4)).unwrap(),
        upload
    );
    assert_eq!(
        from_slice::<Upload>(&bytes, &Limits::default().max_items(3)),
        Err(DecodeError::ItemLimit { max: 3 })
    );
}

#[test]
fn a_byte_vector_over_max_len_is_refused_like_a_byte_string() {
    let plain = to_vec(&vec![7u8; 2_000]).unwrap();
    let as_bytes = to_vec(&serde_bytes::ByteBuf::from(vec![7u8; 2_000])).unwrap();
    // The same encoding, the same refusal, naming the length and the budget.
    assert_eq!(plain, as_bytes);
    let limits = Limits::default().max_len(1_000);
    let expected = DecodeError::LengthLimit {
        len: 2_000,
        max: 1_000,
    };
    assert_eq!(
        from_slice::<Vec<u8>>(&plain, &limits),
        Err(expected.clone())
    );
    assert_eq!(
        from_slice::<serde_bytes::ByteBuf>(&as_bytes, &limits),
        Err(expected.clone())
    );
    assert_eq!(
        from_slice::<Vec<i8>>(&plain, &limits),
        Err(expected.clone())
    );
    let message = expected.to_string();
    assert!(message.contains("2000 bytes"), "{message}");
    assert!(message.contains("1000 (Limits::max_len)"), "{message}");
    assert_eq!(expected.budget(), Some(("max_len", 1_000)));
}

#[test]
fn elements_that_are_not_lone_bytes_still_cost_one_item_each() {
    let limits = Limits::default().max_items(1_000);
    // One input byte each, but two, eight or more bytes of memory each: the item budget holds.
    let small_u16s = to_vec(&vec![1u16; 1_001]).unwrap();
    assert_eq!(small_u16s.len(), 2 + 1_001);
    assert_eq!(
        from_slice::<Vec<u16>>(&small_u16s, &limits),
        Err(DecodeError::ItemLimit { max: 1_000 })
    );
    let wrapped = to_vec(&vec![(7u8,); 1_001]).unwrap();
    assert_eq!(
        from_slice::<Vec<(u8,)>>(&wrapped, &limits),
        Err(DecodeError::ItemLimit { max: 1_000 })
    );
    let options = to_vec(&vec![None::<u8>; 1_001]).unwrap();
    assert_eq!(
        from_slice::<Vec<Option<u8>>>(&options, &limits),
        Err(DecodeError::ItemLimit { max: 1_000 })
    );
    let flags = to_vec(&vec![true; 1_001]).unwrap();
    assert_eq!(
        from_slice::<Vec<bool>>(&flags, &limits),
        Err(DecodeError::ItemLimit { max: 1_000 })
    );
    // At the budget, they decode.
    assert_eq!(
        from_slice::<Vec<u16>>(&to_vec(&vec![1u16; 1_000]).unwrap(), &limits)
            .unwrap()
            .len(),
        1_000
    );
}

#[test]
fn elements_read_as_a_byte_but_larger_in_memory_cost_one_item_each() {
    let limits = Limits::default().max_items(1_000);
    // The same bytes as a `Vec<u8>` of 1,001, which the item budget does not touch...
    let bytes = to_vec(&vec![7u8; 1_001]).unwrap();
    assert_eq!(from_slice::<Vec<u8>>(&bytes, &limits).unwrap().len(), 1_001);
    // ...but each `Box<u8>` is a heap allocation and a pointer: one item each.
    assert_eq!(
        from_slice::<Vec<Box<u8>>>(&bytes, &limits),
        Err(DecodeError::ItemLimit { max: 1_000 })
    );
    // And so is each node of a `LinkedList<u8>`, while a `VecDeque<u8>` is one buffer.
    assert_eq!(
        from_slice::<std::collections::LinkedList<u8>>(&bytes, &limits),
        Err(DecodeError::ItemLimit { max: 1_000 })
    );
    assert_eq!(
        from_slice::<std::collections::VecDeque<u8>>(&bytes, &limits)
            .unwrap()
            .len(),
        1_001
    );
    let at_budget = to_vec(&vec![7u8; 1_000]).unwrap();
    assert_eq!(
        from_slice::<Vec<Box<u8>>>(&at_budget, &limits)
            .unwrap()
            .len(),
        1_000
    );
}

#[test]
fn a_count_no_budget_can_pay_for_is_refused_before_any_element() {
    let claim = 1u64 << 40;
    let mut bomb = varint(claim);
    bomb.extend([0u8; 64]);
    // More elements than items left plus input bytes left: refused at the count, with nothing
    // reserved for it.
    let (refused, peak) = peak_allocated(|| from_slice::<Vec<u8>>(&bomb, &Limits::default()));
    assert_eq!(
        refused,
        Err(DecodeError::ItemLimit {
            max: DEFAULT_MAX_ITEMS
        })
    );
    assert_eq!(peak, 0, "allocated {peak} bytes for a refused count");
    // Zero-sized elements cost no input, so their count is bounded by the item budget alone.
    let units = varint(DEFAULT_MAX_ITEMS as u64 + 1);
    assert_eq!(
        from_slice::<Vec<()>>(&units, &Limits::default()),
        Err(DecodeError::ItemLimit {
            max: DEFAULT_MAX_ITEMS
        })
    );
}

#[test]
fn a_byte_count_beyond_the_input_ends_at_the_input() {
    // Within what the budgets could pay, but the bytes are not there: the decoder stops at
    // the end of the input, having held no more than the growing vector of the bytes that
    // were really there (its old and new buffers at once: three times their length).
    let mut short = varint(100_000);
    short.extend([1u8; 1_000]);
    let (result, peak) = peak_allocated(|| from_slice::<Vec<u8>>(&short, &Limits::default()));
    assert_eq!(
        result,
        Err(DecodeError::UnexpectedEnd {
            needed: 1,
            remaining: 0
        })
    );
    assert!(peak <= 3 * short.len(), "allocated {peak} bytes");
}
