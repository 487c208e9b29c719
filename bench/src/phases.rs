//! The rows of each phase, and the interleaving that measures them.
//!
//! A phase builds every link first (hosts spawned, peers started), then runs `reps`
//! repetitions; in each, every row measures its airlock series and its baselines one burst
//! each, in an order that flips on every repetition.

use std::cell::RefCell;
use std::time::Duration;

use airlock_host::{Confinement, Host, HostConfig, TransportChoice};

use airlock_host::Blob;
use airlock_worker::builtin::{Echo, EchoBlob, EchoBlocking};
use serde_bytes::ByteBuf;
use tokio::runtime::Runtime;

use crate::alloc_count;
use crate::links::{self, Error, IpcLink, Raw, RawLink, TokioLink};
use crate::multiplexed::MultiplexedLink;
use crate::proc_stats::{cpu_nanos, minor_faults};
use crate::session_link::{SessionLink, Worker as SessionWorker};
use crate::table::{Row, Unit};

/// The phases, each run in a process of its own (`peak-rss` starts a fresh one per repetition:
/// see `peak_rss.rs`).
pub const PHASES: [&str; 3] = ["pinned", "unpinned", "peak-rss"];

/// One burst of one series: its figure in the row's unit.
type Burst<'a> = Box<dyn FnMut() -> Result<f64, Error> + 'a>;

/// A row and the bursts that fill it: `bursts[0]` is airlock's, then one per baseline.
struct Measured<'a> {
    row: Row,
    bursts: Vec<Burst<'a>>,
}

/// Rows whose figures are by-products of another row's bursts (the page faults of a timed bulk
/// echo, the bytes of a counted call): the bursts record into them as they run, so both rows
/// come from the same repetitions.
struct ByProducts(RefCell<Vec<Row>>);

impl ByProducts {
    fn new() -> Self {
        Self(RefCell::new(Vec::new()))
    }

    /// Adds `row`; returns its index for [`record`](Self::record).
    fn add(&self, row: Row) -> usize {
        let mut rows = self.0.borrow_mut();
        rows.push(row);
        rows.len() - 1
    }

    /// One sample for row `row`: series 0 is its airlock series, `k` its `k`-th baseline.
    fn record(&self, row: usize, series: usize, figure: f64) {
        let mut rows = self.0.borrow_mut();
        let row = &mut rows[row];
        let series = match series {
            0 => &mut row.airlock,
            k => &mut row.baselines[k - 1],
        };
        series.samples.push(figure);
    }

    fn into_rows(self) -> Vec<Row> {
        self.0.into_inner()
    }
}

/// Scales for one run: repetitions and burst lengths.
#[derive(Clone, Copy)]
struct Scale {
    reps: usize,
    /// Multiplies every burst's operation count.
    size: u32,
}

fn micros_per(n: u32, elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * 1e6 / f64::from(n)
}

fn kilo_per_sec(n: u32, elapsed: Duration) -> f64 {
    f64::from(n) / elapsed.as_secs_f64() / 1e3
}

/// Runs phase `name`.
pub fn run(name: &str, worker: &str, old: Option<&str>, quick: bool) -> Result<Vec<Row>, Error> {
    let scale = if quick {
        Scale { reps: 5, size: 1 }
    } else {
        Scale { reps: 15, size: 3 }
    };
    match name {
        "pinned" => {
            pin_to_one_cpu()?;
            let mut rows = small_calls("pinned", worker, old, scale)?;
            rows.extend(allocations(worker, scale)?);
            Ok(rows)
        }
        "unpinned" => {
            let mut rows = spawn_and_codec(worker, scale)?;
            rows.extend(small_calls("unpinned", worker, old, scale)?);
            rows.extend(throughput(worker, old, scale)?);
            Ok(rows)
        }
        "peak-rss" => crate::peak_rss::row(scale.reps, scale.size),
        other => Err(format!("unknown phase {other}").into()),
    }
}

fn interleave(mut measured: Vec<Measured<'_>>, reps: usize) -> Result<Vec<Row>, Error> {
    for rep in 0..reps {
        for m in &mut measured {
            let count = m.bursts.len();
            for k in 0..count {
                let i = if rep % 2 == 0 { k } else { count - 1 - k };
                let figure = (m.bursts[i])()?;
                let series = if i == 0 {
                    &mut m.row.airlock
                } else {
                    &mut m.row.baselines[i - 1]
                };
                series.samples.push(figure);
            }
        }
    }
    Ok(measured.into_iter().map(|m| m.row).collect())
}

