//! The keeper and the namespace's init drop a fragmented host's memory: a host whose anonymous
//! memory lies in hundreds of mappings with gaps between them.
//!
//! Alone in its test binary (its own process): while it builds its ballast, the ballast's
//! mappings are briefly adjacent and merge into one larger than the machine's memory, and a
//! fork of this process meanwhile (another test's spawn of a confined worker, whose keeper
//! is a fork) would fail with `ENOMEM` under the kernel's overcommit heuristic, which charges
//! a fork each private mapping whole.

use std::time::Duration;

use airlock_host::Host;
use airlock_tests::e2e::{attack_bin, parent_of};
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

/// The `/proc/<pid>/maps` line of the mapping that holds `address`, if any.
fn mapping_holding(pid: u32, address: usize) -> Option<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .find(|line| {
            let range = line.split(' ').next().unwrap_or_default();
            let Some((start, end)) = range.split_once('-') else {
                return false;
            };
            let parse = |hex| usize::from_str_radix(hex, 16).unwrap();
            (parse(start)..parse(end)).contains(&address)
        })
        .map(str::to_owned)
}

/// A host's anonymous memory is often in many mappings with unmapped gaps between them (each
/// large allocation is a mapping of its own, and freed ones leave holes): more than a fixed
/// list of ranges could name one by one. The keeper and init drop all of it still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_and_init_drop_a_fragmented_hosts_memory_too() {
    // Over glibc's largest mmap threshold and a thread arena's size: each its own mapping.
    const EACH: usize = 80 << 20;
    const KEPT: usize = 300;
    let mut ballast: Vec<Vec<u8>> = (0..2 * KEPT).map(|_| Vec::with_capacity(EACH)).collect();
    // Every other one freed: a hole between each two that stay.
    let mut index = 0;
    ballast.retain(|_| {
        index += 1;
        index % 2 == 0
    });
    ballast.iter_mut().for_each(|b| b.push(0x5a));
    let me = std::process::id();
    let separate: std::collections::HashSet<String> = ballast
        .iter()
        .map(|b| mapping_holding(me, b.as_ptr() as usize).unwrap())
        .collect();
    assert_eq!(
        separate.len(),
        KEPT,
        "the ballast is in {KEPT} separate mappings"
    );

    let host = Host::builder(attack_bin()).spawn().await.unwrap();
    let init = parent_of(host.worker_pid().unwrap());
    let keeper = parent_of(init);
    assert_eq!(parent_of(keeper), me, "worker → init → keeper → host");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held: Vec<(u32, String)> = [keeper, init]
            .into_iter()
            .flat_map(|pid| {
                ballast
                    .iter()
                    .filter_map(move |b| mapping_holding(pid, b.as_ptr() as usize))
                    .map(move |line| (pid, line))
            })
            .collect();
        if held.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of the host's {KEPT} mappings are still mapped in the keeper ({keeper}) or \
             init ({init}), e.g. {:?}",
            held.len(),
            held.first()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::hint::black_box(&ballast);
    let echoed = host.call::<Echo>(&ByteBuf::from(b"after".to_vec())).await;
    assert_eq!(echoed.unwrap().as_slice(), b"after");
    host.shutdown().await;
}
