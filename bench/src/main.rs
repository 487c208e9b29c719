//! `airlock-bench`: airlock's call path beside its baselines, measured in the same run.
//!
//! ```text
//! cargo xtask bench            # builds release binaries, runs this, updates BENCHMARKS.md
//! airlock-bench --worker target/release/airlock-worker [--quick] [--compare-worker OLD]
//! ```
//!
//! `--compare-worker OLD` adds a baseline to the small-call and pipelined rows: the same host
//! calling a worker binary built from another revision (`cargo xtask bench --compare REV`
//! builds one), so a change to the worker is measured before and after in one run.
//!
//! Every airlock figure sits beside the baselines measured in the same repetitions,
//! interleaved (the order flips on every repetition), so a machine whose speed drifts moves
//! both alike; the table shows medians with min–max and the ratio of medians. Rows run in two
//! child processes: one pinned to a single CPU (host, worker and peers share it, so a round
//! trip is two context switches in every variant), one left to the scheduler.
//!
//! This is a crate of its own so that the baselines' dependencies (servo's `ipc-channel`) are
//! built only for benchmarking, never for the tests. The raw baselines' far ends are this same
//! binary, re-executed as `airlock-bench peer <role>` (see `peer.rs`); so is the worker of the
//! host's peak-RSS row, `airlock-bench worker` (see `fill_worker.rs`), and each of that row's
//! repetitions, `airlock-bench rss-sample` (see `peak_rss.rs`).

// `deny`, not `forbid`: `alloc_count` implements the unsafe trait `GlobalAlloc` (a counting
// wrapper around the system allocator) and allows it there alone.
#![deny(unsafe_code)]

mod alloc_count;
mod fill_worker;
mod held_memory;
mod links;
mod multiplexed;
mod peak_rss;
mod peer;
mod phases;
mod proc_stats;
mod session_link;
mod spawn_phases;
mod table;
mod targets;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use links::Error;
use table::Row;

const USAGE: &str = "usage: airlock-bench --worker PATH [--quick] [--compare-worker PATH] [--json PATH] [--markdown PATH]";

/// What a run was asked to do.
struct Options {
    worker: String,
    compare: Option<String>,
    quick: bool,
    json: Option<PathBuf>,
    markdown: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("peer") => {
            peer::run(args.get(1).map_or("", String::as_str), &args[2..]).map_err(Error::from)
        }
        Some("worker") => fill_worker::serve(),
        Some("rss-sample") => peak_rss::sample(&args[1..]),
        Some("phase") => phase(&args[1..]),
        Some("calls") => profile_calls(&args[1..]),
        Some("spawns") => profile_spawns(&args[1..]),
        Some("held") => profile_held_memory(&args[1..]),
        Some("codec") => profile_codec(&args[1..]),
        _ => options(&args).and_then(|o| orchestrate(&o)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("airlock-bench: {err}");
            ExitCode::FAILURE
        }
    }
}

fn options(args: &[String]) -> Result<Options, Error> {
    let mut options = Options {
        worker: String::new(),
        compare: None,
        quick: false,
        json: None,
        markdown: None,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--worker" => options.worker = args.next().ok_or(USAGE)?.clone(),
            "--compare-worker" => options.compare = Some(args.next().ok_or(USAGE)?.clone()),
            "--json" => options.json = Some(args.next().ok_or(USAGE)?.into()),
            "--markdown" => options.markdown = Some(args.next().ok_or(USAGE)?.into()),
            _ => return Err(USAGE.into()),
        }
    }
    if options.worker.is_empty() {
        return Err(USAGE.into());
    }
    Ok(options)
}

/// Runs each phase in a child of its own (pinning is per process), then prints and writes the
/// rows.
fn orchestrate(options: &Options) -> Result<(), Error> {
    let started = proc_stats::CpuTicks::now()?;
    let mut rows: Vec<Row> = Vec::new();
    for phase in phases::PHASES {
        eprintln!("airlock-bench: phase {phase}...");
        let mut command = Command::new(std::env::current_exe()?);
        command.args(["phase", phase, "--worker", &options.worker]);
        if options.quick {
            command.arg("--quick");
        }
        if let Some(old) = &options.compare {
            command.args(["--compare-worker", old]);
        }
        let out = command.stderr(Stdio::inherit()).output()?;
        if !out.status.success() {
            return Err(format!("phase {phase} failed: {}", out.status).into());
        }
        let part: Vec<Row> = postcard::from_bytes(&out.stdout)?;
        rows.extend(part);
    }
    let table = table::markdown(&rows);
    let verdicts = targets::markdown(&rows);
    println!("{table}\n{verdicts}");
    let command = if options.quick {
        "cargo xtask bench --quick"
    } else {
        "cargo xtask bench"
    };
    let run = table::Run {
        machine: machine(),
        command,
        date: today(),
        stolen: proc_stats::CpuTicks::now()?.stolen_since(started),
    };
    if let Some(path) = &options.json {
        std::fs::write(path, table::json(&rows, &run))?;
        eprintln!("airlock-bench: wrote {}", path.display());
    }
    if let Some(path) = &options.markdown {
        update_markdown(path, &run, &table, &verdicts)?;
        eprintln!("airlock-bench: updated {}", path.display());
    }
    Ok(())
}

