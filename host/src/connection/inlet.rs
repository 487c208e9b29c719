//! The read side of one worker's channel, shared by the reader task and the callers: the
//! receiver and what a turn carries over from the last, behind one lock, so that turns are
//! taken one at a time whoever takes them.
//!
//! The reader task takes every turn but one kind: a caller that has just written its frame,
//! with no other call in flight, may take one turn itself ([`Inlet::look`]) while the reader
//! waits for input with nothing in hand. When the worker shares the caller's CPU, the kernel
//! usually runs it as the caller's write wakes it, and its answer is in the pipe before the
//! write returns: the caller then takes it with one non-blocking `read`, where otherwise the
//! runtime would poll its I/O, wake the reader, and the reader wake the caller. A look takes
//! only whole frames already read, and the turn it takes is the reader's own (time first,
//! each frame settled before the next, a liar cut off before the lock is released), under the
//! same lock; anything it leaves (frames not yet handed over, updates to deliver, the end of
//! the stream) it leaves to the reader, which it wakes. In the low-latency mode, where the
//! reader spins between turns instead of waiting, the caller's look polls in place for its
//! answer (at most the spin window and a slice), so the answer needs no turn of the runtime.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use airlock_protocol::transport::FrameReceiver;
use bytes::Bytes;

use super::reader::{take_buffered, take_turn, Received, Turned, ITEMS_IN_TURN, TURN_FRAMES};
use super::{Live, Party, ReaderTurn};
use crate::reply::Decoded;
use crate::response::ResponseDecoding;
use crate::updates::Updates;

/// One worker's channel, read side: see the module's docs.
pub(crate) struct Inlet {
    /// Which worker this reads: a turn touches only that worker's session.
    pub(super) generation: u64,
    /// The budgets responses decode within.
    pub(super) limits: ResponseDecoding,
    /// The same, narrowed for the responses a turn decodes under the core's lock.
    in_turn: ResponseDecoding,
    state: Mutex<State>,
}

/// What turns share, under [`Inlet`]'s lock. Taken before the core's lock, never after it.
pub(super) struct State {
    pub(super) receiver: Box<dyn FrameReceiver>,
    /// Frames taken but not yet handed to the session (a turn ends early after some frames).
    pub(super) taken: VecDeque<Received>,
    /// Room for the responses a turn decodes, kept between turns (empty then) so it is
    /// reused; the turn itself holds them ([`State::turn`]).
    decoded: Vec<Decoded>,
    /// Updates a caller's turn brought, for the reader to deliver before anything more of the
    /// worker's is taken.
    pub(super) updates: Vec<(Updates, Bytes)>,
    /// The reader's work is over: the stream ended or failed, or the worker lied or is gone.
    pub(super) ended: bool,
    /// A caller may take a turn: the reader waits for input with nothing in hand (in the
    /// low-latency mode, between the slices it polls in), the frame cap raised. Set by the
    /// reader as its wait begins, cleared by whoever takes the next turn.
    open: bool,
    /// In the low-latency mode, the answer a caller's look took last, for the reader's measure
    /// of whether spinning pays: the grant of the call it answered and when it came.
    pub(super) answered_by_look: Option<(u64, std::time::Instant)>,
    /// The reader's waker, as of its wait: a caller's turn that leaves it work wakes it.
    reader: Option<Waker>,
    looks: LookPolicy,
}

impl Inlet {
    /// The read side of worker `generation`'s channel.
    pub(crate) fn new(
        receiver: Box<dyn FrameReceiver>,
        generation: u64,
        limits: ResponseDecoding,
    ) -> Self {
        Self {
            generation,
            in_turn: limits.with_items_at_most(ITEMS_IN_TURN),
            limits,
            state: Mutex::new(State {
                receiver,
                taken: VecDeque::with_capacity(TURN_FRAMES),
                decoded: Vec::with_capacity(TURN_FRAMES),
                updates: Vec::new(),
                ended: false,
                open: false,
                answered_by_look: None,
                reader: None,
                looks: LookPolicy::default(),
            }),
        }
    }

