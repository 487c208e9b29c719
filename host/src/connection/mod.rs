//! The current worker's connection, shared by the parties of a call so that none of them relays
//! for another:
//!
//! ```text
//!   caller ──(lock: begin the call)──▶ its own non-blocking write ──▶ worker
//!   worker ──▶ reader task ──(lock: time first, then each frame of the read, decoded)──▶ caller
//!   worker ──▶ the caller's own look, just after its write (inlet: the reader's turn) ──▶ caller
//!   supervisor: time, the process, commands, restarts; never reads or writes the channel
//! ```
//!
//! A caller begins its own call under the lock ([`Live::try_begin`]) and, when no write is in
//! flight, writes its frame itself with one non-blocking system call; only a write the OS
//! cannot take at once is handed to the writer task, which keeps the send deadline. With
//! [`GATHER_AT`] or more calls in flight the caller hands its frame to the writer task at
//! once, and the writer lets the callers about to run queue theirs before it writes, so
//! pipelined calls share writes. The reader task completes callers directly. So a small call
//! crosses one task boundary (reader → caller) on the host, and the supervisor wakes only for
//! events, earlier deadlines and the process. A caller that wrote its own frame with no other
//! call in flight first looks for its answer itself ([`Inlet::look`]): one non-blocking read,
//! and, if the worker already answered (it shares the caller's CPU), the reader's turn taken
//! by the caller, with no task boundary at all.
//!
//! Two locks, never held across a system call on the channel and always taken in this order:
//! the core (the session and the call table) and the wire's queue (frames in the order the
//! session produced them, and who is writing). That is the rule this layout exists to keep: a
//! worker able to stall a pipe `read(2)` or `write(2)` inside the kernel stalls at most the
//! task making that call, never the supervisor, which can still see the deadline pass and
//! kill it. A third lock, the inlet's, is taken before both and held through a turn, its
//! non-blocking read included; only the reader waits for it, and only for another party's
//! turn, which is as bounded as its own. A caller never waits for it (it gives up its look)
//! and the supervisor never takes it.
//!
//! The reader takes the frames that came in one read (up to 64, or 64 KiB) and hands them to
//! the session in one turn under the lock, time first. Each frame is settled before the next;
//! a small response (4 KiB, 256 items) is decoded there, any other ends the turn and is decoded
//! once the lock is released, before the reader's next turn. So a worker whose response does
//! not decode is cut off before any later frame of it is accepted, even one read together with
//! the lie.
//!
//! One file per party's job: [`link`] (the calls on the worker and their callers), [`inlet`]
//! (the read side, shared by the reader and a caller's look), [`reader`] (the reader task and
//! its turn), [`reader_spin`] (its low-latency mode) and [`wire`] (writing). This file
//! holds what they share under the lock: [`Live`], [`Core`] and what a turn [`Settled`].

mod inlet;
mod link;
mod reader;
mod reader_spin;
#[cfg(test)]
mod recording;
mod wire;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use airlock_protocol::{Event, HostSession, Transmit};
use bytes::Bytes;
use tokio::sync::Notify;

pub(crate) use inlet::Inlet;
pub(crate) use link::{fail, Link};
use reader::deliver;
pub(crate) use reader::read_frames;
pub(crate) use wire::{drive_writes, Wire};

use crate::reply::{Decoded, Replier};
use crate::response::ResponseDecoding;
use crate::supervisor::CallRequest;
use crate::updates::Updates;
use crate::{CallError, LostReason};

