//! The host session's rules, one test each, driven through the pair simulator. Each hostile
//! frame is first shown to be the frame the attack needs (right id, or the id of a real call,
//! delivered to the host), then shown to be refused.

mod support;

use std::time::Duration;

use airlock_protocol::frame::{self, encode_frame, Frame};
use airlock_protocol::*;
use bytes::Bytes;
use support::*;

fn assert_fatal(pair: &Pair, code: ViolationCode) {
    assert_eq!(
        pair.violation(),
        Some(code),
        "events: {:?}",
        pair.host_events
    );
    assert!(pair.host.is_closed());
}

#[test]
fn call_round_trip_delivers_the_workers_body() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"ping");
    pair.pump();
    let calls = pair.worker_calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, id);
    assert_eq!(calls[0].1.as_str(), "echo");
    pair.worker
        .reply_return(id, Bytes::from_static(b"pong"))
        .unwrap();
    pair.pump();
    assert_eq!(
        pair.outcome_of(id),
        [Outcome::Returned(Bytes::from_static(b"pong"))]
    );
    assert!(pair.host.is_ready());
}

#[test]
fn frame_before_hello_is_fatal() {
    let mut pair = Pair::new(HostConfig::default(), &[]);
    let id = CallId::from_bytes([1; 16]);
    pair.inject_frame(&forged_return(id, "echo", b"x"));
    assert_fatal(&pair, ViolationCode::FrameBeforeHandshake);
}

#[test]
fn duplicate_hello_is_fatal() {
    let mut pair = Pair::ready(&["echo"]);
    let hello = Frame::Hello(frame::Hello {
        protocol: PROTOCOL_VERSION,
        worker_name: "again",
        worker_version: "1",
        methods: vec![],
        token: None,
    });
    pair.inject_frame(&hello);
    assert_fatal(&pair, ViolationCode::DuplicateHandshake);
}

fn hello_frame(protocol: u32, methods: Vec<&str>, token: Option<&[u8]>) -> Vec<u8> {
    encode_frame(&Frame::Hello(frame::Hello {
        protocol,
        worker_name: "w",
        worker_version: "1",
        methods,
        token,
    }))
}

/// The frames the host wrote, decoded (to see a `Refuse`).
fn host_frames(pair: &mut Pair) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| pair.host.poll_transmit().map(|t| t.to_vec())).collect()
}

#[test]
fn version_mismatch_is_refused_cleanly() {
    let mut pair = Pair::new(HostConfig::default(), &[]);
    pair.inject(&hello_frame(PROTOCOL_VERSION + 1, vec![], None));
    assert_eq!(
        pair.close_reason(),
        Some(CloseReason::Refused(RefuseReason::VersionMismatch))
    );
    let sent = host_frames(&mut pair);
    assert_eq!(sent.len(), 1);
    assert_eq!(
        decode_frame(&sent[0][4..]).unwrap(),
        Frame::Refuse(frame::Refuse {
            reason: RefuseReason::VersionMismatch,
            host_protocol: PROTOCOL_VERSION
        })
    );
}

#[test]
fn hello_without_the_expected_token_is_refused() {
    let token = [9u8; TOKEN_LEN];
    for presented in [None, Some(&[8u8; TOKEN_LEN][..])] {
        let mut pair = Pair::new(HostConfig::default().token(token), &[]);
        pair.inject(&hello_frame(PROTOCOL_VERSION, vec![], presented));
        assert_eq!(
            pair.close_reason(),
            Some(CloseReason::Refused(RefuseReason::BadToken))
        );
    }
    let mut pair = Pair::new(HostConfig::default().token(token), &[]);
    pair.inject(&hello_frame(PROTOCOL_VERSION, vec![], Some(&token)));
    assert!(pair.host.is_ready());
}

