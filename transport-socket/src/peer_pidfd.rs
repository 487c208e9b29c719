//! The crate's second `unsafe` operation: asking the kernel for a pidfd of the process that
//! made a connection (`SO_PEERPIDFD`, Linux 6.5+). rustix has no safe wrapper for this option.
//!
//! `SO_PEERCRED` reports the pid a connection was made *from*, frozen at `connect`: a process
//! that connected and exited leaves behind a connection whose credentials name a pid that the
//! kernel may since have given to another process, such as the worker the host forks next. A
//! pidfd names the connecting process itself, so it can tell whether that process is still the
//! one holding the pid.

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