/// What a host's handles, its reader and writer tasks and its supervisor share. One per host;
/// it holds a [`Core`] while a worker is connected.
pub(crate) struct Live {
    core: Mutex<Option<Core>>,
    /// Whether a worker is taking calls (a core is here and [`Core::accepting`]), as of the
    /// last time the lock was released: what a `Pool` reads to prefer such a worker, without
    /// taking the lock.
    taking_calls: AtomicBool,
    /// Wakes the supervisor: events it must handle, a failed write, or a deadline earlier
    /// than its timer.
    pub(crate) wake: Notify,
    /// The low-latency mode's window (`HostBuilder::low_latency`), if on.
    spin: Option<Duration>,
    /// Until when the reader may spin, in nanoseconds since `epoch`. Only a call this host
    /// begins moves it (by one window): the worker's frames never do, so a worker cannot keep
    /// the host's CPU busy by pacing frames, only the host's own calls can.
    spin_until: AtomicU64,
    /// The same for the calls begun alone, with no other call of this host in flight: where
    /// it equals `spin_until`, the latest window was granted by such a call.
    spin_alone_until: AtomicU64,
    epoch: Instant,
    /// The reader sleeps, but would spin through the next window a call begun alone, or one
    /// begun beside others, grants: such a grant wakes it ([`grant_wake`](Self::grant_wake)),
    /// as it can learn of the call only by running. One flag for each kind, as the reader
    /// judges each kind by a policy of its own.
    reader_awaits_alone_grant: AtomicBool,
    reader_awaits_beside_grant: AtomicBool,
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

/// The core, locked. Every change to whether a worker takes calls is made under the lock, so
/// [`Live::taking_calls`] is brought up to date as the lock is released, wherever that is.
pub(crate) struct CoreGuard<'a> {
    core: MutexGuard<'a, Option<Core>>,
    taking_calls: &'a AtomicBool,
}

impl std::ops::Deref for CoreGuard<'_> {
    type Target = Option<Core>;
    fn deref(&self) -> &Option<Core> {
        &self.core
    }
}

impl std::ops::DerefMut for CoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut Option<Core> {
        &mut self.core
    }
}

