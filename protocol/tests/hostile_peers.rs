//! The session state machines against hostile peers: no call the host did not send runs, no
//! reply lands on a call it was not for, deadline bookkeeping stays bounded by the calls in
//! flight, frames behind a violation are never acted on, and error text is neutralised. Each
//! test asserts the safe behaviour; `live` helpers first show an attack would land without the
//! check.

mod support;

use std::time::Duration;

use airlock_protocol::frame::{self, encode_frame, Frame};
use airlock_protocol::*;
use airlock_test_support::alloc::{self, CountingAlloc};
use bytes::Bytes;
use support::*;

// Counts each thread's live bytes, for the bookkeeping-growth tests.
#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

fn worker_closed_with(pair: &Pair) -> Option<CloseReason> {
    pair.worker_events.iter().find_map(|e| match e {
        WorkerEvent::Closed(r) => Some(r.clone()),
        _ => None,
    })
}

/// Runs the handshake by hand: Hello to the host, nothing back to the worker yet.
fn hello_only(config: HostConfig) -> Pair {
    let mut pair = Pair::new(config, &["echo"]);
    while let Some(t) = pair.worker.poll_transmit() {
        pair.host.handle_bytes(&t.to_vec());
    }
    pair.drain();
    assert!(pair.host.is_ready(), "{:?}", pair.host_events);
    pair
}

fn host_wire(pair: &mut Pair) -> Vec<u8> {
    let mut wire = Vec::new();
    while let Some(t) = pair.host.poll_transmit() {
        wire.extend(t.to_vec());
    }
    wire
}

// ---------------------------------------------------------------------------------------------
// Frames that arrive in the same read as the Welcome are kept, not thrown away.

/// The host sends `Welcome` and, as soon as it sees `Ready`, its first `Call`. A transport that
/// batches frames (vectored writes) delivers both in one read. The worker must see the call.
#[test]
fn worker_keeps_a_call_that_arrives_in_the_same_read_as_welcome() {
    let mut pair = hello_only(HostConfig::default());
    let id = pair.call("echo", b"first call");
    let wire = host_wire(&mut pair); // Welcome + Call, back to back
    pair.worker.handle_bytes(&wire);
    pair.drain();
    assert!(
        pair.worker_events
            .iter()
            .any(|e| matches!(e, WorkerEvent::Welcomed(_))),
        "{:?}",
        pair.worker_events
    );
    let calls = pair.worker_calls();
    assert_eq!(
        calls.iter().map(|c| c.0).collect::<Vec<_>>(),
        [id],
        "the Call coalesced with the Welcome was silently dropped by the worker"
    );
}

/// Worse: when the read boundary falls inside that first `Call`, the bytes already buffered
/// (the Call's head) are discarded and the worker resynchronises *inside the body*. A request
/// body that happens to contain frame bytes (data the application forwarded) then becomes a
/// `Call` the host never made.
#[test]
fn worker_never_runs_a_call_the_host_did_not_send() {
    let mut pair = hello_only(HostConfig::default());
    let forged = encode_frame(&Frame::Call(frame::Call {
        id: CallId::from_bytes([0x41; 16]),
        method: "delete-everything",
        body: b"/",
    }));
    let deadline = pair.now + DEADLINE;
    let id = pair
        .host
        .begin_call("echo", Bytes::from(forged), deadline, &mut pair.rng)
        .unwrap();
    let welcome = pair.host.poll_transmit().unwrap();
    let call = pair.host.poll_transmit().unwrap();
    // One read returns the Welcome and the Call's head; the next returns the Call's body.
    let first_read = [&welcome.to_vec()[..], &call.head[..]].concat();
    pair.worker.handle_bytes(&first_read);
    pair.worker.handle_bytes(&call.body);
    pair.drain();
    let calls = pair.worker_calls();
    for (got, method, _) in &calls {
        assert_eq!(
            method.as_str(),
            "echo",
            "worker received a Call for {method:?} (id {got:?}) that the host never sent"
        );
    }
    assert_eq!(calls.iter().map(|c| c.0).collect::<Vec<_>>(), [id]);
}

// ---------------------------------------------------------------------------------------------
// A Fail message with Unicode line separators or bidi controls is refused.

