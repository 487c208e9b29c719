//! Why a connection was refused ([`Refusal`], the peer's doing) and why accepting the worker
//! failed ([`AcceptError`]).

use std::io;

use airlock_protocol::FrameKind;
use thiserror::Error;

/// Why [`NamedListener::accept_worker`](crate::NamedListener::accept_worker) closed a
/// connection instead of accepting it. Every refusal is logged (`tracing::warn!`) and counted;
/// none stops the listener.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The OS would not say who the peer is.
    #[error("peer credentials unavailable ({0:?})")]
    CredentialsUnavailable(io::ErrorKind),
    /// The peer runs as another user.
    #[error("peer runs as uid {got}, expected uid {expected}")]
    WrongUid {
        /// The uid the host expects.
        expected: u32,
        /// The peer's effective uid.
        got: u32,
    },
    /// The peer is not the process the host spawned.
    #[error("peer is pid {got:?}, expected pid {expected}")]
    WrongPid {
        /// The pid the host spawned.
        expected: u32,
        /// The peer's pid, if the OS reported one.
        got: Option<u32>,
    },
    /// The process that made the connection has exited: its credentials name a pid that may
    /// since have passed to another process (the worker itself, even), so they prove nothing.
    #[error("the process that connected (pid {pid}) has exited")]
    ConnectorExited {
        /// The pid its credentials name.
        pid: u32,
    },
    /// Too many connections were already being screened; this one was closed unread.
    #[error("too many connections awaiting their Hello")]
    TooManyCandidates,
    /// No complete first frame within the per-connection deadline.
    #[error("no Hello within the per-connection deadline")]
    HelloTimeout,
    /// The peer closed the connection before a complete first frame.
    #[error("connection closed before a complete Hello")]
    ClosedEarly,
    /// The first frame's length prefix is over the cap.
    #[error("first frame of {len} bytes exceeds the cap ({max})")]
    FrameTooLarge {
        /// The length the prefix claimed.
        len: u32,
        /// The cap.
        max: u32,
    },
    /// The first frame's length prefix is zero.
    #[error("zero-length first frame")]
    EmptyFrame,
    /// The first frame does not decode.
    #[error("first frame is malformed")]
    Malformed,
    /// The first frame decodes but is not a `Hello`.
    #[error("first frame is a {0:?}, not a Hello")]
    NotHello(FrameKind),
    /// The `Hello` carries no token.
    #[error("Hello carries no token")]
    MissingToken,
    /// The `Hello` carries a token other than this listener's.
    #[error("Hello carries the wrong token")]
    WrongToken,
    /// Reading the connection failed.
    #[error("reading the connection failed ({0:?})")]
    Io(io::ErrorKind),
    /// Still being screened when the worker was accepted; closed unread.
    #[error("superseded: the worker was accepted on another connection")]
    Superseded,
}

/// Why [`NamedListener::accept_worker`](crate::NamedListener::accept_worker) did not produce a
/// worker connection. Either way the listener is gone: its name and directory are removed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AcceptError {
    /// The deadline passed without a connection that passed every check.
    #[error("no authenticated worker connected before the deadline ({refused} refused)")]
    Deadline {
        /// Connections refused meanwhile.
        refused: u32,
        /// The first [`MAX_RECORDED_REFUSALS`](crate::MAX_RECORDED_REFUSALS) reasons.
        refusals: Vec<Refusal>,
    },
    /// The listening socket itself failed.
    #[error("the listening socket failed: {0}")]
    Io(#[from] io::Error),
}
