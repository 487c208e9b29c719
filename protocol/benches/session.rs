//! Session cost against its baselines, measured in the same run (read the ratios; absolute
//! times on a shared machine are noise):
//!
//! - `small_call_cycle`: one call and its return through a `HostSession` and a `WorkerSession`
//!   in memory (2 frames of a 64-byte body each), against the same two frames only encoded and
//!   decoded (`encode_frame`/`decode_frame`), and against a plain copy of their bytes.
//!   Throughput is in frames.
//! - `bulk_16mib`: one 16 MiB body through the host's receive path (`handle_frame` on a payload
//!   the transport read), through the worker's send path (`reply_return`), and through
//!   `handle_bytes` (which copies once into the decoder's buffer), against a 16 MiB `memcpy`.
//!   Before timing, it asserts that the body the host returns lies inside the frame's buffer
//!   and that the worker's transmit holds the caller's body itself: neither side copies it.

use std::hint::black_box;
use std::time::{Duration, Instant};

use airlock_protocol::frame::{decode_frame, encode_frame, Call, Frame, Return};
use airlock_protocol::{
    CallId, Event, HostConfig, HostSession, Outcome, WorkerConfig, WorkerEvent, WorkerSession,
    LENGTH_PREFIX,
};
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};

#[path = "../tests/support/seeded_rng.rs"]
mod seeded_rng;
use seeded_rng::SeededRng as BenchRng;

const METHOD: &str = "echo";
const SMALL_BODY: [u8; 64] = [0x5a; 64];
const BULK_LEN: usize = 16 * 1024 * 1024;

fn far_deadline() -> Instant {
    Instant::now() + Duration::from_secs(3600)
}

/// A host and a worker past the handshake. Frames are moved one transmit at a time.
fn handshaken() -> (HostSession, WorkerSession) {
    let mut host = HostSession::new(HostConfig::default(), Instant::now());
    let mut worker = WorkerSession::new(&WorkerConfig::new("bench", "1.0"));
    while let Some(t) = worker.poll_transmit() {
        host.handle_bytes(&t.to_vec());
    }
    while let Some(t) = host.poll_transmit() {
        worker.handle_bytes(&t.to_vec());
    }
    assert!(matches!(host.poll_event(), Some(Event::Ready(_))));
    assert!(matches!(
        worker.poll_event(),
        Some(WorkerEvent::Welcomed(_))
    ));
    (host, worker)
}

/// Both sessions and the scratch buffer a transport would read into.
struct Cycle {
    host: HostSession,
    worker: WorkerSession,
    rng: BenchRng,
    wire: Vec<u8>,
    deadline: Instant,
}

impl Cycle {
    fn new() -> Self {
        let (host, worker) = handshaken();
        Self {
            host,
            worker,
            rng: BenchRng(1),
            wire: Vec::with_capacity(256),
            deadline: far_deadline(),
        }
    }

    /// begin_call → poll_transmit → worker.handle_bytes → reply_return (echo) →
    /// poll_transmit → host.handle_bytes → poll_event, as a driver would run them.
    fn run(&mut self) -> Bytes {
        let body = Bytes::from_static(&SMALL_BODY);
        let id = self
            .host
            .begin_call(METHOD, body, self.deadline, &mut self.rng)
            .unwrap();
        let call = self.host.poll_transmit().unwrap();
        self.wire.clear();
        self.wire.extend_from_slice(&call.head);
        self.wire.extend_from_slice(&call.body);
        self.worker.handle_bytes(&self.wire);
        let Some(WorkerEvent::Call { id: got, body, .. }) = self.worker.poll_event() else {
            panic!("the worker received no call");
        };
        self.worker.reply_return(got, body).unwrap();
        let ret = self.worker.poll_transmit().unwrap();
        self.wire.clear();
        self.wire.extend_from_slice(&ret.head);
        self.wire.extend_from_slice(&ret.body);
        self.host.handle_bytes(&self.wire);
        let _ = self.host.poll_timeout(); // a driver re-reads its timer after every step
        match self.host.poll_event() {
            Some(Event::Completed {
                id: done,
                outcome: Outcome::Returned(body),
            }) if done == id => body,
            other => panic!("expected the call's return, got {other:?}"),
        }
    }
}

fn small_call_cycle(c: &mut Criterion) {
    let id = CallId::from_bytes([7; 16]);
    let call_frame = encode_frame(&Frame::Call(Call {
        id,
        method: METHOD,
        body: &SMALL_BODY,
    }));
    let return_frame = encode_frame(&Frame::Return(Return {
        id,
        method: METHOD,
        body: &SMALL_BODY,
    }));

    let mut cycle = Cycle::new();
    assert_eq!(cycle.run(), &SMALL_BODY[..]);

    let mut group = c.benchmark_group("small_call_cycle");
    group.throughput(Throughput::Elements(2)); // a Call and a Return per iteration
    group.bench_function("memcpy_baseline", |b| {
        let mut wire = Vec::with_capacity(256);
        b.iter(|| {
            wire.clear();
            wire.extend_from_slice(black_box(&call_frame));
            black_box(&wire);
            wire.clear();
            wire.extend_from_slice(black_box(&return_frame));
            black_box(&wire);
        })
    });
    group.bench_function("encode_decode_baseline", |b| {
        b.iter(|| {
            let call = encode_frame(&Frame::Call(Call {
                id,
                method: METHOD,
                body: black_box(&SMALL_BODY),
            }));
            black_box(decode_frame(&call[LENGTH_PREFIX..]).unwrap());
            let ret = encode_frame(&Frame::Return(Return {
                id,
                method: METHOD,
                body: black_box(&SMALL_BODY),
            }));
            black_box(decode_frame(&ret[LENGTH_PREFIX..]).unwrap());
        })
    });
    group.bench_function("host_worker_sessions", |b| {
        b.iter(|| black_box(cycle.run()))
    });
    group.finish();
}

