//! The opt-in low-latency mode: both sides spin briefly before they block.
//!
//! A round trip between processes on different CPUs pays a wake-up on each side: the reader
//! sleeps in the kernel until the writer's data arrives, and waking a sleeping thread costs
//! several microseconds (more in a VM). In the low-latency mode each side keeps polling its
//! channel for a short window after its last message before it sleeps, so an answer that comes
//! within the window is seen without a wake-up.
//!
//! The cost is CPU: each side keeps one CPU busy for up to the window after every message it
//! handles (a window of 50 µs at 10,000 calls/s is half a CPU per side). It is never worth it
//! when both processes share one CPU (the spinner would only delay the peer it waits for), so
//! each side turns it off when it may run on one CPU only.
//!
//! The host asks for it with `HostBuilder::low_latency`; a worker learns the window from its
//! environment ([`SPIN_ENV`]), in whole microseconds. A worker that ignores it is still correct.

use core::time::Duration;

/// The environment variable that carries the spin window to a worker, in microseconds.
pub const SPIN_ENV: &str = "AIRLOCK_SPIN_MICROS";

/// Longest spin window a host may ask for: 10 ms. Beyond that a spinning side is simply busy.
pub const MAX_SPIN: Duration = Duration::from_millis(10);

/// The window to spin for, given the one asked for: `None` (do not spin) when none was asked,
/// when it is zero, or when this process may run on one CPU only.
pub fn effective_window(asked: Option<Duration>) -> Option<Duration> {
    let window = asked.filter(|w| !w.is_zero())?.min(MAX_SPIN);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    (cpus > 1).then_some(window)
}

/// The window a worker was given in its environment, if any (an unparsable value is none).
pub fn window_from_env() -> Option<Duration> {
    let micros: u64 = std::env::var(SPIN_ENV).ok()?.trim().parse().ok()?;
    effective_window(Some(Duration::from_micros(micros)))
}
