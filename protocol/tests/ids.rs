//! Call ids: fresh 128-bit values from the RNG the caller passes, per dispatch (invariant 4).

mod support;

use std::collections::HashSet;

use airlock_protocol::*;
use bytes::Bytes;
use support::*;

#[test]
fn a_million_drawn_ids_are_distinct() {
    let mut rng = SeededRng(0xa1b2);
    let mut seen = HashSet::with_capacity(1_000_000);
    for _ in 0..1_000_000 {
        assert!(seen.insert(CallId::random(&mut rng)));
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