/// The small call taken apart, pinned: `Host::call` to a confined worker (from `block_on`'s
/// future and from a spawned task) and to an unconfined one, beside airlock's host session
/// driven in line by the caller (no task, cell, timer or stats; `session_link`), with the bundled worker
/// or the worker session alone, on tokio or on blocking pipes, then tokio with nothing on top
/// and the raw pipe. Each step down removes one layer, so each ratio is what that layer costs.
fn layers<'a>(
    current: &'a Runtime,
    worker: &'a str,
    host: &'a Host,
    unconfined: &'a Host,
    n: u32,
) -> Result<Measured<'a>, Error> {
    let mut on_tokio = SessionLink::on_tokio(current, SessionWorker::Bundled(worker))?;
    let mut blocking = SessionLink::blocking(SessionWorker::Bundled(worker))?;
    let mut alone_on_tokio = SessionLink::on_tokio(current, SessionWorker::SessionAlone)?;
    let mut alone_blocking = SessionLink::blocking(SessionWorker::SessionAlone)?;
    let mut floor = TokioLink::echo(current)?;
    let mut raw = RawLink::echo(Raw::Pipe)?;
    Ok(Measured {
        row: Row::new(
            "the small call's layers, pinned: Host::call beside airlock's sessions alone, \
             tokio alone and the raw pipe",
            Unit::Micros,
            "Host::call Echo 64 B",
            &[
                "the same from tokio::spawn",
                "Host::call Echo 64 B, Confinement::none() (its calls go through the writer task)",
                "host session in line on tokio, a deadline timer per call, bundled worker (unconfined)",
                "host session in line, blocking pipes (no deadline kept), bundled worker (unconfined)",
                "host session in line on tokio, a deadline timer per call, worker session alone",
                "both sessions alone, blocking pipes (no deadline kept)",
                "tokio alone: a pipe round trip to the raw echo peer",
                "raw blocking pipe",
            ],
        ),
        bursts: vec![
            Box::new(move || Ok(micros_per(n, links::calls(current, host, n)?))),
            Box::new(move || Ok(micros_per(n, links::calls_from_task(current, host, n)?))),
            Box::new(move || Ok(micros_per(n, links::calls(current, unconfined, n)?))),
            Box::new(move || Ok(micros_per(n, on_tokio.round_trips_async(current, n)?))),
            Box::new(move || Ok(micros_per(n, blocking.round_trips_blocking(n)?))),
            Box::new(move || Ok(micros_per(n, alone_on_tokio.round_trips_async(current, n)?))),
            Box::new(move || Ok(micros_per(n, alone_blocking.round_trips_blocking(n)?))),
            Box::new(move || Ok(micros_per(n, floor.round_trips(current, n)?))),
            Box::new(move || Ok(micros_per(n, raw.round_trips(n)?))),
        ],
    })
}

