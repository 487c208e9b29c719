//! A byte cursor that carries the decode budgets.
//!
//! Both decoders (typed and [`Value`](crate::Value)) read through this one type, so the rules
//! "no length is trusted beyond the bytes that remain", "nesting stops at `max_depth`" and "items
//! are counted over the whole value" are written once.

use crate::{DecodeError, Limits, INPUT_BYTES_PER_PREALLOC_SLOT as INPUT_BYTES_PER_SLOT};

/// The input not yet consumed, plus what is left of each budget.
#[derive(Debug)]
pub(crate) struct Reader<'de> {
    input: &'de [u8],
    depth_left: usize,
    items_left: usize,
    /// Element slots all containers of this decode together may still pre-allocate: one per
    /// [`INPUT_BYTES_PER_SLOT`] input bytes, shared, so nested containers cannot each reserve
    /// against the same remaining bytes.
    prealloc_left: usize,
    limits: Limits,
}

impl<'de> Reader<'de> {
    /// Starts a decode; refuses input over `max_bytes` before reading a byte of it.
    pub(crate) fn new(input: &'de [u8], limits: &Limits) -> Result<Self, DecodeError> {
        if input.len() > limits.bytes_budget() {
            return Err(DecodeError::InputTooLong {
                len: input.len(),
                max: limits.bytes_budget(),
            });
        }
        Ok(Self {
            input,
            depth_left: limits.depth_budget(),
            items_left: limits.items_budget(),
            prealloc_left: input.len() / INPUT_BYTES_PER_SLOT,
            limits: *limits,
        })
    }

