//! Frames over any byte stream: the framing both transports share.
//!
//! A [`StreamTransport`] wraps an async reader and writer (pipe ends, a socket's halves). The
//! receiver owns a [`FrameDecoder`] and reads straight into its buffer, so a frame's bytes are
//! copied once, by the kernel; the sender writes a whole batch of frames with vectored writes
//! under a deadline, so a peer that stops reading cannot hold the writer forever.

use std::future::Future;
use std::io::IoSlice;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use airlock_protocol::transport::{FrameReceiver, FrameSender, SendProgress, Transport};
use airlock_protocol::{FrameDecoder, Transmit, TransportError, DEFAULT_MAX_FRAME};
use async_trait::async_trait;
use bytes::Bytes;
use rustix::event::{poll, PollFd, PollFlags};
use rustix::io::Errno;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::PipeReader;

/// Default for [`StreamConfig::send_timeout`]: the protocol's one send deadline (5 seconds).
pub use airlock_protocol::DEFAULT_SEND_TIMEOUT;

/// Smallest read the receiver asks the OS for: 64 KiB, a typical pipe's whole buffer.
pub const READ_CHUNK: usize = 64 * 1024;

/// How a stream transport bounds its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamConfig {
    /// Frames longer than this are refused from their length prefix. Default
    /// [`DEFAULT_MAX_FRAME`].
    pub max_frame: u32,
    /// Longest a batch may take to be written. Default [`DEFAULT_SEND_TIMEOUT`].
    pub send_timeout: Duration,
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_MAX_FRAME,
            send_timeout: DEFAULT_SEND_TIMEOUT,
        }
    }
}

/// A [`Transport`] over a reader and a writer.
#[derive(Debug)]
pub struct StreamTransport<R, W> {
    reader: R,
    writer: W,
    config: StreamConfig,
    direct_fd: Option<OwnedFd>,
    wait_reads_block: bool,
    /// Bytes the reader took while setting up the wait
    /// ([`PipeReader::make_description_blocking`]), handed to the receiver's decoder before
    /// anything read after them.
    early: Vec<u8>,
}

impl<R, W> StreamTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    /// Frames over `reader` (from the peer) and `writer` (to the peer).
    pub fn new(reader: R, writer: W, config: StreamConfig) -> Self {
        Self {
            reader,
            writer,
            config,
            direct_fd: None,
            wait_reads_block: false,
            early: Vec::new(),
        }
    }
}

impl<R: AsFd, W> StreamTransport<R, W> {
    /// Lets the receiver wait for input without its runtime, on a duplicate of the reader's
    /// descriptor ([`FrameReceiver::wait_blocking`]): for a loop that owns its thread. It can
    /// then also [`read_now`](FrameReceiver::read_now). Fails only if the descriptor cannot be
    /// duplicated.
    pub fn with_blocking_wait(mut self) -> std::io::Result<Self> {
        self.duplicate_reader()?;
        Ok(self)
    }

    /// Lets the receiver read without its runtime ([`FrameReceiver::read_now`]), on a
    /// duplicate of the reader's descriptor, which stays non-blocking: for a loop that polls
    /// for input on a thread it shares with other tasks. Where the descriptor cannot be
    /// duplicated (none left to the process) the receiver cannot read so, as
    /// [`reads_now`](FrameReceiver::reads_now) then says, and reads only through the runtime.
    #[must_use]
    pub fn with_direct_reads(mut self) -> Self {
        // The failure is reported by `reads_now`, which a loop that would poll so must ask.
        let _ = self.duplicate_reader();
        self
    }

    fn duplicate_reader(&mut self) -> std::io::Result<()> {
        if self.direct_fd.is_none() {
            self.direct_fd = Some(rustix::io::fcntl_dupfd_cloexec(self.reader.as_fd(), 3)?);
        }
        Ok(())
    }
}