impl Drop for CoreGuard<'_> {
    fn drop(&mut self) {
        // Written only when it changes: every call's turn releases the lock, and a store each
        // time would keep the line bouncing between the threads that read it.
        let taking = self.core.as_ref().is_some_and(|core| core.accepting);
        if self.taking_calls.load(Ordering::Relaxed) != taking {
            self.taking_calls.store(taking, Ordering::Relaxed);
        }
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
            taking_calls: AtomicBool::new(false),
            wake: Notify::new(),
            spin,
            spin_until: AtomicU64::new(0),
            spin_alone_until: AtomicU64::new(0),
            epoch: Instant::now(),
            reader_awaits_alone_grant: AtomicBool::new(false),
            reader_awaits_beside_grant: AtomicBool::new(false),
            grant_wake: Notify::new(),
        }
    }

    fn since_epoch(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// A call was begun, `alone` (no other call in flight) or not: the reader may spin for
    /// one window waiting for its answer. Gives the call's grant (the end of its window in
    /// nanoseconds since `epoch`; 0 with the mode off), by which the answer a caller's look
    /// takes is matched to the reader's wait for it.
    fn grant_spin(&self, alone: bool) -> u64 {
        let Some(window) = self.spin else {
            return 0;
        };
        let window = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        let until = self.since_epoch().saturating_add(window);
        // Before `spin_until`, so that a reader that sees this grant sees its kind too.
        if alone {
            self.spin_alone_until.fetch_max(until, Ordering::SeqCst);
        }
        // SeqCst here and in the reader: each side writes one of `spin_until` and the flag
        // and then reads the other, so either this sees the flag or the reader sees the grant.
        self.spin_until.fetch_max(until, Ordering::SeqCst);
        if self.awaits_grant(alone).swap(false, Ordering::SeqCst) {
            self.grant_wake.notify_one();
        }
        until
    }

    /// The end of the latest spin window a call granted, in nanoseconds since `epoch` (0: none
    /// yet).
    fn granted_until(&self) -> u64 {
        self.spin_until.load(Ordering::SeqCst)
    }

    /// Whether the window ending at `granted` (as [`granted_until`](Self::granted_until) gave
    /// it) was granted by a call begun alone. Two grants of different kinds made at once may
    /// be read the wrong way round (each writes its kind before its window): a wait counted
    /// with the wrong kind, never a lost one.
    fn granted_alone(&self, granted: u64) -> bool {
        self.spin_alone_until.load(Ordering::SeqCst) >= granted
    }

    /// The reader's flag that it awaits a grant from a call begun `alone`, or beside others.
    fn awaits_grant(&self, alone: bool) -> &AtomicBool {
        if alone {
            &self.reader_awaits_alone_grant
        } else {
            &self.reader_awaits_beside_grant
        }
    }

    /// The core, even if a thread panicked while holding it (every update to it is complete
    /// before anything that can panic runs).
    pub(crate) fn lock(&self) -> CoreGuard<'_> {
        CoreGuard {
            core: self
                .core
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            taking_calls: &self.taking_calls,
        }
    }

    /// Whether a worker is taking calls: connected, ready and verified, and not shutting down
    /// or lost. False while a worker starts, is replaced or is reaped (a call made then waits
    /// for the next worker).
    pub(crate) fn taking_calls(&self) -> bool {
        self.taking_calls.load(Ordering::Relaxed)
    }

    /// Begins `call` on the connected worker and, from a caller's task, writes its frame if no
    /// write is in flight. Gives the call back when no worker is taking calls (during a
    /// handshake, a restart or a shutdown): the supervisor then queues it.
    pub(crate) fn try_begin(&self, call: CallRequest, by: Party) -> Result<(), CallRequest> {
        let (settled, wake, alone, look) = {
            let mut guard = self.lock();
            let Some(core) = guard.as_mut().filter(|core| core.accepting) else {
                return Err(call);
            };
            let deadline = call.deadline;
            core.link.begin(&mut core.session, call);
            let mut settled = core.settle();
            settled.gather = core.session.in_flight() >= GATHER_AT;
            // The supervisor's timer is left armed at the last deadline it saw, so a steady
            // stream of calls with one timeout wakes it once per timeout, not once per call.
            let earlier = core.timer_at.is_none_or(|at| deadline < at);
            let alone = core.session.in_flight() <= 1;
            // A caller that writes its own frame, alone, may look for the answer itself. Only
            // then: a worker whose filter is not verified (whose frames callers may not write
            // themselves) could hold its pipe's lock inside the kernel for good (a `splice` or
            // `sendfile` from an empty socket into it, a read into a page whose fault nobody
            // serves), and a read of that pipe, non-blocking or not, would wait for the lock
            // on the caller's thread.
            let look = (alone && settled.writes_now(by))
                .then(|| core.inlet.clone())
                .flatten();
            (settled, earlier, alone, look)
        };
        if wake {
            self.wake.notify_one();
        }
        let granted = self.grant_spin(alone);
        settled.finish(self, by, None);
        if let Some(inlet) = look {
            inlet.look(self, granted);
        }
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

/// Calls in flight (this one included) from which a caller leaves its write to the writer
/// task, so that the frames of the callers about to run join one write: with fewer, a call's
/// own write is sooner than what sharing one saves.
const GATHER_AT: usize = 4;

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
    /// The read side of the worker's channel, for a caller's look ([`Inlet::look`]).
    pub(crate) inlet: Option<Arc<Inlet>>,
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
    /// Other calls are in flight: their callers may queue frames in a moment, so the write is
    /// left to the writer task, which lets them first.
    gather: bool,
}

impl Settled {
    /// Whether `by` writes this turn's frames itself, at once, in [`finish`](Self::finish).
    fn writes_now(&self, by: Party) -> bool {
        self.write
            .as_ref()
            .is_some_and(|(wire, _)| by != Party::Supervisor && wire.direct && !self.gather)
    }

    /// Acts on a turn, outside the lock: decodes and delivers responses (a lie cuts the worker
    /// off first), writes what this party became the writer of (or hands it to the writer
    /// task), and wakes the supervisor. `turn` comes with the reader's turns: the responses
    /// it decoded under the lock and how to decode the rest. True if the worker lied.
    pub(crate) fn finish(self, live: &Live, by: Party, turn: Option<ReaderTurn<'_>>) -> bool {
        let writes_now = self.writes_now(by);
        let Settled {
            mut wake,
            returned,
            more,
            write,
            updates: _,
            gather,
        } = self;
        if let Some((wire, batch)) = write {
            if writes_now {
                wake |= wire.write_now(batch);
            } else {
                wire.hand_off(batch, gather);
            }
        }
        let lied = match turn {
            Some(turn) => deliver(live, turn, returned, more),
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

/// What a reader's turn hands to [`Settled::finish`] besides what it settled.
pub(crate) struct ReaderTurn<'a> {
    /// The budgets responses decode within.
    pub(crate) limits: &'a ResponseDecoding,
    /// The worker whose session a lie cuts off.
    pub(crate) generation: u64,
    /// Responses decoded under the lock, in the order of their frames, for their callers.
    pub(crate) decoded: &'a mut Vec<Decoded>,
    /// The turn's clock read, before its frames: when its responses were accepted, for their
    /// callers' stats.
    pub(crate) at: std::time::Instant,
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
            inlet: None,
            closed: false,
        }
    }

