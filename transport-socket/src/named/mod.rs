//! Named mode: a listening socket in a fresh private directory, for workers started by
//! something other than the host (a container runtime, a jail launcher).
//!
//! Who may connect is settled in layers, each aimed at a different attacker:
//!
//! 1. **The directory.** The socket lives in a directory the host just created with mode
//!    `0700` under a 128-bit random name ([`PrivateDir`]): other users cannot reach the socket
//!    at all, and no name from an earlier run or planted in advance is ever reused or followed.
//!    The socket file itself is mode `0600`.
//! 2. **Peer credentials.** The kernel records who connected (`SO_PEERCRED`); a peer whose uid
//!    differs from the expected one, or whose pid differs when the host spawned the worker
//!    itself, is refused before a byte is read from it. That pid is the one the connecting
//!    process had *when it connected*: a process that connected and exited leaves credentials
//!    naming a pid the kernel may since have given the worker. So, with a pid expected, the
//!    connecting process itself is asked for (`SO_PEERPIDFD`) and must still hold that pid
//!    (`Refusal::ConnectorExited` otherwise). On kernels before Linux 6.5, without the option,
//!    that last check cannot be made and the pid alone is trusted.
//! 3. **The token.** The first frame must be a `Hello` carrying the listener's fresh 32-byte
//!    token, compared in constant time. The token reaches only the child, through its
//!    environment; a token from an earlier listener is worthless.
//!
//! Every refused connection is closed, logged and counted. Candidates are screened
//! concurrently, each under its own short deadline, so one that connects first and stalls does
//! not keep the real worker out. Once a candidate passes, the listener stops, its socket file
//! and directory are removed, and the connection becomes the transport. No refusal ends the
//! wait early: a refused connection may be anyone's (see below), and the worker may still
//! connect before the deadline.
//!
//! Passed descriptors (`SCM_RIGHTS`) are never accepted: the listener refuses them
//! (`SO_PASSRIGHTS` off, Linux 6.16+, set before it is bound; every connection takes the
//! setting as it connects), so a peer's `sendmsg` carrying one fails with `EPERM`. On
//! older kernels the transport's reads, which take no control messages, make the kernel
//! discard (close) any descriptors a peer attached.

mod dir;
mod screen;

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_protocol::TOKEN_LEN;
use airlock_transport_pipe::StreamConfig;
use bytes::Bytes;
use interprocess::local_socket::traits::tokio::Listener as _;
use interprocess::local_socket::traits::StreamCommon as _;
use interprocess::local_socket::{ConnectOptions, GenericFilePath, ToFsName};
use interprocess::os::unix::uds_local_socket::tokio as uds;
use rustix::io::Errno;
use rustix::net::{
    bind, listen, socket_with, AddressFamily, SocketAddrUnix, SocketFlags, SocketType,
};
use tokio::net::UnixStream;
use tokio::task::JoinSet;

pub use dir::{PrivateDir, PRIVATE_DIR_PREFIX};

use crate::env::{encode_token, invalid, AIRLOCK_SOCKET_NAME, AIRLOCK_TOKEN};
use crate::error::{AcceptError, Refusal};
use crate::inherited::transport_from_fd;
use crate::raw_sockopt::refuse_passed_descriptors;
use crate::SocketTransport;

/// Default for [`NamedConfig::candidate_timeout`]: 2 seconds from a connection to its `Hello`.
///
/// A real worker sends its `Hello` within milliseconds of connecting; two seconds survive a
/// loaded machine, and bound what a connection that never speaks can cost.
pub const DEFAULT_CANDIDATE_TIMEOUT: Duration = Duration::from_secs(2);

/// Most connections screened at once; more are closed unread.
///
/// Only peers that already passed the credential check take a slot, so this bounds what a
/// same-user process can pin (memory for at most this many [`MAX_HELLO_FRAME`] buffers).
pub const MAX_CANDIDATES: usize = 64;

/// Largest first frame a candidate may send, whatever `max_frame` says: 128 KiB.
///
/// The largest valid `Hello` (1024 method names of 64 bytes, a name, a version and a token) is
/// about 66 KiB; an unauthenticated peer gets no more than about twice that.
pub const MAX_HELLO_FRAME: u32 = 128 * 1024;

/// Refusal reasons kept in [`Accepted::refusals`] and [`AcceptError::Deadline`]; later ones
/// are only counted.
pub const MAX_RECORDED_REFUSALS: usize = 32;