impl<W> StreamTransport<PipeReader, W> {
    /// As [`with_blocking_wait`](Self::with_blocking_wait), and the wait is one blocking `read`
    /// instead of `ppoll` and `read` where the kernel honours `RWF_NOWAIT` on the pipe
    /// ([`PipeReader::make_description_blocking`]); elsewhere it polls first, as any stream's
    /// wait does. (Only a pipe: a blocking `read` of a Unix socket measured slower than `ppoll`
    /// and `read`.) Fails only if the descriptor cannot be duplicated or its mode set.
    pub fn with_blocking_read(mut self) -> std::io::Result<Self> {
        self.wait_reads_block = self.reader.make_description_blocking(&mut self.early)?;
        self.with_blocking_wait()
    }
}

impl<R, W> Transport for StreamTransport<R, W>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Sender = StreamSender<W>;
    type Receiver = StreamReceiver<R>;

    fn split(self) -> (StreamSender<W>, StreamReceiver<R>) {
        let mut decoder = FrameDecoder::new(self.config.max_frame);
        decoder.extend(&self.early);
        (
            StreamSender {
                writer: Some(self.writer),
                send_timeout: self.config.send_timeout,
            },
            StreamReceiver {
                reader: self.reader,
                decoder,
                scratch: Vec::new(),
                direct_fd: self.direct_fd,
                wait_reads_block: self.wait_reads_block,
                deferred: None,
            },
        )
    }
}

/// The write half of a [`StreamTransport`].
#[derive(Debug)]
pub struct StreamSender<W> {
    /// `None` once closed: dropping the writer is what ends the stream for a pipe, whose
    /// `shutdown` does nothing.
    writer: Option<W>,
    send_timeout: Duration,
}

/// The read half of a [`StreamTransport`].
#[derive(Debug)]
pub struct StreamReceiver<R> {
    reader: R,
    decoder: FrameDecoder,
    /// Where small reads land before they are appended to the decoder (allocated on first
    /// use, [`READ_CHUNK`] bytes): one large read serves many small frames, and the decoder's
    /// buffer never needs spare capacity for them.
    scratch: Vec<u8>,
    /// A duplicate of the reader's descriptor, for reads and waits without the runtime
    /// ([`StreamTransport::with_direct_reads`], [`StreamTransport::with_blocking_wait`]).
    direct_fd: Option<OwnedFd>,
    /// The wait's descriptor is blocking, and the reader's own reads never block on it
    /// ([`StreamTransport::with_blocking_read`]): the wait is one `read`, with no poll first.
    wait_reads_block: bool,
    /// A read error [`FrameReceiver::wait_blocking`] met, reported by the next `poll_recv`
    /// once the frames before it are returned: some errors are reported only once (a socket's
    /// `ECONNRESET`; later reads see the end of the stream), so it is kept, not met again.
    deferred: Option<std::io::Error>,
}

/// The receiver's scratch buffer, allocated on first use.
fn scratch_buffer(scratch: &mut Vec<u8>) -> &mut [u8] {
    if scratch.is_empty() {
        *scratch = vec![0; READ_CHUNK];
    }
    scratch
}

impl<R> StreamReceiver<R> {
    /// Appends the first `read` bytes of the scratch buffer, just read into it, to the decoder.
    fn keep_scratch(&mut self, read: usize) {
        if let Some(bytes) = self.scratch.get(..read) {
            self.decoder.extend(bytes);
        }
    }
}

fn io_error(err: std::io::Error) -> TransportError {
    TransportError::Io(Box::new(err))
}

/// Slices gathered on the stack for one vectored write; a larger batch is written in turns.
const SLICES_PER_WRITE: usize = 64;

/// Frames in a batch whose slices fit the small array (two slices a frame: head and body).
const SMALL_BATCH: usize = 4;

