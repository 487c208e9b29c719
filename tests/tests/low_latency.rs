//! The opt-in low-latency mode (`HostBuilder::low_latency`) and polling under load
//! (`HostBuilder::poll_under_load`, on by default): the worker is told its windows and calls
//! answer exactly as without them; a window over the maximum is refused at spawn. Their speed
//! is measured by `cargo xtask bench`, never here.

use std::time::Duration;

use airlock_host::{ConfigError, Host, Pool, SpawnError, TransportChoice};
use airlock_tests::e2e::{an_exit_mid_call_fails_the_call_and_a_fresh_worker_serves, worker_bin};
use airlock_worker::builtin::{Env, Sleep, Sum};

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

const TRANSPORTS: [TransportChoice; 3] = [
    TransportChoice::Pipe,
    TransportChoice::SocketInherited,
    TransportChoice::SocketNamed,
];

/// The host's reader polls the channel itself while it spins (its worker runs under the
/// host's filter), and so does the worker's loop, alone on its thread, over each transport:
/// calls made one at a time answer in order, so does one answered after its window closed,
/// and a worker that exits while the reader polls fails its call exactly as without the
/// mode, and a fresh worker serves. On a multi-thread runtime and on a current-thread one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_polling_its_channel_in_place_answers_every_call_and_sees_its_worker_exit() {
    polling_in_place_answers_every_call_and_sees_its_worker_exit().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_current_thread_host_polling_in_place_answers_every_call_and_sees_its_worker_exit() {
    polling_in_place_answers_every_call_and_sees_its_worker_exit().await;
}

async fn polling_in_place_answers_every_call_and_sees_its_worker_exit() {
    let window = Duration::from_millis(10);
    for transport in TRANSPORTS {
        let host = Host::builder(worker_bin())
            .transport(transport)
            .low_latency(window)
            .spawn()
            .await
            .unwrap();
        for i in 0..500 {
            assert_eq!(
                host.call::<Sum>(&vec![i, 1]).await,
                Ok(i + 1),
                "{transport:?}"
            );
        }
        assert_eq!(host.call::<Sleep>(&30).await, Ok(30), "{transport:?}");
        pipelined_sums_answer(&host, 200).await;
        host.shutdown().await;

        an_exit_mid_call_fails_the_call_and_a_fresh_worker_serves(transport, |host| {
            host.low_latency(window)
        })
        .await;
    }
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
    let default = (cpus() > 1).then(|| "50".to_owned());
    let chosen = (cpus() > 1).then(|| "30".to_owned());
    let window = Some(Duration::from_micros(30));
    pool_tells(Host::builder(worker_bin()), cpus() + 1, None).await;
    // One worker per CPU keeps it.
    pool_tells(Host::builder(worker_bin()), cpus(), default).await;
    let chosen_builder = Host::builder(worker_bin()).poll_under_load(window);
    pool_tells(chosen_builder, cpus() + 1, chosen).await;
}

/// Spawns a `Pool` of `size` from `builder` and checks what each worker was told.
async fn pool_tells(builder: airlock_host::HostBuilder, size: usize, expected: Option<String>) {
    let pool = Pool::builder(builder).size(size).spawn().await.unwrap();
    for host in pool.hosts() {
        let told = told(host, airlock_protocol::spin::LOAD_POLL_ENV).await;
        assert_eq!(told, expected, "a Pool of {size}");
    }
    pool.shutdown().await;
}

/// The worker's scheduler state (`R` running or runnable, `S` asleep...).
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The state follows the command's name in parentheses.
    let after_name = &stat[stat.rfind(')').unwrap() + 1..];
    after_name.trim_start().chars().next().unwrap()
}

/// How many of ten looks, 0.5 ms apart, right after a spell of pipelined calls, find a fresh
/// worker running or runnable rather than asleep, with a polling window under load of `window`.
async fn running_after_pipelined_calls(window: Option<Duration>) -> usize {
    let host = Host::builder(worker_bin())
        .poll_under_load(window)
        .spawn()
        .await
        .unwrap();
    let pid = host.worker_pid().unwrap();
    // 128 callers making 8 calls each, in turn: the channel stays full, and the worker finds
    // the calls arriving together turn after turn.
    let callers: Vec<_> = (0..128)
        .map(|_| {
            let host = host.clone();
            tokio::spawn(async move {
                for i in 0..8i64 {
                    assert_eq!(host.call::<Sum>(&vec![i, 1]).await, Ok(i + 1));
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
    let looks = tokio::task::spawn_blocking(move || {
        (0..10)
            .filter(|_| {
                std::thread::sleep(Duration::from_micros(500));
                state(pid) == 'R'
            })
            .count()
    });
    let running = looks.await.unwrap();
    host.shutdown().await;
    running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_worker_polls_after_calls_that_came_together_as_its_host_says() {
    if cpus() < 2 {
        return;
    }
    // A worker polling through its window (here the longest allowed) is running or waiting for
    // a CPU; one that is not sleeps in its read.
    let asleep = running_after_pipelined_calls(None).await;
    assert!(
        asleep <= 2,
        "{asleep} of ten looks found the worker running, polling off"
    );
    // It polls only while it measures polling to pay (`SpinPolicy`), which on CPUs kept busy
    // elsewhere it may not: a fresh worker, and so a fresh measure, each time, until one does.
    let longest = airlock_protocol::spin::MAX_SPIN;
    let mut seen = Vec::new();
    for _ in 0..20 {
        let polling = running_after_pipelined_calls(Some(longest)).await;
        seen.push(polling);
        if polling >= 5 {
            return;
        }
    }
    panic!("of ten looks each, {seen:?} found the worker running with a window of {longest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_under_a_microsecond_is_sent_as_one_not_turned_off() {
    let tiny = Duration::from_nanos(400);
    let host = Host::builder(worker_bin())
        .low_latency(tiny)
        .poll_under_load(Some(tiny))
        .spawn()
        .await
        .unwrap();
    let expected = (cpus() > 1).then(|| "1".to_owned());
    for name in [
        airlock_protocol::spin::SPIN_ENV,
        airlock_protocol::spin::LOAD_POLL_ENV,
    ] {
        assert_eq!(told(&host, name).await, expected, "{name}");
    }
    host.shutdown().await;
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
