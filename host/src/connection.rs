//! The current worker's connection, shared by the parties of a call so that none of them relays
//! for another:
//!
//! ```text
//!   caller ──(lock: begin the call)──▶ its own non-blocking write ──▶ worker
//!   worker ──▶ reader task ──(lock: time first, then the frame)──▶ decode ──▶ caller
//!   supervisor: time, the process, commands, restarts; never reads or writes the channel
//! ```
//!
//! A caller begins its own call under the lock ([`Live::try_begin`]) and, when no write is in
//! flight, writes its frame itself with one non-blocking system call; only a write the OS
//! cannot take at once is handed to the writer task, which keeps the send deadline. The reader
//! task completes callers directly. So a small call crosses one task boundary (reader →
//! caller) on the host, and the supervisor wakes only for events, earlier deadlines and the
//! process.
//!
//! Two locks, never held across a system call on the channel and always taken in this order:
//! the core (the session and the call table) and the wire's queue (frames in the order the
//! session produced them, and who is writing). That is the rule this layout exists to keep: a
//! worker able to stall a pipe `read(2)` or `write(2)` inside the kernel stalls at most the
//! task making that call, never the supervisor, which can still see the deadline pass and
//! kill it.
//!
//! Responses are decoded by the reader after it releases the lock and before it reads the
//! next frame: a worker whose response does not decode is cut off before any later frame of it
//! is accepted.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use airlock_protocol::spin::SpinPolicy;
use airlock_protocol::transport::{next_frame, FrameReceiver, Outgoing};
use airlock_protocol::{
    AbortReason, BeginCallError, BuildIdHasher, CallId, CloseReason, Event, HostSession, Outcome,
    Transmit, TransportError,
};
use bytes::Bytes;
use tokio::sync::{oneshot, Notify};

use crate::ids::CallIdRng;
use crate::reply::Replier;
use crate::response::ResponseDecoding;
use crate::supervisor::CallRequest;
use crate::updates::{Delivered, UpdateBudget, Updates};
use crate::{CallError, LostReason};

/// What a host's handles, its reader and writer tasks and its supervisor share. One per host;
/// it holds a [`Core`] while a worker is connected.
pub(crate) struct Live {
    core: Mutex<Option<Core>>,
    /// Wakes the supervisor: events it must handle, a failed write, or a deadline earlier
    /// than its timer.
    pub(crate) wake: Notify,
    /// The low-latency mode's window (`HostBuilder::low_latency`), if on.
    spin: Option<Duration>,
    /// Until when the reader may spin, in nanoseconds since `epoch`. Only a call this host
    /// begins moves it (by one window): the worker's frames never do, so a worker cannot keep
    /// the host's CPU busy by pacing frames, only the host's own calls can.
    spin_until: AtomicU64,
    epoch: Instant,
    /// The reader sleeps, but would spin through the next window a call grants: that grant
    /// wakes it ([`grant_wake`](Self::grant_wake)), as it can learn of the call only by running.
    reader_awaits_grant: AtomicBool,
    grant_wake: Notify,
}

impl Default for Live {
    fn default() -> Self {
        Self::new(None)
    }
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

/// Who is acting on the core: it decides whether that party may write to the channel itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Party {
    /// A caller's task (beginning or cancelling its own call).
    Caller,
    /// The reader task.
    Reader,
    /// The supervisor: it never writes the channel, so a write the kernel stalls can never
    /// keep it from seeing a deadline pass and killing the worker.
    Supervisor,
}

impl Live {
    /// A host's connection state, spinning for `spin` after each call it begins.
    pub(crate) fn new(spin: Option<Duration>) -> Self {
        Self {
            core: Mutex::new(None),
            wake: Notify::new(),
            spin,
            spin_until: AtomicU64::new(0),
            epoch: Instant::now(),
            reader_awaits_grant: AtomicBool::new(false),
            grant_wake: Notify::new(),
        }
    }

    fn since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A call was begun: the reader may spin for one window waiting for its answer.
    fn grant_spin(&self) {
        if let Some(window) = self.spin {
            let window = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
            let until = self.since_epoch().saturating_add(window);
            // SeqCst here and in the reader: each side writes one of `spin_until` and
            // `reader_awaits_grant` and then reads the other, so either this sees the flag or
            // the reader sees the grant.
            self.spin_until.fetch_max(until, Ordering::SeqCst);
            if self.reader_awaits_grant.swap(false, Ordering::SeqCst) {
                self.grant_wake.notify_one();
            }
        }
    }

