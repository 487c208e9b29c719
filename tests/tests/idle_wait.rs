//! A worker served by `Worker::serve_blocking` that asks for it (`Worker::idle_wait_in_os`,
//! as the bundled worker does) waits for the host's next frame in the OS (over a pipe one
//! blocking `read` where the kernel honours `RWF_NOWAIT` on it; else `ppoll` and `read`)
//! between calls instead of through a turn of its runtime, while nothing else of its own is
//! under way; a task a handler left running keeps it on the runtime's own wait, so that task is
//! never held up. A worker that does not ask always waits through its runtime.
//!
//! Where the worker waits is read from `/proc/<pid>/syscall` (the system call its main thread
//! is blocked in). A root host may read it; an unprivileged host may not (the worker is not
//! dumpable), and then only what the calls themselves show is checked.

use std::time::{Duration, Instant};

use airlock_host::{Host, TransportChoice};
use airlock_tests::background::{BackgroundDone, StartBackground};
use airlock_tests::e2e::{background_bin, worker_bin};
use airlock_transport_pipe::kernel_honours_nowait_on_pipes;
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

/// The system call the worker's main thread is blocked in, by number (`None` while it runs),
/// or `Err` if this host may not see it.
fn blocked_in(pid: u32) -> std::io::Result<Option<i64>> {
    let line = std::fs::read_to_string(format!("/proc/{pid}/syscall"))?;
    Ok(line
        .split_whitespace()
        .next()
        .and_then(|nr| nr.parse().ok()))
}

/// Whether this host may see where the worker waits; if not, says so (an unprivileged host).
fn sees_where_it_waits(pid: u32) -> bool {
    match blocked_in(pid) {
        Ok(_) => true,
        Err(err) if !rustix::process::geteuid().is_root() => {
            eprintln!("skipped: an unprivileged host cannot read /proc/{pid}/syscall ({err})");
            false
        }
        Err(err) => panic!("a root host cannot read /proc/{pid}/syscall: {err}"),
    }
}

/// The system call of the idle wait in the OS over `transport`: over a pipe where the kernel
/// honours `RWF_NOWAIT` on it, one blocking `read`; else `ppoll` (then `read`).
fn idle_wait_call(transport: TransportChoice) -> i64 {
    if transport == TransportChoice::Pipe && kernel_honours_nowait_on_pipes().unwrap() {
        libc::SYS_read
    } else {
        libc::SYS_ppoll
    }
}

/// Waits (at most 10 s) until the worker's main thread is blocked in `wait`, the idle wait in
/// the OS; returns the last system call seen if it never is.
async fn waits_in_the_os(pid: u32, wait: i64) -> Result<(), Option<i64>> {
    let started = Instant::now();
    loop {
        let seen = blocked_in(pid).ok().flatten();
        if seen == Some(wait) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(10) {
            return Err(seen);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether system call `nr` is one of the waits of tokio's event loop.
fn is_epoll_wait(nr: i64) -> bool {
    #[cfg(target_arch = "x86_64")]
    if nr == libc::SYS_epoll_wait {
        return true;
    }
    nr == libc::SYS_epoll_pwait || nr == libc::SYS_epoll_pwait2
}

async fn an_idle_worker_waits_in_the_os(choice: TransportChoice, transport: &str) {
    let builder = Host::builder(worker_bin()).transport(choice);
    let host = builder.spawn().await.expect("spawn the bundled worker");
    let pid = host.worker_pid().expect("a process worker has a pid");
    let body = ByteBuf::from(vec![5u8; 64]);
    for _ in 0..3 {
        assert_eq!(host.call::<Echo>(&body).await.unwrap(), body);
    }
    if sees_where_it_waits(pid) {
        let wait = idle_wait_call(choice);
        if let Err(seen) = waits_in_the_os(pid, wait).await {
            panic!("{transport}: the idle worker waits in system call {seen:?}, not in {wait}");
        }
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
        an_idle_worker_waits_in_the_os(choice, name).await;
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
    if sees_where_it_waits(pid) {
        let wait = idle_wait_call(TransportChoice::Pipe);
        if let Err(seen) = waits_in_the_os(pid, wait).await {
            panic!("the background worker waits in system call {seen:?}, not in {wait}");
        }
    }
    host.shutdown().await;
}

#[tokio::test]
async fn a_worker_that_does_not_ask_waits_through_its_runtime() {
    let host = Host::builder(background_bin())
        .arg("--runtime-wait")
        .spawn()
        .await
        .expect("spawn the background worker");
    let pid = host.worker_pid().expect("a process worker has a pid");
    for _ in 0..3 {
        assert!(!host.call::<BackgroundDone>(&()).await.unwrap());
    }
    if sees_where_it_waits(pid) {
        // Idle, it settles in the runtime's wait (`epoll_wait` or `epoll_pwait`, as tokio's
        // build chooses), and never in `ppoll` or a blocking `read`.
        let started = Instant::now();
        let mut settled = 0;
        while started.elapsed() < Duration::from_secs(10) && settled < 10 {
            match blocked_in(pid).unwrap() {
                Some(nr) if is_epoll_wait(nr) => settled += 1,
                Some(nr) => assert!(
                    nr != libc::SYS_ppoll && nr != libc::SYS_read,
                    "it waits in the OS (system call {nr})"
                ),
                None => {}
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            settled, 10,
            "the idle worker never settled in the runtime's wait"
        );
    }
    host.shutdown().await;
}
