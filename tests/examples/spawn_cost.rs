//! `spawn_cost <airlock-worker> [rounds]`: spawn to ready (the handshake done) under
//! `Confinement::none()` and under the default `strict()`, interleaved, and a `Pool` of four
//! confined workers against four spawned one after another. Run by `cargo xtask bench`.

use std::time::{Duration, Instant};

use airlock_host::{Confinement, Host, Pool};

type Error = Box<dyn std::error::Error>;

async fn spawn_once(bin: &str, policy: Confinement) -> Result<Duration, Error> {
    let started = Instant::now();
    let host = Host::builder(bin).confinement(policy).spawn().await?;
    let ready = started.elapsed();
    host.shutdown().await;
    Ok(ready)
}

fn summary(label: &str, samples: &mut [Duration]) -> Duration {
    samples.sort();
    let median = samples[samples.len() / 2];
    println!(
        "   {label:<34} median {:>8.3} ms   min {:>7.3}   max {:>7.3}   (n = {})",
        median.as_secs_f64() * 1e3,
        samples[0].as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3,
        samples.len()
    );
    median
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let bin = args
        .next()
        .ok_or("usage: spawn_cost <airlock-worker> [rounds]")?;
    let rounds: usize = args.next().map(|r| r.parse()).transpose()?.unwrap_or(100);
    let (mut none, mut strict) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        none.push(spawn_once(&bin, Confinement::none()).await?);
        strict.push(spawn_once(&bin, Confinement::strict()).await?);
    }
    println!("spawn to ready, {rounds} rounds interleaved");
    let n = summary("Confinement::none()", &mut none);
    let s = summary("Confinement::strict() (default)", &mut strict);
    println!(
        "   strict adds {:.3} ms ({:.2}x none)",
        (s.as_secs_f64() - n.as_secs_f64()) * 1e3,
        s.as_secs_f64() / n.as_secs_f64()
    );
    let (mut pool, mut serial) = (Vec::new(), Vec::new());
    for _ in 0..rounds.div_ceil(10) {
        let started = Instant::now();
        let p = Pool::builder(Host::builder(&bin)).size(4).spawn().await?;
        pool.push(started.elapsed());
        p.shutdown().await;
        let started = Instant::now();
        let mut hosts = Vec::new();
        for _ in 0..4 {
            hosts.push(Host::builder(&bin).spawn().await?);
        }
        serial.push(started.elapsed());
        for h in hosts {
            h.shutdown().await;
        }
    }
    let p = summary("Pool of 4, strict", &mut pool);
    let q = summary("4 spawns one after another, strict", &mut serial);
    println!(
        "   pool / serial = {:.2}",
        p.as_secs_f64() / q.as_secs_f64()
    );
    Ok(())
}
