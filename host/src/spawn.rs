//! Starting one worker process, as one pipeline: the command (program, arguments,
//! environment, working directory) → its confinement (prepared here, applied in the child)
//! → the fork and `exec` (from the spawner thread) → the channel (pipe or socket) → the
//! check, from outside, that the worker runs under what was asked. The handshake follows in
//! the supervisor.
//!
//! An unconfined worker skips the fork: it is cloned sharing the host's memory and `exec`ed
//! at once (`sys::spawn_vforked`, what `posix_spawn` does), so its cost does not grow with
//! the host's memory. A confined one needs a real fork: its set-up runs in the child.

use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_protocol::TOKEN_LEN;
use airlock_transport_pipe::StreamConfig;
#[cfg(feature = "pipe")]
use airlock_transport_pipe::{PipeWriter, StreamTransport};
use bytes::Bytes;
use tokio::net::unix::pipe;
use tokio::process::Command;

use crate::child::{ClonedChild, WorkerChild, WorkerStdio};
use crate::sys::{c_string, env_entry};

use crate::config::{Settings, TransportChoice};
use crate::confinement::{
    ConfinementError, ConfinementMode, ConfinementReport, ConfinementStep, Prepared, Reports,
};
use crate::SpawnError;

/// How long a worker whose confinement could not be read back is given to turn out to have
/// exited already (then its exit, not the check, is the story).
const EXITED_AT_ONCE: std::time::Duration = std::time::Duration::from_millis(200);

/// A started worker process, before its handshake.
pub(crate) struct Spawned {
    /// The host's child: the worker itself, or (in namespaces) its keeper.
    pub(crate) child: WorkerChild,
    /// The worker's pid as this host sees it.
    pub(crate) pid: u32,
    /// A pidfd for the worker when it is not the host's own child.
    pub(crate) pidfd: Option<OwnedFd>,
    pub(crate) sender: Box<dyn FrameSender>,
    pub(crate) receiver: Box<dyn FrameReceiver>,
    /// The host's end of the worker's stderr pipe, for its relay (`stderr::StderrRelay`).
    pub(crate) stderr: Option<OwnedFd>,
    /// A first frame already read while authenticating the peer (named sockets).
    pub(crate) hello: Option<Bytes>,
    /// The token the session must find in that `Hello` (named sockets).
    pub(crate) token: Option<[u8; TOKEN_LEN]>,
    /// What the worker was verified to run under.
    pub(crate) confinement: ConfinementReport,
    /// Its cgroup, if it has one of its own.
    pub(crate) cgroup: Option<crate::confinement::WorkerCgroup>,
}

