//! Why a command failed, and the exit status each reason maps to (`exit_codes.txt`, which
//! `--help` and the crate docs show).

use std::process::ExitCode;

use airlock_host::{CallError, SpawnError};
use thiserror::Error;

/// A failed command. Each variant has one exit status; the message is printed as
/// `airlock: <message>`.
#[derive(Debug, Error)]
pub enum CliError {
    /// The request or an option is wrong; nothing was started.
    #[error("{0}")]
    Usage(String),
    /// The worker could not be started.
    #[error("could not start the worker: {0}")]
    Spawn(#[from] SpawnError),
    /// A call failed.
    #[error("the call to `{method}` failed: {error}")]
    Call {
        /// The method called.
        method: String,
        /// How it failed.
        error: CallError,
    },
    /// The tool's own I/O failed (its output, or `bench`'s raw echo peer).
    #[error("{what}: {error}")]
    Local {
        /// What was being done.
        what: &'static str,
        /// The failure.
        #[source]
        error: std::io::Error,
    },
}

impl CliError {
    /// A call to `method` that failed with `error`.
    pub fn call(method: &str, error: CallError) -> Self {
        Self::Call {
            method: method.to_owned(),
            error,
        }
    }

    /// A failure of the tool's own I/O while doing `what`.
    pub fn local(what: &'static str, error: std::io::Error) -> Self {
        Self::Local { what, error }
    }

    /// The exit status for this failure, as `exit_codes.txt` lists them.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::Usage(_) => 2,
            CliError::Spawn(_) => 3,
            CliError::Call { error, .. } => match error {
                CallError::Remote(_) => 1,
                CallError::InvalidMethodName
                | CallError::TooLarge { .. }
                | CallError::Encode(_) => 2,
                CallError::Timeout => 5,
                // Cancelled, Overloaded and Shutdown are not reachable from one call of this
                // tool; with the worker lost or lying, the call got no answer from it.
                CallError::WorkerLost(_)
                | CallError::Decode(_)
                | CallError::Cancelled
                | CallError::Overloaded { .. }
                | CallError::Shutdown => 4,
                // A kind of failure added to airlock-host later: the call got no answer.
                _ => 4,
            },
            CliError::Local { .. } => 6,
        })
    }
}