    /// The state. A thread that panicked while holding it may have left it half done: the
    /// reader's work ends then. (A response type's `Deserialize` that panics on the worker's
    /// bytes does not get here: that is a lie, `response::unless_it_panics`.)
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| {
            let mut state = poisoned.into_inner();
            state.ended = true;
            state.open = false;
            state
        })
    }

    /// The reader's wait: ready once frames are taken (or were left by a caller's turn),
    /// updates wait for delivery, or the reader's work is over. While it waits, a caller may
    /// look if `open_to_callers`.
    pub(super) fn wait(&self, open_to_callers: bool) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.lock().poll_wait(cx, open_to_callers))
    }

    /// One turn with the frames taken, as [`State::turn`], by the reader.
    pub(super) fn reader_turn(&self, live: &Live) -> Option<(bool, Vec<(Updates, Bytes)>)> {
        let mut state = self.lock();
        state.open = false;
        state.turn(self, live, Party::Reader)
    }

    /// A caller's look, just after it wrote its frame with no other call in flight: if the
    /// reader waits with nothing in hand and looks have been paying, one non-blocking read;
    /// whole frames it brings are taken through one turn, as the reader would. Never waits
    /// for the lock or for input. In the low-latency mode the look reads until a frame comes,
    /// for at most the spin window and [`IN_PLACE_SLICE`](airlock_protocol::spin::IN_PLACE_SLICE).
    pub(crate) fn look(&self, live: &Live, granted: u64) {
        let Ok(mut guard) = self.state.try_lock() else {
            // The reader (or another caller) is taking a turn, or a turn panicked.
            return;
        };
        let state = &mut *guard;
        if !state.open || !state.looks.due() {
            return;
        }
        let came = match live.spin {
            None => {
                let came = state.receiver.read_now();
                if came {
                    take_buffered(&mut *state.receiver, &mut state.taken, 0);
                }
                came
            }
            Some(window) => state.spin_for_frames(window),
        };
        state.looks.found(!state.taken.is_empty());
        if !came {
            return;
        }
        if live.spin.is_some() && !state.taken.is_empty() {
            state.answered_by_look = Some((granted, std::time::Instant::now()));
        }
        if state.taken.is_empty() {
            // Bytes short of a frame, the end of the stream, or the rest of a large frame:
            // the reader's to read.
            state.wake_reader();
            return;
        }
        state.open = false;
        match state.turn(self, live, Party::Caller) {
            Some((ended, updates)) => {
                state.ended = ended;
                state.updates = updates;
            }
            None => state.ended = true,
        }
        if !state.ended && state.taken.is_empty() && state.updates.is_empty() {
            // A whole frame the read brought beyond the turn's bounds is the reader's too.
            if let Some(item) = state.receiver.recv_buffered() {
                state.taken.push_back(item);
            }
        }
        if state.ended || !state.taken.is_empty() || !state.updates.is_empty() {
            state.wake_reader();
        } else {
            // Nothing left in hand: the reader still waits as it did.
            state.open = true;
        }
    }
}

impl State {
    /// Reads until whole frames are taken, something else comes (part of a frame, the end
    /// of the stream, an error), `window` or one slice passes: whether anything came.
    fn spin_for_frames(&mut self, window: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + window;
        let came = airlock_protocol::spin::poll_in_place(&mut *self.receiver, |now| now < until);
        if came {
            take_buffered(&mut *self.receiver, &mut self.taken, 0);
        }
        came
    }

