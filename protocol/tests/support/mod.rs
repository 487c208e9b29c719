//! A deterministic host↔worker pair simulator: both session state machines, no process, no
//! socket, no runtime, no clock. Time is a field; randomness is a seeded generator.

#![allow(dead_code)] // each test file uses a different part of this module

use std::time::{Duration, Instant};

use airlock_protocol::frame::{encode_frame, Frame};
use airlock_protocol::*;
use bytes::Bytes;
use rand_core::{CryptoRng, RngCore};

#[path = "seeded_rng.rs"]
mod seeded_rng;
pub use seeded_rng::SeededRng;

/// The weak id source of the Python defect: a per-spawn nonce plus a counter. Anyone who saw
/// one id knows the next.
#[derive(Clone, Debug)]
pub struct CounterRng {
    pub nonce: u64,
    pub counter: u64,
}

impl CounterRng {
    /// The id the next draw will produce.
    pub fn predict_next(&self) -> CallId {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.nonce.to_le_bytes());
        bytes[8..].copy_from_slice(&(self.counter + 1).to_le_bytes());
        CallId::from_bytes(bytes)
    }
}

impl RngCore for CounterRng {
    fn next_u32(&mut self) -> u32 {
        self.next_u64() as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.counter += 1;
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.nonce.to_le_bytes());
        bytes[8..].copy_from_slice(&self.counter.to_le_bytes());
        for (d, s) in dst.iter_mut().zip(bytes.iter().cycle()) {
            *d = *s;
        }
    }
}
impl CryptoRng for CounterRng {}

pub const DEADLINE: Duration = Duration::from_secs(30);

/// A host session and a worker session joined back to back.
pub struct Pair {
    pub host: HostSession,
    pub worker: WorkerSession,
    pub now: Instant,
    pub rng: SeededRng,
    pub host_events: Vec<Event>,
    pub worker_events: Vec<WorkerEvent>,
}

impl Pair {
    pub fn new(config: HostConfig, methods: &[&str]) -> Self {
        let now = Instant::now();
        let mut worker_config = WorkerConfig::new("sim-worker", "1.0.0");
        worker_config.methods = methods.iter().map(|m| m.to_string()).collect();
        Self {
            host: HostSession::new(config, now),
            worker: WorkerSession::new(&worker_config),
            now,
            rng: SeededRng(7),
            host_events: Vec::new(),
            worker_events: Vec::new(),
        }
    }

    /// A pair with the default configuration past its handshake, events cleared.
    pub fn ready(methods: &[&str]) -> Self {
        Self::ready_with(HostConfig::default(), methods)
    }

    /// A pair with the host's `config` past its handshake, events cleared.
    pub fn ready_with(config: HostConfig, methods: &[&str]) -> Self {
        let mut pair = Self::new(config, methods);
        pair.pump();
        assert!(
            pair.host.is_ready(),
            "handshake failed: {:?}",
            pair.host_events
        );
        pair.host_events.clear();
        pair.worker_events.clear();
        pair
    }

    /// Moves frames both ways (in 1-byte chunks when `dribble`) until neither side has any.
    pub fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(t) = self.worker.poll_transmit() {
                self.host.handle_bytes(&t.to_vec());
                moved = true;
            }
            while let Some(t) = self.host.poll_transmit() {
                self.worker.handle_bytes(&t.to_vec());
                moved = true;
            }
            self.drain();
            if !moved {
                return;
            }
        }
    }

    pub fn drain(&mut self) {
        while let Some(e) = self.host.poll_event() {
            self.host_events.push(e);
        }
        while let Some(e) = self.worker.poll_event() {
            self.worker_events.push(e);
        }
    }

    pub fn call(&mut self, method: &'static str, body: &'static [u8]) -> CallId {
        self.call_with_deadline(method, body, self.now + DEADLINE)
    }

    /// Begins a call that must end by `deadline`.
    pub fn call_with_deadline(
        &mut self,
        method: &'static str,
        body: &'static [u8],
        deadline: Instant,
    ) -> CallId {
        self.host
            .begin_call(method, Bytes::from_static(body), deadline, &mut self.rng)
            .expect("begin_call")
    }

    /// A ready pair with one `echo` call, which the worker (a hostile peer writing its own
    /// frame) has answered with a `Fail` of kind `Handler` carrying `message`.
    pub fn handler_failed_with(message: &str) -> (Self, CallId) {
        let mut pair = Self::ready(&["echo"]);
        let id = pair.call("echo", b"");
        pair.pump();
        pair.inject_frame(&Frame::Fail(airlock_protocol::frame::Fail {
            id,
            method: "echo",
            kind: ErrorKind::Handler.to_wire(),
            message,
            code: None,
        }));
        (pair, id)
    }

    /// Delivers hostile bytes to the host as if the worker wrote them.
    pub fn inject(&mut self, bytes: &[u8]) {
        self.host.handle_bytes(bytes);
        self.drain();
    }

    pub fn inject_frame(&mut self, frame: &Frame<'_>) {
        self.inject(&encode_frame(frame));
    }

    /// Takes the calls the worker has received so far.
    pub fn worker_calls(&mut self) -> Vec<(CallId, MethodName, Bytes)> {
        let mut calls = Vec::new();
        self.worker_events.retain(|e| match e {
            WorkerEvent::Call { id, method, body } => {
                calls.push((*id, method.clone(), body.clone()));
                false
            }
            _ => true,
        });
        calls
    }

    /// The outcomes delivered so far, by call.
    pub fn outcomes(&self) -> Vec<(CallId, Outcome)> {
        self.host_events
            .iter()
            .filter_map(|e| match e {
                Event::Completed { id, outcome } => Some((*id, outcome.clone())),
                _ => None,
            })
            .collect()
    }

    pub fn outcome_of(&self, id: CallId) -> Vec<Outcome> {
        self.outcomes()
            .into_iter()
            .filter(|(i, _)| *i == id)
            .map(|(_, o)| o)
            .collect()
    }

    /// The reason the host session closed, if it did.
    pub fn close_reason(&self) -> Option<CloseReason> {
        self.host_events.iter().find_map(|e| match e {
            Event::Closed(r) => Some(r.clone()),
            _ => None,
        })
    }

    /// The violation code the host closed with, if it closed for a violation.
    pub fn violation(&self) -> Option<ViolationCode> {
        match self.close_reason()? {
            CloseReason::Violation(v) => Some(v.code),
            _ => None,
        }
    }
}

/// A `Return` frame as a hostile worker would write it.
pub fn forged_return<'a>(id: CallId, method: &'a str, body: &'a [u8]) -> Frame<'a> {
    Frame::Return(airlock_protocol::frame::Return { id, method, body })
}