/// `phase NAME --worker PATH [--quick]`: one phase's rows, postcard-encoded on stdout.
fn phase(args: &[String]) -> Result<(), Error> {
    let name = args.first().ok_or(USAGE)?;
    let options = options(&args[1..])?;
    let rows = phases::run(
        name,
        &options.worker,
        options.compare.as_deref(),
        options.quick,
    )?;
    let bytes = postcard::to_allocvec(&rows)?;
    std::io::stdout().write_all(&bytes)?;
    Ok(())
}

/// `spawns N --worker PATH [--unconfined] [--resident MIB] [--threads T] [--gap MS] [--pool K]`:
/// N spawns to ready beside raw spawns, split into the host's launch and handshake phases
/// (`spawn_phases.rs`), on a current-thread runtime or one of T threads (the bench's spawn rows
/// use 2), each after MS milliseconds idle with `--gap`; with `--pool K`, instead N `Pool`s of
/// K beside K spawns one after another.
fn profile_spawns(args: &[String]) -> Result<(), Error> {
    let n: u32 = args.first().ok_or(USAGE)?.parse()?;
    let unconfined = args.iter().any(|a| a == "--unconfined");
    // `--resident MIB`: the host first fills that much memory of its own, as a host with data
    // of its own would have it (a fork copies the page tables of all of it).
    let resident = number_after(args, "--resident")?;
    let threads = number_after(args, "--threads")?.unwrap_or(0) as usize;
    let pool = number_after(args, "--pool")?;
    let gap = number_after(args, "--gap")?.map(|ms| std::time::Duration::from_millis(ms.into()));
    let mut rest = Vec::new();
    let mut given = args[1..].iter();
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "--unconfined" => {}
            "--resident" | "--threads" | "--pool" | "--gap" => {
                given.next();
            }
            _ => rest.push(arg.clone()),
        }
    }
    let options = options(&rest)?;
    let ballast = vec![1u8; resident.unwrap_or(0) as usize * 1024 * 1024];
    match pool {
        Some(size) => spawn_phases::pools(n, &options.worker, unconfined, threads, size as usize)?,
        None => spawn_phases::run(n, &options.worker, unconfined, threads, gap)?,
    }
    drop(std::hint::black_box(ballast));
    Ok(())
}

/// `held N --worker PATH [--unconfined] [--resident MIB]`: the memory N workers keep once
/// their host rewrites its data (`held_memory.rs`).
fn profile_held_memory(args: &[String]) -> Result<(), Error> {
    let n: u32 = args.first().ok_or(USAGE)?.parse()?;
    let unconfined = args.iter().any(|a| a == "--unconfined");
    let resident = number_after(args, "--resident")?.unwrap_or(1024);
    let worker = value_after(args, "--worker")?;
    held_memory::run(n, &worker, unconfined, resident)
}

/// `codec N airlock|postcard`: N decodes of the codec row's table with one decoder and nothing
/// else, for `valgrind --tool=callgrind` and `perf stat` to compare the two inside this binary.
fn profile_codec(args: &[String]) -> Result<(), Error> {
    let n: u32 = args.first().ok_or(USAGE)?.parse()?;
    let decoder = match args.get(1).map(String::as_str) {
        Some("airlock") => phases::Decoder::Airlock,
        Some("postcard") => phases::Decoder::Postcard,
        _ => return Err(USAGE.into()),
    };
    let each = phases::profile_codec(n, decoder)?;
    eprintln!("{n} decodes: {:.2} ms each", each.as_secs_f64() * 1e3);
    Ok(())
}

/// The argument after `flag`, which must be there.
fn value_after(args: &[String], flag: &str) -> Result<String, Error> {
    let at = args.iter().position(|a| a == flag).ok_or(USAGE)?;
    Ok(args.get(at + 1).ok_or(USAGE)?.clone())
}

