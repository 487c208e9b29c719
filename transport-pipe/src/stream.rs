//! Frames over any byte stream: the framing both transports share.
//!
//! A [`StreamTransport`] wraps an async reader and writer (pipe ends, a socket's halves). The
//! receiver owns a [`FrameDecoder`] and reads straight into its buffer, so a frame's bytes are
//! copied once, by the kernel; the sender writes a whole batch of frames with vectored writes
//! under a deadline, so a peer that stops reading cannot hold the writer forever.

use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_protocol::{FrameDecoder, Transmit, TransportError, DEFAULT_MAX_FRAME};
use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
        }
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
        (
            StreamSender {
                writer: Some(self.writer),
                send_timeout: self.config.send_timeout,
            },
            StreamReceiver {
                reader: self.reader,
                decoder: FrameDecoder::new(self.config.max_frame),
                scratch: Vec::new(),
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
}

fn io_error(err: std::io::Error) -> TransportError {
    TransportError::Io(Box::new(err))
}

/// Slices gathered on the stack for one vectored write; a larger batch is written in turns.
const SLICES_PER_WRITE: usize = 64;

/// Writes every byte of `batch`, in order, with as few vectored writes as the OS allows and no
/// allocation: up to [`SLICES_PER_WRITE`] non-empty heads and bodies per system call.
async fn write_batch<W: AsyncWrite + Unpin>(
    writer: &mut W,
    batch: &[Transmit],
) -> std::io::Result<()> {
    // Pieces are numbered 2i (head of frame i) and 2i + 1 (its body). Plain loops rather than
    // iterator closures: the future must be `Send` for every lifetime of `batch`.
    let total = batch.len() * 2;
    let mut next = 0;
    while next < total {
        let mut slices: [IoSlice<'_>; SLICES_PER_WRITE] = [IoSlice::new(&[]); SLICES_PER_WRITE];
        let mut count = 0;
        while next < total && count < SLICES_PER_WRITE {
            let piece: &[u8] = match batch.get(next / 2) {
                Some(t) if next % 2 == 0 => &t.head,
                Some(t) => &t.body,
                None => &[],
            };
            next += 1;
            if let (false, Some(slot)) = (piece.is_empty(), slices.get_mut(count)) {
                *slot = IoSlice::new(piece);
                count += 1;
            }
        }
        let mut remaining: &mut [IoSlice<'_>] = slices.get_mut(..count).unwrap_or_default();
        while !remaining.is_empty() {
            let written = writer.write_vectored(remaining).await?;
            if written == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut remaining, written);
        }
    }
    writer.flush().await
}

/// Polls `future` once: its output if it is ready, `None` if it would wait (its waker is then
/// registered, so polling it again later is how to go on).
async fn poll_once<F: Future>(mut future: Pin<&mut F>) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match future.as_mut().poll(cx) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => None,
        })
    })
    .await
}

#[async_trait]
impl<W: AsyncWrite + Unpin + Send> FrameSender for StreamSender<W> {
    async fn send(&mut self, batch: &[Transmit]) -> Result<(), TransportError> {
        let writer = self.writer.as_mut().ok_or(TransportError::Closed)?;
        let mut write = std::pin::pin!(write_batch(writer, batch));
        // A peer that reads leaves room in the pipe, and the whole batch goes in one
        // non-blocking attempt: only a write that has to wait is put under the deadline (a
        // timer and a clock read, on every send otherwise).
        if let Some(result) = poll_once(write.as_mut()).await {
            return result.map_err(io_error);
        }
        match tokio::time::timeout(self.send_timeout, write).await {
            Ok(result) => result.map_err(io_error),
            Err(_) => Err(TransportError::SendTimeout),
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
    async fn recv(&mut self) -> Result<Option<Bytes>, TransportError> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                return Ok(Some(frame));
            }
            let wanted = self.decoder.wanted();
            let read = if wanted > READ_CHUNK {
                // The rest of a large frame: read straight into the frame's buffer (the one
                // copy this side makes), growing it at most by what has already arrived
                // again, so capacity never runs more than one step ahead of real bytes.
                let buffered = self.decoder.buffered();
                let want = wanted.min(buffered.max(READ_CHUNK));
                let buf = self.decoder.read_buffer();
                buf.reserve(want);
                self.reader.read_buf(buf).await.map_err(io_error)?
            } else {
                // Prefixes and small frames: one read into the scratch buffer takes whatever
                // the peer has written (often many frames), then it is appended.
                if self.scratch.is_empty() {
                    self.scratch = vec![0; READ_CHUNK];
                }
                let read = self
                    .reader
                    .read(&mut self.scratch)
                    .await
                    .map_err(io_error)?;
                if let Some(bytes) = self.scratch.get(..read) {
                    self.decoder.extend(bytes);
                }
                read
            };
            if read == 0 {
                self.decoder.finish()?;
                return Ok(None);
            }
        }
    }

    fn set_max_frame(&mut self, max_frame: u32) {
        self.decoder.set_max_frame(max_frame);
    }
}
