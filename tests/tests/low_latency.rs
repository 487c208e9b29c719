//! The opt-in low-latency mode (`HostBuilder::low_latency`) and polling under load
//! (`HostBuilder::poll_under_load`, on by default): the worker is told its windows and calls
//! answer exactly as without them; a window over the maximum is refused at spawn. Their speed
//! is measured by `cargo xtask bench`, never here.

use std::time::Duration;

use airlock_host::{ConfigError, Host, Pool, SpawnError};
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{Env, Sum};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_latency_host_tells_its_worker_the_window_and_calls_answer_as_usual() {
    let host = Host::builder(worker_bin())
        .low_latency(Duration::from_micros(50))
        .spawn()
        .await
        .unwrap();
    let window = told(&host, airlock_protocol::spin::SPIN_ENV).await;
    let expected = (cpus() > 1).then(|| "50".to_owned());
    assert_eq!(window, expected, "one CPU: spinning is off");
    pipelined_sums_answer(&host, 200).await;
    host.shutdown().await;
}

/// `n` calls made at once, each answered with its own sum.
async fn pipelined_sums_answer(host: &Host, n: i64) {
    let calls = (0..n).map(|i| {
        let host = host.clone();
        tokio::spawn(async move { (i, host.call::<Sum>(&vec![i, 1]).await) })
    });
    for call in calls {
        let (i, sum) = call.await.unwrap();
        assert_eq!(sum, Ok(i + 1));
    }
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The value of `name` in the worker's environment.
async fn told(host: &Host, name: &str) -> Option<String> {
    let env = host.call::<Env>(&()).await.unwrap();
    env.into_iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_gives_its_worker_the_load_window_by_default_and_none_when_turned_off() {
    let name = airlock_protocol::spin::LOAD_POLL_ENV;
    let default = Host::builder(worker_bin()).spawn().await.unwrap();
    let expected = (cpus() > 1).then(|| {
        let micros = airlock_protocol::spin::DEFAULT_LOAD_POLL.as_micros();
        micros.to_string()
    });
    assert_eq!(told(&default, name).await, expected, "one CPU: off");
    // Calls pipelined on it (the worker polls between their batches) answer as usual.
    pipelined_sums_answer(&default, 500).await;
    default.shutdown().await;

    let off = Host::builder(worker_bin())
        .poll_under_load(None)
        .spawn()
        .await
        .unwrap();
    assert_eq!(told(&off, name).await, None);
    off.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_more_workers_than_cpus_turns_polling_under_load_off_unless_chosen() {
    let name = airlock_protocol::spin::LOAD_POLL_ENV;
    let crowded = Pool::builder(Host::builder(worker_bin()))
        .size(cpus() + 1)
        .spawn()
        .await
        .unwrap();
    for host in crowded.hosts() {
        assert_eq!(told(host, name).await, None);
    }
    crowded.shutdown().await;

    let window = Duration::from_micros(30);
    let chosen = Pool::builder(Host::builder(worker_bin()).poll_under_load(Some(window)))
        .size(cpus() + 1)
        .spawn()
        .await
        .unwrap();
    let expected = (cpus() > 1).then(|| "30".to_owned());
    for host in chosen.hosts() {
        assert_eq!(told(host, name).await, expected);
    }
    chosen.shutdown().await;
}

/// CPU time the process `pid` has run, from `/proc/<pid>/schedstat` (nanoseconds).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap();
    let nanos = stat.split_whitespace().next().unwrap().parse().unwrap();
    Duration::from_nanos(nanos)
}

/// The CPU time a worker spends answering 64 calls made at once and in the 100 ms after, with
/// a polling window under load of `window`.
async fn cpu_for_a_batch(window: Option<Duration>) -> Duration {
    let host = Host::builder(worker_bin())
        .poll_under_load(window)
        .spawn()
        .await
        .unwrap();
    let pid = host.worker_pid().unwrap();
    let before = cpu_time(pid);
    let calls: Vec<_> = (0..64i64)
        .map(|i| {
            let host = host.clone();
            tokio::spawn(async move { host.call::<Sum>(&vec![i, 1]).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let spent = cpu_time(pid) - before;
    host.shutdown().await;
    spent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_worker_polls_after_calls_that_came_together_as_its_host_says() {
    if cpus() < 2 {
        return;
    }
    // Sixty-four calls begun at once reach the worker together (the host gathers them into
    // few writes), and it answers them in well under a millisecond of CPU. With a window, here
    // the longest allowed, it then polls instead of sleeping, spending CPU while nothing comes:
    // up to the whole window, and a good part of it even with both CPUs busy elsewhere.
    let longest = airlock_protocol::spin::MAX_SPIN;
    let polling = cpu_for_a_batch(Some(longest)).await;
    let asleep = cpu_for_a_batch(None).await;
    // About 10 ms more on a quiet machine; 2.4 ms in all was the least seen with two busy
    // loops taking the CPUs (22 runs), where the calls alone took 0.3–0.8 ms.
    assert!(
        polling >= asleep + Duration::from_millis(1),
        "{polling:?} of CPU for the batch and the 100 ms after it with a window of {longest:?}, \
         {asleep:?} with polling off"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_load_window_over_the_maximum_is_refused_at_spawn() {
    let too_long = airlock_protocol::spin::MAX_SPIN + Duration::from_micros(1);
    match Host::builder(worker_bin())
        .poll_under_load(Some(too_long))
        .spawn()
        .await
    {
        Err(SpawnError::Config(ConfigError::LoadPollTooLong(window))) => {
            assert_eq!(window, too_long);
        }
        other => panic!("expected LoadPollTooLong, got {:?}", other.map(|_| ())),
    }
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
