//! A global allocator wrapper that records the largest single allocation made on each thread,
//! so a test can show that a receiver did not reserve memory for a length it was only told.

#![allow(unsafe_code)] // a `GlobalAlloc` impl is unsafe by definition; it only delegates

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Install in a test binary with
/// `#[global_allocator] static ALLOC: PeakAlloc = PeakAlloc;`, then bracket the code under test
/// with [`PeakAlloc::reset`] and [`PeakAlloc::peak`] on the same thread.
#[derive(Debug)]
pub struct PeakAlloc;

impl PeakAlloc {
    /// Whether this allocator is the global one in this binary (it has served an allocation).
    pub fn is_installed() -> bool {
        INSTALLED.load(Ordering::Relaxed)
    }

    /// Forgets this thread's peak.
    pub fn reset() {
        PEAK.with(|peak| peak.set(0));
    }

    /// The largest single allocation (or reallocation target) on this thread since
    /// [`PeakAlloc::reset`].
    pub fn peak() -> usize {
        PEAK.with(Cell::get)
    }

    fn record(size: usize) {
        INSTALLED.store(true, Ordering::Relaxed);
        // `try_with`: during thread teardown the slot may be gone; nothing to record then.
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(size)));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract holds exactly as it does for `System`. Recording touches only a
// const-initialised thread-local `Cell<usize>`, which never allocates.
unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::record(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::record(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above; `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::record(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