    /// Ends a decode: any byte left over is an error.
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        match self.input.len() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes { count }),
        }
    }

    /// Items charged so far against `max_items`.
    pub(crate) fn items_spent(&self) -> usize {
        self.limits.items_budget() - self.items_left
    }

    /// Takes one byte.
    #[inline]
    pub(crate) fn byte(&mut self) -> Result<u8, DecodeError> {
        match self.input.split_first() {
            Some((&b, rest)) => {
                self.input = rest;
                Ok(b)
            }
            None => Err(self.end(1)),
        }
    }

    /// Takes exactly `N` bytes.
    #[inline]
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        match self.input.split_first_chunk::<N>() {
            Some((head, rest)) => {
                self.input = rest;
                Ok(*head)
            }
            None => Err(self.end(N as u64)),
        }
    }

    /// Takes `len` bytes, borrowed from the input. The length is checked against the bytes that
    /// remain before anything else happens, so a huge prefix costs nothing.
    #[inline]
    pub(crate) fn take(&mut self, len: u64) -> Result<&'de [u8], DecodeError> {
        let n = usize::try_from(len).map_err(|_| self.end(len))?;
        match self.input.split_at_checked(n) {
            Some((head, rest)) => {
                self.input = rest;
                Ok(head)
            }
            None => Err(self.end(len)),
        }
    }

    /// Reads a length prefix for a string or byte string and takes that many bytes, refusing a
    /// length over `max_len` or over what remains.
    #[inline]
    pub(crate) fn length_prefixed(&mut self) -> Result<&'de [u8], DecodeError> {
        let len = self.varint_u64()?;
        if len > self.limits.len_budget() as u64 {
            return Err(DecodeError::LengthLimit {
                len,
                max: self.limits.len_budget(),
            });
        }
        self.take(len)
    }

    /// Like [`Reader::length_prefixed`], then checks the bytes are UTF-8.
    #[inline]
    pub(crate) fn str(&mut self) -> Result<&'de str, DecodeError> {
        let bytes = self.length_prefixed()?;
        core::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8)
    }

    fn end(&self, needed: u64) -> DecodeError {
        DecodeError::UnexpectedEnd {
            needed,
            remaining: self.input.len(),
        }
    }

    /// Reads an unsigned LEB128 varint of at most `BITS` bits (`BITS` ≤ 64), strictly: a value
    /// that needs fewer bytes than were used is [`DecodeError::OverlongVarint`], one that needs
    /// more than `BITS` bits is [`DecodeError::VarintOverflow`].
    #[inline(always)]
    pub(crate) fn varint<const BITS: u32>(&mut self) -> Result<u64, DecodeError> {
        // The one-byte case (most lengths, tags and small integers) stays inline at every call.
        if let Some((&first, rest)) = self.input.split_first() {
            if first & 0x80 == 0 {
                self.input = rest;
                return Ok(u64::from(first));
            }
        }
        self.varint_multi_byte::<BITS>()
    }

    /// The rest of [`Reader::varint`]: values of two bytes or more, and every error.
    #[inline(never)]
    fn varint_multi_byte<const BITS: u32>(&mut self) -> Result<u64, DecodeError> {
        let first = self.byte()?;
        let mut value = u64::from(first & 0x7f);
        let mut shift = 7u32;
        loop {
            let b = self.byte()?;
            let group = u64::from(b & 0x7f);
            if shift + 7 > BITS {
                // Last group allowed: its bits above BITS must be zero and it must end here.
                if b & 0x80 != 0 || group >> (BITS - shift) != 0 {
                    return Err(DecodeError::VarintOverflow);
                }
            }
            value |= group << shift;
            if b & 0x80 == 0 {
                // A final group of zero adds nothing: the same value fits in fewer bytes.
                return if b == 0 {
                    Err(DecodeError::OverlongVarint)
                } else {
                    Ok(value)
                };
            }
            shift += 7;
        }
    }

    /// A `u64` varint (lengths, counts).
    #[inline]
    pub(crate) fn varint_u64(&mut self) -> Result<u64, DecodeError> {
        self.varint::<64>()
    }

    /// Reads a 128-bit varint with the same strictness as [`Reader::varint`].
    pub(crate) fn varint_u128(&mut self) -> Result<u128, DecodeError> {
        const BITS: u32 = 128;
        let mut value = 0u128;
        let mut shift = 0u32;
        loop {
            let b = self.byte()?;
            let group = u128::from(b & 0x7f);
            if shift + 7 > BITS && (b & 0x80 != 0 || group >> (BITS - shift) != 0) {
                return Err(DecodeError::VarintOverflow);
            }
            value |= group << shift;
            if b & 0x80 == 0 {
                return if b == 0 && shift > 0 {
                    Err(DecodeError::OverlongVarint)
                } else {
                    Ok(value)
                };
            }
            shift += 7;
        }
    }

    /// Enters one level of nesting; refused at `max_depth`. Pair with [`Reader::leave`].
    #[inline]
    pub(crate) fn enter(&mut self) -> Result<(), DecodeError> {
        match self.depth_left.checked_sub(1) {
            Some(left) => {
                self.depth_left = left;
                Ok(())
            }
            None => Err(DecodeError::DepthLimit {
                max: self.limits.depth_budget(),
            }),
        }
    }

    /// Leaves a level entered with [`Reader::enter`].
    #[inline]
    pub(crate) fn leave(&mut self) {
        self.depth_left += 1;
    }

    /// Reserves `count` items from the whole-value budget, refusing the lot at once when the
    /// budget cannot hold them (so a huge count is refused before any element is decoded).
    #[inline]
    pub(crate) fn reserve_items(&mut self, count: u64) -> Result<usize, DecodeError> {
        match usize::try_from(count) {
            Ok(n) if n <= self.items_left => {
                self.items_left -= n;
                Ok(n)
            }
            _ => Err(DecodeError::ItemLimit {
                max: self.limits.items_budget(),
            }),
        }
    }

    /// Checks a sequence's declared element count before its first element: each element
    /// will cost one item, or (a lone byte) one input byte, at most `max_len` of them per
    /// sequence. A count beyond both together cannot be honoured and is refused at once, so a
    /// huge count costs nothing. The elements are charged as they are decoded.
    #[inline]
    pub(crate) fn plausible_count(&mut self, count: u64) -> Result<usize, DecodeError> {
        let payable = self
            .items_left
            .saturating_add(self.input.len().min(self.limits.len_budget()));
        match usize::try_from(count) {
            Ok(n) if n <= payable => Ok(n),
            _ => Err(DecodeError::ItemLimit {
                max: self.limits.items_budget(),
            }),
        }
    }

    /// Charges one element to the whole-value item budget.
    #[inline]
    pub(crate) fn charge_item(&mut self) -> Result<(), DecodeError> {
        match self.items_left.checked_sub(1) {
            Some(left) => {
                self.items_left = left;
                Ok(())
            }
            None => Err(DecodeError::ItemLimit {
                max: self.limits.items_budget(),
            }),
        }
    }

    /// The longest string or byte string allowed ([`Limits::max_len`]).
    #[inline]
    pub(crate) fn len_budget(&self) -> usize {
        self.limits.len_budget()
    }

    /// A capacity hint for a container of `count` elements that the input cannot inflate: at
    /// most one slot per [`INPUT_BYTES_PER_SLOT`] bytes still unread, drawn from one budget of
    /// `input length / INPUT_BYTES_PER_SLOT` slots shared by the whole decode and never
    /// refunded, so the slots pre-allocated over a whole decode, however containers nest or lie
    /// about their counts, sum to at most that. In bytes, that is at most the slot count times
    /// the size of the largest element type the target contains.
    #[inline]
    pub(crate) fn cautious_hint(&mut self, count: usize) -> usize {
        let hint = count
            .min(self.input.len() / INPUT_BYTES_PER_SLOT)
            .min(self.prealloc_left);
        self.prealloc_left -= hint;
        hint
    }
}