/// Small round trips: `Host::call` of a 64-byte `Echo` beside raw pipes, raw sockets,
/// ipc-channel and Python.
fn small_calls(
    regime: &str,
    worker: &str,
    old: Option<&str>,
    scale: Scale,
) -> Result<Vec<Row>, Error> {
    let n = 1000 * scale.size;
    let current = links::runtime(0)?;
    let multi = links::runtime(2)?;
    let pipe_host = links::spawn_piped(&current, worker)?;
    let multi_host = links::spawn_piped(&multi, worker)?;
    let socket_host = links::spawn_host(
        &current,
        worker,
        TransportChoice::SocketInherited,
        Confinement::strict(),
    )?;
    let mut raw_pipe = RawLink::echo(Raw::Pipe)?;
    let mut raw_pipe_2 = RawLink::echo(Raw::Pipe)?;
    let mut raw_socket = RawLink::echo(Raw::Socket)?;
    let mut raw_socket_2 = RawLink::echo(Raw::Socket)?;
    let mut ipc = IpcLink::start()?;
    let python = links::python_available();

    let mut first = Row::new(
        format!("small call, {regime}, pipe, current-thread host"),
        Unit::Micros,
        "Host::call Echo 64 B",
        &[
            "raw blocking pipe",
            "ipc-channel typed",
            "Python multiprocessing Pipe + pickle",
        ],
    );
    let mut first_bursts: Vec<Burst<'_>> = vec![
        Box::new(|| Ok(micros_per(n, links::calls(&current, &pipe_host, n)?))),
        Box::new(|| Ok(micros_per(n, raw_pipe.round_trips(n)?))),
        Box::new(|| Ok(micros_per(n, ipc.round_trips(n)?))),
    ];
    if python {
        first_bursts.push(Box::new(move || {
            Ok(micros_per(n, links::python_round_trips(n)?))
        }));
    } else {
        first.baselines.pop();
        println_skip("python3 not found: the Python baseline is skipped");
    }
    let old_host = match old {
        Some(old) => Some(links::spawn_piped(&current, old)?),
        None => None,
    };
    if let Some(old_host) = old_host.clone() {
        let current = &current;
        first.baselines.push(crate::table::Series::new(COMPARED));
        first_bursts.push(Box::new(move || {
            Ok(micros_per(n, links::calls(current, &old_host, n)?))
        }));
    }
    // The opt-in low-latency mode only pays off when host and worker run on different CPUs.
    let spin_host = match regime {
        "unpinned" => Some(links::spawn_low_latency_host(
            &current,
            worker,
            Duration::from_micros(50),
        )?),
        _ => None,
    };
    let mut raw_pipe_3 = RawLink::echo(Raw::Pipe)?;
    let mut raw_pipe_4 = RawLink::echo(Raw::Pipe)?;
    let mut raw_pipe_5 = RawLink::echo(Raw::Pipe)?;
    let mut ipc_2 = IpcLink::start()?;
    let one_slot_host = links::spawn_one_slot_host(&current, worker)?;
    // The layers row, pinned only: the targets it explains are the pinned small call's.
    let unconfined_host = match regime {
        "pinned" => Some(links::spawn_host(
            &current,
            worker,
            TransportChoice::Pipe,
            Confinement::none(),
        )?),
        _ => None,
    };
    let mut measured = vec![
        Measured {
            row: first,
            bursts: first_bursts,
        },
        Measured {
            row: Row::new(
                format!("small call, {regime}, pipe, 2-thread host"),
                Unit::Micros,
                "Host::call Echo 64 B from block_on (as #[tokio::main] calls)",
                &[
                    "raw blocking pipe",
                    "the same host, Host::call from tokio::spawn",
                ],
            ),
            bursts: vec![
                Box::new(|| Ok(micros_per(n, links::calls(&multi, &multi_host, n)?))),
                Box::new(|| Ok(micros_per(n, raw_pipe_2.round_trips(n)?))),
                Box::new(|| {
                    Ok(micros_per(
                        n,
                        links::calls_from_task(&multi, &multi_host, n)?,
                    ))
                }),
            ],
        },
        Measured {
            row: Row::new(
                format!("small call, {regime}, inherited socket, current-thread host"),
                Unit::Micros,
                "Host::call Echo 64 B",
                &["raw Unix socket"],
            ),
            bursts: vec![
                Box::new(|| Ok(micros_per(n, links::calls(&current, &socket_host, n)?))),
                Box::new(|| Ok(micros_per(n, raw_socket.round_trips(n)?))),
            ],
        },
        Measured {
            row: Row::new(
                format!(
                    "small call, {regime}, pipe, current-thread host, caller in a spawned task"
                ),
                Unit::Micros,
                "Host::call Echo 64 B from tokio::spawn",
                &["raw blocking pipe", "ipc-channel typed"],
            ),
            bursts: vec![
                Box::new(|| {
                    Ok(micros_per(
                        n,
                        links::calls_from_task(&current, &pipe_host, n)?,
                    ))
                }),
                Box::new(|| Ok(micros_per(n, raw_pipe_5.round_trips(n)?))),
                Box::new(|| Ok(micros_per(n, ipc_2.round_trips(n)?))),
            ],
        },
        Measured {
            row: Row::new(
                format!("small call, {regime}, pipe, blocking handler, current-thread host"),
                Unit::Micros,
                "Host::call EchoBlocking 64 B, worker max_concurrency(1): on its serving thread",
                &[
                    "the same, default worker: on a pool thread",
                    "Host::call Echo 64 B (async handler)",
                    "raw blocking pipe",
                ],
            ),
            bursts: vec![
                Box::new(|| {
                    let elapsed = links::calls_to::<EchoBlocking>(&current, &one_slot_host, n)?;
                    Ok(micros_per(n, elapsed))
                }),
                Box::new(|| {
                    let elapsed = links::calls_to::<EchoBlocking>(&current, &pipe_host, n)?;
                    Ok(micros_per(n, elapsed))
                }),
                Box::new(|| Ok(micros_per(n, links::calls(&current, &one_slot_host, n)?))),
                Box::new(|| Ok(micros_per(n, raw_pipe_4.round_trips(n)?))),
            ],
        },
        Measured {
            row: Row::new(
                format!("raw Unix socket vs raw pipe, {regime} (the OS channels alone)"),
                Unit::Micros,
                "raw Unix socket",
                &["raw blocking pipe"],
            ),
            bursts: vec![
                Box::new(|| Ok(micros_per(n, raw_socket_2.round_trips(n)?))),
                {
                    let mut raw = RawLink::echo(Raw::Pipe)?;
                    Box::new(move || Ok(micros_per(n, raw.round_trips(n)?)))
                },
            ],
        },
    ];
    if let Some(spin_host) = &spin_host {
        let current = &current;
        measured.push(Measured {
            row: Row::new(
                format!(
                    "small call, {regime}, pipe, current-thread host, low-latency mode (50 µs)"
                ),
                Unit::Micros,
                "Host::call Echo 64 B, HostBuilder::low_latency(50 µs)",
                &["raw blocking pipe"],
            ),
            bursts: vec![
                Box::new(move || Ok(micros_per(n, links::calls(current, spin_host, n)?))),
                Box::new(|| Ok(micros_per(n, raw_pipe_3.round_trips(n)?))),
            ],
        });
    }
    if let Some(unconfined_host) = &unconfined_host {
        measured.push(layers(&current, worker, &pipe_host, unconfined_host, n)?);
    }
    let rows = interleave(measured, scale.reps)?;
    for host in [&pipe_host, &socket_host, &one_slot_host]
        .into_iter()
        .chain(old_host.as_ref())
        .chain(spin_host.as_ref())
        .chain(unconfined_host.as_ref())
    {
        current.block_on(host.shutdown());
    }
    multi.block_on(multi_host.shutdown());
    Ok(rows)
}

