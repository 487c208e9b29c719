//! End to end against the real `airlock-worker` binary over each transport: calls, many in
//! flight, the in-flight limit, deadlines, cancellation, panics, unknown methods, bad requests, exits, restarts and
//! the restart budget, shutdown, stdout noise, stderr floods, and no leaks over many cycles.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use airlock_host::{CallError, Host, HostBuilder, LostReason, RestartPolicy, TransportChoice};
use airlock_protocol::{ErrorKind, HostConfig};
use airlock_tests::e2e::{
    an_exit_mid_call_fails_the_call_and_a_fresh_worker_serves, call_pid, fast_restarts,
    process_alive, soon, worker_bin, SumOfBytes,
};
use airlock_worker::builtin::{
    Cwd, Digest, Echo, Env, Fail, OpenFds, Panic, Print, Sleep, StderrFlood, Sum,
};
use serde_bytes::ByteBuf;

airlock_host::method!(
    /// A method the bundled worker does not serve.
    Missing, "no-such-method", () => ()
);

/// The rogue worker exits with code 3 on receiving a call, over every transport (the real
/// worker SIGKILLed mid-call is `worker_killed_mid_call_...` in the macro below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_exit_mid_call_fails_the_call_and_a_fresh_worker_serves() {
    for transport in [
        TransportChoice::Pipe,
        TransportChoice::SocketInherited,
        TransportChoice::SocketNamed,
    ] {
        an_exit_mid_call_fails_the_call_and_a_fresh_worker_serves(transport, |host| host).await;
    }
}

/// The backoff before the `n`th restart (1-based) under `policy`, as `RestartPolicy`
/// documents it: `initial_backoff` doubled for each earlier restart, capped at `max_backoff`.
fn backoff_before_restart(policy: &RestartPolicy, n: u32) -> Duration {
    (policy.initial_backoff * 2u32.pow(n - 1)).min(policy.max_backoff)
}

