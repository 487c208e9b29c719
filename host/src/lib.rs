//! The airlock host: run work in a sandboxed worker process and take its answers back without
//! trusting a byte of them.
//!
//! A [`Host`] spawns a worker (a cleared environment, its own process group, no inherited
//! descriptors, death with its host), completes the handshake, and sends typed calls:
//! `host.call::<M>(&request)` where the [`Method`] `M` (declared in one line with [`method!`])
//! fixes the
//! request and response types at compile time. Every reply is bound to exactly one call by a
//! fresh random 128-bit id and the method's name, and decoded by a non-executing, budgeted
//! codec. A worker that breaks any rule, lies about a response, misses a deadline, stops
//! reading or dies is SIGKILLed and reaped, its calls fail with a [`CallError`] naming why,
//! and a supervisor replaces it with backoff, within a restart budget.
//!
//! ```no_run
//! use airlock_host::{CallError, Host};
//! use airlock_worker::builtin::{Echo, Sum};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let host = Host::builder("target/debug/airlock-worker").spawn().await?;
//! assert_eq!(host.call::<Sum>(&vec![1, 2, 3]).await?, 6);
//! let overflow = host.call::<Sum>(&vec![i64::MAX, 1]).await;
//! assert!(matches!(overflow, Err(CallError::Remote(_))));
//! host.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Everything a host program names is re-exported here ([`Method`], [`Limits`],
//! [`HostConfig`], the error types), so `airlock-host` is its only airlock dependency.
//!
//! [`InProcess`] runs the same handlers through the same codec and state machines inside the
//! host process, for development and tests; [`Pool`] spreads calls over several workers.
//! A method can also be named at run time, with dynamic [`Value`] bodies:
//! [`Host::call_value`] (for tools, and for workers written in other languages).
//!
//! Residuals (see `SECURITY.md`): a compromised worker can lie in its answers to the calls sent
//! to it and deny service to them; it cannot answer another call, run code in the host, or
//! make the host allocate beyond its budgets. airlock's checks do not replace OS confinement.
//!
//! Every worker is OS-confined by default ([`Confinement::strict`]): namespaces of its own
//! with a minimal read-only root, Landlock, seccomp, no capabilities and rlimits, verified
//! from outside before its first call. See the [`confinement`] module for the layers.

#![deny(unsafe_code)]
#![deny(missing_docs)]

mod config;
pub mod confinement;
mod connection;
mod dynamic;
mod error;
mod host;
mod in_process;
mod info;
mod launch;
mod pool;
mod spawn;
mod spawner;
mod stats;
mod stderr;
mod supervisor;
mod sys;

pub use config::{
    RestartPolicy, StderrPolicy, TransportChoice, DEFAULT_CALL_TIMEOUT, DEFAULT_SEND_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE,
};
pub use confinement::{
    Confinement, ConfinementError, ConfinementMode, ConfinementReport, ConfinementStep, Feature,
};
pub use error::{CallError, ExitInfo, LostReason, SpawnError, SpawnerError};
pub use host::{Host, HostBuilder};
pub use in_process::InProcess;
pub use info::WorkerInfo;
pub use pool::{Pool, PoolBuilder};
pub use stats::{FailureCounts, HostStats};

// Everything a host program names, so `airlock-host` is its one airlock dependency.
pub use airlock_codec::{DecodeError, EncodeError, Key, Limits, Value};
pub use airlock_protocol::{
    is_valid_method_name, method, ConfigError, ErrorKind, HostConfig, Method, RefuseReason,
    RemoteError, Violation, ViolationCode, DEFAULT_CANCEL_GRACE, MAX_TIMEOUT, PROTOCOL_VERSION,
};