fn println_skip(why: &str) {
    eprintln!("airlock-bench: {why}");
}

/// The baseline series of a worker built from another revision (`--compare-worker`).
const COMPARED: &str = "the same call to the --compare-worker binary";

/// The CPU work the pipelined rows' last baseline adds to each call of "tokio alone", in its
/// calling task: about what leaves that baseline at 0.6× the raw echo on a 2-CPU machine, so
/// the row shows how much a client may do per call, beyond tokio's own work, at that ratio.
const WORK_PER_CALL: std::time::Duration = std::time::Duration::from_nanos(400);

/// The low-latency window of the pipelined rows' spinning host. On the 2-vCPU development VM,
/// where a sleeping side takes tens of microseconds to wake, 256 calls in flight on a 2-thread
/// host took 0.97–1.12 µs each with 100 µs, 1.18–1.22 µs with 50 µs and 1.09–1.30 µs with
/// 200 µs (`airlock-bench calls 300000 --window 256 --spin MICROS`, three rounds each).
const PIPELINED_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// Pipelined calls on one worker and on a `Pool` of two, and bulk echoes.
fn throughput(worker: &str, old: Option<&str>, scale: Scale) -> Result<Vec<Row>, Error> {
    let rt = links::runtime(2)?;
    let host = links::spawn_piped(&rt, worker)?;
    let old_host = match old {
        Some(old) => Some(links::spawn_piped(&rt, old)?),
        None => None,
    };
    let pool = links::spawn_pool(&rt, worker, 2)?;
    let large_host = spawn_large_body_host(&rt, worker)?;
    let body = BulkBody::of(BULK);
    let large_body = BulkBody::of(LARGE_BULK);
    let faults = ByProducts::new();
    // The host session driven in line by one task (`session_link`): what the host's call path
    // would do with none of its tasks around the session.
    let in_line = links::runtime(0)?;
    // The same calls on a current-thread host: on two CPUs, a host of one thread leaves the
    // other to the worker.
    let current_host = links::spawn_piped(&in_line, worker)?;
    // The opt-in low-latency mode: both sides poll instead of sleeping between batches.
    let spinning_host = links::spawn_low_latency_host(&rt, worker, PIPELINED_SPIN)?;
    let mut measured = Vec::new();
    for window in [1u32, 16, 256] {
        let n = if window == 1 { 1000 } else { 10_000 } * scale.size;
        let host = host.clone();
        let rt = &rt;
        let in_line = &in_line;
        let mut raw = RawLink::echo(Raw::Pipe)?;
        let mut session = SessionLink::on_tokio(in_line, SessionWorker::Bundled(worker))?;
        let mut tasks = MultiplexedLink::echo(rt)?;
        let mut tasks_in_line = MultiplexedLink::echo(in_line)?;
        let mut tasks_working = MultiplexedLink::with_work(rt, WORK_PER_CALL)?;
        let working = format!(
            "tokio alone, 2-thread runtime, each task busy {} ns before each message",
            WORK_PER_CALL.as_nanos()
        );
        let spinning = format!(
            "Host::call Echo 64 B, HostBuilder::low_latency({} µs)",
            PIPELINED_SPIN.as_micros()
        );
        let mut row = Row::new(
            format!("pipelined, {window} in flight, one worker, 2-thread host"),
            Unit::KiloPerSec,
            "Host::call Echo 64 B",
            &[
                "raw pipelined echo, one write per message",
                "host session in line, one task on a current-thread runtime, bundled worker (unconfined)",
                "Host::call Echo 64 B on a current-thread host",
                "tokio alone: one task per call in flight, a shared writer and a reader task, raw echo peer, 2-thread runtime",
                "the same on a current-thread runtime",
                &working,
                &spinning,
            ],
        );
        let current_host = current_host.clone();
        let spinning_host = spinning_host.clone();
        let mut bursts: Vec<Burst<'_>> = vec![
            Box::new(move || Ok(kilo_per_sec(n, links::pipelined(rt, &host, n, window)?))),
            Box::new(move || Ok(kilo_per_sec(n, raw.pipelined(n, window)?))),
            Box::new(move || {
                Ok(kilo_per_sec(
                    n,
                    session.pipelined_async(in_line, n, window)?,
                ))
            }),
            Box::new(move || {
                Ok(kilo_per_sec(
                    n,
                    links::pipelined(in_line, &current_host, n, window)?,
                ))
            }),
            Box::new(move || Ok(kilo_per_sec(n, tasks.pipelined(rt, n, window)?))),
            Box::new(move || {
                Ok(kilo_per_sec(
                    n,
                    tasks_in_line.pipelined(in_line, n, window)?,
                ))
            }),
            Box::new(move || Ok(kilo_per_sec(n, tasks_working.pipelined(rt, n, window)?))),
            Box::new(move || {
                Ok(kilo_per_sec(
                    n,
                    links::pipelined(rt, &spinning_host, n, window)?,
                ))
            }),
        ];
        if let Some(old_host) = old_host.clone() {
            row.baselines.push(crate::table::Series::new(COMPARED));
            bursts.push(Box::new(move || {
                Ok(kilo_per_sec(n, links::pipelined(rt, &old_host, n, window)?))
            }));
        }
        measured.push(Measured { row, bursts });
    }
    let n = 10_000 * scale.size;
    let mut raw = RawLink::echo(Raw::Pipe)?;
    let raw_pid = raw.pid();
    let one = host.clone();
    let one_pid = one.worker_pid().ok_or("the pipelined host has no worker")?;
    let pool_pids = pool
        .hosts()
        .iter()
        .map(|h| h.worker_pid().ok_or("a pool host has no worker"))
        .collect::<Result<Vec<u32>, _>>()?;
    let rt_ref = &rt;
    let names = ["Pool of 2", "raw pipelined echo", "one worker (Host::call)"];
    let cpu_row = |measure: &str, unit| {
        faults.add(Row::new(
            format!("pipelined, 256 in flight, {measure}, host process and its workers"),
            unit,
            names[0],
            &names[1..],
        ))
    };
    let cpu_per_call = cpu_row("CPU time per call", Unit::Micros);
    let cpus_busy = cpu_row("CPUs busy (CPU time over wall time)", Unit::Cpus);
    let cpu_rows = CpuRows {
        by_products: &faults,
        per_call: cpu_per_call,
        busy: cpus_busy,
        calls: n,
    };
    measured.push(Measured {
        row: Row::new(
            "pipelined, 256 in flight, Pool of 2, 2-thread host",
            Unit::KiloPerSec,
            "Pool::call Echo 64 B",
            &[
                "raw pipelined echo, one write per message",
                "one worker (Host::call)",
            ],
        ),
        bursts: vec![
            {
                let pool = pool.clone();
                cpu_rows.around(
                    0,
                    pool_pids,
                    Box::new(move || Ok(kilo_per_sec(n, links::pipelined(rt_ref, &pool, n, 256)?))),
                )
            },
            cpu_rows.around(
                1,
                vec![raw_pid],
                Box::new(move || Ok(kilo_per_sec(n, raw.pipelined(n, 256)?))),
            ),
            cpu_rows.around(
                2,
                vec![one_pid],
                Box::new(move || Ok(kilo_per_sec(n, links::pipelined(rt_ref, &one, n, 256)?))),
            ),
        ],
    });

    measured.push(bulk_row(&rt, &host, &body, &faults)?);
    // A first call shows whether the raised setting is enough; if not, the row says why
    // instead of stopping the bench.
    match links::bulk::<EchoBlob>(&rt, &large_host, &large_body.blob) {
        Ok(_) => measured.push(bulk_row(&rt, &large_host, &large_body, &faults)?),
        Err(err) => {
            let why = format!("the 64 MiB echo failed: {err}");
            eprintln!("airlock-bench: {why}");
            let mut row = Row::new(bulk_row_name(LARGE_BULK), Unit::GigaBytesPerSec, "", &[]);
            row.skipped = Some(why);
            measured.push(Measured {
                row,
                bursts: Vec::new(),
            });
        }
    }
    let mut rows = interleave(measured, scale.reps)?;
    rows.extend(faults.into_rows());
    rt.block_on(host.shutdown());
    rt.block_on(large_host.shutdown());
    rt.block_on(pool.shutdown());
    in_line.block_on(current_host.shutdown());
    if let Some(old_host) = old_host {
        rt.block_on(old_host.shutdown());
    }
    Ok(rows)
}