impl Spawned {
    /// Kills the worker and reaps the host's child: without namespaces the worker is that
    /// child and leads its process group, which is killed; with them the child is its keeper,
    /// whose death takes the worker's PID namespace.
    pub(crate) async fn kill(mut self) {
        if self.pidfd.is_none() {
            crate::launch::kill_group(self.pid);
        }
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// The stream settings for a new worker's channel. Frames are capped at the handshake's
/// limit until the worker has completed its handshake (the supervisor raises it then), so an
/// unauthenticated peer cannot make the host buffer a `max_frame`-sized frame.
pub(crate) fn stream_config(settings: &Settings) -> StreamConfig {
    StreamConfig {
        max_frame: settings
            .protocol
            .frame_limit()
            .min(airlock_protocol::HANDSHAKE_MAX_FRAME),
        send_timeout: settings.send_timeout,
    }
}

/// The channel, made able to [`read_now`](FrameReceiver::read_now): a caller that has just
/// written its frame looks for the answer so (`connection::inlet`), and a reader in the
/// low-latency mode on a multi-thread runtime polls so while it spins
/// (`connection::reader_spin`). That takes a duplicate of the channel's descriptor; where it
/// cannot be made (no descriptor left), callers never look and the reader spins by yielding,
/// as on a current-thread runtime.
fn reading_directly<R: std::os::fd::AsFd, W>(
    transport: airlock_transport_pipe::StreamTransport<R, W>,
) -> airlock_transport_pipe::StreamTransport<R, W> {
    transport.with_direct_reads()
}

/// Step 1, the command of a confined worker: its own process group, a cleared environment
/// holding only what the caller added and what the confinement needs, stderr captured. The
/// confinement itself enters the working directory.
fn base_command(settings: &Settings, prepared: &Prepared) -> Command {
    let mut command = Command::new(&prepared.program);
    command
        .args(&settings.args)
        .env_clear()
        .envs(settings.env.iter().map(|(k, v)| (k, v)))
        .envs(prepared.env.iter().map(|(k, v)| (k, v)))
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    command
}

/// The directories `execvp` searches when `PATH` is not set (glibc's `_CS_PATH`).
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

/// Step 1 for an unconfined worker: its command as an [`ExecImage`](crate::sys::ExecImage)
/// for the clone, with what `std::process::Command` would have done done here: the program
/// looked up in the worker's own `PATH` (or the default) when its name has no `/`, the
/// environment cleared then given the caller's variables and the channel's (a later value
/// of a name replacing an earlier one), the working directory, and the stdio `wiring` asks
/// for, stderr piped. Returns the host's ends of the pipes beside it.
fn exec_image(
    settings: &Settings,
    wiring: Wiring,
) -> Result<(crate::sys::ExecImage, WorkerStdio), std::io::Error> {
    let mut env = std::collections::BTreeMap::<OsString, OsString>::new();
    for (key, value) in settings.env.iter().chain(&wiring.env) {
        env.insert(key.clone(), value.clone());
    }
    let program = settings.program.as_os_str();
    let programs = if program.as_bytes().contains(&b'/') || program.is_empty() {
        vec![c_string(program)?]
    } else {
        let path = env.get(OsStr::new("PATH")).map(|p| p.as_bytes());
        path.unwrap_or(DEFAULT_PATH)
            .split(|b| *b == b':')
            .map(|dir| match dir {
                b"" => c_string(program),
                dir => c_string(std::path::Path::new(OsStr::from_bytes(dir)).join(program)),
            })
            .collect::<Result<_, _>>()?
    };
    let argv = std::iter::once(program)
        .chain(settings.args.iter().map(OsString::as_os_str))
        .map(c_string)
        .collect::<Result<_, _>>()?;
    let envp = env
        .iter()
        .map(|(key, value)| env_entry(key, value))
        .collect::<Result<_, _>>()?;
    let cwd = settings.cwd.as_deref().map(c_string).transpose()?;
    let mut host = WorkerStdio::default();
    let (stdin, stdout) = if wiring.piped {
        let (child_reads, host_writes) = cloexec_pipe()?;
        let (host_reads, child_writes) = cloexec_pipe()?;
        host.stdin = Some(host_writes);
        host.stdout = Some(pipe::Receiver::from_owned_fd(host_reads)?);
        (child_reads, child_writes)
    } else {
        (dev_null()?, dev_null()?)
    };
    let (host_end, stderr) = cloexec_pipe()?;
    host.stderr = Some(host_end);
    let image = crate::sys::ExecImage {
        programs,
        argv,
        envp,
        cwd,
        stdio: [
            above_stdio(stdin)?,
            above_stdio(stdout)?,
            above_stdio(stderr)?,
        ],
        channel: wiring.channel_fd.map(above_stdio).transpose()?,
    };
    Ok((image, host))
}

/// A pipe whose two ends close on exec: (read end, write end).
fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), std::io::Error> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

fn dev_null() -> Result<OwnedFd, std::io::Error> {
    Ok(rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)
}

/// `fd`, renumbered to 3 or above if it is one of 0-2 (a host that closed its own stdio gets
/// those numbers for new descriptors): the child places its stdio over 0-2 one at a time,
/// and a source there would be overwritten before it is placed.
fn above_stdio(fd: OwnedFd) -> Result<OwnedFd, std::io::Error> {
    if std::os::fd::AsRawFd::as_raw_fd(&fd) >= 3 {
        return Ok(fd);
    }
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, 3)?)
}

