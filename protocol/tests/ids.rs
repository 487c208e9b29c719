//! Call ids: fresh 128-bit values from the RNG the caller passes, per dispatch (invariant 4).

mod support;

use std::collections::HashSet;

use airlock_protocol::*;
use bytes::Bytes;
use support::*;

#[test]
fn a_million_ids_from_the_os_rng_are_distinct_and_balanced() {
    // The source the host really uses (host/src/supervisor.rs), not a test RNG: a seeded
    // generator cannot repeat within a million draws by construction, so only the real source
    // makes this test able to fail (a broken or stubbed OS RNG, a counter, a fixed id).
    let mut rng = rand_core::UnwrapErr(rand_core::OsRng);
    const DRAWS: usize = 1_000_000;
    let mut seen = HashSet::with_capacity(DRAWS);
    let mut ones = [0u32; 128];
    for _ in 0..DRAWS {
        let id = CallId::random(&mut rng);
        assert!(seen.insert(id), "the OS RNG repeated an id");
        let bytes = id.to_bytes();
        for (bit, count) in ones.iter_mut().enumerate() {
            *count += u32::from(bytes[bit / 8] >> (bit % 8) & 1);
        }
    }
    // Every bit position is set in about half the ids. Binomial(10^6, 1/2) has a standard
    // deviation of 500; six of them (3,000) is missed by chance about once in 5·10^8 per bit,
    // while a counter, a nonce plus a counter or a time-derived id leaves high bits fixed.
    for (bit, &count) in ones.iter().enumerate() {
        let off = (i64::from(count) - (DRAWS / 2) as i64).abs();
        assert!(off < 3_000, "bit {bit} set in {count} of {DRAWS} ids");
    }
}

#[test]
fn begin_call_draws_ids_from_the_rng_passed_in() {
    // Two sessions given the same seed issue the same ids; a different seed, different ids.
    let issue = |seed: u64| -> Vec<CallId> {
        let mut pair = Pair::ready(&["echo"]);
        pair.rng = SeededRng(seed);
        (0..10).map(|_| pair.call("echo", b"")).collect()
    };
    assert_eq!(issue(42), issue(42));
    assert_ne!(issue(42), issue(43));
    // And each is exactly what the RNG produces, consumed 16 bytes per call.
    let mut expected = SeededRng(42);
    let first: Vec<CallId> = (0..10).map(|_| CallId::random(&mut expected)).collect();
    assert_eq!(issue(42), first);
}

#[test]
fn every_dispatch_draws_a_fresh_id() {
    let mut pair = Pair::ready(&["echo"]);
    let mut seen = HashSet::new();
    for _ in 0..100 {
        let id = pair.call("echo", b"");
        pair.pump();
        let (got, _, _) = pair.worker_calls().pop().unwrap();
        pair.worker.reply_return(got, Bytes::new()).unwrap();
        pair.pump();
        assert!(seen.insert(id), "an id was reused");
    }
}

#[test]
fn ids_are_not_logged_in_full() {
    let id = CallId::from_bytes([0xab; 16]);
    assert_eq!(format!("{id}"), "abababab…");
    assert_eq!(format!("{id:?}"), "CallId(abababab…)");
}
