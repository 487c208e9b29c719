//! The crate's socket options that rustix has no safe wrapper for, each a single `unsafe`
//! call: asking the kernel for a pidfd of the process that made a connection
//! (`SO_PEERPIDFD`, Linux 6.5+), and refusing descriptors a peer would pass
//! (`SO_PASSRIGHTS`, Linux 6.16+).
//!
//! `SO_PEERCRED` reports the pid a connection was made *from*, frozen at `connect`: a process
//! that connected and exited leaves behind a connection whose credentials name a pid that the
//! kernel may since have given to another process, such as the worker the host forks next. A
//! pidfd names the connecting process itself, so it can tell whether that process is still the
//! one holding the pid.
//!
//! A descriptor a peer passes (`SCM_RIGHTS`) is not installed by a `recv` without a control
//! buffer, but the kernel still closes it on the receiving thread, and closing a pipe waits for
//! the pipe's lock, which its sender may hold for seconds (a copy it makes slow). With
//! `SO_PASSRIGHTS` off on the host's end the kernel refuses the send (`EPERM`): the descriptor
//! never reaches the host's queue, so the host never closes it.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A pidfd for the process that made the connection on `socket`, or the OS's error:
/// `ENOPROTOOPT` where the kernel predates the option; `ESRCH` or `EINVAL` on kernels that
/// cannot name a connecting process that has since exited.
pub(crate) fn peer_pidfd(socket: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut fd: RawFd = -1;
    let mut len = std::mem::size_of::<RawFd>() as libc::socklen_t;
    // SAFETY: `socket` is a descriptor borrowed for the duration of the call; `fd` and `len`
    // are valid, writable and sized for the int the kernel writes for this option.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            (&mut fd as *mut RawFd).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if fd < 0 {
        return Err(io::Error::from(io::ErrorKind::InvalidData));
    }
    // SAFETY: on success the kernel installed a new descriptor, `fd`, in this process's table
    // for the caller; nothing else owns it, so taking ownership here is sound (and closes it on
    // every path below).
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
    if len as usize != std::mem::size_of::<RawFd>() {
        return Err(io::Error::from(io::ErrorKind::InvalidData));
    }
    Ok(pidfd)
}

/// `SO_PASSRIGHTS` (Linux 6.16+): whether a Unix socket accepts descriptors passed to it. The
/// `libc` crate does not name it yet; the numbers are the kernel's (`asm-generic/socket.h`,
/// and SPARC's own `socket.h`).
#[cfg(not(any(target_arch = "sparc", target_arch = "sparc64")))]
const SO_PASSRIGHTS: libc::c_int = 83;
#[cfg(any(target_arch = "sparc", target_arch = "sparc64"))]
const SO_PASSRIGHTS: libc::c_int = 92;

/// Makes the kernel refuse descriptors passed to `socket`: a peer's `sendmsg` with
/// `SCM_RIGHTS` then fails with `EPERM` and nothing of it is queued. A connection takes its
/// listener's setting when it connects (not when it is accepted), so set it on a listener
/// before `listen`. Descriptors already queued when this is set are not affected.
///
/// Where the kernel predates the option (`ENOPROTOOPT`) this succeeds and warns once per
/// process: passed descriptors are then still discarded by reads without a control buffer, but
/// closed on the reading thread (SECURITY.md says what that allows).
pub(crate) fn refuse_passed_descriptors(socket: BorrowedFd<'_>) -> io::Result<()> {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if set_passrights_off(socket)? {
        return Ok(());
    }
    WARNED.call_once(|| {
        tracing::warn!(
            "airlock socket: this kernel has no SO_PASSRIGHTS (Linux 6.16+); descriptors a \
             worker passes are discarded, but closed on the host's thread"
        );
    });
    Ok(())
}

/// `setsockopt(SO_PASSRIGHTS, 0)`: `Ok(false)` where the kernel predates the option.
fn set_passrights_off(socket: BorrowedFd<'_>) -> io::Result<bool> {
    let off: libc::c_int = 0;
    // SAFETY: `socket` is a descriptor borrowed for the duration of the call; `off` is a valid,
    // readable int, and the length passed is its size, as the option takes.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PASSRIGHTS,
            (&off as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOPROTOOPT) {
        return Ok(false);
    }
    Err(err)
}
