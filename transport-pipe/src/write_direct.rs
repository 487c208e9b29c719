//! Writing a descriptor straight away, without the runtime, while the OS takes the bytes at
//! once: the write loop under the pipe transport's writer ([`PipeWriter`]) and the socket
//! transport's write half.
//!
//! A write the OS takes at once needs nothing from the event loop, so each is one system call
//! with no readiness to check or clear around it. Only a write that fails with `EAGAIN` (the
//! buffer is full) turns to the event loop and waits for its word that there is room; writes
//! go straight to the descriptor again once one is taken whole. While writes come back partial
//! (a bulk transfer is under way) it keeps asking the event loop first.
//!
//! When the descriptor joins the event loop is the caller's choice:
//! - [`WriteDirect::registered`]: at once, for the writer's whole life (a pipe). Nothing is
//!   registered later, so a process forked from this one never adds a registration to the
//!   event loop it shares with its parent (its runtime's `epoll` instance, a copy of the same
//!   file), and a writer never needs a watch it could be refused once it runs (a sibling of
//!   the same uid may have used them all up, SECURITY.md).
//! - [`WriteDirect::while_full`]: only while the buffer is full, and let go once a write is
//!   taken whole (a Unix socket, which signals room each time its peer reads: a writer
//!   registered all the time would wake its runtime for nothing once per frame the peer reads).
//!   A process forked after such a writer was made does not register it, nor let go of a
//!   registration it inherited: a registration made there would hand the parent's event loop
//!   events for memory only the child has. Its write that has to wait fails instead. The
//!   process is told apart by its pid, so a child forked into a new PID namespace by a
//!   process that is PID 1 of its own is not (SECURITY.md). Dropping the writer in a forked
//!   child still removes the registration from the event loop the two share, as dropping any
//!   of the runtime's descriptors there does.
//!
//! [`PipeWriter`]: crate::PipeWriter

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::task::{ready, Context, Poll};

use rustix::process::{getpid, Pid};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::read_window::register;

/// A non-blocking descriptor written directly, asking the runtime for room only when the OS
/// has none (see the module docs).
#[derive(Debug)]
pub struct WriteDirect {
    state: WriteState,
    /// For a writer registered only while full: the process that made it, the only one that
    /// may register or let go of it.
    while_full_in: Option<Pid>,
}

#[derive(Debug)]
enum WriteState {
    /// Not registered: writes are made directly.
    Idle(OwnedFd),
    /// Registered: writes are made directly while the buffer has room (`full` false), and
    /// only once the event loop says there is room otherwise.
    Registered { fd: AsyncFd<OwnedFd>, full: bool },
    /// Transiently, while moving between the two (or after registration failed).
    Broken,
}

impl WriteDirect {
    /// Writes `fd` (non-blocking), registered with the current runtime's event loop for
    /// writability now, for its whole life. Must be called inside a tokio runtime with I/O
    /// enabled.
    pub fn registered(fd: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            state: WriteState::Registered {
                fd: register(fd, Interest::WRITABLE)?,
                full: false,
            },
            while_full_in: None,
        })
    }

    /// Writes `fd` (non-blocking), registered with the runtime's event loop only while the OS
    /// has no room, by the process that made it (see the module docs). May be made outside a
    /// runtime; a write that has to wait must be polled inside one with I/O enabled.
    pub fn while_full(fd: OwnedFd) -> Self {
        Self {
            state: WriteState::Idle(fd),
            while_full_in: Some(getpid()),
        }
    }

    /// The descriptor; `None` only after registering it with the event loop failed.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.state {
            WriteState::Idle(fd) => Some(fd.as_fd()),
            WriteState::Registered { fd, .. } => Some(fd.get_ref().as_fd()),
            WriteState::Broken => None,
        }
    }

    /// Whether this process may register or let go of the descriptor: it is registered for
    /// life, or this is the process that made it.
    fn may_change_registration(&self) -> bool {
        self.while_full_in.is_none_or(|maker| maker == getpid())
    }

    /// Writes `bufs` with `write_now`: one write that fails with `EAGAIN` (`WouldBlock`)
    /// rather than wait, retried on `EINTR` by the caller's function. `Pending` (with `cx`
    /// registered for the wake-up) while the OS has no room; an error once the descriptor
    /// could not be registered, or where this process may not register it.
    pub fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
        write_now: impl Fn(BorrowedFd<'_>, &[IoSlice<'_>]) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            match &mut self.state {
                WriteState::Idle(fd) => match write_now(fd.as_fd(), bufs) {
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                        if !self.may_change_registration() {
                            return Poll::Ready(Err(forked()));
                        }
                        let WriteState::Idle(fd) =
                            std::mem::replace(&mut self.state, WriteState::Broken)
                        else {
                            return Poll::Ready(Err(lost()));
                        };
                        self.state = WriteState::Registered {
                            fd: register(fd, Interest::WRITABLE)?,
                            full: true,
                        };
                    }
                    result => return Poll::Ready(result),
                },
                WriteState::Registered { fd, full } if !*full => {
                    match write_now(fd.get_ref().as_fd(), bufs) {
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => *full = true,
                        result => return Poll::Ready(result),
                    }
                }
                WriteState::Registered { fd, .. } => {
                    let mut guard = ready!(fd.poll_write_ready(cx))?;
                    let Ok(result) = guard.try_io(|fd| write_now(fd.get_ref().as_fd(), bufs))
                    else {
                        continue; // still full; readiness cleared
                    };
                    // A partial write means the buffer filled again: a bulk transfer is under
                    // way, so the next write asks the event loop first.
                    let requested: usize = bufs.iter().map(|b| b.len()).sum();
                    if matches!(result, Ok(written) if written < requested) {
                        return Poll::Ready(result);
                    }
                    // Taken whole (or a real error): writes go straight to the descriptor
                    // again, and a writer registered only while full leaves the event loop.
                    self.room_again();
                    return Poll::Ready(result);
                }
                WriteState::Broken => return Poll::Ready(Err(lost())),
            }
        }
    }

    /// A write was taken whole: the next is made directly.
    fn room_again(&mut self) {
        if self.while_full_in.is_none() || !self.may_change_registration() {
            if let WriteState::Registered { full, .. } = &mut self.state {
                *full = false;
            }
            return;
        }
        let WriteState::Registered { fd, .. } =
            std::mem::replace(&mut self.state, WriteState::Broken)
        else {
            return;
        };
        self.state = WriteState::Idle(fd.into_inner());
    }
}

