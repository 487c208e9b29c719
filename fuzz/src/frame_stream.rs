//! The `frame_stream` target: a host session past its handshake, with calls in flight, fed an
//! arbitrary byte stream as if a hostile worker wrote it, in chunks of arbitrary sizes.
//!
//! Input layout (missing bytes read as zero):
//!
//! | byte | meaning |
//! | --- | --- |
//! | 0 | flags: bits 0–1 = calls to begin − 1 (1–4); bit 2 = cancel the first call before the stream; bit 3 = `shutdown()` before the stream; bit 4 = pass every deadline (`handle_timeout`) after the stream |
//! | 1 | `n`, the number of chunk-size bytes (taken mod 16) |
//! | 2 .. 2+n | chunk sizes, used in turn; 0 means "all the rest" |
//! | 2+n .. | the stream the worker "wrote" |
//!
//! Call ids come from a fixed-seed generator, so the seed corpus can hold replies that match
//! real calls (the fuzzer itself would never guess a 128-bit id).
//!
//! The invariants checked after `handle_eof`: nothing panicked; every id `begin_call` returned
//! got exactly one [`Event::Completed`] and no other id got one; `Progress` only for a begun
//! call and before its completion; [`Event::Closed`] exactly once (the stream ended, so the
//! session must be closed) and last; nothing left in flight, to send or to wait for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use airlock_protocol::frame::{encode_frame, Fail, Frame, Hello, Progress, Return};
use airlock_protocol::{
    CallId, CloseReason, Event, HostConfig, HostSession, Outcome, MIN_MAX_FRAME, PROTOCOL_VERSION,
};
use bytes::Bytes;

/// The methods the worker declares and the calls alternate between.
pub const METHODS: [&str; 2] = ["echo", "sum"];

/// The fixed seed of the id generator.
pub const RNG_SEED: u64 = 0x00a1_10c4;

/// Flag bits of the first input byte.
pub const CANCEL_FIRST: u8 = 1 << 2;
/// See [`CANCEL_FIRST`].
pub const SHUTDOWN: u8 = 1 << 3;
/// See [`CANCEL_FIRST`].
pub const EXPIRE: u8 = 1 << 4;

/// How long each call may run; [`EXPIRE`] jumps past it.
const DEADLINE: Duration = Duration::from_secs(60);

#[path = "../../protocol/tests/support/seeded_rng.rs"]
mod seeded_rng;
/// The seeded generator shared with the protocol's tests: reproducible ids, never real ones.
pub use seeded_rng::SeededRng as FixedRng;

/// Small limits, so the fuzzer reaches each of them with short inputs.
pub fn config() -> HostConfig {
    HostConfig::default()
        .max_frame(MIN_MAX_FRAME)
        .and_then(|c| c.max_in_flight(8))
        .expect("valid fuzz config")
        .max_progress_per_call(4)
}

/// The input, split into its parts.
#[derive(Debug)]
pub struct Script<'a> {
    /// Calls to begin (1–4).
    pub calls: usize,
    /// The [`CANCEL_FIRST`], [`SHUTDOWN`] and [`EXPIRE`] bits.
    pub flags: u8,
    /// Chunk sizes, used in turn.
    pub chunk_sizes: &'a [u8],
    /// The worker's bytes.
    pub stream: &'a [u8],
}

impl<'a> Script<'a> {
    /// Splits `data` as the module docs describe.
    pub fn parse(data: &'a [u8]) -> Self {
        let flags = data.first().copied().unwrap_or(0);
        let n = usize::from(data.get(1).copied().unwrap_or(0) % 16);
        let sizes_end = (2 + n).min(data.len());
        Script {
            calls: usize::from(flags & 3) + 1,
            flags,
            chunk_sizes: data.get(2.min(data.len())..sizes_end).unwrap_or(&[]),
            stream: data.get(sizes_end..).unwrap_or(&[]),
        }
    }

    /// Builds an input: `calls` (1–4), flag bits, chunk sizes, then the stream.
    pub fn encode(calls: usize, flags: u8, chunk_sizes: &[u8], stream: &[u8]) -> Vec<u8> {
        assert!((1..=4).contains(&calls) && chunk_sizes.len() < 16);
        let header = [(calls - 1) as u8 | (flags & !3), chunk_sizes.len() as u8];
        [&header[..], chunk_sizes, stream].concat()
    }
}

/// The `Hello` every run starts with.
pub fn hello() -> Vec<u8> {
    encode_frame(&Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        worker_name: "fuzz-worker",
        worker_version: "1.0",
        methods: METHODS.to_vec(),
        token: None,
    }))
}

