//! The current worker's connection, shared by the three parties of a call so that none of
//! them relays for another:
//!
//! ```text
//!   caller ──(lock: begin the call, queue its frame)──▶ writer task ──▶ worker
//!   worker ──▶ reader task ──(lock: accept the frame, complete the caller)──▶ caller
//!   supervisor: time, the process, commands, restarts; never reads or writes the channel
//! ```
//!
//! A caller begins its own call under the lock ([`Live::try_begin`]) and the reader task
//! completes it directly, so a small call crosses no supervisor hop either way. The lock is
//! held only for sans-IO work (the session, the call table, a channel push): never across a
//! system call on the worker's channel. That is the rule this layout exists to keep: a worker
//! can make a pipe `read(2)` or `write(2)` sleep inside the kernel, and then only the
//! supervisor, which touches neither, can still see the deadline pass and kill it.
//!
//! Responses are decoded by the reader after it releases the lock and before it reads the
//! next frame: a worker whose response does not decode is cut off before any later frame of
//! it is accepted.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use airlock_protocol::transport::FrameReceiver;
use airlock_protocol::{
    AbortReason, BeginCallError, BuildIdHasher, CallId, CloseReason, Event, HostSession, Outcome,
    Transmit, TransportError,
};
use bytes::Bytes;
use rand_core::{OsRng, UnwrapErr};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::supervisor::{CallReply, CallRequest, Decode};
use crate::{CallError, LostReason};

