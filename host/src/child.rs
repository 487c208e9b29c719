//! The host's child process, whichever way it was started: forked by tokio's `Command` (a
//! confined worker's keeper, or the worker itself, whose confinement needs a real fork), or
//! cloned with `CLONE_VM | CLONE_VFORK` and `exec`ed (an unconfined worker: see
//! `sys::spawn_vforked`). Both are killed when dropped unreaped, and both report how they
//! ended as a [`std::process::ExitStatus`].

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use rustix::process::{pidfd_send_signal, waitid, Signal, WaitId, WaitIdOptions};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// The host's child process.
#[derive(Debug)]
pub(crate) enum WorkerChild {
    /// Forked by tokio, killed on drop.
    Forked(tokio::process::Child),
    /// Cloned and `exec`ed by the host, known by its pidfd.
    Cloned(ClonedChild),
}

impl WorkerChild {
    /// The child's pid, or `None` once it has been reaped.
    pub(crate) fn id(&self) -> Option<u32> {
        match self {
            WorkerChild::Forked(child) => child.id(),
            WorkerChild::Cloned(child) => child.status.is_none().then_some(child.pid),
        }
    }

    /// Sends the child `SIGKILL` (without waiting for it).
    pub(crate) fn start_kill(&mut self) -> io::Result<()> {
        match self {
            WorkerChild::Forked(child) => child.start_kill(),
            WorkerChild::Cloned(child) => child.start_kill(),
        }
    }

    /// Waits for the child to end, and reaps it.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            WorkerChild::Forked(child) => child.wait().await,
            WorkerChild::Cloned(child) => child.wait().await,
        }
    }

    /// Reaps the child if it has ended; `None` if it still runs.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self {
            WorkerChild::Forked(child) => child.try_wait(),
            WorkerChild::Cloned(child) => child.try_wait(),
        }
    }
}

/// A child this process cloned, held by a pidfd: it is signalled and reaped only through the
/// pidfd, so nothing done to it can reach another process that took its pid. Killed with
/// `SIGKILL`, with its process group, and reaped if dropped while it runs.
#[derive(Debug)]
pub(crate) struct ClonedChild {
    pid: u32,
    /// Readable once the child has ended. `None` only inside `drop`.
    pidfd: Option<AsyncFd<OwnedFd>>,
    /// Set once reaped.
    status: Option<ExitStatus>,
}

impl ClonedChild {
    /// Takes charge of the child `pid` held by `pidfd`. Must run inside a tokio runtime (the
    /// pidfd is registered with its reactor); if that fails the child is killed and reaped.
    pub(crate) fn new(pid: u32, pidfd: OwnedFd) -> io::Result<Self> {
        match crate::sys::register_pidfd(pidfd) {
            Ok(pidfd) => Ok(Self {
                pid,
                pidfd: Some(pidfd),
                status: None,
            }),
            Err((pidfd, err)) => {
                let _ = pidfd_send_signal(&pidfd, Signal::KILL);
                let _ = reap(&pidfd, WaitIdOptions::empty());
                Err(err)
            }
        }
    }

    fn start_kill(&mut self) -> io::Result<()> {
        match (&self.pidfd, self.status) {
            (Some(pidfd), None) => Ok(pidfd_send_signal(pidfd, Signal::KILL)?),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the child has been reaped already",
            )),
        }
    }

    async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            let Some(pidfd) = &self.pidfd else {
                return Err(io::Error::from(io::ErrorKind::NotFound));
            };
            // A pidfd turns readable when its process ends; readiness is only a hint, so a
            // wake-up that finds it still running clears it and waits on.
            let mut ready = pidfd.readable().await?;
            let status = reap(pidfd.get_ref(), WaitIdOptions::NOHANG)?;
            if status.is_none() {
                ready.clear_ready();
            }
            drop(ready);
            self.status = status;
        }
    }

    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            if let Some(pidfd) = &self.pidfd {
                self.status = reap(pidfd.get_ref(), WaitIdOptions::NOHANG)?;
            }
        }
        Ok(self.status)
    }
}

impl Drop for ClonedChild {
    fn drop(&mut self) {
        let Some(pidfd) = self.pidfd.take() else {
            return;
        };
        if self.status.is_some() {
            return;
        }
        let pidfd = pidfd.into_inner();
        let _ = pidfd_send_signal(&pidfd, Signal::KILL);
        // And everything it started: the child leads its own process group, and its pid (the
        // group's id) cannot be taken by another process until it is reaped below. (A running
        // worker's `WorkerProcess` does this too when dropped; this covers a child dropped
        // before it has one: a spawn given up after the clone.)
        crate::launch::kill_group(self.pid);
        if let Ok(Some(_)) = reap(&pidfd, WaitIdOptions::NOHANG) {
            return;
        }
        // Not dead yet (the kill is on its way): reap it off this thread, which may be a
        // runtime's. A thread, not a task, so a runtime shutting down cannot leave a zombie.
        let reaper = std::thread::Builder::new()
            .name("airlock-reaper".into())
            .spawn(move || {
                let _ = reap(&pidfd, WaitIdOptions::empty());
            });
        if reaper.is_err() {
            tracing::warn!(
                target: "airlock::spawn",
                pid = self.pid,
                "no thread to reap a killed worker; it stays a zombie until the host exits"
            );
        }
    }
}

/// `waitid(P_PIDFD, WEXITED | options)`: the child's status once it has ended and been
/// reaped; `None` with `NOHANG` while it runs.
fn reap(pidfd: &OwnedFd, options: WaitIdOptions) -> io::Result<Option<ExitStatus>> {
    loop {
        match waitid(
            WaitId::PidFd(pidfd.as_fd()),
            WaitIdOptions::EXITED | options,
        ) {
            Ok(status) => return Ok(status.map(|status| exit_status(&status))),
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
}

/// A `waitid` result as the wait status `std` decodes: the exit code in bits 8-15, or the
/// terminating signal in bits 0-6 (with 0x80 when it dumped core).
fn exit_status(status: &rustix::process::WaitIdStatus) -> ExitStatus {
    let raw = match (status.exit_status(), status.terminating_signal()) {
        (Some(code), _) => (code & 0xff) << 8,
        (None, Some(signal)) => (signal & 0x7f) | if status.dumped() { 0x80 } else { 0 },
        (None, None) => 0,
    };
    ExitStatus::from_raw(raw)
}

/// The host's ends of a worker's stdio: what it writes to the worker's stdin and reads from
/// its stdout (on the pipe transport) and its stderr.
#[derive(Debug, Default)]
pub(crate) struct WorkerStdio {
    pub(crate) stdin: Option<OwnedFd>,
    pub(crate) stdout: Option<pipe::Receiver>,
    /// The host's end of the worker's stderr pipe, read on a thread of its own.
    pub(crate) stderr: Option<std::os::fd::OwnedFd>,
}

impl WorkerStdio {
    /// Takes the piped stdio out of a child tokio forked.
    pub(crate) fn take_from(child: &mut tokio::process::Child) -> io::Result<Self> {
        Ok(Self {
            stdin: child
                .stdin
                .take()
                .map(tokio::process::ChildStdin::into_owned_fd)
                .transpose()?,
            stdout: child
                .stdout
                .take()
                .map(|end| end.into_owned_fd().and_then(pipe::Receiver::from_owned_fd))
                .transpose()?,
            stderr: child
                .stderr
                .take()
                .map(tokio::process::ChildStderr::into_owned_fd)
                .transpose()?,
        })
    }
}
