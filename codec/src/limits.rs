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

/// Input bytes that buy one pre-allocated element slot: 16.
///
/// **The pre-allocation bound.** Over one whole decode, the capacity the decoder offers
/// containers ahead of their elements sums to at most `input length / 16` element slots, and no
/// one container is offered more than one slot per 16 bytes still unread, whatever counts the
/// input claims and however containers nest. A slot is one element of the container's own type,
/// which the decoder cannot see (serde's `size_hint` carries no type), so in bytes the bound is
/// that slot count times the size of the largest element type in the target: at most the input
/// length for elements of 16 bytes or less, but 256 times it for `[u64; 512]` elements. serde's
/// own collections further cap each container's pre-allocation at 1 MiB. Box large elements
/// (`Vec<Box<[u64; 512]>>` has 8-byte slots) to keep pre-allocation below the input length.
///
/// Why 16: one slot per byte let 302 hostile bytes reserve 1 MiB for `Vec<[[u64; 32]; 16]>`;
/// sixteen bytes per slot cuts every such amplification sixteen-fold, while an honest large
/// table still gets its whole hint, because elements worth pre-allocating for rarely encode in
/// fewer than 16 bytes (the benchmark's rows take ~45). Denser elements still decode correctly,
/// their `Vec` growing by doubling past a partial hint. Offering no hint at all measured 1.32×
/// plain postcard on the benchmark table, over the 1.10× target.
///
/// This bounds pre-allocation only. The decoded value itself holds what the input really
/// encodes, times the declared type's own expansion, which no decoder can shrink: a one-byte
/// `None` of `Option<[u8; 4096]>` is 4 KiB in memory. [`Limits::max_items`] bounds how many
/// elements there are; boxing bounds how large each is.
pub const INPUT_BYTES_PER_PREALLOC_SLOT: usize = 16;

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
/// and entries are produced, besides the one-byte elements of byte sequences, which are bounded
/// by the input's length; no string, byte string or byte sequence longer than `max_len` is
/// materialised; no length prefix is trusted beyond the bytes that remain in the input; and
/// capacity reserved ahead of elements sums to at most one element slot per
/// [`INPUT_BYTES_PER_PREALLOC_SLOT`] input bytes.
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
    /// Not counted: the elements of a byte sequence (a `Vec<u8>`, each element one `u8` or
    /// `i8` in one buffer; not a `LinkedList<u8>`, whose elements are items), which are
    /// budgeted as bytes by [`Limits::max_bytes`] and [`Limits::max_len`],
    /// since each is one input byte and one byte of memory (see the crate docs, "Byte buffers").
    ///
    /// Worst-case memory: for a [`Value`](crate::Value), about this many times its 32 bytes
    /// (a map of n entries is charged 6n + 23 items for its tree nodes). For a typed decode,
    /// this many times the size of the largest element type (counting what a `Box` in it
    /// points to, which one item pays for whole), times that container's own slack
    /// (a `BTreeMap` node has room for eleven entries; a growing `Vec` up to twice its length).
    /// Separately, capacity reserved ahead of sequence elements is at most one element slot
    /// per [`INPUT_BYTES_PER_PREALLOC_SLOT`] input bytes over the whole decode (see there for
    /// what that means in bytes); maps reserve nothing ahead.
    #[must_use]
    pub const fn max_items(mut self, items: usize) -> Self {
        self.max_items = items;
        self
    }

    /// Longest single string, byte string or byte sequence (a `Vec<u8>`), in bytes. Default
    /// [`DEFAULT_MAX_LEN`] (16 MiB).
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
