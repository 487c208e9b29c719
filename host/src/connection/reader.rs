//! The reader task and the turn it shares with a caller's look: the worker's frames, taken as
//! many at a time as came in one read and handed to the session under the lock with time
//! first, the responses they complete decoded before the next frame is handed over and
//! delivered outside the lock, a liar cut off before its next frame is accepted.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use airlock_codec::DecodeError;
use airlock_protocol::transport::FrameReceiver;
use airlock_protocol::{AbortReason, CloseReason, TransportError};
use bytes::Bytes;
use tokio::sync::oneshot;

use super::inlet::Inlet;
use super::reader_spin::{Polling, ReaderSpin, Turn};
use super::{Core, Live, Party, ReaderTurn, Returned, Settled};
use crate::reply::{Decoded, Replier};
use crate::response::ResponseDecoding;
use crate::updates::{Delivered, UpdateBudget, Updates};
use crate::CallError;

/// Decodes a response outside the lock, within the host's full budgets: the body is lent to
/// the `Blob`s in it (a large one keeps the frame's bytes). A refusal is logged, with the
/// budget and the method.
fn decode(
    returned: Returned,
    limits: &ResponseDecoding,
) -> Result<Decoded, (Replier, DecodeError)> {
    let body = &returned.body;
    let reply = returned.reply;
    let decoded = airlock_protocol::blob::lending(body, || reply.returned(body, limits));
    if let Err((_, err)) = &decoded {
        limits.refused(&returned.method, err);
    }
    decoded
}

/// Decodes a response in the reader's turn, under the lock, if it is small: a body of at most
/// [`DECODE_IN_TURN`] bytes that decodes within `in_turn`, whose item budget is at most
/// [`ITEMS_IN_TURN`]. Anything else is given back, undecoded and unjudged, to be decoded
/// outside the lock within the full budgets (a lie or not): so the work a turn does under the
/// lock is bounded by bytes and items (see [`ITEMS_IN_TURN`] for what the response type adds),
/// and no response is refused for the narrower budget. No `Blob` is lent from a body this
/// small (`blob::LENT_FROM` is 64 KiB), so nothing is lent here.
fn decode_in_turn(returned: Returned, in_turn: &ResponseDecoding) -> Result<Decoded, Returned> {
    if returned.body.len() > DECODE_IN_TURN {
        return Err(returned);
    }
    let Returned {
        body,
        method,
        reply,
    } = returned;
    match reply.returned(&body, in_turn) {
        Ok(decoded) => Ok(decoded),
        Err((reply, _)) => Err(Returned {
            body,
            method,
            reply,
        }),
    }
}

/// Decodes what the reader's turn left to decode outside the lock and delivers every response
/// of the turn, in the order of their frames. A response that does not decode is a lie: the
/// worker is cut off before the reader accepts another frame, and before any response of the
/// turn is published (so no caller given a response in it can begin a call that reaches the
/// liar; failures, cancellations and timeouts reach their callers as the session settles
/// them); the liar's caller hears `Decode` once the worker is reaped (as the calls lost with
/// it hear `WorkerLost`), so nothing of the liar still runs then. True if the worker lied.
pub(super) fn deliver(
    live: &Live,
    turn: ReaderTurn<'_>,
    returned: Option<Returned>,
    more: Vec<Returned>,
) -> bool {
    let mut refused = Vec::new();
    // Responses decoded in the turn were accepted at its clock read; one decoded here (after
    // them, in frame order) only once its decode is done, which its caller waited through.
    let decoded_in_turn = turn.decoded.len();
    let mut decoded_here = false;
    for returned in returned.into_iter().chain(more) {
        match decode(returned, turn.limits) {
            Ok(decoded) => {
                turn.decoded.push(decoded);
                decoded_here = true;
            }
            Err(lie) => refused.push(lie),
        }
    }
    let decoded_at = if decoded_here {
        Instant::now()
    } else {
        turn.at
    };
    let lied = !refused.is_empty();
    if lied {
        cut_off_liar(live, turn.generation, refused);
    }
    for (index, decoded) in turn.decoded.drain(..).enumerate() {
        decoded.publish(if index < decoded_in_turn {
            turn.at
        } else {
            decoded_at
        });
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
        match crate::response::unless_it_panics(|| (updates.decode)(&body, limits)) {
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
                cut_off_liar(live, generation, Vec::new());
                return false;
            }
        }
    }
    true
}