#[test]
fn invalid_hello_is_fatal() {
    let too_many: Vec<String> = (0..=frame::MAX_HELLO_METHODS)
        .map(|i| format!("m{i}"))
        .collect();
    let cases: Vec<(Vec<u8>, ViolationCode)> = vec![
        (
            hello_frame(PROTOCOL_VERSION, vec!["bad name"], None),
            ViolationCode::InvalidName,
        ),
        (
            hello_frame(PROTOCOL_VERSION, vec![""], None),
            ViolationCode::InvalidName,
        ),
        (
            hello_frame(PROTOCOL_VERSION, vec!["a", "a"], None),
            ViolationCode::InvalidHello,
        ),
        (
            hello_frame(PROTOCOL_VERSION, vec![], Some(&[1, 2, 3])),
            ViolationCode::InvalidHello,
        ),
        (
            hello_frame(
                PROTOCOL_VERSION,
                too_many.iter().map(String::as_str).collect(),
                None,
            ),
            ViolationCode::MalformedFrame, // over the header decoder's item budget
        ),
    ];
    for (bytes, code) in cases {
        let mut pair = Pair::new(HostConfig::default(), &[]);
        pair.inject(&bytes);
        assert_fatal(&pair, code);
    }
}

#[test]
fn reply_for_unknown_id_is_fatal() {
    let mut pair = Pair::ready(&["echo"]);
    let real = pair.call("echo", b"a");
    pair.pump();
    let forged = CallId::from_bytes([0xab; 16]);
    assert_ne!(forged, real);
    pair.inject_frame(&forged_return(forged, "echo", b"forged"));
    assert_fatal(&pair, ViolationCode::UnknownCallId);
    // The real call is not left hanging: it ends, lost with the violation.
    assert!(matches!(
        pair.outcome_of(real).as_slice(),
        [Outcome::Lost(CloseReason::Violation(v))] if v.code == ViolationCode::UnknownCallId
    ));
}

#[test]
fn reply_with_swapped_name_is_fatal() {
    let mut pair = Pair::ready(&["echo", "sum"]);
    let id = pair.call("echo", b"a");
    pair.pump();
    // Right id, wrong method: the attack a worker uses to answer one call with another's type.
    pair.inject_frame(&forged_return(id, "sum", b"\x05"));
    assert_fatal(&pair, ViolationCode::MethodMismatch);
    assert!(matches!(pair.outcome_of(id).as_slice(), [Outcome::Lost(_)]));
}

#[test]
fn second_terminal_frame_is_fatal() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"a");
    pair.pump();
    pair.worker
        .reply_return(id, Bytes::from_static(b"first"))
        .unwrap();
    pair.pump();
    assert_eq!(
        pair.outcome_of(id),
        [Outcome::Returned(Bytes::from_static(b"first"))]
    );
    pair.inject_frame(&forged_return(id, "echo", b"second"));
    assert_fatal(&pair, ViolationCode::FinishedCallId);
    // Still exactly one outcome for the call.
    assert_eq!(pair.outcome_of(id).len(), 1);
}

#[test]
fn progress_after_return_is_fatal() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"a");
    pair.pump();
    pair.worker.reply_return(id, Bytes::new()).unwrap();
    pair.pump();
    pair.inject_frame(&Frame::Progress(frame::Progress {
        id,
        method: "echo",
        body: b"late",
    }));
    assert_fatal(&pair, ViolationCode::FinishedCallId);
}

#[test]
fn replayed_return_from_earlier_call_is_fatal() {
    let mut pair = Pair::ready(&["echo"]);
    let first = pair.call("echo", b"one");
    pair.pump();
    pair.worker
        .reply_return(first, Bytes::from_static(b"one"))
        .unwrap();
    pair.pump();
    let second = pair.call("echo", b"two");
    pair.pump();
    // Replaying the first call's answer cannot answer the second.
    pair.inject_frame(&forged_return(first, "echo", b"one"));
    assert_fatal(&pair, ViolationCode::FinishedCallId);
    assert!(matches!(
        pair.outcome_of(second).as_slice(),
        [Outcome::Lost(_)]
    ));
}

#[test]
fn frame_staged_before_dispatch_is_fatal() {
    // The worker guesses the id of a call not yet made and stages its answer. Even had it
    // guessed right (see `predictable_ids`), the frame arrives while no call has that id.
    let mut pair = Pair::ready(&["echo"]);
    let mut peek = pair.rng.clone();
    let next = CallId::random(&mut peek); // the id the next dispatch will draw
    pair.inject_frame(&forged_return(next, "echo", b"staged"));
    assert_fatal(&pair, ViolationCode::UnknownCallId);
    let refused = pair
        .host
        .begin_call("echo", Bytes::new(), pair.now + DEADLINE, &mut pair.rng);
    assert_eq!(refused, Err(BeginCallError::Closed));
}

