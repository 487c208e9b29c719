//! The `Transport` trait: how whole frames move between host and worker.
//!
//! Runtime-agnostic (no tokio here): the transport crates implement it over pipes and local
//! sockets. A transport splits into a sender and a receiver so reads and writes run
//! concurrently, each owned by one task.

use async_trait::async_trait;
use bytes::Bytes;

use crate::{Transmit, TransportError};

/// Writes frames.
#[async_trait]
pub trait FrameSender: Send {
    /// Writes every frame of `batch`, in order, as few system calls as the transport can
    /// manage (vectored writes). Completes when all bytes were handed to the OS, fails with
    /// [`TransportError::SendTimeout`] if the peer stops reading for longer than the
    /// transport's send deadline.
    async fn send(&mut self, batch: &[Transmit]) -> Result<(), TransportError>;

    /// Closes the write direction; the peer sees end of stream.
    async fn close(&mut self) -> Result<(), TransportError>;
}

/// Reads frames.
#[async_trait]
pub trait FrameReceiver: Send {
    /// The next frame's payload (without its length prefix), `Ok(None)` at a clean end of
    /// stream (between frames). A length over the receiver's `max_frame` is refused from the
    /// prefix alone ([`FrameError::TooLarge`](crate::FrameError::TooLarge)); an end of stream
    /// inside a frame is [`FrameError::Truncated`](crate::FrameError::Truncated).
    async fn recv(&mut self) -> Result<Option<Bytes>, TransportError>;

    /// Changes the cap for frames not yet started, keeping what is buffered. A host starts
    /// its receiver at [`HANDSHAKE_MAX_FRAME`](crate::HANDSHAKE_MAX_FRAME) and raises it once
    /// the worker has completed its handshake. The default does nothing (for transports that
    /// frame by other means).
    fn set_max_frame(&mut self, max_frame: u32) {
        let _ = max_frame;
    }
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
/// [`start`](Self::start) hands a batch to the sender and polls it once: when the OS takes
/// every byte at once (the common case: the peer is reading), it is done there, with no task
/// hop and no wake-up. Only a write that has to wait stays in flight; the loop then awaits
/// [`finish`](Self::finish) beside its other inputs (it is cancel-safe) and queues new frames
/// until the write is done, so frames never interleave and a partial write is never
/// abandoned. The sender's own send deadline bounds a write that cannot finish.
///
/// A write that fails (its deadline passed, the peer went away) may have stopped inside a frame,
/// so the stream is no longer framed: the sender is dropped then, and every later
/// [`start`](Self::start) or [`close`](Self::close) fails with [`TransportError::Closed`]. No
/// frame is ever written behind a partial one.
pub struct Outgoing {
    idle: Option<Box<dyn FrameSender>>,
    flight: Option<Flight>,
    /// The last batch's emptied buffer, reused for the next one.
    spare: Vec<Transmit>,
}

type Flight = core::pin::Pin<
    Box<
        dyn core::future::Future<
                Output = (
                    Box<dyn FrameSender>,
                    Vec<Transmit>,
                    Result<(), TransportError>,
                ),
            > + Send,
    >,
>;

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
            idle: Some(sender),
            flight: None,
            spare: Vec::new(),
        }
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
    pub async fn start(&mut self, mut batch: Vec<Transmit>) -> Option<Result<(), TransportError>> {
        let Some(mut sender) = self.idle.take() else {
            return Some(Err(TransportError::Closed));
        };
        let mut flight: Flight = Box::pin(async move {
            let result = sender.send(&batch).await;
            batch.clear();
            (sender, batch, result)
        });
        let polled = core::future::poll_fn(|cx| {
            core::task::Poll::Ready(match flight.as_mut().poll(cx) {
                core::task::Poll::Ready(done) => Some(done),
                core::task::Poll::Pending => None,
            })
        })
        .await;
        match polled {
            Some(done) => Some(self.landed(done)),
            None => {
                self.flight = Some(flight);
                None
            }
        }
    }

    /// Completes the write in flight; never completes when there is none (for `select!`).
    /// Cancel-safe: the write stays in flight.
    pub async fn finish(&mut self) -> Result<(), TransportError> {
        let Some(flight) = self.flight.as_mut() else {
            return core::future::pending().await;
        };
        let done = flight.await;
        self.flight = None;
        self.landed(done)
    }

    fn landed(
        &mut self,
        (sender, batch, result): (
            Box<dyn FrameSender>,
            Vec<Transmit>,
            Result<(), TransportError>,
        ),
    ) -> Result<(), TransportError> {
        self.spare = batch;
        if result.is_ok() {
            self.idle = Some(sender);
        }
        result
    }

    /// Finishes the write in flight, then closes the write direction.
    pub async fn close(&mut self) -> Result<(), TransportError> {
        if self.is_busy() {
            self.finish().await?;
        }
        match self.idle.as_mut() {
            Some(sender) => sender.close().await,
            None => Err(TransportError::Closed),
        }
    }
}