/// A response or an update did not decode: the worker lied, and its session ends before
/// anything else of it is accepted. The callers of the `refused` responses are answered
/// `Decode` once the worker is reaped (`Link::fail_all`).
fn cut_off_liar(live: &Live, generation: u64, refused: Vec<(Replier, DecodeError)>) {
    let settled = {
        let mut guard = live.lock();
        let Some(core) = guard.as_mut().filter(|core| core.generation == generation) else {
            drop(guard);
            // This worker's core is gone: taken once the worker was reaped, or as the
            // supervisor was dropped with its runtime (which kills the worker with its
            // handle). There is nothing left to wait for.
            for (reply, err) in refused {
                reply.fail(CallError::Decode(err));
            }
            return;
        };
        core.link.refused.extend(refused);
        core.session
            .abort(CloseReason::Aborted(AbortReason::UndecodableResponse));
        core.settle()
    };
    settled.finish(live, Party::Reader, None);
}

/// What the receiver gave: a frame, the end of the stream, or a transport error.
pub(super) type Received = Result<Option<Bytes>, TransportError>;

/// The most frames a turn of the reader takes: pipelined answers share one lock and one clock
/// read, and callers wait on the lock for at most this many frames.
pub(super) const TURN_FRAMES: usize = 64;

/// The reader takes no further frame into a turn once those taken reach this many bytes, so a
/// turn holds at most this much besides its last frame: a worker cannot make the host hold
/// more frames at once by writing them together than by writing them one by one.
const TURN_BYTES: usize = 64 * 1024;

/// The largest response body a turn decodes under the lock, so that the frames after it can
/// be handed to the session in the same turn; a larger one ends its turn and is decoded
/// outside the lock.
const DECODE_IN_TURN: usize = 4096;

/// The most sequence elements and map entries a response decoded under the lock may hold (its
/// bytes alone do not bound them: a 3-byte body can hold a million zero-sized elements); a
/// response with more ends its turn and is decoded outside the lock. With [`TURN_FRAMES`] and
/// [`DECODE_IN_TURN`] it bounds the decoding a turn does under the lock, up to a factor of the
/// response type: fixed arity (arrays, tuples, struct fields) is not counted as items, so a
/// response type of nested arrays multiplies it, for an honest answer as for a hostile one.
pub(super) const ITEMS_IN_TURN: usize = 256;

/// Polls for the worker's next frame into `taken` (empty), then takes the frames that came
/// with it ([`take_buffered`]). Cancel-safe: it takes nothing until it is ready.
pub(super) fn poll_take(
    receiver: &mut dyn FrameReceiver,
    taken: &mut VecDeque<Received>,
    cx: &mut std::task::Context<'_>,
) -> Poll<()> {
    let first = std::task::ready!(receiver.poll_recv(cx));
    let frame_len = match &first {
        Ok(Some(frame)) => Some(frame.len()),
        _ => None,
    };
    taken.push_back(first);
    // The end of the stream or an error: nothing follows it.
    if let Some(frame_len) = frame_len {
        take_buffered(receiver, taken, frame_len);
    }
    Poll::Ready(())
}

/// Takes into `taken` (holding frames of `bytes` in all) the frames the receiver already
/// holds: no further read, so the callers the turn answers are not kept waiting for a read
/// that finds nothing, until [`TURN_FRAMES`] are taken or they reach [`TURN_BYTES`]. The end
/// of the stream or an error ends the taking.
pub(super) fn take_buffered(
    receiver: &mut dyn FrameReceiver,
    taken: &mut VecDeque<Received>,
    mut bytes: usize,
) {
    while taken.len() < TURN_FRAMES && bytes < TURN_BYTES {
        let Some(item) = receiver.recv_buffered() else {
            return;
        };
        let frame_len = match &item {
            Ok(Some(frame)) => Some(frame.len()),
            _ => None,
        };
        taken.push_back(item);
        let Some(frame_len) = frame_len else {
            return;
        };
        bytes = bytes.saturating_add(frame_len);
    }
}

