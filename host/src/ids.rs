//! The randomness of call ids: OS randomness drawn a page at a time, in a page that `fork`
//! wipes.
//!
//! Every call id is 16 bytes of the OS's CSPRNG (`PROTOCOL.md`: ids are unpredictable to the
//! worker). Drawing them one `getrandom` at a time costs a system call per call; drawing
//! 4,080 bytes at once serves 255 calls per system call. The rule that makes a buffer safe is
//! that no two processes ever take bytes from the same copy of it: a host used on both sides
//! of a `fork` would otherwise send the same ids in the same order
//! (`invariant_04_ids_stay_fresh_on_both_sides_of_a_fork`). So the buffer lives in a
//! [`WipeOnForkPage`], which a child gets zeroed. Each thread has its own page (no lock a fork
//! could leave held); where the kernel lacks `MADV_WIPEONFORK`, every id is one `getrandom`.
//!
//! The page starts with a *live* marker, written before any random byte goes in and read
//! again after the id is taken. A zero marker means the page was wiped: before the draw, it
//! is refilled; during it (a signal handler forked in the middle, and this is the child), the
//! draw starts over, since what it took may be the parent's and the count it wrote is stale.
//! Bytes are zeroed as they are handed out, so the page never holds an id already used.

use std::cell::RefCell;

use rand_core::{CryptoRng, RngCore};

use crate::sys::{WipeOnForkPage, WIPED_PAGE};

/// The marker (the page's first 8 bytes, see [`WipeOnForkPage::split`]) of a page this
/// process filled; zero in a page new or wiped by a fork.
const LIVE: u64 = 0x6169_726c_6f63_6b21;
/// The 8 bytes after the marker: how many random bytes are still unused (little-endian).
const COUNT: usize = 8;
/// The random bytes (255 ids): the first `count` of them are unused.
const POOL: usize = WIPED_PAGE - 8 - COUNT;

thread_local! {
    /// This thread's pool: `None` before its first id, and where the kernel cannot wipe pages
    /// on fork (then ids come straight from the OS).
    static PAGE: RefCell<Option<Option<WipeOnForkPage>>> = const { RefCell::new(None) };
}

/// The CSPRNG that call ids are drawn from: the OS's, through this thread's fork-wiped pool.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CallIdRng;

impl RngCore for CallIdRng {
    fn next_u32(&mut self) -> u32 {
        rand_core::impls::next_u32_via_fill(self)
    }

    fn next_u64(&mut self) -> u64 {
        rand_core::impls::next_u64_via_fill(self)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        let pooled = PAGE.try_with(|page| {
            let mut page = page.borrow_mut();
            match page.get_or_insert_with(|| WipeOnForkPage::new().ok()) {
                Some(page) if dest.len() <= POOL => {
                    take(page, dest);
                    true
                }
                _ => false,
            }
        });
        // No pool (the thread is ending, or the kernel cannot wipe pages): the OS directly.
        if pooled != Ok(true) {
            os_random(dest);
        }
    }
}

impl CryptoRng for CallIdRng {}

/// Fills `dest` (at most [`POOL`] bytes) from the page's unused bytes, refilling them from the
/// OS first if the page is not live or too few are left, and zeroes the bytes taken.
fn take(page: &mut WipeOnForkPage, dest: &mut [u8]) {
    let (mut marker, rest) = page.split();
    let (count, pool) = rest.split_at_mut(COUNT);
    loop {
        let mut unused = if marker.get() == LIVE {
            let mut unused = [0u8; COUNT];
            unused.copy_from_slice(count);
            // Anything larger than the pool is not a count this code wrote: treat it as empty.
            usize::try_from(u64::from_le_bytes(unused))
                .ok()
                .filter(|&n| n <= pool.len())
                .unwrap_or(0)
        } else {
            // Live from before the first random byte goes in: a wipe from here on shows.
            marker.set(LIVE);
            0
        };
        if unused < dest.len() {
            os_random(pool);
            unused = pool.len();
        }
        let from = unused - dest.len();
        if let Some(taken) = pool.get_mut(from..unused) {
            dest.copy_from_slice(taken);
            taken.fill(0);
        }
        count.copy_from_slice(&(from as u64).to_le_bytes());
        if marker.get() == LIVE {
            return;
        }
    }
}

/// The OS's randomness. A host that cannot draw any cannot make a call id that a worker could
/// not guess: it stops here rather than send a predictable one.
fn os_random(dest: &mut [u8]) {
    if let Err(err) = getrandom::fill(dest) {
        panic!("the operating system's random source failed: {err}");
    }
}

/// The address of this thread's pool page, made if need be (for `sys`'s fork test).
#[cfg(test)]
pub(crate) fn this_threads_page() -> usize {
    CallIdRng.fill_bytes(&mut [0u8; 16]);
    PAGE.with(|page| {
        let mut page = page.borrow_mut();
        let page = page.as_mut().and_then(Option::as_mut).expect("a pool page");
        page.split().1.as_mut_ptr() as usize - 8
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_drawn_through_the_pool_are_distinct_and_leave_no_copy_in_the_page() {
        let mut rng = CallIdRng;
        let mut seen = std::collections::HashSet::new();
        // More than one page's worth, so the pool refills on the way.
        for _ in 0..3 * (POOL / 16) + 1 {
            let mut id = [0u8; 16];
            rng.fill_bytes(&mut id);
            assert!(seen.insert(id), "an id came out twice");
        }
        PAGE.with(|page| {
            let mut page = page.borrow_mut();
            let page = page.as_mut().and_then(Option::as_mut).expect("a pool page");
            let (marker, rest) = page.split();
            assert_eq!(marker.get(), LIVE);
            let (count, pool) = rest.split_at(COUNT);
            let unused = u64::from_le_bytes(count.try_into().unwrap()) as usize;
            assert!(unused < POOL, "nothing was taken from the last refill");
            assert!(
                pool[unused..].iter().all(|b| *b == 0),
                "bytes handed out are still in the page"
            );
            assert!(
                pool[..unused].iter().any(|b| *b != 0),
                "the unused bytes are not random"
            );
        });
    }

    #[test]
    fn a_request_larger_than_the_pool_comes_straight_from_the_os() {
        let mut big = vec![0u8; POOL + 1];
        CallIdRng.fill_bytes(&mut big);
        assert!(big.iter().filter(|b| **b == 0).count() < big.len() / 16);
    }
}
