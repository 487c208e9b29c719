//! A seeded generator (SplitMix64) standing in for the OS CSPRNG, so tests, benches and fuzz
//! runs draw reproducible ids. Marked `CryptoRng` for that use only: its statistics are fine,
//! its secrecy is not the point. Shared by path (`#[path = ...] mod seeded_rng;`) with
//! `protocol/benches/session.rs` and `fuzz/src/frame_stream.rs`.

use rand_core::{CryptoRng, RngCore};

/// SplitMix64 posing as a CSPRNG: fine for reproducible tests, never for real ids.
#[derive(Clone, Debug)]
pub struct SeededRng(pub u64);

impl RngCore for SeededRng {
    fn next_u32(&mut self) -> u32 {
        self.next_u64() as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        rand_core::impls::fill_bytes_via_next(self, dst)
    }
}

impl CryptoRng for SeededRng {}
