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
//! turn that received it; only a handler that has to wait becomes a task of its own. Blocking
//! handlers run on a pool thread each, bounded by `max_concurrency`; a process worker that runs
//! one handler at a time runs them on the loop's own thread (no thread hop at all).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_codec::Limits;
use airlock_protocol::spin::SpinPolicy;
use airlock_protocol::transport::{next_frame, FrameReceiver, Outgoing, Transport};
use airlock_protocol::{
    BuildIdHasher, CallId, CloseReason, ErrorKind, RemoteError, ReplyError, Transmit,
    TransportError, WorkerConfig, WorkerEvent, WorkerSession,
};
use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinSet};

use crate::handler::{
    join_blocking, AsyncHandler, BlockingHandler, CancelOnDrop, CancelToken, ErasedHandler, Reply,
};
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
    pub(crate) spin: Option<Duration>,
    /// Whether a blocking handler that does not watch its cancel token may run on the serving
    /// loop's own thread when its slot is free. Only for a process worker with
    /// `max_concurrency` 1: nothing else of the worker's could run beside the handler anyway,
    /// and no host runtime shares the thread (an in-process twin's loop runs on the host's).
    pub(crate) inline_blocking: bool,
}

pub(crate) async fn serve_on<T: Transport>(
    spec: ServeSpec,
    transport: T,
) -> Result<(), ServeError> {
    let (sender, mut receiver) = transport.split();
    let mut outgoing = Outgoing::new(Box::new(sender));
    outgoing.recycle_written_bodies();
    let mut outbox = outgoing.take_buffer();
    let mut session = WorkerSession::new(&spec.config);
    let (updates, mut pending_updates) = mpsc::channel(UPDATE_QUEUE);
    let mut calls = Calls::new(spec.methods, spec.max_concurrency, updates);
    calls.inline_blocking = spec.inline_blocking;
    let chosen = spec.limits;
    let mut limits = chosen.unwrap_or_default();
    // Spinning runs from the last input until the window closes, while it pays.
    let mut spin = spec.spin.map(Spin::new);
    let outcome = loop {
        calls.ran_on_loop = false;
        // Apply what the session decided (which may answer calls inline), then write
        // everything it produced in one batch, before waiting for more input.
        let mut applying = Applying {
            session: &mut session,
            calls: &mut calls,
            limits: &mut limits,
            chosen_limits: chosen.is_some(),
            receiver: &mut receiver,
            pending_updates: &mut pending_updates,
        };
        // A blocking handler may run on the loop's thread only when nothing waits to be
        // written: what the session queued so far joins the outbox first.
        outbox.extend(std::iter::from_fn(|| applying.session.poll_transmit()));
        if let Some(end) = applying.events(!outgoing.is_busy() && outbox.is_empty()) {
            break end;
        }
        // Pipelined calls: frames that are here already are applied now, so their answers
        // leave in the same write as this turn's.
        match gather(&mut applying, &mut outbox, outgoing.is_busy()) {
            Ok(0) => {}
            Ok(_) => Spin::frame_in(&mut spin),
            Err(end) => break end,
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
        let spinning = spin.as_mut().is_some_and(Spin::spinning);
        tokio::select! {
            biased;
            incoming = next_frame(&mut receiver) => match feed(&mut session, incoming) {
                Ok(true) => Spin::frame_in(&mut spin),
                Ok(false) => {}
                Err(err) => break Err(err),
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

/// The low-latency mode's state: each frame received opens a window to spin through while
/// the next one is awaited, where [`SpinPolicy`] finds that spinning pays.
struct Spin {
    window: Duration,
    policy: SpinPolicy,
}

impl Spin {
    fn new(window: Duration) -> Self {
        Self {
            window,
            policy: SpinPolicy::default(),
        }
    }

    /// Frames came in (if the mode is on).
    fn frame_in(spin: &mut Option<Self>) {
        if let Some(spin) = spin {
            let now = Instant::now();
            spin.policy.arrived(now);
            spin.policy.open(now, now + spin.window, now);
        }
    }

    fn spinning(&mut self) -> bool {
        self.policy.spinning(Instant::now())
    }
}

/// Most frames [`gather`] applies in one turn: enough that pipelined answers share writes, few
/// enough that a long run of them does not hold up the first answers.
const GATHER: usize = 64;

/// Hands the session what the receiver produced: `Ok(true)` for a frame, `Ok(false)` at the
/// end of the stream.
fn feed(
    session: &mut WorkerSession,
    incoming: Result<Option<Bytes>, TransportError>,
) -> Result<bool, ServeError> {
    match incoming {
        Ok(Some(frame)) => {
            session.handle_frame(frame);
            Ok(true)
        }
        // End of stream, or a stream the host broke: either way the host is gone.
        Ok(None) | Err(TransportError::Frame(_)) => {
            session.handle_eof();
            Ok(false)
        }
        Err(err) => Err(ServeError::Connection(err)),
    }
}

/// Applies up to [`GATHER`] more frames that need no waiting: decoded already, or readable at
/// once (`poll_recv` with a waker that does nothing; a frame not yet whole stays buffered).
/// What the session queued to send moves into `outbox` as it goes, so a blocking handler may
/// run on the loop only while that is empty and no write is in flight (`writing`): nothing
/// gathered so far then waits for it. It stops after such a handler ran, whose answer must
/// not wait either. Returns how many frames it applied, or how serving ends.
fn gather<R: FrameReceiver>(
    applying: &mut Applying<'_, R>,
    outbox: &mut Vec<Transmit>,
    writing: bool,
) -> Result<usize, Stop> {
    let mut frames = 0;
    while frames < GATHER && !applying.calls.ran_on_loop {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let std::task::Poll::Ready(incoming) = applying.receiver.poll_recv(&mut cx) else {
            break;
        };
        let was_frame = feed(applying.session, incoming).map_err(Err)?;
        outbox.extend(std::iter::from_fn(|| applying.session.poll_transmit()));
        if let Some(end) = applying.events(!writing && outbox.is_empty()) {
            return Err(end);
        }
        if !was_frame {
            break;
        }
        frames += 1;
    }
    Ok(frames)
}

/// How serving ends.
type Stop = Result<(), ServeError>;

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

/// The loop's state that applying the session's events touches.
struct Applying<'a, R> {
    session: &'a mut WorkerSession,
    calls: &'a mut Calls,
    limits: &'a mut Limits,
    chosen_limits: bool,
    receiver: &'a mut R,
    pending_updates: &'a mut mpsc::Receiver<Update>,
}

impl<R: FrameReceiver> Applying<'_, R> {
    /// Applies the session's events; `Some` when serving should stop with that result.
    /// `loop_free`: nothing is being or waiting to be written, so a blocking handler run on the
    /// loop's thread holds up nothing but its own answer.
    fn events(&mut self, loop_free: bool) -> Option<Stop> {
        while let Some(event) = self.session.poll_event() {
            match event {
                WorkerEvent::Welcomed(welcome) => {
                    // Frames behind the Welcome may be as large as it allows; the receiver has
                    // not looked at their prefixes yet, and adopts the cap before it does.
                    self.receiver.set_max_frame(welcome.max_frame);
                    self.calls.progress_quota = welcome.max_progress_per_call;
                    if !self.chosen_limits {
                        *self.limits = Limits::default()
                            .max_bytes(welcome.max_frame as usize)
                            .max_len(welcome.max_frame as usize);
                    }
                }
                WorkerEvent::Call { id, method, body } => {
                    let started =
                        self.calls
                            .start(id, method.as_str(), body, self.limits, loop_free);
                    if let Some(reply) = started {
                        answer(self.session, id, reply, self.pending_updates);
                    }
                }
                WorkerEvent::Cancel { id } => {
                    if let Some(reply) = self.calls.cancel(id) {
                        answer(self.session, id, reply, self.pending_updates);
                    }
                }
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
}

/// The calls running in this worker, bounded by a semaphore: answered inline when their
/// handler is ready at once, else one task (or, for a blocking handler, one pool thread) each.
struct Calls {
    methods: HashMap<String, ErasedHandler>,
    permits: Arc<Semaphore>,
    tasks: JoinSet<(CallId, Reply)>,
    /// Task id → call id, to answer a call whose task panicked or was aborted.
    by_task: HashMap<tokio::task::Id, CallId, BuildIdHasher>,
    handles: HashMap<CallId, AbortHandle, BuildIdHasher>,
    /// The cancel tokens of blocking handlers running on pool threads.
    tokens: HashMap<CallId, CancelToken, BuildIdHasher>,
    /// See [`ServeSpec::inline_blocking`].
    inline_blocking: bool,
    /// Whether a blocking handler ran on the loop's thread in this turn of the loop.
    ran_on_loop: bool,
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
            tokens: HashMap::default(),
            inline_blocking: false,
            ran_on_loop: false,
        }
    }

    /// Starts call `id`: `Some` with its reply when it is answered already (no such method, a
    /// handler that finished at once), `None` when it runs on and
    /// [`next_finished`](Self::next_finished) will yield its reply. `loop_free`: see
    /// [`Applying::events`].
    fn start(
        &mut self,
        id: CallId,
        method: &str,
        body: Bytes,
        limits: &Limits,
        loop_free: bool,
    ) -> Option<Reply> {
        let Some(handler) = self.methods.get(method) else {
            return Some(Err(RemoteError::new(
                ErrorKind::UnknownMethod,
                &format!("this worker serves no method named {method:?}"),
            )));
        };
        match handler.clone() {
            ErasedHandler::Async(handler) => self.start_async(id, handler, body, *limits),
            ErasedHandler::Blocking { run, watches_token } => {
                let on_loop = self.inline_blocking && loop_free && !watches_token;
                self.start_blocking(id, run, body, *limits, on_loop)
            }
        }
    }

    /// An async handler: run inline if it finishes on its first poll, with a free permit, for a
    /// body of at most [`INLINE_BODY`]; otherwise it becomes a task.
    fn start_async(
        &mut self,
        id: CallId,
        handler: AsyncHandler,
        body: Bytes,
        limits: Limits,
    ) -> Option<Reply> {
        let context = CallContext {
            id,
            updates: self.updates.clone(),
            quota: self.progress_quota,
        };
        // The permit travels with the handler, so `max_concurrency` bounds what really runs.
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
                    Err(_) => Err(stopping()),
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
        let reply = match polled {
            Ok(std::task::Poll::Ready(reply)) => reply,
            Ok(std::task::Poll::Pending) => {
                self.spawn(id, future);
                return None;
            }
            Err(payload) => Err(RemoteError::new(ErrorKind::Panic, &panic_message(payload))),
        };
        // Dropped under the same guard: a future whose drop panics must not take the serving
        // loop with it.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(future)));
        Some(reply)
    }

    /// A blocking handler: on this thread when `on_loop` and its slot is free, else on a pool
    /// thread of its own (after waiting in a task for a slot, if none is free). The permit moves
    /// onto that thread: a cancelled handler still runs there until it returns (early, if it
    /// watches its token), and still counts against `max_concurrency`.
    fn start_blocking(
        &mut self,
        id: CallId,
        run: BlockingHandler,
        body: Bytes,
        limits: Limits,
        on_loop: bool,
    ) -> Option<Reply> {
        let token = CancelToken::default();
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            let permits = Arc::clone(&self.permits);
            self.spawn(id, async move {
                // Cancels the token when this task goes, however it goes.
                let _cancel_on_drop = CancelOnDrop(token.clone());
                let Ok(permit) = permits.acquire_owned().await else {
                    return Err(stopping());
                };
                let on_thread = move || {
                    let _permit = permit;
                    run(&body, &limits, &token)
                };
                join_blocking(tokio::task::spawn_blocking(on_thread).await)
            });
            return None;
        };
        if on_loop {
            self.ran_on_loop = true;
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run(&body, &limits, &token)
            }));
            drop(permit);
            return Some(ran.unwrap_or_else(|payload| {
                Err(RemoteError::new(ErrorKind::Panic, &panic_message(payload)))
            }));
        }
        let on_thread = {
            let token = token.clone();
            move || {
                let _permit = permit;
                (id, run(&body, &limits, &token))
            }
        };
        let handle = self.tasks.spawn_blocking(on_thread);
        self.track(id, handle);
        self.tokens.insert(id, token);
        None
    }

    fn spawn(
        &mut self,
        id: CallId,
        call: impl std::future::Future<Output = Reply> + Send + 'static,
    ) {
        let handle = self.tasks.spawn(async move { (id, call.await) });
        self.track(id, handle);
    }

    fn track(&mut self, id: CallId, handle: AbortHandle) {
        self.by_task.insert(handle.id(), id);
        self.handles.insert(id, handle);
    }

    /// Cancels call `id`. A task's call is answered `Cancelled` when its abort is joined; a
    /// call on a pool thread (which an abort cannot stop once it runs) has its token cancelled
    /// and is answered now, with `Some`: its handler's eventual result is discarded.
    fn cancel(&mut self, id: CallId) -> Option<Reply> {
        let handle = self.handles.get(&id)?;
        handle.abort();
        let token = self.tokens.remove(&id)?;
        token.cancel();
        let task = handle.id();
        self.handles.remove(&id);
        self.by_task.remove(&task);
        Some(Err(cancelled()))
    }

    /// The next call to finish, with its reply; a panic or an abort becomes a `Fail`. Calls
    /// answered already (cancelled on a pool thread) are passed over.
    async fn next_finished(&mut self) -> Option<(CallId, Reply)> {
        let (id, result) = loop {
            let joined = self.tasks.join_next_with_id().await?;
            let (task, result) = match joined {
                Ok((task, (id, reply))) => (task, Ok((id, reply))),
                Err(err) => (err.id(), Err(err)),
            };
            if let Some(id) = self.by_task.remove(&task) {
                break (id, result);
            }
        };
        self.handles.remove(&id);
        self.tokens.remove(&id);
        Some(match result {
            Ok(done) => done,
            Err(err) if err.is_panic() => {
                let message = panic_message(err.into_panic());
                (id, Err(RemoteError::new(ErrorKind::Panic, &message)))
            }
            Err(_) => (id, Err(cancelled())),
        })
    }

    /// Stops every call: tasks are aborted, handlers on pool threads see their token cancelled.
    fn abort_all(&mut self) {
        self.tasks.abort_all();
        self.tokens.values().for_each(CancelToken::cancel);
    }
}

fn cancelled() -> RemoteError {
    RemoteError::new(ErrorKind::Cancelled, "cancelled by the host")
}

fn stopping() -> RemoteError {
    RemoteError::new(ErrorKind::Internal, "worker stopping")
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