/// What a turn under the lock did.
pub(super) struct Turned {
    pub(super) settled: Settled,
    /// The stream ended (or failed): the reader's last turn.
    pub(super) last: bool,
    /// The turn's clock read, before its frames.
    pub(super) at: Instant,
}

/// One turn of the reader under the lock: time first, then the frames `taken`, each settled
/// before the next is handed to the session. A small response is decoded here
/// ([`decode_in_turn`]); the turn ends after a frame whose response is not (it is decoded
/// outside the lock, and a lie cuts the worker off, before the reader's next turn), after one
/// that brought a streaming call's updates (delivered, perhaps waiting for room, before the
/// call's next frame), and at the end of the stream. Frames not handed over stay in `taken`
/// for the next turn.
pub(super) fn take_turn(
    core: &mut Core,
    taken: &mut VecDeque<Received>,
    in_turn: &ResponseDecoding,
    decoded: &mut Vec<Decoded>,
) -> Turned {
    let mut settled = Settled::default();
    let mut last = false;
    // Time before frames: every frame taken had come in before this clock read, so a deadline
    // that passed while one waited is seen before it, and it cannot complete a call already
    // over.
    let now = Instant::now();
    if core.session.poll_timeout().is_some_and(|at| at <= now) {
        core.session.handle_timeout(now);
    }
    while let Some(item) = taken.pop_front() {
        last = !matches!(item, Ok(Some(_)));
        let session = &mut core.session;
        match item {
            Ok(Some(payload)) => session.handle_frame(payload),
            Ok(None) => session.handle_eof(),
            Err(TransportError::Frame(err)) => session.handle_framing_error(err),
            Err(_) => session.abort(CloseReason::Aborted(AbortReason::TransportFailed)),
        }
        core.settle_events(&mut settled, Some(now));
        if last || !settled.updates.is_empty() {
            break;
        }
        // A frame completes at most one call.
        let Some(returned) = settled.returned.take() else {
            continue;
        };
        match decode_in_turn(returned, in_turn) {
            Ok(response) => decoded.push(response),
            Err(returned) => {
                settled.returned = Some(returned);
                break;
            }
        }
    }
    core.settle_transmits(&mut settled);
    Turned {
        settled,
        last,
        at: now,
    }
}

