//! The airlock worker runtime: register typed handlers, then serve them to a host over the
//! airlock protocol.
//!
//! Every call the worker receives is answered exactly once: with the handler's response, or a
//! `Fail` carrying a data-only error — the handler's own ([`HandlerError`]), `Panic` (the
//! worker keeps serving), `UnknownMethod`, `BadRequest` (the request did not decode),
//! `Cancelled`, `Limit` (an answer over the host's frame cap) or `Internal` (the handler's
//! response did not encode, or the worker is shutting down). With the pipe transport the
//! protocol channel is moved off fds 0 and 1 before anything else runs, so a stray `println!`
//! in a handler cannot corrupt it.
//!
//! An application's own worker binary, in full:
//!
//! ```no_run
//! use airlock_worker::{HandlerError, Worker};
//!
//! // Usually in a crate the host shares: `airlock_host::method!` is the same macro.
//! airlock_worker::method!(pub Greet, "greet", String => String);
//!
//! fn main() -> Result<(), airlock_worker::ServeError> {
//!     Worker::new()
//!         .identity("greeter", "1.0.0")
//!         .method::<Greet, _, _>(|name| async move {
//!             if name.is_empty() { return Err(HandlerError::new("no name")); }
//!             Ok(format!("hello, {name}"))
//!         })
//!         .serve_blocking()
//! }
//! ```
//!
//! The `Method` types are shared with the host, which calls them with
//! `host.call::<Greet>(&"ada".to_string())` (see `airlock-host`). Everything a worker program
//! names is re-exported here ([`Method`], [`method!`], [`Limits`], [`RemoteError`]...), so
//! `airlock-worker` is its only airlock dependency.
//!
//! Bulk data: a [`Blob`] in a request is, when it is 64 KiB or more and at least half the
//! body, the received frame's own bytes rather than a copy (`serde_bytes::ByteBuf` is copied;
//! the wire format is the same, so the host may send either). A large `Blob` that ends a
//! response (a `Blob` alone, or a struct's last field) is written from its own buffer.
//!
//! Speed: a worker served by [`Worker::serve_blocking`] whose code uses its runtime only from
//! the runtime's own tasks may set [`Worker::idle_wait_in_os`]: between calls it then waits
//! for the host in the OS rather than through a turn of the runtime (about a tenth off a small
//! call; the bundled `airlock-worker` does). A worker that runs one handler at a time
//! ([`Worker::max_concurrency`] 1) runs blocking handlers on its serving thread.
//!
//! Confinement: the host confines every worker before `exec` (namespaces, Landlock, a seccomp
//! denylist, rlimits). When the host asks (it does by default), [`Worker::serve`] adds the
//! innermost layer itself once its channel is open and before its `Hello`: a seccomp
//! allowlist with no `execve`, no `fork` and no new sockets (see [`confine`]).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod builtin;
#[cfg(target_os = "linux")]
pub mod confine;
mod env_transport;
mod error;
mod handler;
mod progress;
mod serve;
mod worker;

pub use error::{HandlerError, ProgressError, ServeError};
pub use handler::CancelToken;
pub use progress::Progress;
pub use worker::{Worker, DEFAULT_MAX_CONCURRENCY};

// Everything a worker program names, so `airlock-worker` is its one airlock dependency.
pub use airlock_codec::{Limits, Value};
pub use airlock_protocol::{method, Blob, ErrorKind, Method, RemoteError, Streaming};