    fn poll_wait(&mut self, cx: &mut Context<'_>, open_to_callers: bool) -> Poll<()> {
        if self.ended || !self.taken.is_empty() || !self.updates.is_empty() {
            self.open = false;
            return Poll::Ready(());
        }
        match super::reader::poll_take(&mut *self.receiver, &mut self.taken, cx) {
            Poll::Ready(()) => {
                self.open = false;
                Poll::Ready(())
            }
            Poll::Pending => {
                self.open = open_to_callers;
                if !self
                    .reader
                    .as_ref()
                    .is_some_and(|waker| waker.will_wake(cx.waker()))
                {
                    self.reader = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    fn wake_reader(&mut self) {
        self.open = false;
        if let Some(waker) = &self.reader {
            waker.wake_by_ref();
        }
    }

    /// One turn: the frames taken go to worker `inlet.generation`'s session under the core's
    /// lock, time first ([`take_turn`]), then the turn is finished outside it: responses
    /// decoded and delivered, a liar cut off. Gives whether the reader's work is over (the
    /// stream ended or the worker lied) and the updates to deliver before the next turn;
    /// `None` if the worker's core is gone.
    fn turn(
        &mut self,
        inlet: &Inlet,
        live: &Live,
        by: Party,
    ) -> Option<(bool, Vec<(Updates, Bytes)>)> {
        // The responses the turn decodes are held here, not in the shared state, until they
        // are published: should the turn panic, they are dropped with it and their callers
        // answered `Shutdown`, never left in an inlet nobody takes turns on again.
        let mut decoded = std::mem::take(&mut self.decoded);
        let turned = {
            let mut guard = live.lock();
            // Only this worker's own core: once it is put down, its frames and its end of
            // stream are nobody's business.
            let core = guard
                .as_mut()
                .filter(|core| core.generation == inlet.generation)?;
            take_turn(core, &mut self.taken, &inlet.in_turn, &mut decoded)
        };
        let Turned {
            mut settled,
            last,
            at,
        } = turned;
        let updates = std::mem::take(&mut settled.updates);
        let turn = ReaderTurn {
            limits: &inlet.limits,
            generation: inlet.generation,
            decoded: &mut decoded,
            at,
        };
        let lied = settled.finish(live, by, Some(turn));
        // Empty again: its room is kept for the next turn.
        self.decoded = decoded;
        Some((lied || last, updates))
    }
}

/// Whether a caller's look is worth its `read`: it is when the worker answers while the
/// caller writes (it shares the caller's CPU), and not otherwise (on another CPU the answer
/// comes microseconds later, and the read finds nothing). Each look that finds a frame adds
/// two to a score (up to [`LookPolicy::MOST`]), each that finds none takes one away; at zero,
/// callers look only once in [`LookPolicy::PROBE_EVERY`] chances, to see whether that
/// changed. So a look is made while at least a third of them pay.
#[derive(Debug)]
struct LookPolicy {
    score: u8,
    since_probe: u8,
}

impl Default for LookPolicy {
    fn default() -> Self {
        Self {
            score: 2,
            since_probe: 0,
        }
    }
}

impl LookPolicy {
    const MOST: u8 = 16;
    const PROBE_EVERY: u8 = 32;

    fn due(&mut self) -> bool {
        if self.score > 0 {
            return true;
        }
        self.since_probe += 1;
        if self.since_probe >= Self::PROBE_EVERY {
            self.since_probe = 0;
            return true;
        }
        false
    }

    fn found(&mut self, frame: bool) {
        self.score = if frame {
            self.score.saturating_add(2).min(Self::MOST)
        } else {
            self.score.saturating_sub(1)
        };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;

    use super::*;
    use crate::connection::read_frames;
    use crate::connection::recording::{
        encoded, reaped, runtime, update_then_answer, AnsweringWorker, Calls, Pipe, Piped,
    };
    use crate::connection::wire::now_or_never;
    use crate::updates::{Cost, UpdateBudget};
    use crate::CallError;

    fn pipe_of(pipe: &Arc<Mutex<Pipe>>) -> std::sync::MutexGuard<'_, Pipe> {
        pipe.lock().unwrap()
    }

    /// A caller whose answer is already in the pipe takes it with one read of its own and
    /// one turn: the reader never reads it, and waits on, open to the next caller's look.
    #[test]
    fn a_caller_takes_the_answer_already_in_the_pipe_and_the_reader_waits_on() {
        runtime().block_on(async {
            let mut calls = Calls::<u64>::begin(vec![None, None]);
            let (receiver, pipe) = Piped::new();
            let budget = UpdateBudget::new(Cost::default());
            let (inlet, reader) = calls.reader_over(receiver, budget);
            let mut reader = std::pin::pin!(reader);
            assert!(now_or_never(reader.as_mut()).is_none());
            for (index, value) in [5, 7].into_iter().enumerate() {
                let id = calls.ids[index];
                calls.worker.reply_return(id, encoded(value)).unwrap();
                pipe_of(&pipe).frames = calls.written();
                inlet.look(&calls.live, calls.live.granted_until());
                assert_eq!(now_or_never(&mut calls.answers[index]), Some(Ok(value)));
                assert!(now_or_never(reader.as_mut()).is_none());
            }
            assert_eq!(pipe_of(&pipe).direct_reads, 2);
            assert_eq!(pipe_of(&pipe).runtime_reads, 0, "the reader read an answer");
        });
    }

    /// The look is made where a call is begun: a caller that writes its own frame, with no
    /// other call in flight, to a worker that answers while the write is made (as one sharing
    /// the caller's CPU does), has its answer when `try_begin` returns.
    #[test]
    fn a_caller_that_writes_alone_to_a_worker_that_answers_at_once_has_its_answer_on_return() {
        runtime().block_on(async {
            let worker = AnsweringWorker::new(true);
            for key in 0..3u64 {
                let mut answer = worker.call::<u64>(key, key + 10, Party::Caller);
                assert_eq!(now_or_never(&mut answer), Some(Ok(key + 10)));
            }
            assert_eq!(
                pipe_of(&worker.pipe).runtime_reads,
                0,
                "the reader read one"
            );
            // A call begun by the supervisor (one that waited for the worker) never looks.
            let mut answer = worker.call::<u64>(3, 1, Party::Supervisor);
            assert!(now_or_never(&mut answer).is_none());
            assert_eq!(pipe_of(&worker.pipe).direct_reads, 3);
        });
    }

    /// In the low-latency mode the reader spins between its turns and never waits open to
    /// callers; a caller that writes alone polls in place for its answer itself, and takes it
    /// through the reader's own turn, once the frame cap is raised.
    #[test]
    fn in_the_low_latency_mode_a_caller_writing_alone_polls_for_its_answer_itself() {
        runtime().block_on(async {
            let window = Some(std::time::Duration::from_millis(50));
            let mut worker = AnsweringWorker::with(true, window, true);
            for key in 0..3u64 {
                let mut answer = worker.call::<u64>(key, key + 10, Party::Caller);
                assert_eq!(now_or_never(&mut answer), Some(Ok(key + 10)));
            }
            assert_eq!(pipe_of(&worker.pipe).direct_reads, 3);
            assert_eq!(
                pipe_of(&worker.pipe).runtime_reads,
                0,
                "the reader read one"
            );
            // The last answer a look took is left for the reader's measure of whether spinning
            // pays, under its call's grant (the latest), and the reader's next turn takes it.
            let inlet = worker.live.lock().as_ref().unwrap().inlet.clone().unwrap();
            let answered = inlet.lock().answered_by_look;
            assert_eq!(
                answered.map(|(grant, _)| grant),
                Some(worker.live.granted_until())
            );
            let _ = now_or_never(worker.reader.as_mut());
            assert_eq!(
                inlet.lock().answered_by_look,
                None,
                "the reader never took it"
            );
            // Before the reader raised the frame cap (here it never will): no look.
            let mut unraised = AnsweringWorker::with(true, window, false);
            let mut answer = unraised.call::<u64>(0, 5, Party::Caller);
            assert!(now_or_never(&mut answer).is_none());
            assert_eq!(pipe_of(&unraised.pipe).direct_reads, 0, "a caller looked");
            let _ = now_or_never(unraised.reader.as_mut());
        });
    }

    /// A caller never looks where it may not write its own frame: a worker whose filter is not
    /// verified could hold its pipe's lock inside the kernel (`splice`, `userfaultfd`), and a
    /// read of that pipe, non-blocking or not, would wait for the lock. Its answers are the
    /// reader's, which reads them only once the OS says they came, in the low-latency mode too
    /// (where it would otherwise poll in place).
    #[test]
    fn a_caller_never_looks_where_it_may_not_write_its_own_frame() {
        for spin in [None, Some(std::time::Duration::from_millis(50))] {
            runtime().block_on(async {
                let mut worker = AnsweringWorker::with(false, spin, true);
                let mut answer = worker.call::<u64>(0, 5, Party::Caller);
                assert!(now_or_never(&mut answer).is_none());
                // The writer task writes the frame, and the reader takes the answer.
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                    let _ = now_or_never(worker.reader.as_mut());
                }
                assert_eq!(now_or_never(&mut answer), Some(Ok(5)), "{spin:?}");
                assert_eq!(
                    pipe_of(&worker.pipe).direct_reads,
                    0,
                    "read in place: {spin:?}"
                );
                assert_eq!(pipe_of(&worker.pipe).runtime_reads, 1, "{spin:?}");
            });
        }
    }

    /// Invariant: a worker whose response does not decode is cut off before any later frame
    /// of it is accepted, when a caller's look takes the lie too: the answer read with it
    /// never reaches its caller, who hears `WorkerLost` once the liar is reaped, and the
    /// reader's work is over.
    #[test]
    fn a_lie_a_caller_takes_cuts_the_worker_off_before_the_answer_read_with_it() {
        runtime().block_on(async {
            let mut calls = Calls::<u64>::begin(vec![None, None]);
            let (receiver, pipe) = Piped::new();
            let (inlet, reader) = calls.reader_over(receiver, UpdateBudget::new(Cost::default()));
            let mut reader = std::pin::pin!(reader);
            assert!(now_or_never(reader.as_mut()).is_none());
            // An empty body is not a `u64`; the second answer is honest.
            calls.answer(vec![Bytes::new(), encoded(7)]);
            pipe_of(&pipe).frames = calls.written();
            inlet.look(&calls.live, calls.live.granted_until());
            assert!(calls.live.lock().as_ref().unwrap().session.is_closed());
            assert!(now_or_never(&mut calls.answers[1]).is_none());
            assert!(
                now_or_never(reader.as_mut()).is_some(),
                "the reader went on"
            );
            reaped(&calls.live);
            assert!(matches!(
                now_or_never(&mut calls.answers[0]),
                Some(Err(CallError::Decode(_)))
            ));
            let second = now_or_never(&mut calls.answers[1]);
            assert!(
                matches!(second, Some(Err(CallError::WorkerLost(_)))),
                "the answer read with the lie was delivered: {second:?}"
            );
            assert_eq!(pipe_of(&pipe).runtime_reads, 0);
        });
    }

    /// A streaming call's update and its answer, taken by a caller's look, reach the caller
    /// in that order even when the update must wait for room: the look leaves the update and
    /// the answer's frame to the reader, which delivers the update first.
    #[test]
    fn an_update_a_caller_takes_reaches_its_caller_before_the_answer_read_with_it() {
        update_then_answer(|calls, frames, budget| {
            let (receiver, pipe) = Piped::new();
            let (inlet, reader) = calls.reader_over(receiver, budget);
            let mut reader = Box::pin(reader);
            assert!(now_or_never(reader.as_mut()).is_none());
            pipe_of(&pipe).frames = frames;
            inlet.look(&calls.live, calls.live.granted_until());
            assert_eq!(
                pipe_of(&pipe).runtime_reads,
                0,
                "the reader read the frames"
            );
            // No look while the reader holds them.
            inlet.look(&calls.live, calls.live.granted_until());
            assert_eq!(pipe_of(&pipe).direct_reads, 1);
            reader
        });
    }

    thread_local! {
        /// Whether a `Touchy` was given 666 to decode on this thread.
        static TOUCHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// A response type whose `Deserialize` panics on one value, which the worker chooses.
    #[derive(Debug, PartialEq)]
    struct Touchy(u64);

    impl<'de> serde::Deserialize<'de> for Touchy {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let value = <u64 as serde::Deserialize>::deserialize(deserializer)?;
            if value == 666 {
                TOUCHED.with(|touched| touched.set(true));
                panic!("Touchy panics on 666");
            }
            Ok(Self(value))
        }
    }

    /// A worker's answer that makes the caller's response type panic, taken by the caller's
    /// own look, is a lie: the worker is cut off, nothing unwinds through the caller's
    /// `try_begin`, and the caller hears `Decode` once the worker is reaped.
    #[test]
    fn an_answer_that_makes_the_response_type_panic_in_a_look_is_a_lie() {
        runtime().block_on(async {
            let mut worker = AnsweringWorker::new(true);
            let mut answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                worker.call::<Touchy>(0, 666, Party::Caller)
            }))
            .expect("the response type's panic unwound through try_begin");
            assert!(
                TOUCHED.with(std::cell::Cell::get),
                "the worker's bytes never reached the response type: the attack is not live"
            );
            assert_eq!(pipe_of(&worker.pipe).runtime_reads, 0, "the reader took it");
            assert!(worker.live.lock().as_ref().unwrap().session.is_closed());
            assert!(
                now_or_never(worker.reader.as_mut()).is_some(),
                "the reader went on"
            );
            reaped(&worker.live);
            let heard = now_or_never(&mut answer);
            assert!(
                matches!(heard, Some(Err(CallError::Decode(_)))),
                "{heard:?}"
            );
        });
    }

