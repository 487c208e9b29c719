//! Reading a descriptor registered with the runtime into an adaptive, zero-initialised window
//! of the caller's buffer: the read loop under the worker's pipe reader ([`PipeReader`]) and
//! the socket transport's read half.
//!
//! Safe code cannot read into uninitialised memory, so the window is zeroed first. To keep that
//! within about twice the bytes read, the window starts at 4 KiB, doubles while reads fill it
//! and shrinks to what a short read returned. (Reading the whole of a receiver's 64 KiB
//! scratch buffer at once, which needs no zeroing, measured no faster over a pipe.) A short
//! read means the descriptor is drained, so the reader goes straight back to the event loop
//! instead of paying for a read that fails with `EAGAIN`: tokio's own inference for its pipes
//! and sockets.
//!
//! [`PipeReader`]: crate::PipeReader

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{Interest, ReadBuf};

/// Smallest window: 4 KiB, zeroed in well under the cost of a system call.
const MIN_WINDOW: usize = ReadWindow::FIRST;
/// Largest window: 1 MiB, several pipe or socket buffers' worth.
const MAX_WINDOW: usize = 1 << 20;

/// A descriptor registered for readability only, and the window its next read may fill.
#[derive(Debug)]
pub struct ReadWindow {
    fd: AsyncFd<OwnedFd>,
    window: usize,
}

impl ReadWindow {
    /// The window of a fresh reader's first read, in bytes: also the smallest it shrinks to.
    pub const FIRST: usize = 4096;

    /// Registers `fd` with the current runtime's event loop for readability only. `fd` must be
    /// non-blocking, or be read only in ways that never wait. Must be called inside a tokio
    /// runtime with I/O enabled.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            fd: register(fd, Interest::READABLE)?,
            window: MIN_WINDOW,
        })
    }

    /// The descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }

    /// Reads into `buf` once the descriptor is readable, with `read_now`: one read of at most
    /// the slice's length that fails with `EAGAIN` (`WouldBlock`) rather than wait, retried on
    /// `EINTR` by the caller's function. Zero bytes read is the end of the stream.
    pub fn poll_read_with(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        read_now: impl Fn(BorrowedFd<'_>, &mut [u8]) -> io::Result<usize>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let want = self.window.min(buf.remaining());
            let dst = buf.initialize_unfilled_to(want);
            match guard.try_io(|fd| read_now(fd.get_ref().as_fd(), dst)) {
                Ok(Ok(read)) => {
                    if read == want {
                        // Filled: maybe more is queued; read more next time.
                        self.window = (want * 2).clamp(MIN_WINDOW, MAX_WINDOW);
                    } else if read > 0 {
                        // Short: drained, so the next read would fail with `EAGAIN`.
                        // (Readiness from events newer than this guard is kept.)
                        guard.clear_ready();
                        self.window = read.clamp(MIN_WINDOW, MAX_WINDOW);
                    }
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(err)) => return Poll::Ready(Err(err)),
                Err(_would_block) => continue, // readiness cleared; wait for the next event
            }
        }
    }
}

/// Registers `fd` with the runtime's event loop for `interest` only.
///
/// tokio 1.54 deprecated the safe `AsyncFd::with_interest` in favour of an `unsafe` one,
/// because a generic `T` could hand out a different or closed descriptor from `as_raw_fd`
/// while registered. `OwnedFd` cannot: it owns the descriptor, keeps it open until dropped,
/// and always returns the same number; and this crate only ever reads it through `get_ref`.
#[allow(deprecated)]
pub(crate) fn register(fd: OwnedFd, interest: Interest) -> io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::with_interest(fd, interest)
}