/// `calls N --worker PATH [--unconfined] [--socket] [--window W] [--threads T] [--body BYTES
/// [--blob] [--raw-store]] [--spin MICROS] [--tokio-floor] [--tokio-multiplexed [--work NANOS]]
/// [--session-only [--blocking] [--worker-session]] [--raw] [--ipc]`:
/// N small calls on one current-thread host (with `--socket`, over an inherited socket; with
/// `--window`, W at a time on a 2-thread host; with
/// `--threads`, on a host of T runtime threads, 0 for current-thread; with `--body`, echoes of
/// that size, as a `ByteBuf` or with `--blob` a `Blob`, and with `--raw-store` each beside a
/// raw store-and-forward echo of the same body, alternating (medians of both printed); with `--spin`, in the low-latency mode
/// with that window). With no host at all:
/// `--raw` and `--ipc`, N round trips of the pinned row's raw blocking pipe or ipc-channel;
/// `--tokio-floor`, N round trips of the async floor (tokio and the raw echo peer);
/// `--tokio-multiplexed`, N messages from W tasks (`--window`, default 256) on a runtime of
/// `--threads` T (default 2) to the raw echo peer, each task busy for `--work` NANOS before
/// each message (the pipelined rows' "tokio alone" baseline, with work added per call);
/// `--session-only`, N calls made by airlock's host session driven in line by the caller
/// (on tokio, W at a time with `--window`, or with `--blocking` one at a time on blocking
/// pipes) against the bundled worker or, with
/// `--worker-session`, airlock's worker session alone. Nothing else runs, for a profiler to
/// look at (`strace -f -c`, `perf record`, `valgrind --tool=callgrind --trace-children=yes`).
fn profile_calls(args: &[String]) -> Result<(), Error> {
    let n: u32 = args.first().ok_or(USAGE)?.parse()?;
    if args.iter().any(|a| a == "--tokio-floor") {
        let rt = links::runtime(0)?;
        let elapsed = links::TokioLink::echo(&rt)?.round_trips(&rt, n)?;
        report_calls(n, elapsed);
        return Ok(());
    }
    // `--raw` / `--ipc`: the pinned row's baselines alone, for a profile of the same length.
    if args.iter().any(|a| a == "--raw") {
        let elapsed = links::RawLink::echo(links::Raw::Pipe)?.round_trips(n)?;
        report_calls(n, elapsed);
        return Ok(());
    }
    if args.iter().any(|a| a == "--ipc") {
        let elapsed = links::IpcLink::start()?.round_trips(n)?;
        report_calls(n, elapsed);
        return Ok(());
    }
    if args.iter().any(|a| a == "--tokio-multiplexed") {
        let threads = number_after(args, "--threads")?.unwrap_or(2);
        let window = number_after(args, "--window")?.unwrap_or(256);
        let work =
            std::time::Duration::from_nanos(number_after(args, "--work")?.unwrap_or(0).into());
        let rt = links::runtime(threads as usize)?;
        let elapsed =
            multiplexed::MultiplexedLink::with_work(&rt, work)?.pipelined(&rt, n, window)?;
        report_calls(n, elapsed);
        return Ok(());
    }
    if args.iter().any(|a| a == "--session-only") {
        use session_link::{SessionLink, Worker};
        let flagged = |flag: &str| args.iter().any(|a| a == flag);
        let path = value_after(args, "--worker")?;
        let worker = if flagged("--worker-session") {
            Worker::SessionAlone
        } else {
            Worker::Bundled(&path)
        };
        let elapsed = if let Some(window) = number_after(args, "--window")? {
            let rt = links::runtime(0)?;
            SessionLink::on_tokio(&rt, worker)?.pipelined_async(&rt, n, window)?
        } else if flagged("--blocking") {
            SessionLink::blocking(worker)?.round_trips_blocking(n)?
        } else {
            let rt = links::runtime(0)?;
            SessionLink::on_tokio(&rt, worker)?.round_trips_async(&rt, n)?
        };
        report_calls(n, elapsed);
        return Ok(());
    }
    // `--unconfined`: a profiler that follows children cannot trace into the sandbox.
    let unconfined = args.iter().any(|a| a == "--unconfined");
    // `--window W`: W calls in flight on a 2-thread host, as the pipelined rows make them.
    let window = number_after(args, "--window")?;
    // `--body BYTES`: echo bodies of that size, one at a time, on a host whose `max_frame`
    // fits them (the bulk rows' calls).
    let body = number_after(args, "--body")?;
    // `--spin MICROS`: the host's opt-in low-latency mode with that window.
    let spin = number_after(args, "--spin")?;
    let threads = number_after(args, "--threads")?;
    let mut rest = Vec::new();
    let mut given = args[1..].iter();
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "--unconfined" | "--from-task" | "--blob" | "--raw-store" | "--socket" => {}
            "--window" | "--body" | "--spin" | "--threads" => {
                given.next();
            }
            _ => rest.push(arg.clone()),
        }
    }
    let options = options(&rest)?;
    let default_threads = if window.is_some() { 2 } else { 0 };
    let rt = links::runtime(threads.map_or(default_threads, |t| t as usize))?;
    let policy = if unconfined {
        airlock_host::Confinement::none()
    } else {
        airlock_host::Confinement::strict()
    };
    let mut builder = airlock_host::Host::builder(&options.worker).confinement(policy);
    if args.iter().any(|a| a == "--socket") {
        builder = builder.transport(airlock_host::TransportChoice::SocketInherited);
    }
    if let Some(micros) = spin {
        builder = builder.low_latency(std::time::Duration::from_micros(u64::from(micros)));
    }
    if let Some(len) = body {
        let max_frame = len.saturating_add(4096);
        builder = builder.protocol(airlock_host::HostConfig::default().max_frame(max_frame)?);
    }
    let host = rt.block_on(builder.spawn())?;
    let elapsed = match (window, body) {
        (Some(window), _) => links::pipelined(&rt, &host, n, window)?,
        (None, Some(len)) => {
            let bytes = vec![0xa5u8; len as usize];
            let mut total = std::time::Duration::ZERO;
            if args.iter().any(|a| a == "--raw-store") {
                let body = airlock_host::Blob::from(bytes);
                let mut raw = links::RawLink::piped("bulk-store")?;
                let mut back = Vec::new();
                let (mut ours, mut theirs) = (Vec::new(), Vec::new());
                for _ in 0..n {
                    let one = links::bulk::<airlock_worker::builtin::EchoBlob>(&rt, &host, &body)?;
                    total += one;
                    ours.push(one);
                    theirs.push(raw.bulk(&body, &mut back)?);
                }
                let millis = |d: Vec<std::time::Duration>| {
                    spawn_phases::median(d.iter().map(|d| d.as_secs_f64() * 1e3).collect())
                };
                let (ours, theirs) = (millis(ours), millis(theirs));
                eprintln!(
                    "median: airlock {ours:.2} ms, raw store-and-forward {theirs:.2} ms, {:.2}× raw's speed",
                    theirs / ours
                );
            } else if args.iter().any(|a| a == "--blob") {
                let body = airlock_host::Blob::from(bytes);
                for _ in 0..n {
                    total += links::bulk::<airlock_worker::builtin::EchoBlob>(&rt, &host, &body)?;
                }
            } else {
                let body = serde_bytes::ByteBuf::from(bytes);
                for _ in 0..n {
                    total += links::bulk::<airlock_worker::builtin::Echo>(&rt, &host, &body)?;
                }
            }
            total
        }
        (None, None) if args.iter().any(|a| a == "--from-task") => {
            links::calls_from_task(&rt, &host, n)?
        }
        (None, None) => links::calls(&rt, &host, n)?,
    };
    rt.block_on(host.shutdown());
    report_calls(n, elapsed);
    Ok(())
}