/// The rows that a pipelined burst's CPU time goes into.
#[derive(Clone, Copy)]
struct CpuRows<'a> {
    by_products: &'a ByProducts,
    per_call: usize,
    busy: usize,
    /// Calls per burst.
    calls: u32,
}

impl<'a> CpuRows<'a> {
    /// `burst`, recording as series `series` the CPU time that this process and `peers` spent
    /// on it: per call, and over the burst's wall time.
    fn around(self, series: usize, peers: Vec<u32>, mut burst: Burst<'a>) -> Burst<'a> {
        Box::new(move || {
            let cpu = || -> Result<u64, Error> {
                let mut total = cpu_nanos(None)?;
                for pid in &peers {
                    total += cpu_nanos(Some(*pid))?;
                }
                Ok(total)
            };
            let (cpu_before, started) = (cpu()?, std::time::Instant::now());
            let rate = burst()?;
            let spent = cpu()?.saturating_sub(cpu_before) as f64;
            let wall = started.elapsed().as_secs_f64();
            let calls = f64::from(self.calls);
            self.by_products
                .record(self.per_call, series, spent / 1e3 / calls);
            self.by_products
                .record(self.busy, series, spent / 1e9 / wall);
            Ok(rate)
        })
    }
}

/// The bulk rows' bodies: 16 MiB, the most the default `max_frame` carries, and 64 MiB.
const BULK: usize = 16 * 1024 * 1024;
const LARGE_BULK: usize = 64 * 1024 * 1024;

/// The one setting a 64 MiB body needs: `HostConfig::max_frame` raised to 64 MiB plus the same
/// 4 KiB of room for the frame's head that `DEFAULT_MAX_FRAME` gives a 16 MiB body. The worker
/// adopts it from the `Welcome`, and both sides' decode budgets follow it.
const LARGE_BULK_MAX_FRAME: u32 = LARGE_BULK as u32 + 4096;

fn spawn_large_body_host(rt: &Runtime, worker: &str) -> Result<Host, Error> {
    let config = HostConfig::default().max_frame(LARGE_BULK_MAX_FRAME)?;
    Ok(rt.block_on(Host::builder(worker).protocol(config).spawn())?)
}

/// A bulk body as both byte types: `Blob`, which a large body's decode takes from the frame,
/// and `serde_bytes::ByteBuf`, which it copies.
struct BulkBody {
    blob: Blob,
    byte_buf: ByteBuf,
}

impl BulkBody {
    fn of(len: usize) -> Self {
        Self {
            blob: Blob::from(vec![0xa5u8; len]),
            byte_buf: ByteBuf::from(vec![0xa5u8; len]),
        }
    }

