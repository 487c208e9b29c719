//! The worker's read end of its channel pipe, readable by the runtime without ever blocking and,
//! where the kernel allows, by one blocking `read` while the worker waits for the host.
//!
//! A descriptor's blocking mode belongs to its open file description, which a duplicate shares.
//! A worker that waits for the host in the OS while idle ([`FrameReceiver::wait_blocking`])
//! needs one system call for that wait if the description is blocking (`read`), two if it is
//! not (`ppoll`, then `read`). The runtime's own reads of the same description must never
//! block, or its thread would stop in a read while a handler's answer waits to be written. So
//! the reader ([`PipeReader::make_description_blocking`]) leaves the description blocking only
//! where the kernel honours `preadv2` with `RWF_NOWAIT` on a pipe (a read that fails with
//! `EAGAIN` on an empty pipe whatever the description's mode): its release is 6.4 or later and
//! the pipe takes the flag. It then makes every read of the runtime's that way. Elsewhere the
//! description stays non-blocking and the wait polls first, as any other stream's does.
//!
//! Reads go into an adaptive window of the caller's buffer ([`ReadWindow`]).
//!
//! [`FrameReceiver::wait_blocking`]: airlock_protocol::transport::FrameReceiver::wait_blocking
//! [`ReadWindow`]: crate::ReadWindow

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use rustix::fs::{fstat, FileType};
use rustix::io::{ioctl_fionbio, preadv2, Errno, ReadWriteFlags};
use tokio::io::{AsyncRead, ReadBuf};

use crate::ReadWindow;

/// How many bytes the read that asks the pipe whether it takes `RWF_NOWAIT` may take from it:
/// `PIPE_BUF`, so that a pipe in packet mode (`O_DIRECT`), where a read shorter than a packet
/// drops the rest of it, loses nothing.
const PROBE_BYTES: usize = 4096;

/// `preadv2`'s offset that means "the current position", the only one a pipe has.
const CURRENT_POSITION: u64 = u64::MAX;

/// The read half of a worker's channel pipe (see the module docs). Dropping it closes the
/// descriptor.
#[derive(Debug)]
pub struct PipeReader {
    read: ReadWindow,
    /// Reads pass `RWF_NOWAIT`: the description may be blocking.
    nowait: bool,
}

impl PipeReader {
    /// Reads `fd`, the read end of a pipe, made non-blocking and registered with the current
    /// runtime for readability only. Must be called inside a tokio runtime with I/O enabled.
    /// Fails with [`io::ErrorKind::InvalidInput`] if `fd` is not a pipe.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        let fd = nonblocking_pipe_end(fd, "read")?;
        Ok(Self {
            read: ReadWindow::new(fd)?,
            nowait: false,
        })
    }

    /// Leaves the pipe's open file description blocking, so that a wait on it in the OS can be
    /// one `read`, if this kernel honours `RWF_NOWAIT` on the pipe's reads; returns whether it
    /// did. Every later read of this reader's then passes `RWF_NOWAIT`. Whether the kernel
    /// honours the flag is told by its release ([`kernel_honours_nowait_on_pipes`]) and by a
    /// read of this pipe with the flag, made while the description is still non-blocking:
    /// what that read takes is appended to `taken`. Errors only if that read fails for another
    /// reason than the flag, or the mode cannot be set.
    pub fn make_description_blocking(&mut self, taken: &mut Vec<u8>) -> io::Result<bool> {
        if self.nowait {
            return Ok(true);
        }
        if !release_honours_nowait_on_pipes() {
            return Ok(false);
        }
        let mut probe = [0u8; PROBE_BYTES];
        match read_nowait(self.read.fd(), &mut probe) {
            Ok(read) => taken.extend_from_slice(probe.get(..read).unwrap_or_default()),
            Err(Errno::AGAIN) => {}
            // This pipe does not take the flag (or a filter denies `preadv2`): the description
            // stays non-blocking and reads stay plain.
            Err(err) if refuses_nowait(err) => return Ok(false),
            Err(err) => return Err(err.into()),
        }
        ioctl_fionbio(self.read.fd(), false)?;
        self.nowait = true;
        Ok(true)
    }
}

