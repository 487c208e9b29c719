//! Session configuration: the limits each side enforces, with named defaults.

use core::time::Duration;

use crate::{ConfigError, TOKEN_LEN};

/// Default for [`HostConfig::max_frame`]: 16 MiB of body plus 4 KiB for the frame head.
///
/// The codec's default body budget is 16 MiB; the extra room lets a body that size travel.
/// The host buffers each worker's frames, up to this size, whole while they arrive
/// (SECURITY.md states the bound). Larger bodies need only [`HostConfig::max_frame`] raised.
pub const DEFAULT_MAX_FRAME: u32 = 16 * 1024 * 1024 + 4096;

/// The smallest `max_frame` accepted: 8 KiB, room for a `Fail` frame with the longest error
/// message ([`MAX_ERROR_MESSAGE`](crate::MAX_ERROR_MESSAGE)) and a handshake with a few dozen
/// method names.
pub const MIN_MAX_FRAME: u32 = 8192;

/// The cap on frames before the handshake completes: 128 KiB, enough for the largest valid
/// `Hello` (1024 names of 64 bytes). An unauthenticated peer cannot make the host buffer more.
pub const HANDSHAKE_MAX_FRAME: u32 = 128 * 1024;

/// The longest timeout any setting accepts: 365 days. Longer ones are refused rather than
/// risk overflowing a deadline computed from them.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The largest `max_in_flight` accepted: 65,536 calls per worker.
pub const MAX_IN_FLIGHT: u32 = 65_536;

/// Default for [`HostConfig::max_in_flight`]: 1024 calls per worker.
///
/// Enough to keep a pipe busy (pipelining), small enough that per-call bookkeeping stays a
/// few hundred KiB.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 1024;

/// Default for [`HostConfig::max_progress_per_call`]: 1024 updates per call.
///
/// A progress bar needs tens; a flood needs millions.
pub const DEFAULT_MAX_PROGRESS_PER_CALL: u32 = 1024;

/// Default for [`HostConfig::handshake_timeout`]: 10 seconds from session start to `Hello`.
///
/// A worker binary that has not said hello in that time is hung or hostile.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default send deadline, for every transport and the host: 5 seconds for one batch of frames
/// to be taken by the OS. A pipe or socket buffer drains in microseconds when the peer reads;
/// five seconds without progress means it stopped reading.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Default for [`HostConfig::cancel_grace`]: 1 second for a worker to finish a call whose
/// deadline passed (or that was cancelled), by answering it or acknowledging the `Cancel`.
///
/// A handler that honours cancellation (an async handler is dropped at once; a blocking one
/// checks its token) answers within microseconds; one second covers a loaded machine. A worker
/// that has not answered by then is still running the handler and cannot be pre-empted safely:
/// it is killed, and its other calls with it.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(1);

/// What the host enforces on one worker connection.
///
/// ```
/// use airlock_protocol::HostConfig;
/// let config = HostConfig::default().max_in_flight(64)?.max_frame(1 << 20)?;
/// assert_eq!(config.in_flight_limit(), 64);
/// # Ok::<(), airlock_protocol::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    max_frame: u32,
    max_in_flight: u32,
    max_progress_per_call: u32,
    handshake_timeout: Duration,
    cancel_grace: Duration,
    token: Option<[u8; TOKEN_LEN]>,
}

impl Default for HostConfig {
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_MAX_FRAME,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_progress_per_call: DEFAULT_MAX_PROGRESS_PER_CALL,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            token: None,
        }
    }
}

