//! The airlock worker runtime: register typed handlers, then serve them to a host over the
//! airlock protocol.
//!
//! Every call the worker receives is answered exactly once: with the handler's response, or a
//! `Fail` carrying a data-only error — the handler's own ([`HandlerError`]), `Panic` (the
//! worker keeps serving), `UnknownMethod`, `BadRequest` (the request did not decode), or
//! `Cancelled`. With the pipe transport the protocol channel is moved off fds 0 and 1 before
//! anything else runs, so a stray `println!` in a handler cannot corrupt it.
//!
//! An application's own worker binary, in full:
//!
//! ```no_run
//! use airlock_worker::{HandlerError, Worker};
//! use airlock_protocol::Method;
//!
//! pub struct Greet;
//! impl Method for Greet {
//!     const NAME: &'static str = "greet";
//!     type Request = String;
//!     type Response = String;
//! }
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
//! `host.call::<Greet>(&"ada".to_string())` (see `airlock-host`).
//!
//! Seam for OS confinement: a worker binary can confine itself (rlimits, seccomp, Landlock)
//! after the transport is taken and before [`Worker::serve`] reads the first frame.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod builtin;
mod env_transport;
mod error;
mod handler;
mod serve;
mod worker;

pub use error::{HandlerError, ServeError};
pub use worker::{Worker, DEFAULT_MAX_CONCURRENCY};
