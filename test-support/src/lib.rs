//! What airlock's test suites share, so that each helper exists once.
//!
//! The codec, the protocol and the end-to-end suites all measure allocations, write and read
//! hex, build and read LEB128 varints, and run part of a test in a process of its own; the
//! benchmarks decode one table. This crate holds one copy of each. It depends on no airlock
//! crate (only on serde and rustix), so every crate of the workspace, the codec at the bottom included,
//! can dev-depend on it; it is not published.
//!
//! - [`alloc`]: [`CountingAlloc`], a global allocator that counts each thread's live bytes,
//!   their high-water mark and its largest single allocation.
//! - [`hex`]: bytes as lowercase hex and back.
//! - [`varint`]: `u64` as postcard's LEB128 varint, and a deliberately trusting reader of one.
//! - [`child`]: [`ChildMode`], a test that re-runs its own test binary for itself alone, to do
//!   in a fresh process what would kill or taint the test process; and
//!   [`wait_for_forked`](child::wait_for_forked), a bounded wait for a process a test forked.
//! - [`table`]: the rows the codec's benchmarks decode.
//!
//! ```
//! use airlock_test_support::{hex, varint};
//!
//! assert_eq!(varint::encode(300), [0xac, 0x02]);
//! assert_eq!(hex::encode(&varint::encode(300)), "ac02");
//! assert_eq!(hex::decode("ac02"), Some(vec![0xac, 0x02]));
//! assert_eq!(varint::read_unchecked(&[0xac, 0x02, 0xff]), Some((300, &[0xff][..])));
//! ```

#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

pub mod alloc;
pub mod child;
pub mod hex;
pub mod table;
pub mod varint;

pub use alloc::CountingAlloc;
pub use child::ChildMode;
