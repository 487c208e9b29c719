//! The built-in methods of the `airlock-worker` binary, for demos, tests and benchmarks.
//!
//! Each is a [`Method`](crate::Method) type a host can call; [`builtin_worker`] registers them all. Several
//! exist to let tests observe the worker from outside (`pid`, `open_fds`, `env`, `cwd`) or to
//! make it misbehave on request (`sleep`, `fail`, `panic`, `print`, `stderr_flood`).

use std::time::Duration;

use serde_bytes::ByteBuf;

use crate::{HandlerError, Worker};

crate::method!(
    /// Returns its payload unchanged.
    pub Echo, "echo", ByteBuf => ByteBuf);
crate::method!(
    /// Returns its payload unchanged, as a [`Blob`](crate::Blob): a large one is decoded
    /// without a copy, on the host's side as on the worker's.
    pub EchoBlob, "echo_blob", crate::Blob => crate::Blob);
crate::method!(
    /// Returns its payload unchanged, as a plain `Vec<u8>` (no `serde_bytes`): budgeted as bytes
    /// like a byte string, but encoded and decoded one element at a time.
    pub EchoVec, "echo_vec", Vec<u8> => Vec<u8>);
crate::method!(
    /// Adds integers; an overflow is a handler error.
    pub Sum, "sum", Vec<i64> => i64);
crate::method!(
    /// The 64-bit FNV-1a digest of a payload.
    pub Digest, "digest", ByteBuf => u64);
crate::method!(
    /// Sleeps for the given milliseconds, then returns them.
    pub Sleep, "sleep", u64 => u64);
crate::method!(
    /// Always fails with the given message.
    pub Fail, "fail", String => ());
crate::method!(
    /// Panics with the given message.
    pub Panic, "panic", String => ());
crate::method!(
    /// Prints the text to stdout and stderr (stdout must not reach the channel).
    pub Print, "print", String => ());
crate::method!(
    /// Writes the given number of lines to stderr.
    pub StderrFlood, "stderr_flood", u32 => ());
crate::method!(
    /// Counts from 1 to `count`, sending each step as a progress update `pause_ms` apart, then
    /// answers `count`. An update the quota refuses ends the call with a handler error.
    pub CountTo, "count_to", CountRequest => u32, progress u32);
crate::method!(
    /// A blocking handler that works (sleeps in 1 ms steps) for up to the given milliseconds
    /// and stops early when its call is cancelled; answers the milliseconds worked.
    pub Crunch, "crunch", u64 => u64);
crate::method!(
    /// How many `crunch` handlers have stopped early because their call was cancelled.
    pub CrunchesCancelled, "crunches_cancelled", () => u64);
crate::method!(
    /// Returns its payload unchanged, from a blocking handler.
    pub EchoBlocking, "echo_blocking", ByteBuf => ByteBuf);
crate::method!(
    /// Sleeps the given milliseconds in a blocking handler, then answers the name of the thread
    /// it ran on: `main` when the serving thread ran it (the fast path of a worker with
    /// `max_concurrency` 1), else a pool thread's name.
    pub BlockingThread, "blocking_thread", u64 => String);
crate::method!(
    /// Panics with the given message, in a blocking handler.
    pub PanicBlocking, "panic_blocking", String => ());
crate::method!(
    /// The worker's process id.
    pub Pid, "pid", () => u32);
crate::method!(
    /// The file descriptors open in the worker, from `/proc/self/fd`, with what each points at.
    pub OpenFds, "open_fds", () => Vec<(u32, String)>);
crate::method!(
    /// The worker's environment.
    pub Env, "env", () => Vec<(String, String)>);
crate::method!(
    /// The worker's working directory.
    pub Cwd, "cwd", () => String);

/// The request of [`CountTo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CountRequest {
    /// How far to count.
    pub count: u32,
    /// Milliseconds between updates.
    pub pause_ms: u64,
}