/// The worker's channel, chosen before the fork.
enum Channel {
    #[cfg(feature = "pipe")]
    Pipe,
    #[cfg(feature = "socket")]
    Inherited {
        transport: airlock_transport_socket::SocketTransport,
        child_end: OwnedFd,
    },
    #[cfg(feature = "socket")]
    Named(airlock_transport_socket::NamedListener),
}

impl Channel {
    fn open(settings: &Settings) -> Result<Self, SpawnError> {
        match settings.transport {
            #[cfg(feature = "pipe")]
            TransportChoice::Pipe => Ok(Channel::Pipe),
            #[cfg(feature = "socket")]
            TransportChoice::SocketInherited => {
                let (transport, child_end) =
                    airlock_transport_socket::inherited_pair(stream_config(settings))
                        .map_err(SpawnError::Transport)?;
                Ok(Channel::Inherited {
                    transport,
                    child_end,
                })
            }
            #[cfg(feature = "socket")]
            TransportChoice::SocketNamed => {
                use airlock_transport_socket::{NamedConfig, NamedListener};
                let config = NamedConfig::default().stream(stream_config(settings));
                Ok(Channel::Named(
                    NamedListener::bind(config).map_err(SpawnError::Transport)?,
                ))
            }
        }
    }

    /// Files the worker must reach inside its root for this channel.
    fn files(&self) -> Vec<std::path::PathBuf> {
        match self {
            #[cfg(feature = "socket")]
            Channel::Named(listener) => vec![listener.name().to_path_buf()],
            #[allow(unreachable_patterns)]
            _ => Vec::new(),
        }
    }

    /// Lets a worker running as `uid` connect (a named socket is `0600`, its directory `0700`:
    /// a worker under another uid reaches the socket only through its own root, and needs it
    /// to be its own to connect).
    #[allow(unused_variables)]
    fn admit(&self, uid: u32) -> Result<(), SpawnError> {
        match self {
            #[cfg(feature = "socket")]
            Channel::Named(listener) if uid != rustix::process::geteuid().as_raw() => {
                rustix::fs::chown(listener.name(), Some(rustix::fs::Uid::from_raw(uid)), None)
                    .map_err(|e| SpawnError::Transport(e.into()))
            }
            _ => Ok(()),
        }
    }

    /// What the channel needs of the worker's start: its stdin and stdout piped or
    /// `/dev/null`, its environment variables, and the descriptor to move to fd 3, if any: a
    /// copy of the child's end that the start owns. The fork may run on the spawner thread
    /// after this spawn has been given up (its future dropped, its runtime shut down); a bare
    /// number would by then name whatever descriptor took it, such as another host's
    /// channel, and hand that to this worker.
    fn wiring(&self) -> Result<Wiring, SpawnError> {
        match self {
            #[cfg(feature = "pipe")]
            Channel::Pipe => Ok(Wiring {
                piped: true,
                env: Vec::new(),
                channel_fd: None,
            }),
            #[cfg(feature = "socket")]
            Channel::Inherited { child_end, .. } => {
                use airlock_transport_socket::{AIRLOCK_SOCKET_FD, CHILD_SOCKET_FD};
                Ok(Wiring {
                    piped: false,
                    env: vec![(AIRLOCK_SOCKET_FD.into(), CHILD_SOCKET_FD.to_string().into())],
                    channel_fd: Some(child_end.try_clone().map_err(SpawnError::Transport)?),
                })
            }
            #[cfg(feature = "socket")]
            Channel::Named(listener) => Ok(Wiring {
                piped: false,
                env: listener
                    .env()
                    .into_iter()
                    .map(|(key, value)| (key.into(), value))
                    .collect(),
                channel_fd: None,
            }),
        }
    }
}

/// How a channel is wired into the worker (see [`Channel::wiring`]).
struct Wiring {
    /// Stdin and stdout are the channel's pipes; else `/dev/null`.
    piped: bool,
    env: Vec<(OsString, OsString)>,
    channel_fd: Option<OwnedFd>,
}