fn report_calls(n: u32, elapsed: std::time::Duration) {
    eprintln!(
        "{n} calls: {:.2} µs each",
        elapsed.as_secs_f64() * 1e6 / f64::from(n)
    );
}

/// The number after `flag` in `args`, if the flag is there.
fn number_after(args: &[String], flag: &str) -> Result<Option<u32>, Error> {
    match args.iter().position(|a| a == flag) {
        Some(at) => Ok(Some(args.get(at + 1).ok_or(USAGE)?.parse()?)),
        None => Ok(None),
    }
}

const BEGIN: &str = "<!-- airlock-bench:begin (written by `cargo xtask bench`) -->";
const END: &str = "<!-- airlock-bench:end -->";

/// Replaces the generated part of `BENCHMARKS.md`, keeping what people wrote around it.
fn update_markdown(
    path: &Path,
    run: &table::Run,
    table: &str,
    verdicts: &str,
) -> Result<(), Error> {
    let generated = format!("{BEGIN}\n{}\n\n{table}\n{verdicts}{END}", run.markdown());
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(start), Some(end)) if start < end => {
            format!("{}{generated}{}", &old[..start], &old[end + END.len()..])
        }
        _ => format!("# Benchmarks\n\n{generated}\n"),
    };
    std::fs::write(path, new)?;
    Ok(())
}

/// The CPU model, its count and the kernel, as this machine reports them.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU", |(_, m)| m.trim())
        .to_owned();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} × {model}, Linux {}", kernel.trim())
}

/// Today's date (UTC), from `date`.
fn today() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(|| "unknown date".into(), |d| d.trim().to_owned())
}
