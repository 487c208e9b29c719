//! `held N --worker PATH [--unconfined] [--resident MIB]`: what N workers cost in memory once
//! their host has rewritten its own data. The host first fills MIB (default 1024) of its own,
//! spawns the workers, then writes every page of it again; it prints the anonymous memory its
//! descendants hold (the workers, and under `strict()` their keepers and inits), as the sum of
//! their proportional shares (`Pss_Anon`, so a page two of them share counts once), after the
//! spawns and after the rewrite. A fork that never `exec`s and kept its copy-on-write image of
//! the host shows the rewrite as the host's size again. Reading another process's
//! `smaps_rollup` needs the right to trace it: run as root.

use std::time::Duration;

use airlock_host::{Confinement, Host};

use crate::links::{self, Error};

/// The anonymous memory this process's descendants hold, in MiB: the sum of their
/// `Pss_Anon`.
fn descendants_mib() -> Result<u64, Error> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let name = entry?.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        // `pid (comm) state ppid ...`: the name may hold spaces, so split after the last ')'.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        if let Some(ppid) = after_name
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
        {
            parents.push((pid, ppid));
        }
    }
    let mut ours = vec![std::process::id()];
    let mut kib = 0;
    while let Some(parent) = ours.pop() {
        for &(pid, _) in parents.iter().filter(|(_, ppid)| *ppid == parent) {
            ours.push(pid);
            let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
                continue;
            };
            kib += rollup
                .lines()
                .find_map(|line| line.strip_prefix("Pss_Anon:"))
                .and_then(|value| value.trim().strip_suffix("kB"))
                .and_then(|value| value.trim().parse::<u64>().ok())
                .ok_or_else(|| format!("/proc/{pid}/smaps_rollup: no Pss_Anon"))?;
        }
    }
    Ok(kib / 1024)
}

/// Runs the measurement and prints one line.
pub fn run(workers: u32, worker: &str, unconfined: bool, resident_mib: u32) -> Result<(), Error> {
    let rt = links::runtime(0)?;
    let mut ballast = vec![1u8; resident_mib as usize * 1024 * 1024];
    let mut hosts = Vec::new();
    for _ in 0..workers {
        let policy = if unconfined {
            Confinement::none()
        } else {
            Confinement::strict()
        };
        hosts.push(rt.block_on(Host::builder(worker).confinement(policy).spawn())?);
    }
    // The keeper and init drop what they hold as the worker starts: let them settle.
    std::thread::sleep(Duration::from_millis(300));
    let after_spawns = descendants_mib()?;
    for page in ballast.iter_mut().step_by(4096) {
        *page = page.wrapping_add(1);
    }
    std::hint::black_box(&ballast);
    std::thread::sleep(Duration::from_millis(300));
    let after_rewrite = descendants_mib()?;
    println!(
        "{} x{workers}, host of {resident_mib} MiB: its workers' processes hold {after_spawns} \
         MiB after the spawns, {after_rewrite} MiB once the host rewrote its data",
        if unconfined { "none()" } else { "strict()" },
    );
    for host in hosts {
        rt.block_on(host.shutdown());
    }
    Ok(())
}