impl Wiring {
    /// Wires `command`; returns the descriptor to move to fd 3.
    fn into_command(self, command: &mut Command) -> Option<OwnedFd> {
        if self.piped {
            command.stdin(Stdio::piped()).stdout(Stdio::piped());
        } else {
            command.stdin(Stdio::null()).stdout(Stdio::null());
        }
        command.envs(self.env);
        self.channel_fd
    }
}

/// Spawns the worker with the configured transport and confinement. Besides the command's
/// setup, every descriptor but stdio and the channel is closed on exec and the worker dies
/// with its host (see `sys::prepare_child`).
pub(crate) async fn spawn(settings: &Settings) -> Result<Spawned, SpawnError> {
    if crate::sys::children_reaped_by_kernel() {
        return Err(SpawnError::ChildrenReapedByKernel);
    }
    if !settings.confinement.is_confined() {
        return spawn_unconfined(settings).await;
    }
    match spawn_once(settings, true).await {
        Err(SpawnError::Confinement(ConfinementError::Step { step, source }))
            if settings.confinement.mode() == ConfinementMode::BestEffort
                && namespace_step(step, &source) =>
        {
            tracing::warn!(
                target: "airlock::confinement",
                worker = %settings.label,
                "namespaces unavailable ({step:?}: {source}); starting without them"
            );
            spawn_once(settings, false).await
        }
        Err(SpawnError::Confinement(ConfinementError::Step { step, source }))
            if namespace_step(step, &source) =>
        {
            Err(SpawnError::Confinement(ConfinementError::Unsupported {
                feature: crate::Feature::Namespaces,
                detail: format!("creating them failed: {source}"),
            }))
        }
        other => other,
    }
}

/// A failure that means the kernel does not let this host create namespaces: only these make
/// `best_effort` start without them. A failure to copy a path or build the root is about the
/// paths (which something else may control), and a transient one (EAGAIN, ENOMEM: a sibling
/// near the process limit could cause it) is not the kernel refusing; both stay errors.
fn namespace_step(step: ConfinementStep, source: &std::io::Error) -> bool {
    step == ConfinementStep::CreateNamespaces
        && matches!(
            source.raw_os_error(),
            Some(libc::EPERM | libc::EINVAL | libc::ENOSYS | libc::ENOSPC | libc::EUSERS)
        )
}

/// An unconfined worker: cloned and `exec`ed from a spawner thread (see the module docs).
async fn spawn_unconfined(settings: &Settings) -> Result<Spawned, SpawnError> {
    let channel = Channel::open(settings)?;
    let exec_error = |source| SpawnError::Exec {
        program: settings.program.clone(),
        source,
    };
    let (image, mut stdio) = exec_image(settings, channel.wiring()?).map_err(exec_error)?;
    // The image (with this host's copies of the child's stdio and channel ends) is dropped on
    // the spawner thread as soon as the child runs, so the host sees the worker's exit as
    // the end of its streams.
    let started = crate::spawner::run(move || {
        let (pid, pidfd) = crate::sys::spawn_vforked(&image)?;
        drop(image);
        ClonedChild::new(pid, pidfd)
    })
    .await
    .map_err(SpawnError::Spawner)?;
    let mut child = WorkerChild::Cloned(started.map_err(exec_error)?);
    let pid = child.id().unwrap_or(0);
    let report = ConfinementReport::unconfined(pid, rustix::process::geteuid().as_raw());
    let connected = match connect(settings, channel, &mut stdio, pid, report.uid).await {
        Ok(connected) => connected,
        Err(err) => {
            crate::launch::kill_group(pid);
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(err);
        }
    };
    Ok(Spawned {
        child,
        pid,
        pidfd: None,
        sender: connected.sender,
        receiver: connected.receiver,
        stderr: stdio.stderr,
        hello: connected.hello,
        token: connected.token,
        confinement: report,
        cgroup: None,
    })
}

