//! The host's side of one worker connection.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use bytes::Bytes;
use rand_core::CryptoRng;

use super::deadlines::{Deadlines, Due};
use super::{CloseReason, FinishedIds, WorkerInfo};
use crate::frame::{self, BodyTag, Encoder, Frame, Hello, Refuse, RefuseReason, Welcome};
use crate::Body;
use crate::{
    body_frame_len, is_valid_method_name, BeginCallError, CallId, FrameDecoder, FrameKind,
    HostConfig, Received, RemoteError, Transmit, Violation, ViolationCode, PROTOCOL_VERSION,
};

/// What happened on the connection; drain with [`HostSession::poll_event`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The handshake succeeded; calls may begin.
    Ready(WorkerInfo),
    /// An update for a running call.
    Progress {
        /// The call.
        id: CallId,
        /// The update, opaque.
        body: Bytes,
    },
    /// A call ended. Exactly one of these is emitted for every id [`HostSession::begin_call`]
    /// returned, whatever happens to the connection.
    Completed {
        /// The call.
        id: CallId,
        /// How it ended.
        outcome: Outcome,
    },
    /// The connection ended (after every pending call's `Completed`). Emitted once, last.
    Closed(CloseReason),
}

/// How one call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The worker returned this body (the encoded response, not yet decoded).
    Returned(Bytes),
    /// The worker reported a failure.
    Failed(RemoteError),
    /// The host cancelled the call.
    Cancelled,
    /// The call's deadline passed. The connection closes too: a handler cannot be pre-empted.
    TimedOut,
    /// The connection ended before the call did.
    Lost(CloseReason),
}

/// The handshake and lifetime of the connection.
///
/// ```text
///                 Hello ok                 shutdown()
///  AwaitingHello ─────────▶ Ready ───────────────────▶ Closing
///        │                    │                           │ end of stream, no calls left
///        │ refused, violation,│ violation, timeout,       ▼
///        │ timeout, abort()   │ end of stream, abort() ─▶ Closed
///        └──────────────────────────────────────────────▶
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    AwaitingHello { deadline: Instant },
    Ready,
    Closing,
    Closed,
}

/// One call's progress through its phases.
///
/// ```text
///          Progress              Return / Fail
///  Sent ─────────────▶ InProgress ─────────────▶ (finished: removed, id remembered)
///   │  ╲                   │
///   │   ╲ Return / Fail    │ cancel()
///   │    ╲─────────────────┼──────────────────▶ (finished)
///   │ cancel()             ▼
///   └────────────────▶ Cancelled ── Progress: discarded (counted)
///                          │
///                          └── Return / Fail: discarded ─▶ (finished)
/// ```
/// A frame for a finished id, or for an id never issued, is a violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CallState {
    Sent,
    InProgress,
    Cancelled,
}

#[derive(Debug)]
struct PendingCall {
    /// Borrowed for a typed call (`Method::NAME`); owned only for a call whose method is
    /// named at run time.
    method: Cow<'static, str>,
    state: CallState,
    /// The instant this call's entry in `deadlines` is keyed by: its deadline, then, once that
    /// passed, the deadline plus the cancel grace.
    deadline: Instant,
    /// The deadline passed: the caller has its `TimedOut`, a `Cancel` was sent, and `deadline`
    /// is now the end of the grace.
    overdue: bool,
    progress: u32,
}

