//! The airlock host: run work in a sandboxed worker process and take its answers back without
//! trusting a byte of them.
//!
//! A [`Host`] spawns a worker (a cleared environment, its own process group, no inherited
//! descriptors, death with its host), completes the handshake, and sends typed calls:
//! `host.call::<M>(&request)` where the [`Method`] `M` (declared in one line with [`method!`])
//! fixes the
//! request and response types at compile time. Every reply is bound to exactly one call by a
//! fresh random 128-bit id and the method's name, and decoded by a non-executing, budgeted
//! codec. A worker that breaks any rule, lies about a response, keeps running a timed-out
//! handler past the cancel grace ([`HostConfig::cancel_grace`]), stops reading or dies is
//! SIGKILLed and reaped, its calls fail with a [`CallError`] naming why, and a supervisor
//! replaces it with backoff, within a restart budget. A call past its deadline fails with
//! [`CallError::Timeout`] at once; the worker is sent a `Cancel` and serves on if it stops.
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
//! host process, for development and tests; [`Pool`] spreads calls over several workers;
//! [`blocking`] offers both to programs without an async runtime. A method can also be named
//! at run time, with dynamic [`Value`] bodies: [`Host::call_value`] (for tools, and for
//! workers written in other languages).
//!
//! A worker that cannot start says which program and why ([`SpawnError`], with the worker's
//! last stderr lines in a [`HandshakeError`]); every limit a call runs into is named in its
//! error with its value and the setting that changes it. A response over the host's budgets
//! ([`HostBuilder::limits`]) is logged at WARN on target `airlock::host`, with the budget, the
//! method and the worker's label, before the worker is killed: it cannot know the host's
//! budgets, and that line is how its operator learns why it went. Byte buffers: see
//! `airlock_codec`'s docs (a plain `Vec<u8>` works; a `serde_bytes` field is faster); a large
//! [`Blob`] in a response is taken from the received frame without a copy, and one that ends a
//! request (a `Blob` alone, or a struct's last field) is written from its own buffer.
//!
//! Residuals (see `SECURITY.md`): a compromised worker can lie in its answers to the calls sent
//! to it and deny service to them; it cannot answer another call, run code in the host, or
//! make the host allocate beyond its budgets. airlock's checks do not replace OS confinement.
//!
//! Every worker is OS-confined by default ([`Confinement::strict`]): namespaces of its own
//! with a minimal read-only root, Landlock, seccomp, no capabilities and rlimits, verified
//! from outside before its first call. See the [`confinement`] module for the layers.
//!
//! # Performance
//!
//! A small call costs the host some 12k instructions and two allocations, a pipelined one
//! some 6k (the answers that came in one read are taken in one turn of its reader); `BENCHMARKS.md` has the figures beside raw pipes and ipc-channel. What makes calls
//! cheaper:
//!
//! - On a multi-thread runtime, call from a spawned task, not from `block_on`'s own future
//!   (which is what `#[tokio::main]` runs): that future does not run on one of the runtime's
//!   threads, so every answer crosses to the thread blocked in it. On the development VM a
//!   small call took 1.25–1.39× as long from `block_on` as from a spawned task with both
//!   processes on one CPU, and 2.0–2.1× across two (`BENCHMARKS.md`, runs 17, 18, 23, 24).
//! - With few CPUs, pipelined calls run faster on a current-thread runtime: on two CPUs, 256
//!   calls in flight on one worker made 1,100–1,130k calls/s from a current-thread host
//!   against 835–905k/s from a 2-thread one, whose two threads left the worker less than a
//!   CPU of its own (`BENCHMARKS.md`, runs 51–55).
//! - A worker that runs one handler at a time (`max_concurrency(1)`) runs a blocking handler
//!   on its serving thread, without a hop to a pool thread (0.44× the time).
//! - A worker served by `serve_blocking` with `Worker::idle_wait_in_os` waits for the next
//!   call in the OS rather than through a turn of its runtime (a pinned small call 8.16 µs
//!   against 9.96 µs; the bundled worker does; its docs say when a worker must not).
//! - [`HostBuilder::low_latency`] trades CPU for round trips across CPUs. On a multi-thread
//!   runtime its reader polls the channel itself: one call at a time on two CPUs took a
//!   median 7.0 µs against 18.5 µs when it polled by yielding to the runtime (`BENCHMARKS.md`,
//!   "The low-latency mode on a multi-thread runtime"). Where a wake-up across CPUs is cheap
//!   the mode gains nothing and costs the CPU: measure it on your machine.
//! - [`HostBuilder::poll_under_load`] (on by default) lets a worker poll for a pipelining
//!   host's next batch instead of sleeping: 16 calls in flight made 1.54–1.73× the calls a
//!   second of a worker without it, 256 in flight 1.14–1.16× (runs 44 and 45 of
//!   `BENCHMARKS.md`).
//! - A call made with no other in flight, whose frame the caller writes itself (the default
//!   confinement lets it), is answered without a turn of the runtime when the worker answers
//!   during the write, as one sharing the caller's CPU usually does: the caller reads the
//!   answer itself (one non-blocking `read`) before it waits. A pinned small call took 14.1
//!   µs against 15.1 µs on the AMD VM (`BENCHMARKS.md`, "The caller's look"). Where the
//!   worker answers from another CPU the caller looks only now and then, as looks find
//!   nothing there.
//! - A confined spawn forks the host once, so it grows with the host's memory (about 20 ms
//!   with 512 MiB resident, 5 ms in a small host): start a [`Pool`] early in a large host. A `Pool` spawns its workers concurrently: four take about three
//!   quarters of the time of four in a row, in a host of a few MiB as in one of 200 MiB.
//!
//! # Observability
//!
//! [`Host::stats`] and [`Pool::stats`] count calls by outcome, violations by code, restarts,
//! and, per method, calls and latency percentiles ([`MethodStats`], [`LatencyHistogram`]).
//!
//! The host logs through [`tracing`](https://docs.rs/tracing) on these targets (a
//! subscriber can select them, e.g. `RUST_LOG=airlock::call=debug` with
//! `tracing-subscriber`'s `EnvFilter`). Every event of a process worker carries `worker`, the
//! host's [label](HostBuilder::label), except the spawner's WARN below, which names the
//! process by `pid`; durations are whole microseconds (`*_us`).
//!
//! | target | level | when | fields |
//! | --- | --- | --- | --- |
//! | `airlock::spawn` | DEBUG | a worker process is up and connected (first or replacement) | `program`, `transport`, `confinement` (the mode), `duration_us` (the launch) |
//! | `airlock::spawn` | WARN | no thread could be started to reap a killed worker (it stays a zombie until the host exits) | `pid` |
//! | `airlock::handshake` | DEBUG | its `Hello` was accepted and its confinement verified | `worker_name`, `worker_version`, `methods` (how many), `duration_us` (from the spawn's end) |
//! | `airlock::call` | DEBUG | a call ended | `method`, `call` (its number in this host, from 0: a local handle, never sent; the wire id is random), `outcome` (`ok` or the [`FailureCounts`] field it counts in), `duration_us`, `error` (on failure) |
//! | `airlock::call` | DEBUG | a [`Pool`] retries a lost call ([`PoolBuilder::retry_lost_calls`]) | `method`, `retry_on` (the other worker's label), `reason` |
//! | `airlock::restart` | DEBUG | a lost worker is about to be replaced | `reason`, `backoff_us`, `restart` (its number) |
//! | `airlock::host` | WARN, ERROR | a launch failed, a worker was lost or broke the protocol, the restart budget ran out | the reason, in the message |
//! | `airlock::confinement` | WARN | [`Confinement::none`], a layer the kernel lacks, a worker not verified | the message |
//! | `airlock::worker_stderr` | INFO | a line the worker wrote to stderr (bounded, rate-limited) | the line, in the message |
//! | `airlock::in_process` | DEBUG | an [`InProcess`] worker's serving loop ended with an error | the error |
//!
//! With DEBUG off for a target, its events cost a check of a cached flag per callsite:
//! nothing is formatted or allocated.