/// Name of the socket inside its private directory.
const SOCKET_FILE: &str = "sock";

/// Mode of the socket file: only the owner may connect (the directory already says so).
const SOCKET_MODE: u32 = 0o600;

/// How a [`NamedListener`] is set up. Built from the `DEFAULT_*` constants; change with the
/// setters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedConfig {
    stream: StreamConfig,
    parent_dir: Option<PathBuf>,
    candidate_timeout: Duration,
}

impl Default for NamedConfig {
    fn default() -> Self {
        Self {
            stream: StreamConfig::default(),
            parent_dir: None,
            candidate_timeout: DEFAULT_CANDIDATE_TIMEOUT,
        }
    }
}

impl NamedConfig {
    /// Framing limits of the accepted transport. Default [`StreamConfig::default`].
    pub fn stream(mut self, stream: StreamConfig) -> Self {
        self.stream = stream;
        self
    }

    /// Where the private directory is created. Default [`std::env::temp_dir`]. The parent
    /// should not be writable by other users without the sticky bit (as `/tmp` has): such a
    /// user could swap the directory out, which is detected, but only as a failure.
    pub fn parent_dir(mut self, parent: impl Into<PathBuf>) -> Self {
        self.parent_dir = Some(parent.into());
        self
    }

    /// How long a connection may take to deliver its `Hello`. Default
    /// [`DEFAULT_CANDIDATE_TIMEOUT`].
    pub fn candidate_timeout(mut self, timeout: Duration) -> Self {
        self.candidate_timeout = timeout;
        self
    }

    /// The framing limits.
    pub fn stream_config(&self) -> StreamConfig {
        self.stream
    }
}

/// Who the worker must be, as the kernel reports the peer of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerExpectation {
    /// The effective uid the worker runs as.
    pub uid: u32,
    /// The worker's pid, when the host spawned it directly (a launcher in between, or a
    /// container runtime, makes the pid unknown: then `None`).
    pub pid: Option<u32>,
}

impl PeerExpectation {
    /// Any process running as this process's effective uid.
    pub fn current_user() -> Self {
        Self {
            uid: rustix::process::geteuid().as_raw(),
            pid: None,
        }
    }

    /// Exactly process `pid`, running as this process's effective uid.
    pub fn process(pid: u32) -> Self {
        Self {
            pid: Some(pid),
            ..Self::current_user()
        }
    }
}

/// The worker's connection, authenticated.
#[derive(Debug)]
pub struct Accepted {
    /// The transport, positioned just after the `Hello`.
    pub transport: SocketTransport,
    /// The `Hello` frame's payload (without its length prefix): feed it to the host session
    /// (`HostSession::handle_frame`), which checks the rest of it.
    pub hello: Bytes,
    /// The peer's effective uid.
    pub peer_uid: u32,
    /// The peer's pid, if the OS reports one.
    pub peer_pid: Option<u32>,
    /// Connections refused before (or while) this one was accepted, including candidates still
    /// being screened when it passed.
    pub refused: u32,
    /// The first [`MAX_RECORDED_REFUSALS`] reasons.
    pub refusals: Vec<Refusal>,
}

/// A listening socket waiting for one worker. See the [module docs](self).
///
/// Created by [`NamedListener::bind`]; pass [`NamedListener::env`] to the worker; then
/// [`NamedListener::accept_worker`] consumes it. Dropping it (or accepting) removes the socket
/// file and the directory.
pub struct NamedListener {
    // Field order is drop order: the listening socket closes before its directory goes.
    listener: uds::Listener,
    dir: PrivateDir,
    name: PathBuf,
    token: [u8; TOKEN_LEN],
    config: NamedConfig,
}