#[test]
fn fail_message_with_unicode_line_separators_or_bidi_overrides_is_refused() {
    for hostile in [
        "ok\u{2028}2026-01-01 INFO host: audit clean", // LINE SEPARATOR (Zl)
        "ok\u{2029}2026-01-01 INFO host: audit clean", // PARAGRAPH SEPARATOR (Zp)
        "user \u{202e}nimda\u{202c} denied",           // RIGHT-TO-LEFT OVERRIDE (Cf)
        "user \u{2066}admin\u{2069} denied",           // LEFT-TO-RIGHT ISOLATE (Cf)
        "zero\u{200b}width\u{feff}",                   // ZWSP / BOM (Cf)
    ] {
        let (pair, id) = Pair::handler_failed_with(hostile);
        // Safe: either refused as a violation, or never delivered with those characters.
        for outcome in pair.outcome_of(id) {
            if let Outcome::Failed(err) = outcome {
                assert!(
                    !err.message().chars().any(|c| matches!(
                        c,
                        '\u{2028}' | '\u{2029}' | '\u{200b}' | '\u{feff}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
                    )),
                    "host delivered a worker error message with {:?} intact",
                    err.message()
                );
            }
        }
    }
}

#[test]
fn remote_error_new_neutralises_unicode_line_separators_and_bidi_overrides() {
    let err = RemoteError::new(ErrorKind::Handler, "a\u{2028}b\u{202e}c");
    assert!(
        !err.message().contains(['\u{2028}', '\u{202e}']),
        "RemoteError::new kept {:?}",
        err.message()
    );
}

// ---------------------------------------------------------------------------------------------
// An honest failure fits any valid max_frame: reply_fail bounds its message.

#[test]
fn honest_failure_with_the_longest_message_fits_any_valid_max_frame() {
    let config = HostConfig::default().max_frame(MIN_MAX_FRAME).unwrap();
    let mut pair = Pair::ready_with(config, &["echo"]);
    let id = pair.call("echo", b"");
    pair.pump();
    let err = RemoteError::new(ErrorKind::Handler, &"e".repeat(2 * MAX_ERROR_MESSAGE));
    assert_eq!(err.message().len(), MAX_ERROR_MESSAGE);
    let sent = pair.worker.reply_fail(id, &err);
    pair.pump();
    assert!(
        sent.is_err() || matches!(pair.outcome_of(id)[..], [Outcome::Failed(_)]),
        "reply_fail accepted a frame the host refuses: {:?}",
        pair.close_reason()
    );
    assert!(
        pair.violation().is_none(),
        "honest worker killed: {:?}",
        pair.close_reason()
    );
}

// ---------------------------------------------------------------------------------------------
// Deadline bookkeeping is bounded by the calls in flight, also while an older call stays pending.

/// Makes `rounds` calls that each complete at once, driven as a runtime drives them, and
/// returns how many bytes this thread's live allocations grew by after the first 5,000.
fn growth_over_completed_calls(pair: &mut Pair, rounds: u32) -> usize {
    assert!(CountingAlloc::is_installed(), "nothing would be measured");
    let mut baseline = 0;
    for round in 0..rounds {
        pair.call_with_deadline("echo", b"", pair.now + Duration::from_secs(60));
        pair.pump();
        for (id, _, _) in pair.worker_calls() {
            pair.worker.reply_return(id, Bytes::new()).unwrap();
        }
        pair.pump();
        let _ = pair.host.poll_timeout(); // what a runtime does after every step
        pair.host_events.clear();
        pair.worker_events.clear();
        if round == 5_000 {
            baseline = alloc::live();
        }
    }
    alloc::live().saturating_sub(baseline)
}

#[test]
fn deadline_bookkeeping_is_bounded_by_calls_in_flight() {
    let mut pair = Pair::ready(&["echo"]);
    // The worker holds one call and never answers it (within its 30 s deadline).
    let stalled = pair.call("echo", b"");
    pair.pump();
    let _ = pair.worker_calls();
    let rounds = 100_000;
    let growth = growth_over_completed_calls(&mut pair, rounds);
    assert_eq!(pair.host.in_flight(), 1, "only the stalled call is pending");
    let _ = stalled;
    assert!(
        growth < 512 * 1024,
        "host bookkeeping grew by {growth} bytes over {rounds} completed calls with 1 in flight"
    );
}

/// Control for the test above: the same traffic without a stalled call stays within the same
/// bound, so that bound is about what one stalled call adds (its deadline entry among all the
/// others), not about the traffic.
#[test]
fn deadline_bookkeeping_control_without_a_stalled_call_stays_flat() {
    let mut pair = Pair::ready(&["echo"]);
    let growth = growth_over_completed_calls(&mut pair, 100_000);
    assert!(growth < 512 * 1024, "grew by {growth} bytes");
}

// ---------------------------------------------------------------------------------------------
// An honest Cancel that crosses its call's answer on the wire never kills the worker, however
// many calls a legal max_in_flight lets be in flight.

