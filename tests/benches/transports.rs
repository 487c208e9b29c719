//! Round-trip latency of a 64-byte message between two processes, over each transport and
//! over the raw OS channel underneath it, in the same run (`cargo bench -p airlock-tests`).
//!
//! The echo peer is this same binary, re-executed with `AIRLOCK_BENCH_PEER=<role>`. Every
//! variant moves exactly 64 bytes each way per round trip: the raw baselines write and read 64
//! bytes with blocking calls; the transports send a frame of a 4-byte length prefix and a
//! 60-byte payload, and the peer echoes it as a frame. At the end the medians and the ratios
//! of each transport to its raw baseline are printed (design target: within 1.5×).
//!
//! Both processes are pinned to one CPU (the child inherits the parent's affinity), so every
//! variant is measured in the same regime: a round trip then costs two context switches. Left
//! to the scheduler on a small VM, each variant flips at random between that and waking an
//! idle vCPU (tens of µs), which swamps the differences being measured. Set
//! `AIRLOCK_BENCH_UNPINNED=1` to measure the unpinned regime anyway.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_protocol::Transmit;
use airlock_tests::support::{pass_socket_fd, pattern, raw_frame};
use airlock_transport_pipe::{take_worker_stdio, StreamConfig, StreamTransport};
use airlock_transport_socket::{inherited_pair, worker_inherited, PrivateDir};
use criterion::Criterion;

/// Selects the echo role of a re-executed copy of this binary.
const PEER_ENV: &str = "AIRLOCK_BENCH_PEER";
/// Set to measure without pinning both processes to one CPU.
const UNPINNED_ENV: &str = "AIRLOCK_BENCH_UNPINNED";
/// Raw mode: the socket path to connect to.
const SOCKET_PATH_ENV: &str = "AIRLOCK_BENCH_SOCKET";
/// Bytes on the wire each way per round trip.
const WIRE: usize = 64;
/// Samples per benchmark; the summary takes the median of the last this many.
const SAMPLES: usize = 40;

const RAW_PIPE: &str = "raw_pipe";
const RAW_UNIX: &str = "raw_unix_socket";
const PIPE_TRANSPORT: &str = "pipe_transport";
const SOCKET_TRANSPORT: &str = "socket_transport";
const HOST_CALL: &str = "host_call_echo";