impl std::fmt::Debug for NamedListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token: debug output ends up in logs.
        f.debug_struct("NamedListener")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl NamedListener {
    /// Creates a fresh private directory, listens on a socket inside it, and draws a fresh
    /// 32-byte token from the OS's CSPRNG. Must be called inside a tokio runtime with I/O.
    pub fn bind(config: NamedConfig) -> io::Result<Self> {
        let parent = config.parent_dir.clone().unwrap_or_else(std::env::temp_dir);
        let dir = PrivateDir::create_random_in(&parent)?;
        let name = dir.path().join(SOCKET_FILE);
        let listener = listen_refusing_descriptors(&name)?;
        let mut listener = Self {
            listener,
            dir,
            name,
            token: [0; TOKEN_LEN],
            config,
        };
        // The directory must still be the one created, now that the socket is in it.
        listener.dir.verify()?;
        getrandom::fill(&mut listener.token).map_err(|err| io::Error::other(err.to_string()))?;
        Ok(listener)
    }

    /// The socket's path, which the worker connects to.
    pub fn name(&self) -> &Path {
        &self.name
    }

    /// The private directory holding the socket.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The token the worker must quote in its `Hello`.
    pub fn token(&self) -> &[u8; TOKEN_LEN] {
        &self.token
    }

    /// The environment the worker needs: [`AIRLOCK_SOCKET_NAME`] and [`AIRLOCK_TOKEN`]. Pass
    /// it to the child only (`Command::envs`), never to the host's own environment.
    pub fn env(&self) -> [(&'static str, OsString); 2] {
        [
            (AIRLOCK_SOCKET_NAME, self.name.clone().into_os_string()),
            (AIRLOCK_TOKEN, OsString::from(encode_token(&self.token))),
        ]
    }

    /// Accepts connections until one passes every check (see the [module docs](self)) or
    /// `deadline` passes, then stops listening and removes the name.
    ///
    /// Each connection whose credentials match `expect` is screened concurrently: it must send
    /// a complete first frame (at most [`MAX_HELLO_FRAME`] and `max_frame` bytes) within the
    /// candidate timeout, and that frame must be a `Hello` with this listener's token. Anything
    /// else is closed, logged (`tracing::warn!`) and counted. A refusal never ends the wait,
    /// even from the expected pid: the kernel reports the pid a connection was made *from*, and
    /// a process that connected and died may have left that number to the worker (see the
    /// residual in `SECURITY.md`), so no refusal proves the worker itself failed. Must be
    /// awaited inside a tokio runtime with I/O and time enabled.
    pub async fn accept_worker(
        self,
        expect: PeerExpectation,
        deadline: Instant,
    ) -> Result<Accepted, AcceptError> {
        let stream_config = self.config.stream;
        let max_hello = stream_config.max_frame.min(MAX_HELLO_FRAME);
        let mut tally = Tally::default();
        let mut pending: JoinSet<Result<Passed, Refusal>> = JoinSet::new();
        let expired = tokio::time::sleep_until(deadline.into());
        tokio::pin!(expired);
        loop {
            tokio::select! {
                biased;
                Some(joined) = pending.join_next() => match joined {
                    Ok(Ok(passed)) => {
                        for _ in 0..pending.len() {
                            tally.refuse(Refusal::Superseded);
                        }
                        pending.abort_all();
                        drop(self); // stop listening; remove the socket file and directory
                        let Passed { stream, hello, uid, pid } = passed;
                        let fd = stream.into_std()?.into();
                        let transport = transport_from_fd(fd, stream_config)?;
                        return Ok(Accepted {
                            transport,
                            hello,
                            peer_uid: uid,
                            peer_pid: pid,
                            refused: tally.refused,
                            refusals: tally.refusals,
                        });
                    }
                    Ok(Err(refusal)) => tally.refuse(refusal),
                    Err(_) => tally.refuse(Refusal::Io(io::ErrorKind::Other)),
                },
                accepted = self.listener.accept() => match accepted {
                    Ok(stream) => {
                        if pending.len() >= MAX_CANDIDATES {
                            tally.refuse(Refusal::TooManyCandidates);
                            continue;
                        }
                        match admit(stream, &expect) {
                            Ok((stream, uid, pid)) => {
                                let token = self.token;
                                let timeout = self.config.candidate_timeout;
                                pending.spawn(async move {
                                    let (stream, hello) =
                                        screen::screen(stream, token, max_hello, timeout).await?;
                                    Ok(Passed { stream, hello, uid, pid })
                                });
                            }
                            Err(refusal) => tally.refuse(refusal),
                        }
                    }
                    Err(err) if is_transient(&err) => {
                        tracing::warn!(%err, "airlock socket: accept failed; retrying");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(err) => return Err(AcceptError::Io(err)),
                },
                () = &mut expired => {
                    for _ in 0..pending.len() {
                        tally.refuse(Refusal::HelloTimeout);
                    }
                    return Err(AcceptError::Deadline {
                        refused: tally.refused,
                        refusals: tally.refusals,
                    });
                }
            }
        }
    }
}

/// A listening socket at `name` that refuses passed descriptors (`SO_PASSRIGHTS` off) from
/// before it is bound. A connection takes the listener's setting when it connects, not when it
/// is accepted, so the setting must precede `listen`: a connection made in between would keep
/// the right to queue descriptors for the host to close. The mode is set on the socket before
/// `bind`, which gives it to the file; `bind` fails on any existing entry, so nothing at `name`
/// is ever deleted to make room (removal is ours, by descriptor).
fn listen_refusing_descriptors(name: &Path) -> io::Result<uds::Listener> {
    let socket = socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    refuse_passed_descriptors(socket.as_fd())?;
    rustix::fs::fchmod(&socket, rustix::fs::Mode::from_raw_mode(SOCKET_MODE))?;
    bind(&socket, &SocketAddrUnix::new(name)?)?;
    listen(&socket, -1)?;
    uds::Listener::try_from(socket)
}

impl Drop for NamedListener {
    fn drop(&mut self) {
        // Unlink through the directory's descriptor: nothing but our own socket file can be hit.
        if let Err(err) = self.dir.remove_entry(OsStr::new(SOCKET_FILE)) {
            tracing::debug!(%err, name = %self.name.display(), "socket file already gone");
        }
    }
}

/// A candidate that passed screening.
struct Passed {
    stream: UnixStream,
    hello: Bytes,
    uid: u32,
    pid: Option<u32>,
}

/// Refusals so far.
#[derive(Default)]
struct Tally {
    refused: u32,
    refusals: Vec<Refusal>,
}

impl Tally {
    fn refuse(&mut self, refusal: Refusal) {
        tracing::warn!(%refusal, "airlock socket: refused a connection");
        self.refused = self.refused.saturating_add(1);
        if self.refusals.len() < MAX_RECORDED_REFUSALS {
            self.refusals.push(refusal);
        }
    }
}

/// The credential check, done as soon as the connection is accepted: a peer that fails it is
/// closed before a byte is read from it.
fn admit(
    stream: uds::Stream,
    expect: &PeerExpectation,
) -> Result<(UnixStream, u32, Option<u32>), Refusal> {
    let creds = stream
        .peer_creds()
        .map_err(|err| Refusal::CredentialsUnavailable(err.kind()))?;
    let uid = creds.euid();
    let pid = creds.pid().and_then(|pid| u32::try_from(pid).ok());
    screen::check_credentials(uid, pid, expect)?;
    if let Some(expected) = expect.pid {
        use std::os::fd::AsFd;
        screen::check_connector_holds_pid(stream.as_fd(), expected)?;
    }
    let uid = uid.unwrap_or(expect.uid);
    Ok((UnixStream::from(stream), uid, pid))
}

/// Accept failures that concern one connection or a passing shortage, not the listener.
fn is_transient(err: &io::Error) -> bool {
    Errno::from_io_error(err).is_some_and(|errno| {
        [
            Errno::CONNABORTED,
            Errno::INTR,
            Errno::MFILE,
            Errno::NFILE,
            Errno::NOBUFS,
            Errno::NOMEM,
            Errno::PROTO,
        ]
        .contains(&errno)
    })
}

/// Worker side of named mode: connects to the socket named by [`AIRLOCK_SOCKET_NAME`].
///
/// The worker must then send its `Hello` with the token from
/// [`token_from_env`](crate::token_from_env) (`WorkerConfig::token`), or the host refuses it.
/// Must be awaited inside a tokio runtime with I/O.
pub async fn worker_connect_named(config: StreamConfig) -> io::Result<SocketTransport> {
    let name = std::env::var_os(AIRLOCK_SOCKET_NAME)
        .ok_or_else(|| invalid(format!("{AIRLOCK_SOCKET_NAME} is not set")))?;
    worker_connect_named_at(Path::new(&name), config).await
}

/// Worker side of named mode, at an explicit socket path.
pub async fn worker_connect_named_at(
    name: &Path,
    config: StreamConfig,
) -> io::Result<SocketTransport> {
    let stream = ConnectOptions::new()
        .name(name.to_fs_name::<GenericFilePath>()?)
        .connect_tokio_as::<uds::Stream>()
        .await?;
    transport_from_fd(UnixStream::from(stream).into_std()?.into(), config)
}
