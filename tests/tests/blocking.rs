//! The blocking API in a program with no runtime of its own: these tests are plain `#[test]`
//! functions, and each checks that no tokio runtime exists on its thread. Calls, errors,
//! deadlines, concurrent callers, a pool, and shutting down on drop.

use std::time::{Duration, Instant};

use airlock_host::{blocking, CallError, Host, Pool};
use airlock_tests::e2e::{process_alive, worker_bin};
use airlock_worker::builtin::{Echo, Sleep, Sum};
use serde_bytes::ByteBuf;

fn no_runtime_here() {
    assert!(
        tokio::runtime::Handle::try_current().is_err(),
        "this test must run outside any runtime"
    );
}

#[test]
fn a_blocking_host_calls_its_worker_without_a_runtime_of_the_callers() {
    no_runtime_here();
    let host = blocking::Host::spawn(Host::builder(worker_bin())).unwrap();
    assert_eq!(host.call::<Sum>(&vec![1, 2, 3]), Ok(6));
    assert!(matches!(
        host.call::<Sum>(&vec![i64::MAX, 1]),
        Err(CallError::Remote(_))
    ));
    let payload = ByteBuf::from(vec![7u8; 1 << 20]);
    assert_eq!(host.call::<Echo>(&payload), Ok(payload));
    assert!(host.worker_info().methods.iter().any(|m| m == "sum"));
    assert_eq!(host.stats().calls_ok, 2);

    // Many threads at once on one host.
    let sums: Vec<_> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..8i64)
            .map(|i| {
                let host = host.clone();
                scope.spawn(move || host.call::<Sum>(&vec![i; 10]))
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    assert_eq!(sums, (0..8).map(|i| Ok(i * 10)).collect::<Vec<_>>());

    host.shutdown();
    assert_eq!(host.call::<Sum>(&vec![1]), Err(CallError::Shutdown));
    no_runtime_here();
}

#[test]
fn a_blocking_call_keeps_its_deadline_and_the_worker_is_replaced() {
    no_runtime_here();
    // No cancel grace: the missed deadline itself takes the worker down.
    let host = blocking::Host::spawn(
        Host::builder(worker_bin()).protocol(
            airlock_host::HostConfig::default()
                .cancel_grace(Duration::ZERO)
                .unwrap(),
        ),
    )
    .unwrap();
    let first = host.worker_pid().unwrap();
    let started = Instant::now();
    let missed =
        host.call_with_deadline::<Sleep>(&5_000, Instant::now() + Duration::from_millis(200));
    let took = started.elapsed();
    assert_eq!(missed, Err(CallError::Timeout));
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The runtime thread killed it and started another while no caller was waiting.
    assert_eq!(host.call::<Sum>(&vec![2, 2]), Ok(4));
    assert_ne!(host.worker_pid(), Some(first));
    assert_eq!(host.stats().restarts, 1);
}

#[test]
fn dropping_the_last_blocking_handle_shuts_its_worker_down() {
    no_runtime_here();
    let host = blocking::Host::spawn(Host::builder(worker_bin())).unwrap();
    let clone = host.clone();
    let pid = host.worker_pid().unwrap();
    assert!(process_alive(pid));
    drop(host);
    // A clone keeps it running.
    assert_eq!(clone.call::<Sum>(&vec![1]), Ok(1));
    drop(clone);
    // The drop waited for the graceful shutdown: the worker is gone when it returns.
    assert!(!process_alive(pid), "worker {pid} outlived its last handle");
}

#[test]
fn a_blocking_pool_spreads_calls_from_many_threads() {
    no_runtime_here();
    let pool = blocking::Pool::spawn(Pool::builder(Host::builder(worker_bin())).size(3)).unwrap();
    let slept: Vec<_> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..6)
            .map(|_| {
                let pool = pool.clone();
                // Each call holds its worker for a while, so the six spread out.
                scope.spawn(move || pool.call::<Sleep>(&300))
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    assert_eq!(slept, vec![Ok(300); 6]);
    assert_eq!(pool.stats().workers.len(), 3);
    let busy = pool
        .stats()
        .workers
        .iter()
        .filter(|s| s.calls_ok > 0)
        .count();
    assert!(
        busy >= 2,
        "the calls all went to one worker: {:?}",
        pool.stats()
    );
    pool.shutdown();
    assert_eq!(pool.call::<Sum>(&vec![1]), Err(CallError::Shutdown));
}