    fn len(&self) -> usize {
        self.blob.len()
    }
}

fn bulk_row_name(len: usize) -> String {
    format!("bulk echo, {} MiB body", len >> 20)
}

/// A bulk-echo row for `body` on `host`: `EchoBlob` (no copy on either side's decode) beside a
/// raw store-and-forward and a raw streaming echo, and beside `Echo`, whose `ByteBuf` each side
/// copies out of the frame. Each `EchoBlob` call and each store-and-forward echo also records
/// the minor page faults it cost in two rows of `faults`: the host's side and the worker's (the
/// bench's own process and its peer's, for the raw echo).
fn bulk_row<'a>(
    rt: &'a Runtime,
    host: &'a Host,
    body: &'a BulkBody,
    faults: &'a ByProducts,
) -> Result<Measured<'a>, Error> {
    let mib = body.len() >> 20;
    let host_row = faults.add(Row::new(
        format!("{}, host minor page faults", bulk_row_name(body.len())),
        Unit::PerCall,
        "Host::call EchoBlob (host process)",
        &["raw pipe, store and forward (bench process)"],
    ));
    let worker_row = faults.add(Row::new(
        format!("{}, worker minor page faults", bulk_row_name(body.len())),
        Unit::PerCall,
        "airlock-worker",
        &["raw store-and-forward peer"],
    ));
    let len = body.len();
    let gb_per_sec = move |elapsed: Duration| len as f64 / elapsed.as_secs_f64() / 1e9;
    let mut store = RawLink::piped("bulk-store")?;
    let mut stream = RawLink::piped("bulk-stream")?;
    let (mut back_store, mut back_stream) = (Vec::new(), Vec::new());
    Ok(Measured {
        row: Row::new(
            bulk_row_name(len),
            Unit::GigaBytesPerSec,
            &format!("Host::call EchoBlob {mib} MiB (airlock_host::Blob)"),
            &[
                "raw pipe, store and forward",
                "raw pipe, streaming",
                "Host::call Echo (serde_bytes::ByteBuf, copied out of each frame)",
            ],
        ),
        bursts: vec![
            Box::new(move || {
                let pid = host.worker_pid().ok_or("the bulk host has no worker")?;
                let before = (minor_faults(None)?, minor_faults(Some(pid))?);
                let elapsed = links::bulk::<EchoBlob>(rt, host, &body.blob)?;
                let after = (minor_faults(None)?, minor_faults(Some(pid))?);
                if host.worker_pid() != Some(pid) {
                    return Err("the bulk worker was replaced during a call".into());
                }
                faults.record(host_row, 0, (after.0 - before.0) as f64);
                faults.record(worker_row, 0, (after.1 - before.1) as f64);
                Ok(gb_per_sec(elapsed))
            }),
            Box::new(move || {
                let pid = Some(store.pid());
                let before = (minor_faults(None)?, minor_faults(pid)?);
                let elapsed = store.bulk(&body.blob, &mut back_store)?;
                let after = (minor_faults(None)?, minor_faults(pid)?);
                faults.record(host_row, 1, (after.0 - before.0) as f64);
                faults.record(worker_row, 1, (after.1 - before.1) as f64);
                Ok(gb_per_sec(elapsed))
            }),
            Box::new(move || Ok(gb_per_sec(stream.bulk(&body.blob, &mut back_stream)?))),
            Box::new(move || Ok(gb_per_sec(links::bulk::<Echo>(rt, host, &body.byte_buf)?))),
        ],
    })
}

