//! Call ids: 128 bits from a cryptographic RNG, fresh for every dispatch.

use core::fmt;

use rand_core::CryptoRng;
use serde::{Deserialize, Serialize};

/// The id that binds a worker's reply to exactly one call.
///
/// Drawn by [`CallId::random`] from the `CryptoRng` the caller passes — the host passes the
/// operating system's — for every dispatch: never a counter, never a per-spawn nonce plus a
/// counter, never derived from time. A worker therefore cannot name a call before the host has
/// sent it, which is what defeats a forged reply staged for a *later* call (a worker that
/// knows the next id can otherwise answer a call before it is made).
///
/// Its `Debug` and `Display` show only the first four bytes, so logs can correlate events
/// without publishing ids in full.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CallId([u8; 16]);

impl CallId {
    /// Draws a fresh id from `rng`.
    pub fn random<R: CryptoRng + ?Sized>(rng: &mut R) -> Self {
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// The id's 16 bytes, as they appear on the wire.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0
    }

    /// An id from its wire bytes. Only the session state machines decide whether an id is one
    /// they issued; this constructor grants nothing.
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, ..] = self.0;
        write!(f, "{a:02x}{b:02x}{c:02x}{d:02x}…")
    }
}

impl fmt::Debug for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallId({self})")
    }
}

/// Hashes by the id's first eight bytes, which are already uniformly random: enough for any
/// hasher, and the whole input of [`IdHasher`].
impl core::hash::Hash for CallId {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        let [a, b, c, d, e, f, g, h, ..] = self.0;
        state.write_u64(u64::from_le_bytes([a, b, c, d, e, f, g, h]));
    }
}

/// A hasher for maps keyed by [`CallId`] (or by local counters): one multiplication, no
/// SipHash.
///
/// Sound against a hostile worker because the host alone *inserts* keys into its maps: call ids
/// are drawn from the OS's CSPRNG, so the table's entries are spread uniformly whatever ids a
/// worker sends to be looked up (and a lookup that misses is a fatal violation). The worker's
/// maps hold ids its host chose, and the host is the party it serves. A key a hostile peer
/// chose must never be inserted into a map using this hasher.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl core::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word.iter_mut().zip(chunk).for_each(|(w, b)| *w = *b);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        // Fibonacci hashing: an odd multiplier permutes the low bits (the bucket index), so
        // sequential counters stay distinct there, and it fills the high bits (the table's
        // tag) too; random ids stay random.
        self.0 = (self.0 ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Builds [`IdHasher`]s: `HashMap<CallId, V, BuildIdHasher>`.
pub type BuildIdHasher = core::hash::BuildHasherDefault<IdHasher>;
