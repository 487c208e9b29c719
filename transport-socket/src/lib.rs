//! The airlock [`Transport`](airlock_protocol::transport::Transport) over a local socket, with
//! peer authentication: only the worker the host started can become its peer.
//!
//! Two ways to connect, one transport type ([`SocketTransport`]):
//!
//! - **Inherited** (the Unix default): [`inherited_pair`] makes a connected socket pair; the
//!   host places one end in the child at [`CHILD_SOCKET_FD`] and the worker adopts it with
//!   [`worker_inherited`]. No name exists anywhere for another process to find.
//! - **Named**, for workers started by something else: [`NamedListener`] listens in a fresh
//!   `0700` directory under a random name, hands the child the name and a fresh 32-byte token
//!   ([`NamedListener::env`]), and accepts only a peer whose credentials match and whose
//!   `Hello` carries the token ([`NamedListener::accept_worker`]); the worker connects with
//!   [`worker_connect_named`]. See [`named`] for the argument.
//!
//! Framing is the one the pipe transport uses ([`StreamTransport`]): frames over `max_frame`
//! are refused from their length prefix before anything is reserved, and sends fail with
//! `SendTimeout` instead of blocking on a peer that stopped reading. Descriptors passed as
//! ancillary data (`SCM_RIGHTS`) are never accepted: the host's end refuses them at the
//! peer's send (`SO_PASSRIGHTS` off, Linux 6.16+), so the host never even closes one; on older
//! kernels reads take no control messages, so the kernel discards them. The socket's halves ([`SocketReader`], [`SocketWriter`]) keep the
//! event loop from waking on every "writable" edge a Unix socket raises when its peer reads,
//! which would otherwise double the cost of a small round trip. Unix only for now; Windows
//! named pipes would come in through `interprocess` behind the same API.
//!
//! ```
//! use std::os::fd::IntoRawFd;
//! use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
//! use airlock_protocol::frame::{encode_frame, Frame, Shutdown};
//! use airlock_protocol::Transmit;
//! use airlock_transport_pipe::StreamConfig;
//! use airlock_transport_socket::{inherited_pair, worker_inherited_fd};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! // Host: a socket pair. A real host puts `child_end` at fd 3 in the worker it spawns; here
//! // the "worker" adopts it in the same process.
//! let (host, child_end) = inherited_pair(StreamConfig::default()).unwrap();
//! let worker = worker_inherited_fd(child_end.into_raw_fd(), StreamConfig::default()).unwrap();
//!
//! let (mut send, _) = host.split();
//! let (_, mut recv) = worker.split();
//! let frame = encode_frame(&Frame::Shutdown(Shutdown));
//! send.send(&[Transmit { head: frame.into(), body: Default::default() }]).await.unwrap();
//! assert_eq!(recv.recv().await.unwrap().unwrap(), &[8][..]);
//! # });
//! ```

#![deny(unsafe_code)] // allowed in `adopt` (a descriptor taken by number) and `raw_sockopt` only
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod adopt;
mod env;
mod error;
mod inherited;
pub mod named;
mod raw_sockopt;
mod socket_io;
mod worker;

pub use airlock_transport_pipe::{StreamConfig, StreamTransport};
pub use env::{
    encode_token, parse_token, token_from_env, AIRLOCK_SOCKET_FD, AIRLOCK_SOCKET_NAME,
    AIRLOCK_TOKEN, CHILD_SOCKET_FD, TOKEN_HEX_LEN,
};
pub use error::{AcceptError, Refusal};
pub use inherited::{
    inherited_pair, worker_inherited, worker_inherited_blocking, worker_inherited_fd,
};
pub use named::{
    worker_connect_named, worker_connect_named_at, Accepted, NamedConfig, NamedListener,
    PeerExpectation, PrivateDir, DEFAULT_CANDIDATE_TIMEOUT, MAX_CANDIDATES, MAX_HELLO_FRAME,
    MAX_RECORDED_REFUSALS,
};
pub use socket_io::{SocketReader, SocketWriter};
pub use worker::{worker_from_env, SocketMode};

/// The transport over a connected Unix stream socket, in either mode: the shared framing
/// ([`StreamTransport`]) over the socket's two halves ([`SocketReader`], [`SocketWriter`]).
pub type SocketTransport = StreamTransport<SocketReader, SocketWriter>;
