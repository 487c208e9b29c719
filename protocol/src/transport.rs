//! The `Transport` trait: how whole frames move between host and worker.
//!
//! Runtime-agnostic (no tokio here): the transport crates implement it over pipes and local
//! sockets. A transport splits into a sender and a receiver so reads and writes run
//! concurrently, each owned by one task.

use async_trait::async_trait;
use bytes::Bytes;

use crate::{Transmit, TransportError};

/// How far the write of one batch has got: the bytes the OS has taken so far, and the deadline
/// the transport armed when the write first had to wait. A fresh one ([`Default`]) starts each
/// batch; the same one goes to every [`FrameSender::poll_send`] of that batch.
#[derive(Default)]
pub struct SendProgress {
    /// Bytes of the batch (its frames' heads and bodies, in order) already written.
    pub written: usize,
    /// The send deadline, armed by the transport when the batch first had to wait.
    pub deadline: Option<core::pin::Pin<Box<dyn core::future::Future<Output = ()> + Send>>>,
    /// How many pieces (heads and bodies, in order) are written whole, and their bytes: where
    /// [`unwritten`](Self::unwritten) starts, so a batch written in many small writes is not
    /// walked from its start each time.
    whole: (usize, usize),
}

impl SendProgress {
    /// Fills `slices` with the pieces of `batch` not yet written (empty ones left out), the
    /// first cut where the last write stopped; returns how many it filled. `batch` must be the
    /// batch this progress belongs to.
    pub fn unwritten<'b>(
        &mut self,
        batch: &'b [Transmit],
        slices: &mut [std::io::IoSlice<'b>],
    ) -> usize {
        let (mut whole, mut whole_bytes) = self.whole;
        // Bytes written into the pieces from `whole` on: all inside the first that is not whole.
        let mut offset = self.written.saturating_sub(whole_bytes);
        let mut count = 0;
        // Piece `index` is frame `index / 2`'s head (even) or body (odd); starting at `whole`,
        // the pieces written whole are not walked again on every call.
        let mut index = whole;
        while count < slices.len() {
            let Some(frame) = batch.get(index / 2) else {
                break;
            };
            let piece: &'b [u8] = if index % 2 == 0 {
                &frame.head
            } else {
                &frame.body
            };
            index += 1;
            if count == 0 && offset >= piece.len() {
                // Written whole (or empty) at the front: later calls start behind it.
                offset -= piece.len();
                whole += 1;
                whole_bytes += piece.len();
                continue;
            }
            let rest = piece.get(offset..).unwrap_or_default();
            offset = 0;
            if let (false, Some(slot)) = (rest.is_empty(), slices.get_mut(count)) {
                *slot = std::io::IoSlice::new(rest);
                count += 1;
            }
        }
        self.whole = (whole, whole_bytes);
        count
    }
}

impl core::fmt::Debug for SendProgress {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SendProgress")
            .field("written", &self.written)
            .field("waiting", &self.deadline.is_some())
            .field("whole_pieces", &self.whole.0)
            .finish()
    }
}

/// Writes frames.
#[async_trait]
pub trait FrameSender: Send {
    /// Writes `batch` from byte `progress.written` on, as few system calls as the transport can
    /// manage (vectored writes), advancing `progress` as the OS takes bytes. `Ready(Ok)` once
    /// every byte is written; `Pending` while the OS has no room (call again with the same
    /// batch and progress when woken). Fails with [`TransportError::SendTimeout`] once the
    /// batch has waited longer than the transport's send deadline. No allocation unless the
    /// write has to wait (then its deadline timer).
    fn poll_send(
        &mut self,
        cx: &mut core::task::Context<'_>,
        batch: &[Transmit],
        progress: &mut SendProgress,
    ) -> core::task::Poll<Result<(), TransportError>>;

