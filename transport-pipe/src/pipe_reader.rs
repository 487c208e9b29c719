//! The worker's read end of its channel pipe, readable by the runtime without ever blocking and,
//! where the kernel allows, by one blocking `read` while the worker waits for the host.
//!
//! A descriptor's blocking mode belongs to its open file description, which a duplicate shares.
//! A worker that waits for the host in the OS while idle ([`FrameReceiver::wait_blocking`])
//! needs one system call for that wait if the description is blocking (`read`), two if it is
//! not (`ppoll`, then `read`). The runtime's own reads of the same description must never
//! block, or its thread would stop in a read while a handler's answer waits to be written. So
//! the reader ([`BlockingDescription`]) leaves the description blocking only where the kernel
//! takes `preadv2` with `RWF_NOWAIT` on a pipe: a read that fails with `EAGAIN` on an empty
//! pipe whatever the description's mode. It then makes every read of the runtime's that way.
//! Where the kernel refuses the flag (`EOPNOTSUPP`), the description stays non-blocking and the
//! wait polls first, as any other stream's does.
//!
//! Reads go into an adaptive window of the caller's buffer ([`ReadWindow`]).
//!
//! [`FrameReceiver::wait_blocking`]: airlock_protocol::transport::FrameReceiver::wait_blocking
//! [`ReadWindow`]: crate::ReadWindow
//! [`BlockingDescription`]: crate::BlockingDescription

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use rustix::fs::{fstat, FileType};
use rustix::io::{ioctl_fionbio, preadv2, Errno, ReadWriteFlags};
use tokio::io::{AsyncRead, ReadBuf};

use crate::{BlockingDescription, ReadWindow};

/// How many bytes the probe for `RWF_NOWAIT` may take from the pipe (kept, and returned first).
const PROBE_BYTES: usize = 256;

/// `preadv2`'s offset that means "the current position", the only one a pipe has.
const CURRENT_POSITION: u64 = u64::MAX;

/// The read half of a worker's channel pipe (see the module docs). Dropping it closes the
/// descriptor.
#[derive(Debug)]
pub struct PipeReader {
    read: ReadWindow,
    /// Reads pass `RWF_NOWAIT`: the description may be blocking.
    nowait: bool,
    /// Bytes the probe for `RWF_NOWAIT` read, returned before anything read after them.
    probed: Vec<u8>,
}

impl PipeReader {
    /// Reads `fd`, the read end of a pipe, made non-blocking and registered with the current
    /// runtime for readability only. Must be called inside a tokio runtime with I/O enabled.
    /// Fails with [`io::ErrorKind::InvalidInput`] if `fd` is not a pipe.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        if FileType::from_raw_mode(fstat(&fd)?.st_mode) != FileType::Fifo {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the channel's read end is not a pipe",
            ));
        }
        ioctl_fionbio(&fd, true)?;
        Ok(Self {
            read: ReadWindow::new(fd)?,
            nowait: false,
            probed: Vec::new(),
        })
    }
}

impl BlockingDescription for PipeReader {
    /// Leaves the pipe's open file description blocking, so that a wait on it in the OS can be
    /// one `read`, if this kernel lets the reader's own reads stay non-blocking on it; returns
    /// whether it did. Every later read of this reader's then passes `RWF_NOWAIT`. A probe read
    /// decides it: what it takes from the pipe is returned first by the next read. Errors only
    /// if the probe read fails for another reason than the flag.
    fn make_description_blocking(&mut self) -> io::Result<bool> {
        if self.nowait {
            return Ok(true);
        }
        let mut probe = [0u8; PROBE_BYTES];
        match read_nowait(self.read.fd(), &mut probe) {
            Ok(read) => self
                .probed
                .extend_from_slice(probe.get(..read).unwrap_or_default()),
            Err(Errno::AGAIN) => {}
            // The kernel does not take the flag on a pipe (or a filter denies `preadv2`):
            // the description stays non-blocking and reads stay plain.
            Err(err) if refuses_nowait(err) => return Ok(false),
            Err(err) => return Err(err.into()),
        }
        ioctl_fionbio(self.read.fd(), false)?;
        self.nowait = true;
        Ok(true)
    }
}

/// Whether this kernel takes `RWF_NOWAIT` on a pipe's reads, asked of a fresh, empty pipe of
/// its own: where it does, a [`PipeReader`] leaves its pipe's description blocking
/// ([`BlockingDescription`]) and a worker's idle wait is one `read`. Errors only if no pipe can be
/// made or the read fails otherwise (a seccomp filter that denies `preadv2` reads as "no").
pub fn kernel_takes_nowait_on_pipes() -> io::Result<bool> {
    let (read, _write) = rustix::pipe::pipe()?;
    match read_nowait(read.as_fd(), &mut [0u8; 1]) {
        Err(Errno::AGAIN) => Ok(true),
        Err(err) if refuses_nowait(err) => Ok(false),
        Ok(_) => Err(io::Error::other("an empty pipe gave bytes")),
        Err(err) => Err(err.into()),
    }
}

/// Whether a read with `RWF_NOWAIT` failed with `err` because the flag (or `preadv2`) is refused.
fn refuses_nowait(err: Errno) -> bool {
    matches!(
        err,
        Errno::OPNOTSUPP | Errno::NOSYS | Errno::PERM | Errno::INVAL
    )
}

/// One read of at most `dst.len()` bytes that fails with `EAGAIN` rather than wait, even on a
/// blocking description if `nowait`.
fn read_now(fd: BorrowedFd<'_>, dst: &mut [u8], nowait: bool) -> io::Result<usize> {
    loop {
        let read = if nowait {
            read_nowait(fd, dst)
        } else {
            rustix::io::read(fd, &mut *dst)
        };
        match read {
            Err(Errno::INTR) => continue,
            other => return Ok(other?),
        }
    }
}

/// `preadv2(fd, dst, current position, RWF_NOWAIT)`.
fn read_nowait(fd: BorrowedFd<'_>, dst: &mut [u8]) -> rustix::io::Result<usize> {
    preadv2(
        fd,
        &mut [IoSliceMut::new(dst)],
        CURRENT_POSITION,
        ReadWriteFlags::NOWAIT,
    )
}

/// The pipe's descriptor, for [`StreamTransport::with_blocking_wait`](crate::StreamTransport::with_blocking_wait)
/// (which duplicates it).
impl AsFd for PipeReader {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.read.fd()
    }
}

impl AsyncRead for PipeReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.probed.is_empty() && buf.remaining() > 0 {
            let given = this.probed.len().min(buf.remaining());
            buf.put_slice(this.probed.get(..given).unwrap_or_default());
            this.probed.drain(..given);
            return Poll::Ready(Ok(()));
        }
        let nowait = this.nowait;
        this.read
            .poll_read_with(cx, buf, |fd, dst| read_now(fd, dst, nowait))
    }
}
