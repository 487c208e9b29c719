//! The calls running in the worker: each started inline, on a task or on a pool thread, as its
//! handler and `max_concurrency` allow, cancelled on request, and collected as they finish.

use std::collections::HashMap;
use std::sync::Arc;

use airlock_codec::Limits;
use airlock_protocol::{BuildIdHasher, CallId, ErrorKind, MethodName, RemoteError};
use bytes::Bytes;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{AbortHandle, JoinSet};

use crate::handler::{
    join_blocking, AsyncHandler, BlockingHandler, CancelOnDrop, CancelToken, ErasedHandler, Reply,
};
use crate::progress::{CallContext, Update};

/// Largest request body whose handler is first polled inline, on the serving loop. Decoding a
/// larger body, which a handler does before its first `.await`, would hold up every other
/// call's reading and writing: such a call starts in a task of its own.
const INLINE_BODY: usize = 64 * 1024;

/// The calls running in this worker, bounded by a semaphore: answered inline when their
/// handler is ready at once, else one task (or, for a blocking handler, one pool thread) each.
pub(super) struct Calls {
    /// The handlers by name, found by the name's bytes as the frame carried them (validated
    /// ASCII), so there is no UTF-8 check per call. The names are the worker's own and the
    /// host's choice, never a hostile peer's, so a fast multiplicative hash serves.
    methods: HashMap<Box<[u8]>, ErasedHandler, BuildIdHasher>,
    permits: Arc<Semaphore>,
    tasks: JoinSet<(CallId, Reply)>,
    /// Task id → call id, to answer a call whose task panicked or was aborted.
    by_task: HashMap<tokio::task::Id, CallId, BuildIdHasher>,
    handles: HashMap<CallId, AbortHandle, BuildIdHasher>,
    /// The cancel tokens of blocking handlers running on pool threads.
    tokens: HashMap<CallId, CancelToken, BuildIdHasher>,
    /// See [`ServeSpec::inline_blocking`].
    pub(super) inline_blocking: bool,
    /// Whether a blocking handler ran on the loop's thread in this turn of the loop.
    pub(super) ran_on_loop: bool,
    /// Where handlers send their progress updates.
    updates: mpsc::Sender<Update>,
    /// The host's `max_progress_per_call` (none before its `Welcome`).
    pub(super) progress_quota: u32,
}

impl Calls {
    pub(super) fn new(
        methods: HashMap<String, ErasedHandler>,
        max_concurrency: usize,
        updates: mpsc::Sender<Update>,
    ) -> Self {
        Self {
            updates,
            progress_quota: 0,
            methods: methods
                .into_iter()
                .map(|(name, handler)| (name.into_bytes().into_boxed_slice(), handler))
                .collect(),
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
    pub(super) fn start(
        &mut self,
        id: CallId,
        method: &MethodName,
        body: Bytes,
        limits: &Limits,
        loop_free: bool,
    ) -> Option<Reply> {
        let Some(handler) = self.methods.get(method.as_bytes()) else {
            return Some(Err(RemoteError::new(
                ErrorKind::UnknownMethod,
                &format!("this worker serves no method named {:?}", method.as_str()),
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
    pub(super) fn cancel(&mut self, id: CallId) -> Option<Reply> {
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
    pub(super) async fn next_finished(&mut self) -> Option<(CallId, Reply)> {
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

    /// Whether no call is running (none on a task or a pool thread).
    pub(super) fn none_running(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Stops every call: tasks are aborted, handlers on pool threads see their token cancelled.
    pub(super) fn abort_all(&mut self) {
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
