//! The serving loop: one task that owns the [`WorkerSession`], one reading frames, one writing
//! them, and one task per call.

use std::collections::HashMap;
use std::sync::Arc;

use airlock_codec::Limits;
use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_protocol::{
    CallId, CloseReason, ErrorKind, RemoteError, ReplyError, TransportError, WorkerConfig,
    WorkerEvent, WorkerSession,
};
use bytes::Bytes;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{AbortHandle, JoinSet};

use crate::handler::{ErasedHandler, Reply};
use crate::ServeError;

/// Frames read ahead of the session: bounded, so a fast host cannot grow the worker's memory.
const READ_AHEAD: usize = 64;
/// Batches queued for the writer task.
const WRITE_QUEUE: usize = 64;

/// Everything the loop needs besides the transport.
pub(crate) struct ServeSpec {
    pub(crate) config: WorkerConfig,
    pub(crate) methods: HashMap<String, ErasedHandler>,
    pub(crate) max_concurrency: usize,
}

/// What the reader task hands the loop.
type Incoming = Result<Option<Bytes>, TransportError>;

pub(crate) async fn serve_on<T: Transport>(
    spec: ServeSpec,
    transport: T,
) -> Result<(), ServeError> {
    let (mut sender, mut receiver) = transport.split();
    let (frames_tx, mut frames_rx) = mpsc::channel::<Incoming>(READ_AHEAD);
    // The host states the connection's frame cap in its `Welcome`; the reader adopts it.
    let (raise_tx, mut raise_rx) = tokio::sync::oneshot::channel::<u32>();
    let mut raise_tx = Some(raise_tx);
    let reader = tokio::spawn(async move {
        let mut raised = false;
        loop {
            let item = receiver.recv().await;
            let last = !matches!(item, Ok(Some(_)));
            if frames_tx.send(item).await.is_err() || last {
                return;
            }
            if !raised {
                // The first frame is the host's answer to our Hello. Frames behind it (a call
                // queued during a restart, in the same write) may be as large as the Welcome
                // allows: read no further until the session has adopted its cap. If the first
                // frame was not a Welcome the session ends and this resolves as dropped.
                raised = true;
                if let Ok(max) = (&mut raise_rx).await {
                    receiver.set_max_frame(max);
                }
            }
        }
    });
    let (batches_tx, mut batches_rx) =
        mpsc::channel::<Vec<airlock_protocol::Transmit>>(WRITE_QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(batch) = batches_rx.recv().await {
            sender.send(&batch).await?;
        }
        sender.close().await
    });

    let mut session = WorkerSession::new(&spec.config);
    let mut calls = Calls::new(spec.methods, spec.max_concurrency);
    let mut limits = Limits::default();
    let outcome = loop {
        // Apply what the session decided (which may queue replies), then write everything
        // it produced in one batch, before waiting for more input.
        if let Some(end) = handle_events(&mut session, &mut calls, &mut limits, &mut raise_tx) {
            break end;
        }
        let batch: Vec<_> = std::iter::from_fn(|| session.poll_transmit()).collect();
        if !batch.is_empty() && batches_tx.send(batch).await.is_err() {
            break Err(ServeError::Connection(TransportError::Closed));
        }
        if session.is_drained() {
            break Ok(());
        }
        tokio::select! {
            incoming = frames_rx.recv() => match incoming {
                Some(Ok(Some(frame))) => session.handle_frame(frame),
                // End of stream, or a stream the host broke: either way the host is gone.
                Some(Ok(None)) | None | Some(Err(TransportError::Frame(_))) => session.handle_eof(),
                Some(Err(err)) => break Err(ServeError::Connection(err)),
            },
            Some((id, reply)) = calls.next_finished() => answer(&mut session, id, reply),
        }
    };
    // Flush what is left (the last replies), then close our side.
    let rest: Vec<_> = std::iter::from_fn(|| session.poll_transmit()).collect();
    if !rest.is_empty() {
        let _ = batches_tx.send(rest).await;
    }
    drop(batches_tx);
    calls.abort_all();
    reader.abort();
    let _ = writer.await;
    outcome
}

/// Sends a finished call's one terminal frame. A response the session cannot send (larger
/// than the host's `max_frame`) becomes a `Fail`: a call is never left unanswered.
fn answer(session: &mut WorkerSession, id: CallId, reply: Reply) {
    let refused = match reply {
        Ok(body) => match session.reply_return(id, body) {
            Err(ReplyError::TooLarge { len, max }) => Some(RemoteError::new(
                ErrorKind::Limit,
                &format!("response of {len} bytes exceeds the host's max_frame ({max})"),
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
    raise: &mut Option<tokio::sync::oneshot::Sender<u32>>,
) -> Option<Result<(), ServeError>> {
    while let Some(event) = session.poll_event() {
        match event {
            WorkerEvent::Welcomed(welcome) => {
                if let Some(raise) = raise.take() {
                    let _ = raise.send(welcome.max_frame);
                }
                *limits = Limits::default()
                    .max_bytes(welcome.max_frame as usize)
                    .max_len(welcome.max_frame as usize);
            }
            WorkerEvent::Call { id, method, body } => {
                match calls.start(id, method.as_str(), body, limits) {
                    Ok(()) => {}
                    Err(error) => {
                        let _ = session.reply_fail(id, &error);
                    }
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

/// The calls running in this worker: one task each, bounded by a semaphore.
struct Calls {
    methods: HashMap<String, ErasedHandler>,
    permits: Arc<Semaphore>,
    tasks: JoinSet<(CallId, Reply)>,
    /// Task id → call id, to answer a call whose task panicked or was aborted.
    by_task: HashMap<tokio::task::Id, CallId>,
    handles: HashMap<CallId, AbortHandle>,
}

impl Calls {
    fn new(methods: HashMap<String, ErasedHandler>, max_concurrency: usize) -> Self {
        Self {
            methods,
            permits: Arc::new(Semaphore::new(max_concurrency.max(1))),
            tasks: JoinSet::new(),
            by_task: HashMap::new(),
            handles: HashMap::new(),
        }
    }

    fn start(
        &mut self,
        id: CallId,
        method: &str,
        body: Bytes,
        limits: &Limits,
    ) -> Result<(), RemoteError> {
        let Some(handler) = self.methods.get(method) else {
            return Err(RemoteError::new(
                ErrorKind::UnknownMethod,
                &format!("this worker serves no method named {method:?}"),
            ));
        };
        let handler = Arc::clone(handler);
        let permits = Arc::clone(&self.permits);
        let limits = *limits;
        let handle = self.tasks.spawn(async move {
            // The permit travels with the handler (a blocking one keeps it on its thread
            // even after this task is aborted), so `max_concurrency` bounds what really runs.
            // Closed only when the loop ends, and then nobody awaits this task.
            let Ok(permit) = permits.acquire_owned().await else {
                return (
                    id,
                    Err(RemoteError::new(ErrorKind::Internal, "worker stopping")),
                );
            };
            (id, handler(body, limits, permit).await)
        });
        self.by_task.insert(handle.id(), id);
        self.handles.insert(id, handle);
        Ok(())
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
