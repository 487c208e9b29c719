//! The host's DEBUG traces, captured: a spawn and a handshake for every worker, one event
//! per call at its outcome naming its method, number, outcome and duration, and a restart
//! event with its reason, backoff and number. The targets are those the `airlock-host` crate
//! docs list.

use std::time::Duration;

use airlock_host::{CallError, Host, HostConfig, LostReason};
use airlock_tests::capture::{events, TracedEvent};
use airlock_tests::e2e::{soon, worker_bin};
use airlock_worker::builtin::{Sleep, Sum};

const LABEL: &str = "traced";

fn duration_us(event: &TracedEvent) -> u64 {
    event
        .field("duration_us")
        .parse()
        .unwrap_or_else(|_| panic!("a duration in µs: {event:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_handshake_every_call_and_restart_are_traced_at_debug() {
    let events = events();
    // No cancel grace: a call past its deadline takes its worker down, and a fresh one starts.
    let host = Host::builder(worker_bin())
        .label(LABEL)
        .protocol(HostConfig::default().cancel_grace(Duration::ZERO).unwrap())
        .spawn()
        .await
        .expect("spawn");
    assert_eq!(host.call::<Sum>(&vec![1, 2]).await, Ok(3));
    let overflow = host.call::<Sum>(&vec![i64::MAX, 1]).await;
    assert!(
        matches!(overflow, Err(CallError::Remote(_))),
        "{overflow:?}"
    );
    assert_eq!(
        host.call_with_deadline::<Sleep>(&10_000, soon(100)).await,
        Err(CallError::Timeout)
    );
    // Waits for the replacement: its spawn, handshake and the restart are traced before it.
    assert_eq!(host.call::<Sum>(&vec![4]).await, Ok(4));
    assert_eq!(host.stats().restarts, 1);
    host.shutdown().await;

    let spawns = events.of("airlock::spawn", LABEL);
    assert_eq!(
        spawns.len(),
        2,
        "the first worker and its replacement: {spawns:?}"
    );
    for spawn in &spawns {
        assert_eq!(spawn.level, tracing::Level::DEBUG);
        assert_eq!(spawn.field("program"), worker_bin().display().to_string());
        assert_eq!(spawn.field("transport"), "Pipe");
        assert_eq!(spawn.field("confinement"), "Strict");
        assert!(duration_us(spawn) > 0, "{spawn:?}");
    }

    let handshakes = events.of("airlock::handshake", LABEL);
    assert_eq!(handshakes.len(), 2, "{handshakes:?}");
    for handshake in &handshakes {
        assert_eq!(handshake.level, tracing::Level::DEBUG);
        assert_eq!(handshake.field("worker_name"), "airlock-worker");
        assert_eq!(
            handshake.field("worker_version"),
            env!("CARGO_PKG_VERSION"),
            "{handshake:?}"
        );
        let served = host.worker_info().methods.len().to_string();
        assert_eq!(handshake.field("methods"), served);
        duration_us(handshake);
    }

    let calls = events.of("airlock::call", LABEL);
    let seen: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|c| (c.field("method"), c.field("call"), c.field("outcome")))
        .collect();
    assert_eq!(
        seen,
        [
            ("sum", "0", "ok"),
            ("sum", "1", "remote"),
            ("sleep", "2", "timeout"),
            ("sum", "3", "ok"),
        ],
        "one event per call, at its outcome"
    );
    for call in &calls {
        assert_eq!(call.level, tracing::Level::DEBUG);
        duration_us(call);
    }
    assert_eq!(
        calls[0].field("error"),
        "",
        "a call that succeeded has no error"
    );
    assert_eq!(calls[2].field("error"), CallError::Timeout.to_string());
    let timed_out = duration_us(&calls[2]);
    assert!(
        (100_000..10_000_000).contains(&timed_out),
        "the timed-out call lasted until its deadline: {timed_out} µs"
    );

    let restarts = events.of("airlock::restart", LABEL);
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    let restart = &restarts[0];
    assert_eq!(restart.level, tracing::Level::DEBUG);
    assert_eq!(
        restart.field("reason"),
        LostReason::OtherCallTimedOut.to_string()
    );
    let initial_backoff = airlock_host::RestartPolicy::default().initial_backoff;
    assert_eq!(
        restart.field("backoff_us"),
        initial_backoff.as_micros().to_string()
    );
    assert_eq!(restart.field("restart"), "1");
}
