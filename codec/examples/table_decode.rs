//! Decodes the benchmark table once with the decoder named on the command line (`airlock` or
//! `postcard`; `none` only builds and encodes it): a fixed workload for instruction-count
//! profiling (`valgrind --tool=callgrind`) and `perf stat -r N` comparisons.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Row {
    id: u64,
    name: String,
    score: f64,
    tags: [String; 3],
    active: bool,
}

fn main() {
    let rows: Vec<Row> = (0..100_000u64)
        .map(|i| Row {
            id: i * 7919,
            name: format!("customer-{i:07}"),
            score: i as f64 * 0.25,
            tags: ["alpha".into(), format!("t{}", i % 13), "omega".into()],
            active: i % 3 == 0,
        })
        .collect();
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