/// One vectored write of what `progress` has not yet written of `batch`, gathering up to `N`
/// slices.
fn write_unwritten<const N: usize, W: AsyncWrite + Unpin>(
    writer: &mut W,
    cx: &mut Context<'_>,
    batch: &[Transmit],
    progress: &mut SendProgress,
) -> Poll<std::io::Result<usize>> {
    let mut slices = [IoSlice::new(&[]); N];
    let count = progress.unwritten(batch, &mut slices);
    let slices = slices.get(..count).unwrap_or_default();
    Pin::new(writer).poll_write_vectored(cx, slices)
}

#[async_trait]
impl<W: AsyncWrite + Unpin + Send> FrameSender for StreamSender<W> {
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        batch: &[Transmit],
        progress: &mut SendProgress,
    ) -> Poll<Result<(), TransportError>> {
        let Some(writer) = self.writer.as_mut() else {
            return Poll::Ready(Err(TransportError::Closed));
        };
        let total: usize = batch.iter().map(Transmit::len).sum();
        loop {
            let step = if progress.written < total {
                // Most batches are a frame or two: their slices are gathered in a small array,
                // not one whose every slot is set up for a write that uses two of them.
                let wrote = if batch.len() <= SMALL_BATCH {
                    write_unwritten::<{ 2 * SMALL_BATCH }, W>(writer, cx, batch, progress)
                } else {
                    write_unwritten::<SLICES_PER_WRITE, W>(writer, cx, batch, progress)
                };
                match wrote {
                    Poll::Ready(Ok(0)) => Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => {
                        progress.written += n;
                        continue;
                    }
                    Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
                    Poll::Pending => Poll::Pending,
                }
            } else {
                Pin::new(&mut *writer).poll_flush(cx)
            };
            return match step {
                Poll::Ready(done) => {
                    progress.deadline = None;
                    Poll::Ready(done.map_err(io_error))
                }
                // The OS has no room: from now on the batch is under the send deadline (a
                // timer, armed only for a write that has to wait).
                Poll::Pending => {
                    let timeout = self.send_timeout;
                    let deadline = progress
                        .deadline
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                    match deadline.as_mut().poll(cx) {
                        Poll::Ready(()) => Poll::Ready(Err(TransportError::SendTimeout)),
                        Poll::Pending => Poll::Pending,
                    }
                }
            };
        }
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        let Some(mut writer) = self.writer.take() else {
            return Ok(());
        };
        // `shutdown` flushes and, for sockets, half-closes; dropping the writer then closes
        // the descriptor, which is what a pipe's reader sees as end of stream.
        let result = tokio::time::timeout(self.send_timeout, writer.shutdown()).await;
        drop(writer);
        match result {
            Ok(result) => result.map_err(io_error),
            Err(_) => Err(TransportError::SendTimeout),
        }
    }
}

