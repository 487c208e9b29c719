//! Handing a socket-pair end to a child at [`CHILD_SOCKET_FD`], as a host does.

#![allow(unsafe_code)] // `pre_exec` is unsafe by definition

use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use airlock_transport_socket::CHILD_SOCKET_FD;

/// Arranges for `fd` to be at [`CHILD_SOCKET_FD`] (without close-on-exec) in the child `cmd`
/// spawns. The command keeps `fd` open until it is dropped: drop the command right after
/// spawning, or the parent's copy keeps the socket open after the child exits.
///
/// `fd` must not itself be [`CHILD_SOCKET_FD`] (then `dup2` would be a no-op that leaves
/// close-on-exec set); `inherited_pair` guarantees that.
pub fn pass_socket_fd(cmd: &mut Command, fd: OwnedFd) {
    // SAFETY: the closure runs in the forked child before `exec`. It makes one system call,
    // `dup2`, which is async-signal-safe, allocates nothing and takes no lock. The `OwnedFd`
    // for the target number is never dropped (`ManuallyDrop`), so nothing is closed by it; it
    // exists only to name the target for `dup2`, which replaces whatever is there atomically.
    unsafe {
        cmd.pre_exec(move || {
            let mut target = ManuallyDrop::new(OwnedFd::from_raw_fd(CHILD_SOCKET_FD));
            rustix::io::dup2(&fd, &mut target)?;
            Ok(())
        });
    }
}
