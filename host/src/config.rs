//! How a host spawns, bounds and supervises its worker.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use airlock_codec::Limits;
use airlock_protocol::HostConfig;

/// Default deadline of a call: 30 seconds.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Default grace period between `Shutdown` and SIGKILL: 2 seconds.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Default send deadline: a worker that does not read a batch within 5 seconds is dead (the
/// protocol's one default, shared with the transports).
pub use airlock_protocol::DEFAULT_SEND_TIMEOUT;

/// Which channel connects host and worker. Each variant exists when its cargo feature is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportChoice {
    /// The child's stdin and stdout (feature `pipe`, the default).
    #[cfg(feature = "pipe")]
    Pipe,
    /// A socket pair made by the host, the child's end inherited at fd 3 (feature `socket`).
    /// No name exists anywhere for another process to find.
    #[cfg(feature = "socket")]
    SocketInherited,
    /// A socket with a random name in a fresh private directory; the child connects and
    /// proves itself with its pid, its uid and a one-time token (feature `socket`). For
    /// workers that cannot inherit a descriptor.
    #[cfg(feature = "socket")]
    SocketNamed,
}

impl Default for TransportChoice {
    /// The pipe when compiled in, else the inherited socket.
    fn default() -> Self {
        #[cfg(feature = "pipe")]
        return TransportChoice::Pipe;
        #[cfg(all(not(feature = "pipe"), feature = "socket"))]
        return TransportChoice::SocketInherited;
    }
}

/// When and how fast a failed worker is replaced.
///
/// A worker lost for any reason is replaced after a backoff that doubles from `initial_backoff`
/// up to `max_backoff`; once more than `max_restarts` replacements happen within `window`,
/// the supervisor stops and every call fails fast with
/// [`LostReason::RestartBudgetExhausted`](crate::LostReason::RestartBudgetExhausted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Replacements allowed within `window`. 0 disables restarts.
    pub max_restarts: u32,
    /// The sliding window the budget is counted over.
    pub window: Duration,
    /// The first backoff.
    pub initial_backoff: Duration,
    /// The longest backoff.
    pub max_backoff: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        Self {
            max_restarts: 5,
            window: Duration::from_secs(60),
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// How the worker's stderr is relayed into `tracing`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StderrPolicy {
    /// Longest line relayed, in bytes; the rest of a longer line is dropped.
    pub max_line: usize,
    /// Most lines relayed per second; lines over the rate are dropped and counted.
    pub max_lines_per_second: u32,
}

impl Default for StderrPolicy {
    fn default() -> Self {
        Self {
            max_line: 4096,
            max_lines_per_second: 200,
        }
    }
}

/// Everything a host needs to (re)start its worker, shared by every restart.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) cwd: Option<PathBuf>,
    pub(crate) transport: TransportChoice,
    /// Response budgets set by the caller; `None` derives them from `max_frame`.
    pub(crate) limits: Option<Limits>,
    pub(crate) protocol: HostConfig,
    pub(crate) call_timeout: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) send_timeout: Duration,
    pub(crate) restart: RestartPolicy,
    pub(crate) stderr: StderrPolicy,
    pub(crate) label: String,
    pub(crate) confinement: crate::Confinement,
    /// The low-latency spin window asked for (`HostBuilder::low_latency`).
    pub(crate) low_latency: Option<Duration>,
    /// The worker's polling window under load, as chosen (`HostBuilder::poll_under_load`);
    /// `None`: not chosen, the default applies (see [`load_poll`](Self::load_poll)).
    pub(crate) poll_under_load: Option<Option<Duration>>,
}

impl Settings {
    /// The budgets responses are decoded under. By default the byte budgets match the frame
    /// cap, so any response an honest worker can send decodes; a caller's own, smaller budgets
    /// make a larger response a decode failure (which is fatal to the worker).
    pub(crate) fn response_limits(&self) -> Limits {
        self.limits.unwrap_or_else(|| {
            let frame = self.protocol.frame_limit() as usize;
            Limits::default().max_bytes(frame).max_len(frame)
        })
    }

    /// The worker's polling window under load: as chosen, else
    /// [`DEFAULT_LOAD_POLL`](airlock_protocol::spin::DEFAULT_LOAD_POLL).
    pub(crate) fn load_poll(&self) -> Option<Duration> {
        self.poll_under_load
            .unwrap_or(Some(airlock_protocol::spin::DEFAULT_LOAD_POLL))
    }

    /// Refuses durations that could overflow a deadline computed from them.
    pub(crate) fn validate(&self) -> Result<(), airlock_protocol::ConfigError> {
        let too_long =
            |window: Option<Duration>| window.filter(|w| *w > airlock_protocol::spin::MAX_SPIN);
        if let Some(window) = too_long(self.low_latency) {
            return Err(airlock_protocol::ConfigError::SpinTooLong(window));
        }
        if let Some(window) = too_long(self.load_poll()) {
            return Err(airlock_protocol::ConfigError::LoadPollTooLong(window));
        }
        let restart = &self.restart;
        for timeout in [
            self.call_timeout,
            self.shutdown_grace,
            self.send_timeout,
            restart.window,
            restart.initial_backoff,
            restart.max_backoff,
        ] {
            airlock_protocol::check_timeout(timeout)?;
        }
        Ok(())
    }

    pub(crate) fn new(program: PathBuf) -> Self {
        let label = program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "worker".into());
        Self {
            program,
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            transport: TransportChoice::default(),
            limits: None,
            protocol: HostConfig::default(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            send_timeout: DEFAULT_SEND_TIMEOUT,
            restart: RestartPolicy::default(),
            stderr: StderrPolicy::default(),
            label,
            confinement: crate::Confinement::strict(),
            low_latency: None,
            poll_under_load: None,
        }
    }
}