/// The bytes of a `Hello`, and of the `Welcome` the host answers with.
fn handshake_bytes() -> (Vec<u8>, Vec<u8>) {
    let mut worker = WorkerSession::new(&WorkerConfig::new("bench", "1.0"));
    let hello = worker.poll_transmit().unwrap().to_vec();
    let mut host = HostSession::new(HostConfig::default(), Instant::now());
    host.handle_bytes(&hello);
    let welcome = host.poll_transmit().unwrap().to_vec();
    (hello, welcome)
}

/// A ready host with one call pending; the same id every time (fixed seed).
fn host_with_pending_call(hello: &[u8]) -> (HostSession, CallId) {
    let mut host = HostSession::new(HostConfig::default(), Instant::now());
    host.handle_bytes(hello);
    let _ = host.poll_event();
    let _ = host.poll_transmit();
    let id = host
        .begin_call(METHOD, Bytes::new(), far_deadline(), &mut BenchRng(42))
        .unwrap();
    let _ = host.poll_transmit();
    (host, id)
}

/// A worker that has received call `id`.
fn worker_with_running_call(welcome: &[u8], id: CallId) -> WorkerSession {
    let mut worker = WorkerSession::new(&WorkerConfig::new("bench", "1.0"));
    let _ = worker.poll_transmit();
    worker.handle_bytes(welcome);
    worker.handle_bytes(&encode_frame(&Frame::Call(Call {
        id,
        method: METHOD,
        body: &[],
    })));
    let _ = worker.poll_event();
    assert!(matches!(
        worker.poll_event(),
        Some(WorkerEvent::Call { .. })
    ));
    worker
}

fn bulk_16mib(c: &mut Criterion) {
    let body = Bytes::from(vec![0xab; BULK_LEN]);
    let (hello, welcome) = handshake_bytes();
    let (_, id) = host_with_pending_call(&hello);

    // The worker's send path: the transmit holds the caller's body itself.
    let mut worker = worker_with_running_call(&welcome, id);
    worker.reply_return(id, body.clone()).unwrap();
    let transmit = worker.poll_transmit().unwrap();
    assert_eq!(
        transmit.body.as_ptr(),
        body.as_ptr(),
        "reply_return copied the body"
    );
    assert_eq!(transmit.body.len(), BULK_LEN);

    // What the host's transport reads: the whole frame, in one buffer (its one copy).
    let wire = transmit.to_vec();
    let payload = Bytes::copy_from_slice(&wire[LENGTH_PREFIX..]);

    // The host's receive path: the returned body is a slice of the frame's buffer.
    let (mut host, _) = host_with_pending_call(&hello);
    host.handle_frame(payload.clone());
    let Some(Event::Completed {
        outcome: Outcome::Returned(returned),
        ..
    }) = host.poll_event()
    else {
        panic!("the host did not complete the call");
    };
    let frame = payload.as_ptr_range();
    let got = returned.as_ptr_range();
    assert_eq!(returned.len(), BULK_LEN);
    assert!(
        frame.start <= got.start && got.end <= frame.end,
        "the returned body was copied out of the frame's buffer"
    );
    assert_eq!(returned, body);
    drop((host, returned));

    let mut group = c.benchmark_group("bulk_16mib");
    group.throughput(Throughput::Bytes(BULK_LEN as u64));
    group.sample_size(30);
    group.bench_function("memcpy_baseline", |b| {
        let mut dst = vec![0u8; BULK_LEN];
        b.iter(|| {
            dst.copy_from_slice(black_box(&body));
            black_box(&dst);
        })
    });
    group.bench_function(BenchmarkId::new("host", "handle_frame"), |b| {
        b.iter_batched_ref(
            || host_with_pending_call(&hello).0,
            |host| {
                host.handle_frame(payload.clone());
                drop(black_box(host.poll_event()));
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function(BenchmarkId::new("worker", "reply_return"), |b| {
        b.iter_batched_ref(
            || worker_with_running_call(&welcome, id),
            |worker| {
                worker.reply_return(id, body.clone()).unwrap();
                drop(black_box(worker.poll_transmit()));
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function(BenchmarkId::new("host", "handle_bytes_one_copy"), |b| {
        b.iter_batched_ref(
            || host_with_pending_call(&hello).0,
            |host| {
                host.handle_bytes(&wire);
                drop(black_box(host.poll_event()));
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, small_call_cycle, bulk_16mib);
criterion_main!(benches);
