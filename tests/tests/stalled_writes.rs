//! A worker that stops reading, or reads a drip at a time, is cut off at the send deadline on
//! every write path (the caller's direct write under the default confinement, the writer task,
//! the blocking API), and the calls behind the stuck write learn it then, not at their own
//! deadlines.

use std::time::{Duration, Instant};

use airlock_host::{blocking, CallError, Host, HostBuilder, TransportChoice};
use airlock_tests::e2e::{fast_restarts, rogue_bin, rogue_host_in, soon, ScratchDir};
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

const SEND_TIMEOUT: Duration = Duration::from_millis(500);

fn builder(
    dir: &ScratchDir,
    scenario: &str,
    confined: bool,
    transport: TransportChoice,
) -> HostBuilder {
    let builder = if confined {
        rogue_host_in(dir)
    } else {
        Host::builder(rogue_bin()).confinement(airlock_host::Confinement::none())
    };
    builder
        .arg(scenario)
        .env("ROGUE_ONCE", dir.join("once"))
        .transport(transport)
        .restart_policy(fast_restarts(5))
        .send_timeout(SEND_TIMEOUT)
}

async fn big_call_is_cut_off(scenario: &str, confined: bool, transport: TransportChoice) {
    let dir = ScratchDir::new("stalled-writes");
    let host = builder(&dir, scenario, confined, transport)
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let seccomp = host.worker_info().confinement.seccomp_filters;
    assert_eq!(
        confined,
        seccomp > 0,
        "direct writes iff seccomp: {seccomp}"
    );
    let started = Instant::now();
    // 8 MiB: more than any pipe or socket buffer holds; the write has to wait.
    let big = tokio::spawn({
        let host = host.clone();
        async move {
            host.call_with_deadline::<Echo>(&ByteBuf::from(vec![7u8; 8 << 20]), soon(30_000))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let behind = host
        .call_with_deadline::<Echo>(&ByteBuf::from(b"behind".to_vec()), soon(30_000))
        .await;
    let took = started.elapsed();
    let big = big.await.unwrap();
    assert!(
        took < Duration::from_secs(4),
        "{scenario} (confined {confined}, {transport:?}): the call behind the stuck write \
         waited {took:?} with a {SEND_TIMEOUT:?} send deadline ({behind:?}, big: {:?})",
        big.as_ref().map(|b| b.len())
    );
    assert!(
        matches!(behind, Err(CallError::WorkerLost(_))),
        "{behind:?}"
    );
    assert!(
        matches!(big, Err(CallError::WorkerLost(_))),
        "{:?}",
        big.map(|b| b.len())
    );
    let fresh = host
        .call_with_deadline::<Echo>(&ByteBuf::from(b"fresh".to_vec()), soon(10_000))
        .await;
    assert_eq!(fresh.unwrap().as_slice(), b"fresh");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_write_never_read_pipe() {
    big_call_is_cut_off("never_read", true, TransportChoice::Pipe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_write_drip_read_pipe() {
    big_call_is_cut_off("drip_read", true, TransportChoice::Pipe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_task_drip_read_pipe() {
    big_call_is_cut_off("drip_read", false, TransportChoice::Pipe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_write_never_read_socket() {
    big_call_is_cut_off("never_read", true, TransportChoice::SocketInherited).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_write_drip_read_socket() {
    big_call_is_cut_off("drip_read", true, TransportChoice::SocketInherited).await;
}

#[tokio::test(flavor = "current_thread")]
async fn direct_write_never_read_pipe_current_thread() {
    big_call_is_cut_off("never_read", true, TransportChoice::Pipe).await;
}

/// The blocking API: callers on threads with no runtime of their own.
fn blocking_cut_off(scenario: &str, confined: bool) {
    let dir = ScratchDir::new("stalled-writes-blocking");
    let host = blocking::Host::spawn(builder(&dir, scenario, confined, TransportChoice::Pipe))
        .expect("the rogue completes its handshake");
    let started = Instant::now();
    let big = std::thread::spawn({
        let host = host.clone();
        move || host.call_with_deadline::<Echo>(&ByteBuf::from(vec![7u8; 8 << 20]), soon(30_000))
    });
    std::thread::sleep(Duration::from_millis(50));
    let behind = host.call_with_deadline::<Echo>(&ByteBuf::from(b"behind".to_vec()), soon(30_000));
    let took = started.elapsed();
    let big = big.join().unwrap();
    assert!(
        took < Duration::from_secs(4),
        "blocking {scenario}: the call behind waited {took:?} ({behind:?})"
    );
    assert!(
        matches!(behind, Err(CallError::WorkerLost(_))),
        "{behind:?}"
    );
    assert!(big.is_err());
    let fresh = host.call_with_deadline::<Echo>(&ByteBuf::from(b"fresh".to_vec()), soon(10_000));
    assert_eq!(fresh.unwrap().as_slice(), b"fresh");
}

#[test]
fn blocking_direct_write_never_read() {
    blocking_cut_off("never_read", true);
}

#[test]
fn blocking_direct_write_drip_read() {
    blocking_cut_off("drip_read", true);
}

/// A graceful shutdown while a write is stuck (send deadline far off): the grace bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_stuck_direct_write_is_bounded_by_the_grace() {
    for confined in [true, false] {
        let dir = ScratchDir::new("stalled-writes-shutdown");
        let host = builder(&dir, "never_read", confined, TransportChoice::Pipe)
            .send_timeout(Duration::from_secs(60))
            .shutdown_grace(Duration::from_millis(200))
            .spawn()
            .await
            .expect("the rogue completes its handshake");
        let pid = host.worker_pid().unwrap();
        let big = tokio::spawn({
            let host = host.clone();
            async move {
                host.call_with_deadline::<Echo>(&ByteBuf::from(vec![7u8; 8 << 20]), soon(60_000))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        let done = tokio::time::timeout(Duration::from_secs(5), host.shutdown()).await;
        let took = started.elapsed();
        let alive = airlock_tests::e2e::process_alive(pid);
        assert!(
            done.is_ok() && took < Duration::from_secs(2),
            "confined {confined}: shutdown took {took:?}"
        );
        assert!(!alive, "confined {confined}: worker left alive");
        let big = tokio::time::timeout(Duration::from_secs(2), big).await;
        assert!(
            matches!(big, Ok(Ok(Err(_)))),
            "confined {confined}: {big:?}"
        );
    }
}

/// Many callers at once, bodies around the pipe's size, some given up mid-write: with direct
/// writes (confined) and through the writer task, every frame must reach the honest worker
/// whole and in order (no violation, no restart) and every echo must be exact.
async fn stress(confined: bool, transport: TransportChoice) {
    let dir = ScratchDir::new("stalled-writes-stress");
    let base = if confined {
        Host::builder(airlock_tests::e2e::worker_bin())
            .confinement(airlock_host::Confinement::strict().read_write(&*dir))
    } else {
        Host::builder(airlock_tests::e2e::worker_bin())
            .confinement(airlock_host::Confinement::none())
    };
    let host = base
        .transport(transport)
        .restart_policy(fast_restarts(0))
        .spawn()
        .await
        .expect("the worker starts");
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let host = host.clone();
        tasks.push(tokio::spawn(async move {
            let mut seed = t.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            for i in 0..150u64 {
                let len = match next() % 4 {
                    0 => (next() % 64) as usize,
                    1 => (next() % 70_000) as usize,
                    2 => (next() % 1_200_000) as usize,
                    _ => 0,
                };
                let body: Vec<u8> = (0..len).map(|j| (j as u64 ^ i ^ t) as u8).collect();
                let request = ByteBuf::from(body.clone());
                let call = host.call_with_deadline::<Echo>(&request, soon(20_000));
                if next() % 5 == 0 {
                    let _ = tokio::time::timeout(Duration::from_micros(next() % 3000), call).await;
                } else {
                    let got = call.await.expect("an honest echo");
                    assert!(
                        got.as_slice() == &body[..],
                        "task {t} call {i}: echo differs"
                    );
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let stats = host.stats();
    assert_eq!(stats.restarts, 0, "{stats:#?}");
    assert!(stats.violations.is_empty(), "{stats:#?}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_direct_pipe() {
    stress(true, TransportChoice::Pipe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_direct_socket() {
    stress(true, TransportChoice::SocketInherited).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_writer_task_pipe() {
    stress(false, TransportChoice::Pipe).await;
}
