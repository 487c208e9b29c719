//! The worker's side of the connection: the mirror of [`HostSession`](crate::HostSession).
//!
//! The host is trusted, but its frames are validated all the same (defence in depth), and the
//! worker runtime is held to the protocol: exactly one terminal frame per call received,
//! `Progress` only before it and within the host's quota.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use super::{CloseReason, FinishedIds};
use crate::frame::{self, BodyTag, Encoder, Frame, Hello, Refuse, Welcome};
use crate::Body;
use crate::{
    body_frame_len, CallId, FrameDecoder, MethodName, Received, RemoteError, ReplyError, Transmit,
    Violation, ViolationCode, DEFAULT_MAX_FRAME, PROTOCOL_VERSION, TOKEN_LEN,
};

/// What the worker introduces itself with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The worker's name (naming rule of method names).
    pub name: String,
    /// The worker's version (same rule).
    pub version: String,
    /// The methods it serves.
    pub methods: Vec<String>,
    /// The connection token the host handed over, for socket transports.
    pub token: Option<[u8; TOKEN_LEN]>,
    /// Largest frame accepted before the `Welcome` states the connection's cap.
    pub max_frame: u32,
}

impl WorkerConfig {
    /// A config with no methods, no token and [`DEFAULT_MAX_FRAME`].
    pub fn new(name: &str, version: &str) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            methods: Vec::new(),
            token: None,
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

/// What the host asked; drain with [`WorkerSession::poll_event`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// The host accepted the `Hello` and stated its limits.
    Welcomed(Welcome),
    /// Run `method` on `body` and answer with exactly one terminal reply for `id`.
    Call {
        /// The call's id, to quote in every reply.
        id: CallId,
        /// The method's name (validated).
        method: MethodName,
        /// The encoded request.
        body: Bytes,
    },
    /// The host cancelled `id`: stop its handler if possible; a terminal reply is still owed.
    Cancel {
        /// The call.
        id: CallId,
    },
    /// Take no new calls; exit once the calls in flight are answered.
    Shutdown,
    /// The session ended. Emitted once, last.
    Closed(CloseReason),
}

/// The connection's lifetime, worker side.
///
/// ```text
///                     Welcome                 Shutdown
///  AwaitingWelcome ───────────▶ Serving ──────────────────▶ Draining
///        │ Refuse, violation       │ violation, end of stream   │ violation, end of stream
///        ▼                         ▼                            ▼
///      Closed ◀──────────────────────────────────────────────────
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    AwaitingWelcome,
    Serving(Welcome),
    Draining(Welcome),
    Closed,
}

#[derive(Debug)]
struct RunningCall {
    method: MethodName,
    progress: u32,
}

/// The worker's sans-IO session. Drive it as [`HostSession`](crate::HostSession) is driven:
/// feed frames in, send replies with [`reply_progress`](Self::reply_progress),
/// [`reply_return`](Self::reply_return) and [`reply_fail`](Self::reply_fail), and drain
/// [`poll_transmit`](Self::poll_transmit) and [`poll_event`](Self::poll_event). Its first
/// transmit is the `Hello`.
#[derive(Debug)]
pub struct WorkerSession {
    state: State,
    decoder: FrameDecoder,
    encoder: Encoder,
    calls: HashMap<CallId, RunningCall, crate::BuildIdHasher>,
    finished: FinishedIds,
    transmits: VecDeque<Transmit>,
    events: VecDeque<WorkerEvent>,
}

impl WorkerSession {
    /// A session whose `Hello` is queued for sending.
    pub fn new(config: &WorkerConfig) -> Self {
        let mut encoder = Encoder::default();
        let hello = Hello {
            protocol: PROTOCOL_VERSION,
            worker_name: &config.name,
            worker_version: &config.version,
            methods: config.methods.iter().map(String::as_str).collect(),
            token: config.token.as_ref().map(|t| &t[..]),
        };
        let mut transmits = VecDeque::new();
        transmits.push_back(encoder.whole(&Frame::Hello(hello)));
        Self {
            state: State::AwaitingWelcome,
            decoder: FrameDecoder::new(config.max_frame),
            encoder,
            calls: HashMap::default(),
            finished: FinishedIds::default(),
            transmits,
            events: VecDeque::new(),
        }
    }

    /// True once the session has closed.
    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// True when the host asked for shutdown and every call has been answered: the worker
    /// should flush its transmits, close the connection and exit.
    pub fn is_drained(&self) -> bool {
        matches!(self.state, State::Draining(_)) && self.calls.is_empty()
    }