    /// Writes every frame of `batch`, in order ([`poll_send`](Self::poll_send) to the end).
    /// Completes when all bytes were handed to the OS; fails with
    /// [`TransportError::SendTimeout`] if the peer stops reading for longer than the
    /// transport's send deadline.
    async fn send(&mut self, batch: &[Transmit]) -> Result<(), TransportError> {
        let mut progress = SendProgress::default();
        core::future::poll_fn(|cx| self.poll_send(cx, batch, &mut progress)).await
    }

    /// Closes the write direction; the peer sees end of stream.
    async fn close(&mut self) -> Result<(), TransportError>;
}

/// Reads frames.
#[async_trait]
pub trait FrameReceiver: Send {
    /// Polls for the next frame's payload (without its length prefix): `Ok(None)` at a clean
    /// end of stream (between frames). A length over the receiver's `max_frame` is refused
    /// from the prefix alone ([`FrameError::TooLarge`](crate::FrameError::TooLarge)); an end
    /// of stream inside a frame is [`FrameError::Truncated`](crate::FrameError::Truncated).
    /// `Pending` loses nothing: bytes already read stay buffered for the next call.
    fn poll_recv(
        &mut self,
        cx: &mut core::task::Context<'_>,
    ) -> core::task::Poll<Result<Option<Bytes>, TransportError>>;

    /// The next frame if the receiver already holds all of it, or an error it holds for
    /// [`poll_recv`](Self::poll_recv) to report, without reading or waiting: `None` when
    /// `poll_recv` would have to read. For a loop that takes the frames that came together in
    /// one turn, and reads again only after it has acted on them. The default holds nothing.
    fn recv_buffered(&mut self) -> Option<Result<Option<Bytes>, TransportError>> {
        None
    }

    /// The next frame, as [`poll_recv`](Self::poll_recv) says. Cancel-safe.
    async fn recv(&mut self) -> Result<Option<Bytes>, TransportError> {
        core::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// Changes the cap for frames not yet started, keeping what is buffered. A host starts
    /// its receiver at [`HANDSHAKE_MAX_FRAME`](crate::HANDSHAKE_MAX_FRAME) and raises it once
    /// the worker has completed its handshake. The default does nothing (for transports that
    /// frame by other means).
    fn set_max_frame(&mut self, max_frame: u32) {
        let _ = max_frame;
    }

    /// Blocks the calling thread, without the async runtime, until the peer has sent more
    /// bytes or ended the stream, and takes what came into the receiver's buffer: for a loop
    /// that owns its thread and has nothing else to wait for (one wait in the OS and one read,
    /// without a turn of the runtime). There is no timeout: nothing but the peer ends the
    /// wait. `true`: the wait ended, and [`poll_recv`](Self::poll_recv) reports what came
    /// (bytes, the end of the stream, a read error) or, after a spurious wake-up, waits
    /// through the runtime. `false`: it did not wait, because the receiver holds bytes it has
    /// not yet decoded (a whole frame, perhaps) or an error to report, the rest of a large
    /// frame is wanted (`poll_recv` reads it into the frame's own buffer), the wait failed (a
    /// filter refused the system call; the receiver then never waits so again), or this
    /// receiver cannot wait so (the default).
    fn wait_blocking(&mut self) -> bool {
        false
    }

    /// Takes what the OS already holds for this receiver, without waiting and without the
    /// async runtime: one non-blocking `read` (on a blocking description, a read that asks
    /// not to wait), whatever the runtime believes of the descriptor's readiness. For a loop
    /// that polls while it expects input and must not turn its runtime to look (a reader or
    /// a worker's loop spinning in the low-latency mode, where each turn through the scheduler
    /// costs a system call and, on a multi-thread runtime, wakes its other threads). `true`: ask
    /// [`poll_recv`](Self::poll_recv) now. It has something to go on with (bytes, a frame, an
    /// error), or the stream ended, which it meets through the runtime, or the rest of a large
    /// frame is wanted, which only it reads (into the frame's own buffer, through the
    /// runtime). `false`: nothing came, or this receiver cannot read so
    /// ([`reads_now`](Self::reads_now)). Bytes taken are kept for `poll_recv`, under the same
    /// cap: nothing is lost or reordered.
    fn read_now(&mut self) -> bool {
        false
    }

    /// Whether [`read_now`](Self::read_now) can take input at all: a loop that would poll with
    /// it must not rely on it otherwise, as it never sees input. The default cannot.
    fn reads_now(&self) -> bool {
        false
    }
}

/// The next frame from `receiver`, without the allocation an `async_trait` method's future
/// costs: for loops that read every frame. Cancel-safe, as [`FrameReceiver::recv`].
pub fn next_frame<R: FrameReceiver + ?Sized>(
    receiver: &mut R,
) -> impl core::future::Future<Output = Result<Option<Bytes>, TransportError>> + '_ {
    core::future::poll_fn(move |cx| receiver.poll_recv(cx))
}

