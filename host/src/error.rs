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
    /// as a liar, and this is returned once it is reaped (a wait with a bound: SECURITY.md,
    /// "make its death slow"); nothing of its answer was used. When the answer was over one of
    /// the host's response budgets, the message names the budget, its value and where it is set
    /// ([`HostBuilder::limits`](crate::HostBuilder::limits)).
    #[error("the worker's response did not decode: {0}{hint}", hint = response_budget_hint(.0))]
    Decode(DecodeError),
    /// The request could not be encoded (a failing `Serialize`); nothing was sent.
    #[error("the request did not encode: {0}")]
    Encode(EncodeError),
    /// The encoded request is larger than a frame may be; nothing was sent.
    #[error(
        "the request is {len} bytes, too large for the frame limit of {max} bytes \
         (HostConfig::max_frame, set with HostBuilder::protocol)"
    )]
    TooLarge {
        /// The encoded request's length.
        len: usize,
        /// The frame limit.
        max: u32,
    },
    /// The worker already has `max_in_flight` calls (or that many wait for it); nothing was
    /// sent.
    #[error(
        "the worker is at its limit of {max} calls in flight (HostConfig::max_in_flight, set \
         with HostBuilder::protocol)"
    )]
    Overloaded {
        /// The in-flight limit.
        max: u32,
    },
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

    /// True if the host knows that the call reporting this reason did not cause the loss, so
    /// that an idempotent call may be sent again on another worker (what
    /// [`PoolBuilder::retry_lost_calls`](crate::PoolBuilder::retry_lost_calls) does):
    ///
    /// - [`OtherCallTimedOut`](Self::OtherCallTimedOut): another call passed its deadline and
    ///   its handler ignored the cancel past the grace (the call that timed out gets
    ///   [`CallError::Timeout`] itself);
    /// - [`HandshakeTimeout`](Self::HandshakeTimeout), [`Refused`](Self::Refused),
    ///   [`ConfinementNotVerified`](Self::ConfinementNotVerified),
    ///   [`RestartBudgetExhausted`](Self::RestartBudgetExhausted): no worker took the call (a
    ///   worker is given calls only once its handshake and verification have passed).
    ///
    /// False for the rest, where this call may be the cause, so that a retry would carry the
    /// same request to a second worker and its calls: a [`Violation`](Self::Violation) or an
    /// [`UndecodableResponse`](Self::UndecodableResponse) (even in another call's answer) is
    /// the mark of a worker gone hostile or broken, and any request it held may be what did
    /// it; a worker that [`Exited`](Self::Exited) or stopped reading
    /// ([`TransportFailed`](Self::TransportFailed)) may have aborted, overflowed its stack or
    /// run out of memory on this very request. And [`Shutdown`](Self::Shutdown): the host was
    /// shut down on purpose.
    ///
    /// ```
    /// use airlock_host::LostReason;
    /// assert!(LostReason::OtherCallTimedOut.not_caused_by_the_call());
    /// assert!(!LostReason::TransportFailed.not_caused_by_the_call());
    /// ```
    pub fn not_caused_by_the_call(&self) -> bool {
        match self {
            LostReason::OtherCallTimedOut
            | LostReason::HandshakeTimeout
            | LostReason::Refused(_)
            | LostReason::ConfinementNotVerified
            | LostReason::RestartBudgetExhausted => true,
            LostReason::Violation(_)
            | LostReason::UndecodableResponse
            | LostReason::Exited(_)
            | LostReason::TransportFailed
            | LostReason::Shutdown => false,
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

/// Points a budget refusal of a response at the setting that changes it.
fn response_budget_hint(err: &DecodeError) -> &'static str {
    match err.budget() {
        Some(_) => "; the host's response budgets are set with HostBuilder::limits",
        None => "",
    }
}

/// Why a worker could not be started.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The program could not be executed: it does not exist, is not executable, or is not a
    /// format the kernel runs.
    #[error("could not start the worker program {}: {source}{hint}", program.display(), hint = exec_hint(source))]
    Exec {
        /// The program, as configured.
        program: std::path::PathBuf,
        /// Why `exec` (or finding the program) failed.
        #[source]
        source: std::io::Error,
    },
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
    /// The worker started but did not complete the handshake: it exited, wrote something
    /// that is not an airlock `Hello`, said nothing in time, or was refused. The error names
    /// the program, says what to check, and carries the worker's last stderr lines.
    #[error("{0}")]
    Handshake(HandshakeError),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(#[from] airlock_protocol::ConfigError),
    /// The worker could not be started under the confinement asked for, or was found, from
    /// outside, not to run under it. It was killed; nothing was sent to it.
    #[error("confinement: {0}")]
    Confinement(#[from] crate::ConfinementError),
    /// The runtime a [`blocking`](crate::blocking) host runs on could not be started (the
    /// thread or its I/O driver could not be created).
    #[error("could not start the blocking host's runtime thread: {0}")]
    Runtime(#[source] std::io::Error),
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

/// Violations that, as the first thing a program sends, mean its output is not frames at all.
fn not_frames(code: ViolationCode) -> bool {
    matches!(
        code,
        ViolationCode::FrameTooLarge
            | ViolationCode::EmptyFrame
            | ViolationCode::MalformedFrame
            | ViolationCode::TruncatedFrame
    )
}

/// Why `exec` failed, in the words of what to check.
fn exec_hint(source: &std::io::Error) -> &'static str {
    // The spawn's own descriptors (pipes, the channel) are opened here too: running out of
    // them is this process's doing, not the program's.
    match source.raw_os_error() {
        Some(libc::EMFILE) => {
            return " (this host process is out of file descriptors: raise its RLIMIT_NOFILE \
                    or close some)"
        }
        Some(libc::ENFILE) => return " (the machine is out of file descriptors: fs.file-max)",
        _ => {}
    }
    match source.kind() {
        std::io::ErrorKind::NotFound => {
            " (check the path: a relative one is resolved against the host's working directory)"
        }
        std::io::ErrorKind::PermissionDenied => " (is it executable? chmod +x)",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_error_says_what_to_check() {
        let exec = |errno| SpawnError::Exec {
            program: "/bin/worker".into(),
            source: std::io::Error::from_raw_os_error(errno),
        };
        assert!(exec(libc::ENOENT).to_string().contains("check the path"));
        assert!(exec(libc::EACCES).to_string().contains("chmod +x"));
        let out_of_descriptors = exec(libc::EMFILE).to_string();
        assert!(
            out_of_descriptors.contains("this host process is out of file descriptors")
                && out_of_descriptors.contains("RLIMIT_NOFILE"),
            "{out_of_descriptors}"
        );
        assert!(exec(libc::ENFILE).to_string().contains("fs.file-max"));
    }
}

/// The worker did not complete its handshake ([`SpawnError::Handshake`]): why, which program,
/// and what it last wrote to stderr.
///
/// Its message says what to check: a program that exits or writes to its stdout before its
/// `Hello` is asked whether it is an airlock worker at all (stdout is the channel on the pipe
/// transport, and anything but frames there is refused); a handshake that times out names
/// the deadline and [`HostConfig::handshake_timeout`](crate::HostConfig::handshake_timeout).
///
/// ```no_run
/// use airlock_host::{Host, LostReason, SpawnError};
/// # async fn demo() {
/// match Host::builder("/bin/false").spawn().await {
///     Err(SpawnError::Handshake(failure)) => {
///         assert!(matches!(failure.reason, LostReason::Exited(_)));
///         eprintln!("{failure}"); // names /bin/false and asks whether it is an airlock worker
///     }
///     other => panic!("{other:?}"),
/// }
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandshakeError {
    /// Why the worker was lost.
    pub reason: LostReason,
    /// The worker program, as configured.
    pub program: std::path::PathBuf,
    /// The handshake deadline it was given.
    pub handshake_timeout: std::time::Duration,
    /// Whether its channel was its stdout (the pipe transport).
    pub channel_is_stdout: bool,
    /// Its last lines on stderr, oldest first: at most [`STDERR_TAIL_LINES`] lines of at most
    /// [`STDERR_TAIL_LINE`] bytes, every character that could forge or hide text replaced.
    pub stderr: Vec<String>,
}

/// Most stderr lines a [`HandshakeError`] keeps: the last 10.
pub const STDERR_TAIL_LINES: usize = 10;

/// Longest stderr line a [`HandshakeError`] keeps, in bytes; the rest is cut.
pub const STDERR_TAIL_LINE: usize = 512;

impl HandshakeError {
    /// A failure with nothing known yet but its reason; the host adds the rest before a caller
    /// sees it.
    pub(crate) fn new(reason: LostReason) -> Self {
        Self {
            reason,
            program: std::path::PathBuf::new(),
            handshake_timeout: std::time::Duration::ZERO,
            channel_is_stdout: false,
            stderr: Vec::new(),
        }
    }

    /// What to check, for this reason.
    fn hint(&self) -> Option<String> {
        const NOT_A_WORKER: &str = "is this an airlock worker?";
        match &self.reason {
            LostReason::Exited(_) => Some(format!(
                "{NOT_A_WORKER} A worker built on airlock-worker says Hello as soon as it \
                 serves; one that exits first has usually said why on stderr"
            )),
            LostReason::Violation(v) if not_frames(v.code) && self.channel_is_stdout => {
                Some(format!(
                    "{NOT_A_WORKER} it wrote to stdout, which is the channel, before its Hello, \
                     and what it wrote is not airlock frames (a worker built on airlock-worker \
                     sends print! output to stderr)"
                ))
            }
            LostReason::Violation(v) if not_frames(v.code) => Some(format!(
                "{NOT_A_WORKER} it sent bytes that are not airlock frames before its Hello"
            )),
            LostReason::HandshakeTimeout => Some(format!(
                "the deadline is {:?} (HostConfig::handshake_timeout, set with \
                 HostBuilder::protocol); {NOT_A_WORKER} A program that waits for input, like \
                 cat, never says Hello",
                self.handshake_timeout
            )),
            LostReason::Refused(airlock_protocol::RefuseReason::VersionMismatch) => Some(
                "it speaks another protocol version: build it against this version of airlock"
                    .into(),
            ),
            _ => None,
        }
    }
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the worker {} did not complete its handshake: {}",
            self.program.display(),
            self.reason
        )?;
        if let Some(hint) = self.hint() {
            write!(f, "; {hint}")?;
        }
        match self.stderr.as_slice() {
            [] if matches!(self.reason, LostReason::Exited(_)) => {
                f.write_str("; it wrote nothing to stderr")
            }
            [] => Ok(()),
            lines => {
                f.write_str("; its last stderr lines:")?;
                for line in lines {
                    write!(f, "\n  {line}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for HandshakeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.reason)
    }
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