#[test]
fn echoed_call_frame_is_fatal() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"a");
    let echoed = pair.host.poll_transmit().unwrap().to_vec();
    pair.inject(&echoed);
    assert_fatal(&pair, ViolationCode::ForbiddenKind);
    assert!(matches!(pair.outcome_of(id).as_slice(), [Outcome::Lost(_)]));
}

#[test]
fn host_only_frames_from_worker_are_fatal() {
    let id = CallId::from_bytes([3; 16]);
    let frames = [
        Frame::Welcome(Welcome {
            max_frame: 1 << 20,
            max_in_flight: 1,
            max_progress_per_call: 1,
        }),
        Frame::Refuse(frame::Refuse {
            reason: RefuseReason::BadToken,
            host_protocol: 1,
        }),
        Frame::Cancel(frame::Cancel { id }),
        Frame::Shutdown(frame::Shutdown),
    ];
    for f in frames {
        let mut pair = Pair::ready(&[]);
        pair.inject_frame(&f);
        assert_fatal(&pair, ViolationCode::ForbiddenKind);
    }
}

#[test]
fn late_return_after_cancel_is_discarded_once() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"a");
    pair.pump();
    assert!(pair.host.cancel(id));
    assert!(!pair.host.cancel(id), "a second cancel is a no-op");
    pair.drain();
    assert_eq!(pair.outcome_of(id), [Outcome::Cancelled]);
    assert_eq!(
        pair.host.in_flight(),
        1,
        "the id stays reserved until the worker answers"
    );
    // The worker answered before it saw the Cancel: discarded, no second outcome.
    pair.worker
        .reply_return(id, Bytes::from_static(b"late"))
        .unwrap();
    pair.pump();
    assert_eq!(pair.outcome_of(id), [Outcome::Cancelled]);
    assert_eq!(pair.host.in_flight(), 0);
    assert!(pair.host.is_ready());
    // Any frame for it after that is a violation.
    pair.inject_frame(&forged_return(id, "echo", b"again"));
    assert_fatal(&pair, ViolationCode::FinishedCallId);
}

#[test]
fn progress_is_delivered_then_over_quota_is_fatal() {
    let config = HostConfig::default().max_progress_per_call(2);
    let mut pair = Pair::ready_with(config, &["job"]);
    let id = pair.call("job", b"");
    pair.pump();
    pair.worker
        .reply_progress(id, Bytes::from_static(b"1"))
        .unwrap();
    pair.worker
        .reply_progress(id, Bytes::from_static(b"2"))
        .unwrap();
    assert_eq!(
        pair.worker.reply_progress(id, Bytes::from_static(b"3")),
        Err(ReplyError::ProgressQuota { max: 2 }),
        "an honest worker stops at the quota"
    );
    pair.pump();
    let progress: Vec<_> = pair
        .host_events
        .iter()
        .filter(|e| matches!(e, Event::Progress { .. }))
        .collect();
    assert_eq!(progress.len(), 2);
    // A hostile one does not.
    pair.inject_frame(&Frame::Progress(frame::Progress {
        id,
        method: "job",
        body: b"3",
    }));
    assert_fatal(&pair, ViolationCode::ProgressOverQuota);
}

#[test]
fn invalid_error_descriptors_are_fatal() {
    let long = "x".repeat(MAX_ERROR_MESSAGE + 1);
    let cases: [(u8, &str); 4] = [
        (0, "\u{1b}[2J\u{1b}[31mfake host log line"),
        (0, "line one\nforged: second line"),
        (0, &long),
        (200, "an error kind the worker may not send"),
    ];
    for (kind, message) in cases {
        let mut pair = Pair::ready(&["echo"]);
        let id = pair.call("echo", b"");
        pair.pump();
        let fail = Frame::Fail(frame::Fail {
            id,
            method: "echo",
            kind,
            message,
            code: None,
        });
        pair.inject_frame(&fail);
        assert_fatal(&pair, ViolationCode::InvalidErrorDescriptor);
    }
}

#[test]
fn remote_failure_is_delivered_as_data() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    pair.pump();
    let err = RemoteError::new(ErrorKind::Handler, "bad\u{1b}input").with_code(7);
    assert_eq!(err.message(), "bad input", "the worker side sanitises");
    pair.worker.reply_fail(id, &err).unwrap();
    pair.pump();
    assert_eq!(pair.outcome_of(id), [Outcome::Failed(err)]);
}