/// One attempt at a confined worker; `namespaces`: whether to create them.
async fn spawn_once(settings: &Settings, namespaces: bool) -> Result<Spawned, SpawnError> {
    let channel = Channel::open(settings)?;
    let inputs = crate::confinement::SpawnInputs {
        program: &settings.program,
        env: &settings.env,
        cwd: settings.cwd.as_deref(),
        transport_files: &channel.files(),
    };
    let (mut plan, mut prepared) =
        crate::confinement::prepare(&settings.confinement, &inputs, namespaces)?;
    channel.admit(prepared.expected.uid)?;
    let mut command = base_command(settings, &prepared);
    let channel_fd = channel.wiring()?.into_command(&mut command);
    if plan.namespaced {
        let channel_number = channel_fd.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        plan.worker = Some(
            crate::sys::WorkerExec::of(command.as_std(), channel_number).map_err(|source| {
                SpawnError::Exec {
                    program: settings.program.clone(),
                    source,
                }
            })?,
        );
    }
    let set_up: crate::sys::SetUp = Box::new(move || plan.run());
    crate::sys::prepare_child(&mut command, Some(set_up), channel_fd);
    // Counted on the thread that forks: the worker inherits its filters (a container's). Again
    // after the fork, the larger count kept: a filter the host's own code adds to every thread
    // meanwhile (`TSYNC`) is never taken for the worker's.
    let (inherited, spawned) = crate::spawner::run(move || {
        crate::confinement::filters_of_this_thread().map(|before| {
            let spawned = command.spawn();
            let after = crate::confinement::filters_of_this_thread().unwrap_or(before);
            (before.max(after), spawned)
        })
    })
    .await
    .map_err(SpawnError::Spawner)??;
    prepared.expected.count_inherited(inherited);
    let mut forked = match spawned {
        Ok(child) => child,
        Err(err) => return Err(explain_failure(settings, &prepared, err)),
    };
    let stdio = WorkerStdio::take_from(&mut forked);
    let mut child = WorkerChild::Forked(forked);
    let mut stdio = match stdio {
        Ok(stdio) => stdio,
        Err(err) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(SpawnError::Transport(err));
        }
    };
    // Every record is in the pipe by now: the keeper and init write theirs before the spawn
    // can return (init before it starts the worker, or as it exits on a failure).
    let reports = prepared.read_reports();
    // A step's failure ranks first, as in `explain_failure`.
    if let (None, Some(errno)) = (reports.failure, reports.exec_failure) {
        // Init could not `exec` the worker's program, and exited: the keeper ends with it.
        let _ = child.start_kill();
        let _ = child.wait().await;
        return Err(SpawnError::Exec {
            program: settings.program.clone(),
            source: std::io::Error::from_raw_os_error(errno),
        });
    }
    let (pid, pidfd, report) = match verified(&child, &prepared, &reports) {
        Ok(found) => found,
        Err(err @ ConfinementError::Step { .. }) => {
            // The keeper ended init before it started the worker, and said why.
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(SpawnError::Confinement(err));
        }
        Err(err) => {
            // A worker that exited at once cannot be read back, and leaves nothing running
            // for long (its PID namespace died with it; without one, its process group is
            // killed if the handshake fails and its cgroup once it is reaped): let the
            // supervisor report its exit and its stderr instead of a failed check.
            let exited = tokio::time::timeout(EXITED_AT_ONCE, child.wait())
                .await
                .is_ok();
            if exited {
                let pid = child.id().unwrap_or(0);
                (pid, None, prepared.expected.clone())
            } else {
                // Without namespaces the child is the worker and leads its own process
                // group, which is killed while the unreaped child still holds its id (with
                // namespaces the keeper's death takes the PID namespace).
                if !prepared.expected.namespaces {
                    if let Some(pid) = child.id() {
                        crate::launch::kill_group(pid);
                    }
                }
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Err(SpawnError::Confinement(err));
            }
        }
    };
    let connected = match connect(settings, channel, &mut stdio, pid, report.uid).await {
        Ok(connected) => connected,
        Err(err) => {
            crate::launch::kill_worker(pid, pidfd.as_ref());
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(err);
        }
    };
    let mut prepared = prepared;
    Ok(Spawned {
        child,
        pid,
        pidfd,
        sender: connected.sender,
        receiver: connected.receiver,
        stderr: stdio.stderr,
        hello: connected.hello,
        token: connected.token,
        confinement: report,
        cgroup: prepared.cgroup.take(),
    })
}

