//! The protocol's errors. Peer misbehaviour ([`Violation`]) is kept apart from local mistakes
//! ([`BeginCallError`], [`ReplyError`], [`ConfigError`]) and from transport failures
//! ([`TransportError`]). A remote handler's own failure is data ([`RemoteError`](crate::RemoteError)).

use core::fmt;

use airlock_codec::DecodeError;
use thiserror::Error;

use crate::FrameKind;

/// A framing fault: the byte stream itself is unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    /// A length prefix over the receiver's cap; refused before any buffer was reserved.
    #[error("frame of {len} bytes exceeds max_frame ({max})")]
    TooLarge {
        /// The length the prefix claimed.
        len: u32,
        /// The receiver's cap.
        max: u32,
    },
    /// A length prefix of zero: every frame has at least a kind tag.
    #[error("zero-length frame")]
    Empty,
    /// The stream ended inside a frame.
    #[error("stream ended inside a frame: {received} of {expected} bytes")]
    Truncated {
        /// Bytes the prefix (or the prefix itself) promised.
        expected: u32,
        /// Bytes that arrived.
        received: u32,
    },
}

/// A frame payload that is not a valid encoding of any frame.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("malformed frame: {0}")]
pub struct DecodeFrameError(pub DecodeError);

/// Stable numeric codes for every way a peer can break the protocol, for metrics and logs.
///
/// The numbers are part of the protocol (`PROTOCOL.md` lists them) and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
#[repr(u16)]
pub enum ViolationCode {
    /// A length prefix over `max_frame`.
    FrameTooLarge = 1,
    /// A zero length prefix.
    EmptyFrame = 2,
    /// A payload that is not a valid frame encoding.
    MalformedFrame = 3,
    /// The stream ended inside a frame.
    TruncatedFrame = 4,
    /// Any frame other than `Hello` (host side) or `Welcome`/`Refuse` (worker side) first.
    FrameBeforeHandshake = 5,
    /// A second `Hello` (or `Welcome`).
    DuplicateHandshake = 6,
    /// A frame kind this side never receives (a worker sending `Call`, a host sending `Return`).
    ForbiddenKind = 7,
    /// A frame for an id no call was ever given (forged, or staged before its call was sent).
    UnknownCallId = 8,
    /// A frame for a call that already ended: a second terminal frame, progress after the end,
    /// a replayed answer.
    FinishedCallId = 9,
    /// A frame whose method name is not the call's.
    MethodMismatch = 10,
    /// A method, worker name or version that breaks the naming rule.
    InvalidName = 11,
    /// More `Progress` frames for one call than the host allows.
    ProgressOverQuota = 12,
    /// An error descriptor with an unknown kind, an over-long message or a control character.
    InvalidErrorDescriptor = 13,
    /// A `Hello` that breaks a rule: duplicate methods, a malformed token. (More than
    /// [`MAX_HELLO_METHODS`](crate::frame::MAX_HELLO_METHODS) methods is already refused by the
    /// frame decoder's item budget, as [`MalformedFrame`](Self::MalformedFrame).)
    InvalidHello = 14,
    /// A `Call` reusing the id of a call still running (worker side).
    DuplicateCallId = 15,
    /// More calls in flight than the worker was told to expect (worker side).
    TooManyCalls = 16,
    /// A `Welcome` whose limits are out of range (worker side).
    InvalidWelcome = 17,
}

impl ViolationCode {
    /// The stable number.
    pub const fn number(self) -> u16 {
        self as u16
    }
}

impl fmt::Display for ViolationCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} (#{})", self.number())
    }
}

/// A peer broke the protocol. Fatal to the connection: the session closes, every call on it
/// ends with this violation, and the peer is never trusted again.
///
/// Carries what the session expected and what it received, for logs that explain themselves.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("protocol violation {code}: expected {expected}, received {received}")]
pub struct Violation {
    /// The stable reason code.
    pub code: ViolationCode,
    /// What the session would have accepted, in words.
    pub expected: &'static str,
    /// What arrived.
    pub received: Received,
}

/// What arrived, as far as a [`Violation`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Received {
    /// A frame of this kind.
    Frame(FrameKind),
    /// Bytes that did not form a frame.
    Bytes,
    /// The end of the stream.
    EndOfStream,
}

impl fmt::Display for Received {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Received::Frame(kind) => write!(f, "a {kind:?} frame"),
            Received::Bytes => f.write_str("bytes that are not a frame"),
            Received::EndOfStream => f.write_str("end of stream"),
        }
    }
}