/// `fd`, one end of a pipe (`which`: "read" or "write", for the error), made non-blocking.
/// Fails with [`io::ErrorKind::InvalidInput`] if `fd` is not a pipe.
pub(crate) fn nonblocking_pipe_end(fd: OwnedFd, which: &str) -> io::Result<OwnedFd> {
    if FileType::from_raw_mode(fstat(&fd)?.st_mode) != FileType::Fifo {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the channel's {which} end is not a pipe"),
        ));
    }
    ioctl_fionbio(&fd, true)?;
    Ok(fd)
}

/// Whether this kernel honours `RWF_NOWAIT` on a pipe's reads: its release is Linux 6.4 or
/// later (its release candidates excepted: 6.4-rc1 took the flag on pipes without honouring
/// it, as gVisor does, which reports release 4.4), and a fresh, empty, non-blocking pipe of
/// its own takes the flag. Where it does, a [`PipeReader`] leaves its pipe's description
/// blocking ([`PipeReader::make_description_blocking`]) and a worker's idle wait is one
/// `read`. Errors only if no pipe can be made or the read fails otherwise (a seccomp filter
/// that denies `preadv2` reads as "no").
pub fn kernel_honours_nowait_on_pipes() -> io::Result<bool> {
    if !release_honours_nowait_on_pipes() {
        return Ok(false);
    }
    let (read, _write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::NONBLOCK)?;
    match read_nowait(read.as_fd(), &mut [0u8; 1]) {
        Err(Errno::AGAIN) => Ok(true),
        Err(err) if refuses_nowait(err) => Ok(false),
        Ok(_) => Err(io::Error::other("an empty pipe gave bytes")),
        Err(err) => Err(err.into()),
    }
}

/// Whether this kernel's release honours `RWF_NOWAIT` on pipe reads: Linux 6.4 and later. A
/// kernel that takes the flag need not honour it, and a probe cannot tell the two apart on an
/// empty pipe without risking the very wait it is about: Linux 6.4-rc1 set the flag's mark on
/// pipes (`afed6271f5b0`) a release candidate before their reads honoured it (`c04fe8e32f90`),
/// and gVisor, which reports release 4.4, takes the flag and ignores it. Older releases, 6.4's
/// release candidates, and a release this cannot read count as "no": the wait then polls
/// first.
fn release_honours_nowait_on_pipes() -> bool {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy();
    release_at_least_6_4(&release)
}

/// Whether kernel release string `release` (`6.18.44-…`) is 6.4 or later, 6.4's release
/// candidates excepted.
fn release_at_least_6_4(release: &str) -> bool {
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|part| part.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor))) = (numbers.next(), numbers.next()) else {
        return false;
    };
    // Release candidates of 6.4 count as older whatever their number: vendors spell them
    // `6.4.0-rc1`, `6.4.0-060400rc1-generic` or `6.4.0-0.rc1.fc39`.
    (major, minor) > (6, 4) || ((major, minor) == (6, 4) && !release.contains("rc"))
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
pub(crate) fn read_now(fd: BorrowedFd<'_>, dst: &mut [u8], nowait: bool) -> io::Result<usize> {
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
        let nowait = this.nowait;
        this.read
            .poll_read_with(cx, buf, |fd, dst| read_now(fd, dst, nowait))
    }
}

#[cfg(test)]
mod tests {
    use super::release_at_least_6_4;

    #[test]
    fn releases_from_6_4_honour_the_flag_but_its_release_candidates() {
        for (release, honours) in [
            ("6.18.44-fc-v1147", true),
            ("6.4.0", true),
            ("6.4.0-rc2", false),
            ("6.4.0-060400rc1-generic", false),
            ("6.4.0-0.rc1.20230508git.fc39.x86_64", false),
            ("6.4.15-200.fc38.x86_64", true),
            ("6.40.1", true),
            ("10.0.0", true),
            ("6.5.0-21-generic", true),
            ("7.0.1", true),
            ("6.4.0-rc1", false),
            ("6.3.13", false),
            ("5.15.0-91-generic", false),
            ("4.4.0", false),
            ("", false),
            ("six", false),
        ] {
            assert_eq!(release_at_least_6_4(release), honours, "{release}");
        }
    }
}