/// Why a confined spawn failed: the step the child reported, or the exec error.
fn explain_failure(settings: &Settings, prepared: &Prepared, source: std::io::Error) -> SpawnError {
    let reports = prepared.read_reports();
    match reports.failure {
        Some((step, errno)) => SpawnError::Confinement(ConfinementError::Step {
            step,
            source: std::io::Error::from_raw_os_error(errno),
        }),
        None => SpawnError::Exec {
            program: settings.program.clone(),
            source: reports
                .exec_failure
                .map_or(source, std::io::Error::from_raw_os_error),
        },
    }
}

/// Step 5 (before the channel is used): the worker's pid, a pidfd for it, and what it runs
/// under, read from outside.
fn verified(
    child: &WorkerChild,
    prepared: &Prepared,
    reports: &Reports,
) -> Result<(u32, Option<OwnedFd>, ConfinementReport), ConfinementError> {
    let keeper = child.id().ok_or(ConfinementError::Verification {
        check: "pid",
        expected: "a running child".into(),
        found: "reaped".into(),
    })?;
    if !prepared.expected.namespaces {
        // Without namespaces the host's child is the worker itself.
        let report = crate::confinement::verify_spawned(keeper, None, &prepared.expected)?;
        in_its_cgroup(prepared, keeper)?;
        return Ok((keeper, None, report));
    }
    if let Some((step, errno)) = reports.failure {
        return Err(ConfinementError::Step {
            step,
            source: std::io::Error::from_raw_os_error(errno),
        });
    }
    let init = reports
        .worker_pid
        .and_then(|p| u32::try_from(p).ok())
        .ok_or(ConfinementError::Verification {
            check: "init pid",
            expected: "reported by the keeper".into(),
            found: "nothing".into(),
        })?;
    // Pidfds first, then the checks that each process is the child it should be: a pid freed
    // by an exit could have been taken by anything since. The worker's pidfd is how the host
    // kills it; init then reports its status and exits, which takes the whole PID namespace.
    let _init_fd = pidfd_of(init)?;
    if ppid_of(init) != Some(keeper) {
        return Err(ConfinementError::Verification {
            check: "PPid of init",
            expected: keeper.to_string(),
            found: format!("{:?}", ppid_of(init)),
        });
    }
    let pid = worker_of(init).ok_or(ConfinementError::Verification {
        check: "/proc/<init>/task/<init>/children",
        expected: "the worker".into(),
        found: "no child".into(),
    })?;
    let worker_fd = pidfd_of(pid)?;
    let report = crate::confinement::verify_spawned(pid, Some(init), &prepared.expected)?;
    in_its_cgroup(prepared, pid)?;
    Ok((pid, Some(worker_fd), report))
}

/// Refuses a worker that is not in every hierarchy of the cgroup made for it, where one was:
/// its report says it runs under the cgroup's limits.
fn in_its_cgroup(prepared: &Prepared, pid: u32) -> Result<(), ConfinementError> {
    match &prepared.cgroup {
        Some(cgroup) if !cgroup.holds(pid) => Err(ConfinementError::Verification {
            check: "/proc/<pid>/cgroup",
            expected: "the worker's own cgroup".into(),
            found: std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default(),
        }),
        _ => Ok(()),
    }
}

fn pidfd_of(pid: u32) -> Result<OwnedFd, ConfinementError> {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
        .ok_or(ConfinementError::Verification {
            check: "pidfd",
            expected: "the process alive".into(),
            found: "gone".into(),
        })
}

