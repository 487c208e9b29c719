//! The policy a caller asks for: which layers, which paths, which limits.

use std::path::PathBuf;
use std::time::Duration;

/// Default address-space limit (`RLIMIT_AS`): 4 GiB. Address space, not resident memory: a
/// tokio worker reserves far more than it touches (thread stacks, malloc arenas), so the limit
/// sits well above any honest worker's footprint and well below what would hurt the machine.
pub const DEFAULT_MEMORY_LIMIT: u64 = 4 << 30;

/// Default process and thread limit (`RLIMIT_NPROC`, counted in the worker's own user
/// namespace): 256. Threads count, and a worker's blocking pool may grow to a few dozen.
pub const DEFAULT_MAX_PROCESSES: u64 = 256;

/// Default open-descriptor limit (`RLIMIT_NOFILE`): 1024, the usual soft limit.
pub const DEFAULT_MAX_OPEN_FILES: u64 = 1024;

/// Default limit on signals queued to the worker and its POSIX timers (`RLIMIT_SIGPENDING`):
/// 64. The kernel counts them, through the worker's user namespace, against the user that
/// owns that namespace too: the worker's own uid for a root host, but the host's user for an
/// unprivileged host, and root for a root host in a container's namespace (SECURITY.md). That
/// user's processes are refused a real-time signal or a timer once its count reaches their
/// own limit; a worker bounded this way takes at most this many of them (standard signals it
/// sends itself pass the limit, and are counted all the same).
pub const DEFAULT_MAX_PENDING_SIGNALS: u64 = 64;

/// Default largest file the worker may write (`RLIMIT_FSIZE`): 1 GiB.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 1 << 30;

/// Default size of the worker's private `/tmp` (a tmpfs, counted against the machine's
/// memory): 64 MiB.
pub const DEFAULT_TMP_SIZE: u64 = 64 << 20;

/// How much confinement a worker gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfinementMode {
    /// Every layer; a kernel that lacks one makes the spawn fail with
    /// [`ConfinementError::Unsupported`](crate::ConfinementError::Unsupported).
    Strict,
    /// Every layer the kernel offers; what is missing is reported in
    /// [`ConfinementReport::missing`](crate::ConfinementReport::missing) and logged at WARN.
    BestEffort,
    /// No OS confinement: the worker reaches whatever its host's user can.
    None,
}

/// The OS confinement a host puts its workers under. [`Confinement::strict`] is the default.
///
/// ```
/// use airlock_host::Confinement;
/// use std::time::Duration;
///
/// let policy = Confinement::strict()
///     .read_only("/usr/share/dict")
///     .read_write("/var/tmp/job-42")
///     .memory_limit(512 << 20)
///     .cpu_time(Duration::from_secs(60))
///     .max_processes(32)
///     .max_open_files(64);
/// assert_eq!(policy.mode(), airlock_host::ConfinementMode::Strict);
/// ```
///
/// Under [`strict`](Self::strict) the worker sees a root of its own: the system's `/usr` (and
/// `/bin`, `/lib`, `/lib64`, `/sbin` where they are not links into it), `/etc/ld.so.cache`,
/// its own program, `/dev/{null,zero,full,random,urandom}`, its own `/proc` (its own
/// processes only), an empty private `/tmp`, and the paths this policy grants; nothing else,
/// and nothing of it writable but `/tmp` and [`read_write`](Self::read_write) paths. It has no
/// network interface, no capability, cannot gain privileges, cannot see, signal or trace any
/// process outside its own namespace, and dies with its host.
///
/// When the host runs as root its workers run under a uid of the host's own, as seen from
/// outside their namespace (one of [`WORKER_UIDS`](crate::WORKER_UIDS), given to each
/// [`Host`](crate::Host) in turn and kept across its restarts, so each worker of a
/// [`Pool`](crate::Pool) has its own; `nobody` inside), and group `nogroup` (65534), so the
/// paths it is granted must be readable (and for [`read_write`](Self::read_write), writable)
/// by that group or by everyone. A uid of its own keeps the kernel's per-user budgets (epoll
/// watches, pipe pages) apart: one worker using up its own leaves its siblings' and every
/// other user's alone. An unprivileged host's workers run as the host's own uid and gid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confinement {
    pub(crate) mode: ConfinementMode,
    pub(crate) read_only: Vec<PathBuf>,
    pub(crate) read_write: Vec<PathBuf>,
    pub(crate) memory_limit: Option<u64>,
    pub(crate) cpu_time: Option<Duration>,
    pub(crate) max_processes: Option<u64>,
    pub(crate) max_open_files: Option<u64>,
    pub(crate) max_file_size: Option<u64>,
    pub(crate) max_pending_signals: Option<u64>,
    pub(crate) tmp_size: u64,
    pub(crate) require_worker_filter: bool,
    /// The program and the granted paths as resolved at the first spawn; every later spawn
    /// (a replacement) must find the very same files there (see [`Pinned`]).
    pub(crate) pins: Option<Pins>,
}

