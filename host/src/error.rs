//! The host's errors: what a call can end with, and why a worker could not be started.
//!
//! Kept apart: the remote handler's own failure ([`CallError::Remote`], data from the worker),
//! the worker's misbehaviour or death ([`CallError::WorkerLost`] with a [`LostReason`]), and
//! local outcomes (timeout, cancellation, overload, shutdown).

use airlock_codec::{DecodeError, EncodeError};
use airlock_protocol::{RefuseReason, RemoteError, Violation, ViolationCode};
use thiserror::Error;

/// How a call failed. Every call ends with exactly one `Ok` or one of these.
#[derive(Clone, Debug, PartialEq, Error)]
#[non_exhaustive]
pub enum CallError {
    /// The worker's handler reported a failure (as data: kind, bounded message, code).
    #[error("the worker reported: {0}")]
    Remote(RemoteError),
    /// The call's deadline passed. The worker was killed: a handler cannot be pre-empted.
    #[error("the call timed out")]
    Timeout,
    /// The call was cancelled.
    #[error("the call was cancelled")]
    Cancelled,
    /// The worker died or was killed before answering.
    #[error("the worker was lost: {0}")]
    WorkerLost(LostReason),
    /// The worker's answer did not decode to the method's response type. The worker was killed
    /// as a liar; nothing of its answer was used.
    #[error("the worker's response did not decode: {0}")]
    Decode(DecodeError),
    /// The request could not be encoded (a failing `Serialize`); nothing was sent.
    #[error("the request did not encode: {0}")]
    Encode(EncodeError),
    /// The encoded request is larger than a frame may be; nothing was sent.
    #[error("the request is {len} bytes, over the frame limit")]
    TooLarge {
        /// The encoded request's length.
        len: usize,
    },
    /// The worker already has `max_in_flight` calls; nothing was sent.
    #[error("the worker is at its in-flight limit")]
    Overloaded,
    /// A method named at run time ([`Host::call_value`](crate::Host::call_value)) is not 1–64
    /// bytes of `[A-Za-z0-9._-]`; nothing was sent.
    #[error("invalid method name: a method name is 1-64 bytes of [A-Za-z0-9._-]")]
    InvalidMethodName,
    /// The host is shut down.
    #[error("the host is shut down")]
    Shutdown,
}

/// Why a worker was lost. The worker is never reused after any of these.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LostReason {
    /// The worker broke the protocol; the code says how.
    #[error("{0}")]
    Violation(Violation),
    /// The worker's `Hello` was refused (wrong version or token).
    #[error("handshake refused: {0:?}")]
    Refused(RefuseReason),
    /// No valid `Hello` arrived within the handshake deadline.
    #[error("no handshake within the deadline")]
    HandshakeTimeout,
    /// Another call on the same worker passed its deadline and its handler was still running
    /// when the cancel grace ended (it ignored the `Cancel`), so the worker was killed.
    #[error(
        "another call on this worker timed out and its handler ignored the cancel for longer \
         than the cancel grace (HostConfig::cancel_grace); give that call a longer deadline, \
         make its handler honour cancellation, or put it on a worker of its own"
    )]
    OtherCallTimedOut,
    /// The worker closed its channel or exited.
    #[error("the worker exited ({0})")]
    Exited(ExitInfo),
    /// Writing to or reading from the worker failed (it stopped reading, or I/O failed).
    #[error("the transport failed")]
    TransportFailed,
    /// The worker answered some call with a response that did not decode.
    #[error("the worker sent an undecodable response")]
    UndecodableResponse,
    /// The host shut the worker down before the call finished.
    #[error("the host shut the worker down")]
    Shutdown,
    /// The host found, from outside, that the worker does not run under the confinement it
    /// asked for (the details are logged at WARN on target `airlock::confinement`).
    #[error("the worker does not run under the confinement asked for")]
    ConfinementNotVerified,
    /// The worker failed too often; the supervisor stopped restarting it.
    #[error("the restart budget is exhausted")]
    RestartBudgetExhausted,
}

impl LostReason {
    /// The violation code, if the worker was lost for breaking the protocol.
    pub fn violation_code(&self) -> Option<ViolationCode> {
        match self {
            LostReason::Violation(v) => Some(v.code),
            _ => None,
        }
    }
}

/// How a worker process ended, as far as the host saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitInfo {
    /// The exit code, if it exited normally.
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
}

impl std::fmt::Display for ExitInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.code, self.signal) {
            (Some(code), _) => write!(f, "exit code {code}"),
            (None, Some(signal)) => write!(f, "signal {signal}"),
            (None, None) => f.write_str("status unknown"),
        }
    }
}

/// Why a worker could not be started.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The program could not be executed.
    #[error("could not start the worker program: {0}")]
    Exec(#[source] std::io::Error),
    /// This process ignores `SIGCHLD` (or set `SA_NOCLDWAIT`), so the kernel reaps children
    /// the moment they exit. airlock relies on holding its worker unreaped until it has
    /// finished with its pid (killing its process group, authenticating its socket): with the
    /// pid free, another process could take it. Restore `SIGCHLD`'s default disposition
    /// before spawning workers.
    #[error(
        "SIGCHLD is ignored in this process, so workers would be reaped behind the host's back"
    )]
    ChildrenReapedByKernel,
    /// The channel to the worker could not be set up.
    #[error("could not set up the transport: {0}")]
    Transport(#[source] std::io::Error),
    /// The worker started but did not complete the handshake.
    #[error("the worker failed its handshake: {0}")]
    Handshake(LostReason),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(#[from] airlock_protocol::ConfigError),
    /// The worker could not be started under the confinement asked for, or was found, from
    /// outside, not to run under it. It was killed; nothing was sent to it.
    #[error("confinement: {0}")]
    Confinement(#[from] crate::ConfinementError),
    /// `PoolBuilder::size(0)`: a pool needs at least one worker.
    #[error("a Pool needs at least one worker: set PoolBuilder::size to 1 or more")]
    EmptyPool,
    /// airlock's spawner thread, from which every worker is forked, did not take or answer
    /// the spawn. Not a fault of the worker program; the next spawn starts a fresh thread.
    #[error("airlock's spawner thread failed: {0}")]
    Spawner(#[source] SpawnerError),
    /// The task supervising the worker ended before it reported whether the worker started:
    /// the tokio runtime it ran on is shutting down, or the task panicked (a defect in airlock).
    #[error("the worker's supervisor task ended before the worker was ready (is the runtime shutting down?)")]
    SupervisorEnded,
}

/// Why airlock's spawner thread did not fork a worker (see [`SpawnError::Spawner`]).
///
/// Every worker is forked from a dedicated thread that lives as long as the process, so that
/// the worker's parent-death signal means "the host process died". These are that thread's
/// own failures, apart from the program's ([`SpawnError::Exec`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SpawnerError {
    /// The operating system would not start the thread.
    #[error("the spawner thread could not be started: {0}")]
    Start(#[source] std::io::Error),
    /// The thread started but did not report itself ready in time.
    #[error("the spawner thread did not start in time")]
    StartTimeout,
    /// A thread panicked while holding the spawner's lock.
    #[error("the spawner lock is poisoned")]
    Poisoned,
    /// The thread is gone: it took no job.
    #[error("the spawner thread is gone")]
    Gone,
    /// The thread took the job and dropped it without an answer.
    #[error("the spawner thread dropped the spawn")]
    Dropped,
    /// The thread took the job and did not answer in time.
    #[error("the spawner thread did not answer in time")]
    NoAnswer,
}
