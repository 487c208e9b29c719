//! Time before frames: a reply that arrives after its call's deadline is never delivered. When
//! the host's driver wakes to find both a reply and a passed deadline waiting (its thread was
//! busy, or the timer's 1 ms granularity let the frame in first), the clock must be read
//! before the frame is accepted.

use std::time::{Duration, Instant};

use airlock_host::{CallError, Host, RestartPolicy};
use airlock_tests::e2e::worker_bin;
use airlock_tests::support::current_thread_runtime;
use airlock_worker::builtin::Sleep;

#[test]
fn a_reply_after_its_deadline_is_never_delivered() {
    // One thread, so that blocking it holds the host's driver still while the worker answers.
    let runtime = current_thread_runtime();
    runtime.block_on(async {
        let host = Host::builder(worker_bin())
            .restart_policy(RestartPolicy {
                max_restarts: 1000,
                initial_backoff: Duration::from_millis(1),
                ..RestartPolicy::default()
            })
            .spawn()
            .await
            .unwrap();
        let rounds = 40;
        let mut delivered_late = 0;
        for _ in 0..rounds {
            let deadline = Instant::now() + Duration::from_millis(20);
            let call = {
                let host = host.clone();
                tokio::spawn(async move { host.call_with_deadline::<Sleep>(&30, deadline).await })
            };
            // Let the call go out, then hold the thread past both the deadline (20 ms) and
            // the worker's answer (30 ms after it read the call).
            tokio::time::sleep(Duration::from_millis(5)).await;
            std::thread::sleep(Duration::from_millis(100));
            match call.await.unwrap() {
                Ok(_) => delivered_late += 1,
                Err(CallError::Timeout) => {}
                Err(other) => panic!("expected a timeout, got {other:?}"),
            }
        }
        assert_eq!(
            delivered_late, 0,
            "{delivered_late} of {rounds} replies that arrived after their deadline were delivered"
        );
        host.shutdown().await;
    });
}