    /// The end of the latest spin window a call granted, in nanoseconds since `epoch` (0: none
    /// yet).
    fn granted_until(&self) -> u64 {
        self.spin_until.load(Ordering::SeqCst)
    }

    /// The core, even if a thread panicked while holding it (every update to it is complete
    /// before anything that can panic runs).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Core>> {
        self.core
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Begins `call` on the connected worker and, from a caller's task, writes its frame if no
    /// write is in flight. Gives the call back when no worker is taking calls (during a
    /// handshake, a restart or a shutdown): the supervisor then queues it.
    pub(crate) fn try_begin(&self, call: CallRequest, by: Party) -> Result<(), CallRequest> {
        let (settled, wake) = {
            let mut guard = self.lock();
            let Some(core) = guard.as_mut().filter(|core| core.accepting) else {
                return Err(call);
            };
            let deadline = call.deadline;
            core.link.begin(&mut core.session, call);
            let settled = core.settle();
            // The supervisor's timer is left armed at the last deadline it saw, so a steady
            // stream of calls with one timeout wakes it once per timeout, not once per call.
            let earlier = core.timer_at.is_none_or(|at| deadline < at);
            (settled, earlier)
        };
        if wake {
            self.wake.notify_one();
        }
        self.grant_spin();
        settled.finish(self, by, None);
        Ok(())
    }

    /// Cancels the call with local handle `key` if it is on the worker (a `Cancel` is sent).
    /// False if it is not: it is still waiting for a worker, or already over.
    pub(crate) fn cancel(&self, key: u64, by: Party) -> bool {
        let settled = {
            let mut guard = self.lock();
            let Some(core) = guard.as_mut() else {
                return false;
            };
            let Some(id) = core.link.keys.remove(&key) else {
                return false;
            };
            core.session.cancel(id);
            core.settle()
        };
        settled.finish(self, by, None);
        true
    }

    /// The supervisor's turn: runs `turn` on the core (if a worker is connected) and applies
    /// what it changed, leaving any write to the writer task.
    pub(crate) fn with_core<T>(&self, turn: impl FnOnce(&mut Core) -> T) -> Option<T> {
        let (value, settled) = {
            let mut guard = self.lock();
            let core = guard.as_mut()?;
            let value = turn(core);
            (value, core.settle())
        };
        settled.finish(self, Party::Supervisor, None);
        Some(value)
    }
}

/// One worker's session and calls.
pub(crate) struct Core {
    /// Which worker this is (the supervisor counts its launches): a task left over from an
    /// earlier worker never touches a later one's session.
    pub(crate) generation: u64,
    pub(crate) session: HostSession,
    pub(crate) link: Link,
    pub(crate) wire: Arc<Wire>,
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

/// What [`Core::settle`] found, to act on once the lock is released.
#[derive(Default)]
#[must_use]
pub(crate) struct Settled {
    /// The supervisor has events to handle.
    wake: bool,
    /// Responses to decode, each with its caller: one frame completes at most one call, so a
    /// reader's turn has at most one (kept without an allocation).
    returned: Option<Returned>,
    /// Any further responses (none in a reader's turn; kept for completeness).
    more: Vec<Returned>,
    /// Progress updates for streaming calls, to decode and deliver.
    updates: Vec<(Updates, Bytes)>,
    /// Frames this party must write: it became the wire's writer.
    write: Option<(Arc<Wire>, Vec<Transmit>)>,
}

impl Settled {
    /// Acts on a turn, outside the lock: decodes and delivers responses (a lie cuts the worker
    /// off first), writes what this party became the writer of (or hands it to the writer
    /// task), and wakes the supervisor. `limits` comes with the reader's turns: responses and
    /// the generation whose session may be cut off. True if the worker lied.
    pub(crate) fn finish(
        self,
        live: &Live,
        by: Party,
        limits: Option<(&ResponseDecoding, u64)>,
    ) -> bool {
        let Settled {
            mut wake,
            returned,
            more,
            write,
            updates: _,
        } = self;
        if let Some((wire, batch)) = write {
            if by != Party::Supervisor && wire.direct {
                wake |= wire.write_now(batch);
            } else {
                wire.hand_off(batch);
            }
        }
        let lied = match limits {
            Some((limits, generation)) => deliver(live, generation, returned, more, limits),
            // Only the reader accepts frames, so only its turns return responses.
            None => {
                for returned in returned.into_iter().chain(more) {
                    fail(
                        returned.reply,
                        CallError::WorkerLost(LostReason::TransportFailed),
                    );
                }
                false
            }
        };
        if wake {
            live.wake.notify_one();
        }
        lied
    }
}

/// A response accepted from the worker, not yet decoded.
pub(crate) struct Returned {
    body: Bytes,
    /// The call's method, for the warning a refused response is logged with.
    method: std::borrow::Cow<'static, str>,
    reply: Replier,
}

impl Core {
    pub(crate) fn new(generation: u64, session: HostSession, wire: Arc<Wire>) -> Self {
        Self {
            generation,
            session,
            link: Link::default(),
            wire,
            accepting: false,
            events: Vec::new(),
            last_words: Vec::new(),
            timer_at: None,
            closed: false,
        }
    }