#[test]
fn honest_cancel_crossing_its_answer_never_kills_the_worker() {
    let in_flight = 5_000u32;
    let config = HostConfig::default().max_in_flight(in_flight).unwrap();
    let mut pair = Pair::ready_with(config, &["echo"]);
    let ids: Vec<CallId> = (0..in_flight).map(|_| pair.call("echo", b"")).collect();
    pair.pump();
    assert_eq!(pair.worker_calls().len(), in_flight as usize);
    // The worker answers every call; none of its frames has reached the host yet ...
    for id in &ids {
        pair.worker.reply_return(*id, Bytes::new()).unwrap();
    }
    // ... when the host cancels the first (it still sees it pending), and the Cancel arrives.
    assert!(pair.host.cancel(ids[0]));
    let wire = host_wire(&mut pair);
    pair.worker.handle_bytes(&wire);
    pair.drain();
    assert_eq!(
        worker_closed_with(&pair),
        None,
        "worker closed itself over an honest Cancel ({:?})",
        worker_closed_with(&pair)
    );
}

// ---------------------------------------------------------------------------------------------
// Other attacks, each refused.

#[test]
fn frames_behind_a_violation_in_the_same_read_reach_no_call() {
    let mut pair = Pair::ready(&["echo"]);
    let a = pair.call("echo", b"");
    let b = pair.call("echo", b"");
    pair.pump();
    let mut wire = encode_frame(&forged_return(CallId::from_bytes([9; 16]), "echo", b"x"));
    wire.extend(encode_frame(&forged_return(a, "echo", b"forged")));
    pair.inject(&wire);
    assert_eq!(pair.violation(), Some(ViolationCode::UnknownCallId));
    for id in [a, b] {
        assert!(matches!(pair.outcome_of(id)[..], [Outcome::Lost(_)]));
    }
}

#[test]
fn nothing_is_emitted_after_closed() {
    let mut pair = Pair::ready(&["echo"]);
    let a = pair.call("echo", b"");
    let c = pair.call("echo", b"");
    pair.pump();
    assert!(pair.host.cancel(c));
    pair.inject(&[0, 0, 0, 0]); // empty frame: violation
    assert_eq!(pair.violation(), Some(ViolationCode::EmptyFrame));
    let before = pair.host_events.len();
    assert!(matches!(pair.host_events.last(), Some(Event::Closed(_))));
    // Poke every entry point.
    assert!(!pair.host.cancel(a));
    pair.host.shutdown();
    pair.host
        .abort(CloseReason::Aborted(AbortReason::HostShutdown));
    pair.host
        .handle_timeout(pair.now + Duration::from_secs(3600));
    pair.inject_frame(&forged_return(a, "echo", b""));
    pair.host.handle_eof();
    pair.drain();
    assert_eq!(
        pair.host_events.len(),
        before,
        "{:?}",
        &pair.host_events[before..]
    );
    assert_eq!(pair.host.poll_transmit(), None);
    assert_eq!(pair.host.poll_timeout(), None);
    assert!(pair
        .host
        .begin_call("echo", Bytes::new(), pair.now, &mut pair.rng)
        .is_err());
    // Exactly one Completed per call: a lost, c cancelled.
    assert!(matches!(pair.outcome_of(a)[..], [Outcome::Lost(_)]));
    assert_eq!(pair.outcome_of(c), [Outcome::Cancelled]);
}

#[test]
fn cancelled_call_then_timeout_then_late_frames_give_one_outcome_each() {
    let mut pair = Pair::ready(&["echo"]);
    let c = pair.call("echo", b"");
    let deadline2 = pair.now + DEADLINE + Duration::from_secs(10);
    let d = pair.call_with_deadline("echo", b"", deadline2);
    pair.pump();
    assert!(pair.host.cancel(c));
    // Progress for the cancelled call is discarded (not delivered).
    pair.worker
        .reply_progress(c, Bytes::from_static(b"p"))
        .unwrap();
    pair.pump();
    assert!(!pair
        .host_events
        .iter()
        .any(|e| matches!(e, Event::Progress { id, .. } if *id == c)));
    pair.host.handle_timeout(pair.now + DEADLINE);
    pair.drain();
    assert!(pair.outcome_of(d).is_empty(), "the cancel grace is running");
    pair.host
        .handle_timeout(pair.now + DEADLINE + DEFAULT_CANCEL_GRACE);
    pair.drain();
    assert_eq!(pair.outcome_of(c), [Outcome::Cancelled]);
    assert!(matches!(
        pair.outcome_of(d)[..],
        [Outcome::Lost(CloseReason::CallTimeout)]
    ));
}

