//! The airlock [`Transport`](airlock_protocol::transport::Transport) over pipes: the host
//! speaks to a spawned worker through the child's stdin and stdout.
//!
//! Guarantees: frames over `max_frame` are refused from their length prefix before anything is
//! reserved for them; a batch that cannot be written within the send deadline fails with
//! [`TransportError::SendTimeout`](airlock_protocol::TransportError::SendTimeout) instead of
//! blocking; bodies are written from the caller's buffers (vectored writes) and read into the
//! frame buffer once. On the worker side, [`take_worker_stdio`] moves the channel off fds 0
//! and 1 so handler output cannot reach it, and its reader ([`PipeReader`]) lets an idle worker
//! wait for the host in one blocking `read` where the kernel allows
//! ([`StreamTransport::with_blocking_read`]). Both sides write with a [`PipeWriter`]: one
//! `writev` a batch, straight to the pipe, the runtime asked for room only when it is full.
//!
//! ```
//! use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
//! use airlock_protocol::frame::{encode_frame, Frame, Shutdown};
//! use airlock_protocol::Transmit;
//! use airlock_transport_pipe::{StreamConfig, StreamTransport};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let (host_end, worker_end) = tokio::io::duplex(1 << 16);
//! let (host_r, host_w) = tokio::io::split(host_end);
//! let (worker_r, worker_w) = tokio::io::split(worker_end);
//! let (mut send, _) = StreamTransport::new(host_r, host_w, StreamConfig::default()).split();
//! let (_, mut recv) = StreamTransport::new(worker_r, worker_w, StreamConfig::default()).split();
//!
//! let frame = encode_frame(&Frame::Shutdown(Shutdown));
//! send.send(&[Transmit { head: frame.into(), body: Default::default() }]).await.unwrap();
//! assert_eq!(recv.recv().await.unwrap().unwrap(), &[8][..]);
//! # });
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod pipe_reader;
mod pipe_writer;
mod read_window;
mod stream;
mod worker_stdio;
mod write_direct;

pub use pipe_reader::{kernel_honours_nowait_on_pipes, PipeReader};
pub use pipe_writer::PipeWriter;
pub use read_window::ReadWindow;
pub use stream::{
    StreamConfig, StreamReceiver, StreamSender, StreamTransport, DEFAULT_SEND_TIMEOUT, READ_CHUNK,
};
pub use worker_stdio::{take_worker_stdio, WorkerPipe};
pub use write_direct::WriteDirect;

/// The host's end of the pipe transport: the child's stdout (frames from the worker) and
/// stdin (frames to it).
pub type HostPipe = StreamTransport<tokio::process::ChildStdout, tokio::process::ChildStdin>;
