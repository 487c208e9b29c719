//! The one place this crate needs `unsafe`: code that runs in the forked child before `exec`.
//!
//! Between `fork` and `exec` only async-signal-safe operations are allowed: no allocation, no
//! locks. Everything below is a bare system call on values prepared before the fork.

#![allow(unsafe_code)]

use std::os::fd::RawFd;

use tokio::process::Command;

/// Arranges for the child, just before `exec`:
/// - every descriptor from 3 up to be closed on exec, so nothing the host holds leaks into the
///   worker — except `channel` (the inherited socket, if any), which is moved to fd 3;
/// - SIGKILL when the host thread that spawned it dies (`PR_SET_PDEATHSIG`), and an immediate
///   exit if the host is already gone.
pub(crate) fn prepare_child(command: &mut Command, channel: Option<RawFd>) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the child between fork and exec. It only makes system calls
    // (close_range, dup2, prctl, getppid) on integers captured by value; it allocates nothing,
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
            if let Some(fd) = channel {
                // The documented place for the channel is fd 3. `dup2` leaves the copy without
                // close-on-exec; the original (numbered above 3) closes on exec.
                // SAFETY: a plain system call on two integers; `fd` is open in the child
                // because the parent keeps it open until the spawn has returned.
                if libc::dup2(fd, 3) != 3 {
                    return Err(std::io::Error::last_os_error());
                }
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
