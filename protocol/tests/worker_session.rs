//! The worker session: host frames validated (defence in depth), and exactly one terminal
//! frame per received call enforced on the worker runtime.

mod support;

use airlock_protocol::frame::{self, encode_frame, Frame};
use airlock_protocol::*;
use bytes::Bytes;
use support::*;

fn worker_closed_with(pair: &Pair) -> Option<CloseReason> {
    pair.worker_events.iter().find_map(|e| match e {
        WorkerEvent::Closed(r) => Some(r.clone()),
        _ => None,
    })
}

fn worker_violation(pair: &Pair) -> Option<ViolationCode> {
    match worker_closed_with(pair)? {
        CloseReason::Violation(v) => Some(v.code),
        _ => None,
    }
}

#[test]
fn exactly_one_terminal_reply_per_call() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    pair.pump();
    pair.worker
        .reply_progress(id, Bytes::from_static(b"half"))
        .unwrap();
    pair.worker.reply_return(id, Bytes::new()).unwrap();
    assert_eq!(
        pair.worker.reply_return(id, Bytes::new()),
        Err(ReplyError::NoSuchCall)
    );
    let err = RemoteError::new(ErrorKind::Internal, "late");
    assert_eq!(
        pair.worker.reply_fail(id, &err),
        Err(ReplyError::NoSuchCall)
    );
    assert_eq!(
        pair.worker.reply_progress(id, Bytes::new()),
        Err(ReplyError::NoSuchCall)
    );
    pair.pump();
    assert!(pair.host.is_ready());
    assert_eq!(pair.outcome_of(id).len(), 1);
}

#[test]
fn replies_to_ids_never_received_are_refused() {
    let mut pair = Pair::ready(&["echo"]);
    let id = CallId::from_bytes([1; 16]);
    assert_eq!(
        pair.worker.reply_return(id, Bytes::new()),
        Err(ReplyError::NoSuchCall)
    );
}

#[test]
fn reply_over_max_frame_is_refused_locally() {
    let config = HostConfig::default().max_frame(MIN_MAX_FRAME).unwrap();
    let mut pair = Pair::ready_with(config, &["echo"]);
    let id = pair.call("echo", b"");
    pair.pump();
    let big = Bytes::from(vec![0; MIN_MAX_FRAME as usize]);
    assert!(matches!(
        pair.worker.reply_return(id, big),
        Err(ReplyError::TooLarge { .. })
    ));
    pair.worker.reply_return(id, Bytes::new()).unwrap();
}

#[test]
fn call_before_welcome_is_fatal() {
    let mut pair = Pair::new(HostConfig::default(), &["echo"]);
    let call = encode_frame(&Frame::Call(frame::Call {
        id: CallId::from_bytes([2; 16]),
        method: "echo",
        body: b"",
    }));
    pair.worker.handle_bytes(&call);
    pair.drain();
    assert_eq!(
        worker_violation(&pair),
        Some(ViolationCode::FrameBeforeHandshake)
    );
}

#[test]
fn refuse_closes_the_worker_with_the_reason() {
    let mut pair = Pair::new(HostConfig::default(), &[]);
    let refuse = encode_frame(&Frame::Refuse(frame::Refuse {
        reason: RefuseReason::BadToken,
        host_protocol: 1,
    }));
    pair.worker.handle_bytes(&refuse);
    pair.drain();
    assert_eq!(
        worker_closed_with(&pair),
        Some(CloseReason::Refused(RefuseReason::BadToken))
    );
}

#[test]
fn duplicate_call_id_is_fatal() {
    let mut pair = Pair::ready(&["echo"]);
    let call = encode_frame(&Frame::Call(frame::Call {
        id: CallId::from_bytes([5; 16]),
        method: "echo",
        body: b"",
    }));
    pair.worker.handle_bytes(&call);
    pair.worker.handle_bytes(&call);
    pair.drain();
    assert_eq!(
        worker_violation(&pair),
        Some(ViolationCode::DuplicateCallId)
    );
}

