//! The calls on the current worker and their callers: who waits on which call id, and how each
//! outcome reaches its caller.

use std::collections::HashMap;
use std::time::Instant;

use airlock_codec::DecodeError;
use airlock_protocol::{BeginCallError, BuildIdHasher, CallId, HostSession, Outcome};

use super::Returned;
use crate::ids::CallIdRng;
use crate::reply::Replier;
use crate::supervisor::CallRequest;
use crate::updates::Updates;
use crate::{CallError, LostReason};

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
    /// Calls whose response did not decode, answered `Decode` once the worker is reaped, so
    /// nothing of the liar still runs when its lie is reported.
    pub(super) refused: Vec<(Replier, DecodeError)>,
    /// Calls that timed out in the turn being settled.
    timed_out: Vec<Replier>,
}

impl Link {
    /// Begins `call`, or answers it at once if it cannot be begun.
    pub(crate) fn begin(&mut self, session: &mut HostSession, call: CallRequest) {
        // A call already past its deadline is not sent: it would only time out on the worker
        // and take the worker, and every call beside it, down for nothing. The clock is read
        // here, under the lock, so a deadline that passed while the request was encoded or
        // while the call waited for the lock is seen.
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
    pub(super) fn updates_of(&self, id: &CallId) -> Option<Updates> {
        self.responders.get(id)?.updates.clone()
    }

    pub(super) fn answer_timed_out(&mut self) {
        for reply in self.timed_out.drain(..) {
            reply.fail(CallError::Timeout);
        }
    }

    fn answer_refused(&mut self) {
        for (reply, err) in self.refused.drain(..) {
            reply.fail(CallError::Decode(err));
        }
    }

    /// Answers a completed call, except a response, which is handed back to be decoded.
    /// `accepted_at` is the clock read of the reader's turn that accepted the frame, if one
    /// did: when a handler's error was accepted, for its caller's stats.
    pub(super) fn complete(
        &mut self,
        id: CallId,
        outcome: Outcome,
        accepted_at: Option<Instant>,
    ) -> Option<Returned> {
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
            Outcome::Failed(err) => {
                reply.fail_at(CallError::Remote(err), accepted_at);
                return None;
            }
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
        self.answer_refused();
        let remaining = self.responders.drain().map(|(_, r)| r.reply);
        for reply in self.lost.drain(..).chain(remaining) {
            reply.fail(CallError::WorkerLost(reason.clone()));
        }
        self.keys.clear();
    }

    /// Answers every call with `err` (the host itself is gone), but a refused response's
    /// with its own `Decode`.
    pub(crate) fn fail_all_with(&mut self, err: &CallError) {
        self.answer_refused();
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