/// The host's sans-IO session with one worker: it decides what every frame from the worker
/// means, and every frame it may not send is a [`Violation`] that ends the connection.
///
/// Drive it like this, from one task that owns it:
/// 1. Feed input: [`handle_frame`](Self::handle_frame) (or [`handle_bytes`](Self::handle_bytes))
///    for what the worker sent, [`handle_eof`](Self::handle_eof) when its stream ends,
///    [`handle_timeout`](Self::handle_timeout) when [`poll_timeout`](Self::poll_timeout)'s
///    instant passes.
/// 2. Start work: [`begin_call`](Self::begin_call), [`cancel`](Self::cancel),
///    [`shutdown`](Self::shutdown), [`abort`](Self::abort).
/// 3. After each of those, drain [`poll_transmit`](Self::poll_transmit) (frames to write) and
///    [`poll_event`](Self::poll_event) (outcomes to deliver), and re-read `poll_timeout`.
///
/// Guarantees: a worker frame reaches a call only if its `(id, phase, method)` matches a call
/// this session issued and the call's state admits the phase (invariant 3); every call gets
/// exactly one [`Event::Completed`] (invariant 5); after a violation nothing more is accepted
/// and every pending call completes with it (invariant 6).
#[derive(Debug)]
pub struct HostSession {
    config: HostConfig,
    state: State,
    decoder: FrameDecoder,
    encoder: Encoder,
    calls: HashMap<CallId, PendingCall, crate::BuildIdHasher>,
    /// Every pending call's deadline, soonest first (entries of finished calls are dropped
    /// lazily; see [`Deadlines`]).
    deadlines: Deadlines,
    finished: FinishedIds,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
}

impl HostSession {
    /// A session awaiting the worker's `Hello`, which must arrive within the configured
    /// handshake timeout of `now`.
    pub fn new(config: HostConfig, now: Instant) -> Self {
        let deadline = now + config.handshake_limit();
        Self {
            // Until the worker has proven itself with a valid Hello, accept only Hello-sized
            // frames: an unauthenticated peer cannot make the host buffer max_frame bytes.
            decoder: FrameDecoder::new(config.frame_limit().min(crate::HANDSHAKE_MAX_FRAME)),
            state: State::AwaitingHello { deadline },
            encoder: Encoder::default(),
            calls: HashMap::default(),
            deadlines: Deadlines::default(),
            finished: FinishedIds::unindexed(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            config,
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// True once the handshake succeeded and until the session closes.
    pub fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready)
    }

    /// True once the session has closed; nothing more will be accepted or sent.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Calls in flight, cancelled ones awaiting their terminal frame included.
    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Starts a call: draws a fresh id from `rng`, records the call, and only then queues its
    /// `Call` frame. The call must end by `deadline`, or it times out and the session closes.
    ///
    /// Refuses (sending nothing) before the handshake, after shutdown, at `max_in_flight`, for
    /// an invalid method name, and for a body that would make a frame over `max_frame`.
    ///
    /// `method` is a `&'static str` for a typed call (kept without a copy) or an owned
    /// `String` for one named at run time.
    pub fn begin_call<R: CryptoRng + ?Sized>(
        &mut self,
        method: impl Into<Cow<'static, str>>,
        body: impl Into<Body>,
        deadline: Instant,
        rng: &mut R,
    ) -> Result<CallId, BeginCallError> {
        let method = method.into();
        let body = body.into();
        match self.state {
            State::AwaitingHello { .. } => return Err(BeginCallError::NotReady),
            State::Closing | State::Closed => return Err(BeginCallError::Closed),
            State::Ready => {}
        }
        if !is_valid_method_name(&method) {
            return Err(BeginCallError::InvalidMethodName);
        }
        if self.calls.len() >= self.config.in_flight_limit() as usize {
            return Err(BeginCallError::Overloaded {
                max: self.config.in_flight_limit(),
            });
        }
        let max = self.config.frame_limit();
        if body_frame_len(method.len(), body.len()) > max as usize {
            return Err(BeginCallError::TooLarge {
                len: body.len(),
                max,
            });
        }
        let id = loop {
            // A collision with a pending id has probability 2^-128 per draw; redraw anyway.
            let id = CallId::random(rng);
            if !self.calls.contains_key(&id) {
                break id;
            }
        };
        let transmit = self
            .encoder
            .with_body(BodyTag::Call, id, method.as_bytes(), body);
        self.calls.insert(
            id,
            PendingCall {
                method,
                state: CallState::Sent,
                deadline,
                overdue: false,
                progress: 0,
            },
        );
        let calls = &self.calls;
        self.deadlines
            .push((deadline, id), calls.len(), |due| is_due(calls, due));
        self.transmits.push_back(transmit);
        Ok(id)
    }

    /// Cancels a pending call: it completes at once with [`Outcome::Cancelled`] and a `Cancel`
    /// frame is queued. The worker still owes its terminal frame, which will be discarded; its
    /// id stays reserved (and counted in flight) until then, or until the original deadline
    /// plus the [cancel grace](HostConfig::cancel_grace), which closes the session if the
    /// worker never answers. Returns false if the call is not pending or already cancelled.
    pub fn cancel(&mut self, id: CallId) -> bool {
        if matches!(self.state, State::Closed) {
            return false;
        }
        let Some(call) = self.calls.get_mut(&id) else {
            return false;
        };
        if call.state == CallState::Cancelled {
            return false;
        }
        call.state = CallState::Cancelled;
        let transmit = self.encoder.whole(&Frame::Cancel(frame::Cancel { id }));
        self.transmits.push_back(transmit);
        self.events.push_back(Event::Completed {
            id,
            outcome: Outcome::Cancelled,
        });
        true
    }

    /// Begins a graceful shutdown: queues `Shutdown`, takes no new calls, lets pending calls
    /// finish. The session closes with [`CloseReason::Shutdown`] at the worker's end of stream
    /// once no call is pending. Before the handshake, closes at once.
    pub fn shutdown(&mut self) {
        match self.state {
            State::Ready => {
                let transmit = self.encoder.whole(&Frame::Shutdown(frame::Shutdown));
                self.transmits.push_back(transmit);
                self.state = State::Closing;
            }
            State::AwaitingHello { .. } => self.close(CloseReason::Shutdown),
            State::Closing | State::Closed => {}
        }
    }

    /// Ends the session for a reason found outside the protocol (a response that did not
    /// decode, a failed transport, a killed process): every pending call completes with
    /// [`Outcome::Lost`] carrying `reason`.
    pub fn abort(&mut self, reason: CloseReason) {
        self.close(reason);
    }

    /// The next frame to write, in order.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event to deliver, in order.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`handle_timeout`](Self::handle_timeout) must next be called, if ever.
    #[must_use]
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        match self.state {
            State::AwaitingHello { deadline } => Some(deadline),
            State::Closed => None,
            State::Ready | State::Closing => {
                let calls = &self.calls;
                let first = self.deadlines.first(|due| is_due(calls, due));
                first.map(|(deadline, _)| deadline)
            }
        }
    }

