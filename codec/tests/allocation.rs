//! Decoding allocates O(input length): no length prefix or count is trusted to size an
//! allocation before the input proves it. Measured with a counting global allocator that
//! records each thread's peak live bytes, so parallel tests do not disturb each other.

use airlock_codec::{from_slice, DecodeError, Limits, Value};

mod common;

use common::{peak_allocated, varint};

#[global_allocator]
static ALLOCATOR: common::Counting = common::Counting;

#[test]
fn length_prefix_beyond_input_allocates_nothing() {
    // A million u64s promised in three bytes.
    let bomb = varint(1_000_000);
    assert_eq!(bomb.len(), 3);

    // The attack is live: the prefix asks for 8 MB of slots. A decoder that sized its buffer
    // from it would allocate that much for three bytes. (postcard 1.2 caps its own hint by the
    // remaining input too; this test pins that airlock does not regress below that.)
    let claimed = 1_000_000 * std::mem::size_of::<u64>();
    assert!(claimed > 1_000_000 * bomb.len());
    let (plain, plain_peak) = peak_allocated(|| postcard::from_bytes::<Vec<u64>>(&bomb));
    assert!(plain.is_err());
    assert_eq!(plain_peak, 0);

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
    let mut bytes = varint(1000);
    for _ in 0..1000 {
        bytes.extend(varint(100_000));
        bytes.push(7);
    }
    // The attack is live: the prefixes claim 800 MB of slots for about 4 KB of input.
    let claimed: usize = 1000 * 100_000 * std::mem::size_of::<u64>();
    assert!(claimed > 100_000 * bytes.len());

    let (ours, our_peak) =
        peak_allocated(|| from_slice::<Vec<Vec<u64>>>(&bytes, &Limits::default()));
    assert!(ours.is_err());
    // Each slot is at most one per remaining input byte; allow a generous constant factor.
    let bound = 64 * bytes.len();
    assert!(
        our_peak <= bound,
        "allocated {our_peak} bytes for {} input bytes",
        bytes.len()
    );
}

#[test]
fn value_count_bomb_allocates_in_proportion_to_input() {
    let bomb = [&[0x08][..], &varint(1_000_000)].concat();
    let (ours, our_peak) = peak_allocated(|| Value::from_slice(&bomb, &Limits::default()));
    assert!(ours.is_err());
    assert!(
        our_peak <= 1024,
        "allocated {our_peak} bytes for a {}-byte input",
        bomb.len()
    );
}
