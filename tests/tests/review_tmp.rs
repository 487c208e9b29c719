use airlock_host::{Host, RestartPolicy};
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{Pid, Sleep};
use std::time::{Duration, Instant};

async fn once(shutdown_at: u64, seed0: u64) {
    let host = Host::builder(worker_bin())
        .shutdown_grace(Duration::from_millis(100))
        .restart_policy(RestartPolicy {
            max_restarts: 1000,
            window: Duration::from_secs(60),
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
        })
        .spawn()
        .await
        .unwrap();
    let mut tasks = Vec::new();
    let mut seed: u64 = seed0;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..400u64 {
        let h2 = host.clone();
        let sleep = rnd() % 300;
        let kill = rnd() % 50 == 0;
        tasks.push(tokio::spawn(async move {
            if kill {
                if let Ok(pid) = h2.call::<Pid>(&()).await {
                    let _ = rustix::process::kill_process(
                        rustix::process::Pid::from_raw(pid as i32).unwrap(),
                        rustix::process::Signal::KILL,
                    );
                }
            }
            let t = Instant::now();
            let r = h2
                .call_with_deadline::<Sleep>(&sleep, Instant::now() + Duration::from_secs(3))
                .await;
            (i, r, t.elapsed())
        }));
        if i == shutdown_at {
            let h = host.clone();
            tokio::spawn(async move {
                h.shutdown().await;
            });
        }
        if i % 20 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let t = Instant::now();
    host.shutdown().await;
    let sd = t.elapsed();
    let mut worst = Duration::ZERO;
    let mut counts = std::collections::BTreeMap::new();
    for task in tasks {
        let (_i, r, el) = tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("call hung")
            .unwrap();
        worst = worst.max(el);
        let k = match &r {
            Ok(_) => "ok".to_string(),
            Err(e) => format!("{e:?}").chars().take(30).collect(),
        };
        *counts.entry(k).or_insert(0) += 1;
    }
    eprintln!("shutdown_at {shutdown_at}: shutdown took {sd:?}, worst call {worst:?}, {counts:?}");
    assert!(worst < Duration::from_secs(2));
}
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_shutdown() {
    for (i, at) in [0u64, 50, 150, 399, 1000].into_iter().enumerate() {
        once(at, 0x9e3779b97f4a7c15 ^ i as u64).await;
    }
}
