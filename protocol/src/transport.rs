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