/// The tests every transport must pass; each module below supplies `worker()`.
macro_rules! lifecycle_tests {
    () => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn builtin_calls_return_typed_results() {
            let host = worker().spawn().await.unwrap();
            assert_eq!(host.worker_info().name, "airlock-worker");
            assert_eq!(host.call::<Sum>(&vec![40, 2]).await, Ok(42));
            let payload = ByteBuf::from((0..=255u8).collect::<Vec<_>>());
            assert_eq!(host.call::<Echo>(&payload).await.unwrap(), payload);
            assert_eq!(
                host.call::<Digest>(&payload).await.unwrap(),
                airlock_worker::builtin::fnv1a(&payload)
            );
            assert_eq!(host.call::<Sleep>(&5).await, Ok(5));
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_thousand_concurrent_calls_on_one_worker() {
            let host = worker().spawn().await.unwrap();
            let tasks: Vec<_> = (0..1000i64)
                .map(|i| {
                    let host = host.clone();
                    tokio::spawn(async move { (i, host.call::<Sum>(&vec![i, i]).await) })
                })
                .collect();
            for task in tasks {
                let (i, result) = task.await.unwrap();
                assert_eq!(result, Ok(2 * i), "call {i}");
            }
            let stats = host.stats();
            assert_eq!(stats.calls_ok, 1000);
            assert_eq!(stats.restarts, 0);
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn with_no_grace_a_deadline_kills_the_worker_and_a_fresh_one_answers_next() {
            let host = worker()
                .protocol(no_grace())
                .restart_policy(fast_restarts(5))
                .spawn()
                .await
                .unwrap();
            let first = call_pid(&host).await.unwrap();
            assert_eq!(
                host.call_with_deadline::<Sleep>(&60_000, soon(200)).await,
                Err(CallError::Timeout)
            );
            assert!(!process_alive(first), "the hung worker {first} still runs");
            let second = call_pid(&host).await.unwrap();
            assert_ne!(first, second, "the hung worker was reused");
            assert_eq!(host.stats().restarts, 1);
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn restarts_back_off_and_stop_at_the_budget() {
            let policy = RestartPolicy {
                max_restarts: 3,
                window: Duration::from_secs(60),
                initial_backoff: Duration::from_millis(150),
                max_backoff: Duration::from_secs(1),
            };
            // No cancel grace: each missed deadline is a loss, as the budget needs.
            let host = worker()
                .protocol(no_grace())
                .restart_policy(policy)
                .spawn()
                .await
                .unwrap();
            let mut pids = HashSet::new();
            pids.insert(call_pid(&host).await.unwrap());
            for restart in 1..=policy.max_restarts {
                // The worker cannot be lost before this deadline, so the backoff starts after it.
                let deadline = soon(50);
                assert_eq!(
                    host.call_with_deadline::<Sleep>(&60_000, deadline).await,
                    Err(CallError::Timeout)
                );
                // Sent during the backoff, this call waits for the replacement worker.
                pids.insert(call_pid(&host).await.unwrap());
                let waited = deadline.elapsed();
                let backoff = backoff_before_restart(&policy, restart);
                assert!(
                    waited >= backoff,
                    "restart {restart} came {waited:?} after the loss, before its backoff {backoff:?}"
                );
            }
            // Had the backoff not doubled, the last restart would have come 150 ms after its loss.
            assert_eq!(
                backoff_before_restart(&policy, policy.max_restarts),
                Duration::from_millis(600)
            );
            assert_eq!(pids.len(), 4, "each restart is a fresh process");
            assert_eq!(host.stats().restarts, u64::from(policy.max_restarts));
            // One more loss spends the budget (3 restarts): calls now fail fast.
            assert_eq!(
                host.call_with_deadline::<Sleep>(&60_000, soon(50)).await,
                Err(CallError::Timeout)
            );
            let started = Instant::now();
            assert_eq!(
                host.call::<Sum>(&vec![1]).await,
                Err(CallError::WorkerLost(LostReason::RestartBudgetExhausted))
            );
            assert!(started.elapsed() < Duration::from_millis(500));
            assert!(!host.is_alive());
            assert_eq!(host.stats().restarts, u64::from(policy.max_restarts));
            for pid in pids {
                assert!(!process_alive(pid), "worker {pid} survived");
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn worker_killed_mid_call_fails_the_call_and_a_fresh_worker_serves() {
            let host = worker()
                .restart_policy(fast_restarts(5))
                .spawn()
                .await
                .unwrap();
            let pid = call_pid(&host).await.unwrap();
            // A deadline well short of the sleep: a call that missed the kill and reached the
            // replacement ends in `Timeout`, not a hang.
            let call = {
                let host = host.clone();
                tokio::spawn(async move { host.call_with_deadline::<Sleep>(&60_000, soon(10_000)).await })
            };
            let waited_from = Instant::now();
            while host.in_flight() == 0 {
                assert!(waited_from.elapsed() < Duration::from_secs(5), "the call never started");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Let the call reach the worker before it dies.
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(process_alive(pid));
            rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid as i32).unwrap(),
                rustix::process::Signal::KILL,
            )
            .unwrap();
            match call.await.unwrap() {
                Err(CallError::WorkerLost(LostReason::Exited(info))) => {
                    assert_eq!(info.signal, Some(9), "{info}")
                }
                other => panic!("expected WorkerLost(Exited), got {other:?}"),
            }
            let fresh = call_pid(&host).await.unwrap();
            assert_ne!(fresh, pid, "the dead worker was reused");
            let stats = host.stats();
            assert_eq!(stats.restarts, 1);
            assert_eq!(stats.calls_failed.worker_lost, 1);
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_call_over_the_in_flight_limit_is_refused_at_once() {
            let host = worker()
                .protocol(HostConfig::default().max_in_flight(2).unwrap())
                .spawn()
                .await
                .unwrap();
            let pid = call_pid(&host).await.unwrap();
            let slow: Vec<_> = (0..2)
                .map(|_| {
                    let host = host.clone();
                    tokio::spawn(async move { host.call::<Sleep>(&1_500).await })
                })
                .collect();
            let waited_from = Instant::now();
            while host.in_flight() < 2 {
                assert!(waited_from.elapsed() < Duration::from_secs(5), "the calls never started");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            // Let both reach the worker: the limit is now reached.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let started = Instant::now();
            assert_eq!(host.call::<Sleep>(&1_500).await, Err(CallError::Overloaded { max: 2 }));
            assert!(
                started.elapsed() < Duration::from_millis(500),
                "the refusal took {:?}: the call waited for a slot",
                started.elapsed()
            );
            for call in slow {
                assert_eq!(call.await.unwrap(), Ok(1_500));
            }
            // The refusal cost the worker nothing, and a slot is free again.
            assert_eq!(call_pid(&host).await, Ok(pid));
            let stats = host.stats();
            assert_eq!(stats.calls_failed.refused, 1);
            assert_eq!(stats.calls_ok, 4);
            assert_eq!(stats.restarts, 0);
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropping_a_call_cancels_it_without_killing_the_worker() {
            let host = worker().spawn().await.unwrap();
            let pid = call_pid(&host).await.unwrap();
            let dropped =
                tokio::time::timeout(Duration::from_millis(100), host.call::<Sleep>(&60_000)).await;
            assert!(dropped.is_err(), "the sleep should still have been running");
            assert_eq!(host.call::<Sum>(&vec![1, 1]).await, Ok(2));
            assert_eq!(
                call_pid(&host).await,
                Ok(pid),
                "the worker was replaced"
            );
            let stats = host.stats();
            assert_eq!(stats.calls_failed.cancelled, 1);
            assert_eq!(stats.in_flight, 0);
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn panic_is_reported_as_data_and_the_worker_keeps_serving() {
            let host = worker().spawn().await.unwrap();
            let pid = call_pid(&host).await.unwrap();
            match host.call::<Panic>(&"kaboom".into()).await {
                Err(CallError::Remote(err)) => {
                    assert_eq!(err.kind(), ErrorKind::Panic);
                    assert!(err.message().contains("kaboom"), "{}", err.message());
                }
                other => panic!("expected a panic report, got {other:?}"),
            }
            assert_eq!(call_pid(&host).await, Ok(pid));
            match host.call::<Fail>(&"no such thing".into()).await {
                Err(CallError::Remote(err)) => assert_eq!(err.kind(), ErrorKind::Handler),
                other => panic!("expected a handler error, got {other:?}"),
            }
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn unknown_method_and_bad_request_are_remote_errors() {
            let host = worker().spawn().await.unwrap();
            match host.call::<Missing>(&()).await {
                Err(CallError::Remote(err)) => assert_eq!(err.kind(), ErrorKind::UnknownMethod),
                other => panic!("expected UnknownMethod, got {other:?}"),
            }
            // Encoded as [1, 0x80]: to `sum` that is one i64 whose varint never ends.
            let request = ByteBuf::from(vec![0x80]);
            assert!(
                airlock_codec::from_slice::<Vec<i64>>(&[1, 0x80], &Default::default()).is_err()
            );
            match host.call::<SumOfBytes>(&request).await {
                Err(CallError::Remote(err)) => assert_eq!(err.kind(), ErrorKind::BadRequest),
                other => panic!("expected BadRequest, got {other:?}"),
            }
            assert_eq!(host.stats().restarts, 0);
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shutdown_with_calls_pending_answers_every_call() {
            let host = worker()
                .shutdown_grace(Duration::from_millis(300))
                .spawn()
                .await
                .unwrap();
            let quick = {
                let host = host.clone();
                tokio::spawn(async move { host.call::<Sleep>(&50).await })
            };
            let slow = {
                let host = host.clone();
                tokio::spawn(async move { host.call::<Sleep>(&60_000).await })
            };
            tokio::time::sleep(Duration::from_millis(20)).await;
            let started = Instant::now();
            host.shutdown().await;
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "shutdown exceeded its grace"
            );
            assert_eq!(
                quick.await.unwrap(),
                Ok(50),
                "a call finishing within the grace completes"
            );
            assert_eq!(
                slow.await.unwrap(),
                Err(CallError::WorkerLost(LostReason::Shutdown)),
                "a call outliving the grace is failed, not dropped"
            );
            assert_eq!(host.call::<Sum>(&vec![1]).await, Err(CallError::Shutdown));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stdout_noise_from_a_handler_does_not_reach_the_channel() {
            let host = worker().spawn().await.unwrap();
            // A frame-shaped line: were stdout the channel, this would be a length prefix of ~10 MB.
            let noise = "\u{0}\u{0}\u{a0}\u{0}not a frame".to_string();
            assert_eq!(host.call::<Print>(&noise).await, Ok(()));
            for i in 0..10 {
                assert_eq!(host.call::<Sum>(&vec![i]).await, Ok(i));
            }
            assert_eq!(host.stats().restarts, 0);
            assert!(host.stats().violations.is_empty());
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn stderr_flood_is_rate_limited_and_does_not_stall_calls() {
            let host = worker().spawn().await.unwrap();
            let started = Instant::now();
            assert_eq!(host.call::<StderrFlood>(&50_000).await, Ok(()));
            assert_eq!(host.call::<Sum>(&vec![7]).await, Ok(7));
            assert!(started.elapsed() < Duration::from_secs(20));
            // Give the relay a moment to drain the pipe, then count what it dropped.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let dropped = host.stats().stderr_lines_dropped;
            assert!(
                dropped > 40_000,
                "only {dropped} lines were dropped: the flood was not limited"
            );
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn worker_gets_a_cleared_environment_and_the_chosen_directory() {
            let dir = std::env::temp_dir();
            let host = worker()
                .env("ONLY_THIS", "1")
                .current_dir(&dir)
                .spawn()
                .await
                .unwrap();
            // The host's own environment is not empty (cargo sets plenty), and none of it leaks.
            assert!(std::env::vars().count() > 3);
            // Only what the caller added, plus the transport's own `AIRLOCK_*` variables.
            let env: Vec<(String, String)> = host
                .call::<Env>(&())
                .await
                .unwrap()
                .into_iter()
                .filter(|(key, _)| !key.starts_with("AIRLOCK_"))
                .collect();
            assert_eq!(env, vec![("ONLY_THIS".to_string(), "1".to_string())]);
            let cwd = host.call::<Cwd>(&()).await.unwrap();
            assert_eq!(std::path::Path::new(&cwd), dir.canonicalize().unwrap());
            host.shutdown().await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn host_descriptors_do_not_leak_into_the_worker() {
            use std::os::fd::AsRawFd;
            // A descriptor opened without close-on-exec: any child spawned naively inherits it.
            let scratch = airlock_tests::e2e::ScratchDir::new("lifecycle");
            let canary_path = scratch.join("fd-canary");
            std::fs::write(&canary_path, b"secret").unwrap();
            let canary = rustix::fs::open(
                &canary_path,
                rustix::fs::OFlags::RDONLY,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            let naive = std::process::Command::new("ls")
                .arg("-l")
                .arg(format!("/proc/self/fd/{}", canary.as_raw_fd()))
                .output()
                .unwrap();
            assert!(
                naive.status.success(),
                "the attack is not live: a plain child did not inherit it"
            );

            let host = worker().spawn().await.unwrap();
            let fds = host.call::<OpenFds>(&()).await.unwrap();
            let canary_name = canary_path.display().to_string();
            assert!(
                fds.iter().all(|(_, target)| target != &canary_name),
                "the canary leaked into the worker: {fds:?}"
            );
            // stdio 0-2 are the relocated descriptors; the rest are the private channel copies and
            // the worker's own runtime (epoll, eventfd, its pipes).
            assert!(fds.iter().any(|(fd, _)| *fd == 0));
            host.shutdown().await;
            drop(canary);
        }
    };
}

/// A cancel grace of zero: a call past its deadline takes its worker down at the deadline.
fn no_grace() -> airlock_host::HostConfig {
    airlock_host::HostConfig::default()
        .cancel_grace(Duration::ZERO)
        .unwrap()
}

mod pipe {
    use super::*;

    fn worker() -> HostBuilder {
        Host::builder(worker_bin()).transport(TransportChoice::Pipe)
    }

    lifecycle_tests!();
}

mod socket_inherited {
    use super::*;

    fn worker() -> HostBuilder {
        Host::builder(worker_bin()).transport(TransportChoice::SocketInherited)
    }

    lifecycle_tests!();
}

mod socket_named {
    use super::*;

    fn worker() -> HostBuilder {
        Host::builder(worker_bin()).transport(TransportChoice::SocketNamed)
    }

    lifecycle_tests!();
}
