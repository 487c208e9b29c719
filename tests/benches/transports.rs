//! Round-trip latency of a 64-byte message between two processes, over each transport and
//! over the raw OS channel underneath it, in the same run (`cargo bench -p airlock-tests`).
//!
//! The echo peer is this same binary, re-executed with `AIRLOCK_BENCH_PEER=<role>`. Every
//! variant moves exactly 64 bytes each way per round trip: the raw baselines write and read 64
//! bytes with blocking calls; the transports send a frame of a 4-byte length prefix and a
//! 60-byte payload, and the peer echoes it as a frame.
//!
//! Two measurements of the same live links. First criterion times each link alone. Then a
//! paired run alternates each transport with its raw baseline in short bursts, ABBA order, for
//! [`PAIRED_ROUNDS`] rounds, and reports the median of the per-round ratios: on a shared
//! machine whose speed drifts by tens of percent between criterion's benchmarks, only a
//! comparison made at the same moment says what the transport itself costs. The summary prints
//! both (design target: each transport within 1.5× of its raw baseline).
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
use std::time::{Duration, Instant};

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_tests::support::{pass_socket_fd, pattern, raw_frame};
use airlock_transport_pipe::{take_worker_stdio, StreamConfig, StreamTransport, READ_CHUNK};
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
const RAW_PIPE_EPOLL: &str = "raw_pipe_epoll";
const TOKIO_PIPE: &str = "tokio_pipe";
const PIPE_TRANSPORT: &str = "pipe_transport";
const SOCKET_TRANSPORT: &str = "socket_transport";
const HOST_CALL: &str = "host_call_echo";

/// Rounds of the paired comparison; each round times both links, ABBA.
const PAIRED_ROUNDS: usize = 60;
/// Round trips per link per burst of the paired comparison (a few milliseconds).
const PAIRED_BURST: u64 = 500;

/// The echo peer's process, spawned by std or (as the host does) by tokio.
enum Peer {
    Std(Child),
    Tokio(tokio::process::Child),
}

/// A live two-process channel, ready to time round trips on.
enum Link {
    /// Blocking `write` and `read` of 64 bytes on plain pipes or a Unix socket.
    Raw {
        to: Box<dyn Write>,
        from: Box<dyn Read>,
        child: Child,
    },
    /// tokio's own pipe types, `write_all` of 64 bytes and reads into a large buffer until 64
    /// bytes are in: the runtime alone, making the same system calls as the transports.
    Tokio {
        rt: tokio::runtime::Runtime,
        to: tokio::process::ChildStdin,
        from: tokio::process::ChildStdout,
        child: tokio::process::Child,
    },
    /// A transport's sender and receiver, on their own runtime.
    Transport {
        rt: tokio::runtime::Runtime,
        send: Box<dyn FrameSender>,
        recv: Box<dyn FrameReceiver>,
        child: Peer,
    },
    /// The product end to end: `Host::call::<Echo>` to the bundled `airlock-worker`.
    HostCall {
        rt: tokio::runtime::Runtime,
        host: airlock_host::Host,
    },
}

impl Link {
    /// Blocking `write` and `read` on a child's stdin and stdout.
    fn raw_pipe() -> Self {
        Self::raw_pipe_peer(RAW_PIPE, |from| Box::new(from))
    }

    /// The readiness model alone, no runtime: each side waits in `epoll_wait` and then reads,
    /// as tokio does, with plain non-blocking pipes. The floor for any epoll-based transport.
    fn raw_pipe_epoll() -> Self {
        Self::raw_pipe_peer(RAW_PIPE_EPOLL, |from| {
            Box::new(EpollReader::new(from.into()))
        })
    }

    /// A `role` peer on plain pipes, read from through `reader`.
    fn raw_pipe_peer(role: &str, reader: fn(std::process::ChildStdout) -> Box<dyn Read>) -> Self {
        let mut child = peer_command(role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        Link::Raw {
            to: Box::new(child.stdin.take().unwrap()),
            from: reader(child.stdout.take().unwrap()),
            child,
        }
    }

    /// The host's tokio child pipes with no framing: what the runtime alone costs.
    fn tokio_pipe() -> Self {
        let rt = runtime();
        let mut child = rt.block_on(async {
            tokio::process::Command::from(peer_command(TOKIO_PIPE))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn")
        });
        Link::Tokio {
            to: child.stdin.take().unwrap(),
            from: child.stdout.take().unwrap(),
            child,
            rt,
        }
    }

    fn raw_unix() -> Self {
        let dir = PrivateDir::create_random_in(&std::env::temp_dir()).expect("dir");
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).expect("bind");
        let child = peer_command(RAW_UNIX)
            .env(SOCKET_PATH_ENV, &path)
            .spawn()
            .expect("spawn");
        let (stream, _) = listener.accept().expect("accept");
        std::fs::remove_file(&path).unwrap();
        Link::Raw {
            to: Box::new(stream.try_clone().unwrap()),
            from: Box::new(stream),
            child,
        }
    }