#[test]
fn violation_fails_every_pending_call_and_closes() {
    let mut pair = Pair::ready(&["echo"]);
    let ids: Vec<CallId> = (0..5).map(|_| pair.call("echo", b"")).collect();
    pair.pump();
    pair.inject(&[0xff, 0xff, 0xff, 0xff]); // a length prefix over the cap
    assert_fatal(&pair, ViolationCode::FrameTooLarge);
    for id in &ids {
        assert!(matches!(
            pair.outcome_of(*id).as_slice(),
            [Outcome::Lost(CloseReason::Violation(_))]
        ));
    }
    // Closed is the last event, emitted once; nothing is accepted afterwards.
    assert!(matches!(pair.host_events.last(), Some(Event::Closed(_))));
    pair.worker.reply_return(ids[0], Bytes::new()).unwrap();
    pair.pump();
    assert_eq!(pair.outcomes().len(), 5);
    assert_eq!(
        pair.host_events
            .iter()
            .filter(|e| matches!(e, Event::Closed(_)))
            .count(),
        1
    );
}

#[test]
fn malformed_and_empty_frames_are_fatal() {
    let mut pair = Pair::ready(&[]);
    pair.inject(&[2, 0, 0, 0, 42, 0]); // kind tag 42 does not exist
    assert_fatal(&pair, ViolationCode::MalformedFrame);
    let mut pair = Pair::ready(&[]);
    pair.inject(&[0, 0, 0, 0]);
    assert_fatal(&pair, ViolationCode::EmptyFrame);
}

#[test]
fn end_of_stream_inside_a_frame_is_fatal() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    pair.inject(&[10, 0, 0, 0, 6]); // promises 10 bytes, delivers 1
    pair.host.handle_eof();
    pair.drain();
    assert_fatal(&pair, ViolationCode::TruncatedFrame);
    assert!(matches!(pair.outcome_of(id).as_slice(), [Outcome::Lost(_)]));
}

#[test]
fn end_of_stream_with_calls_pending_loses_them() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    pair.host.handle_eof();
    pair.drain();
    assert_eq!(pair.close_reason(), Some(CloseReason::WorkerClosed));
    assert_eq!(
        pair.outcome_of(id),
        [Outcome::Lost(CloseReason::WorkerClosed)]
    );
}

/// A pair past its handshake whose host has `grace` as its cancel grace.
fn ready_with_grace(grace: Duration) -> Pair {
    let config = HostConfig::default().cancel_grace(grace).unwrap();
    Pair::ready_with(config, &["echo"])
}

fn worker_saw_cancel_for(pair: &Pair, id: CallId) -> bool {
    pair.worker_events
        .iter()
        .any(|e| matches!(e, WorkerEvent::Cancel { id: c } if *c == id))
}

#[test]
fn a_call_past_its_deadline_times_out_at_once_and_is_cancelled_on_the_worker() {
    let mut pair = ready_with_grace(Duration::from_secs(1));
    let early = pair.call_with_deadline("echo", b"", pair.now + Duration::from_secs(1));
    let late = pair.call("echo", b"");
    pair.pump();
    assert_eq!(
        pair.host.poll_timeout(),
        Some(pair.now + Duration::from_secs(1))
    );
    pair.host
        .handle_timeout(pair.now + Duration::from_millis(999));
    pair.drain();
    assert!(pair.outcomes().is_empty(), "nothing expires early");
    pair.host.handle_timeout(pair.now + Duration::from_secs(1));
    pair.pump();
    assert_eq!(pair.outcome_of(early), [Outcome::TimedOut]);
    assert!(
        worker_saw_cancel_for(&pair, early),
        "{:?}",
        pair.worker_events
    );
    assert!(pair.host.is_ready(), "the worker keeps its other calls");
    assert_eq!(
        pair.host.poll_timeout(),
        Some(pair.now + Duration::from_secs(2)),
        "the grace ends one second after the deadline"
    );
    // The worker honours the cancel: its answer is discarded, the id is finished, and the
    // call beside it completes normally.
    pair.worker
        .reply_fail(
            early,
            &airlock_protocol::RemoteError::new(airlock_protocol::ErrorKind::Cancelled, "stop"),
        )
        .unwrap();
    pair.worker
        .reply_return(late, Bytes::from_static(b"fine"))
        .unwrap();
    pair.pump();
    assert_eq!(pair.outcome_of(early), [Outcome::TimedOut]);
    assert_eq!(
        pair.outcome_of(late),
        [Outcome::Returned(Bytes::from_static(b"fine"))]
    );
    pair.host.handle_timeout(pair.now + Duration::from_secs(5));
    pair.drain();
    assert_eq!(pair.close_reason(), None);
    assert_eq!(pair.host.in_flight(), 0);
}