#![deny(unsafe_code)]
#![deny(missing_docs)]

pub mod blocking;
mod child;
mod config;
pub mod confinement;
mod connection;
mod dynamic;
mod error;
mod host;
mod ids;
mod in_process;
mod info;
mod launch;
mod pool;
mod reply;
mod response;
mod spawn;
mod spawner;
mod stats;
mod stderr;
mod streaming;
mod supervisor;
mod sys;
mod updates;

pub use config::{
    RestartPolicy, StderrPolicy, TransportChoice, DEFAULT_CALL_TIMEOUT, DEFAULT_SEND_TIMEOUT,
    DEFAULT_SHUTDOWN_GRACE,
};
pub use confinement::{
    Confinement, ConfinementError, ConfinementMode, ConfinementReport, ConfinementStep, Feature,
    WORKER_UIDS,
};
pub use error::{
    CallError, ExitInfo, HandshakeError, LostReason, SpawnError, SpawnerError, STDERR_TAIL_LINE,
    STDERR_TAIL_LINES,
};
pub use host::{Host, HostBuilder};
pub use in_process::InProcess;
pub use info::WorkerInfo;
pub use pool::{Pool, PoolBuilder, PoolStats};
pub use stats::{FailureCounts, HostStats, LatencyHistogram, MethodStats, MAX_DYNAMIC_METHODS};
pub use streaming::CallStream;

// Everything a host program names, so `airlock-host` is its one airlock dependency.
pub use airlock_codec::{DecodeError, EncodeError, Key, Limits, Value};
pub use airlock_protocol::{
    is_valid_method_name, method, Blob, ConfigError, ErrorKind, HostConfig, Method, RefuseReason,
    RemoteError, Streaming, Violation, ViolationCode, DEFAULT_CANCEL_GRACE, MAX_TIMEOUT,
    PROTOCOL_VERSION,
};