    /// The host's side exactly as `airlock-host` builds it: a tokio child's stdin and stdout.
    fn pipe_transport() -> Self {
        let rt = runtime();
        let (transport, child) = rt.block_on(async {
            let mut child = tokio::process::Command::from(peer_command(PIPE_TRANSPORT))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn");
            let transport = StreamTransport::new(
                child.stdout.take().unwrap(),
                child.stdin.take().unwrap(),
                StreamConfig::default(),
            );
            (transport, child)
        });
        Self::transport(rt, transport, Peer::Tokio(child))
    }

    fn socket_transport() -> Self {
        let rt = runtime();
        let (transport, child_end) = rt
            .block_on(async { inherited_pair(StreamConfig::default()) })
            .expect("pair");
        let mut cmd = peer_command(SOCKET_TRANSPORT);
        pass_socket_fd(&mut cmd, child_end);
        let child = cmd.spawn().expect("spawn");
        drop(cmd); // our copy of the child's end
        Self::transport(rt, transport, Peer::Std(child))
    }

    fn transport<T: Transport>(rt: tokio::runtime::Runtime, transport: T, child: Peer) -> Self
    where
        T::Sender: 'static,
        T::Receiver: 'static,
    {
        let (send, recv) = transport.split();
        Link::Transport {
            rt,
            send: Box::new(send),
            recv: Box::new(recv),
            child,
        }
    }

    /// The request is sized so each frame is about 64 bytes on the wire.
    fn host_call() -> Self {
        let rt = runtime();
        let host = rt
            .block_on(airlock_host::Host::builder(airlock_tests::e2e::worker_bin()).spawn())
            .expect("spawn the bundled worker");
        Link::HostCall { rt, host }
    }

    /// Time `iters` round trips.
    fn round_trips(&mut self, iters: u64) -> Duration {
        match self {
            Link::Raw { to, from, .. } => {
                let msg = [7u8; WIRE];
                let mut back = [0u8; WIRE];
                let start = Instant::now();
                for _ in 0..iters {
                    to.write_all(&msg).unwrap();
                    from.read_exact(&mut back).unwrap();
                }
                start.elapsed()
            }
            Link::Tokio { rt, to, from, .. } => {
                use tokio::io::AsyncWriteExt;
                let msg = [7u8; WIRE];
                let mut back = vec![0u8; READ_CHUNK];
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        to.write_all(&msg).await.unwrap();
                        read_message(from, &mut back).await;
                    }
                    start.elapsed()
                })
            }
            Link::Transport { rt, send, recv, .. } => {
                let batch = [raw_frame(pattern(WIRE - 4))];
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        send.send(&batch).await.unwrap();
                        let echoed = recv.recv().await.unwrap().unwrap();
                        debug_assert_eq!(echoed.len(), WIRE - 4);
                    }
                    start.elapsed()
                })
            }
            Link::HostCall { rt, host } => {
                use airlock_worker::builtin::Echo;
                let payload = serde_bytes::ByteBuf::from(vec![7u8; 28]);
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let back = host.call::<Echo>(&payload).await.unwrap();
                        std::hint::black_box(back);
                    }
                    start.elapsed()
                })
            }
        }
    }

    /// Ends the link and checks its peer exited cleanly.
    fn finish(self) {
        let status = match self {
            Link::Raw { to, from, child } => {
                drop((to, from));
                { child }.wait()
            }
            Link::Tokio {
                rt,
                to,
                from,
                mut child,
            } => {
                drop((to, from));
                rt.block_on(child.wait())
            }
            Link::Transport {
                rt,
                mut send,
                recv,
                child,
            } => {
                rt.block_on(send.close()).unwrap();
                drop((send, recv));
                match child {
                    Peer::Std(mut child) => child.wait(),
                    Peer::Tokio(mut child) => rt.block_on(child.wait()),
                }
            }
            Link::HostCall { rt, host } => {
                rt.block_on(host.shutdown());
                return;
            }
        };
        let status = status.expect("wait");
        assert!(status.success(), "echo peer failed: {status}");
    }
}

