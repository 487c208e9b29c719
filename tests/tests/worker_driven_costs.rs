//! What a worker can make its host hold or burn through streaming updates and the low-latency
//! spin, measured against what the documentation promises: host memory per worker bounded by
//! `3 × max_frame` (SECURITY.md), untaken updates bounded by items as well as bytes, a reader
//! spin that costs at most the window after each
//! message, and a caller that stops reading a stream holding up only its worker's other
//! frames, bounded by their deadlines.

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use airlock_codec::Limits;
use airlock_host::{method, CallError, CallStream, Host, HostConfig, Streaming};
use airlock_tests::e2e::{rogue_host, rogue_host_in, stat_fields, worker_bin, ScratchDir};
use airlock_worker::builtin::{CountRequest, CountTo, Echo};
use serde_bytes::ByteBuf;

method!(
    /// The rogue's identity method called as a stream of byte-string updates.
    FatStream, "fat", ByteBuf => ByteBuf, progress ByteBuf
);

method!(
    /// The rogue's identity method called as a stream of string-list updates (log lines, say).
    WideStream, "wide", ByteBuf => ByteBuf, progress Vec<String>
);

/// The strings in each of the rogue's `wide_updates` updates (its `WIDE_UPDATE_ITEMS`), and
/// the host's `max_items` in that test: one update is a whole response's worth of items.
const WIDE_ITEMS: usize = 100_000;

/// The host's `max_frame` in the memory test: each of the rogue's 60 KiB updates fits.
const MAX_FRAME: u32 = 64 * 1024;

/// A worker sends 16 updates of nearly `max_frame` to each of four streaming calls whose
/// callers have not read yet (3.75 MiB against a 64 KiB `max_frame`). Every update the callers
/// can take without the host's reader running again is what the host holds, decoded, for
/// this one worker: at most a frame's worth, the rest held back in the worker's pipe.
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
    // Time enough for the rogue to write everything, were the host to take it all.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !mark.exists(),
        "the host read all 64 fat updates without its callers taking any"
    );
    let (mut updates, mut held) = (0, 0);
    for call in &mut calls {
        for update in take_held(call) {
            updates += 1;
            held += update.len();
        }
    }
    assert!(updates > 0, "the worker's updates reached the callers");
    assert!(
        held <= 3 * MAX_FRAME as usize,
        "the host held {updates} decoded updates, {held} bytes, for one worker whose \
         max_frame is {MAX_FRAME} (documented bound: {} bytes)",
        3 * MAX_FRAME
    );
    drop(calls);
    host.shutdown().await;
}

/// Every update the host already holds for `call`. On a current-thread runtime nothing else
/// runs while these polls do, so the host's reader cannot add to them; `unconstrained`, so
/// tokio's per-task budget does not end the polls early (after 128) with a false `Pending`.
fn take_held<M: Streaming>(call: &mut CallStream<'_, M>) -> Vec<M::Progress> {
    let mut held = Vec::new();
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        let next = std::pin::pin!(tokio::task::unconstrained(call.next()));
        match next.poll(&mut cx) {
            Poll::Ready(Some(update)) => held.push(update),
            Poll::Ready(None) | Poll::Pending => return held,
        }
    }
}

/// The protocol for the rogue's `tiny_updates`: a 64 KiB `max_frame`, and room for its 1,000
/// updates in one call.
fn tiny_updates_protocol() -> HostConfig {
    HostConfig::default()
        .max_frame(MAX_FRAME)
        .expect("a valid max_frame")
        .max_progress_per_call(1000)
}

/// A progress type whose every value is 4 KiB in memory, though a `None` is one byte on the
/// wire (like an enum with one large variant).
type Sparse = Option<[[u64; 32]; 16]>;

method!(
    /// The rogue's identity method called as a stream of mostly empty 4 KiB updates.
    SparseStream, "sparse", ByteBuf => ByteBuf, progress Sparse
);

