//! Property test: arbitrary interleavings of legitimate worker behaviour and injected hostile
//! frames. After every step each call has at most one outcome and no outcome carries another
//! call's body; at the end every call has exactly one outcome (invariants 3 and 5).

mod support;

use std::collections::HashMap;
use std::time::Duration;

use airlock_protocol::frame::{self, Frame};
use airlock_protocol::*;
use bytes::Bytes;
use proptest::prelude::*;
use support::*;

const METHODS: [&str; 2] = ["echo", "sum"];

#[derive(Clone, Debug)]
enum Step {
    /// The host starts a call to `METHODS[m]`.
    Begin(usize),
    /// The host cancels the `k`-th call ever begun (if still pending).
    Cancel(usize),
    /// The worker answers its `k`-th received call honestly, echoing the request.
    Return(usize),
    /// The worker fails its `k`-th received call.
    Fail(usize),
    /// The worker sends progress for its `k`-th received call.
    Progress(usize),
    /// Frames are moved between the two sides.
    Pump,
    /// Time passes.
    Advance(u64),
    /// A hostile frame is injected into the host.
    Hostile(Hostile),
}

#[derive(Clone, Debug)]
enum Hostile {
    /// A `Return` for an id never issued.
    RandomId([u8; 16]),
    /// A `Return` for the `k`-th call, with another call's body and the right name.
    Replay(usize),
    /// A `Return` for the `k`-th call under the other method's name.
    SwappedName(usize),
    /// Bytes that are not a frame.
    Garbage(Vec<u8>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..2usize).prop_map(Step::Begin),
        1 => (0..16usize).prop_map(Step::Cancel),
        3 => (0..16usize).prop_map(Step::Return),
        1 => (0..16usize).prop_map(Step::Fail),
        1 => (0..16usize).prop_map(Step::Progress),
        4 => Just(Step::Pump),
        1 => (0..40u64).prop_map(Step::Advance),
        1 => prop_oneof![
            any::<[u8; 16]>().prop_map(Hostile::RandomId),
            (0..16usize).prop_map(Hostile::Replay),
            (0..16usize).prop_map(Hostile::SwappedName),
            prop::collection::vec(any::<u8>(), 1..12).prop_map(Hostile::Garbage),
        ]
        .prop_map(Step::Hostile),
    ]
}

struct Run {
    pair: Pair,
    /// Every call begun: id, method, the unique request body.
    begun: Vec<(CallId, &'static str, Bytes)>,
    /// Calls as the worker received them, in order, with the request body.
    received: Vec<(CallId, Bytes)>,
    /// Every `Return` frame written toward the host, honest or forged: the id it named and
    /// its body. A returned body must come from a frame that named that call.
    returns_sent: Vec<(CallId, Bytes)>,
    elapsed: u64,
}

impl Run {
    fn issued(&self, id: CallId) -> bool {
        self.begun.iter().any(|(i, _, _)| *i == id)
    }

    fn was_sent_for(&self, id: CallId, body: &Bytes) -> bool {
        self.returns_sent.iter().any(|(i, b)| *i == id && b == body)
    }