fn main() {
    if let Ok(role) = std::env::var(PEER_ENV) {
        peer(&role);
        return;
    }
    let pinned = std::env::var_os(UNPINNED_ENV)
        .is_none()
        .then(airlock_tests::e2e::pin_to_one_cpu);
    let mut criterion = Criterion::default()
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut links: Vec<(&'static str, Link)> = vec![
        (RAW_PIPE, Link::raw_pipe()),
        (PIPE_TRANSPORT, Link::pipe_transport()),
        (RAW_PIPE_EPOLL, Link::raw_pipe_epoll()),
        (TOKIO_PIPE, Link::tokio_pipe()),
        (RAW_UNIX, Link::raw_unix()),
        (SOCKET_TRANSPORT, Link::socket_transport()),
        (HOST_CALL, Link::host_call()),
    ];
    let mut criterion_medians = Vec::new();
    {
        let mut group = criterion.benchmark_group("round_trip_64B");
        for (name, link) in &mut links {
            let mut samples = Vec::new();
            group.bench_function(*name, |b| {
                b.iter_custom(|iters| {
                    let elapsed = link.round_trips(iters);
                    samples.push(elapsed.as_nanos() as f64 / iters.max(1) as f64);
                    elapsed
                })
            });
            // Criterion's warm-up calls come first; the last SAMPLES are the measured ones.
            if !samples.is_empty() {
                criterion_medians.push((
                    *name,
                    median(&samples[samples.len().saturating_sub(SAMPLES)..]),
                ));
            }
        }
        group.finish();
    }
    criterion.final_summary();
    let paired = if criterion_medians.len() == links.len() {
        // Only on a full run: with a filter, criterion measured just some links.
        paired_ratios(&mut links)
    } else {
        Vec::new()
    };
    for (_, link) in links {
        link.finish();
    }
    match pinned {
        Some(cpu) => println!("\nboth processes pinned to CPU {cpu}"),
        None => println!("\nnot pinned ({UNPINNED_ENV} is set)"),
    }
    summary(&criterion_medians, &paired);
}

/// What each transport is compared with, and the design's target ratio (the epoll floor has
/// none: it shows how much of a transport's cost the readiness model alone explains).
const COMPARISONS: [(&str, &str, f64); 9] = [
    (PIPE_TRANSPORT, RAW_PIPE, 1.5),
    (RAW_PIPE_EPOLL, RAW_PIPE, f64::NAN),
    (TOKIO_PIPE, RAW_PIPE, f64::NAN),
    (PIPE_TRANSPORT, RAW_PIPE_EPOLL, f64::NAN),
    (PIPE_TRANSPORT, TOKIO_PIPE, f64::NAN),
    (SOCKET_TRANSPORT, RAW_UNIX, 1.5),
    (SOCKET_TRANSPORT, RAW_PIPE, 1.5),
    (HOST_CALL, RAW_PIPE, 1.3),
    (HOST_CALL, PIPE_TRANSPORT, f64::NAN),
];

/// One comparison of the paired run: medians of per-burst round trip times, and the median of
/// the per-round ratios.
struct Paired {
    subject: &'static str,
    baseline: &'static str,
    subject_ns: f64,
    baseline_ns: f64,
    ratio: f64,
}

