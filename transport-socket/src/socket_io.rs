//! The socket's two halves, as the async reader and writer under [`SocketTransport`].
//!
//! Why not tokio's `UnixStream` halves: tokio registers a stream socket for readability *and*
//! writability, edge-triggered. A Unix stream socket signals "writable" every time its peer
//! consumes data, so every frame the peer reads wakes the sender's runtime for nothing: one
//! spurious wake-up (two context switches) per message, which doubled the round-trip cost of
//! small frames. Here the read half is registered for readability only, and the write half
//! writes straight to the socket and learns of room through an `epoll` instance of its own,
//! which watches the socket only while its buffer is full
//! ([`WriteDirect::armed_while_full`]): the runtime hears nothing of the peer's reads
//! otherwise. Both register with the runtime as they are made, and never after.
//!
//! The read half reads into an adaptive window of the caller's buffer, zero-initialised first
//! so that no `unsafe` is needed to read into uninitialised memory
//! ([`ReadWindow`](airlock_transport_pipe::ReadWindow); a 64 MiB transfer measured ~88% of
//! tokio's own halves' throughput on one thread, small round trips ~30% faster). A short read
//! means the socket is drained, so the half goes straight back to the event loop instead of
//! paying for a read that fails with `EAGAIN`. The kernel also ends a read early at a message
//! carrying descriptors or from another process; only a misbehaving peer does that, and it
//! then delays only its own frames until it writes again or the host's deadline fires.
//!
//! Writes use `sendmsg` with `MSG_NOSIGNAL` (a peer that went away is an `EPIPE` error, never a
//! `SIGPIPE` in the host) and carry no control messages. Reads use `recv` with no control
//! buffer, so descriptors a peer attaches (`SCM_RIGHTS`) are never installed in this process;
//! the host's sockets refuse them before that (`raw_sockopt::refuse_passed_descriptors`).

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use airlock_transport_pipe::{ReadWindow, WriteDirect};
use rustix::io::{fcntl_dupfd_cloexec, ioctl_fionbio, Errno};
use rustix::net::{recv, sendmsg, shutdown, RecvFlags, SendAncillaryBuffer, SendFlags, Shutdown};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Splits a connected stream socket we own into its two halves. The write half gets its own
/// descriptor (a duplicate), so the two are watched independently. Must be
/// called inside a tokio runtime with I/O enabled.
pub(crate) fn split_socket(fd: OwnedFd) -> io::Result<(SocketReader, SocketWriter)> {
    ioctl_fionbio(&fd, true)?;
    let write_fd = fcntl_dupfd_cloexec(&fd, 0)?;
    let reader = SocketReader {
        read: ReadWindow::new(fd)?,
    };
    let writer = SocketWriter {
        write: WriteDirect::armed_while_full(write_fd)?,
        shut_down: false,
    };
    Ok((reader, writer))
}

/// The read half of a socket transport: registered with the event loop for readability only,
/// so a peer draining our writes never wakes us for nothing. Reads into an adaptive,
/// zero-initialised window of the caller's buffer, and never takes ancillary data.
#[derive(Debug)]
pub struct SocketReader {
    read: ReadWindow,
}

/// The socket's descriptor, for [`StreamTransport::with_blocking_wait`](airlock_transport_pipe::StreamTransport::with_blocking_wait)
/// (which duplicates it). Its `read`s, like `recv` without a control buffer, take no ancillary
/// data: descriptors a peer attaches are discarded by the kernel.
impl AsFd for SocketReader {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.read.fd()
    }
}

impl AsyncRead for SocketReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().read.poll_read_with(cx, buf, recv_now)
    }
}

/// One `recv` into `dst`, with no control buffer (descriptors a peer attaches are discarded);
/// the socket is non-blocking, so an empty one fails with `EAGAIN`.
fn recv_now(fd: BorrowedFd<'_>, dst: &mut [u8]) -> io::Result<usize> {
    loop {
        match recv(fd, &mut *dst, RecvFlags::empty()) {
            Err(Errno::INTR) => continue,
            other => return Ok(other?.0),
        }
    }
}

/// The write half of a socket transport. Writes go straight to the socket; only while the
/// socket buffer is full does the half wait for the runtime's word that there is room, through
/// an `epoll` instance of its own registered as the half is made
/// ([`WriteDirect::armed_while_full`]). Dropping it (or `shutdown`) ends the write direction:
/// the peer sees end of stream.
#[derive(Debug)]
pub struct SocketWriter {
    write: WriteDirect,
    shut_down: bool,
}

/// One `sendmsg` of `bufs` with `MSG_NOSIGNAL` and no control messages; the socket is
/// non-blocking, so a full one fails with `EAGAIN`.
fn send_slices(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    loop {
        match sendmsg(
            fd,
            bufs,
            &mut SendAncillaryBuffer::default(),
            SendFlags::NOSIGNAL,
        ) {
            Err(Errno::INTR) => continue,
            other => return Ok(other?),
        }
    }
}

impl AsyncWrite for SocketWriter {
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
        self.get_mut().write.poll_write_with(cx, bufs, send_slices)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let fd = self.write.fd();
        let result = match shutdown(fd, Shutdown::Write) {
            Ok(()) | Err(Errno::NOTCONN) => Ok(()),
            Err(err) => Err(err.into()),
        };
        self.shut_down = true;
        Poll::Ready(result)
    }
}

impl Drop for SocketWriter {
    fn drop(&mut self) {
        // The read half holds the socket open, so closing our descriptor alone would not end
        // the stream: shut the write direction down explicitly, as a dropped writer should.
        if !self.shut_down {
            let _ = shutdown(self.write.fd(), Shutdown::Write);
        }
    }
}
