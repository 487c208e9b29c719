//! The write end of a channel pipe, on either side: frames are written with one `writev`
//! each, straight away, and the runtime is asked for room only when the pipe is full
//! ([`WriteDirect`]).
//!
//! tokio's own pipe sender checks and clears the descriptor's readiness around every write;
//! a small call's frame then costs the caller that bookkeeping on top of the system call.
//! Here a write the pipe takes at once is the system call alone. The descriptor is registered
//! with the runtime once, when the writer is made, as tokio's sender does
//! ([`WriteDirect::registered`]): a pipe signals room only when it was full, so the
//! registration never wakes the runtime for nothing.

use std::io::{self, IoSlice};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use rustix::io::{writev, Errno};
use tokio::io::AsyncWrite;

use crate::pipe_reader::nonblocking_pipe_end;
use crate::WriteDirect;

/// The write end of a pipe (see the module docs). Dropping it closes the descriptor, which
/// the reader sees as the end of the stream.
#[derive(Debug)]
pub struct PipeWriter {
    write: WriteDirect,
}

impl PipeWriter {
    /// Writes `fd`, the write end of a pipe, made non-blocking and registered with the current
    /// runtime's event loop for writability. Must be called inside a tokio runtime with I/O
    /// enabled. Fails with [`io::ErrorKind::InvalidInput`] if `fd` is not a pipe.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        let fd = nonblocking_pipe_end(fd, "write")?;
        Ok(Self {
            write: WriteDirect::registered(fd)?,
        })
    }
}

/// One `writev` of `bufs`; the pipe is non-blocking, so a full one fails with `EAGAIN`. A
/// reader that is gone is an `EPIPE` error (the process ignores `SIGPIPE`, as Rust programs
/// do from their start).
fn writev_now(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    loop {
        match writev(fd, bufs) {
            Err(Errno::INTR) => continue,
            other => return Ok(other?),
        }
    }
}

impl AsyncWrite for PipeWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().write.poll_write_with(cx, bufs, writev_now)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Nothing to do: a pipe has no half-close; dropping the writer ends the stream.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