    /// An answer decoded in a turn and held until the turn ends reaches its caller when a
    /// later answer of the same read makes its response type panic (the liar is cut off after
    /// it, as after any answer that came before a lie).
    #[test]
    fn an_answer_held_in_a_turn_reaches_its_caller_when_a_later_one_makes_its_type_panic() {
        runtime().block_on(async {
            let mut calls = Calls::<Touchy>::begin(vec![None, None]);
            calls.answer(vec![encoded(7), encoded(666)]);
            let (receiver, pipe) = Piped::new();
            let (inlet, reader) = calls.reader_over(receiver, UpdateBudget::new(Cost::default()));
            calls.live.lock().as_mut().unwrap().inlet = Some(Arc::clone(&inlet));
            let mut reader = std::pin::pin!(reader);
            assert!(now_or_never(reader.as_mut()).is_none());
            pipe_of(&pipe).frames = calls.written();
            inlet.look(&calls.live, calls.live.granted_until());
            assert!(TOUCHED.with(std::cell::Cell::get), "the attack is not live");
            assert_eq!(now_or_never(&mut calls.answers[0]), Some(Ok(Touchy(7))));
            assert!(calls.live.lock().as_ref().unwrap().session.is_closed());
            reaped(&calls.live);
            let second = now_or_never(&mut calls.answers[1]);
            assert!(
                matches!(second, Some(Err(CallError::Decode(_)))),
                "{second:?}"
            );
        });
    }

