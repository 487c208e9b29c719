//! The bench binary's global allocator: the system allocator, plus two counters that move only
//! while [`counting`] runs, for the allocations-per-call rows.
//!
//! Every request goes to [`System`] unchanged. Outside [`counting`] the only added work is one
//! relaxed load of a flag no thread writes, so the timed rows pay nothing measurable for it.
//! The counters are process-wide: while counting, every thread's allocations count (the
//! host's runtime and its helper threads alike), which is what "host side" means.

// `GlobalAlloc` is an unsafe trait: this module is the crate's one use of `unsafe`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Whether allocations are being counted now.
static ON: AtomicBool = AtomicBool::new(false);
/// Requests that obtained memory (`alloc`, `alloc_zeroed`, `realloc`) while counting.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// Bytes those requests asked for (a `realloc` counts its new size).
static BYTES: AtomicU64 = AtomicU64::new(0);

/// What the allocator was asked for while counting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests that obtained memory: `alloc`, `alloc_zeroed` and `realloc` (a `Vec` that
    /// grows counts once per growth).
    pub allocations: u64,
    /// Bytes requested by them.
    pub bytes: u64,
}

/// Runs `f` with counting on and returns what every thread of the process allocated meanwhile.
/// Not reentrant: the bench counts one thing at a time.
pub fn counting<T>(f: impl FnOnce() -> T) -> (T, Counts) {
    let before = snapshot();
    ON.store(true, Ordering::SeqCst);
    let out = f();
    ON.store(false, Ordering::SeqCst);
    let after = snapshot();
    let counts = Counts {
        allocations: after.allocations - before.allocations,
        bytes: after.bytes - before.bytes,
    };
    (out, counts)
}

fn snapshot() -> Counts {
    Counts {
        allocations: ALLOCATIONS.load(Ordering::SeqCst),
        bytes: BYTES.load(Ordering::SeqCst),
    }
}

fn record(bytes: usize) {
    if ON.load(Ordering::Relaxed) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// [`System`], counted.
struct Counting;

// SAFETY: every method forwards to `System` with the arguments it was given, so each keeps
// `System`'s guarantees; `record` only touches atomics and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: the caller's contract for `alloc_zeroed` is passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator, with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        // SAFETY: `ptr` came from `System` through this allocator, with this `layout`; the
        // caller's contract for `new_size` is passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Checks the counter before its figures are trusted: an allocation made while counting is
/// seen with its size, and one made outside moves nothing.
pub fn check() -> Result<(), &'static str> {
    let (kept, counts) = counting(|| std::hint::black_box(vec![7u8; 1000]));
    // Other threads may allocate meanwhile, so at least the vector's buffer.
    if kept.len() != 1000 || counts.allocations < 1 || counts.bytes < 1000 {
        return Err("the allocation counter missed an allocation made while counting");
    }
    let before = snapshot();
    drop(std::hint::black_box(vec![0u8; 4096]));
    if snapshot() != before {
        return Err("the allocation counter moved outside counting");
    }
    Ok(())
}