    /// Applies what the session decided since the last turn: completions are answered
    /// (responses are handed back to decode outside the lock), other events are kept for the
    /// supervisor, and the session's frames join the wire's queue. Call after every change to
    /// the session, before the lock is released.
    pub(crate) fn settle(&mut self) -> Settled {
        let mut settled = Settled::default();
        self.settle_events(&mut settled, None);
        self.settle_transmits(&mut settled);
        settled
    }

    /// The first half of [`settle`](Self::settle): the session's events, into `settled`. The
    /// reader runs it after each frame of its turn, to act on that frame before the next,
    /// with `accepted_at`, the turn's clock read (frames are accepted only there).
    fn settle_events(&mut self, settled: &mut Settled, accepted_at: Option<Instant>) {
        while let Some(event) = self.session.poll_event() {
            match event {
                Event::Completed { id, outcome } => {
                    if let Some(returned) = self.link.complete(id, outcome, accepted_at) {
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
    }

    /// The second half of [`settle`](Self::settle): the session's frames, onto the wire (or
    /// left to the supervisor once the session is closed).
    fn settle_transmits(&mut self, settled: &mut Settled) {
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
    }
}

#[cfg(test)]
mod tests {
    use super::recording::{ready_sessions, recording_wire};
    use super::*;
    use crate::host::decode_response;
    use crate::reply::{pair, Reply};

    /// Begins an `echo` call with local handle `key`, due in a minute, as a caller does; its
    /// answer is kept by the caller's handle returned.
    fn begin_echo(live: &Live, key: u64) -> Reply<u64> {
        let (answer, reply) = pair(decode_response::<u64>);
        let call = CallRequest {
            key,
            method: "echo".into(),
            body: Bytes::from_static(&[0]).into(),
            deadline: Instant::now() + Duration::from_secs(60),
            reply,
            updates: None,
        };
        assert!(live.try_begin(call, Party::Caller).is_ok());
        answer
    }

    #[test]
    fn a_call_begun_with_no_other_in_flight_grants_an_alone_window_and_one_beside_others_does_not()
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _entered = runtime.enter();
        let live = Live::new(Some(Duration::from_millis(1)));
        let mut core = Core::new(1, ready_sessions().0, recording_wire().0);
        core.accepting = true;
        *live.lock() = Some(core);
        let mut answers = Vec::new();
        let mut alone = Vec::new();
        for key in 0..3 {
            answers.push(begin_echo(&live, key));
            alone.push(live.granted_alone(live.granted_until()));
            // Each grant ends later than the last.
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(alone, [true, false, false]);
    }

    #[test]
    fn callers_leave_their_writes_to_the_writer_from_gather_at_calls_in_flight() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (wire, writes) = recording_wire();
            let live = Arc::new(Live::new(None));
            let mut core = Core::new(1, ready_sessions().0, Arc::clone(&wire));
            core.accepting = true;
            *live.lock() = Some(core);
            let writer = tokio::spawn(drive_writes(wire, Arc::clone(&live)));
            let mut answers = Vec::new();
            let calls = GATHER_AT + 2;
            for key in 0..calls as u64 {
                answers.push(begin_echo(&live, key));
            }
            // With fewer calls in flight each caller wrote its own frame at once; from
            // `GATHER_AT` on they left theirs to the writer task, which has not run yet.
            let direct = vec![1; GATHER_AT - 1];
            let frames_per_write =
                || -> Vec<usize> { writes.lock().unwrap().iter().map(Vec::len).collect() };
            assert_eq!(frames_per_write(), direct);
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            let gathered = calls - (GATHER_AT - 1);
            assert_eq!(frames_per_write(), [direct, vec![gathered]].concat());
            writer.abort();
        });
    }
}