/// A bidirectional frame channel.
pub trait Transport: Send {
    /// The write half.
    type Sender: FrameSender + 'static;
    /// The read half.
    type Receiver: FrameReceiver + 'static;

    /// Splits into halves that can be driven from different tasks.
    fn split(self) -> (Self::Sender, Self::Receiver);
}

/// The write in flight on a connection, driven from the loop that owns the session instead of
/// a writer task of its own.
///
/// [`start`](Self::start) hands a batch to the sender and tries it once: when the OS takes
/// every byte at once (the common case: the peer is reading), it is done there, with no task
/// hop, no wake-up and no allocation. Only a write that has to wait stays in flight; the loop
/// then awaits [`finish`](Self::finish) beside its other inputs (it is cancel-safe) and queues
/// new frames until the write is done, so frames never interleave and a partial write is never
/// abandoned. The sender's own send deadline bounds a write that cannot finish.
///
/// A write that fails (its deadline passed, the peer went away) may have stopped inside a frame,
/// so the stream is no longer framed: the sender is dropped then, and every later
/// [`start`](Self::start) or [`close`](Self::close) fails with [`TransportError::Closed`]. No
/// frame is ever written behind a partial one.
pub struct Outgoing {
    sender: Option<Box<dyn FrameSender>>,
    /// The batch being written and how far it has got.
    flight: Option<(Vec<Transmit>, SendProgress)>,
    /// The last batch's emptied buffer, reused for the next one.
    spare: Vec<Transmit>,
    /// Large bodies go back to [`crate::reuse`] once written.
    recycle_bodies: bool,
}

impl core::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Outgoing")
            .field("busy", &self.is_busy())
            .finish_non_exhaustive()
    }
}

impl Outgoing {
    /// Writes through `sender`.
    pub fn new(sender: Box<dyn FrameSender>) -> Self {
        Self {
            sender: Some(sender),
            flight: None,
            spare: Vec::new(),
            recycle_bodies: false,
        }
    }

    /// Gives each body of at least [`REUSED_FROM`](crate::reuse::REUSED_FROM) bytes back to
    /// [`crate::reuse`] once it is written, so that a sender encoding its large bodies with
    /// [`encode_body`](crate::reuse::encode_body) has their buffers again instead of allocating
    /// (and faulting in) fresh ones. A body still referenced elsewhere is not reused.
    pub fn recycle_written_bodies(&mut self) {
        self.recycle_bodies = true;
    }

    /// Whether a write is still in flight (new frames must wait for it).
    pub fn is_busy(&self) -> bool {
        self.flight.is_some()
    }

    /// An empty buffer to gather the next batch in (the last batch's, when there was one).
    pub fn take_buffer(&mut self) -> Vec<Transmit> {
        core::mem::take(&mut self.spare)
    }

    /// Starts writing `batch`: `Some(result)` if it completed at once, `None` if it is in
    /// flight. Fails with [`TransportError::Closed`] if a write is already in flight or the
    /// sender is gone.
    pub async fn start(&mut self, batch: Vec<Transmit>) -> Option<Result<(), TransportError>> {
        if self.flight.is_some() || self.sender.is_none() {
            return Some(Err(TransportError::Closed));
        }
        self.flight = Some((batch, SendProgress::default()));
        core::future::poll_fn(|cx| {
            core::task::Poll::Ready(match self.poll_flight(cx) {
                core::task::Poll::Ready(done) => Some(done),
                core::task::Poll::Pending => None,
            })
        })
        .await
    }

