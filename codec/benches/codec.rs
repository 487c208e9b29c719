//! Codec cost against its baselines, measured in the same run:
//! - a 100,000-row table decoded by `airlock_codec::from_slice` vs plain `postcard::from_bytes`
//!   (owned rows, and rows borrowing their strings from the input);
//! - a 64 MiB byte payload borrowed by `from_slice` vs a `memcpy` of the same size.
//!
//! Read the ratio of each pair; absolute times on a shared machine are noise.

use std::hint::black_box;

use airlock_codec::{from_slice, to_vec, Limits};
use airlock_test_support::table::{self, BorrowedRow, Row};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

fn bench_table(c: &mut Criterion) {
    let bytes = to_vec(&table::rows()).unwrap();
    let limits = Limits::default();
    let mut group = c.benchmark_group("table_100k_rows");
    group.sample_size(20);
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function(BenchmarkId::new("owned", "postcard_baseline"), |b| {
        b.iter(|| postcard::from_bytes::<Vec<Row>>(black_box(&bytes)).unwrap())
    });
    group.bench_function(BenchmarkId::new("owned", "airlock"), |b| {
        b.iter(|| from_slice::<Vec<Row>>(black_box(&bytes), &limits).unwrap())
    });
    group.bench_function(BenchmarkId::new("borrowed", "postcard_baseline"), |b| {
        b.iter(|| postcard::from_bytes::<Vec<BorrowedRow<'_>>>(black_box(&bytes)).unwrap())
    });
    group.bench_function(BenchmarkId::new("borrowed", "airlock"), |b| {
        b.iter(|| from_slice::<Vec<BorrowedRow<'_>>>(black_box(&bytes), &limits).unwrap())
    });
    group.finish();
}

fn bench_payload(c: &mut Criterion) {
    const SIZE: usize = 64 * 1024 * 1024;
    let payload = serde_bytes::ByteBuf::from(vec![0xa5u8; SIZE]);
    let bytes = to_vec(&payload).unwrap();
    let limits = Limits::default().max_bytes(SIZE + 16).max_len(SIZE);
    let mut dest = vec![0u8; SIZE];
    let mut group = c.benchmark_group("payload_64mib");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(SIZE as u64));
    group.bench_function("memcpy_baseline", |b| {
        b.iter(|| dest.copy_from_slice(black_box(&bytes[bytes.len() - SIZE..])))
    });
    group.bench_function("airlock_borrowed", |b| {
        b.iter(|| {
            from_slice::<&serde_bytes::Bytes>(black_box(&bytes), &limits)
                .unwrap()
                .len()
        })
    });
    group.bench_function("airlock_owned", |b| {
        b.iter(|| {
            from_slice::<serde_bytes::ByteBuf>(black_box(&bytes), &limits)
                .unwrap()
                .len()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_table, bench_payload);
criterion_main!(benches);