fn lost() -> io::Error {
    io::Error::other("the writer lost its descriptor: registering it with the runtime failed")
}

fn forked() -> io::Error {
    io::Error::other(
        "this writer can wait for room only in the process that made it: a process forked \
         from it shares its runtime's event loop, where it must not register the descriptor",
    )
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::io::Read;

    use rustix::pipe::{pipe_with, PipeFlags};

    use super::*;

    fn write_now(
        writer: &mut WriteDirect,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        writer.poll_write_with(cx, &[IoSlice::new(bytes)], |fd, bufs| {
            rustix::io::writev(fd, bufs).map_err(io::Error::from)
        })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap()
    }

    /// Fills the pipe through `writer`, until a write has to wait; returns the bytes written.
    fn fill(writer: &mut WriteDirect) -> usize {
        let chunk = [7u8; 4096];
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut filled = 0;
        while let Poll::Ready(wrote) = write_now(writer, &mut cx, &chunk) {
            filled += wrote.unwrap();
        }
        filled
    }

    /// Drains `filled` bytes on another thread while `writer`'s waiting write of 4 KiB goes
    /// through once there is room.
    async fn drain_and_write(writer: &mut WriteDirect, reader: std::fs::File, filled: usize) {
        let mut reader = reader;
        let drained = std::thread::spawn(move || {
            let mut sink = vec![0u8; filled];
            reader.read_exact(&mut sink).unwrap();
            reader
        });
        let chunk = [7u8; 4096];
        let wrote = poll_fn(|cx| write_now(writer, cx, &chunk)).await.unwrap();
        assert_eq!(wrote, chunk.len());
        drained.join().unwrap();
    }

    #[test]
    fn a_writer_registered_while_full_writes_with_no_runtime_while_there_is_room() {
        let (read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
        let mut writer = WriteDirect::while_full(write);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // No runtime exists here: registering would fail, so the write was made directly.
        let wrote = write_now(&mut writer, &mut cx, b"frame");
        assert!(matches!(wrote, Poll::Ready(Ok(5))), "{wrote:?}");
        assert!(matches!(writer.state, WriteState::Idle(_)));
        let mut got = [0u8; 5];
        std::fs::File::from(read).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"frame");
    }

    #[test]
    fn a_writer_registered_while_full_waits_for_room_then_leaves_the_event_loop() {
        runtime().block_on(async {
            let (read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
            let mut writer = WriteDirect::while_full(write);
            let filled = fill(&mut writer);
            assert!(matches!(
                writer.state,
                WriteState::Registered { full: true, .. }
            ));
            drain_and_write(&mut writer, std::fs::File::from(read), filled).await;
            assert!(matches!(writer.state, WriteState::Idle(_)));
        });
    }

    #[test]
    fn a_writer_registered_for_life_waits_for_room_then_writes_directly_and_stays() {
        runtime().block_on(async {
            let (read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
            let mut writer = WriteDirect::registered(write).unwrap();
            let filled = fill(&mut writer);
            assert!(matches!(
                writer.state,
                WriteState::Registered { full: true, .. }
            ));
            drain_and_write(&mut writer, std::fs::File::from(read), filled).await;
            // Still registered (nothing to add or remove later), writing directly again.
            assert!(matches!(
                writer.state,
                WriteState::Registered { full: false, .. }
            ));
        });
    }

    #[test]
    fn a_writer_registered_while_full_is_not_registered_by_another_process() {
        runtime().block_on(async {
            let (_read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
            let mut writer = WriteDirect::while_full(write);
            // As if this process were a fork of the writer's maker.
            let maker = writer
                .while_full_in
                .map(|pid| pid.as_raw_nonzero().get() + 1);
            writer.while_full_in = maker.and_then(Pid::from_raw);
            let chunk = [7u8; 4096];
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let refused = loop {
                match write_now(&mut writer, &mut cx, &chunk) {
                    Poll::Ready(Ok(_)) => {}
                    Poll::Ready(Err(err)) => break err,
                    Poll::Pending => panic!("it registered the descriptor"),
                }
            };
            assert!(refused.to_string().contains("forked"), "{refused}");
            assert!(matches!(writer.state, WriteState::Idle(_)));
        });
    }
}
