//! Call-id randomness: the operating system's, fetched in blocks.
//!
//! Every call id is 16 bytes the kernel's CSPRNG produced for it alone, never reused and never
//! derived from another. What changes is only how often the host asks: one `getrandom` per
//! [`BLOCK`] bytes (32 calls) instead of one per call. Bytes are wiped from the block as they are
//! handed out, so a block never holds ids that are already on the wire. The block lives in the
//! host's memory, which the worker (another process) cannot read.

use rand_core::{CryptoRng, RngCore};

/// Bytes fetched from the OS at a time: 32 call ids.
const BLOCK: usize = 512;

/// A [`CryptoRng`] whose every byte comes straight from `getrandom`, fetched [`BLOCK`] bytes at a
/// time. Panics if the OS has no randomness to give, as `rand_core`'s `UnwrapErr<OsRng>` would: a host that
/// cannot draw unpredictable ids must not make calls.
pub(crate) struct OsRandomBlock {
    block: [u8; BLOCK],
    /// Index of the first byte not yet handed out; `BLOCK` when the block is spent.
    next: usize,
}

impl OsRandomBlock {
    /// An empty block: the first draw fetches.
    pub(crate) fn new() -> Self {
        Self {
            block: [0; BLOCK],
            next: BLOCK,
        }
    }
}

impl RngCore for OsRandomBlock {
    fn next_u32(&mut self) -> u32 {
        let mut bytes = [0; 4];
        self.fill_bytes(&mut bytes);
        u32::from_le_bytes(bytes)
    }

    fn next_u64(&mut self) -> u64 {
        let mut bytes = [0; 8];
        self.fill_bytes(&mut bytes);
        u64::from_le_bytes(bytes)
    }

    fn fill_bytes(&mut self, mut dst: &mut [u8]) {
        while !dst.is_empty() {
            if self.next == BLOCK {
                // See the type's docs: no randomness, no calls.
                getrandom::fill(&mut self.block).expect("the OS random source failed");
                self.next = 0;
            }
            let take = dst.len().min(BLOCK - self.next);
            let (head, rest) = dst.split_at_mut(take);
            let source = &mut self.block[self.next..self.next + take];
            head.copy_from_slice(source);
            source.fill(0);
            self.next += take;
            dst = rest;
        }
    }
}

impl CryptoRng for OsRandomBlock {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_handed_out_once_and_then_wiped() {
        let mut rng = OsRandomBlock::new();
        let mut ids = std::collections::HashSet::new();
        // Three blocks' worth, drawn in id-sized pieces and across block boundaries.
        for _ in 0..(3 * BLOCK / 16) {
            let mut id = [0u8; 16];
            rng.fill_bytes(&mut id);
            assert!(ids.insert(id), "an id repeated");
            assert!(
                rng.block[..rng.next].iter().all(|&b| b == 0),
                "handed-out bytes are still in the block"
            );
        }
        let mut odd = [0u8; 700]; // larger than a block
        rng.fill_bytes(&mut odd);
        assert!(odd.iter().any(|&b| b != 0));
    }

    #[test]
    fn draws_are_not_a_function_of_the_previous_ones() {
        // Two fresh sources must disagree: a seeded or counter-based source would repeat.
        let (mut a, mut b) = (OsRandomBlock::new(), OsRandomBlock::new());
        let (mut x, mut y) = ([0u8; 16], [0u8; 16]);
        a.fill_bytes(&mut x);
        b.fill_bytes(&mut y);
        assert_ne!(x, y);
    }
}