/// A ready host session with `calls` calls begun (method `METHODS[i % 2]`), and their ids.
pub fn setup(calls: usize, now: Instant) -> (HostSession, Vec<(CallId, &'static str)>, Vec<Event>) {
    let mut host = HostSession::new(config(), now);
    host.handle_bytes(&hello());
    let mut events: Vec<Event> = std::iter::from_fn(|| host.poll_event()).collect();
    assert!(
        matches!(events.as_slice(), [Event::Ready(_)]),
        "handshake failed: {events:?}"
    );
    events.clear();
    let mut rng = FixedRng(RNG_SEED);
    let calls = (0..calls)
        .map(|i| {
            let method = METHODS[i % 2];
            let body = Bytes::from(vec![i as u8; i * 3]);
            let id = host
                .begin_call(method, body, now + DEADLINE, &mut rng)
                .expect("begin_call");
            (id, method)
        })
        .collect();
    while host.poll_transmit().is_some() {}
    (host, calls, events)
}

/// What one run delivered.
#[derive(Debug)]
pub struct Report {
    /// The calls begun, in order.
    pub calls: Vec<(CallId, &'static str)>,
    /// Every event after `Ready`, in order.
    pub events: Vec<Event>,
}

impl Report {
    /// The one outcome of call `i`.
    pub fn outcome(&self, i: usize) -> &Outcome {
        let id = self.calls[i].0;
        self.events
            .iter()
            .find_map(|e| match e {
                Event::Completed { id: got, outcome } if *got == id => Some(outcome),
                _ => None,
            })
            .expect("every call completes")
    }

    /// Why the session closed.
    pub fn closed(&self) -> &CloseReason {
        match self.events.last() {
            Some(Event::Closed(reason)) => reason,
            other => panic!("last event is not Closed: {other:?}"),
        }
    }

    /// The violation number the session closed with, if any.
    pub fn violation(&self) -> Option<u16> {
        match self.closed() {
            CloseReason::Violation(v) => Some(v.code.number()),
            _ => None,
        }
    }
}

/// Runs the script and checks every invariant; panics if one breaks.
pub fn check_frame_stream(data: &[u8]) -> Report {
    let script = Script::parse(data);
    let now = Instant::now();
    let (mut host, calls, mut events) = setup(script.calls, now);
    let drain = |host: &mut HostSession, events: &mut Vec<Event>| {
        events.extend(std::iter::from_fn(|| host.poll_event()));
    };

    if script.flags & CANCEL_FIRST != 0 {
        assert!(host.cancel(calls[0].0), "a pending call can be cancelled");
    }
    if script.flags & SHUTDOWN != 0 {
        host.shutdown();
    }
    drain(&mut host, &mut events);

    let mut rest = script.stream;
    let mut sizes = script.chunk_sizes.iter().cycle();
    while !rest.is_empty() {
        let size = match sizes.next() {
            Some(&0) | None => rest.len(),
            Some(&n) => usize::from(n).min(rest.len()),
        };
        let (chunk, tail) = rest.split_at(size);
        host.handle_bytes(chunk);
        drain(&mut host, &mut events);
        rest = tail;
    }
    if script.flags & EXPIRE != 0 {
        // The deadline (calls time out and are cancelled), then the end of the cancel grace
        // (a call still owed closes the session).
        host.handle_timeout(now + DEADLINE);
        drain(&mut host, &mut events);
        host.handle_timeout(now + DEADLINE + config().cancel_grace_limit());
    }
    host.handle_eof();
    drain(&mut host, &mut events);

    check_invariants(&calls, &events);
    assert!(host.is_closed(), "the stream ended but the session is open");
    assert_eq!(host.in_flight(), 0, "calls left in flight after close");
    assert!(host.poll_transmit().is_none(), "a frame queued after close");
    assert!(host.poll_timeout().is_none(), "a timer armed after close");
    host.handle_bytes(&hello());
    host.handle_eof();
    assert!(host.poll_event().is_none(), "an event after Closed");
    Report { calls, events }
}

fn check_invariants(calls: &[(CallId, &'static str)], events: &[Event]) {
    let mut completed: HashMap<CallId, usize> = calls.iter().map(|(id, _)| (*id, 0)).collect();
    let mut closed = 0;
    for (at, event) in events.iter().enumerate() {
        assert_eq!(closed, 0, "event after Closed: {:?}", &events[at..]);
        match event {
            Event::Completed { id, .. } => match completed.get_mut(id) {
                Some(count) => *count += 1,
                None => panic!("Completed for an id begin_call never returned: {id}"),
            },
            Event::Progress { id, .. } => match completed.get(id) {
                Some(0) => {}
                Some(_) => panic!("Progress after the call completed: {id}"),
                None => panic!("Progress for an id begin_call never returned: {id}"),
            },
            Event::Closed(_) => closed += 1,
            other => panic!("unexpected event {other:?}"),
        }
    }
    for (id, count) in completed {
        assert_eq!(count, 1, "call {id} completed {count} times: {events:?}");
    }
    assert_eq!(closed, 1, "Closed emitted {closed} times: {events:?}");
}

/// What a seed must do, checked against its run's [`Report`].
pub type Expect = Box<dyn Fn(&Report) -> bool>;

/// The committed seeds for `corpus/frame_stream/seed-*`: valid and hostile worker streams,
/// each with a check of what it must do, so the seeds are known to reach what they are named for.
pub fn seeds() -> Vec<(&'static str, Vec<u8>, Expect)> {
    let (_, calls, _) = setup(4, Instant::now());
    let ret = |i: usize| {
        let (id, method) = calls[i];
        encode_frame(&Frame::Return(Return {
            id,
            method,
            body: b"ok",
        }))
    };
    let progress = |i: usize| {
        let (id, method) = calls[i];
        encode_frame(&Frame::Progress(Progress {
            id,
            method,
            body: &[i as u8],
        }))
    };
    let fail = |i: usize, kind: u8, message: &str| {
        let (id, method) = calls[i];
        encode_frame(&Frame::Fail(Fail {
            id,
            method,
            kind,
            message,
            code: Some(7),
        }))
    };
    let all_returns: Vec<u8> = (0..4).flat_map(ret).collect();
    let forged = encode_frame(&Frame::Return(Return {
        id: CallId::from_bytes([0x42; 16]),
        method: "echo",
        body: b"forged",
    }));
    let swapped = encode_frame(&Frame::Return(Return {
        id: calls[0].0,
        method: "sum",
        body: b"swapped",
    }));
    let returned =
        |r: &Report| (0..r.calls.len()).all(|i| matches!(r.outcome(i), Outcome::Returned(_)));
    let violation = |code: u16| -> Expect { Box::new(move |r| r.violation() == Some(code)) };
    vec![
        (
            "all-return",
            Script::encode(4, 0, &[], &all_returns),
            Box::new(move |r| returned(r) && *r.closed() == CloseReason::WorkerClosed),
        ),
        (
            "all-return-one-byte-chunks",
            Script::encode(4, 0, &[1], &all_returns),
            Box::new(move |r| returned(r) && *r.closed() == CloseReason::WorkerClosed),
        ),
        (
            "progress-then-fail",
            Script::encode(
                2,
                0,
                &[3, 7, 0],
                &[progress(0), progress(0), fail(0, 1, "boom"), ret(1)].concat(),
            ),
            Box::new(|r| {
                matches!(r.outcome(0), Outcome::Failed(_))
                    && matches!(r.outcome(1), Outcome::Returned(_))
                    && r.events
                        .iter()
                        .filter(|e| matches!(e, Event::Progress { .. }))
                        .count()
                        == 2
            }),
        ),
        (
            "cancel-race",
            Script::encode(
                2,
                CANCEL_FIRST,
                &[5],
                &[progress(0), ret(0), ret(1)].concat(),
            ),
            Box::new(|r| {
                *r.outcome(0) == Outcome::Cancelled
                    && matches!(r.outcome(1), Outcome::Returned(_))
                    && *r.closed() == CloseReason::WorkerClosed
            }),
        ),
        (
            "shutdown-clean",
            Script::encode(4, SHUTDOWN, &[], &all_returns),
            Box::new(move |r| returned(r) && *r.closed() == CloseReason::Shutdown),
        ),
        (
            "expired",
            Script::encode(3, EXPIRE, &[], &ret(1)),
            Box::new(|r| {
                *r.outcome(0) == Outcome::TimedOut && *r.closed() == CloseReason::CallTimeout
            }),
        ),
        (
            "progress-over-quota",
            Script::encode(
                1,
                0,
                &[],
                &(0..5).flat_map(|_| progress(0)).collect::<Vec<u8>>(),
            ),
            violation(12),
        ),
        (
            "forged-id",
            Script::encode(1, 0, &[], &forged),
            violation(8),
        ),
        (
            "replayed-return",
            Script::encode(2, 0, &[], &[ret(0), ret(0)].concat()),
            violation(9),
        ),
        (
            "method-mismatch",
            Script::encode(1, 0, &[], &swapped),
            violation(10),
        ),
        (
            "unknown-error-kind",
            Script::encode(1, 0, &[], &fail(0, 9, "x")),
            violation(13),
        ),
        (
            "control-char-message",
            Script::encode(1, 0, &[], &fail(0, 0, "line\nbreak")),
            violation(13),
        ),
        (
            "duplicate-hello",
            Script::encode(1, 0, &[], &hello()),
            violation(6),
        ),
        (
            "forbidden-shutdown",
            Script::encode(1, 0, &[], &[1, 0, 0, 0, 8]),
            violation(7),
        ),
        (
            "too-large-prefix",
            Script::encode(1, 0, &[], &[0xff, 0xff, 0xff, 0x7f]),
            violation(1),
        ),
        (
            "zero-length",
            Script::encode(1, 0, &[], &[0, 0, 0, 0]),
            violation(2),
        ),
        (
            "garbage",
            Script::encode(1, 0, &[], &[4, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]),
            violation(3),
        ),
        (
            "truncated",
            Script::encode(2, 0, &[], &ret(1)[..20]),
            violation(4),
        ),
    ]
}
