//! Buffers of large bodies, reused: a side that sends large bodies one after another encodes
//! each into the buffer of an earlier one, already written, instead of allocating (and faulting
//! in, page by page) a fresh one per call.
//!
//! An [`Outgoing`](crate::transport::Outgoing) told to
//! [`recycle_written_bodies`](crate::transport::Outgoing::recycle_written_bodies) gives each
//! written body of at least [`REUSED_FROM`] bytes back ([`give_back`]); [`encode_body`] takes
//! one whose capacity fits. A buffer is reused only when the written body was its one
//! reference, and is emptied first: a body never carries bytes of an earlier one.
//!
//! The buffers are the process's, shared by every host and worker in it, and are kept for its
//! life: at most [`KEPT`] of them, each allocated to the exact length of a body written from
//! it, so at most twice the largest `max_frame` the process has used (32 MiB at the
//! defaults). A body's tail left in a `Blob`'s buffer ([`crate::body`]) is never kept: that
//! buffer is its owner's. Emptied is not wiped: a kept
//! buffer still holds, behind its length, the bytes of the body last written from it, until a
//! later body overwrites them.
//!
//! ```
//! use airlock_protocol::reuse::{encode_body, give_back, REUSED_FROM};
//!
//! let large = vec![7u8; REUSED_FROM];
//! let first = encode_body(&serde_bytes::Bytes::new(&large)).unwrap().into_bytes();
//! let at = first.as_ptr();
//! give_back(first); // written: nothing else refers to it
//! let second = encode_body(&serde_bytes::Bytes::new(&large[1..])).unwrap();
//! assert_eq!(second.front().as_ptr(), at, "the same buffer, holding only the new body");
//! assert_eq!(second.len(), airlock_codec::encoded_len(&serde_bytes::Bytes::new(&large[1..])).unwrap());
//! ```

use std::sync::{Mutex, PoisonError};

use airlock_codec::EncodeError;
use bytes::Bytes;
use serde::Serialize;

use crate::body::{Body, SPLICED_FROM};

/// Bodies smaller than this are encoded into fresh buffers: allocating them is cheap, and
/// keeping them would hold memory for nothing. 1 MiB.
pub const REUSED_FROM: usize = 1024 * 1024;

/// Most buffers a process keeps: a body being encoded while the last one is written.
pub const KEPT: usize = 2;

/// The process's spare buffers, each empty, each of at least [`REUSED_FROM`] bytes.
static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Encodes `value` as a [`Body`]: when the encoding ends with a large [`Blob`](crate::Blob)
/// after a short lead, the lead alone, with the blob's bytes left in its own buffer
/// ([`crate::body`]); otherwise into a buffer of exactly its encoded length (a kept one when
/// the body is large and one is free, else a fresh one).
pub fn encode_body<T: Serialize + ?Sized>(value: &T) -> Result<Body, EncodeError> {
    let len = airlock_codec::encoded_len(value)?;
    if len >= SPLICED_FROM {
        if let Some(body) = crate::body::encode_spliced(value) {
            return Ok(body);
        }
    }
    let buffer = take(len).unwrap_or_else(|| Vec::with_capacity(len));
    airlock_codec::append_to_vec(value, buffer).map(Body::from)
}

/// The smallest empty kept buffer with room for `len` bytes, if one is free and `len` is large
/// enough to be worth it. The smallest: a larger one stays for a larger body, and a body holds
/// no more memory than it must while it is written.
fn take(len: usize) -> Option<Vec<u8>> {
    if len < REUSED_FROM {
        return None;
    }
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    let (at, _) = spare
        .iter()
        .enumerate()
        .filter(|(_, buffer)| buffer.capacity() >= len)
        .min_by_key(|(_, buffer)| buffer.capacity())?;
    Some(spare.swap_remove(at))
}

/// Keeps the buffer of a written `body` for a later [`encode_body`], if nothing else refers to
/// it and it is large enough; otherwise drops it.
pub fn give_back(body: Bytes) {
    if body.len() < REUSED_FROM {
        return;
    }
    let Ok(mut buffer) = body.try_into_mut() else {
        return;
    };
    buffer.clear();
    let buffer = Vec::from(buffer);
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    if spare.len() < KEPT {
        spare.push(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool is the process's and tests run in parallel: each test holds this while it
    /// uses the pool, and starts from an empty one.
    fn pool_alone() -> std::sync::MutexGuard<'static, ()> {
        static ALONE: Mutex<()> = Mutex::new(());
        let alone = ALONE.lock().unwrap_or_else(PoisonError::into_inner);
        SPARE.lock().unwrap_or_else(PoisonError::into_inner).clear();
        alone
    }

    #[test]
    fn a_written_body_comes_back_empty_and_is_reused_only_when_unshared() {
        let _alone = pool_alone();
        let old = vec![0xAAu8; 3 * REUSED_FROM];
        let body = encode_body(serde_bytes::Bytes::new(&old))
            .unwrap()
            .into_bytes();
        let at = body.as_ptr();
        let shared = body.clone();
        give_back(body);
        assert!(take(REUSED_FROM).is_none(), "kept while still referenced");
        give_back(shared);
        assert!(take(10).is_none(), "small bodies take no kept buffer");

        let new = vec![0x55u8; 2 * REUSED_FROM];
        let encoded = encode_body(serde_bytes::Bytes::new(&new)).unwrap();
        assert_eq!(
            encoded.front().as_ptr(),
            at,
            "the written body's buffer, reused"
        );
        assert_eq!(
            encoded.to_vec(),
            airlock_codec::to_vec(serde_bytes::Bytes::new(&new)).unwrap(),
            "nothing of the earlier body"
        );
    }

    #[test]
    fn a_slice_of_a_body_keeps_its_buffer_out_and_a_sliced_body_gives_back_the_whole_buffer() {
        let _alone = pool_alone();
        let old = vec![0xAAu8; 3 * REUSED_FROM];
        let body = encode_body(serde_bytes::Bytes::new(&old))
            .unwrap()
            .into_bytes();
        let view = body.slice(..16);
        give_back(body);
        assert!(
            take(REUSED_FROM).is_none(),
            "kept while a slice of it lives"
        );
        drop(view);

        // The only reference left is a view that starts inside its buffer.
        let body = encode_body(serde_bytes::Bytes::new(&old))
            .unwrap()
            .into_bytes();
        let (at, len) = (body.as_ptr(), body.len());
        let inner = body.slice(1..);
        drop(body);
        give_back(inner);
        let kept = take(len).expect("the sliced body's buffer, kept");
        assert_eq!(kept.as_ptr(), at, "from the start of its allocation");
        assert!(kept.is_empty() && kept.capacity() >= len);
    }

    #[test]
    fn a_body_takes_the_smallest_kept_buffer_it_fits() {
        let _alone = pool_alone();
        let large = Bytes::from(vec![1u8; 8 * REUSED_FROM]);
        let small = Bytes::from(vec![2u8; 2 * REUSED_FROM]);
        let (large_at, small_at) = (large.as_ptr(), small.as_ptr());
        give_back(large);
        give_back(small);

        let body = vec![3u8; REUSED_FROM + REUSED_FROM / 2];
        let first = encode_body(serde_bytes::Bytes::new(&body)).unwrap();
        assert_eq!(
            first.front().as_ptr(),
            small_at,
            "the smaller buffer, not the larger"
        );
        let body = vec![4u8; 7 * REUSED_FROM];
        let second = encode_body(serde_bytes::Bytes::new(&body)).unwrap();
        assert_eq!(
            second.front().as_ptr(),
            large_at,
            "the larger buffer, left for the larger body"
        );
    }
}