/// The reader task: takes the worker's frames as they come (several at once when several are
/// ready), hands them to the session under the lock, deadlines first, and answers the callers
/// they complete; delivers the updates of streaming calls before it takes the next frames.
/// Turns are taken under the `inlet`'s lock, which a caller's look takes too. `raise` carries
/// the connection's `max_frame` once the worker is verified (the wait is cancel-safe, so
/// switching mid-wait loses nothing); callers look only after that, and only while the reader
/// waits with nothing in hand (in the low-latency mode, between the slices it polls in).
pub(crate) async fn read_frames(
    inlet: Arc<Inlet>,
    live: Arc<Live>,
    mut raise: oneshot::Receiver<u32>,
    budget: Arc<UpdateBudget>,
) {
    let mut raised = false;
    let mut spin = live.spin.map(|window| {
        let direct = live.lock().as_ref().is_some_and(|core| core.wire.direct);
        ReaderSpin::new(window, Polling::for_reader(&*inlet.lock().receiver, direct))
    });
    loop {
        let (ended, updates, in_hand) = {
            let mut state = inlet.lock();
            let updates = std::mem::take(&mut state.updates);
            (state.ended, updates, !state.taken.is_empty())
        };
        if ended {
            return;
        }
        // Updates a caller's turn brought go to their callers before the next frame is taken.
        if !updates.is_empty() {
            if !deliver_updates(&live, inlet.generation, updates, &inlet.limits, &budget).await {
                return;
            }
            continue;
        }
        if !in_hand {
            // Low-latency mode: for a window after each call begins, poll for the worker's
            // frames instead of sleeping until they arrive (`HostBuilder::low_latency`), while
            // it pays.
            let turn = spin.as_mut().map(|spin| {
                let mut state = inlet.lock();
                let answered = state.answered_by_look.take();
                spin.turn(&live, &mut *state.receiver, answered)
            });
            let (spinning, awaits_grant) = match turn {
                None | Some(Turn::Sleep) => (false, false),
                Some(Turn::Spin) => (true, false),
                Some(Turn::SleepUntilGranted) => (false, true),
                Some(Turn::LookAgain) => continue,
            };
            tokio::select! {
                biased;
                max = &mut raise, if !raised => {
                    raised = true;
                    if let Ok(max) = max {
                        inlet.lock().receiver.set_max_frame(max);
                    }
                    continue;
                }
                () = inlet.wait(raised) => {}
                () = tokio::task::yield_now(), if spinning => continue,
                () = live.grant_wake.notified(), if awaits_grant => continue,
            }
            if let Some(spin) = spin.as_mut() {
                if matches!(inlet.lock().taken.front(), Some(Ok(Some(_)))) {
                    spin.frame_in(&live);
                }
            }
            // Whatever ended the wait (frames taken, or left by a caller's look with updates
            // that go first, or the end of the reader's work) is looked at in that order.
            continue;
        }
        let Some((ended, updates)) = inlet.reader_turn(&live) else {
            return;
        };
        if ended {
            return;
        }
        if !deliver_updates(&live, inlet.generation, updates, &inlet.limits, &budget).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Context;
    use std::time::Duration;

    use super::*;
    use crate::connection::recording::{
        encoded, reaped, runtime, update_then_answer, AllReady, Calls,
    };
    use crate::connection::wire::now_or_never;
    use crate::updates::Cost;

    /// What two callers expecting a `u64` hear when the worker answers the first with `first`
    /// and the second with 7 in one write: as the reader leaves them (`None`: not yet
    /// answered), then once the worker is reaped. Also whether the reader ended.
    fn answered_together(first: &[u8]) -> (Vec<Option<Result<u64, CallError>>>, bool, usize) {
        runtime().block_on(async {
            let mut calls = Calls::<u64>::begin(vec![None, None]);
            let (one, two) = (calls.ids[0], calls.ids[1]);
            calls
                .worker
                .reply_return(one, Bytes::copy_from_slice(first))
                .unwrap();
            calls.worker.reply_return(two, encoded(7)).unwrap();
            let frames = calls.written();
            assert_eq!(frames.len(), 2);
            let reader = calls.reader(frames, UpdateBudget::new(Cost::default()));
            // One poll: the reader takes both frames in one turn, then ends (it cut a liar
            // off) or waits for more.
            let ended = now_or_never(reader).is_some();
            let mut heard: Vec<_> = calls.answers.iter_mut().map(now_or_never).collect();
            // What the supervisor does once the worker is reaped.
            reaped(&calls.live);
            for (heard, answer) in heard.iter_mut().zip(&mut calls.answers) {
                if heard.is_none() {
                    *heard = Some(now_or_never(answer).expect("answered once reaped"));
                }
            }
            (heard, ended, calls.reads.load(Ordering::SeqCst))
        })
    }

    /// The answers an honest worker writes together are all delivered in the reader's turn:
    /// the second frame of the write is handed over in the same turn as the first.
    #[test]
    fn answers_written_together_are_delivered_in_one_turn() {
        let five = airlock_protocol::reuse::encode_body(&5u64)
            .unwrap()
            .to_vec();
        let (heard, ended, reads) = answered_together(&five);
        assert_eq!(heard, [Some(Ok(5)), Some(Ok(7))]);
        assert!(!ended, "the reader stopped reading an honest worker");
        assert_eq!(reads, 1, "the second frame was read in a turn of its own");
    }

    /// Invariant: a worker whose response does not decode is cut off before any later frame
    /// of it is accepted, even a frame read in the same turn: the answer written after the lie
    /// never reaches its caller, who hears `WorkerLost` once the liar is reaped.
    #[test]
    fn a_lie_read_together_with_a_later_answer_cuts_the_worker_off_before_that_answer() {
        // An empty body is not a `u64`.
        let (heard, ended, _) = answered_together(&[]);
        assert!(ended, "the reader went on reading a worker that lied");
        assert!(
            matches!(heard[0], Some(Err(CallError::Decode(_)))),
            "{:?}",
            heard[0]
        );
        assert!(
            matches!(heard[1], Some(Err(CallError::WorkerLost(_)))),
            "the answer written after the lie was delivered: {:?}",
            heard[1]
        );
    }

    /// A streaming call's update and its answer, written together, reach the caller in that
    /// order even when the update must wait for room in the budget: the answer's frame is not
    /// handed to the session until the update is with its caller.
    #[test]
    fn an_update_read_together_with_its_calls_answer_reaches_the_caller_first() {
        update_then_answer(|calls, frames, budget| Box::pin(calls.reader(frames, budget)));
    }

    /// Frames the worker wrote together are taken into one turn only up to `TURN_FRAMES`
    /// frames or `TURN_BYTES` bytes: writing large frames together makes the host hold no more
    /// of them at once than writing them one by one (the frame that reaches the cap is the
    /// turn's last).
    #[test]
    fn a_turn_takes_at_most_64_frames_or_64_kib_and_the_frame_that_passes_it() {
        let taken_from = |frames: Vec<usize>| {
            let mut receiver = AllReady(
                frames.into_iter().map(|len| vec![0; len].into()).collect(),
                Arc::default(),
            );
            let mut taken = VecDeque::new();
            let take = std::future::poll_fn(|cx| poll_take(&mut receiver, &mut taken, cx));
            assert!(now_or_never(take).is_some());
            taken.len()
        };
        assert_eq!(taken_from(vec![16; 100]), TURN_FRAMES);
        assert_eq!(taken_from(vec![40 * 1024; 5]), 2);
        assert_eq!(taken_from(vec![100, 16 * 1024 * 1024, 100]), 2);
        assert_eq!(
            taken_from(vec![100, 200]),
            2,
            "it waits for none but the first"
        );
    }

    fn units(n: usize) -> Bytes {
        airlock_protocol::reuse::encode_body(&vec![(); n])
            .unwrap()
            .into()
    }

    /// What the worker wrote, as a reader's receiver would give it.
    fn received(frames: VecDeque<Bytes>) -> VecDeque<Received> {
        frames.into_iter().map(|frame| Ok(Some(frame))).collect()
    }

    /// A response of more elements than a turn decodes under the lock (here a thousand
    /// zero-sized ones in three bytes) ends the turn undecoded, the frames after it left for
    /// the next turn, and is then decoded outside the lock within the full budgets: delivered,
    /// not refused for the narrower one.
    #[test]
    fn a_response_of_many_elements_is_decoded_outside_the_lock_and_delivered() {
        runtime().block_on(async {
            let (many, few) = (ITEMS_IN_TURN * 4, 3);
            let mut calls = Calls::<Vec<()>>::begin(vec![None, None]);
            calls.answer(vec![units(many), units(few)]);
            let frames = calls.written();
            assert!(frames[0].len() <= DECODE_IN_TURN);
            let mut taken = received(frames.clone());
            let mut decoded = Vec::new();
            let turned = calls.turn(&mut taken, &mut decoded);
            assert!(decoded.is_empty(), "decoded under the lock");
            assert!(
                turned.settled.returned.is_some(),
                "not left to decode outside"
            );
            assert_eq!(
                taken.len(),
                1,
                "the next frame was handed over in the same turn"
            );
            // Nothing refused: the whole exchange through the reader delivers both.
            let mut calls = Calls::<Vec<()>>::begin(vec![None, None]);
            calls.answer(vec![units(many), units(few)]);
            let frames = calls.written();
            let reader = calls.reader(frames, UpdateBudget::new(Cost::default()));
            assert!(now_or_never(reader).is_none(), "the reader stopped");
            let heard: Vec<_> = calls.answers.iter_mut().map(now_or_never).collect();
            assert_eq!(heard, [Some(Ok(vec![(); many])), Some(Ok(vec![(); few]))]);
        });
    }

    /// A caller's stats time its call to when the host accepted the answer: a response
    /// decoded in the turn, and a handler's error, at the turn's clock read; a response decoded
    /// outside the lock once its decode is done, which its caller waited through.
    #[test]
    fn an_answer_is_timed_at_its_turn_or_after_its_decode_outside_the_lock() {
        runtime().block_on(async {
            let mut calls = Calls::<Vec<()>>::begin(vec![None, None, None]);
            let ids = calls.ids.clone();
            calls.worker.reply_return(ids[0], units(3)).unwrap();
            let error =
                airlock_protocol::RemoteError::new(airlock_protocol::ErrorKind::Handler, "no");
            calls.worker.reply_fail(ids[1], &error).unwrap();
            calls
                .worker
                .reply_return(ids[2], units(ITEMS_IN_TURN * 4))
                .unwrap();
            let mut taken = received(calls.written());
            let mut decoded = Vec::new();
            let turned = calls.turn(&mut taken, &mut decoded);
            assert!(taken.is_empty(), "the three frames took more than one turn");
            let at = turned.at;
            assert!(
                !calls.finish(turned, &mut decoded),
                "an honest worker was cut off"
            );
            let mut heard = Vec::new();
            for answer in &mut calls.answers {
                let outcome = now_or_never(&mut *answer).expect("not answered");
                heard.push((outcome.is_ok(), answer.answered_at()));
            }
            assert_eq!(heard[0], (true, Some(at)));
            assert_eq!(heard[1], (false, Some(at)));
            let (ok, decoded_at) = heard[2];
            assert!(ok);
            assert!(
                decoded_at.is_some_and(|decoded_at| decoded_at > at),
                "a response decoded outside the lock was timed at its turn"
            );
        });
    }

    /// Counts its wake-ups.
    struct CountWake(AtomicUsize);

    impl std::task::Wake for CountWake {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A caller already waiting when its response fails the narrower decode in the turn sees
    /// nothing under the lock (no value held, no wake-up), and is woken exactly once, with the
    /// whole value, when the turn is finished outside the lock.
    #[test]
    fn a_caller_is_untouched_by_a_failed_narrower_decode_and_woken_once_after_the_full_one() {
        runtime().block_on(async {
            let many = ITEMS_IN_TURN + 1;
            let mut calls = Calls::<Vec<()>>::begin(vec![None]);
            calls.answer(vec![units(many)]);
            let wakes = Arc::new(CountWake(AtomicUsize::new(0)));
            let waker = std::task::Waker::from(Arc::clone(&wakes));
            let mut cx = Context::from_waker(&waker);
            let mut poll = |calls: &mut Calls<Vec<()>>| {
                std::future::Future::poll(std::pin::Pin::new(&mut calls.answers[0]), &mut cx)
            };
            assert!(poll(&mut calls).is_pending());
            let mut taken = received(calls.written());
            let mut decoded = Vec::new();
            let turned = calls.turn(&mut taken, &mut decoded);
            assert!(decoded.is_empty() && turned.settled.returned.is_some());
            assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "woken under the lock");
            assert!(
                poll(&mut calls).is_pending(),
                "answered before the full decode"
            );
            assert!(!turned.last);
            assert!(
                !calls.finish(turned, &mut decoded),
                "refused for the narrower budget"
            );
            assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "not woken once");
            assert_eq!(poll(&mut calls), Poll::Ready(Ok(vec![(); many])));
            assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        });
    }

    /// The in-turn bounds at their edges: 256 items and a 4096-byte body are decoded under the
    /// lock; 257 items or a 4097-byte body end the turn undecoded.
    #[test]
    fn a_turn_decodes_under_the_lock_up_to_256_items_and_4_kib_and_no_more() {
        /// Three calls answered with `bodies` in one write, the first at the bound and the
        /// second just past it: the first is decoded in the turn, the turn ends at the second,
        /// undecoded, and the third is left for the next turn.
        fn at_the_edge<T: serde::de::DeserializeOwned + Send + 'static>(bodies: Vec<Bytes>) {
            let mut calls = Calls::<T>::begin(vec![None, None, None]);
            calls.answer(bodies);
            let mut taken = received(calls.written());
            let mut decoded = Vec::new();
            let turned = calls.turn(&mut taken, &mut decoded);
            assert_eq!(
                decoded.len(),
                1,
                "the response at the bound not decoded in the turn"
            );
            assert!(
                turned.settled.returned.is_some(),
                "the response past the bound decoded under the lock"
            );
            assert_eq!(taken.len(), 1);
        }
        runtime().block_on(async {
            at_the_edge::<Vec<()>>(vec![
                units(ITEMS_IN_TURN),
                units(ITEMS_IN_TURN + 1),
                units(1),
            ]);
            // A `Vec<u8>` of n bytes, 128 <= n < 16384, has a body of n + 2 bytes.
            let bytes = |n: usize| -> Bytes {
                airlock_protocol::reuse::encode_body(&vec![7u8; n])
                    .unwrap()
                    .into()
            };
            assert_eq!(bytes(DECODE_IN_TURN - 2).len(), DECODE_IN_TURN);
            at_the_edge::<Vec<u8>>(vec![
                bytes(DECODE_IN_TURN - 2),
                bytes(DECODE_IN_TURN - 1),
                bytes(1),
            ]);
        });
    }

    /// Invariant: a small lie read with a later answer: its caller hears nothing until the
    /// worker is reaped, then `Decode`; the later answer's caller hears `WorkerLost`.
    #[test]
    fn a_small_lie_is_heard_only_once_the_worker_is_reaped() {
        runtime().block_on(async {
            let mut calls = Calls::<u64>::begin(vec![None, None]);
            calls.answer(vec![Bytes::new(), encoded(7)]);
            let frames = calls.written();
            let reader = calls.reader(frames, UpdateBudget::new(Cost::default()));
            assert!(now_or_never(reader).is_some(), "the reader went on");
            assert!(
                now_or_never(&mut calls.answers[0]).is_none(),
                "Decode heard before the reap"
            );
            assert!(now_or_never(&mut calls.answers[1]).is_none());
            assert!(calls.live.lock().as_ref().unwrap().session.is_closed());
            reaped(&calls.live);
            assert!(matches!(
                now_or_never(&mut calls.answers[0]),
                Some(Err(CallError::Decode(_)))
            ));
            assert!(matches!(
                now_or_never(&mut calls.answers[1]),
                Some(Err(CallError::WorkerLost(_)))
            ));
        });
    }

    /// Time before frames: a frame left in `taken` for the next turn meets that turn's clock.
    /// A `Return` left behind a response decoded outside the lock, whose deadline passes
    /// before the next turn, is never `Ok`.
    #[test]
    fn a_frame_left_over_for_the_next_turn_meets_that_turns_clock() {
        runtime().block_on(async {
            let now = Instant::now();
            let mut calls = Calls::<Vec<()>>::begin_due(vec![
                now + Duration::from_secs(60),
                now + Duration::from_millis(50),
            ]);
            calls.answer(vec![units(ITEMS_IN_TURN + 1), units(1)]);
            let mut taken = received(calls.written());
            let mut decoded = Vec::new();
            let turned = calls.turn(&mut taken, &mut decoded);
            assert_eq!(taken.len(), 1, "the second frame was not left over");
            assert!(!calls.finish(turned, &mut decoded));
            // Past the second call's deadline, whenever the first turn ran.
            while Instant::now() <= now + Duration::from_millis(50) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let turned = calls.turn(&mut taken, &mut decoded);
            assert!(!calls.finish(turned, &mut decoded));
            assert_eq!(
                now_or_never(&mut calls.answers[0]),
                Some(Ok(vec![(); ITEMS_IN_TURN + 1]))
            );
            // Timed out: answered at once if the worker lives on, or once it is reaped.
            reaped(&calls.live);
            let second = now_or_never(&mut calls.answers[1]);
            assert!(
                matches!(second, Some(Err(CallError::Timeout))),
                "{second:?}"
            );
        });
    }
}
