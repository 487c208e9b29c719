//! The host's peak resident set while four workers answer with frames at `max_frame`, beside
//! its resident set before and the bound SECURITY.md states: the host buffers at most
//! `3 × max_frame` per worker (the frame being decoded, the value decoded from it until its
//! caller takes it, and the next frame arriving).
//!
//! Every repetition is a fresh process (`airlock-bench rss-sample ROUNDS`), so neither an
//! earlier row nor memory the allocator kept from an earlier repetition is in its figures. It
//! spawns a `Pool` of four `fill` workers (see `fill_worker.rs`), notes its resident set,
//! lowers its recorded peak to it, has each worker answer `ROUNDS` calls on each of two slots
//! at once (so one answer is read while the next arrives), dropping every answer as it comes,
//! and reports its peak.

use airlock_host::HostConfig;

use crate::fill_worker;
use crate::links::{self, Error};
use crate::proc_stats;
use crate::table::{Row, Unit};

const WORKERS: usize = 4;
const IN_FLIGHT_PER_WORKER: usize = 2;

/// The row, from `reps` fresh processes, each reading `rounds` answers per slot.
pub fn row(reps: usize, rounds: u32) -> Result<Vec<Row>, Error> {
    let max_frame = HostConfig::default().frame_limit();
    let len = fill_worker::longest_answer(max_frame);
    // Once, outside the samples: the answers make frames exactly at the cap.
    let rt = links::runtime(0)?;
    let pool = fill_worker::spawn_pool(&rt, 1)?;
    fill_worker::check_at_cap(&rt, &pool.hosts()[0], len)?;
    rt.block_on(pool.shutdown());

    let mib = |bytes: u64| bytes as f64 / f64::from(1u32 << 20);
    let bound = (3 * WORKERS) as u64 * u64::from(max_frame);
    let mut row = Row::new(
        format!(
            "host peak RSS, Pool of {WORKERS} answering with frames at max_frame ({} MiB + 4 KiB), {IN_FLIGHT_PER_WORKER} calls in flight on each",
            max_frame >> 20
        ),
        Unit::MiB,
        "peak (VmHWM) while the answers are read",
        &[
            "before (VmRSS)",
            "bound: before + 3 × max_frame per worker (SECURITY.md)",
        ],
    );
    for _ in 0..reps {
        let (before, peak) = sample_in_fresh_process(rounds)?;
        row.airlock.samples.push(mib(peak));
        row.baselines[0].samples.push(mib(before));
        row.baselines[1].samples.push(mib(before + bound));
    }
    Ok(vec![row])
}

fn sample_in_fresh_process(rounds: u32) -> Result<(u64, u64), Error> {
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(["rss-sample", &rounds.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("rss-sample failed: {}", out.status).into());
    }
    let text = String::from_utf8(out.stdout)?;
    let (before, peak) = text
        .trim()
        .split_once(' ')
        .ok_or("rss-sample printed no figures")?;
    Ok((before.parse()?, peak.parse()?))
}

/// `rss-sample ROUNDS`: one repetition, in this fresh process; prints the resident set before
/// and the peak during, in bytes.
pub fn sample(args: &[String]) -> Result<(), Error> {
    let rounds: u32 = args.first().ok_or("usage: rss-sample ROUNDS")?.parse()?;
    let len = fill_worker::longest_answer(HostConfig::default().frame_limit());
    let rt = links::runtime(2)?;
    let pool = fill_worker::spawn_pool(&rt, WORKERS)?;
    proc_stats::reset_peak()?;
    let before = proc_stats::resident()?.now;
    fill_worker::answer_at_cap(&rt, &pool, len, IN_FLIGHT_PER_WORKER, rounds)?;
    let peak = proc_stats::resident()?.peak;
    rt.block_on(pool.shutdown());
    println!("{before} {peak}");
    Ok(())
}
