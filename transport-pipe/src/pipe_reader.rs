//! The worker's read end of its channel pipe, readable by the runtime without ever blocking and,
//! where the kernel allows, by one blocking `read` while the worker waits for the host.
//!
//! A descriptor's blocking mode belongs to its open file description, which a duplicate shares.
//! A worker that waits for the host in the OS while idle ([`FrameReceiver::wait_blocking`])
//! needs one system call for that wait if the description is blocking (`read`), two if it is
//! not (`ppoll`, then `read`). The runtime's own reads of the same description must never
//! block, or its thread would stop in a read while a handler's answer waits to be written. So
//! [`PipeReader::make_description_blocking`] leaves the description blocking only where the
//! kernel takes `preadv2` with `RWF_NOWAIT` on a pipe: a read that fails with `EAGAIN` on an
//! empty pipe whatever the description's mode. It then makes every read of the runtime's that
//! way. Where the kernel refuses the flag (`EOPNOTSUPP`), the description stays non-blocking
//! and the wait polls first, as any other stream's does.
//!
//! Reads go into a window of the caller's buffer that is zero-initialised first (safe code
//! cannot read into uninitialised memory), as the socket transport's reader does: the window
//! starts at 4 KiB, doubles while reads fill it and shrinks to what a short read returned, so
//! zeroing stays within about twice the bytes read. Already initialised room is read into
//! whole. A short read means the pipe is drained, so the reader goes back to the event loop
//! instead of paying for a read that fails with `EAGAIN`.
//!
//! [`FrameReceiver::wait_blocking`]: airlock_protocol::transport::FrameReceiver::wait_blocking

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustix::fs::{fstat, FileType};
use rustix::io::{ioctl_fionbio, preadv2, Errno, ReadWriteFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, Interest, ReadBuf};

/// Smallest read window into uninitialised room: 4 KiB, zeroed in well under the cost of a
/// system call.
const MIN_WINDOW: usize = 4096;
/// Largest read window: 1 MiB, the most a pipe's buffer is enlarged to by default.
const MAX_WINDOW: usize = 1 << 20;

/// How many bytes the probe for `RWF_NOWAIT` may take from the pipe (kept, and returned first).
const PROBE_BYTES: usize = 256;

/// `preadv2`'s offset that means "the current position", the only one a pipe has.
const CURRENT_POSITION: u64 = u64::MAX;

/// The read half of a worker's channel pipe (see the module docs). Dropping it closes the
/// descriptor.
#[derive(Debug)]
pub struct PipeReader {
    fd: AsyncFd<OwnedFd>,
    /// Reads pass `RWF_NOWAIT`: the description may be blocking.
    nowait: bool,
    window: usize,
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
            fd: register(fd)?,
            nowait: false,
            window: MIN_WINDOW,
            probed: Vec::new(),
        })
    }

    /// Leaves the pipe's open file description blocking, so that a wait on it in the OS can be
    /// one `read`, if this kernel lets the reader's own reads stay non-blocking on it; returns
    /// whether it did. Every later read of this reader's then passes `RWF_NOWAIT`. A probe read
    /// decides it: what it takes from the pipe is returned first by the next read. Errors only
    /// if the probe read fails for another reason than the flag.
    pub fn make_description_blocking(&mut self) -> io::Result<bool> {
        if self.nowait {
            return Ok(true);
        }
        let mut probe = [0u8; PROBE_BYTES];
        match read_nowait(self.fd.get_ref().as_fd(), &mut probe) {
            Ok(read) => self
                .probed
                .extend_from_slice(probe.get(..read).unwrap_or_default()),
            Err(Errno::AGAIN) => {}
            // The kernel does not take the flag on a pipe (or a filter denies `preadv2`):
            // the description stays non-blocking and reads stay plain.
            Err(Errno::OPNOTSUPP | Errno::NOSYS | Errno::PERM | Errno::INVAL) => return Ok(false),
            Err(err) => return Err(err.into()),
        }
        ioctl_fionbio(self.fd.get_ref(), false)?;
        self.nowait = true;
        Ok(true)
    }

    /// One read of at most `dst.len()` bytes that fails with `EAGAIN` rather than wait.
    fn read_now(&self, dst: &mut [u8]) -> io::Result<usize> {
        let fd = self.fd.get_ref().as_fd();
        loop {
            let read = if self.nowait {
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

/// Registers `fd` with the runtime's event loop for readability.
///
/// tokio 1.54 deprecated the safe `AsyncFd::with_interest` in favour of an `unsafe` one,
/// because a generic `T` could hand out a different or closed descriptor from `as_raw_fd`
/// while registered. `OwnedFd` cannot: it owns the descriptor, keeps it open until dropped,
/// and always returns the same number; and this reader only ever reads it through `get_ref`.
#[allow(deprecated)]
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::with_interest(fd, Interest::READABLE)
}

/// The pipe's descriptor, for [`StreamTransport::with_blocking_wait`](crate::StreamTransport::with_blocking_wait)
/// (which duplicates it).
impl AsFd for PipeReader {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

impl AsyncRead for PipeReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if !this.probed.is_empty() {
            let given = this.probed.len().min(buf.remaining());
            buf.put_slice(this.probed.get(..given).unwrap_or_default());
            this.probed.drain(..given);
            return Poll::Ready(Ok(()));
        }
        loop {
            let mut guard = ready!(this.fd.poll_read_ready(cx))?;
            // Room already initialised is read into whole; only fresh room is windowed.
            let initialised = buf.initialized().len() - buf.filled().len();
            let want = initialised.max(this.window.min(buf.remaining()));
            let dst = buf.initialize_unfilled_to(want);
            match guard.try_io(|_| this.read_now(dst)) {
                Ok(Ok(read)) => {
                    if read == want {
                        // Filled: maybe more is queued; read more next time.
                        this.window = (want * 2).clamp(MIN_WINDOW, MAX_WINDOW);
                    } else if read > 0 {
                        // Short: the pipe is drained, so the next read would fail with
                        // `EAGAIN` (readiness from events newer than this guard is kept).
                        guard.clear_ready();
                        this.window = read.clamp(MIN_WINDOW, MAX_WINDOW);
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
