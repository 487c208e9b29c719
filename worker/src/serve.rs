//! The serving loop: one task owns the [`WorkerSession`], reads frames, runs calls and writes
//! replies.
//!
//! ```text
//!   events ──▶ transmit ──▶ wait for: a frame │ a call finishing │ the write in flight
//! ```
//!
//! No reader or writer task: the loop reads the transport itself (`recv` is cancel-safe) and
//! writes through [`Outgoing`], which completes a write on the spot when the pipe has room. A
//! call whose handler finishes on its first poll (most do) is answered inline, in the same
//! turn that received it; only a handler that has to wait becomes a task of its own.

use std::collections::HashMap;
use std::sync::Arc;

use airlock_codec::Limits;
use airlock_protocol::transport::{FrameReceiver, Outgoing, Transport};
use airlock_protocol::{
    BuildIdHasher, CallId, CloseReason, ErrorKind, RemoteError, ReplyError, TransportError,
    WorkerConfig, WorkerEvent, WorkerSession,
};
use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinSet};

use crate::handler::{ErasedHandler, Reply};
use crate::progress::{CallContext, Update, UPDATE_QUEUE};
use crate::ServeError;
use tokio::sync::mpsc;

/// Largest request body whose handler is first polled inline, on the serving loop. Decoding a
/// larger body, which a handler does before its first `.await`, would hold up every other
/// call's reading and writing: such a call starts in a task of its own.
const INLINE_BODY: usize = 64 * 1024;

/// Everything the loop needs besides the transport.
pub(crate) struct ServeSpec {
    pub(crate) config: WorkerConfig,
    pub(crate) methods: HashMap<String, ErasedHandler>,
    pub(crate) max_concurrency: usize,
    /// Budgets for decoding requests; `None`: the default budgets, with bytes and lengths
    /// raised to the host's `max_frame` once it is known.
    pub(crate) limits: Option<Limits>,
    /// The low-latency spin window, if the host asked for one (`airlock_protocol::spin`).
    pub(crate) spin: Option<std::time::Duration>,
}

pub(crate) async fn serve_on<T: Transport>(
    spec: ServeSpec,
    transport: T,
) -> Result<(), ServeError> {
    let (sender, mut receiver) = transport.split();
    let mut outgoing = Outgoing::new(Box::new(sender));
    let mut outbox = outgoing.take_buffer();
    let mut session = WorkerSession::new(&spec.config);
    let (updates, mut pending_updates) = mpsc::channel(UPDATE_QUEUE);
    let mut calls = Calls::new(spec.methods, spec.max_concurrency, updates);
    let chosen = spec.limits;
    let mut limits = chosen.unwrap_or_default();
    let spin = spec.spin;
    // Spinning runs from the last input until the window closes.
    let mut spin_until: Option<std::time::Instant> = None;
    let outcome = loop {
        // Apply what the session decided (which may answer calls inline), then write
        // everything it produced in one batch, before waiting for more input.
        if let Some(end) = handle_events(
            &mut session,
            &mut calls,
            &mut limits,
            chosen.is_some(),
            &mut receiver,
            &mut pending_updates,
        ) {
            break end;
        }
        outbox.extend(std::iter::from_fn(|| session.poll_transmit()));
        if !outbox.is_empty() && !outgoing.is_busy() {
            let batch = std::mem::replace(&mut outbox, outgoing.take_buffer());
            if let Some(Err(err)) = outgoing.start(batch).await {
                break Err(ServeError::Connection(err));
            }
        }
        if session.is_drained() && outbox.is_empty() && !outgoing.is_busy() {
            break Ok(());
        }
        let spinning = spin_until.is_some_and(|until| std::time::Instant::now() < until);
        tokio::select! {
            biased;
            incoming = receiver.recv() => match incoming {
                Ok(Some(frame)) => {
                    spin_until = spin.map(|window| std::time::Instant::now() + window);
                    session.handle_frame(frame)
                }
                // End of stream, or a stream the host broke: either way the host is gone.
                Ok(None) | Err(TransportError::Frame(_)) => session.handle_eof(),
                Err(err) => break Err(ServeError::Connection(err)),
            },
            Some((id, reply)) = calls.next_finished() => {
                answer(&mut session, id, reply, &mut pending_updates);
            }
            Some((id, body)) = pending_updates.recv() => send_update(&mut session, id, body),
            // Low-latency mode: nothing is ready yet; go round again instead of sleeping, so
            // the runtime polls the channel without a wake-up, until the window closes.
            () = tokio::task::yield_now(), if spinning => continue,
            written = outgoing.finish() => if let Err(err) = written {
                break Err(ServeError::Connection(err));
            },
        }
    };
    // Flush what is left (the last replies), then close our side.
    outbox.extend(std::iter::from_fn(|| session.poll_transmit()));
    let flushed = async {
        if outgoing.is_busy() {
            outgoing.finish().await?;
        }
        if !outbox.is_empty() {
            if let Some(written) = outgoing.start(outbox).await {
                written?;
            }
        }
        outgoing.close().await
    };
    let _ = flushed.await;
    calls.abort_all();
    outcome
}