    /// Calls received and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.calls.len()
    }

    /// The next frame to write, in order.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// The next event, in order.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<WorkerEvent> {
        self.events.pop_front()
    }

    /// Sends an update for a running call, within the host's quota.
    pub fn reply_progress(&mut self, id: CallId, body: impl Into<Body>) -> Result<(), ReplyError> {
        let body = body.into();
        let welcome = self.welcome()?;
        let call = self.calls.get_mut(&id).ok_or(ReplyError::NoSuchCall)?;
        check_size(call.method.len(), &body, welcome.max_frame)?;
        if call.progress >= welcome.max_progress_per_call {
            return Err(ReplyError::ProgressQuota {
                max: welcome.max_progress_per_call,
            });
        }
        call.progress += 1;
        let transmit = self
            .encoder
            .with_body(BodyTag::Progress, id, call.method.as_bytes(), body);
        self.transmits.push_back(transmit);
        Ok(())
    }

    /// Answers a call with its encoded response: its one terminal frame.
    pub fn reply_return(&mut self, id: CallId, body: impl Into<Body>) -> Result<(), ReplyError> {
        let body = body.into();
        let welcome = self.welcome()?;
        let call = self.calls.get(&id).ok_or(ReplyError::NoSuchCall)?;
        check_size(call.method.len(), &body, welcome.max_frame)?;
        let transmit = self
            .encoder
            .with_body(BodyTag::Return, id, call.method.as_bytes(), body);
        self.finish(id);
        self.transmits.push_back(transmit);
        Ok(())
    }

    /// Answers a call with a failure: its one terminal frame. Always fits: a `Fail` with the
    /// longest message is smaller than [`MIN_MAX_FRAME`](crate::MIN_MAX_FRAME).
    pub fn reply_fail(&mut self, id: CallId, error: &RemoteError) -> Result<(), ReplyError> {
        self.welcome()?;
        let call = self.calls.get(&id).ok_or(ReplyError::NoSuchCall)?;
        let fail = frame::Fail {
            id,
            method: call.method.as_str(),
            kind: error.kind().to_wire(),
            message: error.message(),
            code: error.code(),
        };
        let transmit = self.encoder.whole(&Frame::Fail(fail));
        self.finish(id);
        self.transmits.push_back(transmit);
        Ok(())
    }

    fn finish(&mut self, id: CallId) {
        self.calls.remove(&id);
        self.finished.remember(id);
    }

    fn welcome(&self) -> Result<Welcome, ReplyError> {
        match self.state {
            State::Serving(welcome) | State::Draining(welcome) => Ok(welcome),
            State::AwaitingWelcome | State::Closed => Err(ReplyError::Closed),
        }
    }

    /// Feeds raw bytes from the host's stream (any chunking).
    pub fn handle_bytes(&mut self, data: &[u8]) {
        if self.is_closed() {
            return;
        }
        self.decoder.extend(data);
        loop {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => self.handle_frame(frame),
                Ok(None) => return,
                Err(err) => {
                    return self.close(CloseReason::Violation(Violation::from_frame_error(err)))
                }
            }
            if self.is_closed() {
                return;
            }
        }
    }

    /// The host's stream ended: the session closes (the host is gone; nothing can be sent).
    pub fn handle_eof(&mut self) {
        if self.is_closed() {
            return;
        }
        let reason = match self.decoder.finish() {
            Err(err) => CloseReason::Violation(Violation::from_frame_error(err)),
            Ok(()) if self.is_drained() => CloseReason::Shutdown,
            Ok(()) => CloseReason::WorkerClosed,
        };
        self.close(reason);
    }

    /// Handles one complete frame payload (without its length prefix).
    pub fn handle_frame(&mut self, payload: Bytes) {
        if self.is_closed() {
            return;
        }
        let max = self.decoder.max_frame();
        if payload.is_empty() || payload.len() > max as usize {
            let err = if payload.is_empty() {
                crate::FrameError::Empty
            } else {
                crate::FrameError::TooLarge {
                    len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
                    max,
                }
            };
            return self.close(CloseReason::Violation(Violation::from_frame_error(err)));
        }
        let result = match frame::decode_frame(&payload) {
            Ok(frame) => self.on_frame(&payload, frame),
            Err(_) => Err(Violation::new(
                ViolationCode::MalformedFrame,
                "a valid frame encoding",
                Received::Bytes,
            )),
        };
        if let Err(violation) = result {
            self.close(CloseReason::Violation(violation));
        }
    }

    fn on_frame(&mut self, payload: &Bytes, frame: Frame<'_>) -> Result<(), Violation> {
        let received = Received::Frame(frame.kind());
        let welcome = match (self.state, frame) {
            (State::AwaitingWelcome, Frame::Welcome(welcome)) => {
                check_welcome(&welcome).map_err(|_| {
                    Violation::new(ViolationCode::InvalidWelcome, "limits in range", received)
                })?;
                // Keep whatever is buffered behind the Welcome (a Call may share its read).
                self.decoder.set_max_frame(welcome.max_frame);
                self.finished = FinishedIds::with_capacity(2 * welcome.max_in_flight as usize);
                self.state = State::Serving(welcome);
                self.events.push_back(WorkerEvent::Welcomed(welcome));
                return Ok(());
            }
            (State::AwaitingWelcome, Frame::Refuse(Refuse { reason, .. })) => {
                self.close(CloseReason::Refused(reason));
                return Ok(());
            }
            (State::AwaitingWelcome, _) => {
                return Err(Violation::new(
                    ViolationCode::FrameBeforeHandshake,
                    "Welcome or Refuse",
                    received,
                ))
            }
            (State::Closed, _) => return Ok(()),
            (State::Serving(welcome) | State::Draining(welcome), frame) => (welcome, frame),
        };
        match welcome {
            (_, Frame::Welcome(_) | Frame::Refuse(_)) => Err(Violation::new(
                ViolationCode::DuplicateHandshake,
                "Call, Cancel or Shutdown",
                received,
            )),
            (_, Frame::Hello(_) | Frame::Progress(_) | Frame::Return(_) | Frame::Fail(_)) => {
                Err(Violation::new(
                    ViolationCode::ForbiddenKind,
                    "Call, Cancel or Shutdown",
                    received,
                ))
            }
            (welcome, Frame::Call(call)) => self.on_call(payload, welcome, call),
            (_, Frame::Cancel(frame::Cancel { id })) => {
                // A Cancel can cross the worker's answer on the wire: one for a call that
                // already finished is expected and ignored; one for an id never seen is not.
                if self.calls.contains_key(&id) {
                    self.events.push_back(WorkerEvent::Cancel { id });
                    Ok(())
                } else if self.finished.contains(&id) {
                    Ok(())
                } else {
                    Err(Violation::new(
                        ViolationCode::UnknownCallId,
                        "the id of a call received",
                        received,
                    ))
                }
            }
            (welcome, Frame::Shutdown(_)) => {
                if let State::Serving(_) = self.state {
                    self.state = State::Draining(welcome);
                    self.events.push_back(WorkerEvent::Shutdown);
                }
                Ok(())
            }
        }
    }

    fn on_call(
        &mut self,
        payload: &Bytes,
        welcome: Welcome,
        call: frame::Call<'_>,
    ) -> Result<(), Violation> {
        let received = Received::Frame(crate::FrameKind::Call);
        if matches!(self.state, State::Draining(_)) {
            return Err(Violation::new(
                ViolationCode::ForbiddenKind,
                "no Call after Shutdown",
                received,
            ));
        }
        let Some(method) = MethodName::new(payload.slice_ref(call.method.as_bytes())) else {
            return Err(Violation::new(
                ViolationCode::InvalidName,
                "a valid method name",
                received,
            ));
        };
        if self.calls.contains_key(&call.id) || self.finished.contains(&call.id) {
            return Err(Violation::new(
                ViolationCode::DuplicateCallId,
                "a fresh call id",
                received,
            ));
        }
        if self.calls.len() >= welcome.max_in_flight as usize {
            return Err(Violation::new(
                ViolationCode::TooManyCalls,
                "at most max_in_flight calls",
                received,
            ));
        }
        self.calls.insert(
            call.id,
            RunningCall {
                method: method.clone(),
                progress: 0,
            },
        );
        self.events.push_back(WorkerEvent::Call {
            id: call.id,
            method,
            body: payload.slice_ref(call.body),
        });
        Ok(())
    }

    fn close(&mut self, reason: CloseReason) {
        if self.is_closed() {
            return;
        }
        self.state = State::Closed;
        self.calls.clear();
        self.events.push_back(WorkerEvent::Closed(reason));
    }
}

/// A `Welcome`'s limits must be ones a real host can set.
fn check_welcome(welcome: &Welcome) -> Result<(), ()> {
    let frame_ok = welcome.max_frame >= crate::MIN_MAX_FRAME;
    let in_flight_ok = (1..=crate::MAX_IN_FLIGHT).contains(&welcome.max_in_flight);
    if frame_ok && in_flight_ok {
        Ok(())
    } else {
        Err(())
    }
}

fn check_size(method_len: usize, body: &Body, max_frame: u32) -> Result<(), ReplyError> {
    if body_frame_len(method_len, body.len()) > max_frame as usize {
        return Err(ReplyError::TooLarge {
            len: body.len(),
            max: max_frame,
        });
    }
    Ok(())
}