    /// Completes the write in flight; never completes when there is none (for `select!`).
    /// Cancel-safe: the write stays in flight.
    pub async fn finish(&mut self) -> Result<(), TransportError> {
        if self.flight.is_none() {
            return core::future::pending().await;
        }
        core::future::poll_fn(|cx| self.poll_flight(cx)).await
    }

    /// Drives the write in flight; when it ends, keeps its emptied buffer, and drops the
    /// sender if it failed.
    fn poll_flight(
        &mut self,
        cx: &mut core::task::Context<'_>,
    ) -> core::task::Poll<Result<(), TransportError>> {
        let (Some(sender), Some((batch, progress))) = (self.sender.as_mut(), self.flight.as_mut())
        else {
            return core::task::Poll::Ready(Err(TransportError::Closed));
        };
        let result = core::task::ready!(sender.poll_send(cx, batch, progress));
        if let Some((mut batch, _)) = self.flight.take() {
            if self.recycle_bodies && result.is_ok() {
                for transmit in batch.drain(..) {
                    crate::reuse::give_back(transmit.body);
                }
            }
            batch.clear();
            self.spare = batch;
        }
        if result.is_err() {
            self.sender = None;
        }
        core::task::Poll::Ready(result)
    }

    /// Finishes the write in flight, then closes the write direction.
    pub async fn close(&mut self) -> Result<(), TransportError> {
        if self.is_busy() {
            self.finish().await?;
        }
        match self.sender.as_mut() {
            Some(sender) => sender.close().await,
            None => Err(TransportError::Closed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three frames, one without a body, as their bytes on the wire.
    fn batch() -> (Vec<Transmit>, Vec<u8>) {
        let frames = vec![
            Transmit {
                head: Bytes::from_static(b"abc"),
                body: Bytes::from_static(b"defgh"),
            },
            Transmit {
                head: Bytes::from_static(b"ij"),
                body: Bytes::new(),
            },
            Transmit {
                head: Bytes::from_static(b"k"),
                body: Bytes::from_static(b"lmnop"),
            },
        ];
        let wire = frames
            .iter()
            .flat_map(|t| t.head.iter().chain(t.body.iter()).copied())
            .collect();
        (frames, wire)
    }

    /// What `unwritten` hands out with `room` slices, joined.
    fn handed_out(progress: &mut SendProgress, batch: &[Transmit], room: usize) -> Vec<u8> {
        let mut slices = vec![std::io::IoSlice::new(&[]); room];
        let count = progress.unwritten(batch, &mut slices);
        slices[..count]
            .iter()
            .flat_map(|s| s.iter().copied())
            .collect()
    }

    #[test]
    fn unwritten_hands_out_exactly_the_bytes_not_yet_written() {
        let (frames, wire) = batch();
        // Written in steps of every size, each step seeing what the last left.
        for step in 1..=wire.len() {
            let mut progress = SendProgress::default();
            while progress.written < wire.len() {
                assert_eq!(
                    handed_out(&mut progress, &frames, 64),
                    wire[progress.written..]
                );
                progress.written = (progress.written + step).min(wire.len());
            }
            assert!(handed_out(&mut progress, &frames, 64).is_empty());
        }
    }

    #[test]
    fn unwritten_fills_at_most_the_slices_it_is_given() {
        let (frames, wire) = batch();
        let mut progress = SendProgress {
            written: 4,
            ..SendProgress::default()
        };
        // "efgh", then "ij": the empty body is left out.
        assert_eq!(handed_out(&mut progress, &frames, 2), b"efghij");
        progress.written = wire.len() - 2;
        assert_eq!(handed_out(&mut progress, &frames, 2), b"op");
    }
}