/// Heap allocations and bytes per small call on the host side (every thread of this process),
/// beside ipc-channel's typed round trip, counted by the bench's global allocator.
fn allocations(worker: &str, scale: Scale) -> Result<Vec<Row>, Error> {
    alloc_count::check()?;
    let n = 1000 * scale.size;
    let rt = links::runtime(0)?;
    let host = links::spawn_piped(&rt, worker)?;
    let mut ipc = IpcLink::start()?;
    let per_call = |count: u64| count as f64 / f64::from(n);
    let bytes = ByProducts::new();
    let bytes_row = bytes.add(Row::new(
        "heap bytes allocated per small call, host process, current-thread host",
        Unit::PerCall,
        "Host::call Echo 64 B",
        &["ipc-channel typed"],
    ));
    let measured = vec![Measured {
        row: Row::new(
            "heap allocations per small call, host process, current-thread host",
            Unit::PerCall,
            "Host::call Echo 64 B",
            &["ipc-channel typed"],
        ),
        bursts: vec![
            Box::new(|| {
                let (done, counts) = alloc_count::counting(|| links::calls(&rt, &host, n));
                done?;
                bytes.record(bytes_row, 0, per_call(counts.bytes));
                Ok(per_call(counts.allocations))
            }),
            Box::new(|| {
                let (done, counts) = alloc_count::counting(|| ipc.round_trips(n));
                done?;
                bytes.record(bytes_row, 1, per_call(counts.bytes));
                Ok(per_call(counts.allocations))
            }),
        ],
    }];
    let mut rows = interleave(measured, scale.reps)?;
    rows.extend(bytes.into_rows());
    rt.block_on(host.shutdown());
    Ok(rows)
}

/// How long the host sits idle before each spawn of the after-idle row: as a host that
/// starts a worker now and then does, where a burst of spawns leaves the kernel's state warm
/// for the next.
const IDLE_BEFORE_SPAWN: Duration = Duration::from_millis(300);

/// The codec beside plain postcard, then spawn to ready beside a raw spawn, back to back and
/// after the host was idle.
fn spawn_and_codec(worker: &str, scale: Scale) -> Result<Vec<Row>, Error> {
    // The codec row runs first, so every spawn below is made by a host whose heap the decoded
    // tables have grown, as a long-running host's is (the spawn row's figures depend on it).
    let codec = codec(scale)?;
    let rt = links::runtime(2)?;
    let spawns = 5 * scale.size;
    let per_spawn = |f: &mut dyn FnMut() -> Result<Duration, Error>| -> Result<f64, Error> {
        let mut total = Duration::ZERO;
        for _ in 0..spawns {
            total += f()?;
        }
        Ok(total.as_secs_f64() * 1e3 / f64::from(spawns))
    };
    let one_spawn = spawn_row("spawn to ready", &rt, worker, per_spawn);
    // One spawn a burst, after the host was idle.
    let after_idle = |f: &mut dyn FnMut() -> Result<Duration, Error>| -> Result<f64, Error> {
        std::thread::sleep(IDLE_BEFORE_SPAWN);
        Ok(f()?.as_secs_f64() * 1e3)
    };
    let idle_spawn = spawn_row("spawn to ready after 300 ms idle", &rt, worker, after_idle);
    let mut pool_of_four = Measured {
        row: Row::new(
            "spawn a Pool of 4 to ready",
            Unit::Millis,
            "Pool::builder().size(4)",
            &["4 Host spawns one after another"],
        ),
        bursts: vec![
            Box::new(|| {
                let started = std::time::Instant::now();
                let pool = links::spawn_pool(&rt, worker, 4)?;
                let elapsed = started.elapsed();
                rt.block_on(pool.shutdown());
                Ok(elapsed.as_secs_f64() * 1e3)
            }),
            Box::new(|| {
                let started = std::time::Instant::now();
                let mut hosts = Vec::new();
                for _ in 0..4 {
                    hosts.push(links::spawn_piped(&rt, worker)?);
                }
                let elapsed = started.elapsed();
                for host in hosts {
                    rt.block_on(host.shutdown());
                }
                Ok(elapsed.as_secs_f64() * 1e3)
            }),
        ],
    };
    // Each row is interleaved on its own, so that the two series of the `Pool` row follow the
    // same bursts: a spawn is slower just after a burst of unconfined spawns (see
    // BENCHMARKS.md, "Spawn to ready"), and in one interleave with the row above, only the
    // `Pool`'s bursts ever followed that row's `none()` burst. One round of the `Pool` row
    // is run and dropped first, so that its first measured burst follows one of its own.
    let mut rows = interleave(vec![one_spawn], scale.reps)?;
    for burst in &mut pool_of_four.bursts {
        burst()?;
    }
    rows.extend(interleave(vec![pool_of_four], scale.reps)?);
    rows.extend(interleave(vec![idle_spawn], scale.reps)?);
    rows.extend(codec);
    Ok(rows)
}

