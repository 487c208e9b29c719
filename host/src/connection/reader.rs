//! The reader task: the worker's frames, handed to the session under the lock with time first,
//! and the responses they complete decoded and delivered outside it, a liar cut off before its
//! next frame is accepted.

use std::sync::Arc;
use std::time::Instant;

use airlock_codec::DecodeError;
use airlock_protocol::transport::{next_frame, FrameReceiver};
use airlock_protocol::{AbortReason, CloseReason, TransportError};
use bytes::Bytes;
use tokio::sync::oneshot;

use super::reader_spin::{ReaderSpin, Turn};
use super::{Live, Party, Returned};
use crate::reply::Replier;
use crate::response::ResponseDecoding;
use crate::updates::{Delivered, UpdateBudget, Updates};
use crate::CallError;

/// Decodes and delivers what the reader's turn returned, outside the lock. A response that
/// does not decode is a lie: the worker is cut off before the reader accepts another frame,
/// and its caller hears `Decode` once the worker is reaped (as the calls lost with it hear
/// `WorkerLost`), so no call begun after the caller sees `Decode` reaches the liar and nothing
/// of the liar still runs. True if the worker lied.
pub(super) fn deliver(
    live: &Live,
    generation: u64,
    returned: Option<Returned>,
    more: Vec<Returned>,
    limits: &ResponseDecoding,
) -> bool {
    let Some(first) = returned else {
        return false;
    };
    // A refusal is logged, with the budget and the method, before the worker is cut off. The
    // body is lent to the `Blob`s in the response: a large one keeps the frame's bytes.
    let decode = |returned: Returned| {
        let body = &returned.body;
        let reply = returned.reply;
        let decoded = airlock_protocol::blob::lending(body, || reply.returned(body, limits));
        if let Err((_, err)) = &decoded {
            limits.refused(&returned.method, err);
        }
        decoded
    };
    if more.is_empty() {
        // The common case, without collecting.
        return match decode(first) {
            Ok(decoded) => {
                decoded.publish();
                false
            }
            Err(refused) => {
                cut_off_liar(live, generation, vec![refused]);
                true
            }
        };
    }
    // The liar is cut off before any answer is published: no caller answered in this turn
    // can begin a call that reaches it.
    let (decoded, refused): (Vec<_>, Vec<_>) = std::iter::once(first)
        .chain(more)
        .map(decode)
        .partition(Result::is_ok);
    let lied = !refused.is_empty();
    if lied {
        cut_off_liar(
            live,
            generation,
            refused.into_iter().filter_map(Result::err).collect(),
        );
    }
    for decoded in decoded.into_iter().filter_map(Result::ok) {
        decoded.publish();
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
