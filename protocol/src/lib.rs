//! The airlock protocol, sans-IO: framing, frames, call ids, and the session state machines
//! that bind every reply from a worker to exactly one call the host made.
//!
//! Nothing here does I/O, reads a clock or owns an RNG: bytes, time and randomness are
//! parameters, in the manner of `quinn-proto` and `rustls`, so every rule is tested
//! deterministically without a process. [`HostSession`] accepts a worker frame only when its
//! `(id, phase, method)` matches a pending call whose state admits that phase; anything else is
//! a [`Violation`] that closes the session and fails every pending call with the reason.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use airlock_protocol::*;
//! # struct Rng(u64);
//! # impl rand_core::RngCore for Rng {
//! #     fn next_u32(&mut self) -> u32 { self.next_u64() as u32 }
//! #     fn next_u64(&mut self) -> u64 { self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1); self.0 }
//! #     fn fill_bytes(&mut self, dst: &mut [u8]) { rand_core::impls::fill_bytes_via_next(self, dst) }
//! # }
//! # impl rand_core::CryptoRng for Rng {}
//! # let mut rng = Rng(1); // the host passes the OS's CSPRNG
//! let now = Instant::now();
//! let mut host = HostSession::new(HostConfig::default(), now);
//! let mut worker = WorkerSession::new(&WorkerConfig::new("demo", "1.0"));
//!
//! // Shuttle frames between the two until both are quiet.
//! fn pump(host: &mut HostSession, worker: &mut WorkerSession) {
//!     loop {
//!         let mut moved = false;
//!         while let Some(t) = worker.poll_transmit() { host.handle_bytes(&t.to_vec()); moved = true; }
//!         while let Some(t) = host.poll_transmit() { worker.handle_bytes(&t.to_vec()); moved = true; }
//!         if !moved { break; }
//!     }
//! }
//! pump(&mut host, &mut worker);
//! assert!(matches!(host.poll_event(), Some(Event::Ready(_))));
//!
//! let id = host.begin_call("echo", "hi", now + Duration::from_secs(5), &mut rng).unwrap();
//! pump(&mut host, &mut worker);
//! # let _ = worker.poll_event();
//! let Some(WorkerEvent::Call { id: got, body, .. }) = worker.poll_event() else { panic!() };
//! worker.reply_return(got, body).unwrap();
//! pump(&mut host, &mut worker);
//! assert_eq!(host.poll_event(), Some(Event::Completed { id, outcome: Outcome::Returned("hi".into()) }));
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod blob;
pub mod body;
mod error;
pub mod frame;
mod framing;
mod id;
mod limits;
mod method;
mod remote_error;
pub mod reuse;
mod session;
pub mod spin;
pub mod transport;

pub use blob::Blob;
pub use body::Body;
pub use error::{
    BeginCallError, ConfigError, DecodeFrameError, FrameError, Received, ReplyError,
    TransportError, Violation, ViolationCode,
};
pub(crate) use frame::body_frame_len;
pub use frame::{decode_frame, Frame, FrameKind, RefuseReason, Transmit, Welcome, TOKEN_LEN};
pub use framing::{FrameDecoder, LENGTH_PREFIX, OWN_BUFFER_FROM};
pub use id::{BuildIdHasher, CallId, IdHasher};
pub use limits::check_timeout;
pub use limits::{
    HostConfig, DEFAULT_CANCEL_GRACE, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_FRAME,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_PROGRESS_PER_CALL, DEFAULT_SEND_TIMEOUT,
    HANDSHAKE_MAX_FRAME, MAX_IN_FLIGHT, MAX_TIMEOUT, MIN_MAX_FRAME,
};
pub use method::{is_valid_method_name, Method, MethodName, Streaming, MAX_METHOD_NAME};
pub use remote_error::{ErrorKind, RemoteError, MAX_ERROR_MESSAGE};
pub use session::host::{Event, HostSession, Outcome};
pub use session::worker::{WorkerConfig, WorkerEvent, WorkerSession};
pub use session::{AbortReason, CloseReason, WorkerInfo, FINISHED_ID_MEMORY};

/// The protocol version both ends state in the handshake; a mismatch is refused.
pub const PROTOCOL_VERSION: u32 = 1;