    /// Applies what the session decided since the last turn: completions are answered
    /// (responses are handed back to decode outside the lock), other events are kept for the
    /// supervisor, and the session's frames join the wire's queue. Call after every change to
    /// the session, before the lock is released.
    pub(crate) fn settle(&mut self) -> Settled {
        let mut settled = Settled::default();
        while let Some(event) = self.session.poll_event() {
            match event {
                Event::Completed { id, outcome } => {
                    if let Some(returned) = self.link.complete(id, outcome) {
                        match settled.returned {
                            None => settled.returned = Some(returned),
                            Some(_) => settled.more.push(returned),
                        }
                    }
                }
                Event::Closed(reason) => {
                    self.accepting = false;
                    self.closed = true;
                    self.wire.close();
                    self.events.push(Event::Closed(reason));
                    settled.wake = true;
                }
                // Delivered to a streaming call's caller (decoded by the reader, outside the
                // lock); dropped for a call that does not stream. The session has counted them
                // against the call's quota either way.
                Event::Progress { id, body } => {
                    if let Some(updates) = self.link.updates_of(&id) {
                        settled.updates.push((updates, body));
                    }
                }
                other => {
                    self.events.push(other);
                    settled.wake = true;
                }
            }
        }
        if !self.closed {
            self.link.answer_timed_out();
        }
        let mut batch = self.wire.take_spare();
        batch.extend(std::iter::from_fn(|| self.session.poll_transmit()));
        if self.closed {
            // Only the session's own last frames, written (bounded) by the supervisor as it
            // puts the worker down.
            self.last_words.append(&mut batch);
        } else if batch.is_empty() {
            self.wire.give_back(batch);
        } else if let Some(batch) = self.wire.push(batch) {
            settled.write = Some((Arc::clone(&self.wire), batch));
        }
        settled
    }
}

/// What a call's caller waits on.
struct Responder {
    method: std::borrow::Cow<'static, str>,
    key: u64,
    reply: Replier,
    /// A streaming call's update channel.
    updates: Option<Updates>,
}

/// The calls on the current worker and their callers.
#[derive(Default)]
pub(crate) struct Link {
    responders: HashMap<CallId, Responder, BuildIdHasher>,
    pub(crate) keys: HashMap<u64, CallId, BuildIdHasher>,
    /// Calls lost when the session closed, answered once the worker is reaped, so a caller
    /// that sees `WorkerLost` knows the worker is already dead.
    pub(crate) lost: Vec<Replier>,
    /// Calls that timed out in the turn being settled.
    timed_out: Vec<Replier>,
}

impl Link {
    pub(crate) fn begin(&mut self, session: &mut HostSession, call: CallRequest) {
        // A call already past its deadline is not sent: it would only time out on the worker
        // and take the worker, and every call beside it, down for nothing.
        if call.deadline <= Instant::now() {
            return fail(call.reply, CallError::Timeout);
        }
        // OS randomness through a pool that `fork` wipes (see `ids`).
        let mut rng = CallIdRng;
        // Kept for the log if its response is refused: free for a typed call's `&'static str`.
        let method = call.method.clone();
        match session.begin_call(call.method, call.body, call.deadline, &mut rng) {
            Ok(id) => {
                self.keys.insert(call.key, id);
                let responder = Responder {
                    method,
                    key: call.key,
                    reply: call.reply,
                    updates: call.updates,
                };
                self.responders.insert(id, responder);
            }
            Err(err) => fail(
                call.reply,
                match err {
                    BeginCallError::Overloaded { max } => CallError::Overloaded { max },
                    BeginCallError::TooLarge { len, max } => CallError::TooLarge { len, max },
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

    /// Where an update for call `id` goes: its caller's channel, if it streams.
    fn updates_of(&self, id: &CallId) -> Option<Updates> {
        self.responders.get(id)?.updates.clone()
    }

    fn answer_timed_out(&mut self) {
        for reply in self.timed_out.drain(..) {
            reply.fail(CallError::Timeout);
        }
    }

    /// Answers a completed call, except a response, which is handed back to be decoded.
    fn complete(&mut self, id: CallId, outcome: Outcome) -> Option<Returned> {
        let Responder {
            method, key, reply, ..
        } = self.responders.remove(&id)?;
        self.keys.remove(&key);
        let answer = match outcome {
            Outcome::Returned(body) => {
                return Some(Returned {
                    body,
                    method,
                    reply,
                })
            }
            Outcome::Failed(err) => CallError::Remote(err),
            // Answered when the turn is settled: at once if the worker lives on (it was sent
            // `Cancel` and has the cancel grace to finish), after the reap if the session
            // closed in the same turn (no grace), so a caller that sees `Timeout` then knows
            // the worker that missed the deadline is dead.
            Outcome::TimedOut => {
                self.timed_out.push(reply);
                return None;
            }
            Outcome::Cancelled => CallError::Cancelled,
            Outcome::Lost(_) => {
                self.lost.push(reply);
                return None;
            }
            _ => CallError::WorkerLost(LostReason::TransportFailed),
        };
        reply.fail(answer);
        None
    }

    /// Answers every call still on the worker, once it is reaped.
    pub(crate) fn fail_all(&mut self, reason: &LostReason) {
        self.answer_timed_out();
        let remaining = self.responders.drain().map(|(_, r)| r.reply);
        for reply in self.lost.drain(..).chain(remaining) {
            reply.fail(CallError::WorkerLost(reason.clone()));
        }
        self.keys.clear();
    }

    /// Answers every call with `err` (the host itself is gone).
    pub(crate) fn fail_all_with(&mut self, err: &CallError) {
        let remaining = self.responders.drain().map(|(_, r)| r.reply);
        let replies = self.timed_out.drain(..).chain(self.lost.drain(..));
        for reply in replies.chain(remaining) {
            reply.fail(err.clone());
        }
        self.keys.clear();
    }
}

pub(crate) fn fail(reply: Replier, err: CallError) {
    reply.fail(err);
}

/// Decodes and delivers what the reader's turn returned, outside the lock. A response that
/// does not decode is a lie: the worker is cut off first, before its caller learns of it and
/// before the reader accepts another frame, so no call begun after the caller sees `Decode`
/// reaches the liar. True if the worker lied.
fn deliver(
    live: &Live,
    generation: u64,
    returned: Option<Returned>,
    more: Vec<Returned>,
    limits: &ResponseDecoding,
) -> bool {
    let Some(first) = returned else {
        return false;
    };
    // A refusal is logged, with the budget and the method, before the worker is cut off.
    let decode = |returned: Returned| {
        let decoded = returned.reply.returned(&returned.body, limits);
        if let Err((_, err)) = &decoded {
            limits.refused(&returned.method, err);
        }
        decoded
    };
    if more.is_empty() {
        // The common case, without collecting: decode, cut a liar off, then answer.
        return match decode(first) {
            Ok(decoded) => {
                decoded.publish();
                false
            }
            Err((reply, err)) => {
                cut_off_liar(live, generation);
                reply.fail(CallError::Decode(err));
                true
            }
        };
    }
    let decoded: Vec<_> = std::iter::once(first).chain(more).map(decode).collect();
    let lied = decoded.iter().any(Result::is_err);
    if lied {
        cut_off_liar(live, generation);
    }
    for outcome in decoded {
        match outcome {
            Ok(decoded) => decoded.publish(),
            Err((reply, err)) => reply.fail(CallError::Decode(err)),
        }
    }
    lied
}

/// Decodes and delivers a streaming call's updates, in order, before the reader takes the
/// worker's next frame (so every update is with its caller before the call's answer). An
/// update that does not decode is a lie: the worker is cut off (false is returned). Waits only
/// while the worker's undelivered updates would pass their budget (bytes and items, see
/// `updates`): then the worker's other frames wait with it, bounded by the deadlines, which
/// the supervisor keeps.
async fn deliver_updates(
    live: &Live,
    generation: u64,
    updates: Vec<(Updates, Bytes)>,
    limits: &ResponseDecoding,
    budget: &Arc<UpdateBudget>,
) -> bool {
    for (updates, body) in updates {
        match (updates.decode)(&body, limits) {
            Ok((update, cost)) => {
                // A caller that has stopped listening takes no more updates: its update is
                // dropped at once, never waiting for room it would not use. (`take` changes
                // the budget only as it returns, so abandoning it takes nothing.)
                tokio::select! {
                    biased;
                    () = updates.sender.closed() => continue,
                    () = budget.take(cost) => {}
                }
                let delivered = Delivered::new(update, cost, Arc::clone(budget));
                // A caller that drops its stream from here on: the update is dropped with the
                // channel, and its share of the budget given back.
                let _ = updates.sender.send(delivered);
            }
            Err(_) => {
                cut_off_liar(live, generation);
                return false;
            }
        }
    }
    true
}

/// A response did not decode: the worker lied, and its session ends before anything else of
/// it is accepted.
fn cut_off_liar(live: &Live, generation: u64) {
    let settled = {
        let mut guard = live.lock();
        let Some(core) = guard.as_mut().filter(|core| core.generation == generation) else {
            return;
        };
        core.session
            .abort(CloseReason::Aborted(AbortReason::UndecodableResponse));
        core.settle()
    };
    settled.finish(live, Party::Reader, None);
}

/// The reader task: hands each frame to the session under the lock, deadlines first, and
/// answers the callers it completes. `raise` carries the connection's `max_frame` once the
/// worker is verified (`recv` is cancel-safe, so switching mid-wait loses nothing).
pub(crate) async fn read_frames(
    mut receiver: Box<dyn FrameReceiver>,
    live: Arc<Live>,
    generation: u64,
    mut raise: oneshot::Receiver<u32>,
    limits: ResponseDecoding,
    budget: Arc<UpdateBudget>,
) {
    let mut raised = false;
    let mut spin = live.spin.map(ReaderSpin::new);
    loop {
        // Low-latency mode: for a window after each call begins, poll for the worker's frames
        // instead of sleeping until they arrive (`HostBuilder::low_latency`), while it pays.
        let (spinning, awaits_grant) = match spin.as_mut().map(|spin| spin.turn(&live)) {
            None | Some(Turn::Sleep) => (false, false),
            Some(Turn::Spin) => (true, false),
            Some(Turn::SleepUntilGranted) => (false, true),
            Some(Turn::LookAgain) => continue,
        };
        let item = tokio::select! {
            biased;
            max = &mut raise, if !raised => {
                raised = true;
                if let Ok(max) = max {
                    receiver.set_max_frame(max);
                }
                continue;
            }
            item = next_frame(&mut *receiver) => item,
            () = tokio::task::yield_now(), if spinning => continue,
            () = live.grant_wake.notified(), if awaits_grant => continue,
        };
        let last = !matches!(item, Ok(Some(_)));
        if let Some(spin) = spin.as_mut().filter(|_| !last) {
            spin.frame_in(&live);
        }
        let settled = {
            let mut guard = live.lock();
            // Only this reader's own worker: once it is put down (this task is aborted, but an
            // abort lands only at the next `.await`), its frames and its end of stream are
            // nobody's business.
            let Some(core) = guard.as_mut().filter(|core| core.generation == generation) else {
                return;
            };
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
        let mut settled = settled;
        let updates = std::mem::take(&mut settled.updates);
        if settled.finish(&live, Party::Reader, Some((&limits, generation))) || last {
            return;
        }
        if !deliver_updates(&live, generation, updates, &limits, &budget).await {
            return;
        }
    }
}

/// What the reader does this turn of its loop, in the low-latency mode.
#[derive(Debug, PartialEq, Eq)]
enum Turn {
    /// Poll again instead of sleeping.
    Spin,
    /// Sleep until a frame comes.
    Sleep,
    /// Sleep until a frame comes or a call grants a window (`Live::grant_wake`).
    SleepUntilGranted,
    /// A call granted a window while the reader decided: decide again.
    LookAgain,
}

/// The reader's side of the low-latency mode: the windows callers grant, spun through where
/// [`SpinPolicy`] finds that spinning pays, as the worker's frames come in.
struct ReaderSpin {
    window: Duration,
    policy: SpinPolicy,
    /// The latest grant seen, as [`Live::granted_until`] gives it.
    seen: u64,
}

impl ReaderSpin {
    fn new(window: Duration) -> Self {
        Self {
            window,
            policy: SpinPolicy::default(),
            seen: 0,
        }
    }

    /// Adopts a window granted since the last look (it began when its call did), at `now`.
    fn observe(&mut self, live: &Live, now: Instant) {
        let granted = live.granted_until();
        if granted > self.seen {
            self.seen = granted;
            let end = live.epoch + Duration::from_nanos(granted);
            let at = end.checked_sub(self.window).unwrap_or(end);
            self.policy.open(at, end, now);
        }
    }

    /// This turn of the reader's loop: a look at the windows granted, then what follows.
    fn turn(&mut self, live: &Live) -> Turn {
        let now = Instant::now();
        self.observe(live, now);
        let spinning = self.policy.spinning(now);
        self.after_look(live, spinning)
    }

    /// What follows a look that found the reader `spinning` or not. Asleep but willing to
    /// spin, the reader is woken by the next call's grant. A grant made after the look but
    /// before the flag is stored did not see the flag: look again. One made after it either
    /// stores a permit in the `Notify` or wakes the wait; a stale permit costs one more turn.
    fn after_look(&self, live: &Live, spinning: bool) -> Turn {
        let awaits_grant = !spinning && self.policy.would_spin();
        live.reader_awaits_grant
            .store(awaits_grant, Ordering::SeqCst);
        match (spinning, awaits_grant) {
            (true, _) => Turn::Spin,
            (false, true) if live.granted_until() > self.seen => Turn::LookAgain,
            (false, true) => Turn::SleepUntilGranted,
            (false, false) => Turn::Sleep,
        }
    }

    /// A frame came in: the wait for it is measured.
    fn frame_in(&mut self, live: &Live) {
        let now = Instant::now();
        self.observe(live, now);
        self.policy.arrived(now);
    }
}

/// The write side of one worker's channel: frames queued in the order the session produced
/// them, and at most one party writing at a time.
///
/// Whoever queues frames while nobody is writing becomes the writer and makes one
/// non-blocking write itself ([`write_now`](Self::write_now)); a write the OS cannot take at
/// once, or frames queued meanwhile, go to the writer task ([`drive_writes`]), which keeps the
/// send deadline. A failed write may have stopped inside a frame: nothing is written after it.
pub(crate) struct Wire {
    /// Whether callers and the reader may write themselves. Only when the worker cannot make a
    /// write sleep inside the kernel (its confinement denies `userfaultfd`): otherwise every
    /// write goes through the writer task, so that a caller can always give up its call.
    direct: bool,
    /// The host's runtime: a write that has to wait arms its send deadline on this runtime's
    /// timer, whichever runtime the caller that began it runs on.
    runtime: tokio::runtime::Handle,
    queue: Mutex<Queue>,
    /// The sender; taken out by the writer while it writes.
    outgoing: Mutex<Option<Outgoing>>,
    /// Wakes the writer task: a write is in flight, or frames wait.
    resume: Notify,
    /// Tells whoever waits that nobody is writing any more.
    idle: Notify,
    failed: AtomicBool,
}

#[derive(Default)]
struct Queue {
    frames: Vec<Transmit>,
    /// Someone is writing (or a write failed and nothing more will be written).
    writing: bool,
    /// The session closed: call frames are dropped; only last words go out.
    closed: bool,
    /// An emptied batch buffer, reused.
    spare: Vec<Transmit>,
}

impl Wire {
    /// A wire over `outgoing`, on the current (the supervisor's) runtime.
    pub(crate) fn new(outgoing: Outgoing, direct: bool) -> Self {
        Self {
            direct,
            runtime: tokio::runtime::Handle::current(),
            queue: Mutex::new(Queue::default()),
            outgoing: Mutex::new(Some(outgoing)),
            resume: Notify::new(),
            idle: Notify::new(),
            failed: AtomicBool::new(false),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn sender(&self) -> MutexGuard<'_, Option<Outgoing>> {
        self.outgoing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a write failed: the connection can no longer be written.
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    fn take_spare(&self) -> Vec<Transmit> {
        std::mem::take(&mut self.queue().spare)
    }

    /// Returns a batch buffer [`take_spare`](Self::take_spare) lent that was not needed.
    fn give_back(&self, unused: Vec<Transmit>) {
        keep_larger(&mut self.queue().spare, unused);
    }

    /// Queues `frames`; returns the batch to write if the caller became the writer.
    fn push(&self, mut frames: Vec<Transmit>) -> Option<Vec<Transmit>> {
        let mut queue = self.queue();
        if queue.closed {
            return None;
        }
        if queue.writing {
            queue.frames.append(&mut frames);
            queue.spare = frames;
            return None;
        }
        queue.writing = true;
        if queue.frames.is_empty() {
            // Nothing queued before: these frames are the batch, as they are.
            return Some(frames);
        }
        queue.frames.append(&mut frames);
        queue.spare = frames;
        Some(std::mem::take(&mut queue.frames))
    }

    /// The session closed: frames not yet written are dropped (their calls are reported lost
    /// and must never reach a worker being put down), and nothing more is queued.
    fn close(&self) {
        let mut queue = self.queue();
        queue.closed = true;
        queue.frames.clear();
    }

    /// Writes `batch` (this party is the writer) with one non-blocking attempt; hands what is
    /// left to the writer task. True if the write failed (the supervisor must hear of it).
    fn write_now(&self, batch: Vec<Transmit>) -> bool {
        let Some(mut outgoing) = self.sender().take() else {
            return self.fail();
        };
        // Inside the host's runtime, whatever runtime (or none) this caller runs on: a write
        // that has to wait registers its readiness and its send deadline there, where the
        // writer task finishes it.
        let started = {
            let _host_runtime = self.runtime.enter();
            now_or_never(outgoing.start(batch))
        };
        let spare = outgoing.take_buffer();
        *self.sender() = Some(outgoing);
        match started {
            // Written whole: done, unless frames were queued meanwhile.
            Some(Some(Ok(()))) => {
                let mut queue = self.queue();
                keep_larger(&mut queue.spare, spare);
                if queue.frames.is_empty() {
                    queue.writing = false;
                    drop(queue);
                    self.idle.notify_waiters();
                } else {
                    drop(queue);
                    self.resume.notify_one();
                }
                false
            }
            Some(Some(Err(_))) => self.fail(),
            // In flight (the pipe is full): the writer task finishes it under the deadline.
            Some(None) | None => {
                self.resume.notify_one();
                false
            }
        }
    }

    /// This party became the writer but must not write itself: the writer task writes the
    /// batch (ahead of anything queued since, which came after it).
    fn hand_off(&self, mut batch: Vec<Transmit>) {
        let mut queue = self.queue();
        if queue.frames.is_empty() {
            // The batch becomes the queue, and the queue's empty buffer the next spare.
            std::mem::swap(&mut queue.frames, &mut batch);
            keep_larger(&mut queue.spare, batch);
        } else {
            queue.frames.splice(0..0, batch);
        }
        drop(queue);
        self.resume.notify_one();
    }

    fn fail(&self) -> bool {
        self.failed.store(true, Ordering::Release);
        self.idle.notify_waiters();
        true
    }

    /// Replaces whatever is queued with the closed session's last frames and waits, at most
    /// `within`, until they are written.
    ///
    /// The writer task writes them (the supervisor, which calls this, never writes itself).
    pub(crate) async fn write_last_words(&self, words: Vec<Transmit>, within: std::time::Duration) {
        let idle = self.idle.notified();
        let mut idle = std::pin::pin!(idle);
        idle.as_mut().enable();
        let start_writer = {
            let mut queue = self.queue();
            queue.frames = words;
            !std::mem::replace(&mut queue.writing, true)
        };
        if start_writer {
            self.resume.notify_one();
        }
        if !self.failed() {
            let _ = tokio::time::timeout(within, idle).await;
        }
    }
}

/// The writer task: finishes writes the OS could not take at once (under the sender's send
/// deadline) and writes frames queued meanwhile, then hands writing back. Ends when a write
/// fails, after telling the supervisor.
pub(crate) async fn drive_writes(wire: Arc<Wire>, live: Arc<Live>) {
    loop {
        wire.resume.notified().await;
        let Some(outgoing) = wire.sender().take() else {
            continue;
        };
        if write_queued(&wire, outgoing).await.is_err() {
            wire.fail();
            live.wake.notify_one();
            return;
        }
        wire.idle.notify_waiters();
    }
}

/// Finishes the write in flight, then writes queued batches until the queue is empty, when
/// writing is handed back: the sender is put back and the flag cleared under the queue's lock,
/// so a party that queues after that finds the sender and writes itself. A failed write keeps
/// the flag set: nothing is written after it.
async fn write_queued(wire: &Wire, mut outgoing: Outgoing) -> Result<(), TransportError> {
    loop {
        if outgoing.is_busy() {
            outgoing.finish().await?;
        }
        let batch = {
            let mut queue = wire.queue();
            keep_larger(&mut queue.spare, outgoing.take_buffer());
            if queue.frames.is_empty() {
                *wire.sender() = Some(outgoing);
                queue.writing = false;
                return Ok(());
            }
            std::mem::take(&mut queue.frames)
        };
        if let Some(result) = outgoing.start(batch).await {
            result?;
        }
    }
}

/// Keeps the emptied batch buffer with more room in `spare`, so the next batch is gathered
/// without an allocation.
fn keep_larger(spare: &mut Vec<Transmit>, mut other: Vec<Transmit>) {
    if other.capacity() > spare.capacity() {
        other.clear();
        *spare = other;
    }
}

/// Polls `future` once, with a waker that does nothing: for futures that finish on their first
/// poll or hand their remaining work to a task that will poll them again.
fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_millis(1);

    #[test]
    fn a_grant_made_between_the_readers_look_and_its_flag_sends_it_round_again() {
        let live = Live::new(Some(WINDOW));
        let mut spin = ReaderSpin::new(WINDOW);
        // The look: no window yet, so no spinning (nothing measured yet: it would spin).
        let now = Instant::now();
        spin.observe(&live, now);
        assert!(!spin.policy.spinning(now));
        // A caller's grant lands before the flag is stored: no wake is sent.
        live.grant_spin();
        assert!(now_or_never(live.grant_wake.notified()).is_none());
        assert_eq!(spin.after_look(&live, false), Turn::LookAgain);
        assert_eq!(
            spin.turn(&live),
            Turn::Spin,
            "and the next turn spins through it"
        );
    }

    #[test]
    fn a_grant_made_after_the_reader_flags_that_it_sleeps_wakes_it() {
        let live = Live::new(Some(WINDOW));
        let mut spin = ReaderSpin::new(WINDOW);
        assert_eq!(spin.turn(&live), Turn::SleepUntilGranted);
        live.grant_spin();
        // The wait the reader is about to enter (or is in) completes.
        assert!(now_or_never(live.grant_wake.notified()).is_some());
        assert!(
            !live.reader_awaits_grant.load(Ordering::SeqCst),
            "one wake per sleep"
        );
        live.grant_spin();
        assert!(
            now_or_never(live.grant_wake.notified()).is_none(),
            "no stale permit piles up"
        );
    }

    #[test]
    fn with_the_mode_off_a_call_neither_grants_nor_wakes() {
        let live = Live::new(None);
        live.reader_awaits_grant.store(true, Ordering::SeqCst);
        live.grant_spin();
        assert_eq!(live.granted_until(), 0);
        assert!(now_or_never(live.grant_wake.notified()).is_none());
    }
}
