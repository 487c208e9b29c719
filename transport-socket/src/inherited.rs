//! Inherited mode: a connected socket pair, one end kept by the host, the other placed in the
//! child at a documented descriptor number. No name exists anywhere for another process to
//! find, so nothing needs authenticating: the only peer is whoever the host gave the end to.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use airlock_transport_pipe::{StreamConfig, StreamTransport};
use rustix::io::fcntl_dupfd_cloexec;
use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};

use crate::adopt::adopt_inherited_socket;
use crate::env::{socket_fd_from_env, CHILD_SOCKET_FD};
use crate::raw_sockopt::refuse_passed_descriptors;
use crate::socket_io::split_socket;
use crate::SocketTransport;

/// Host side: a connected socket pair. Returns the host's transport and the child's end.
///
/// Both ends are close-on-exec. The host's end refuses descriptors the worker would pass
/// (`SO_PASSRIGHTS` off, Linux 6.16+): its `sendmsg` with `SCM_RIGHTS` fails with `EPERM`. The host places the child's end at [`CHILD_SOCKET_FD`] in the
/// child between `fork` and `exec` (`dup2(child_end, 3)`, which also clears close-on-exec on
/// the copy) and then drops its own copy of the child's end, so that the worker exiting is seen
/// as end of stream. The child's end is guaranteed to have a number above [`CHILD_SOCKET_FD`],
/// so that `dup2` is never the no-op `dup2(3, 3)` that would leave close-on-exec set.
///
/// Must be called inside a tokio runtime with I/O enabled.
pub fn inherited_pair(config: StreamConfig) -> io::Result<(SocketTransport, OwnedFd)> {
    let (host, child) = socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    // Before the child exists: the worker can never queue a descriptor for the host to close.
    refuse_passed_descriptors(host.as_fd())?;
    let child = if child.as_raw_fd() <= CHILD_SOCKET_FD {
        fcntl_dupfd_cloexec(&child, CHILD_SOCKET_FD + 1)?
    } else {
        child
    };
    Ok((transport_from_fd(host, config)?, child))
}

/// Worker side of inherited mode: adopts the socket at the descriptor number in
/// [`AIRLOCK_SOCKET_FD`](crate::AIRLOCK_SOCKET_FD), or [`CHILD_SOCKET_FD`] if it is unset.
///
/// See [`worker_inherited_fd`] for the checks and the calling contract.
pub fn worker_inherited(config: StreamConfig) -> io::Result<SocketTransport> {
    worker_inherited_fd(socket_fd_from_env()?, config)
}

/// Worker side of inherited mode, at an explicit descriptor number.
///
/// The descriptor must be open and a connected Unix stream socket, else the call fails with
/// nothing taken. On success it is owned by the returned transport and marked close-on-exec, so
/// processes the worker starts do not inherit the channel. At most one descriptor is adopted per
/// process: a second call fails with [`io::ErrorKind::AlreadyExists`].
///
/// Call once, early, before any handler runs: nothing else in the process may own or close
/// `fd` (it was placed there by the host before `exec`, and no other code was given it). Must
/// be called inside a tokio runtime with I/O enabled.
pub fn worker_inherited_fd(fd: RawFd, config: StreamConfig) -> io::Result<SocketTransport> {
    transport_from_fd(adopt_inherited_socket(fd)?, config)
}

/// Worker side of inherited mode for a peer that does its own blocking I/O (no tokio runtime):
/// adopts the socket at [`AIRLOCK_SOCKET_FD`](crate::AIRLOCK_SOCKET_FD), or
/// [`CHILD_SOCKET_FD`] if it is unset, and returns it as a blocking standard stream.
///
/// The same checks, close-on-exec marking and once-per-process rule as [`worker_inherited_fd`]
/// apply; the caller frames its own bytes (see `PROTOCOL.md`).
pub fn worker_inherited_blocking() -> io::Result<std::os::unix::net::UnixStream> {
    let stream =
        std::os::unix::net::UnixStream::from(adopt_inherited_socket(socket_fd_from_env()?)?);
    // The host may have left it non-blocking; this caller reads and writes synchronously.
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Wraps a connected stream socket we own into the transport.
pub(crate) fn transport_from_fd(fd: OwnedFd, config: StreamConfig) -> io::Result<SocketTransport> {
    let (read, write) = split_socket(fd)?;
    Ok(StreamTransport::new(read, write, config))
}
