//! A counting global allocator, so a test can show what a piece of code allocates.
//!
//! [`CountingAlloc`] forwards every call to [`System`] unchanged and counts, for each thread
//! on its own, the bytes live now, their high-water mark and the largest single allocation.
//! Per thread, so tests that run in parallel in one binary do not disturb each other's
//! figures; what a test measures is what the thread it runs on allocated.
//!
//! A global allocator is chosen by the binary, not by a library: a test binary that measures
//! declares it itself, once, at its top level.
//!
//! ```
//! use airlock_test_support::alloc::{self, CountingAlloc};
//!
//! #[global_allocator]
//! static ALLOCATOR: CountingAlloc = CountingAlloc;
//!
//! # fn main() {
//! let (buffer, peak) = alloc::peak_allocated(|| Vec::<u8>::with_capacity(4096));
//! assert!(peak >= 4096);
//! let (_kept, retained) = alloc::retained_by(|| buffer);
//! assert_eq!(retained, 0); // made before, only moved
//!
//! alloc::reset_largest();
//! drop(vec![0u8; 100_000]);
//! assert!(alloc::largest() >= 100_000);
//! assert!(CountingAlloc::is_installed());
//! # }
//! ```

// A `GlobalAlloc` impl is unsafe by definition. This one only forwards to `System`; the
// SAFETY comments below say why each forward keeps the contract.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// A global allocator that forwards to [`System`] and counts each thread's allocations. See
/// the [module docs](self) for how a test binary installs it and reads the counts.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

/// One thread's counts, in bytes.
struct Counts {
    /// Allocated and not yet freed by this thread (a block freed by another thread than the
    /// one that made it is subtracted there, saturating at zero).
    live: Cell<usize>,
    /// The most `live` has been since [`peak_allocated`] last lowered it to the current value.
    peak: Cell<usize>,
    /// The largest single allocation (or reallocation's new size) since [`reset_largest`].
    largest: Cell<usize>,
}

thread_local! {
    // Const-initialised and without a destructor, so reading it never allocates: an allocator
    // that allocated to count would recurse.
    static COUNTS: Counts = const {
        Counts { live: Cell::new(0), peak: Cell::new(0), largest: Cell::new(0) }
    };
}

/// Set by the first allocation made through [`CountingAlloc`].
static INSTALLED: AtomicBool = AtomicBool::new(false);

impl CountingAlloc {
    /// Whether this allocator is the global one in this binary (it has served an allocation).
    /// A test that relies on the counts asserts this first: without it every count reads zero
    /// and a bound on them passes for nothing.
    pub fn is_installed() -> bool {
        INSTALLED.load(Ordering::Relaxed)
    }

    fn allocated(size: usize) {
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        // `try_with`: while a thread is torn down its slot may be gone; nothing is counted then.
        let _ = COUNTS.try_with(|counts| {
            let live = counts.live.get() + size;
            counts.live.set(live);
            counts.peak.set(counts.peak.get().max(live));
            counts.largest.set(counts.largest.get().max(size));
        });
    }

    fn freed(size: usize) {
        let _ = COUNTS.try_with(|counts| counts.live.set(counts.live.get().saturating_sub(size)));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract holds exactly as it does for `System`. The counting touches only the
// const-initialised thread-local above and an atomic, neither of which allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::allocated(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::allocated(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::freed(layout.size());
        // SAFETY: as above; `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as the new block made before the old one is freed, which is what a moving
        // reallocation holds at its peak.
        Self::allocated(new_size);
        Self::freed(layout.size());
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Bytes this thread has allocated and not yet freed.
pub fn live() -> usize {
    COUNTS.with(|counts| counts.live.get())
}

/// Runs `f` and returns its result and the most bytes this thread had allocated while it ran,
/// over what was live before it began.
pub fn peak_allocated<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = live();
    COUNTS.with(|counts| counts.peak.set(base));
    let out = f();
    let peak = COUNTS.with(|counts| counts.peak.get());
    (out, peak - base)
}

/// Runs `f` and returns its result, still alive, and the bytes this thread allocated while
/// `f` ran and had not freed when it returned: what the result holds.
pub fn retained_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = live();
    let out = f();
    (out, live().saturating_sub(base))
}

/// Forgets this thread's largest allocation, so [`largest`] counts from here. For code that
/// awaits in between (where [`peak_allocated`]'s closure does not fit), bracket it with
/// `reset_largest()` and `largest()` on the same thread.
pub fn reset_largest() {
    COUNTS.with(|counts| counts.largest.set(0));
}

/// The largest single allocation (or reallocation's new size) this thread has made since
/// [`reset_largest`].
pub fn largest() -> usize {
    COUNTS.with(|counts| counts.largest.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOCATOR: CountingAlloc = CountingAlloc;

    #[test]
    fn a_thread_counts_only_its_own_allocations() {
        let (_, peak) = peak_allocated(|| {
            std::thread::spawn(|| drop(std::hint::black_box(vec![0u8; 1 << 20])))
                .join()
                .unwrap();
        });
        assert!(CountingAlloc::is_installed());
        assert!(peak < 1 << 20, "{peak}");
        let (_, peak) = peak_allocated(|| drop(std::hint::black_box(vec![0u8; 1 << 20])));
        assert!(peak >= 1 << 20, "{peak}");
    }

    #[test]
    fn a_reallocation_holds_both_blocks_at_its_peak_and_then_only_the_new_one() {
        let mut buffer = std::hint::black_box(Vec::<u8>::with_capacity(1000));
        let before = live();
        reset_largest();
        // The old block was live before; at the peak the whole new one is live beside it.
        let ((), peak) = peak_allocated(|| buffer.reserve_exact(5000));
        assert_eq!(buffer.capacity(), 5000);
        assert_eq!(peak, 5000);
        assert_eq!(largest(), 5000);
        assert_eq!(live() - before, 4000);
        drop(buffer);
        assert_eq!(before - live(), 1000);
    }
}