#[test]
fn a_handler_still_running_when_the_grace_ends_closes_the_session() {
    let mut pair = ready_with_grace(Duration::from_secs(1));
    let early = pair.call_with_deadline("echo", b"", pair.now + Duration::from_secs(1));
    let late = pair.call("echo", b"");
    pair.host.handle_timeout(pair.now + Duration::from_secs(1));
    pair.pump();
    assert_eq!(pair.outcome_of(early), [Outcome::TimedOut]);
    pair.host
        .handle_timeout(pair.now + Duration::from_millis(1999));
    pair.drain();
    assert_eq!(pair.close_reason(), None, "the grace is not over yet");
    pair.host.handle_timeout(pair.now + Duration::from_secs(2));
    pair.drain();
    assert_eq!(
        pair.outcome_of(early),
        [Outcome::TimedOut],
        "one outcome only"
    );
    assert_eq!(
        pair.outcome_of(late),
        [Outcome::Lost(CloseReason::CallTimeout)]
    );
    assert_eq!(pair.close_reason(), Some(CloseReason::CallTimeout));
    assert_eq!(pair.host.poll_timeout(), None);
}

#[test]
fn zero_grace_closes_the_session_at_the_deadline() {
    let mut pair = ready_with_grace(Duration::ZERO);
    let early = pair.call_with_deadline("echo", b"", pair.now + Duration::from_secs(1));
    let late = pair.call("echo", b"");
    pair.host.handle_timeout(pair.now + Duration::from_secs(1));
    pair.drain();
    assert_eq!(pair.outcome_of(early), [Outcome::TimedOut]);
    assert_eq!(
        pair.outcome_of(late),
        [Outcome::Lost(CloseReason::CallTimeout)]
    );
    assert_eq!(pair.close_reason(), Some(CloseReason::CallTimeout));
}

#[test]
fn cancelled_call_never_answered_times_out_after_its_deadline_and_the_grace() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    pair.host.cancel(id);
    pair.host.handle_timeout(pair.now + DEADLINE);
    pair.drain();
    assert_eq!(
        pair.close_reason(),
        None,
        "the grace runs from the deadline"
    );
    pair.host
        .handle_timeout(pair.now + DEADLINE + airlock_protocol::DEFAULT_CANCEL_GRACE);
    pair.drain();
    // One outcome (Cancelled) for the call; the session ends because the worker ignored it.
    assert_eq!(pair.outcome_of(id), [Outcome::Cancelled]);
    assert_eq!(pair.close_reason(), Some(CloseReason::CallTimeout));
}

#[test]
fn handshake_deadline_closes_the_session() {
    let config = HostConfig::default()
        .handshake_timeout(Duration::from_secs(2))
        .unwrap();
    let mut pair = Pair::new(config, &[]);
    assert_eq!(
        pair.host.poll_timeout(),
        Some(pair.now + Duration::from_secs(2))
    );
    pair.host.handle_timeout(pair.now + Duration::from_secs(2));
    pair.drain();
    assert_eq!(pair.close_reason(), Some(CloseReason::HandshakeTimeout));
}

#[test]
fn in_flight_limit_counts_cancelled_calls() {
    let config = HostConfig::default().max_in_flight(2).unwrap();
    let mut pair = Pair::ready_with(config, &["echo"]);
    let a = pair.call("echo", b"");
    pair.call("echo", b"");
    pair.host.cancel(a);
    let refused = pair
        .host
        .begin_call("echo", Bytes::new(), pair.now + DEADLINE, &mut pair.rng);
    assert_eq!(refused, Err(BeginCallError::Overloaded { max: 2 }));
}

