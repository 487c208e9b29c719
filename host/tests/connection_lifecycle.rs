//! A host across a worker's end: calls waiting for a worker that dies at its Hello are lost
//! with it for its reason (never failed as a shut-down host), and a host whose supervisor is
//! gone answers at once.

use std::time::{Duration, Instant};

use airlock_host::{CallError, InProcess};
use airlock_worker::builtin::{builtin_worker, Sum};

/// Over the pipe transport only: the stand-in worker below writes its frames to its stdout,
/// which is its channel there (the socket transport hands it a socket instead).
#[cfg(feature = "pipe")]
mod over_the_pipe {
    use std::time::{Duration, Instant};

    use airlock_host::{CallError, Confinement, Host, RestartPolicy};
    use airlock_protocol::frame::{encode_frame, Frame, Hello};
    use airlock_protocol::PROTOCOL_VERSION;
    use airlock_worker::builtin::Echo;
    use serde_bytes::ByteBuf;

    /// A worker whose Hello and a bad frame arrive in one read: its `Ready` is handled on a
    /// session already closed. The calls waiting for it were that worker's: they are lost with
    /// it, for its reason, never failed as if the host had shut down.
    #[tokio::test(flavor = "current_thread")]
    async fn calls_waiting_for_a_worker_that_dies_at_its_hello_are_not_failed_as_shutdown() {
        let dir =
            std::env::temp_dir().join(format!("airlock-hello-then-garbage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("frames");
        let mut bytes = encode_frame(&Frame::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            worker_name: "hello-then-garbage",
            worker_version: "1.0.0",
            methods: vec!["echo"],
            token: None,
        }));
        bytes.extend_from_slice(&[1, 0, 0, 0, 0xEE]);
        std::fs::write(&file, &bytes).unwrap();
        let host = Host::builder("/bin/sh")
            .arg("-c")
            .arg(format!("/bin/cat {}; exec /bin/sleep 3", file.display()))
            .confinement(Confinement::none())
            .restart_policy(RestartPolicy {
                max_restarts: 1000,
                window: Duration::from_secs(60),
                initial_backoff: Duration::from_millis(5),
                max_backoff: Duration::from_millis(5),
            })
            .spawn()
            .await
            .expect("spawn");
        let mut outcomes = std::collections::BTreeMap::<String, u32>::new();
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let r = host
                .call_with_deadline::<Echo>(
                    &ByteBuf::from(b"x".to_vec()),
                    Instant::now() + Duration::from_secs(2),
                )
                .await;
            let key = match &r {
                Err(CallError::WorkerLost(reason)) => {
                    format!("WorkerLost({reason:?})").chars().take(60).collect()
                }
                other => format!("{other:?}"),
            };
            *outcomes.entry(key).or_default() += 1;
        }
        let alive = host.is_alive();
        host.shutdown().await;
        assert!(
            !outcomes.contains_key("Err(Shutdown)"),
            "a call on a live host failed as Shutdown: {outcomes:?}"
        );
        assert!(alive, "the restart budget is far from spent: {outcomes:?}");
        let violations: u32 = outcomes
            .iter()
            .filter(|(key, _)| {
                key.starts_with("WorkerLost(Violation(") && key.contains("MalformedFrame")
            })
            .map(|(_, n)| n)
            .sum();
        assert_eq!(violations, 40, "{outcomes:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The runtime the host was spawned on is gone, and its supervisor with it: a call made from
/// another runtime fails at once with `Shutdown`, instead of waiting out its deadline.
#[test]
fn a_call_after_the_supervisors_runtime_is_gone_fails_at_once() {
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let host = first.block_on(InProcess::new(builtin_worker)).unwrap();
    assert_eq!(first.block_on(host.call::<Sum>(&vec![1, 2])), Ok(3));
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let r = second.block_on(
        host.call_with_deadline::<Sum>(&vec![1], Instant::now() + Duration::from_secs(2)),
    );
    let took = started.elapsed();
    assert_eq!(r, Err(CallError::Shutdown));
    assert!(took < Duration::from_secs(1), "waited {took:?} for {r:?}");
}
