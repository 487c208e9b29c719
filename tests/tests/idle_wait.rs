//! A worker served by `Worker::serve_blocking` owns its runtime's one thread. Between calls,
//! when nothing else of the worker's is alive, it waits for the host's next frame in the OS
//! (`ppoll` and `read`) instead of through a turn of its runtime; a task a handler left
//! running keeps it on the runtime's own wait, so that task is never held up.
//!
//! Where the worker waits is read from `/proc/<pid>/syscall` (the system call its main thread
//! is blocked in), which the host may read: it is root, or it owns the worker's user namespace.

use std::time::{Duration, Instant};

use airlock_host::{Host, HostBuilder, TransportChoice};
use airlock_tests::background::{BackgroundDone, StartBackground};
use airlock_tests::e2e::{background_bin, worker_bin};
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

/// The system call an idle worker's main thread is blocked in, by number, or `None` while it
/// runs (or if it has gone).
fn blocked_in(pid: u32) -> Option<i64> {
    let line = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
    line.split_whitespace().next()?.parse().ok()
}

/// Waits (at most 10 s) until the worker's main thread is blocked in `ppoll`, the idle wait in
/// the OS; returns the last system call seen if it never is.
async fn waits_in_the_os(pid: u32) -> Result<(), Option<i64>> {
    let started = Instant::now();
    loop {
        let seen = blocked_in(pid);
        if seen == Some(libc::SYS_ppoll) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err(seen);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn an_idle_worker_waits_in_the_os(builder: HostBuilder, transport: &str) {
    let host = builder.spawn().await.expect("spawn the bundled worker");
    let pid = host.worker_pid().expect("a process worker has a pid");
    let body = ByteBuf::from(vec![5u8; 64]);
    for _ in 0..3 {
        assert_eq!(host.call::<Echo>(&body).await.unwrap(), body);
    }
    if let Err(seen) = waits_in_the_os(pid).await {
        panic!("{transport}: the idle worker waits in system call {seen:?}, not in ppoll");
    }
    // The wait in the OS takes the next call as the runtime would.
    assert_eq!(host.call::<Echo>(&body).await.unwrap(), body);
    host.shutdown().await;
}

#[tokio::test]
async fn an_idle_worker_on_its_own_thread_waits_for_the_host_in_the_os() {
    for (choice, name) in [
        (TransportChoice::Pipe, "pipe"),
        (TransportChoice::SocketInherited, "inherited socket"),
        (TransportChoice::SocketNamed, "named socket"),
    ] {
        let builder = Host::builder(worker_bin()).transport(choice);
        an_idle_worker_waits_in_the_os(builder, name).await;
    }
}

#[tokio::test]
async fn a_task_a_handler_left_running_runs_while_the_worker_waits_for_the_host() {
    let host = Host::builder(background_bin())
        .spawn()
        .await
        .expect("spawn the background worker");
    let pid = host.worker_pid().expect("a process worker has a pid");
    host.call::<StartBackground>(&20).await.unwrap();
    // No frame comes for two seconds. Had the worker waited in the OS with its handler's task
    // alive, nothing would have turned its runtime, and the task's 20 ms timer would not have
    // fired: the next call would be answered before the task ran.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        host.call::<BackgroundDone>(&()).await.unwrap(),
        "a task left running by a handler did not run while the worker was idle"
    );
    // With the task gone, this worker does wait in the OS: the task above was what kept it on
    // its runtime's wait.
    if let Err(seen) = waits_in_the_os(pid).await {
        panic!("the background worker waits in system call {seen:?}, not in ppoll");
    }
    host.shutdown().await;
}