#[async_trait]
impl<R: AsyncRead + Unpin + Send> FrameReceiver for StreamReceiver<R> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, TransportError>> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                return Poll::Ready(Ok(Some(frame)));
            }
            if let Some(err) = self.deferred.take() {
                return Poll::Ready(Err(io_error(err)));
            }
            let wanted = self.decoder.wanted();
            // Each read is a future polled once, here: tokio's reads are cancel-safe, so one
            // that is not ready loses nothing and registers `cx` for the wake-up.
            let read = if wanted > READ_CHUNK {
                // The rest of a large frame: read straight into the frame's buffer (the one
                // copy this side makes), reserving at most what has already arrived again
                // (growth may round that up to twice), so its capacity stays within about four
                // times the bytes that really came, and ends within about twice the frame.
                // Never past the frame: its buffer holds that frame alone.
                let buffered = self.decoder.buffered();
                let want = wanted.min(buffered.max(READ_CHUNK));
                let buf = self.decoder.read_buffer();
                buf.reserve(want);
                let mut within_frame = bytes::BufMut::limit(buf, want);
                let read = std::pin::pin!(self.reader.read_buf(&mut within_frame)).poll(cx);
                std::task::ready!(read).map_err(io_error)?
            } else {
                // Prefixes and small frames: one read into the scratch buffer takes whatever
                // the peer has written (often many frames), then it is appended.
                let scratch = scratch_buffer(&mut self.scratch);
                let read = std::pin::pin!(self.reader.read(scratch)).poll(cx);
                let read = std::task::ready!(read).map_err(io_error)?;
                self.keep_scratch(read);
                read
            };
            if read == 0 {
                self.decoder.finish()?;
                return Poll::Ready(Ok(None));
            }
        }
    }

    fn recv_buffered(&mut self) -> Option<Result<Option<Bytes>, TransportError>> {
        match self.decoder.next_frame() {
            Ok(Some(frame)) => Some(Ok(Some(frame))),
            Ok(None) => self.deferred.take().map(|err| Err(io_error(err))),
            Err(err) => Some(Err(err.into())),
        }
    }

    fn set_max_frame(&mut self, max_frame: u32) {
        self.decoder.set_max_frame(max_frame);
    }

    fn read_now(&mut self) -> bool {
        if !self.reads_now() {
            return false;
        }
        // Something to go on with already: a whole prefix or frame, a refused one, or a kept
        // error, all for `poll_recv`.
        let wanted = self.decoder.wanted();
        if wanted == 0 || self.deferred.is_some() {
            return true;
        }
        // The rest of a large frame: `poll_recv` reads it into the frame's own buffer, so a
        // loop that looks here must ask `poll_recv` instead.
        if wanted > READ_CHUNK {
            return true;
        }
        let Some(fd) = self.direct_fd.as_ref() else {
            return false;
        };
        // Bytes join the decoder, an error is kept for `poll_recv`, and the end of the stream
        // (a read of 0) is met again by `poll_recv`'s own read once the runtime sees it. A
        // blocking description (`with_blocking_read`) is read with `RWF_NOWAIT`, which the
        // kernel honours there.
        let dst = scratch_buffer(&mut self.scratch);
        match crate::pipe_reader::read_now(fd.as_fd(), dst, self.wait_reads_block) {
            Ok(read) => {
                self.keep_scratch(read);
                true
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(err) => {
                self.deferred = Some(err);
                true
            }
        }
    }

    fn reads_now(&self) -> bool {
        self.direct_fd.is_some()
    }

    fn wait_blocking(&mut self) -> bool {
        let Some(fd) = self.direct_fd.as_ref() else {
            return false;
        };
        // Nothing wanted: the decoder has bytes to go on with (a whole frame or prefix, or a
        // refused one), for `poll_recv`. The rest of a large frame is read by `poll_recv`
        // too, into the frame's own buffer. A kept error is `poll_recv`'s to report.
        let wanted = self.decoder.wanted();
        if wanted == 0 || wanted > READ_CHUNK || self.deferred.is_some() {
            return false;
        }
        if !self.wait_reads_block {
            let mut fds = [PollFd::new(fd, PollFlags::IN)];
            loop {
                // No timeout: a wait with one arms a kernel timer each time, which cost about
                // what this wait saves (BENCHMARKS.md).
                match poll(&mut fds, None) {
                    Ok(_) => break,
                    Err(Errno::INTR) => {}
                    // A system call this process may not make (a seccomp filter) or any other
                    // failure: it waits through the runtime from now on.
                    Err(_) => {
                        self.direct_fd = None;
                        return false;
                    }
                }
            }
        }
        // Readable, or a blocking read that waits until it is: bytes, the end of the stream or
        // an error. Bytes join the decoder; an error is kept for `poll_recv`; the end of the
        // stream (and nothing after all, `EAGAIN` or `EINTR`) is left for `poll_recv`'s own
        // read, which meets it again.
        match rustix::io::read(fd, scratch_buffer(&mut self.scratch)) {
            Ok(read) => self.keep_scratch(read),
            Err(Errno::AGAIN | Errno::INTR) => {}
            Err(err) => self.deferred = Some(err.into()),
        }
        true
    }
}