#[test]
fn worker_only_frames_from_host_are_fatal() {
    let id = CallId::from_bytes([4; 16]);
    let frames = [
        Frame::Return(frame::Return {
            id,
            method: "echo",
            body: b"",
        }),
        Frame::Progress(frame::Progress {
            id,
            method: "echo",
            body: b"",
        }),
        Frame::Hello(frame::Hello {
            protocol: 1,
            worker_name: "h",
            worker_version: "1",
            methods: vec![],
            token: None,
        }),
    ];
    for f in frames {
        let mut pair = Pair::ready(&["echo"]);
        pair.worker.handle_bytes(&encode_frame(&f));
        pair.drain();
        assert_eq!(worker_violation(&pair), Some(ViolationCode::ForbiddenKind));
    }
}

#[test]
fn cancel_crossing_the_answer_is_ignored_but_unknown_cancel_is_fatal() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    pair.pump();
    pair.worker.reply_return(id, Bytes::new()).unwrap();
    pair.worker
        .handle_bytes(&encode_frame(&Frame::Cancel(frame::Cancel { id })));
    pair.drain();
    assert_eq!(worker_closed_with(&pair), None);
    pair.worker
        .handle_bytes(&encode_frame(&Frame::Cancel(frame::Cancel {
            id: CallId::from_bytes([9; 16]),
        })));
    pair.drain();
    assert_eq!(worker_violation(&pair), Some(ViolationCode::UnknownCallId));
}

#[test]
fn cancel_reaches_the_worker_runtime() {
    let mut pair = Pair::ready(&["echo"]);
    let id = pair.call("echo", b"");
    pair.pump();
    pair.host.cancel(id);
    pair.pump();
    assert!(pair.worker_events.contains(&WorkerEvent::Cancel { id }));
    // The worker still answers exactly once; the host discards it.
    pair.worker
        .reply_fail(id, &RemoteError::new(ErrorKind::Cancelled, "stopped"))
        .unwrap();
    pair.pump();
    assert_eq!(pair.outcome_of(id), [Outcome::Cancelled]);
    assert_eq!(pair.host.in_flight(), 0);
}

#[test]
fn too_many_calls_is_fatal_for_the_worker() {
    let config = HostConfig::default().max_in_flight(1).unwrap();
    let mut pair = Pair::ready_with(config, &["echo"]);
    for byte in [1u8, 2] {
        let call = encode_frame(&Frame::Call(frame::Call {
            id: CallId::from_bytes([byte; 16]),
            method: "echo",
            body: b"",
        }));
        pair.worker.handle_bytes(&call);
    }
    pair.drain();
    assert_eq!(worker_violation(&pair), Some(ViolationCode::TooManyCalls));
}

#[test]
fn call_after_shutdown_is_fatal_for_the_worker() {
    let mut pair = Pair::ready(&["echo"]);
    pair.worker
        .handle_bytes(&encode_frame(&Frame::Shutdown(frame::Shutdown)));
    let call = encode_frame(&Frame::Call(frame::Call {
        id: CallId::from_bytes([1; 16]),
        method: "echo",
        body: b"",
    }));
    pair.worker.handle_bytes(&call);
    pair.drain();
    assert_eq!(worker_violation(&pair), Some(ViolationCode::ForbiddenKind));
}

#[test]
fn welcome_with_out_of_range_limits_is_fatal_for_the_worker() {
    for (max_frame, max_in_flight) in [
        (0, 1),
        (MIN_MAX_FRAME, 0),
        (MIN_MAX_FRAME, MAX_IN_FLIGHT + 1),
    ] {
        let mut pair = Pair::new(HostConfig::default(), &[]);
        let welcome = Frame::Welcome(Welcome {
            max_frame,
            max_in_flight,
            max_progress_per_call: 1,
        });
        pair.worker.handle_bytes(&encode_frame(&welcome));
        pair.drain();
        assert_eq!(worker_violation(&pair), Some(ViolationCode::InvalidWelcome));
    }
}