impl HostConfig {
    /// Largest frame either side may send, in bytes (the length prefix's value). Default
    /// [`DEFAULT_MAX_FRAME`], room for a 16 MiB body; at least [`MIN_MAX_FRAME`].
    ///
    /// **This is the one setting that bounds a body.** Raise it and larger bodies travel both
    /// ways with nothing else changed: the worker adopts it from the `Welcome` (its receive cap,
    /// and its request decode budgets unless the worker set its own with `Worker::limits`), and
    /// the host's response decode budgets follow it unless the host set its own with
    /// `HostBuilder::limits`. Give it the body plus 4 KiB for the frame's head, as the default
    /// does; for 64 MiB bodies:
    ///
    /// ```
    /// use airlock_protocol::HostConfig;
    /// let config = HostConfig::default().max_frame(64 * 1024 * 1024 + 4096)?;
    /// assert_eq!(config.frame_limit(), 67_112_960);
    /// # Ok::<(), airlock_protocol::ConfigError>(())
    /// ```
    ///
    /// Memory grows with it on both sides. The host buffers each worker's frames whole while
    /// they arrive, and copies a body once more when it encodes a request or decodes a
    /// response (SECURITY.md states the buffering bound per worker; `cargo xtask bench`
    /// measures the host's peak with four workers answering at the cap). A confined worker
    /// needs room for a few bodies of this size under its address-space limit
    /// (`Confinement::memory_limit`, 4 GiB by default).
    pub fn max_frame(mut self, bytes: u32) -> Result<Self, ConfigError> {
        if bytes < MIN_MAX_FRAME {
            return Err(ConfigError::MaxFrameTooSmall(bytes));
        }
        self.max_frame = bytes;
        Ok(self)
    }

    /// Most calls in flight on the worker, cancelled calls awaiting their terminal frame
    /// included. Default [`DEFAULT_MAX_IN_FLIGHT`]; 1 to [`MAX_IN_FLIGHT`]. Worst-case memory:
    /// about 100 bytes of bookkeeping per call, plus the bodies.
    pub fn max_in_flight(mut self, calls: u32) -> Result<Self, ConfigError> {
        if calls == 0 || calls > MAX_IN_FLIGHT {
            return Err(ConfigError::InFlightOutOfRange(calls));
        }
        self.max_in_flight = calls;
        Ok(self)
    }

    /// Most `Progress` frames accepted for one call; one more is a violation. Default
    /// [`DEFAULT_MAX_PROGRESS_PER_CALL`]; 0 forbids progress. Memory: none (a counter).
    pub fn max_progress_per_call(mut self, frames: u32) -> Self {
        self.max_progress_per_call = frames;
        self
    }

    /// Time from session start to a valid `Hello`. Default [`DEFAULT_HANDSHAKE_TIMEOUT`]; at
    /// most [`MAX_TIMEOUT`].
    pub fn handshake_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        check_timeout(timeout)?;
        self.handshake_timeout = timeout;
        Ok(self)
    }

    /// How long past a call's deadline (or its cancellation's) the worker has to finish it.
    ///
    /// When a call's deadline passes, its caller gets [`TimedOut`](crate::Outcome::TimedOut) at
    /// once and the worker is sent `Cancel`; the worker and its other calls are left alone if
    /// the call's terminal frame (usually `Fail` with kind `Cancelled`) arrives within this
    /// grace. If it does not, the handler is still running and the connection closes with
    /// [`CloseReason::CallTimeout`](crate::CloseReason::CallTimeout): the worker is killed and
    /// its other calls are lost. Zero kills at the deadline itself. Default
    /// [`DEFAULT_CANCEL_GRACE`]; at most [`MAX_TIMEOUT`]. Memory: none.
    pub fn cancel_grace(mut self, grace: Duration) -> Result<Self, ConfigError> {
        check_timeout(grace)?;
        self.cancel_grace = grace;
        Ok(self)
    }

    /// Requires the worker's `Hello` to carry exactly this token (socket transports).
    /// Default: none required.
    pub fn token(mut self, token: [u8; TOKEN_LEN]) -> Self {
        self.token = Some(token);
        self
    }

    /// The frame cap.
    pub fn frame_limit(&self) -> u32 {
        self.max_frame
    }

    /// The in-flight cap.
    pub fn in_flight_limit(&self) -> u32 {
        self.max_in_flight
    }

    /// The per-call progress quota.
    pub fn progress_limit(&self) -> u32 {
        self.max_progress_per_call
    }

    /// The handshake deadline's length.
    pub fn handshake_limit(&self) -> Duration {
        self.handshake_timeout
    }

    /// The grace a cancelled or overdue call has to finish.
    pub fn cancel_grace_limit(&self) -> Duration {
        self.cancel_grace
    }

    pub(crate) fn expected_token(&self) -> Option<&[u8; TOKEN_LEN]> {
        self.token.as_ref()
    }
}

/// Refuses a timeout over [`MAX_TIMEOUT`].
pub fn check_timeout(timeout: Duration) -> Result<Duration, ConfigError> {
    if timeout > MAX_TIMEOUT {
        return Err(ConfigError::TimeoutTooLong(timeout));
    }
    Ok(timeout)
}