    /// Applies the passage of time. A missed handshake deadline closes the session. A call
    /// past its deadline completes with [`Outcome::TimedOut`] at once and is sent `Cancel`
    /// (a cancelled call completed already); the worker then has the
    /// [cancel grace](HostConfig::cancel_grace) to finish it, after which the call's id is
    /// still owed and the session closes with [`CloseReason::CallTimeout`]: every other call
    /// is lost with it.
    ///
    /// ```text
    ///   Sent/InProgress ──deadline──▶ TimedOut delivered, Cancel sent ─┐
    ///   Cancelled ───────deadline──────────────────────────────────────┴─▶ overdue
    ///   overdue ──terminal frame within the grace──▶ finished (discarded), worker kept
    ///   overdue ──deadline + grace──────────────────▶ session closed (CallTimeout)
    /// ```
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.state {
            State::AwaitingHello { deadline } if now >= deadline => {
                self.close(CloseReason::HandshakeTimeout);
            }
            State::Ready | State::Closing => {
                let grace = self.config.cancel_grace_limit();
                let mut still_running = false;
                loop {
                    let calls = &self.calls;
                    let Some((deadline, id)) = self.deadlines.first(|due| is_due(calls, due))
                    else {
                        break;
                    };
                    if deadline > now {
                        break;
                    }
                    self.deadlines.pop_first();
                    let Some(call) = self.calls.get_mut(&id) else {
                        continue;
                    };
                    if call.overdue {
                        // The grace is over and the handler still runs: it cannot be stopped.
                        still_running = true;
                        continue;
                    }
                    if call.state != CallState::Cancelled {
                        call.state = CallState::Cancelled;
                        let transmit = self.encoder.whole(&Frame::Cancel(frame::Cancel { id }));
                        self.transmits.push_back(transmit);
                        self.events.push_back(Event::Completed {
                            id,
                            outcome: Outcome::TimedOut,
                        });
                    }
                    call.overdue = true;
                    call.deadline = deadline.checked_add(grace).unwrap_or(deadline);
                    let due = (call.deadline, id);
                    let calls = &self.calls;
                    self.deadlines
                        .push(due, calls.len(), |due| is_due(calls, due));
                }
                if still_running {
                    self.close(CloseReason::CallTimeout);
                }
            }
            _ => {}
        }
    }

    /// Feeds raw bytes from the worker's stream (any chunking). Frames are handled as they
    /// complete; a framing fault is a violation.
    pub fn handle_bytes(&mut self, data: &[u8]) {
        if self.is_closed() {
            return;
        }
        self.decoder.extend(data);
        loop {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => self.handle_frame(frame),
                Ok(None) => return,
                Err(err) => return self.violation(Violation::from_frame_error(err)),
            }
            if self.is_closed() {
                return;
            }
        }
    }

    /// The transport's framing failed (a length over the cap, a zero length, a stream ending
    /// inside a frame): a violation, exactly as if the bytes had gone through
    /// [`handle_bytes`](Self::handle_bytes).
    pub fn handle_framing_error(&mut self, err: crate::FrameError) {
        if !self.is_closed() {
            self.violation(Violation::from_frame_error(err));
        }
    }

    /// The worker's stream ended. Ends the session: gracefully if shutting down with no call
    /// pending, otherwise with [`CloseReason::WorkerClosed`] (or a violation if the stream
    /// ended inside a frame).
    pub fn handle_eof(&mut self) {
        if self.is_closed() {
            return;
        }
        if let Err(err) = self.decoder.finish() {
            return self.violation(Violation::from_frame_error(err));
        }
        if self.state == State::Closing && self.calls.is_empty() {
            self.close(CloseReason::Shutdown);
        } else {
            self.close(CloseReason::WorkerClosed);
        }
    }

    /// Handles one complete frame payload (without its length prefix), as delivered by a
    /// transport that does its own framing.
    ///
    /// Time is not an input here: call [`handle_timeout`](Self::handle_timeout) first when a
    /// deadline may have passed, or a frame arriving just after it is still accepted.
    pub fn handle_frame(&mut self, payload: Bytes) {
        if self.is_closed() {
            return;
        }
        if payload.len() > self.decoder.max_frame() as usize || payload.is_empty() {
            let err = if payload.is_empty() {
                crate::FrameError::Empty
            } else {
                crate::FrameError::TooLarge {
                    len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
                    max: self.decoder.max_frame(),
                }
            };
            return self.violation(Violation::from_frame_error(err));
        }
        if let State::AwaitingHello { .. } = self.state {
            // Read the version before the rest: a peer of another version is refused cleanly
            // even if its Hello has a layout this version cannot decode.
            if frame::peek_hello_version(&payload).is_some_and(|v| v != PROTOCOL_VERSION) {
                let reason = RefuseReason::VersionMismatch;
                return self.close_with_refuse(CloseReason::Refused(reason), reason);
            }
        }
        let frame = match frame::decode_frame(&payload) {
            Ok(frame) => frame,
            Err(_) => {
                return self.violation(Violation::new(
                    ViolationCode::MalformedFrame,
                    "a valid frame encoding",
                    Received::Bytes,
                ))
            }
        };
        let result = match self.state {
            State::AwaitingHello { .. } => self.on_handshake_frame(frame),
            State::Ready | State::Closing => self.on_call_frame(&payload, frame),
            State::Closed => Ok(()),
        };
        if let Err(violation) = result {
            self.violation(violation);
        }
    }

    fn on_handshake_frame(&mut self, frame: Frame<'_>) -> Result<(), Violation> {
        let Frame::Hello(hello) = frame else {
            return Err(Violation::new(
                ViolationCode::FrameBeforeHandshake,
                "Hello",
                Received::Frame(frame.kind()),
            ));
        };
        if hello.protocol != PROTOCOL_VERSION {
            // Unreachable after the peek in `handle_frame`, kept so this function stands alone.
            let reason = RefuseReason::VersionMismatch;
            self.close_with_refuse(CloseReason::Refused(reason), reason);
            return Ok(());
        }
        if let Err(violation) = check_hello(&hello) {
            self.close_with_refuse(
                CloseReason::Violation(violation),
                RefuseReason::InvalidHello,
            );
            return Ok(());
        }
        if let Some(expected) = self.config.expected_token() {
            let presented = hello.token.unwrap_or_default();
            if !frame::token_matches(presented, expected) {
                let reason = RefuseReason::BadToken;
                self.close_with_refuse(CloseReason::Refused(reason), reason);
                return Ok(());
            }
        }
        let info = WorkerInfo {
            name: hello.worker_name.into(),
            version: hello.worker_version.into(),
            methods: hello.methods.iter().map(|m| String::from(*m)).collect(),
        };
        let welcome = Welcome {
            max_frame: self.config.frame_limit(),
            max_in_flight: self.config.in_flight_limit(),
            max_progress_per_call: self.config.progress_limit(),
        };
        let transmit = self.encoder.whole(&Frame::Welcome(welcome));
        self.transmits.push_back(transmit);
        self.decoder.set_max_frame(self.config.frame_limit());
        self.state = State::Ready;
        self.events.push_back(Event::Ready(info));
        Ok(())
    }

    /// Closes the session, leaving one last frame to write: the `Refuse` telling the worker why.
    fn close_with_refuse(&mut self, close: CloseReason, reason: RefuseReason) {
        self.close(close);
        let refuse = Refuse {
            reason,
            host_protocol: PROTOCOL_VERSION,
        };
        let transmit = self.encoder.whole(&Frame::Refuse(refuse));
        self.transmits.push_back(transmit);
    }

    fn on_call_frame(&mut self, payload: &Bytes, frame: Frame<'_>) -> Result<(), Violation> {
        let kind = frame.kind();
        let (id, method) = match &frame {
            Frame::Progress(p) => (p.id, p.method),
            Frame::Return(r) => (r.id, r.method),
            Frame::Fail(f) => (f.id, f.method),
            Frame::Hello(_) => {
                return Err(Violation::new(
                    ViolationCode::DuplicateHandshake,
                    "Progress, Return or Fail",
                    Received::Frame(kind),
                ))
            }
            _ => {
                return Err(Violation::new(
                    ViolationCode::ForbiddenKind,
                    "Progress, Return or Fail",
                    Received::Frame(kind),
                ))
            }
        };
        let Some(call) = self.calls.get_mut(&id) else {
            let code = if self.finished.contains(&id) {
                ViolationCode::FinishedCallId
            } else {
                ViolationCode::UnknownCallId
            };
            return Err(Violation::new(
                code,
                "the id of a pending call",
                Received::Frame(kind),
            ));
        };
        if call.method != method {
            return Err(Violation::new(
                ViolationCode::MethodMismatch,
                "the method name of the call with this id",
                Received::Frame(kind),
            ));
        }
        let outcome = match frame {
            Frame::Progress(progress) => {
                if call.progress >= self.config.progress_limit() {
                    return Err(Violation::new(
                        ViolationCode::ProgressOverQuota,
                        "at most max_progress_per_call Progress frames",
                        Received::Frame(kind),
                    ));
                }
                call.progress += 1;
                if call.state != CallState::Cancelled {
                    call.state = CallState::InProgress;
                    let body = payload.slice_ref(progress.body);
                    self.events.push_back(Event::Progress { id, body });
                }
                return Ok(());
            }
            Frame::Return(ret) => Outcome::Returned(payload.slice_ref(ret.body)),
            Frame::Fail(fail) => match RemoteError::from_wire(fail.kind, fail.message, fail.code) {
                Some(err) => Outcome::Failed(err),
                None => {
                    return Err(Violation::new(
                        ViolationCode::InvalidErrorDescriptor,
                        "a known error kind and a short message without control characters",
                        Received::Frame(kind),
                    ))
                }
            },
            _ => return Ok(()), // excluded above
        };
        let cancelled = call.state == CallState::Cancelled;
        // Its entry in `deadlines` goes stale with it.
        self.calls.remove(&id);
        self.finished.remember(id);
        if !cancelled {
            self.events.push_back(Event::Completed { id, outcome });
        }
        Ok(())
    }

    fn violation(&mut self, violation: Violation) {
        self.close(CloseReason::Violation(violation));
    }

    /// Ends the session: every pending call not yet completed completes as lost, then
    /// `Closed` is emitted. Idempotent.
    fn close(&mut self, reason: CloseReason) {
        if self.is_closed() {
            return;
        }
        self.state = State::Closed;
        let mut pending: Vec<(CallId, PendingCall)> = self.calls.drain().collect();
        // Deterministic order for callers and tests: by deadline, then id.
        pending.sort_by_key(|(id, call)| (call.deadline, *id));
        for (id, call) in pending {
            if call.state != CallState::Cancelled {
                self.events.push_back(Event::Completed {
                    id,
                    outcome: Outcome::Lost(reason.clone()),
                });
            }
        }
        self.deadlines.clear();
        self.decoder = FrameDecoder::new(self.config.frame_limit());
        // Nothing queued is worth writing to a connection that is over.
        self.transmits.clear();
        self.events.push_back(Event::Closed(reason));
    }
}

