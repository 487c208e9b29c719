//! Streaming calls: a [`Streaming`] method's progress updates, in order, then its answer.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::time::Instant;

use airlock_protocol::Streaming;
use tokio::sync::mpsc;

use crate::host::Due;
use crate::host::{decode_response, decode_update, Begun};
use crate::updates::{Delivered, Updates};
use crate::{CallError, Host, InProcess, Pool};

/// A streaming call in flight: take its updates with [`next`](Self::next), then its outcome
/// with [`result`](Self::result).
///
/// Every update was decoded by the budgeted codec where its frame was accepted (one that does
/// not decode ends the worker, and the call fails with `WorkerLost(UndecodableResponse)`). The
/// call's deadline and the per-call update quota (`HostConfig::max_progress_per_call`) hold as
/// for any call. Updates wait here for the caller; a worker's untaken updates may total at
/// most what one response may decode to (its `max_frame` in bytes, each update charged its
/// frame body, its value's own size and a slot of about 60 bytes; the response budget's
/// `max_items` in items, each update one and each of its elements one), beyond which the
/// host stops reading that worker until some are taken, and its other calls wait, bounded by
/// their deadlines. Small updates come near it only by the hundred thousand at the default
/// `max_frame`; at a small one, read streams promptly. Dropping it before the outcome
/// cancels the call.
///
/// ```no_run
/// use airlock_host::{method, Host};
/// method!(pub CountTo, "count_to", u32 => u32, progress u32);
/// # async fn demo(host: Host) -> Result<(), airlock_host::CallError> {
/// let mut call = host.call_streaming::<CountTo>(&3);
/// while let Some(step) = call.next().await {
///     println!("step {step}");
/// }
/// assert_eq!(call.result().await?, 3);
/// # Ok(()) }
/// ```
#[must_use = "a streaming call is cancelled when dropped"]
pub struct CallStream<'a, M: Streaming> {
    begun: Begun<'a, M::Response>,
    updates: Option<mpsc::UnboundedReceiver<Delivered>>,
    _method: PhantomData<fn() -> M>,
}

impl<M: Streaming> std::fmt::Debug for CallStream<'_, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallStream")
            .field("method", &M::NAME)
            .field("updates_open", &self.updates.is_some())
            .finish_non_exhaustive()
    }
}

impl<M: Streaming> CallStream<'_, M> {
    /// The next update, or `None` once the worker will send no more (the call is over, or was
    /// never sent): then take [`result`](Self::result).
    pub async fn next(&mut self) -> Option<M::Progress> {
        let updates = self.updates.as_mut()?;
        match updates.recv().await {
            // Taking it gives its bytes back to its worker's budget (when `delivered` drops).
            Some(mut delivered) => match std::mem::replace(&mut delivered.update, Box::new(()))
                .downcast::<M::Progress>()
            {
                Ok(update) => Some(*update),
                // Only this call's decoder fills its channel.
                Err(_) => None,
            },
            None => {
                self.updates = None;
                None
            }
        }
    }

    /// The call's outcome. Updates not yet taken are discarded.
    pub async fn result(mut self) -> Result<M::Response, CallError> {
        // Closed first: the reader never waits for a caller that has stopped listening.
        drop(self.updates.take());
        self.begun.finish().await
    }
}

impl Host {
    /// Calls the [`Streaming`] method `M` with the host's call deadline: its updates arrive as
    /// the worker sends them, then its outcome. See [`CallStream`].
    pub fn call_streaming<M: Streaming>(&self, request: &M::Request) -> CallStream<'_, M> {
        self.call_streaming_due::<M>(request, Due::After(self.call_timeout()))
    }

    /// Like [`call_streaming`](Self::call_streaming), which must finish by `deadline`.
    pub fn call_streaming_with_deadline<M: Streaming>(
        &self,
        request: &M::Request,
        deadline: Instant,
    ) -> CallStream<'_, M> {
        self.call_streaming_due::<M>(request, Due::By(deadline))
    }

    fn call_streaming_due<M: Streaming>(
        &self,
        request: &M::Request,
        due: Due,
    ) -> CallStream<'_, M> {
        const {
            assert!(
                airlock_protocol::is_valid_method_name(M::NAME),
                "Method::NAME must be 1-64 bytes of [A-Za-z0-9._-]"
            )
        };
        let when = due.starting_now();
        let (sender, receiver) = mpsc::unbounded_channel();
        let updates = Updates {
            decode: decode_update::<M::Progress>,
            sender,
        };
        let body = airlock_protocol::reuse::encode_body(request).map_err(CallError::Encode);
        let begun = self.begin_call(
            Cow::Borrowed(M::NAME),
            body,
            decode_response::<M::Response>,
            when,
            Some(updates),
        );
        CallStream {
            begun,
            updates: Some(receiver),
            _method: PhantomData,
        }
    }
}

impl Pool {
    /// Streams `M` on the least busy live worker, as [`Host::call_streaming`].
    pub fn call_streaming<M: Streaming>(
        &self,
        request: &M::Request,
    ) -> Result<CallStream<'_, M>, CallError> {
        Ok(self.pick()?.call_streaming::<M>(request))
    }
}

impl InProcess {
    /// Streams `M`, as [`Host::call_streaming`].
    pub fn call_streaming<M: Streaming>(&self, request: &M::Request) -> CallStream<'_, M> {
        self.host().call_streaming::<M>(request)
    }
}