    /// A caller never reads while the reader has not raised the frame cap (an answer read
    /// under the handshake's cap would be refused as too large).
    #[test]
    fn no_caller_looks_before_the_reader_has_raised_the_frame_cap() {
        runtime().block_on(async {
            let mut calls = Calls::<u64>::begin(vec![None]);
            let (receiver, pipe) = Piped::new();
            let inlet = Arc::new(Inlet::new(receiver, 1, ResponseDecoding::for_tests()));
            let (_raise, raised) = tokio::sync::oneshot::channel();
            let budget = UpdateBudget::new(Cost::default());
            let reader = read_frames(Arc::clone(&inlet), Arc::clone(&calls.live), raised, budget);
            let mut reader = std::pin::pin!(reader);
            assert!(now_or_never(reader.as_mut()).is_none());
            calls.answer(vec![encoded(5)]);
            pipe_of(&pipe).frames = calls.written();
            inlet.look(&calls.live, calls.live.granted_until());
            assert_eq!(pipe_of(&pipe).direct_reads, 0);
            assert!(now_or_never(&mut calls.answers[0]).is_none());
        });
    }

    /// Looks stop while they find nothing (the worker answers later, on another CPU), but
    /// for one in `PROBE_EVERY`, and go on again once one finds a frame.
    #[test]
    fn looks_that_find_nothing_stop_but_for_probes_and_one_that_finds_a_frame_resumes_them() {
        let mut looks = LookPolicy::default();
        let made = |looks: &mut LookPolicy, chances: usize| -> usize {
            (0..chances)
                .filter(|_| {
                    let due = looks.due();
                    if due {
                        looks.found(false);
                    }
                    due
                })
                .count()
        };
        let chances = 10 * usize::from(LookPolicy::PROBE_EVERY);
        // The first score's worth, then one probe in `PROBE_EVERY`.
        assert_eq!(made(&mut looks, chances), 2 + 9);
        assert!(!looks.due() || looks.score == 0);
        looks.found(true);
        assert!(looks.due());
        assert!(looks.due(), "a found frame allows the next look too");
    }