/// Checks every rule of a `Hello` besides version and token.
fn check_hello(hello: &Hello<'_>) -> Result<(), Violation> {
    let invalid_name = |_| {
        Violation::new(
            ViolationCode::InvalidName,
            "names of 1-64 bytes of [A-Za-z0-9._-]",
            Received::Frame(FrameKind::Hello),
        )
    };
    for name in [hello.worker_name, hello.worker_version]
        .into_iter()
        .chain(hello.methods.iter().copied())
    {
        if !is_valid_method_name(name) {
            return Err(invalid_name(()));
        }
    }
    let invalid_hello = || {
        Violation::new(
            ViolationCode::InvalidHello,
            "distinct methods and a 32-byte token",
            Received::Frame(FrameKind::Hello),
        )
    };
    if hello.methods.len() > frame::MAX_HELLO_METHODS {
        return Err(invalid_hello());
    }
    let mut sorted = hello.methods.clone();
    sorted.sort_unstable();
    if sorted
        .windows(2)
        .any(|pair| matches!(pair, [a, b] if a == b))
    {
        return Err(invalid_hello());
    }
    if hello.token.is_some_and(|t| t.len() != frame::TOKEN_LEN) {
        return Err(invalid_hello());
    }
    Ok(())
}

/// Whether `due` is a pending call's current deadline (not an entry left stale by the call
/// finishing or its deadline moving).
fn is_due(calls: &HashMap<CallId, PendingCall, crate::BuildIdHasher>, due: &Due) -> bool {
    let (at, id) = due;
    calls.get(id).is_some_and(|call| call.deadline == *at)
}
