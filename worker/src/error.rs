//! The worker's errors.

use airlock_protocol::{ErrorKind, RemoteError};
use thiserror::Error;

/// A handler's own failure, sent to the host as a [`RemoteError`] of kind
/// [`ErrorKind::Handler`]. The message is made safe on the way out (control characters become
/// spaces, length capped at [`MAX_ERROR_MESSAGE`](airlock_protocol::MAX_ERROR_MESSAGE)).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct HandlerError {
    message: String,
    code: Option<u32>,
}

impl HandlerError {
    /// A failure with a message for the host.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: None,
        }
    }

    /// Adds an application-defined numeric code.
    #[must_use]
    pub fn with_code(mut self, code: u32) -> Self {
        self.code = Some(code);
        self
    }

    pub(crate) fn into_remote(self) -> RemoteError {
        let err = RemoteError::new(ErrorKind::Handler, &self.message);
        match self.code {
            Some(code) => err.with_code(code),
            None => err,
        }
    }
}

/// Why a [`Progress::send`](crate::Progress::send) did not send its update.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProgressError {
    /// The call has sent the host's `max_progress_per_call` updates already (one more would be
    /// a violation that ends the worker). Send fewer, or raise
    /// `HostConfig::max_progress_per_call` on the host.
    #[error(
        "the call's progress quota ({max} updates, HostConfig::max_progress_per_call) is spent"
    )]
    QuotaExhausted {
        /// The quota.
        max: u32,
    },
    /// The update did not encode.
    #[error("the update did not encode: {0}")]
    Encode(#[source] airlock_codec::EncodeError),
    /// The worker is stopping: nothing more reaches the host.
    #[error("the worker is stopping")]
    Closed,
}

/// Why [`Worker::serve`](crate::Worker::serve) stopped abnormally.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The transport could not be set up (stdio not pipes, socket missing...).
    #[error("could not open the transport: {0}")]
    Transport(#[source] std::io::Error),
    /// No transport feature was compiled in, or the environment names one not compiled in.
    #[error("no usable transport: {0}")]
    NoTransport(&'static str),
    /// The process could not make itself non-dumpable (see [`Worker::serve`](crate::Worker::serve)).
    #[error("could not make the worker process non-dumpable: {0}")]
    Undumpable(#[source] std::io::Error),
    /// The host asked the worker to install its seccomp allowlist, and it could not
    /// (see [`confine`](crate::confine)).
    #[error("could not install the worker's seccomp allowlist: {0}")]
    Confine(#[source] crate::confine::ConfineError),
    /// The connection failed while serving.
    #[error("connection failed: {0}")]
    Connection(#[from] airlock_protocol::TransportError),
    /// The host refused the handshake.
    #[error("the host refused the worker: {0:?}")]
    Refused(airlock_protocol::RefuseReason),
    /// The host broke the protocol.
    #[error("the host broke the protocol: {0}")]
    Violation(airlock_protocol::Violation),
    /// A method name is invalid or registered twice.
    #[error("invalid method registration: {0}")]
    InvalidMethod(String),
    /// The async runtime could not be built (for `serve_blocking`).
    #[error("the runtime failed: {0}")]
    Runtime(#[source] std::io::Error),
    /// The runtime cancelled the serving task before it finished (for `serve_blocking`): it
    /// was shut down from elsewhere.
    #[error("the runtime cancelled the serving task")]
    ServingCancelled,
}
