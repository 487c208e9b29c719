//! The opt-in low-latency mode (`HostBuilder::low_latency`): the worker is told its spin window
//! and calls answer exactly as without it; a window over the maximum is refused at spawn. Its
//! speed is measured by `cargo xtask bench`, never here.

use std::time::Duration;

use airlock_host::{ConfigError, Host, SpawnError};
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{Env, Sum};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_latency_host_tells_its_worker_the_window_and_calls_answer_as_usual() {
    let host = Host::builder(worker_bin())
        .low_latency(Duration::from_micros(50))
        .spawn()
        .await
        .unwrap();
    let env = host.call::<Env>(&()).await.unwrap();
    let told = env
        .iter()
        .find(|(key, _)| key == airlock_protocol::spin::SPIN_ENV)
        .map(|(_, value)| value.clone());
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus > 1 {
        assert_eq!(told.as_deref(), Some("50"), "{env:?}");
    } else {
        assert_eq!(told, None, "one CPU: spinning is off");
    }
    let calls = (0..200i64).map(|i| {
        let host = host.clone();
        tokio::spawn(async move { (i, host.call::<Sum>(&vec![i, 1]).await) })
    });
    for call in calls {
        let (i, sum) = call.await.unwrap();
        assert_eq!(sum, Ok(i + 1));
    }
    host.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_spin_window_over_the_maximum_is_refused_at_spawn() {
    let too_long = airlock_protocol::spin::MAX_SPIN + Duration::from_micros(1);
    match Host::builder(worker_bin())
        .low_latency(too_long)
        .spawn()
        .await
    {
        Err(SpawnError::Config(ConfigError::SpinTooLong(window))) => assert_eq!(window, too_long),
        other => panic!("expected SpinTooLong, got {:?}", other.map(|_| ())),
    }
}
