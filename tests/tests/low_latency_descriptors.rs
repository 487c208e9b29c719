//! Every host can read its channel without its runtime (`FrameReceiver::read_now`), through
//! one duplicate of the channel's descriptor: its callers look for their answers so, and in
//! the low-latency mode on a multi-thread runtime its reader polls so while it spins. So the
//! mode and the runtime change nothing in the descriptors a host holds, over every transport.
//! Counted in `/proc/self/fd`, so this file holds one test: no other test's hosts open or
//! close descriptors while it counts.

use std::time::Duration;

use airlock_host::{Host, TransportChoice};
use airlock_tests::e2e::worker_bin;
use airlock_tests::support::current_thread_runtime;
use airlock_worker::builtin::Sum;

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// The descriptors a host spawned on `runtime` holds once it has answered a call, with the
/// low-latency `window` or without it.
fn held_by_a_host(
    runtime: &tokio::runtime::Runtime,
    transport: TransportChoice,
    window: Option<Duration>,
) -> usize {
    runtime.block_on(async {
        let before = open_descriptors();
        let mut builder = Host::builder(worker_bin()).transport(transport);
        if let Some(window) = window {
            builder = builder.low_latency(window);
        }
        let host = builder.spawn().await.unwrap();
        assert_eq!(host.call::<Sum>(&vec![1, 2]).await, Ok(3), "{transport:?}");
        let held = open_descriptors() - before;
        host.shutdown().await;
        held
    })
}

#[test]
fn a_host_holds_as_many_descriptors_in_the_low_latency_mode_and_out_of_it_on_either_runtime() {
    if std::thread::available_parallelism().map_or(1, usize::from) < 2 {
        // One CPU: the mode is off (`airlock_protocol::spin::host_window`).
        return;
    }
    let window = Some(Duration::from_millis(1));
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let current = current_thread_runtime();
    // A first spawn may open descriptors the process keeps for later spawns: counted here,
    // not below.
    held_by_a_host(&multi, TransportChoice::Pipe, window);
    for transport in [
        TransportChoice::Pipe,
        TransportChoice::SocketInherited,
        TransportChoice::SocketNamed,
    ] {
        let plain = held_by_a_host(&multi, transport, None);
        assert!(plain > 0, "{transport:?}: a host holds no descriptor");
        assert_eq!(
            held_by_a_host(&multi, transport, window),
            plain,
            "{transport:?}: a multi-thread runtime"
        );
        assert_eq!(
            held_by_a_host(&current, transport, None),
            plain,
            "{transport:?}: a current-thread runtime"
        );
        assert_eq!(
            held_by_a_host(&current, transport, window),
            plain,
            "{transport:?}: a current-thread runtime, in the mode"
        );
    }
}
