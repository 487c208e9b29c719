//! Decodes the benchmark table once with the decoder named on the command line (`airlock` or
//! `postcard`; `none` only builds and encodes it): a fixed workload for instruction-count
//! profiling (`valgrind --tool=callgrind`) and `perf stat -r N` comparisons.

use airlock_test_support::table::{self, Row};

fn main() {
    let rows = table::rows();
    let bytes = airlock_codec::to_vec(&rows).expect("encode");
    let which = std::env::args().nth(1).unwrap_or_default();
    if which == "none" {
        // The fixed cost (building and encoding the table), to subtract from the other runs.
        std::hint::black_box(bytes);
        return;
    }
    let decoded: Vec<Row> = if which == "postcard" {
        postcard::from_bytes(&bytes).expect("postcard decode")
    } else {
        airlock_codec::from_slice(&bytes, &airlock_codec::Limits::default()).expect("decode")
    };
    std::hint::black_box(decoded);
}
