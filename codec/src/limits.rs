//! Decoding budgets.
//!
//! Every decoder in this crate takes a [`Limits`] and refuses input that would exceed any of its
//! budgets *before* it spends the memory or the stack the input asks for.

/// Default for [`Limits::max_bytes`]: 16 MiB.
///
/// Large enough for a bulk payload in one message; small enough that a host holding one such
/// buffer per worker stays well inside a server's memory.
pub const DEFAULT_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Default for [`Limits::max_depth`]: 64 levels.
///
/// Deeper than any hand-written message type; shallow enough that decoding on a thread with a
/// 64 KiB stack cannot run out of stack.
pub const DEFAULT_MAX_DEPTH: usize = 64;

/// Default for [`Limits::max_items`]: 1 Mi (1,048,576) elements and map entries in one value.
///
/// Bounds the work done on zero-sized elements (`Vec<()>`), which cost no input bytes at all.
pub const DEFAULT_MAX_ITEMS: usize = 1024 * 1024;

/// Default for [`Limits::max_len`]: 16 MiB for one string or byte string.
///
/// The same as [`DEFAULT_MAX_BYTES`]: by default only the overall size bounds one payload.
pub const DEFAULT_MAX_LEN: usize = 16 * 1024 * 1024;

/// The budgets one decode may spend.
///
/// `Copy`, built from [`Default`] and narrowed with setters:
///
/// ```
/// use airlock_codec::Limits;
/// let tight = Limits::default().max_depth(8).max_items(1_000).max_len(4096);
/// assert_eq!(tight.depth_budget(), 8);
/// ```
///
/// Guarantees, for every decoder in this crate: input longer than `max_bytes` is refused without
/// being read; no nesting deeper than `max_depth` is entered; no more than `max_items` elements
/// and entries are produced; no string or byte string longer than `max_len` is materialised; and
/// no length prefix is trusted beyond the bytes that remain in the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    max_bytes: usize,
    max_depth: usize,
    max_items: usize,
    max_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
            max_items: DEFAULT_MAX_ITEMS,
            max_len: DEFAULT_MAX_LEN,
        }
    }
}

impl Limits {
    /// Longest input accepted, in bytes. Default [`DEFAULT_MAX_BYTES`] (16 MiB).
    ///
    /// Worst-case memory: the decoded value can hold at most this many bytes of string and
    /// byte-string data, plus per-item overhead bounded by [`Limits::max_items`].
    #[must_use]
    pub const fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// Deepest nesting of sequences, maps, structs, tuples, enums, options and newtypes, in
    /// levels. Default [`DEFAULT_MAX_DEPTH`] (64).
    ///
    /// Worst-case memory: stack only, a few hundred bytes per level.
    #[must_use]
    pub const fn max_depth(mut self, levels: usize) -> Self {
        self.max_depth = levels;
        self
    }

    /// Most sequence elements and map entries in one decoded value, counted over the whole value,
    /// zero-sized elements included. Default [`DEFAULT_MAX_ITEMS`] (1 Mi).
    ///
    /// Worst-case memory: this many times the size of the largest element type, though a
    /// sequence never pre-allocates more slots than input bytes remain.
    #[must_use]
    pub const fn max_items(mut self, items: usize) -> Self {
        self.max_items = items;
        self
    }

    /// Longest single string or byte string, in bytes. Default [`DEFAULT_MAX_LEN`] (16 MiB).
    ///
    /// Worst-case memory: one allocation of this many bytes (and never more than the input
    /// still holds).
    #[must_use]
    pub const fn max_len(mut self, bytes: usize) -> Self {
        self.max_len = bytes;
        self
    }

    /// The input-length budget set by [`Limits::max_bytes`].
    pub const fn bytes_budget(&self) -> usize {
        self.max_bytes
    }

    /// The nesting budget set by [`Limits::max_depth`].
    pub const fn depth_budget(&self) -> usize {
        self.max_depth
    }

    /// The element budget set by [`Limits::max_items`].
    pub const fn items_budget(&self) -> usize {
        self.max_items
    }

    /// The string-length budget set by [`Limits::max_len`].
    pub const fn len_budget(&self) -> usize {
        self.max_len
    }
}