/// What a host's handles, its reader task and its supervisor share. One per host; it holds a
/// [`Core`] while a worker is connected.
#[derive(Default)]
pub(crate) struct Live {
    core: Mutex<Option<Core>>,
    /// Wakes the supervisor: events it must handle, or a deadline earlier than its timer.
    pub(crate) wake: Notify,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

impl Live {
    /// The core, even if a thread panicked while holding it (every update to it is complete
    /// before anything that can panic runs).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Core>> {
        self.core
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Begins `call` on the connected worker, from the caller's own task. Gives the call back
    /// when no worker is taking calls (during a handshake, a restart or a shutdown): the
    /// supervisor then queues it.
    pub(crate) fn try_begin(&self, call: CallRequest) -> Result<(), CallRequest> {
        let wake = {
            let mut guard = self.lock();
            let Some(core) = guard.as_mut().filter(|core| core.accepting) else {
                return Err(call);
            };
            let deadline = call.deadline;
            core.begin(call);
            let settled = core.settle();
            // The supervisor's timer is left armed at the last deadline it saw, so a steady
            // stream of calls with one timeout wakes it once per timeout, not once per call.
            settled.wake || core.timer_at.is_none_or(|at| deadline < at)
        };
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }
}

/// One worker's session and calls.
pub(crate) struct Core {
    pub(crate) session: HostSession,
    pub(crate) link: Link,
    /// Frames for the writer task, in the order the session produced them; `None` once the
    /// supervisor has closed the queue.
    batches: Option<mpsc::UnboundedSender<Vec<Transmit>>>,
    /// Whether callers may begin calls here: the worker is ready and verified, and the
    /// session is neither closed nor shutting down.
    pub(crate) accepting: bool,
    /// Events for the supervisor (everything but completions), oldest first.
    pub(crate) events: Vec<Event>,
    /// Frames the closed session still has to say (a `Refuse`); written by the supervisor.
    pub(crate) last_words: Vec<Transmit>,
    /// What the supervisor's timer is armed for.
    pub(crate) timer_at: Option<Instant>,
    closed: bool,
}

/// What [`Core::settle`] found.
#[derive(Debug, Default)]
#[must_use]
pub(crate) struct Settled {
    /// The supervisor has events to handle.
    pub(crate) wake: bool,
    /// Responses to decode, each with its caller; see [`Core::settle`].
    pub(crate) returned: Vec<Returned>,
}

/// A response accepted from the worker, not yet decoded.
pub(crate) struct Returned {
    body: Bytes,
    decode: Decode,
    reply: oneshot::Sender<CallReply>,
}

impl std::fmt::Debug for Returned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Returned")
            .field("len", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl Core {
    pub(crate) fn new(session: HostSession, batches: mpsc::UnboundedSender<Vec<Transmit>>) -> Self {
        Self {
            session,
            link: Link::default(),
            batches: Some(batches),
            accepting: false,
            events: Vec::new(),
            last_words: Vec::new(),
            timer_at: None,
            closed: false,
        }
    }

    /// Queues the closed session's last frames for the writer, then closes its queue, so the
    /// writer ends once they are written. False if the writer is gone.
    pub(crate) fn send_last_words(&mut self, words: Vec<Transmit>) -> bool {
        self.batches
            .take()
            .is_some_and(|batches| batches.send(words).is_ok())
    }

    /// Begins `call`, or answers it at once if it cannot be sent.
    pub(crate) fn begin(&mut self, call: CallRequest) {
        self.link.begin(&mut self.session, call);
    }

    /// Applies what the session decided since the last turn: completions are answered
    /// (responses are handed back to decode outside the lock), other events are kept for the
    /// supervisor, and the session's frames go to the writer. Call after every change to the
    /// session, before the lock is released.
    pub(crate) fn settle(&mut self) -> Settled {
        let mut settled = Settled::default();
        while let Some(event) = self.session.poll_event() {
            match event {
                Event::Completed { id, outcome } => {
                    if let Some(returned) = self.link.complete(id, outcome) {
                        settled.returned.push(returned);
                    }
                }
                Event::Closed(reason) => {
                    self.accepting = false;
                    self.closed = true;
                    self.events.push(Event::Closed(reason));
                    settled.wake = true;
                }
                other => {
                    self.events.push(other);
                    settled.wake = true;
                }
            }
        }
        let batch: Vec<Transmit> = std::iter::from_fn(|| self.session.poll_transmit()).collect();
        if self.closed {
            // Only the session's own last frames, written (bounded) by the supervisor as it
            // puts the worker down.
            self.last_words.extend(batch);
        } else if !batch.is_empty()
            && self
                .batches
                .as_ref()
                .is_none_or(|batches| batches.send(batch).is_err())
        {
            self.session
                .abort(CloseReason::Aborted(AbortReason::TransportFailed));
            return merge(settled, self.settle());
        }
        settled
    }
}

fn merge(mut first: Settled, second: Settled) -> Settled {
    first.wake |= second.wake;
    first.returned.extend(second.returned);
    first
}

/// The calls on the current worker and their callers.
#[derive(Default)]
pub(crate) struct Link {
    responders: HashMap<CallId, (u64, Decode, oneshot::Sender<CallReply>), BuildIdHasher>,
    pub(crate) keys: HashMap<u64, CallId, BuildIdHasher>,
    /// Calls lost when the session closed, answered once the worker is reaped.
    lost: Vec<oneshot::Sender<CallReply>>,
    /// Calls that timed out: answered once the worker is reaped, so a caller that sees
    /// `Timeout` knows the worker that missed the deadline is already dead.
    timed_out: Vec<oneshot::Sender<CallReply>>,
}

impl Link {
    fn begin(&mut self, session: &mut HostSession, call: CallRequest) {
        // A call already past its deadline is not sent: it would only time out on the worker
        // and take the worker, and every call beside it, down for nothing.
        if call.deadline <= Instant::now() {
            return fail(call.reply, CallError::Timeout);
        }
        // One `getrandom` per call id, on purpose: a buffer of OS randomness would be copied
        // by `fork`, and a host used on both sides of a fork would send the same ids in the
        // same order (`invariant_04_ids_stay_fresh_on_both_sides_of_a_fork`).
        let mut rng = UnwrapErr(OsRng);
        match session.begin_call(call.method, call.body, call.deadline, &mut rng) {
            Ok(id) => {
                self.keys.insert(call.key, id);
                self.responders
                    .insert(id, (call.key, call.decode, call.reply));
            }
            Err(err) => fail(
                call.reply,
                match err {
                    BeginCallError::Overloaded { .. } => CallError::Overloaded,
                    BeginCallError::TooLarge { len, .. } => CallError::TooLarge { len },
                    BeginCallError::InvalidMethodName => {
                        CallError::Remote(airlock_protocol::RemoteError::new(
                            airlock_protocol::ErrorKind::UnknownMethod,
                            "invalid method name",
                        ))
                    }
                    _ => CallError::Shutdown,
                },
            ),
        }
    }

    /// Answers a completed call, except a response, which is handed back to be decoded.
    fn complete(&mut self, id: CallId, outcome: Outcome) -> Option<Returned> {
        let (key, decode, reply) = self.responders.remove(&id)?;
        self.keys.remove(&key);
        let answer = match outcome {
            Outcome::Returned(body) => {
                return Some(Returned {
                    body,
                    decode,
                    reply,
                })
            }
            Outcome::Failed(err) => CallReply::Failed(CallError::Remote(err)),
            Outcome::TimedOut => {
                self.timed_out.push(reply);
                return None;
            }
            Outcome::Cancelled => CallReply::Failed(CallError::Cancelled),
            Outcome::Lost(_) => {
                self.lost.push(reply);
                return None;
            }
            _ => CallReply::Failed(CallError::WorkerLost(LostReason::TransportFailed)),
        };
        let _ = reply.send(answer);
        None
    }

    /// Answers every call still on the worker, once it is reaped.
    pub(crate) fn fail_all(&mut self, reason: &LostReason) {
        for reply in self.timed_out.drain(..) {
            let _ = reply.send(CallReply::Failed(CallError::Timeout));
        }
        let remaining = self.responders.drain().map(|(_, (_, _, reply))| reply);
        for reply in self.lost.drain(..).chain(remaining) {
            let _ = reply.send(CallReply::Failed(CallError::WorkerLost(reason.clone())));
        }
        self.keys.clear();
    }
}

pub(crate) fn fail(reply: oneshot::Sender<CallReply>, err: CallError) {
    let _ = reply.send(CallReply::Failed(err));
}

/// The reader task: hands each frame to the session under the lock, deadlines first, and
/// answers the callers it completes. `raise` carries the connection's `max_frame` once the
/// worker is verified (`recv` is cancel-safe, so switching mid-wait loses nothing).
pub(crate) async fn read_frames(
    mut receiver: Box<dyn FrameReceiver>,
    live: std::sync::Arc<Live>,
    mut raise: oneshot::Receiver<u32>,
    limits: airlock_codec::Limits,
) {
    let mut raised = false;
    loop {
        let item = tokio::select! {
            item = receiver.recv() => item,
            max = &mut raise, if !raised => {
                raised = true;
                if let Ok(max) = max {
                    receiver.set_max_frame(max);
                }
                continue;
            }
        };
        let last = !matches!(item, Ok(Some(_)));
        let settled = {
            let mut guard = live.lock();
            let Some(core) = guard.as_mut() else { return };
            let session = &mut core.session;
            match item {
                Ok(Some(payload)) => {
                    // Time before frames: a deadline that passed while this frame waited is
                    // seen first, so the frame cannot complete a call already over.
                    let now = Instant::now();
                    if session.poll_timeout().is_some_and(|at| at <= now) {
                        session.handle_timeout(now);
                    }
                    session.handle_frame(payload);
                }
                Ok(None) => session.handle_eof(),
                Err(TransportError::Frame(err)) => session.handle_framing_error(err),
                Err(_) => session.abort(CloseReason::Aborted(AbortReason::TransportFailed)),
            }
            core.settle()
        };
        if deliver(&live, settled, &limits) || last {
            return;
        }
    }
}

/// Decodes and delivers what a turn returned, outside the lock. A response that does not
/// decode is a lie: the worker is cut off first, before its caller learns of it and before the
/// reader accepts another frame, so no call begun after the caller sees `Decode` reaches the
/// liar. Wakes the supervisor if the turn left it events. True if the worker lied.
pub(crate) fn deliver(live: &Live, settled: Settled, limits: &airlock_codec::Limits) -> bool {
    let mut wake = settled.wake;
    let decoded: Vec<_> = settled
        .returned
        .into_iter()
        .map(|returned| (returned.reply, (returned.decode)(&returned.body, limits)))
        .collect();
    let lied = decoded.iter().any(|(_, value)| value.is_err());
    if lied {
        let mut guard = live.lock();
        if let Some(core) = guard.as_mut() {
            core.session
                .abort(CloseReason::Aborted(AbortReason::UndecodableResponse));
            let again = core.settle();
            wake |= again.wake;
            // A closed session completes nothing more with a response; should one be here,
            // its caller is answered as lost with the liar.
            for returned in again.returned {
                fail(
                    returned.reply,
                    CallError::WorkerLost(LostReason::UndecodableResponse),
                );
            }
        }
    }
    for (reply, value) in decoded {
        let _ = reply.send(match value {
            Ok(value) => CallReply::Returned(value),
            Err(err) => CallReply::Failed(CallError::Decode(err)),
        });
    }
    if wake {
        live.wake.notify_one();
    }
    lied
}
