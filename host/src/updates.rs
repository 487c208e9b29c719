//! Where a streaming call's updates wait for their caller, and the budget that bounds them.
//!
//! The reader decodes each `Progress` frame where it is accepted and hands the update to its
//! caller's channel at once. What callers have not taken yet is bounded per worker process,
//! not per call, by what one response could decode to ([`Cost::of_update`]): at most the
//! host's `max_frame` bytes of frame bodies, values' own sizes and channel slots (so a
//! one-byte update of a 4 KiB type is charged 4 KiB), and at most the response budget's
//! `max_items` items, each update one item and its sequence elements and map entries one each
//! (so a frame of a million empty strings is charged a million `String`s, not a million
//! bytes). What a `Box` in an update points to is bounded as in a response, by the items: at
//! most `max_items` updates are held. Past either cap the reader waits for a caller to take
//! an update before it reads the worker's next frame (backpressure on that worker alone),
//! holding the one decoded update that did not fit. So no worker can make the host hold more
//! than two responses' worth of them, and small updates hold nothing up until about
//! `max_frame / 64` of them are untaken (some 270,000 progress-bar `u32`s at the default).
//!
//! A lost worker's updates stay charged to its own budget until their callers take or drop
//! them: they never hold up its successor, and the restart policy bounds how many lost
//! workers a host can have.

use std::any::Any;
use std::sync::Arc;
use std::sync::Mutex;

use tokio::sync::{mpsc, Notify};

use crate::supervisor::Decode;

/// What one held update costs its worker's budget, in bytes and items.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cost {
    pub(crate) bytes: usize,
    pub(crate) items: usize,
}

/// What holding any update costs besides its value: its slot in the caller's channel, and the
/// allocator's header on the boxed value.
const HELD_UPDATE_OVERHEAD: usize = std::mem::size_of::<Delivered>() + 16;

impl Cost {
    /// An update of type `T` decoded from `body_len` bytes into a value holding `items`
    /// elements and entries. Charged as a response's decoding is bounded, and never zero:
    /// bytes for the frame's body (which bounds the value's strings and byte strings), the
    /// value's own size and its place in the channel, so that a one-byte update of a large
    /// type is charged that type's size; and items for its elements plus one for the update
    /// itself, as one element of a list of updates would be.
    pub(crate) fn of_update<T>(body_len: usize, items: usize) -> Self {
        Cost {
            bytes: body_len
                .saturating_add(std::mem::size_of::<T>())
                .saturating_add(HELD_UPDATE_OVERHEAD),
            items: items.saturating_add(1),
        }
    }

    fn fits_under(self, cap: Cost) -> bool {
        self.bytes <= cap.bytes && self.items <= cap.items
    }

    fn plus(self, other: Cost) -> Cost {
        Cost {
            bytes: self.bytes.saturating_add(other.bytes),
            items: self.items.saturating_add(other.items),
        }
    }
}

/// One worker process's budget for updates its callers have not taken yet.
#[derive(Debug)]
pub(crate) struct UpdateBudget {
    held: Mutex<Cost>,
    cap: Cost,
    freed: Notify,
}

impl UpdateBudget {
    /// A budget of `cap` bytes and items.
    pub(crate) fn new(cap: Cost) -> Arc<Self> {
        Arc::new(Self {
            held: Mutex::new(Cost::default()),
            cap,
            freed: Notify::new(),
        })
    }

    /// Takes `cost` from the budget, waiting while it would take either quantity past its cap
    /// (an update larger than the whole cap waits until nothing else is held).
    pub(crate) async fn take(&self, cost: Cost) {
        loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            {
                let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
                if *held == Cost::default() || held.plus(cost).fits_under(self.cap) {
                    *held = held.plus(cost);
                    return;
                }
            }
            freed.await;
        }
    }

    /// Gives `cost` back: an update was taken, or dropped untaken.
    pub(crate) fn give_back(&self, cost: Cost) {
        {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            held.bytes -= cost.bytes;
            held.items -= cost.items;
        }
        self.freed.notify_waiters();
    }

    /// What callers have not taken yet.
    #[cfg(test)]
    pub(crate) fn held(&self) -> Cost {
        *self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An update on its way to its caller, holding its share of its worker's budget until taken.
pub(crate) struct Delivered {
    pub(crate) update: Box<dyn Any + Send>,
    cost: Cost,
    budget: Arc<UpdateBudget>,
}

impl Delivered {
    pub(crate) fn new(update: Box<dyn Any + Send>, cost: Cost, budget: Arc<UpdateBudget>) -> Self {
        Self {
            update,
            cost,
            budget,
        }
    }
}

impl Drop for Delivered {
    fn drop(&mut self) {
        self.budget.give_back(self.cost);
    }
}

/// Where a streaming call's updates go: decoded (to the method's progress type) by the reader
/// where each `Progress` frame is accepted, then sent to the caller.
#[derive(Clone)]
pub(crate) struct Updates {
    pub(crate) decode: Decode,
    pub(crate) sender: mpsc::UnboundedSender<Delivered>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::task::{Context, Waker};

    /// Whether `take(cost)` completes at once; one abandoned while it waits takes nothing.
    fn takes_now(budget: &UpdateBudget, cost: Cost) -> bool {
        std::pin::pin!(budget.take(cost))
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    #[test]
    fn untaken_updates_are_charged_their_items_not_only_their_bytes() {
        let budget = UpdateBudget::new(Cost {
            bytes: 1000,
            items: 10,
        });
        // Few bytes, many items: a frame of empty strings.
        let wide = Cost { bytes: 3, items: 8 };
        assert!(takes_now(&budget, wide), "an empty budget takes anything");
        assert!(
            !takes_now(&budget, wide),
            "16 items held would pass the cap of 10, however few the bytes"
        );
        assert_eq!(budget.held(), wide, "the abandoned take took nothing");
        budget.give_back(wide);
        assert!(takes_now(&budget, wide), "taking the first makes room");
    }

    #[test]
    fn an_update_is_charged_its_size_and_one_item_however_few_bytes_carry_it() {
        // A `None` of a 4 KiB type is one byte on the wire.
        let cost = Cost::of_update::<Option<[u64; 512]>>(1, 0);
        assert!(cost.bytes > 4096, "{cost:?}");
        assert_eq!(cost.items, 1);
        // Even an empty update of a zero-sized type holds a slot.
        let unit = Cost::of_update::<()>(0, 0);
        assert!(unit.bytes >= std::mem::size_of::<Delivered>() && unit.items == 1);
        // A list's elements are items besides the update.
        assert_eq!(Cost::of_update::<Vec<String>>(3, 1000).items, 1001);
    }

    #[test]
    fn an_update_over_the_whole_cap_waits_until_nothing_is_held() {
        let budget = UpdateBudget::new(Cost {
            bytes: 10,
            items: 10,
        });
        let small = Cost { bytes: 1, items: 1 };
        let huge = Cost {
            bytes: 50,
            items: 0,
        };
        assert!(takes_now(&budget, small));
        assert!(!takes_now(&budget, huge));
        budget.give_back(small);
        assert!(takes_now(&budget, huge));
        assert_eq!(budget.held(), huge);
    }
}
