//! What a `Blob` answer costs the host's memory: it is the frame's own bytes, and a kept one
//! holds only its own frame's buffer. Alone in its binary: large request buffers are kept in a
//! pool the whole process shares (`airlock_protocol::reuse`), so a test beside it could take
//! or free one this test's thread allocated, and its per-thread counts would be off.

use airlock_host::{Blob, Host};
use airlock_protocol::blob::LENT_FROM;
use airlock_test_support::alloc::{self, CountingAlloc};
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{Echo, EchoBlob};
use serde_bytes::ByteBuf;

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// Just under the default frame cap: the largest answer a default host takes.
const LARGE: usize = 16 * 1024 * 1024 - LENT_FROM;

/// A large `Blob` answer is the frame's own bytes: once the host has a frame buffer of that
/// size, receiving one allocates nothing of its size (copied, each would allocate its whole
/// length). And a small `Blob` answer kept after large frames keeps only its own frame's
/// buffer: a buffer the decoder grew for an earlier frame, which a worker chooses the size
/// of, is never shared with a later frame, so each 64 KiB answer kept holds at most four
/// times its length, whatever frames came before it.
#[tokio::test(flavor = "current_thread")]
async fn a_blob_answer_is_the_frames_bytes_and_a_kept_one_holds_only_its_own_frame() {
    // The host's reader runs on this thread (a current-thread runtime), so this thread's
    // counts are the host's receiving and decoding.
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    let large = Blob::from(vec![0x3c; LARGE]);
    let small = Blob::from(vec![0xc3; LENT_FROM]);
    drop(host.call::<EchoBlob>(&large).await.unwrap());
    alloc::reset_largest();
    let echoed = host.call::<EchoBlob>(&large).await.unwrap();
    assert!(CountingAlloc::is_installed());
    assert!(
        alloc::largest() < LARGE / 2,
        "receiving a large Blob allocated {} bytes at once: it was copied",
        alloc::largest()
    );
    assert!(echoed == large);
    drop(echoed);
    // A large `ByteBuf` request is encoded into a buffer the process then keeps for the next
    // (`reuse`): made here, before the count, so the count holds only what kept answers hold.
    // (A large `Blob` request is written from the caller's buffer and fills no such pool.)
    let copied = ByteBuf::from(vec![0x5a; LARGE]);
    drop(host.call::<Echo>(&copied).await.unwrap());

    let rounds = 8;
    let before = alloc::live();
    let mut kept = Vec::new();
    for round in 0..rounds {
        // A large frame, dropped (as a Blob, then as a ByteBuf), then a small Blob, kept.
        if round % 2 == 0 {
            drop(host.call::<EchoBlob>(&large).await.unwrap());
        } else {
            drop(host.call::<Echo>(&copied).await.unwrap());
        }
        kept.push(host.call::<EchoBlob>(&small).await.unwrap());
    }
    let held_each = alloc::live().saturating_sub(before) / rounds;
    assert!(kept.iter().all(|blob| *blob == small));
    assert!(
        held_each <= 4 * LENT_FROM,
        "each kept {LENT_FROM}-byte Blob holds {held_each} bytes"
    );
    host.shutdown().await;
}
