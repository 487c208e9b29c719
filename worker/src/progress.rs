//! Progress updates from a running handler: typed values sent as `Progress` frames before the
//! call's answer.

use std::marker::PhantomData;

use airlock_protocol::CallId;
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::ProgressError;

/// Updates waiting for the serving loop, from every call. Small: a handler that outruns the
/// channel waits in [`Progress::send`] (backpressure), it never piles frames up in memory.
pub(crate) const UPDATE_QUEUE: usize = 16;

/// One encoded update and the call it belongs to.
pub(crate) type Update = (CallId, Bytes);

/// Where a call's handler sends its updates, and how many it may still send.
#[derive(Debug, Clone)]
pub(crate) struct CallContext {
    pub(crate) id: CallId,
    pub(crate) updates: mpsc::Sender<Update>,
    /// The host's `max_progress_per_call`, from its `Welcome`.
    pub(crate) quota: u32,
}

/// A streaming handler's sender of typed updates (see
/// [`Worker::streaming_method`](crate::Worker::streaming_method)).
///
/// Every update is encoded with the call's codec and reaches the host before the call's answer,
/// in the order sent. At most the host's `max_progress_per_call` updates are sent: one more is
/// refused here with [`ProgressError::QuotaExhausted`] (the host would take it as a violation).
#[derive(Debug)]
pub struct Progress<T> {
    context: CallContext,
    sent: u32,
    _update: PhantomData<fn(&T)>,
}

impl<T: Serialize> Progress<T> {
    pub(crate) fn new(context: CallContext) -> Self {
        Self {
            context,
            sent: 0,
            _update: PhantomData,
        }
    }

    /// Sends one update. Waits while the serving loop's queue of updates is full; fails if the
    /// update does not encode, if the call's quota is spent, or if the worker is stopping.
    pub async fn send(&mut self, update: &T) -> Result<(), ProgressError> {
        if self.sent >= self.context.quota {
            return Err(ProgressError::QuotaExhausted {
                max: self.context.quota,
            });
        }
        let body = airlock_codec::to_vec(update).map_err(ProgressError::Encode)?;
        self.context
            .updates
            .send((self.context.id, Bytes::from(body)))
            .await
            .map_err(|_| ProgressError::Closed)?;
        self.sent += 1;
        Ok(())
    }

    /// Updates sent so far.
    pub fn sent(&self) -> u32 {
        self.sent
    }
}