fn ppid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The worker: init's one child (init forks nothing else), as this host numbers it.
fn worker_of(init: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A connected channel.
struct Connected {
    sender: Box<dyn FrameSender>,
    receiver: Box<dyn FrameReceiver>,
    hello: Option<Bytes>,
    token: Option<[u8; TOKEN_LEN]>,
}

impl Connected {
    fn new<T: Transport>(transport: T) -> Self {
        let (sender, receiver) = transport.split();
        Self {
            sender: Box::new(sender),
            receiver: Box::new(receiver),
            hello: None,
            token: None,
        }
    }
}

/// Largest pipe buffer a worker's pipes are given: 1 MiB (Linux's default `pipe-max-size`).
/// A large body then crosses in 16× fewer turns than through the default 64 KiB. Two such pipes
/// per worker stay well inside an unprivileged user's default pipe allowance
/// (`pipe-user-pages-soft`, 64 MiB) for pools of up to about thirty workers.
#[cfg(feature = "pipe")]
const PIPE_BUFFER: usize = 1024 * 1024;

/// [`PIPE_BUFFER`], or the kernel's `pipe-max-size` if that is lower.
#[cfg(feature = "pipe")]
fn pipe_buffer_size() -> usize {
    std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .map_or(PIPE_BUFFER, |most| PIPE_BUFFER.min(most))
}

/// Raises a worker pipe's buffer to `size`. Best effort: a kernel or a user over its allowance
/// that refuses keeps the pipe as it was, which only costs speed.
#[cfg(feature = "pipe")]
fn enlarge_pipe(pipe: &impl std::os::fd::AsFd, size: usize) {
    let _ = rustix::pipe::fcntl_setpipe_size(pipe, size);
}

/// Step 4: the channel, connected to the worker `pid` running as `uid`.
#[allow(unused_variables)]
async fn connect(
    settings: &Settings,
    channel: Channel,
    stdio: &mut WorkerStdio,
    pid: u32,
    uid: u32,
) -> Result<Connected, SpawnError> {
    match channel {
        #[cfg(feature = "pipe")]
        Channel::Pipe => {
            let (Some(stdin), Some(stdout)) = (stdio.stdin.take(), stdio.stdout.take()) else {
                return Err(SpawnError::Transport(std::io::Error::other(
                    "child stdio missing",
                )));
            };
            let size = pipe_buffer_size();
            enlarge_pipe(&stdin, size);
            enlarge_pipe(&stdout, size);
            let stdin = PipeWriter::new(stdin).map_err(SpawnError::Transport)?;
            let transport = StreamTransport::new(stdout, stdin, stream_config(settings));
            Ok(Connected::new(reading_directly(transport)))
        }
        #[cfg(feature = "socket")]
        Channel::Inherited {
            transport,
            child_end,
        } => {
            // Our copy of the child's end must go, or the worker exiting is never seen as the
            // end of the stream.
            drop(child_end);
            Ok(Connected::new(reading_directly(transport)))
        }
        #[cfg(feature = "socket")]
        Channel::Named(listener) => {
            use airlock_transport_socket::{AcceptError, PeerExpectation};
            let token = *listener.token();
            let deadline = std::time::Instant::now() + settings.protocol.handshake_limit();
            let expectation = PeerExpectation {
                uid,
                pid: Some(pid),
            };
            match listener.accept_worker(expectation, deadline).await {
                Ok(accepted) => {
                    let mut connected = Connected::new(reading_directly(accepted.transport));
                    connected.hello = Some(accepted.hello);
                    connected.token = Some(token);
                    Ok(connected)
                }
                Err(AcceptError::Deadline { .. }) => Err(SpawnError::Handshake(
                    crate::HandshakeError::new(crate::LostReason::HandshakeTimeout),
                )),
                Err(AcceptError::Io(err)) => Err(SpawnError::Transport(err)),
                // A kind of failure added to the socket transport later: its own error, kept
                // whole as the source.
                Err(other) => Err(SpawnError::Transport(std::io::Error::other(other))),
            }
        }
    }
}