/// Sends a handler's progress update. One the session refuses (over the frame cap, a call
/// already cancelled) is dropped: the handler's quota was checked when it sent it, and a
/// cancelled call's updates are nobody's business.
fn send_update(session: &mut WorkerSession, id: CallId, body: Bytes) {
    let _ = session.reply_progress(id, body);
}

/// Sends a finished call's one terminal frame, after every update its handler sent (they are
/// queued before the handler returns, so draining the queue first keeps them ahead of the
/// answer). A response the session cannot send (larger than the host's `max_frame`) becomes a
/// `Fail`: a call is never left unanswered.
fn answer(
    session: &mut WorkerSession,
    id: CallId,
    reply: Reply,
    pending_updates: &mut mpsc::Receiver<Update>,
) {
    while let Ok((update_id, body)) = pending_updates.try_recv() {
        send_update(session, update_id, body);
    }
    let refused = match reply {
        Ok(body) => match session.reply_return(id, body) {
            Err(ReplyError::TooLarge { len, max }) => Some(RemoteError::new(
                ErrorKind::Limit,
                &format!(
                    "the response is {len} bytes, too large for the host's frame limit of {max} \
                     bytes (HostConfig::max_frame, set with HostBuilder::protocol)"
                ),
            )),
            _ => None,
        },
        Err(error) => {
            let _ = session.reply_fail(id, &error);
            None
        }
    };
    if let Some(error) = refused {
        let _ = session.reply_fail(id, &error);
    }
}

/// Applies the session's events; `Some` when serving should stop with that result.
fn handle_events(
    session: &mut WorkerSession,
    calls: &mut Calls,
    limits: &mut Limits,
    chosen_limits: bool,
    receiver: &mut impl FrameReceiver,
    pending_updates: &mut mpsc::Receiver<Update>,
) -> Option<Result<(), ServeError>> {
    while let Some(event) = session.poll_event() {
        match event {
            WorkerEvent::Welcomed(welcome) => {
                // Frames behind the Welcome may be as large as it allows; the receiver has
                // not looked at their prefixes yet, and adopts the cap before it does.
                receiver.set_max_frame(welcome.max_frame);
                calls.progress_quota = welcome.max_progress_per_call;
                if !chosen_limits {
                    *limits = Limits::default()
                        .max_bytes(welcome.max_frame as usize)
                        .max_len(welcome.max_frame as usize);
                }
            }
            WorkerEvent::Call { id, method, body } => {
                if let Some(reply) = calls.start(id, method.as_str(), body, limits) {
                    answer(session, id, reply, pending_updates);
                }
            }
            WorkerEvent::Cancel { id } => calls.cancel(id),
            WorkerEvent::Shutdown => {}
            WorkerEvent::Closed(reason) => {
                return Some(match reason {
                    CloseReason::Shutdown | CloseReason::WorkerClosed => Ok(()),
                    CloseReason::Refused(r) => Err(ServeError::Refused(r)),
                    CloseReason::Violation(v) => Err(ServeError::Violation(v)),
                    _ => Ok(()),
                });
            }
            _ => {}
        }
    }
    None
}

/// The calls running in this worker, bounded by a semaphore: answered inline when their
/// handler is ready at once, else one task each.
struct Calls {
    methods: HashMap<String, ErasedHandler>,
    permits: Arc<Semaphore>,
    tasks: JoinSet<(CallId, Reply)>,
    /// Task id → call id, to answer a call whose task panicked or was aborted.
    by_task: HashMap<tokio::task::Id, CallId, BuildIdHasher>,
    handles: HashMap<CallId, AbortHandle, BuildIdHasher>,
    /// Where handlers send their progress updates.
    updates: mpsc::Sender<Update>,
    /// The host's `max_progress_per_call` (none before its `Welcome`).
    progress_quota: u32,
}