/// Per-round-trip times (ns) of every routine call, per benchmark.
static RECORDED: Mutex<Vec<(&'static str, Vec<f64>)>> = Mutex::new(Vec::new());

fn record(name: &'static str, iters: u64, elapsed: Duration) -> Duration {
    let per = elapsed.as_nanos() as f64 / iters.max(1) as f64;
    let mut recorded = RECORDED.lock().unwrap();
    match recorded.iter_mut().find(|(n, _)| *n == name) {
        Some((_, samples)) => samples.push(per),
        None => recorded.push((name, vec![per])),
    }
    elapsed
}

fn main() {
    if let Ok(role) = std::env::var(PEER_ENV) {
        peer(&role);
        return;
    }
    let pinned = std::env::var_os(UNPINNED_ENV)
        .is_none()
        .then(pin_to_one_cpu);
    let mut criterion = Criterion::default()
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut group = criterion.benchmark_group("round_trip_64B");
    group.bench_function(RAW_PIPE, bench_raw_pipe);
    group.bench_function(PIPE_TRANSPORT, bench_pipe_transport);
    group.bench_function(RAW_UNIX, bench_raw_unix);
    group.bench_function(SOCKET_TRANSPORT, bench_socket_transport);
    group.bench_function(HOST_CALL, bench_host_call);
    group.finish();
    criterion.final_summary();
    match pinned {
        Some(cpu) => println!("\nboth processes pinned to CPU {cpu}"),
        None => println!("\nnot pinned ({UNPINNED_ENV} is set)"),
    }
    summary();
}

/// Restricts this process (and so the peers it spawns) to the first CPU it may run on.
fn pin_to_one_cpu() -> usize {
    use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
    let allowed = sched_getaffinity(None).expect("sched_getaffinity");
    let cpu = (0..CpuSet::MAX_CPU)
        .find(|&cpu| allowed.is_set(cpu))
        .expect("some CPU");
    let mut only = CpuSet::new();
    only.set(cpu);
    sched_setaffinity(None, &only).expect("sched_setaffinity");
    cpu
}

fn peer_command(role: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.env_clear()
        .env(PEER_ENV, role)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

fn finish(mut child: Child) {
    let status = child.wait().expect("wait");
    assert!(status.success(), "echo peer failed: {status}");
}

fn bench_raw_pipe(b: &mut criterion::Bencher<'_>) {
    let mut child = peer_command("raw_pipe")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut to = child.stdin.take().unwrap();
    let mut from = child.stdout.take().unwrap();
    let msg = [7u8; WIRE];
    let mut back = [0u8; WIRE];
    b.iter_custom(|iters| {
        let start = Instant::now();
        for _ in 0..iters {
            to.write_all(&msg).unwrap();
            from.read_exact(&mut back).unwrap();
        }
        record(RAW_PIPE, iters, start.elapsed())
    });
    drop(to);
    finish(child);
}

fn bench_raw_unix(b: &mut criterion::Bencher<'_>) {
    let dir = PrivateDir::create_random_in(&std::env::temp_dir()).expect("dir");
    let path = dir.path().join("s");
    let listener = UnixListener::bind(&path).expect("bind");
    let child = peer_command("raw_unix")
        .env(SOCKET_PATH_ENV, &path)
        .spawn()
        .expect("spawn");
    let (mut stream, _) = listener.accept().expect("accept");
    std::fs::remove_file(&path).unwrap();
    let msg = [7u8; WIRE];
    let mut back = [0u8; WIRE];
    b.iter_custom(|iters| {
        let start = Instant::now();
        for _ in 0..iters {
            stream.write_all(&msg).unwrap();
            stream.read_exact(&mut back).unwrap();
        }
        record(RAW_UNIX, iters, start.elapsed())
    });
    drop(stream);
    finish(child);
}

/// A whole typed call through the product: `Host::call::<Echo>` to the real `airlock-worker`
/// over the pipe transport (supervisor task, session, codec, worker runtime and back). The
/// request is sized so each frame is about 64 bytes on the wire. DESIGN's target for a small
/// call is 1.3x a raw pipe ping-pong.
fn bench_host_call(b: &mut criterion::Bencher<'_>) {
    use airlock_worker::builtin::Echo;
    let rt = runtime();
    let host = rt
        .block_on(airlock_host::Host::builder(airlock_tests::e2e::worker_bin()).spawn())
        .expect("spawn the bundled worker");
    let payload = serde_bytes::ByteBuf::from(vec![7u8; 28]);
    b.iter_custom(|iters| {
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..iters {
                let back = host.call::<Echo>(&payload).await.unwrap();
                std::hint::black_box(back);
            }
            record(HOST_CALL, iters, start.elapsed())
        })
    });
    rt.block_on(host.shutdown());
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn frame() -> Transmit {
    raw_frame(pattern(WIRE - 4))
}

/// Send a frame, receive the echo, `iters` times.
fn ping_pong<T: Transport>(
    b: &mut criterion::Bencher<'_>,
    rt: &tokio::runtime::Runtime,
    name: &'static str,
    transport: T,
) {
    let (mut send, mut recv) = transport.split();
    let batch = [frame()];
    b.iter_custom(|iters| {
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..iters {
                send.send(&batch).await.unwrap();
                let echoed = recv.recv().await.unwrap().unwrap();
                debug_assert_eq!(echoed.len(), WIRE - 4);
            }
            record(name, iters, start.elapsed())
        })
    });
}

