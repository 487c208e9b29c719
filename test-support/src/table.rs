//! The table the codec's benchmarks decode: the criterion bench, the `table_decode` profiling
//! example and `cargo xtask bench` all use this one, so their figures describe the same work.

use serde::{Deserialize, Serialize};

/// One row: an integer, a string, a float, three short strings and a bool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// A large, distinct integer (a multi-byte varint).
    pub id: u64,
    /// `customer-NNNNNNN`.
    pub name: String,
    /// A float.
    pub score: f64,
    /// Three short strings, one of them varying.
    pub tags: [String; 3],
    /// A flag.
    pub active: bool,
}

/// A [`Row`] that borrows its strings from the bytes it is decoded from.
#[derive(Debug, Deserialize)]
pub struct BorrowedRow<'a> {
    /// As [`Row::id`].
    pub id: u64,
    /// As [`Row::name`].
    pub name: &'a str,
    /// As [`Row::score`].
    pub score: f64,
    /// As [`Row::tags`].
    pub tags: [&'a str; 3],
    /// As [`Row::active`].
    pub active: bool,
}

/// How many rows the table has.
pub const ROWS: usize = 100_000;

/// The table's [`ROWS`] rows. Encoded with postcard (or airlock's codec, the same wire
/// format) they take about 4.6 MB.
///
/// ```
/// let rows = airlock_test_support::table::rows();
/// assert_eq!(rows.len(), airlock_test_support::table::ROWS);
/// assert_eq!(rows[1].name, "customer-0000001");
/// ```
pub fn rows() -> Vec<Row> {
    (0..ROWS as u64)
        .map(|i| Row {
            id: i * 7919,
            name: format!("customer-{i:07}"),
            score: i as f64 * 0.25,
            tags: ["alpha".into(), format!("t{}", i % 13), "omega".into()],
            active: i % 3 == 0,
        })
        .collect()
}