impl Calls {
    fn new(
        methods: HashMap<String, ErasedHandler>,
        max_concurrency: usize,
        updates: mpsc::Sender<Update>,
    ) -> Self {
        Self {
            updates,
            progress_quota: 0,
            methods,
            permits: Arc::new(Semaphore::new(max_concurrency.max(1))),
            tasks: JoinSet::new(),
            by_task: HashMap::default(),
            handles: HashMap::default(),
        }
    }

    /// Starts call `id`. `Some` when it is answered already: no such method, or a handler
    /// that finished (or panicked) on its first poll, run inline with a free permit for a body
    /// of at most [`INLINE_BODY`]. Otherwise the call becomes a task, and
    /// [`next_finished`](Self::next_finished) yields its reply.
    fn start(&mut self, id: CallId, method: &str, body: Bytes, limits: &Limits) -> Option<Reply> {
        let Some(handler) = self.methods.get(method) else {
            return Some(Err(RemoteError::new(
                ErrorKind::UnknownMethod,
                &format!("this worker serves no method named {method:?}"),
            )));
        };
        let handler = Arc::clone(handler);
        let limits = *limits;
        let context = CallContext {
            id,
            updates: self.updates.clone(),
            quota: self.progress_quota,
        };
        // The permit travels with the handler (a blocking one keeps it on its thread even
        // after its task is aborted), so `max_concurrency` bounds what really runs.
        let permit = if body.len() <= INLINE_BODY {
            Arc::clone(&self.permits).try_acquire_owned().ok()
        } else {
            None
        };
        let Some(permit) = permit else {
            // A large body, or every slot taken: the call waits for a slot in a task of its
            // own. The semaphore is closed only when the loop ends, and then nobody awaits
            // this task.
            let permits = Arc::clone(&self.permits);
            self.spawn(id, async move {
                match permits.acquire_owned().await {
                    Ok(permit) => handler(body, limits, permit, context).await,
                    Err(_) => Err(RemoteError::new(ErrorKind::Internal, "worker stopping")),
                }
            });
            return None;
        };
        let mut future = handler(body, limits, permit, context);
        // One poll here, with a waker that does nothing: a handler that is ready at once is
        // answered now; one that is not is moved into its task, whose first poll registers
        // the task's own waker (every poll must), so no wake-up is lost.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            future.as_mut().poll(&mut cx)
        }));
        match polled {
            Ok(std::task::Poll::Ready(reply)) => {
                let _ =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(future)));
                Some(reply)
            }
            Ok(std::task::Poll::Pending) => {
                self.spawn(id, future);
                None
            }
            Err(payload) => {
                // Dropped here, under the same guard: a future whose drop panics too must not
                // take the serving loop with it.
                let _ =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(future)));
                Some(Err(RemoteError::new(
                    ErrorKind::Panic,
                    &panic_message(payload),
                )))
            }
        }
    }

    fn spawn(
        &mut self,
        id: CallId,
        call: impl std::future::Future<Output = Reply> + Send + 'static,
    ) {
        let handle = self.tasks.spawn(async move { (id, call.await) });
        self.by_task.insert(handle.id(), id);
        self.handles.insert(id, handle);
    }

    fn cancel(&mut self, id: CallId) {
        if let Some(handle) = self.handles.get(&id) {
            handle.abort();
        }
    }

    /// The next call to finish, with its reply; a panic or an abort becomes a `Fail`.
    async fn next_finished(&mut self) -> Option<(CallId, Reply)> {
        let joined = self.tasks.join_next_with_id().await?;
        let (task, result) = match joined {
            Ok((task, (id, reply))) => (task, Ok((id, reply))),
            Err(err) => (err.id(), Err(err)),
        };
        let id = self.by_task.remove(&task)?;
        self.handles.remove(&id);
        Some(match result {
            Ok(done) => done,
            Err(err) if err.is_panic() => {
                let message = panic_message(err.into_panic());
                (id, Err(RemoteError::new(ErrorKind::Panic, &message)))
            }
            Err(_) => (
                id,
                Err(RemoteError::new(
                    ErrorKind::Cancelled,
                    "cancelled by the host",
                )),
            ),
        })
    }

    fn abort_all(&mut self) {
        self.tasks.abort_all();
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => format!("handler panicked: {s}"),
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => format!("handler panicked: {s}"),
            Err(_) => "handler panicked".into(),
        },
    }
}
