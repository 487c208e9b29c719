//! `airlock bench`: the worker's `echo` beside a raw pipe echo, measured in the same run.
//!
//! The raw echo is this tool re-executed (`airlock raw-echo`, hidden): one blocking read of a
//! 64-byte message from its stdin, one write of it to its stdout, with no framing, no checks
//! and no runtime. That is the floor under any call over a pipe pair. Each repetition times
//! one burst of every series, in an order that flips on every repetition, so a machine whose
//! speed drifts moves both alike; the figures are medians over the repetitions.
//!
//! The worker must serve the built-in `echo` method (bytes in, the same bytes out), as the
//! bundled `airlock-worker` does; for a full table with more baselines there is
//! `cargo xtask bench`.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use airlock_host::{CallError, Host};
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

use crate::error::CliError;

/// Bytes each way per call, in both series.
const MESSAGE: usize = 64;
/// Untimed round trips on each series before the first repetition.
const WARM_UP: u32 = 200;

/// `airlock bench [--reps N] [--calls N] [--window N] WORKER [-- ARGS...]`
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Repetitions; each times one burst of every series.
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=1000))]
    reps: u32,
    /// Calls per burst.
    #[arg(long, default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    calls: u32,
    /// Calls in flight for the throughput figure.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=256))]
    window: u32,
    /// The worker program.
    worker: PathBuf,
    /// Arguments for the worker program, after `--`.
    #[arg(last = true)]
    args: Vec<OsString>,
}

/// Spawns the worker and the raw echo, measures both, prints the figures.
pub async fn run(args: Args) -> Result<(), CliError> {
    let host = crate::host_builder(args.worker.clone(), args.args)
        .spawn()
        .await?;
    let measured = measure(&host, args.reps, args.calls, args.window).await;
    host.shutdown().await;
    let figures = measured?;
    let text = render(&args.worker, args.reps, args.window, &figures);
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|err| CliError::local("could not write the figures", err))
}

/// Samples of one measure: airlock's and the raw echo's, one per repetition.
#[derive(Debug, Default)]
struct Samples {
    airlock: Vec<f64>,
    raw: Vec<f64>,
}

/// Both measures.
#[derive(Debug, Default)]
struct Figures {
    /// Microseconds per round trip.
    round_trip: Samples,
    /// Thousands of calls per second with `window` in flight.
    throughput: Samples,
}

async fn measure(host: &Host, reps: u32, calls: u32, window: u32) -> Result<Figures, CliError> {
    let mut raw = RawEcho::start()?;
    let message = ByteBuf::from(vec![0x5a; MESSAGE]);
    let lost = |err| CliError::call("echo", err);
    let echo_failed = |err| CliError::local("the raw echo failed", err);
    airlock_round_trips(host, &message, WARM_UP)
        .await
        .map_err(lost)?;
    raw.round_trips(WARM_UP).map_err(echo_failed)?;

    let micros = |elapsed: Duration| elapsed.as_secs_f64() * 1e6 / f64::from(calls);
    let kilo_per_sec = |elapsed: Duration| f64::from(calls) / elapsed.as_secs_f64() / 1e3;
    let mut figures = Figures::default();
    for rep in 0..reps {
        let airlock_first = rep % 2 == 0;
        for raw_turn in [!airlock_first, airlock_first] {
            if raw_turn {
                let elapsed = raw.round_trips(calls).map_err(echo_failed)?;
                figures.round_trip.raw.push(micros(elapsed));
                let elapsed = raw.pipelined(calls, window).map_err(echo_failed)?;
                figures.throughput.raw.push(kilo_per_sec(elapsed));
            } else {
                let elapsed = airlock_round_trips(host, &message, calls)
                    .await
                    .map_err(lost)?;
                figures.round_trip.airlock.push(micros(elapsed));
                let elapsed = airlock_pipelined(host, &message, calls, window)
                    .await
                    .map_err(lost)?;
                figures.throughput.airlock.push(kilo_per_sec(elapsed));
            }
        }
    }
    Ok(figures)
}

/// `n` sequential `echo` calls.
async fn airlock_round_trips(
    host: &Host,
    message: &ByteBuf,
    n: u32,
) -> Result<Duration, CallError> {
    let started = Instant::now();
    for _ in 0..n {
        host.call::<Echo>(message).await?;
    }
    Ok(started.elapsed())
}

