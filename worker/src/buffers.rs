//! Buffers of large responses, reused: a worker answering large calls one after another
//! encodes each answer into the buffer of an earlier one, already written to the host, instead
//! of allocating (and faulting in, page by page) a fresh one per call.
//!
//! The serving loop gives written bodies back ([`give_back`]); encoding takes one whose
//! capacity fits ([`take`]). A buffer is reused only when the written body was its one
//! reference, and is emptied first: an answer never carries bytes of an earlier one.

use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

/// Responses smaller than this are encoded into fresh buffers: allocating them is cheap, and
/// keeping them would hold memory for nothing.
pub(crate) const REUSED_FROM: usize = 1024 * 1024;

/// Most buffers kept.
const KEPT: usize = 2;

static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// An empty buffer with room for `len` bytes, if one is kept and `len` is large enough to be
/// worth it.
pub(crate) fn take(len: usize) -> Option<Vec<u8>> {
    if len < REUSED_FROM {
        return None;
    }
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    let at = spare.iter().position(|buffer| buffer.capacity() >= len)?;
    Some(spare.swap_remove(at))
}

/// Keeps the buffer of a written `body` if nothing else refers to it.
pub(crate) fn give_back(body: Bytes) {
    let Ok(mut buffer) = body.try_into_mut() else {
        return;
    };
    buffer.clear();
    let buffer = Vec::from(buffer);
    if buffer.capacity() < REUSED_FROM {
        return;
    }
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    if spare.len() < KEPT {
        spare.push(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_body_comes_back_empty_with_its_capacity_and_a_shared_one_does_not() {
        let body = Bytes::from(vec![7u8; 2 * REUSED_FROM]);
        let shared = body.clone();
        give_back(body);
        assert!(
            take(2 * REUSED_FROM).is_none(),
            "kept while still referenced"
        );
        give_back(shared);
        let buffer = take(2 * REUSED_FROM).expect("kept once unique");
        assert!(buffer.is_empty());
        assert!(buffer.capacity() >= 2 * REUSED_FROM);
        assert!(take(10).is_none(), "small responses take no kept buffer");
    }
}
