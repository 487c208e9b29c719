//! What a worker can make its host hold or burn through streaming updates and the low-latency
//! spin, measured against what the documentation promises: host memory per worker bounded by
//! `3 × max_frame` (SECURITY.md), a reader spin that costs at most the window after each
//! message, and a caller that stops reading a stream holding up only its worker's other
//! frames, bounded by their deadlines.

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use airlock_host::{method, CallError, Host, HostConfig};
use airlock_tests::e2e::{
    rogue_host, rogue_host_in, stat_fields, wait_until, worker_bin, ScratchDir,
};
use airlock_worker::builtin::{CountRequest, CountTo, Echo};
use serde_bytes::ByteBuf;

method!(
    /// The rogue's identity method called as a stream of byte-string updates.
    FatStream, "fat", ByteBuf => ByteBuf, progress ByteBuf
);

/// The host's `max_frame` in the memory test: each of the rogue's 60 KiB updates fits.
const MAX_FRAME: u32 = 64 * 1024;

/// A worker sends 16 updates of nearly `max_frame` to each of four streaming calls whose
/// callers have not read yet. Every update the caller can take without the host's reader
/// running again is held, decoded, in the host's memory for this one worker.
#[tokio::test(flavor = "current_thread")]
async fn a_worker_cannot_make_the_host_hold_more_than_three_frames_of_updates() {
    let dir = ScratchDir::new("fat-updates");
    let mark = dir.join("mark");
    let host = rogue_host_in(&dir)
        .arg("fat_updates")
        .env("ROGUE_MARK", &mark)
        .protocol(HostConfig::default().max_frame(MAX_FRAME).unwrap())
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let mut calls: Vec<_> = (0..4)
        .map(|_| host.call_streaming::<FatStream>(&ByteBuf::from(b"x".to_vec())))
        .collect();
    wait_until(
        "the rogue wrote every update",
        Duration::from_secs(10),
        || mark.exists(),
    )
    .await;
    // Lets the reader take what the pipe still held when the rogue's last write returned.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // On this current-thread runtime nothing else runs while these polls do: what they take
    // was already held by the host.
    let (mut updates, mut held) = (0, 0);
    let mut cx = Context::from_waker(Waker::noop());
    for call in &mut calls {
        loop {
            let next = std::pin::pin!(call.next());
            match next.poll(&mut cx) {
                Poll::Ready(Some(update)) => {
                    updates += 1;
                    held += update.len();
                }
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
    }
    assert!(updates > 0, "the worker's updates reached the host");
    assert!(
        held <= 3 * MAX_FRAME as usize,
        "the host held {updates} decoded updates, {held} bytes, for one worker whose \
         max_frame is {MAX_FRAME} (documented bound: {} bytes)",
        3 * MAX_FRAME
    );
    drop(calls);
    host.shutdown().await;
}

/// This process's CPU time, user and system (`/proc/self/stat`, in USER_HZ = 100 ticks).
fn cpu_time() -> Duration {
    let fields = stat_fields(std::process::id()).expect("/proc/self/stat");
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// One `echo` call to a rogue that sends 100 `Progress` frames 8 ms apart before answering:
/// the host's CPU time and the wall time it took.
async fn cpu_during_paced_call(window: Option<Duration>) -> (Duration, Duration) {
    let mut builder = rogue_host().arg("paced_progress");
    if let Some(window) = window {
        builder = builder.low_latency(window);
    }
    let host = builder
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let (before, started) = (cpu_time(), Instant::now());
    let echoed = host.call::<Echo>(&ByteBuf::from(b"paced".to_vec())).await;
    let (cpu, wall) = (cpu_time() - before, started.elapsed());
    assert_eq!(echoed.as_deref().map(|b| b.as_slice()), Ok(&b"paced"[..]));
    host.shutdown().await;
    (cpu, wall)
}

/// A worker that sends one small frame inside every spin window (100 frames a second) keeps
/// a host CPU busy for as long as it likes, up to `(max_progress_per_call + 1) × window` per
/// call; without the low-latency mode the same traffic costs the host almost nothing.
#[tokio::test(flavor = "current_thread")]
async fn a_worker_pacing_frames_inside_the_spin_window_does_not_keep_a_host_cpu_busy() {
    assert!(
        std::thread::available_parallelism().map_or(1, usize::from) > 1,
        "the low-latency mode spins only with more than one CPU"
    );
    let (cpu, wall) = cpu_during_paced_call(None).await;
    assert!(
        cpu < wall / 4,
        "without the spin the paced frames are cheap: {cpu:?} of CPU in {wall:?}"
    );
    let (cpu, wall) = cpu_during_paced_call(Some(Duration::from_millis(10))).await;
    assert!(
        cpu < wall / 4,
        "with a 10 ms window the host spent {cpu:?} of CPU in {wall:?} on 100 frames"
    );
}

/// Bytes alone do not extend the spin: a worker that dribbles one frame a byte every 5 ms
/// (inside a 10 ms window) costs the host about one window, not the whole dribble.
#[tokio::test(flavor = "current_thread")]
async fn a_frame_dribbled_inside_the_spin_window_does_not_keep_the_host_spinning() {
    let host = rogue_host()
        .arg("fast_dribble")
        .low_latency(Duration::from_millis(10))
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let body = ByteBuf::from(vec![7u8; 200]);
    let (before, started) = (cpu_time(), Instant::now());
    let echoed = host
        .call_with_deadline::<Echo>(&body, started + Duration::from_secs(5))
        .await;
    let (cpu, wall) = (cpu_time() - before, started.elapsed());
    assert_eq!(
        echoed.as_ref(),
        Ok(&body),
        "the dribbled frame arrives whole"
    );
    assert!(
        wall > Duration::from_secs(1),
        "the frame took more than 200 dribbled bytes: {wall:?}"
    );
    assert!(
        cpu < wall / 4,
        "the host spent {cpu:?} of CPU in {wall:?} on one dribbled frame"
    );
    host.shutdown().await;
}

/// A streaming caller that stops reading holds up its worker's other frames; the honest
/// worker answers a neighbour at once and honours the `Cancel` of the neighbour's timeout,
/// but neither answer can be read, so the grace ends with the worker killed and the stream
/// lost.
#[tokio::test(flavor = "current_thread")]
async fn a_stream_nobody_reads_does_not_get_an_honest_worker_killed() {
    let host = Host::builder(worker_bin())
        .spawn()
        .await
        .expect("spawn the worker");
    let started = Instant::now();
    let stream = host.call_streaming_with_deadline::<CountTo>(
        &CountRequest {
            count: 200,
            pause_ms: 0,
        },
        started + Duration::from_secs(20),
    );
    // The stream's updates fill its buffer before the neighbour's answer.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let neighbour = host
        .call_with_deadline::<Echo>(
            &ByteBuf::from(b"neighbour".to_vec()),
            Instant::now() + Duration::from_millis(400),
        )
        .await;
    assert_eq!(
        neighbour,
        Err(CallError::Timeout),
        "the honest worker's immediate answer was held up behind the unread stream"
    );
    // Past the default cancel grace (1 s) of the neighbour's timeout.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let restarts = host.stats().restarts;
    let stream = stream.result().await;
    assert_eq!(
        (restarts, stream.map(|_| ())),
        (0, Ok(())),
        "the honest worker was killed and the stream lost"
    );
    host.shutdown().await;
}