    /// In the low-latency mode, while the reader waits for room to deliver a streaming call's
    /// update it took itself, a caller's look does not take the call's answer (which would
    /// reach the caller before its update): the reader is not open to looks then.
    #[test]
    fn no_look_takes_the_answer_while_the_reader_delivers_an_update_in_the_mode() {
        runtime().block_on(async {
            let (sender, mut updates) = tokio::sync::mpsc::unbounded_channel();
            let streaming = Updates {
                decode: crate::host::decode_update::<u64>,
                sender,
            };
            let window = std::time::Duration::from_millis(200);
            let mut calls = Calls::<u64>::begin_spinning(vec![Some(streaming)], window);
            let id = calls.ids[0];
            calls.worker.reply_progress(id, encoded(1)).unwrap();
            calls.worker.reply_return(id, encoded(2)).unwrap();
            let mut frames = calls.written();
            assert_eq!(frames.len(), 2);
            let held = Cost { bytes: 1, items: 1 };
            let budget = UpdateBudget::new(held);
            assert!(now_or_never(budget.take(held)).is_some());
            let (receiver, pipe) = Piped::new();
            let (inlet, reader) = calls.reader_over(receiver, Arc::clone(&budget));
            let mut reader = Box::pin(reader);
            // Only the update has come: the reader takes it and waits for room.
            pipe_of(&pipe).frames.push_back(frames.pop_front().unwrap());
            for _ in 0..5 {
                assert!(now_or_never(reader.as_mut()).is_none());
            }
            assert!(
                pipe_of(&pipe).frames.is_empty(),
                "the reader did not take the update"
            );
            assert!(
                updates.try_recv().is_err(),
                "the update did not wait for room"
            );
            // The answer comes while the reader waits for room; a caller looks.
            pipe_of(&pipe).frames.push_back(frames.pop_front().unwrap());
            let direct = pipe_of(&pipe).direct_reads;
            inlet.look(&calls.live, calls.live.granted_until());
            assert_eq!(
                pipe_of(&pipe).direct_reads,
                direct,
                "a look read while the reader delivers"
            );
            assert!(
                now_or_never(&mut calls.answers[0]).is_none(),
                "the answer before its update"
            );
            budget.give_back(held);
            for _ in 0..5 {
                assert!(now_or_never(reader.as_mut()).is_none());
            }
            let update = updates.try_recv().expect("the update, once there is room");
            assert_eq!(update.update.downcast_ref::<u64>(), Some(&1));
            assert_eq!(now_or_never(&mut calls.answers[0]), Some(Ok(2)));
        });
    }
}
