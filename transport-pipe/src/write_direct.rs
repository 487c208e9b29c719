//! Writing a descriptor without the runtime while the OS takes the bytes at once: the write
//! loop under the pipe transport's writer ([`PipeWriter`]) and the socket transport's write
//! half.
//!
//! A write the OS takes at once needs nothing from the event loop. So the descriptor is not
//! registered at all while writes succeed: each is one system call, with no readiness to check
//! or clear first. Only a write that fails with `EAGAIN` (the pipe or socket buffer is full)
//! registers it, for writability, and the writer waits for the event loop's word that there is
//! room. It stays registered while writes come back partial (a bulk transfer is under way, and
//! the next write will fill the buffer again) and leaves the event loop once a write is taken
//! whole.
//!
//! [`PipeWriter`]: crate::PipeWriter

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::read_window::register;

/// A non-blocking descriptor written directly, registered with the runtime only while the OS
/// has no room (see the module docs).
#[derive(Debug)]
pub struct WriteDirect {
    state: WriteState,
}

#[derive(Debug)]
enum WriteState {
    /// Not registered: writes are made directly.
    Idle(OwnedFd),
    /// The buffer was full: registered for writability until a write is taken whole.
    Waiting(AsyncFd<OwnedFd>),
    /// Transiently, while moving between the two (or after registration failed).
    Broken,
}

impl WriteDirect {
    /// Writes `fd`, which must be non-blocking. Registers nothing until a write has to wait,
    /// so it may be made outside a runtime; a write that has to wait must be polled inside one
    /// with I/O enabled.
    pub fn new(fd: OwnedFd) -> Self {
        Self {
            state: WriteState::Idle(fd),
        }
    }

    /// The descriptor; `None` only after registering it with the event loop failed.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.state {
            WriteState::Idle(fd) => Some(fd.as_fd()),
            WriteState::Waiting(registered) => Some(registered.get_ref().as_fd()),
            WriteState::Broken => None,
        }
    }

    /// Writes `bufs` with `write_now`: one write that fails with `EAGAIN` (`WouldBlock`)
    /// rather than wait, retried on `EINTR` by the caller's function. `Pending` (with `cx`
    /// registered for the wake-up) while the OS has no room; an error once the descriptor
    /// could not be registered.
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
                        let WriteState::Idle(fd) =
                            std::mem::replace(&mut self.state, WriteState::Broken)
                        else {
                            return Poll::Ready(Err(lost()));
                        };
                        self.state = WriteState::Waiting(register(fd, Interest::WRITABLE)?);
                    }
                    result => return Poll::Ready(result),
                },
                WriteState::Waiting(registered) => {
                    let mut guard = ready!(registered.poll_write_ready(cx))?;
                    let Ok(result) = guard.try_io(|fd| write_now(fd.get_ref().as_fd(), bufs))
                    else {
                        continue; // still full; readiness cleared
                    };
                    // A partial write means the buffer filled again: a bulk transfer is under
                    // way, so it stays registered rather than registering again for every
                    // buffer-full.
                    let requested: usize = bufs.iter().map(|b| b.len()).sum();
                    if matches!(result, Ok(written) if written < requested) {
                        return Poll::Ready(result);
                    }
                    // Taken whole (or a real error): it leaves the event loop.
                    let WriteState::Waiting(registered) =
                        std::mem::replace(&mut self.state, WriteState::Broken)
                    else {
                        return Poll::Ready(Err(lost()));
                    };
                    self.state = WriteState::Idle(registered.into_inner());
                    return Poll::Ready(result);
                }
                WriteState::Broken => return Poll::Ready(Err(lost())),
            }
        }
    }
}

fn lost() -> io::Error {
    io::Error::other("the writer lost its descriptor: registering it with the runtime failed")
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::io::Read;

    use rustix::pipe::{pipe_with, PipeFlags};

    use super::*;

    fn write_all_now(
        writer: &mut WriteDirect,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        writer.poll_write_with(cx, &[IoSlice::new(bytes)], |fd, bufs| {
            rustix::io::writev(fd, bufs).map_err(io::Error::from)
        })
    }

    #[test]
    fn a_write_the_os_takes_at_once_needs_no_runtime() {
        let (read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
        let mut writer = WriteDirect::new(write);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // No runtime exists here: registering would fail, so the write was made directly.
        let wrote = write_all_now(&mut writer, &mut cx, b"frame");
        assert!(matches!(wrote, Poll::Ready(Ok(5))), "{wrote:?}");
        assert!(matches!(writer.state, WriteState::Idle(_)));
        let mut got = [0u8; 5];
        std::fs::File::from(read).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"frame");
    }

    #[test]
    fn a_full_pipe_waits_for_room_then_writes_directly_again() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
            let mut reader = std::fs::File::from(read);
            let mut writer = WriteDirect::new(write);
            let chunk = [7u8; 4096];
            // Fill the pipe: the write that finds no room registers and waits.
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let mut filled = 0;
            while let Poll::Ready(wrote) = write_all_now(&mut writer, &mut cx, &chunk) {
                filled += wrote.unwrap();
            }
            assert!(matches!(writer.state, WriteState::Waiting(_)));
            // Room comes once the reader drains the pipe; the waiting write then goes whole.
            let drained = std::thread::spawn(move || {
                let mut sink = vec![0u8; filled];
                reader.read_exact(&mut sink).unwrap();
                reader
            });
            let wrote = poll_fn(|cx| write_all_now(&mut writer, cx, &chunk))
                .await
                .unwrap();
            assert_eq!(wrote, chunk.len());
            drained.join().unwrap();
            // Taken whole: it has left the event loop, and the next write is direct again.
            assert!(matches!(writer.state, WriteState::Idle(_)));
        });
    }
}
