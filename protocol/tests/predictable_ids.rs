//! Predictable call ids, reproduced: with predictable ids and a host that tolerates
//! unsolicited frames, a worker can stage the answer to a *later* call. The test shows the
//! attack succeeding against such a host, then shows `HostSession` refusing the same frame.

mod support;

use std::collections::HashMap;

use airlock_protocol::frame::{decode_frame, encode_frame, Frame};
use airlock_protocol::*;
use bytes::Bytes;
use support::*;

/// The defective design: ids from a counter, and replies parked in a mailbox by id whether or
/// not a call with that id exists yet. A later call takes whatever is waiting in its slot.
struct MailboxHost {
    ids: CounterRng,
    mailbox: HashMap<CallId, Vec<u8>>,
}

impl MailboxHost {
    fn receive(&mut self, wire: &[u8]) {
        if let Ok(Frame::Return(ret)) = decode_frame(&wire[LENGTH_PREFIX..]) {
            self.mailbox.insert(ret.id, ret.body.to_vec());
        }
    }
    fn call(&mut self) -> (CallId, Option<Vec<u8>>) {
        let id = CallId::random(&mut self.ids);
        (id, self.mailbox.remove(&id))
    }
}

#[test]
fn staged_reply_for_next_predictable_id_is_refused() {
    let weak = CounterRng {
        nonce: 0x5eed,
        counter: 0,
    };

    // The hostile worker saw one id (its own call) and predicts the next one.
    let predicted = weak.predict_next();
    let staged = encode_frame(&forged_return(predicted, "echo", b"forged answer"));

    // 1. The attack is live against the defective design: the staged frame is consumed as the
    //    answer to the next, unrelated call, with no error.
    let mut naive = MailboxHost {
        ids: weak.clone(),
        mailbox: HashMap::new(),
    };
    naive.receive(&staged);
    let (victim, answer) = naive.call();
    assert_eq!(victim, predicted, "the worker predicted the victim's id");
    assert_eq!(
        answer.as_deref(),
        Some(&b"forged answer"[..]),
        "the forgery was delivered"
    );

    // 2. HostSession, even fed the very same weak id source, refuses it: the frame names an id
    //    no call holds yet, which is fatal, so the later call never meets it.
    let mut pair = Pair::ready(&["echo"]);
    let mut ids = weak.clone();
    assert_eq!(ids.predict_next(), predicted);
    pair.inject(&staged);
    assert_eq!(pair.violation(), Some(ViolationCode::UnknownCallId));
    let later = pair
        .host
        .begin_call("echo", Bytes::new(), pair.now + DEADLINE, &mut ids);
    assert_eq!(later, Err(BeginCallError::Closed));
    assert!(
        pair.outcomes().is_empty(),
        "no outcome carries the forged body"
    );

    // 3. And with the host's real id source the worker cannot even aim: the next id is not
    //    the predicted one.
    let mut pair = Pair::ready(&["echo"]);
    let real = pair.call("echo", b"");
    assert_ne!(real, predicted);
}
