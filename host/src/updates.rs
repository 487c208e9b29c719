//! Where a streaming call's updates wait for their caller, and the budget that bounds them.
//!
//! The reader decodes each `Progress` frame where it is accepted and hands the update to its
//! caller's channel at once. What callers have not taken yet is bounded per worker by bytes,
//! not per call by count: a worker's undelivered updates may total at most its `max_frame`
//! (the frames' bytes, which bound what decoding them made). Past that the reader waits for a
//! caller to take one before it reads the worker's next frame (backpressure on that worker
//! alone), so small updates, such as a progress bar's, never hold anything up, and no worker
//! can make the host hold more than one frame's worth of them.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, Notify};

use crate::supervisor::Decode;

/// One worker's budget for updates its callers have not taken yet.
#[derive(Debug)]
pub(crate) struct UpdateBudget {
    held: AtomicUsize,
    cap: usize,
    freed: Notify,
}

impl UpdateBudget {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            held: AtomicUsize::new(0),
            cap,
            freed: Notify::new(),
        })
    }

    /// Takes `size` bytes of the budget, waiting while they would take it past its cap (an
    /// update larger than the whole cap waits until nothing else is held).
    pub(crate) async fn take(&self, size: usize) {
        loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            let held = self.held.load(Ordering::Acquire);
            if held == 0 || held + size <= self.cap {
                if self
                    .held
                    .compare_exchange(held, held + size, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            freed.await;
        }
    }

    /// Gives `size` bytes back: an update was taken, or dropped untaken.
    pub(crate) fn give_back(&self, size: usize) {
        self.held.fetch_sub(size, Ordering::AcqRel);
        self.freed.notify_waiters();
    }
}

/// An update on its way to its caller, holding its share of its worker's budget until taken.
pub(crate) struct Delivered {
    pub(crate) update: Box<dyn Any + Send>,
    size: usize,
    budget: Arc<UpdateBudget>,
}

impl Delivered {
    pub(crate) fn new(update: Box<dyn Any + Send>, size: usize, budget: Arc<UpdateBudget>) -> Self {
        Self {
            update,
            size,
            budget,
        }
    }
}

impl Drop for Delivered {
    fn drop(&mut self) {
        self.budget.give_back(self.size);
    }
}

/// Where a streaming call's updates go: decoded (to the method's progress type) by the reader
/// where each `Progress` frame is accepted, then sent to the caller.
#[derive(Clone)]
pub(crate) struct Updates {
    pub(crate) decode: Decode,
    pub(crate) sender: mpsc::UnboundedSender<Delivered>,
}
