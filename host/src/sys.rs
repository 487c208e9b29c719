//! The one place this crate needs `unsafe`: code that runs in the forked child before `exec`.
//!
//! Between `fork` and `exec` only async-signal-safe operations are allowed: no allocation, no
//! locks. Everything below is a bare system call on values prepared before the fork.

#![allow(unsafe_code)]

use std::os::fd::RawFd;

use tokio::process::Command;

/// Arranges for the child, just before `exec`:
/// - every descriptor from 3 up to be closed on exec, except `keep` (the socket channel, if
///   any), so nothing the host holds leaks into the worker;
/// - SIGKILL when the host thread that spawned it dies (`PR_SET_PDEATHSIG`), and an immediate
///   exit if the host is already gone.
pub(crate) fn prepare_child(command: &mut Command, keep: Option<RawFd>) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the child between fork and exec. It only makes system calls
    // (close_range, prctl, getppid, fcntl) on integers captured by value; it allocates nothing,
    // takes no lock and touches no shared state, so it is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            // Mark every inherited descriptor >= 3 close-on-exec. stdio (0-2) was already set
            // up by std; its own error-report pipe is close-on-exec anyway.
            // SAFETY: a plain system call with integer arguments.
            let marked = libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if marked != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = keep {
                // SAFETY: `fd` is the channel descriptor the parent created and keeps open
                // until the child has been spawned; it is valid in the child.
                let borrowed = std::os::fd::BorrowedFd::borrow_raw(fd);
                rustix::io::fcntl_setfd(borrowed, rustix::io::FdFlags::empty())?;
            }
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The host may have died before the prctl took effect: then nobody would kill us.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::other("host exited during spawn"));
            }
            Ok(())
        });
    }
}
