//! The crate's one `unsafe` operation: a worker taking ownership of the socket descriptor its
//! host placed at a known number before `exec`.
//!
//! Nothing in the process owns that descriptor yet, so no safe API can hand it out: it has to
//! be adopted from its number. Before adopting, the descriptor is checked to be open and to be
//! a connected Unix stream socket, so a misconfigured number (nothing there, a pipe, a file, the
//! async runtime's own epoll descriptor) is refused instead of stolen. Adoption happens at most
//! once per process, so this crate never creates two owners of one number.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::FileType;
use rustix::io::{fcntl_getfd, fcntl_setfd, FdFlags};
use rustix::net::{sockopt, AddressFamily, SocketType};

use crate::env::{invalid, CHILD_SOCKET_FD};

/// Set once a descriptor has been adopted: a second adoption is refused.
static ADOPTED: AtomicBool = AtomicBool::new(false);

/// Takes ownership of the inherited socket at `raw`, after checking that it is one, and marks
/// it close-on-exec so processes the worker starts do not inherit the channel.
pub(crate) fn adopt_inherited_socket(raw: RawFd) -> io::Result<OwnedFd> {
    if raw < CHILD_SOCKET_FD {
        // Also keeps -1 (which `borrow_raw` forbids) and the standard streams out.
        return Err(invalid(format!(
            "descriptor {raw} is a standard stream or invalid, never the channel"
        )));
    }
    if ADOPTED
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the inherited socket was already taken by this process",
        ));
    }
    match check_and_adopt(raw) {
        Ok(fd) => Ok(fd),
        Err(err) => {
            // Nothing was taken: a corrected call may try again.
            ADOPTED.store(false, Ordering::Release);
            Err(err)
        }
    }
}

fn check_and_adopt(raw: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: `raw` is not -1 (checked by the caller). The borrow lives only for the checks
    // below, which are `fcntl`, `fstat` and `getsockopt`: they neither close the descriptor nor
    // touch memory through it. If nothing is open at `raw`, they fail with `EBADF`, which is
    // reported, and nothing else happens. The caller's contract (documented on
    // `worker_inherited`) is that this runs at start-up, before any other code in the process
    // could be closing or reusing this number concurrently.
    let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
    fcntl_getfd(borrowed).map_err(|err| {
        io::Error::new(
            io::Error::from(err).kind(),
            format!("no descriptor is open at {raw}: did the host pass the socket?"),
        )
    })?;
    let stat = rustix::fs::fstat(borrowed)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Socket {
        return Err(invalid(format!("descriptor {raw} is not a socket")));
    }
    if sockopt::socket_domain(borrowed)? != AddressFamily::UNIX
        || sockopt::socket_type(borrowed)? != SocketType::STREAM
    {
        return Err(invalid(format!(
            "descriptor {raw} is not a Unix stream socket"
        )));
    }
    if sockopt::socket_acceptconn(borrowed)? {
        return Err(invalid(format!(
            "descriptor {raw} is a listening socket, not a connection"
        )));
    }
    // SAFETY: `raw` is open (fcntl succeeded) and is a Unix stream socket (checked above). The
    // host created it for this process and placed it at this number before `exec`; nothing in
    // this process was handed ownership of it (there is no safe way to obtain an inherited
    // descriptor), and `ADOPTED` makes this the only adoption this crate performs. From here on
    // the returned `OwnedFd` is its sole owner and closes it exactly once.
    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
    // Inherited descriptors arrive without close-on-exec; a process the worker spawns must not
    // get the channel.
    fcntl_setfd(&owned, FdFlags::CLOEXEC)?;
    Ok(owned)
}