/// A path resolved once, with the identity of what it named.
///
/// Grants are resolved when the host first spawns and never again: a worker may change what
/// a path under one of its read-write grants names (a symlink to a host file, say), and a
/// replacement resolving it afresh would be handed that file. Each spawn checks the inode it
/// finds against the pinned one and refuses a mismatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pinned {
    pub(crate) path: PathBuf,
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) is_dir: bool,
}

/// Everything a policy pins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pins {
    pub(crate) program: Pinned,
    pub(crate) read_only: Vec<Pinned>,
    pub(crate) read_write: Vec<Pinned>,
    /// The uid the host's workers run as, seen from outside: a root host's own for this host
    /// (kept across restarts, so a replacement owns what the worker before it wrote), an
    /// unprivileged host's own uid.
    pub(crate) worker_uid: u32,
}

impl Pinned {
    /// Resolves `path` (it must exist) and records what it names.
    pub(crate) fn resolve(path: &std::path::Path) -> Result<Self, super::ConfinementError> {
        use std::os::unix::fs::MetadataExt;
        let err = |source| super::ConfinementError::Path {
            path: path.to_path_buf(),
            source,
        };
        let canonical = std::fs::canonicalize(path).map_err(err)?;
        let meta = std::fs::metadata(&canonical).map_err(err)?;
        Ok(Self {
            path: canonical,
            dev: meta.dev(),
            ino: meta.ino(),
            is_dir: meta.is_dir(),
        })
    }
}

impl Default for Confinement {
    /// [`Confinement::strict`].
    fn default() -> Self {
        Self::strict()
    }
}

impl Confinement {
    /// Every layer, with the default limits: [`DEFAULT_MEMORY_LIMIT`],
    /// [`DEFAULT_MAX_PROCESSES`], [`DEFAULT_MAX_OPEN_FILES`], [`DEFAULT_MAX_FILE_SIZE`],
    /// [`DEFAULT_MAX_PENDING_SIGNALS`], no CPU-time limit (a long-lived worker accumulates CPU
    /// time; each call has its deadline), no core dumps and no POSIX message queue
    /// (`RLIMIT_MSGQUEUE` 0: a queue's bytes count against the user that owns the worker's
    /// namespace too). Spawning fails if the kernel lacks a layer.
    pub fn strict() -> Self {
        Self {
            mode: ConfinementMode::Strict,
            read_only: Vec::new(),
            read_write: Vec::new(),
            memory_limit: Some(DEFAULT_MEMORY_LIMIT),
            cpu_time: None,
            max_processes: Some(DEFAULT_MAX_PROCESSES),
            max_open_files: Some(DEFAULT_MAX_OPEN_FILES),
            max_file_size: Some(DEFAULT_MAX_FILE_SIZE),
            max_pending_signals: Some(DEFAULT_MAX_PENDING_SIGNALS),
            tmp_size: DEFAULT_TMP_SIZE,
            require_worker_filter: false,
            pins: None,
        }
    }

    /// No OS confinement at all. The worker can read its host's files, connect to the network,
    /// signal and trace its host and its siblings. The host logs this at WARN once per host.
    /// Channel checks still hold: a reply reaches only the call it matches.
    pub fn none() -> Self {
        Self {
            mode: ConfinementMode::None,
            memory_limit: None,
            max_processes: None,
            max_open_files: None,
            max_file_size: None,
            max_pending_signals: None,
            ..Self::strict()
        }
    }

    /// Starts the worker with every layer the kernel offers instead of refusing; what is
    /// missing is listed in [`ConfinementReport::missing`](crate::ConfinementReport::missing)
    /// and logged at WARN. Has no effect on [`none`](Self::none).
    #[must_use]
    pub fn best_effort(mut self) -> Self {
        if self.mode == ConfinementMode::Strict {
            self.mode = ConfinementMode::BestEffort;
        }
        self
    }

    /// Makes `path` (a file or a directory tree) visible to the worker at the same path,
    /// read-only (and executable). The path must exist when the worker is spawned.
    #[must_use]
    pub fn read_only(mut self, path: impl Into<PathBuf>) -> Self {
        self.read_only.push(path.into());
        self
    }