/// For each comparison, `PAIRED_ROUNDS` rounds of bursts in ABBA order (baseline, subject,
/// subject, baseline), so a drift in machine speed within a round cancels out of its ratio.
fn paired_ratios(links: &mut [(&'static str, Link)]) -> Vec<Paired> {
    let mut out = Vec::new();
    for (subject, baseline, _) in COMPARISONS {
        let (Some(s), Some(b)) = (
            links.iter().position(|(n, _)| *n == subject),
            links.iter().position(|(n, _)| *n == baseline),
        ) else {
            continue;
        };
        let mut per = |index: usize| {
            links[index].1.round_trips(PAIRED_BURST).as_nanos() as f64 / PAIRED_BURST as f64
        };
        let (mut subject_ns, mut baseline_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..PAIRED_ROUNDS {
            let (b1, s1, s2, b2) = (per(b), per(s), per(s), per(b));
            subject_ns.extend([s1, s2]);
            baseline_ns.extend([b1, b2]);
            ratios.push((s1 + s2) / (b1 + b2));
        }
        out.push(Paired {
            subject,
            baseline,
            subject_ns: median(&subject_ns),
            baseline_ns: median(&baseline_ns),
            ratio: median(&ratios),
        });
    }
    out
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// This process's stdin and stdout, as owned descriptors (the peer's pipes to the bench).
fn stdio_pipes() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    let input = std::io::stdin().as_fd().try_clone_to_owned().unwrap();
    let output = std::io::stdout().as_fd().try_clone_to_owned().unwrap();
    (input, output)
}

/// The echo side, in the re-executed process.
fn peer(role: &str) {
    match role {
        RAW_PIPE => {
            let (input, output) = stdio_pipes();
            echo_raw(std::fs::File::from(input), std::fs::File::from(output));
        }
        RAW_PIPE_EPOLL => {
            let (input, output) = stdio_pipes();
            echo_raw(EpollReader::new(input), std::fs::File::from(output));
        }
        TOKIO_PIPE => {
            use tokio::io::AsyncWriteExt;
            let (input, output) = stdio_pipes();
            runtime().block_on(async {
                let mut input = tokio::net::unix::pipe::Receiver::from_owned_fd(input).unwrap();
                let mut output = tokio::net::unix::pipe::Sender::from_owned_fd(output).unwrap();
                let mut buf = vec![0u8; READ_CHUNK];
                while read_message(&mut input, &mut buf).await {
                    output.write_all(&buf[..WIRE]).await.unwrap();
                }
            });
        }
        RAW_UNIX => {
            let stream = UnixStream::connect(std::env::var_os(SOCKET_PATH_ENV).unwrap()).unwrap();
            echo_raw(stream.try_clone().unwrap(), stream);
        }
        PIPE_TRANSPORT => {
            let rt = runtime();
            rt.block_on(async {
                let transport = take_worker_stdio(StreamConfig::default()).unwrap();
                echo_frames(transport).await;
            });
        }
        SOCKET_TRANSPORT => {
            let rt = runtime();
            rt.block_on(async {
                let transport = worker_inherited(StreamConfig::default()).unwrap();
                echo_frames(transport).await;
            });
        }
        other => panic!("unknown bench peer role {other:?}"),
    }
}

/// A non-blocking descriptor read the way a readiness-based runtime reads it: wait in
/// `epoll_wait` (level-triggered) until it is readable, then `read`.
struct EpollReader {
    epoll: std::os::fd::OwnedFd,
    fd: std::fs::File,
}

impl EpollReader {
    fn new(fd: std::os::fd::OwnedFd) -> Self {
        use rustix::event::epoll;
        rustix::io::ioctl_fionbio(&fd, true).unwrap();
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
        epoll::add(
            &epoll,
            &fd,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )
        .unwrap();
        Self {
            epoll,
            fd: std::fs::File::from(fd),
        }
    }
}

impl Read for EpollReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use rustix::event::epoll;
        loop {
            let mut events = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 1];
            epoll::wait(&self.epoll, &mut events, None)?;
            match self.fd.read(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }
}

/// Reads one 64-byte message the way a framed reader does: into a large buffer, so a short
/// read tells tokio the pipe is drained and the next read waits for readiness first instead of
/// failing with `EAGAIN` (three system calls per message, as the transports make). False at
/// end of stream.
async fn read_message(from: &mut (impl tokio::io::AsyncRead + Unpin), buf: &mut [u8]) -> bool {
    use tokio::io::AsyncReadExt;
    let mut got = 0;
    while got < WIRE {
        match from.read(&mut buf[got..]).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got += n,
        }
    }
    true
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

/// Criterion's medians, then the paired run's, each with the ratio to its baseline.
fn summary(criterion_medians: &[(&'static str, f64)], paired: &[Paired]) {
    let verdict = |ratio: f64, target: f64| match ratio <= target {
        _ if target.is_nan() => "no target: shows where the time goes".to_string(),
        true => format!("target <= {target}x: ok"),
        false => format!("target <= {target}x: OVER TARGET"),
    };
    let target_of = |subject: &str, baseline: &str| {
        COMPARISONS
            .iter()
            .find(|(s, b, _)| *s == subject && *b == baseline)
            .map_or(f64::NAN, |(_, _, t)| *t)
    };
    println!("\nround trip of {WIRE} bytes each way.");
    println!("criterion, each link alone, median per round trip:");
    for (name, ns) in criterion_medians {
        println!("  {name:<18} {:>9.2} µs", ns / 1000.0);
    }
    let med = |name: &str| {
        criterion_medians
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, m)| *m)
    };
    for (subject, baseline, target) in COMPARISONS {
        if let (Some(s), Some(b)) = (med(subject), med(baseline)) {
            let ratio = s / b;
            println!(
                "  {subject} / {baseline}: {ratio:.2}x ({})",
                verdict(ratio, target)
            );
        }
    }
    if paired.is_empty() {
        return;
    }
    println!(
        "paired, {PAIRED_ROUNDS} rounds of {PAIRED_BURST}-round-trip bursts in ABBA order, medians:"
    );
    for p in paired {
        let target = target_of(p.subject, p.baseline);
        println!(
            "  {} {:.2} µs / {} {:.2} µs: {:.2}x ({})",
            p.subject,
            p.subject_ns / 1000.0,
            p.baseline,
            p.baseline_ns / 1000.0,
            p.ratio,
            verdict(p.ratio, target)
        );
    }
}
