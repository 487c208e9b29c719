//! The checks behind airlock's fuzz targets, and the generator of their seed corpus.
//!
//! Each `fuzz_targets/*.rs` is one line calling a `check_*` function here, so a crashing input
//! can also be replayed from a plain test. The seed corpus under `corpus/<target>/seed-*` is
//! written by [`seeds::typed`], [`seeds::value`], [`frame_stream::seeds`] and
//! [`frame_decoder::seeds`]; regenerate it with
//! `AIRLOCK_WRITE_SEEDS=1 cargo test --manifest-path fuzz/Cargo.toml` (the test checks the
//! committed files match otherwise).

use airlock_codec::{from_slice, to_vec, Limits, Value};

pub mod frame_decoder;
pub mod frame_stream;
pub mod message;
pub mod seeds;

pub use message::Message;

/// Tight budgets, so the fuzzer reaches every limit within a few hundred bytes.
pub fn limits() -> Limits {
    Limits::default()
        .max_bytes(4096)
        .max_depth(16)
        .max_items(256)
        .max_len(64)
}

/// Decodes `data` as a [`Message`]; if that succeeds, re-encoding must give back `data` exactly.
///
/// Byte identity holds because the typed wire format is canonical and the decoder is strict:
/// no overlong varints, no non-0/1 bool or option tags, no trailing bytes, and every map in
/// [`Message`] keeps its entries in wire order.
pub fn check_typed(data: &[u8]) {
    let Ok(message) = from_slice::<Message>(data, &limits()) else {
        return;
    };
    let bytes = to_vec(&message).expect("a decoded message re-encodes");
    assert_eq!(
        bytes, data,
        "typed round trip is not byte-identical: {message:?}"
    );
}

/// Decodes `data` as a [`Value`]; if that succeeds, its encoding must decode (within the same
/// limits) to a value with the same encoding.
///
/// Encodings are compared rather than values because `F64(NaN) != F64(NaN)`; the encoding is
/// injective, so equal encodings mean equal values. The re-encoding may reorder map entries
/// (maps are sorted by key) but is never longer: every varint in accepted input is minimal.
pub fn check_value(data: &[u8]) {
    let Ok(value) = Value::from_slice(data, &limits()) else {
        return;
    };
    let bytes = value.to_vec();
    assert_eq!(
        bytes.len(),
        data.len(),
        "value re-encoding changed length: {value:?}"
    );
    let again = Value::from_slice(&bytes, &limits()).expect("a re-encoded value decodes");
    assert_eq!(again.to_vec(), bytes, "value round trip differs: {value:?}");
}