#[test]
fn begin_call_refuses_locally_without_sending() {
    let mut pair = Pair::new(
        HostConfig::default().max_frame(MIN_MAX_FRAME).unwrap(),
        &["echo"],
    );
    let early = pair
        .host
        .begin_call("echo", Bytes::new(), pair.now + DEADLINE, &mut pair.rng);
    assert_eq!(early, Err(BeginCallError::NotReady));
    pair.pump();
    let bad = pair.host.begin_call(
        "no spaces",
        Bytes::new(),
        pair.now + DEADLINE,
        &mut pair.rng,
    );
    assert_eq!(bad, Err(BeginCallError::InvalidMethodName));
    let big = Bytes::from(vec![0; MIN_MAX_FRAME as usize]);
    let too_big = pair
        .host
        .begin_call("echo", big, pair.now + DEADLINE, &mut pair.rng);
    assert!(matches!(too_big, Err(BeginCallError::TooLarge { .. })));
    assert!(pair.host.poll_transmit().is_none());
    assert_eq!(pair.host.in_flight(), 0);
}

#[test]
fn graceful_shutdown_lets_pending_calls_finish() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"x");
    pair.host.shutdown();
    assert_eq!(
        pair.host
            .begin_call("echo", Bytes::new(), pair.now + DEADLINE, &mut pair.rng),
        Err(BeginCallError::Closed)
    );
    pair.pump();
    assert!(pair.worker_events.contains(&WorkerEvent::Shutdown));
    assert!(!pair.worker.is_drained());
    pair.worker
        .reply_return(id, Bytes::from_static(b"x"))
        .unwrap();
    pair.pump();
    assert!(pair.worker.is_drained());
    pair.host.handle_eof();
    pair.drain();
    assert_eq!(
        pair.outcome_of(id),
        [Outcome::Returned(Bytes::from_static(b"x"))]
    );
    assert_eq!(pair.close_reason(), Some(CloseReason::Shutdown));
}

#[test]
fn abort_loses_pending_calls_with_the_reason() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    let reason = CloseReason::Aborted(AbortReason::UndecodableResponse);
    pair.host.abort(reason.clone());
    pair.drain();
    assert_eq!(pair.outcome_of(id), [Outcome::Lost(reason.clone())]);
    assert_eq!(pair.close_reason(), Some(reason));
}

#[test]
fn frames_dribbled_one_byte_at_a_time_are_reassembled() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    pair.pump();
    let bytes = encode_frame(&forged_return(id, "echo", b"slow but valid"));
    for b in bytes {
        pair.inject(&[b]);
    }
    assert_eq!(
        pair.outcome_of(id),
        [Outcome::Returned(Bytes::from_static(b"slow but valid"))]
    );
}

#[test]
fn returned_body_shares_the_frame_buffer() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    pair.pump();
    let payload = Bytes::from(encode_frame(&forged_return(id, "echo", &[7u8; 1000]))).slice(4..);
    let range = payload.as_ptr_range();
    pair.host.handle_frame(payload);
    pair.drain();
    let outcomes = pair.outcome_of(id);
    let [Outcome::Returned(body)] = outcomes.as_slice() else {
        panic!("expected a return, got {outcomes:?}");
    };
    assert!(range.contains(&body.as_ptr()), "the body was copied");
}

#[test]
fn future_hello_layout_of_another_version_is_refused_cleanly() {
    // A v2 Hello with a field v1 does not know: it would not decode as a v1 Hello at all.
    let mut payload = vec![0u8];
    payload.push((PROTOCOL_VERSION + 1) as u8);
    payload.extend_from_slice(&[0xff; 40]);
    assert!(
        decode_frame(&payload).is_err(),
        "the attack is live: v1 cannot decode it"
    );
    let mut wire = (payload.len() as u32).to_le_bytes().to_vec();
    wire.extend_from_slice(&payload);
    let mut pair = Pair::new(HostConfig::default(), &[]);
    pair.inject(&wire);
    assert_eq!(
        pair.close_reason(),
        Some(CloseReason::Refused(RefuseReason::VersionMismatch))
    );
    let sent = host_frames(&mut pair);
    assert!(matches!(decode_frame(&sent[0][4..]), Ok(Frame::Refuse(_))));
}
