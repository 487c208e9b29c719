//! `spawns N --worker PATH [--unconfined] [--threads T] [--gap MS]`: where spawn-to-ready goes.
//! N spawns, each beside a raw spawn (interleaved; with `--gap`, each after MS milliseconds
//! idle, as a host that starts a worker now and then does), split by the host's own DEBUG
//! events: the launch (`airlock::spawn`, from the supervisor's start of a launch to a
//! connected channel: the spawner thread, the channel, the fork and `exec`, and for confined
//! workers the sandbox's set-up) and the handshake (`airlock::handshake`, from there to the
//! worker's verified `Hello`). What is left is the builder, the supervisor's start and the
//! return to the caller. With `--pool K`, N
//! `Pool`s of K to ready instead, each beside K spawns one after another (the order flipping
//! every round): whether a `Pool`'s concurrent spawns gain anything on this machine.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_host::Confinement;

use crate::links::{self, Error};

/// The `duration_us` of the last spawn and handshake events.
#[derive(Default)]
struct Phases {
    launch_us: Option<u64>,
    handshake_us: Option<u64>,
}

struct Recorder(Arc<Mutex<Phases>>);

struct DurationField(Option<u64>);

impl tracing::field::Visit for DurationField {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "duration_us" {
            self.0 = Some(value);
        }
    }
    fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        matches!(metadata.target(), "airlock::spawn" | "airlock::handshake")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut field = DurationField(None);
        event.record(&mut field);
        let Ok(mut phases) = self.0.lock() else {
            return;
        };
        match event.metadata().target() {
            "airlock::spawn" => phases.launch_us = field.0,
            "airlock::handshake" => phases.handshake_us = field.0,
            _ => {}
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// `none()` for `--unconfined`, else the default `strict()`.
fn policy(unconfined: bool) -> Confinement {
    if unconfined {
        Confinement::none()
    } else {
        Confinement::strict()
    }
}

/// The middle of `samples` (the upper one of an even count); NaN if there are none.
pub fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn run(
    n: u32,
    worker: &str,
    unconfined: bool,
    threads: usize,
    gap: Option<Duration>,
) -> Result<(), Error> {
    let phases = Arc::new(Mutex::new(Phases::default()));
    tracing::subscriber::set_global_default(Recorder(Arc::clone(&phases)))
        .map_err(|_| "a tracing subscriber is already installed")?;
    let policy = policy(unconfined);
    let rt = links::runtime(threads)?;
    // The spawner thread starts with the first spawn: not counted.
    links::spawn_to_ready(&rt, worker, policy.clone())?;
    let (mut raw, mut total, mut launch, mut handshake, mut rest) =
        (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..n {
        raw.push(links::raw_spawn()?.as_secs_f64() * 1e6);
        if let Some(gap) = gap {
            std::thread::sleep(gap);
        }
        let started = Instant::now();
        let elapsed: Duration = rt.block_on(async {
            let host = airlock_host::Host::builder(worker)
                .confinement(policy.clone())
                .spawn()
                .await?;
            let elapsed = started.elapsed();
            host.shutdown().await;
            Ok::<_, Error>(elapsed)
        })?;
        let phases = phases.lock().map_err(|_| "poisoned")?;
        let this_launch = phases.launch_us.ok_or("no spawn event")? as f64;
        let this_handshake = phases.handshake_us.ok_or("no handshake event")? as f64;
        let this_total = elapsed.as_secs_f64() * 1e6;
        total.push(this_total);
        launch.push(this_launch);
        handshake.push(this_handshake);
        rest.push(this_total - this_launch - this_handshake);
    }
    let (raw, total) = (median(raw), median(total));
    println!(
        "{n} spawns, medians (µs): raw spawn to first byte {raw:.0}; spawn to ready {total:.0} \
         ({:.2}× raw); of which launch {:.0}, handshake {:.0}, the rest {:.0}",
        total / raw,
        median(launch),
        median(handshake),
        median(rest)
    );
    Ok(())
}

/// N `Pool`s of `size` to ready, each beside `size` spawns one after another, the order flipping
/// every round; prints the medians and their ratio.
pub fn pools(
    n: u32,
    worker: &str,
    unconfined: bool,
    threads: usize,
    size: usize,
) -> Result<(), Error> {
    let policy = policy(unconfined);
    let rt = links::runtime(threads)?;
    let builder = || airlock_host::Host::builder(worker).confinement(policy.clone());
    let pool = || airlock_host::Pool::builder(builder()).size(size).spawn();
    // The spawner threads start with the first spawns: not counted.
    rt.block_on(async {
        pool().await?.shutdown().await;
        Ok::<_, Error>(())
    })?;
    let (mut concurrent, mut in_a_row) = (vec![], vec![]);
    for round in 0..n {
        for pool_first in [round % 2 == 0, round % 2 == 1] {
            let started = Instant::now();
            rt.block_on(async {
                if pool_first {
                    let pool = pool().await?;
                    concurrent.push(started.elapsed().as_secs_f64() * 1e3);
                    pool.shutdown().await;
                } else {
                    let mut hosts = Vec::new();
                    for _ in 0..size {
                        hosts.push(builder().spawn().await?);
                    }
                    in_a_row.push(started.elapsed().as_secs_f64() * 1e3);
                    for host in hosts {
                        host.shutdown().await;
                    }
                }
                Ok::<_, Error>(())
            })?;
        }
    }
    let (concurrent, in_a_row) = (median(concurrent), median(in_a_row));
    println!(
        "{n} rounds, medians (ms): a Pool of {size} {concurrent:.2}; {size} spawns one after \
         another {in_a_row:.2} ({:.2}×)",
        concurrent / in_a_row
    );
    Ok(())
}