/// `n` `echo` calls with `window` in flight: one task per slot of the window.
async fn airlock_pipelined(
    host: &Host,
    message: &ByteBuf,
    n: u32,
    window: u32,
) -> Result<Duration, CallError> {
    let started = Instant::now();
    let mut slots = tokio::task::JoinSet::new();
    for slot in 0..window.min(n) {
        let share = n / window + u32::from(slot < n % window);
        let host = host.clone();
        let message = message.clone();
        slots.spawn(async move {
            for _ in 0..share {
                host.call::<Echo>(&message).await?;
            }
            Ok::<(), CallError>(())
        });
    }
    while let Some(slot) = slots.join_next().await {
        match slot {
            Ok(calls) => calls?,
            // A slot's task is never aborted; it ends early only by panicking.
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    Ok(started.elapsed())
}

/// The raw baseline's near end: the re-executed tool on two pipes.
struct RawEcho {
    child: Child,
    to: ChildStdin,
    from: ChildStdout,
}

impl RawEcho {
    fn start() -> Result<Self, CliError> {
        let failed = |err| CliError::local("could not start the raw echo", err);
        let exe = std::env::current_exe().map_err(failed)?;
        let mut child = Command::new(exe)
            .arg("raw-echo")
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(failed)?;
        match (child.stdin.take(), child.stdout.take()) {
            (Some(to), Some(from)) => Ok(Self { child, to, from }),
            _ => Err(failed(std::io::Error::other("its pipes were not set up"))),
        }
    }

    /// `n` round trips of one message.
    fn round_trips(&mut self, n: u32) -> std::io::Result<Duration> {
        let mut message = [0x5a; MESSAGE];
        let started = Instant::now();
        for _ in 0..n {
            self.to.write_all(&message)?;
            self.from.read_exact(&mut message)?;
        }
        Ok(started.elapsed())
    }

    /// `n` messages with `window` in flight, one write per message on both sides. The window
    /// (at most 256 messages, 16 KiB) fits in a pipe's buffer, so the writes never block
    /// while the answers wait to be read.
    fn pipelined(&mut self, n: u32, window: u32) -> std::io::Result<Duration> {
        let message = [0x5a; MESSAGE];
        let mut answer = [0; MESSAGE];
        let started = Instant::now();
        let mut sent = 0;
        while sent < window.min(n) {
            self.to.write_all(&message)?;
            sent += 1;
        }
        for _ in 0..n {
            self.from.read_exact(&mut answer)?;
            if sent < n {
                self.to.write_all(&message)?;
                sent += 1;
            }
        }
        Ok(started.elapsed())
    }
}

impl Drop for RawEcho {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The far end of the raw baseline (`airlock raw-echo`): each 64-byte message read from stdin
/// is written back to stdout at once, until stdin ends.
pub fn raw_echo() -> std::io::Result<()> {
    // Plain files on the descriptors: std's `Stdout` buffers by line, and would hold every
    // answer back.
    use std::os::fd::AsFd;
    let mut from = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let mut to = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let mut message = [0; MESSAGE];
    loop {
        match from.read_exact(&mut message) {
            Ok(()) => to.write_all(&message)?,
            Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(err) => return Err(err),
        }
    }
}

/// Median, least and greatest of `samples` (at least one).
fn spread(samples: &[f64]) -> (f64, f64, f64) {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    };
    (median, sorted[0], sorted[sorted.len() - 1])
}

fn render(worker: &std::path::Path, reps: u32, window: u32, figures: &Figures) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "airlock bench: `echo` of {MESSAGE} bytes on {}, beside a raw pipe echo; \
         {reps} repetitions interleaved; medians (min-max)",
        worker.display()
    );
    let rows = [
        ("round trip, µs per call".to_owned(), &figures.round_trip),
        (
            format!("throughput, k calls/s, {window} in flight"),
            &figures.throughput,
        ),
    ];
    for (label, samples) in rows {
        let (airlock, airlock_min, airlock_max) = spread(&samples.airlock);
        let (raw, raw_min, raw_max) = spread(&samples.raw);
        let _ = writeln!(
            out,
            "{:<41} airlock {airlock:.2} ({airlock_min:.2}-{airlock_max:.2})  \
             raw pipe {raw:.2} ({raw_min:.2}-{raw_max:.2})  ratio {:.2}",
            format!("{label}:"),
            airlock / raw
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(spread(&[4.0, 1.0, 3.0, 2.0]), (2.5, 1.0, 4.0));
        assert_eq!(spread(&[5.0, 1.0, 3.0]), (3.0, 1.0, 5.0));
        assert_eq!(spread(&[7.0]), (7.0, 7.0, 7.0));
    }
}