#[test]
fn progress_quota_counts_cancelled_calls_and_is_exact() {
    let config = HostConfig::default().max_progress_per_call(2);
    let mut pair = Pair::ready_with(config, &["echo"]);
    let id = pair.call("echo", b"");
    pair.pump();
    for _ in 0..2 {
        pair.inject_frame(&Frame::Progress(frame::Progress {
            id,
            method: "echo",
            body: b"",
        }));
    }
    assert!(pair.host.is_ready());
    pair.inject_frame(&Frame::Progress(frame::Progress {
        id,
        method: "echo",
        body: b"",
    }));
    assert_eq!(pair.violation(), Some(ViolationCode::ProgressOverQuota));
}

#[test]
fn handshake_rules_hold() {
    let token = [7u8; TOKEN_LEN];
    let hello = |protocol: u32, methods: Vec<&str>, token: Option<&[u8]>| {
        encode_frame(&Frame::Hello(frame::Hello {
            protocol,
            worker_name: "w",
            worker_version: "1",
            methods,
            token,
        }))
    };
    let fresh = || {
        HostSession::new(
            HostConfig::default().token(token),
            std::time::Instant::now(),
        )
    };
    let closed_with = |host: &mut HostSession| {
        let mut last = None;
        while let Some(e) = host.poll_event() {
            if let Event::Closed(r) = e {
                last = Some(r);
            }
        }
        last
    };
    // Missing token, short token, long token, wrong token, one bit off: never Ready.
    let mut off = token;
    off[31] ^= 1;
    for presented in [
        None,
        Some(&token[..31]),
        Some(&[7u8; 33][..]),
        Some(&[0u8; 32][..]),
        Some(&off[..]),
    ] {
        let mut host = fresh();
        host.handle_bytes(&hello(PROTOCOL_VERSION, vec!["a"], presented));
        assert!(!host.is_ready());
        assert!(closed_with(&mut host).is_some());
    }
    // 1025 methods: refused at decode (item budget), no allocation beyond the frame.
    let names: Vec<String> = (0..1025).map(|i| format!("m{i}")).collect();
    let mut host = fresh();
    host.handle_bytes(&hello(
        PROTOCOL_VERSION,
        names.iter().map(String::as_str).collect(),
        Some(&token),
    ));
    assert!(!host.is_ready());
    // Duplicate / invalid / over-long names.
    for methods in [
        vec!["a", "a"],
        vec!["a b"],
        vec![&*"x".repeat(65)],
        vec![""],
    ] {
        let mut host = fresh();
        host.handle_bytes(&hello(PROTOCOL_VERSION, methods, Some(&token)));
        assert!(!host.is_ready());
    }
    // A Return before Hello, a huge prefix before Hello.
    let mut host = fresh();
    host.handle_bytes(&encode_frame(&forged_return(
        CallId::from_bytes([0; 16]),
        "a",
        b"",
    )));
    assert!(host.is_closed());
    let mut host = fresh();
    host.handle_bytes(&u32::MAX.to_le_bytes());
    assert!(host.is_closed());
    // The valid one works; anything after a refusal in the same read is ignored.
    let mut host = fresh();
    let mut wire = hello(PROTOCOL_VERSION + 1, vec!["a"], Some(&token));
    wire.extend(hello(PROTOCOL_VERSION, vec!["a"], Some(&token)));
    host.handle_bytes(&wire);
    assert!(!host.is_ready());
    assert_eq!(
        closed_with(&mut host),
        Some(CloseReason::Refused(RefuseReason::VersionMismatch))
    );
    let mut host = fresh();
    host.handle_bytes(&hello(PROTOCOL_VERSION, vec!["a"], Some(&token)));
    assert!(host.is_ready());
}

#[test]
fn long_method_names_never_reach_the_head_encoder() {
    // The head buffer of with_body holds a 64-byte name; a 65-byte one must be refused first.
    let mut pair = Pair::ready(&["echo"]);
    let long: &'static str = Box::leak("m".repeat(65).into_boxed_str());
    let deadline = pair.now + DEADLINE;
    assert_eq!(
        pair.host
            .begin_call(long, Bytes::new(), deadline, &mut pair.rng),
        Err(BeginCallError::InvalidMethodName)
    );
    // The longest legal name with a body whose length needs a 3-byte varint round-trips.
    let name: &'static str = Box::leak("m".repeat(MAX_METHOD_NAME).into_boxed_str());
    let mut pair = Pair::ready(&[name]);
    let body = Bytes::from(vec![0xabu8; 70_000]);
    let id = pair
        .host
        .begin_call(name, body.clone(), deadline, &mut pair.rng)
        .unwrap();
    pair.pump();
    let calls = pair.worker_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].0, calls[0].1.as_str(), &calls[0].2),
        (id, name, &body)
    );
}