    /// Makes `path` (a file or a directory tree) visible to the worker at the same path,
    /// readable and writable. The path must exist when the worker is spawned.
    #[must_use]
    pub fn read_write(mut self, path: impl Into<PathBuf>) -> Self {
        self.read_write.push(path.into());
        self
    }

    /// The worker's address-space limit in bytes (`RLIMIT_AS`); an allocation past it fails,
    /// which kills a Rust worker. Default [`DEFAULT_MEMORY_LIMIT`]; must not be 0.
    #[must_use]
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// The worker's CPU-time limit over its whole life (`RLIMIT_CPU`, whole seconds, rounded
    /// up); past it the kernel kills it. Default: none. Must not be zero.
    #[must_use]
    pub fn cpu_time(mut self, limit: Duration) -> Self {
        self.cpu_time = Some(limit);
        self
    }

    /// How many processes and threads the worker may have at once, the namespace's init
    /// included: `RLIMIT_NPROC`, counted in the worker's own user namespace, and the `pids`
    /// limit of its cgroup where it has one. The worker's runtime and handler threads count,
    /// so a limit near the minimum starts a worker that may not be able to answer a call.
    /// Without namespaces ([`best_effort`](Self::best_effort) on a kernel without them) the
    /// rlimit counts every process of the worker's uid: a root host's workers have one for
    /// each host, an unprivileged host's share the host's own (SECURITY.md). Default
    /// [`DEFAULT_MAX_PROCESSES`]; must be at least 2, else the spawn
    /// fails with [`ConfinementError::InvalidLimit`](crate::ConfinementError).
    #[must_use]
    pub fn max_processes(mut self, processes: u64) -> Self {
        self.max_processes = Some(processes);
        self
    }

    /// How many descriptors the worker may hold open (`RLIMIT_NOFILE`). Default
    /// [`DEFAULT_MAX_OPEN_FILES`]; must be at least 16 (a runtime needs a few).
    #[must_use]
    pub fn max_open_files(mut self, files: u64) -> Self {
        self.max_open_files = Some(files);
        self
    }

    /// The largest file the worker may write, in bytes (`RLIMIT_FSIZE`). Default
    /// [`DEFAULT_MAX_FILE_SIZE`].
    #[must_use]
    pub fn max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = Some(bytes);
        self
    }

    /// How many signals may be queued to the worker's processes at once, and how many POSIX
    /// timers they may hold (`RLIMIT_SIGPENDING`, counted per user in the worker's user
    /// namespace). Signals sent by the kernel and the standard ones from `kill` are delivered
    /// past it; a real-time signal or a timer over it is refused (`EAGAIN`). Default
    /// [`DEFAULT_MAX_PENDING_SIGNALS`]; must be at least 1.
    #[must_use]
    pub fn max_pending_signals(mut self, signals: u64) -> Self {
        self.max_pending_signals = Some(signals);
        self
    }

    /// The size of the worker's private `/tmp` in bytes. Default [`DEFAULT_TMP_SIZE`].
    #[must_use]
    pub fn tmp_size(mut self, bytes: u64) -> Self {
        self.tmp_size = bytes;
        self
    }

    /// Refuses a worker that does not install its own seccomp allowlist before its `Hello`
    /// (every worker built on `airlock-worker` does; one written in another language does not).
    /// Off by default, so that any program from PROTOCOL.md runs confined by the host's layers.
    #[must_use]
    pub fn require_worker_filter(mut self) -> Self {
        self.require_worker_filter = true;
        self
    }

    /// Which mode this policy is in.
    pub fn mode(&self) -> ConfinementMode {
        self.mode
    }

    /// Resolves the program (found as `resolve_program` finds it) and every granted path once,
    /// and picks the uid its workers run as, for this and every later spawn of the host.
    pub(crate) fn pin(
        &mut self,
        program: std::path::PathBuf,
    ) -> Result<(), super::ConfinementError> {
        let pin_all = |paths: &[PathBuf]| -> Result<Vec<Pinned>, super::ConfinementError> {
            paths.iter().map(|p| Pinned::resolve(p)).collect()
        };
        self.pins = Some(Pins {
            program: Pinned::resolve(&program)?,
            read_only: pin_all(&self.read_only)?,
            read_write: pin_all(&self.read_write)?,
            worker_uid: super::namespaces::uid_for_a_new_hosts_workers(),
        });
        Ok(())
    }

    /// True unless this is [`none`](Self::none).
    pub(crate) fn is_confined(&self) -> bool {
        self.mode != ConfinementMode::None
    }
}
