//! Proof that `airlock-codec` builds and links without `std`.
//!
//! This crate is `#![no_std]` and defines its own `#[panic_handler]` and `#[global_allocator]`.
//! If anything in its dependency graph links `std` (an `extern crate std`, a dependency's
//! `std` feature switched on), `std`'s own panic handler collides with the one below and the
//! build fails with `error[E0152]: found duplicate lang item 'panic_impl'`. `cargo xtask test`
//! builds it: `cargo build --locked --manifest-path nostd-check/Cargo.toml --release`.
//!
//! It is a `staticlib`, not a binary, so nothing has to be linked against a C runtime: the
//! lang-item check happens when rustc compiles this crate, for the host target, with no extra
//! toolchain component. The exported function is never called; it exists so the typed and
//! dynamic decoders are monomorphised and compiled here.

#![no_std]
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::panic::PanicInfo;
use core::sync::atomic::{AtomicUsize, Ordering};

use airlock_codec::{from_slice, to_vec, Limits, Value};

/// A message shape decoded through the typed path.
#[derive(serde::Serialize, serde::Deserialize)]
struct Reply {
    id: u64,
    name: String,
    tags: Vec<String>,
}

/// Decodes a typed reply and a dynamic value, re-encodes both, and returns how many bytes
/// that produced (0 if a decode failed).
#[no_mangle]
pub extern "C" fn airlock_nostd_check() -> usize {
    let limits = Limits::default().max_depth(8).max_items(64).max_len(64);
    let typed = [7, 5, b's', b'e', b'v', b'e', b'n', 1, 3, b'o', b'd', b'd'];
    let dynamic = [0x08, 0x02, 0x04, 0x07, 0x06, 0x01, b'x'];
    let Ok(reply) = from_slice::<Reply>(&typed, &limits) else {
        return 0;
    };
    let Ok(value) = Value::from_slice(&dynamic, &limits) else {
        return 0;
    };
    to_vec(&reply).map_or(0, |bytes| bytes.len()) + value.to_vec().len()
}

#[panic_handler]
fn panic(_: &PanicInfo<'_>) -> ! {
    loop {
        core::hint::spin_loop();
    }
}

const HEAP_SIZE: usize = 64 * 1024;

/// A bump allocator over a static array: allocation moves a cursor, deallocation is a no-op.
struct Bump {
    heap: UnsafeCell<[u8; HEAP_SIZE]>,
    next: AtomicUsize,
}

// SAFETY: the only shared mutable state is `next`, which is atomic; each successful `alloc`
// hands out a range of `heap` that no other call ever returns, so no two threads touch the
// same bytes through this allocator.
unsafe impl Sync for Bump {}

// SAFETY: `alloc` returns either null or a pointer to `layout.size()` bytes inside `heap`,
// aligned to `layout.align()`, reserved by a compare-exchange so ranges never overlap;
// `dealloc` releases nothing, which is always sound.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let base = self.heap.get() as usize;
        let mut current = self.next.load(Ordering::Relaxed);
        loop {
            let Some(start) = (base + current).checked_next_multiple_of(layout.align()) else {
                return core::ptr::null_mut();
            };
            let offset = start - base;
            let Some(end) = offset
                .checked_add(layout.size())
                .filter(|&end| end <= HEAP_SIZE)
            else {
                return core::ptr::null_mut();
            };
            match self.next.compare_exchange_weak(
                current,
                end,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                // SAFETY: `offset + size <= HEAP_SIZE`, so the result stays inside `heap`.
                Ok(_) => return unsafe { self.heap.get().cast::<u8>().add(offset) },
                Err(actual) => current = actual,
            }
        }
    }

    unsafe fn dealloc(&self, _: *mut u8, _: Layout) {}
}

#[global_allocator]
static ALLOCATOR: Bump = Bump {
    heap: UnsafeCell::new([0; HEAP_SIZE]),
    next: AtomicUsize::new(0),
};