    fn apply(&mut self, step: Step) {
        let pair = &mut self.pair;
        match step {
            Step::Begin(m) => {
                let n = self.begun.len();
                let body = Bytes::from(format!("request-{n}"));
                // Deadlines spread out, so time passing expires some calls and not others.
                let deadline = pair.now + Duration::from_secs(10 + 7 * n as u64);
                if let Ok(id) =
                    pair.host
                        .begin_call(METHODS[m], body.clone(), deadline, &mut pair.rng)
                {
                    self.begun.push((id, METHODS[m], body));
                }
            }
            Step::Cancel(k) => {
                if let Some((id, _, _)) = self.begun.get(k) {
                    pair.host.cancel(*id);
                }
            }
            Step::Return(k) => {
                if let Some((id, body)) = self.received.get(k) {
                    if pair.worker.reply_return(*id, body.clone()).is_ok() {
                        self.returns_sent.push((*id, body.clone()));
                    }
                }
            }
            Step::Fail(k) => {
                if let Some((id, _)) = self.received.get(k) {
                    let _ = pair
                        .worker
                        .reply_fail(*id, &RemoteError::new(ErrorKind::Handler, "no"));
                }
            }
            Step::Progress(k) => {
                if let Some((id, _)) = self.received.get(k) {
                    let _ = pair.worker.reply_progress(*id, Bytes::from_static(b"p"));
                }
            }
            Step::Pump => pair.pump(),
            Step::Advance(secs) => {
                self.elapsed += secs;
                pair.host
                    .handle_timeout(pair.now + Duration::from_secs(self.elapsed));
            }
            Step::Hostile(h) => {
                let frame_bytes = match &h {
                    Hostile::RandomId(bytes) => frame::encode_frame(&forged_return(
                        CallId::from_bytes(*bytes),
                        "echo",
                        b"forged",
                    )),
                    Hostile::Replay(k) => match self.begun.get(*k) {
                        Some((id, method, _)) => {
                            self.returns_sent
                                .push((*id, Bytes::from_static(b"a forged body")));
                            frame::encode_frame(&forged_return(*id, method, b"a forged body"))
                        }
                        None => return,
                    },
                    Hostile::SwappedName(k) => match self.begun.get(*k) {
                        Some((id, method, body)) => {
                            let other = if *method == "echo" { "sum" } else { "echo" };
                            frame::encode_frame(&Frame::Return(frame::Return {
                                id: *id,
                                method: other,
                                body,
                            }))
                        }
                        None => return,
                    },
                    Hostile::Garbage(bytes) => bytes.clone(),
                };
                pair.inject(&frame_bytes);
            }
        }
        pair.drain();
        for (id, _, body) in pair.worker_calls() {
            self.received.push((id, body));
        }
    }

    /// After every step: at most one outcome per call, and a returned body is the call's own.
    fn check_step(&self) -> Result<(), TestCaseError> {
        let mut seen: HashMap<CallId, usize> = HashMap::new();
        for (id, outcome) in self.pair.outcomes() {
            let count = seen.entry(id).or_default();
            *count += 1;
            prop_assert!(*count == 1, "call {id} has two outcomes");
            prop_assert!(self.issued(id), "an outcome for an id never issued");
            if let Outcome::Returned(body) = outcome {
                // A worker may lie in the answer to a call it was sent (a stated residual), but
                // a body can only reach a call through a frame that named that call.
                prop_assert!(
                    self.was_sent_for(id, &body),
                    "an outcome carries a frame of another call"
                );
            }
        }
        let closed = self
            .pair
            .host_events
            .iter()
            .filter(|e| matches!(e, Event::Closed(_)))
            .count();
        prop_assert!(closed <= 1);
        if closed == 1 {
            prop_assert!(matches!(
                self.pair.host_events.last(),
                Some(Event::Closed(_))
            ));
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_call_gets_exactly_one_outcome_of_its_own(steps in prop::collection::vec(step(), 1..60)) {
        let mut run = Run {
            pair: Pair::ready(&METHODS),
            begun: Vec::new(),
            received: Vec::new(),
            returns_sent: Vec::new(),
            elapsed: 0,
        };
        for step in steps {
            run.apply(step);
            run.check_step()?;
        }
        // However the run went, ending the connection settles every call.
        run.pair.host.handle_eof();
        run.pair.drain();
        run.check_step()?;
        let outcomes = run.pair.outcomes();
        for (id, _, _) in &run.begun {
            let count = outcomes.iter().filter(|(i, _)| i == id).count();
            prop_assert_eq!(count, 1, "call {} ended {} times", id, count);
        }
        prop_assert!(run.pair.host.is_closed());
    }
}