impl Violation {
    pub(crate) fn new(code: ViolationCode, expected: &'static str, received: Received) -> Self {
        Self {
            code,
            expected,
            received,
        }
    }

    pub(crate) fn from_frame_error(err: FrameError) -> Self {
        match err {
            FrameError::TooLarge { .. } => Self::new(
                ViolationCode::FrameTooLarge,
                "a frame within max_frame",
                Received::Bytes,
            ),
            FrameError::Empty => Self::new(
                ViolationCode::EmptyFrame,
                "a non-empty frame",
                Received::Bytes,
            ),
            FrameError::Truncated { .. } => Self::new(
                ViolationCode::TruncatedFrame,
                "a complete frame",
                Received::EndOfStream,
            ),
        }
    }
}

/// Why the host could not start a call. Local: nothing was sent.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BeginCallError {
    /// The handshake has not completed yet.
    #[error("the worker has not completed its handshake")]
    NotReady,
    /// The session is shutting down or closed.
    #[error("the session is closed to new calls")]
    Closed,
    /// `max_in_flight` calls are already running (cancelled calls awaiting their terminal
    /// frame count too).
    #[error("{max} calls already in flight")]
    Overloaded {
        /// The limit.
        max: u32,
    },
    /// The method name breaks the naming rule.
    #[error("invalid method name")]
    InvalidMethodName,
    /// The encoded request would make a frame over `max_frame`.
    #[error("request of {len} bytes makes a frame over max_frame ({max})")]
    TooLarge {
        /// The request body's length.
        len: usize,
        /// The frame cap.
        max: u32,
    },
}

/// Why the worker could not send a reply. Local: nothing was sent.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ReplyError {
    /// No call with this id is waiting for an answer (it already has one, or never existed).
    #[error("no running call has this id")]
    NoSuchCall,
    /// The reply would make a frame over the host's `max_frame`.
    #[error("reply of {len} bytes makes a frame over max_frame ({max})")]
    TooLarge {
        /// The body's length.
        len: usize,
        /// The host's frame cap.
        max: u32,
    },
    /// The call already sent as many `Progress` frames as the host allows.
    #[error("progress quota of {max} reached")]
    ProgressQuota {
        /// The quota.
        max: u32,
    },
    /// The session is closed.
    #[error("the session is closed")]
    Closed,
}

/// A configuration value out of range. Nothing is clamped silently.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `max_frame` must be at least [`MIN_MAX_FRAME`](crate::MIN_MAX_FRAME) bytes.
    #[error(
        "HostConfig::max_frame({0}) is below the minimum of {min} bytes",
        min = crate::MIN_MAX_FRAME
    )]
    MaxFrameTooSmall(u32),
    /// A timeout over [`MAX_TIMEOUT`](crate::MAX_TIMEOUT).
    #[error("timeout of {0:?} exceeds the maximum of 365 days")]
    TimeoutTooLong(core::time::Duration),
    /// `max_in_flight` must be 1 to [`MAX_IN_FLIGHT`](crate::MAX_IN_FLIGHT).
    #[error(
        "HostConfig::max_in_flight({0}) is outside 1..={max}",
        max = crate::MAX_IN_FLIGHT
    )]
    InFlightOutOfRange(u32),
    /// A low-latency spin window over [`MAX_SPIN`](crate::spin::MAX_SPIN)
    /// (`HostBuilder::low_latency`).
    #[error("spin window of {0:?} exceeds the maximum of {max:?} (HostBuilder::low_latency)", max = crate::spin::MAX_SPIN)]
    SpinTooLong(core::time::Duration),
    /// A polling window under load over [`MAX_SPIN`](crate::spin::MAX_SPIN)
    /// (`HostBuilder::poll_under_load`).
    #[error("polling window under load of {0:?} exceeds the maximum of {max:?} (HostBuilder::poll_under_load)", max = crate::spin::MAX_SPIN)]
    LoadPollTooLong(core::time::Duration),
}

/// A transport failed. The session treats it as the end of the connection.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    /// The byte stream broke the framing rules.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A write did not complete within its deadline: the peer stopped reading.
    #[error("send did not complete within its deadline")]
    SendTimeout,
    /// The operating system reported an error.
    #[error("transport I/O failed: {0}")]
    Io(#[source] Box<dyn std::error::Error + Send + Sync>),
}