/// A worker sends 1,000 updates of one byte each, every one a 4 KiB value decoded: 4 MB in
/// memory against a 64 KiB `max_frame`. Each held update is charged its size in memory, so
/// what the host holds untaken stays within `max_frame`; and once the caller reads, every
/// update and the answer arrive.
#[tokio::test(flavor = "current_thread")]
async fn a_worker_cannot_make_the_host_hold_more_than_max_frame_in_small_updates() {
    let dir = ScratchDir::new("tiny-updates");
    let mark = dir.join("mark");
    let host = rogue_host_in(&dir)
        .arg("tiny_updates")
        .env("ROGUE_MARK", &mark)
        .protocol(tiny_updates_protocol())
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let mut call = host.call_streaming::<SparseStream>(&ByteBuf::from(b"x".to_vec()));
    // The attack is live: all 1,000 updates are written (into the host's pipe, whether or not
    // its reader takes them).
    let waited = Instant::now();
    while !mark.exists() {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the rogue never sent its updates"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first update reaches the caller however slow the machine, and taking it gives its
    // share back; then time for the host's reader to take what it would.
    assert!(
        call.next().await.is_some(),
        "the worker's updates reach the caller"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = take_held(&mut call).len();
    let in_memory = held * std::mem::size_of::<Sparse>();
    assert!(
        in_memory <= MAX_FRAME as usize,
        "the host held {held} updates of 4 KiB, {in_memory} bytes, for one worker whose \
         max_frame is {MAX_FRAME}"
    );
    let mut delivered = 1 + held;
    while call.next().await.is_some() {
        delivered += 1;
    }
    assert_eq!(
        delivered, 1000,
        "every update arrives once the caller reads"
    );
    assert_eq!(
        call.result().await.expect("the honest answer").as_ref(),
        b"x"
    );
    host.shutdown().await;
}

/// A `count_to` step as a host might keep it: the step beside 40 KB of the host's own, so
/// that one update is charged far more than its wire bytes.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(from = "u32", into = "u32")]
struct PaddedStep {
    step: u32,
    _pad: [u8; 40_000],
}

impl From<u32> for PaddedStep {
    fn from(step: u32) -> Self {
        Self {
            step,
            _pad: [0; 40_000],
        }
    }
}

impl From<PaddedStep> for u32 {
    fn from(padded: PaddedStep) -> Self {
        padded.step
    }
}

method!(
    /// The bundled worker's `count_to`, each step kept padded by the host.
    CountPadded, "count_to", CountRequest => u32, progress PaddedStep
);

/// An update whose caller has stopped listening is dropped at once, never waiting for room:
/// with the worker's budget half full of a stream nobody reads yet, a call whose caller wants
/// only the outcome gets it, although its one update would not fit, and nothing is killed.
#[tokio::test(flavor = "current_thread")]
async fn an_update_nobody_will_take_does_not_wait_for_room() {
    let host = Host::builder(worker_bin())
        .protocol(
            HostConfig::default()
                .max_frame(MAX_FRAME)
                .expect("a valid max_frame"),
        )
        .spawn()
        .await
        .expect("spawn the worker");
    // 500 small steps, about half the 64 KiB budget, left unread for now.
    let mut unread = host.call_streaming_with_deadline::<CountTo>(
        &CountRequest {
            count: 500,
            pause_ms: 0,
        },
        Instant::now() + Duration::from_secs(30),
    );
    // The reader is free: a neighbour's answer comes through.
    let neighbour = host
        .call_with_deadline::<Echo>(
            &ByteBuf::from(b"neighbour".to_vec()),
            Instant::now() + Duration::from_secs(5),
        )
        .await;
    assert!(neighbour.is_ok(), "{neighbour:?}");
    // One 40 KB step, which the rest of the budget cannot hold, for a caller that only takes
    // the outcome.
    let outcome_only = host
        .call_streaming_with_deadline::<CountPadded>(
            &CountRequest {
                count: 1,
                pause_ms: 0,
            },
            Instant::now() + Duration::from_secs(2),
        )
        .result()
        .await;
    assert_eq!(
        outcome_only,
        Ok(1),
        "the answer waited behind an update nobody would take"
    );
    let mut steps = Vec::new();
    while let Some(step) = unread.next().await {
        steps.push(step);
    }
    assert_eq!(steps, (1..=500).collect::<Vec<_>>(), "every step, in order");
    assert_eq!(unread.result().await, Ok(500));
    assert_eq!(
        host.stats().restarts,
        0,
        "the honest worker was never killed"
    );
    host.shutdown().await;
}

/// Waits until the host has restarted its worker `restarts` times.
async fn restarted(host: &Host, restarts: u64) {
    let waited = Instant::now();
    while host.stats().restarts < restarts {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the worker was not restarted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A lost worker's untaken updates stay charged to its own budget: a worker that sends small
/// updates nobody reads and exits leaves its successor free to stream and answer in full.
#[tokio::test(flavor = "current_thread")]
async fn a_lost_workers_untaken_updates_do_not_hold_up_its_successor() {
    let dir = ScratchDir::new("lost-updates");
    let host = rogue_host_in(&dir)
        .arg("tiny_updates_then_exit")
        .env("ROGUE_MARK", dir.join("mark"))
        .protocol(tiny_updates_protocol())
        .call_timeout(Duration::from_secs(10))
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    // The first worker fills its budget with updates nobody reads, and exits.
    let mut lost = host.call_streaming::<SparseStream>(&ByteBuf::from(b"x".to_vec()));
    assert!(
        lost.next().await.is_some(),
        "the first worker's updates reach its caller"
    );
    restarted(&host, 1).await;
    // Its updates stay unread with their caller while the successor works.
    let mut successor = host.call_streaming::<SparseStream>(&ByteBuf::from(b"x".to_vec()));
    let mut delivered = 0;
    while successor.next().await.is_some() {
        delivered += 1;
    }
    assert_eq!(delivered, 1000, "the successor's updates all arrive");
    assert_eq!(
        successor
            .result()
            .await
            .expect("the successor answers")
            .as_ref(),
        b"x"
    );
    // The lost worker's budget was full all the while (at least half a frame of 4 KiB values
    // besides the one taken, as many as fit).
    let left = take_held(&mut lost).len();
    assert!(
        (left + 1) * std::mem::size_of::<Sparse>() > MAX_FRAME as usize / 2,
        "the lost worker left its budget filled: {left} updates"
    );
    assert!(matches!(lost.result().await, Err(CallError::WorkerLost(_))));
    host.shutdown().await;
}

/// The number in the rogue's mark ("sent N"), 0 before its first write.
fn updates_sent(mark: &std::path::Path) -> usize {
    std::fs::read_to_string(mark)
        .ok()
        .and_then(|text| text.strip_prefix("sent ")?.parse().ok())
        .unwrap_or(0)
}

/// A worker sends 16 updates, each a list of 100,000 empty strings: 100 KB on the wire (far
/// inside the byte budget) but 2.4 MB of `String`s decoded. What the host holds untaken is
/// charged by items as well as bytes, so it stays within one response's `max_items` however
/// few bytes carry them; and once the caller reads, every update and the answer arrive.
#[tokio::test(flavor = "current_thread")]
async fn a_worker_cannot_make_the_host_hold_more_than_one_response_of_decoded_items() {
    let dir = ScratchDir::new("wide-updates");
    let mark = dir.join("mark");
    let frame = airlock_protocol::DEFAULT_MAX_FRAME as usize;
    let host = rogue_host_in(&dir)
        .arg("wide_updates")
        .env("ROGUE_MARK", &mark)
        .limits(
            Limits::default()
                .max_bytes(frame)
                .max_len(frame)
                .max_items(WIDE_ITEMS),
        )
        .spawn()
        .await
        .expect("the rogue completes its handshake");
    let mut call = host.call_streaming::<WideStream>(&ByteBuf::from(b"x".to_vec()));
    // The attack is live: the rogue has written three updates, three times the items cap,
    // which the host's pipe takes whether or not its reader does.
    let waited = Instant::now();
    while updates_sent(&mark) < 3 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the rogue never sent its updates"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The first update reaches the caller however slow the machine, and taking it gives its
    // share back; then time for the host's reader to take what it would.
    let first = call
        .next()
        .await
        .expect("the worker's updates reach the caller");
    assert_eq!(first.len(), WIDE_ITEMS);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = take_held(&mut call);
    let (held_updates, held_items) = (held.len(), held.iter().map(Vec::len).sum::<usize>());
    assert!(
        held_items <= WIDE_ITEMS,
        "the host held {held_updates} decoded updates, {held_items} strings, for one worker \
         whose max_items is {WIDE_ITEMS}"
    );
    let mut delivered = 1 + held_updates;
    while let Some(update) = call.next().await {
        assert_eq!(update.len(), WIDE_ITEMS);
        delivered += 1;
    }
    assert_eq!(delivered, 16, "every update arrives once the caller reads");
    assert_eq!(
        call.result().await.expect("the honest answer").as_ref(),
        b"x"
    );
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
    paced_frames_cost_the_host_little().await;
}

/// The same on a multi-thread runtime, where the host's reader spins by reading its channel
/// itself (`FrameReceiver::read_now`) instead of yielding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_pacing_frames_inside_the_spin_window_does_not_keep_a_multi_thread_host_busy() {
    paced_frames_cost_the_host_little().await;
}

async fn paced_frames_cost_the_host_little() {
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
    a_dribbled_frame_costs_the_host_little().await;
}

/// The same on a multi-thread runtime, where each dribbled byte the reader takes in place
/// ends its look and the reader yields before it looks again: still about one window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_dribbled_inside_the_spin_window_does_not_keep_a_multi_thread_host_spinning() {
    a_dribbled_frame_costs_the_host_little().await;
}

async fn a_dribbled_frame_costs_the_host_little() {
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

/// A streaming caller that has not read its 200 small updates yet does not hold up its
/// worker's other frames (they are far inside the worker's update budget): the honest
/// worker's immediate answer to a neighbour arrives, nothing is killed, and every update is
/// still there for the stream's caller, in order.
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
        neighbour.as_deref().map(|b| b.as_slice()),
        Ok(&b"neighbour"[..]),
        "the honest worker's immediate answer was held up behind the unread stream"
    );
    let mut stream = stream;
    let mut steps = Vec::new();
    while let Some(step) = stream.next().await {
        steps.push(step);
    }
    assert_eq!(
        steps,
        (1..=200).collect::<Vec<_>>(),
        "every update, in order"
    );
    assert_eq!(stream.result().await, Ok(200));
    assert_eq!(
        host.stats().restarts,
        0,
        "the honest worker was never killed"
    );
    host.shutdown().await;
}