fn bench_pipe_transport(b: &mut criterion::Bencher<'_>) {
    let rt = runtime();
    let mut child = rt.block_on(async {
        tokio::process::Command::from(peer_command("pipe_transport"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn")
    });
    let transport = StreamTransport::new(
        child.stdout.take().unwrap(),
        child.stdin.take().unwrap(),
        StreamConfig::default(),
    );
    ping_pong(b, &rt, PIPE_TRANSPORT, transport);
    let status = rt.block_on(child.wait()).expect("wait");
    assert!(status.success(), "echo peer failed: {status}");
}

fn bench_socket_transport(b: &mut criterion::Bencher<'_>) {
    let rt = runtime();
    let (transport, child_end) = rt
        .block_on(async { inherited_pair(StreamConfig::default()) })
        .expect("pair");
    let mut cmd = peer_command("socket_transport");
    pass_socket_fd(&mut cmd, child_end);
    let child = cmd.spawn().expect("spawn");
    drop(cmd); // our copy of the child's end
    ping_pong(b, &rt, SOCKET_TRANSPORT, transport);
    finish(child);
}

/// The echo side, in the re-executed process.
fn peer(role: &str) {
    match role {
        "raw_pipe" => {
            let input = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
            let output = std::io::stdout().as_fd().try_clone_to_owned().unwrap();
            echo_raw(std::fs::File::from(input), std::fs::File::from(output));
        }
        "raw_unix" => {
            let stream = UnixStream::connect(std::env::var_os(SOCKET_PATH_ENV).unwrap()).unwrap();
            echo_raw(stream.try_clone().unwrap(), stream);
        }
        "pipe_transport" => {
            let rt = runtime();
            rt.block_on(async {
                let transport = take_worker_stdio(StreamConfig::default()).unwrap();
                echo_frames(transport).await;
            });
        }
        "socket_transport" => {
            let rt = runtime();
            rt.block_on(async {
                let transport = worker_inherited(StreamConfig::default()).unwrap();
                echo_frames(transport).await;
            });
        }
        other => panic!("unknown bench peer role {other:?}"),
    }
}

fn echo_raw(mut input: impl Read, mut output: impl Write) {
    let mut buf = [0u8; WIRE];
    while input.read_exact(&mut buf).is_ok() {
        output.write_all(&buf).unwrap();
    }
}

async fn echo_frames<T: Transport>(transport: T) {
    let (mut send, mut recv) = transport.split();
    while let Some(frame) = recv.recv().await.unwrap() {
        send.send(&[raw_frame(frame)]).await.unwrap();
    }
}

fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Medians over the measured samples (the last `SAMPLES` calls; earlier ones were warm-up),
/// and each transport's ratio to its raw baseline.
fn summary() {
    let recorded = RECORDED.lock().unwrap();
    let med = |name: &str| {
        recorded
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| median(&s[s.len().saturating_sub(SAMPLES)..]))
    };
    println!("\nround trip of {WIRE} bytes each way, median per round trip:");
    for name in [
        RAW_PIPE,
        PIPE_TRANSPORT,
        RAW_UNIX,
        SOCKET_TRANSPORT,
        HOST_CALL,
    ] {
        if let Some(m) = med(name) {
            println!("  {name:<18} {:>9.2} µs", m / 1000.0);
        }
    }
    for (transport, baseline, target) in [
        (PIPE_TRANSPORT, RAW_PIPE, 1.5),
        (SOCKET_TRANSPORT, RAW_UNIX, 1.5),
        (SOCKET_TRANSPORT, RAW_PIPE, 1.5),
        (HOST_CALL, RAW_PIPE, 1.3),
    ] {
        if let (Some(t), Some(b)) = (med(transport), med(baseline)) {
            let ratio = t / b;
            let verdict = if ratio <= target { "ok" } else { "OVER TARGET" };
            println!("  {transport} / {baseline}: {ratio:.2}x (target <= {target}x: {verdict})");
        }
    }
}