/// A spawn row: `strict()` beside a raw spawn and `none()`, each burst timed by `time`, which
/// runs the spawn it is given and returns milliseconds.
fn spawn_row<'a>(
    name: &'static str,
    rt: &'a Runtime,
    worker: &'a str,
    time: impl Fn(&mut dyn FnMut() -> Result<Duration, Error>) -> Result<f64, Error> + Copy + 'a,
) -> Measured<'a> {
    Measured {
        row: Row::new(
            name,
            Unit::Millis,
            "Confinement::strict() (default)",
            &["raw spawn to first byte", "Confinement::none()"],
        ),
        bursts: vec![
            Box::new(move || {
                time(&mut || links::spawn_to_ready(rt, worker, Confinement::strict()))
            }),
            Box::new(move || time(&mut links::raw_spawn)),
            Box::new(move || time(&mut || links::spawn_to_ready(rt, worker, Confinement::none()))),
        ],
    }
}

/// The codec beside plain postcard. Each burst is a single decode, and the two alternate
/// (the order flipping every pair) `reps × 2 × size` times: one decode takes tens of
/// milliseconds, so pairing single decodes leaves a neighbour's burst of load less room to
/// fall on one decoder's samples and not the other's than bursts of several decodes would.
fn codec(scale: Scale) -> Result<Vec<Row>, Error> {
    let table = codec_table();
    let measured = vec![Measured {
        row: Row::new(
            "codec, decode a 100k-row table",
            Unit::Millis,
            "airlock_codec::from_slice",
            &["postcard::from_bytes"],
        ),
        bursts: vec![
            Box::new(|| Ok(Decoder::Airlock.time(&table)?.as_secs_f64() * 1e3)),
            Box::new(|| Ok(Decoder::Postcard.time(&table)?.as_secs_f64() * 1e3)),
        ],
    }];
    interleave(measured, scale.reps * 2 * scale.size as usize)
}

/// The two decoders the codec row compares.
#[derive(Clone, Copy)]
pub enum Decoder {
    /// `airlock_codec::from_slice` within the default `Limits`.
    Airlock,
    /// `postcard::from_bytes`.
    Postcard,
}

impl Decoder {
    /// How long one decode of `table` takes, dropping what it decoded included.
    fn time(self, table: &[u8]) -> Result<Duration, Error> {
        type Table = Vec<airlock_test_support::table::Row>;
        let started = std::time::Instant::now();
        match self {
            Self::Airlock => drop(std::hint::black_box(airlock_codec::from_slice::<Table>(
                table,
                &airlock_codec::Limits::default(),
            )?)),
            Self::Postcard => drop(std::hint::black_box(postcard::from_bytes::<Table>(table)?)),
        }
        Ok(started.elapsed())
    }
}

/// `n` decodes of the codec row's table with `decoder` (the profiling command `codec`):
/// the mean time of one.
pub fn profile_codec(n: u32, decoder: Decoder) -> Result<Duration, Error> {
    let table = codec_table();
    let mut total = Duration::ZERO;
    for _ in 0..n {
        total += decoder.time(&table)?;
    }
    Ok(total / n.max(1))
}

/// The codec crate's benchmark table, encoded.
fn codec_table() -> Vec<u8> {
    postcard::to_allocvec(&airlock_test_support::table::rows()).unwrap_or_default()
}

/// Restricts this process, and so every thread and child it starts, to one CPU.
fn pin_to_one_cpu() -> Result<(), Error> {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let allowed = sched_getaffinity(None)?;
    let cpu = (0..CpuSet::MAX_CPU)
        .find(|&cpu| allowed.is_set(cpu))
        .ok_or("no CPU allowed")?;
    let mut only = CpuSet::new();
    only.set(cpu);
    sched_setaffinity(None, &only)?;
    Ok(())
}