/// The 64-bit FNV-1a hash: tiny, dependency-free, and enough to check a payload arrived whole.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The one built-in method with dynamic bodies: it answers its [`Value`](crate::Value)
/// request unchanged (both in the `Value` encoding, for `Host::call_value`).
pub const ECHO_VALUE: &str = "echo_value";

/// `crunch` handlers that saw their token cancelled, in this process.
static CRUNCHES_CANCELLED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A worker serving every built-in method.
pub fn builtin_worker() -> Worker {
    Worker::new()
        .method::<Echo, _, _>(|payload| async move { Ok(payload) })
        .value_method(ECHO_VALUE, |value| async move { Ok(value) })
        .method::<EchoVec, _, _>(|payload| async move { Ok(payload) })
        .method::<EchoBlob, _, _>(|payload| async move { Ok(payload) })
        .method::<Sum, _, _>(|values| async move {
            values
                .iter()
                .try_fold(0i64, |acc, v| acc.checked_add(*v))
                .ok_or_else(|| HandlerError::new("sum overflows i64").with_code(1))
        })
        .method::<Digest, _, _>(|payload| async move { Ok(fnv1a(&payload)) })
        .method::<Sleep, _, _>(|millis| async move {
            tokio::time::sleep(Duration::from_millis(millis)).await;
            Ok(millis)
        })
        .streaming_method::<CountTo, _, _>(|request, mut progress| async move {
            for step in 1..=request.count {
                if request.pause_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(request.pause_ms)).await;
                }
                progress
                    .send(&step)
                    .await
                    .map_err(|e| HandlerError::new(e.to_string()))?;
            }
            Ok(request.count)
        })
        .cancellable_blocking_method::<Crunch, _>(|millis, cancel| {
            for worked in 0..millis {
                if cancel.is_cancelled() {
                    CRUNCHES_CANCELLED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Err(HandlerError::new(format!("cancelled after {worked} ms")));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(millis)
        })
        .blocking_method::<EchoBlocking, _>(Ok)
        .blocking_method::<BlockingThread, _>(|millis| {
            std::thread::sleep(Duration::from_millis(millis));
            Ok(std::thread::current()
                .name()
                .unwrap_or("unnamed")
                .to_owned())
        })
        .blocking_method::<PanicBlocking, _>(|message| std::panic::panic_any(message))
        .method::<CrunchesCancelled, _, _>(|()| async move {
            Ok(CRUNCHES_CANCELLED.load(std::sync::atomic::Ordering::Relaxed))
        })
        .method::<Fail, _, _>(|message| async move { Err(HandlerError::new(message)) })
        .method::<Panic, _, _>(|message| async move { std::panic::panic_any(message) })
        .method::<Print, _, _>(|text| async move {
            println!("{text}");
            eprintln!("{text}");
            Ok(())
        })
        .method::<StderrFlood, _, _>(|lines| async move {
            for i in 0..lines {
                eprintln!("flood line {i} {}", "x".repeat(100));
            }
            Ok(())
        })
        .method::<Pid, _, _>(|()| async move { Ok(std::process::id()) })
        .method::<OpenFds, _, _>(|()| async move {
            let fds = std::fs::read_dir("/proc/self/fd")
                .map_err(|e| HandlerError::new(e.to_string()))?
                .filter_map(|entry| {
                    let entry = entry.ok()?;
                    let fd = entry.file_name().to_str()?.parse().ok()?;
                    let target = std::fs::read_link(entry.path()).ok()?;
                    Some((fd, target.display().to_string()))
                })
                .collect();
            Ok(fds)
        })
        .method::<Env, _, _>(|()| async move { Ok(std::env::vars().collect()) })
        .method::<Cwd, _, _>(|()| async move {
            std::env::current_dir()
                .map(|d| d.display().to_string())
                .map_err(|e| HandlerError::new(e.to_string()))
        })
}
