//! The host session's deadlines against a model that scans every pending call: calls begun
//! with deadlines in any order, answered in any order (time fed before frames, as the host's
//! reader does), cancelled, timed out, and killed at the end of their cancel grace.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use airlock_protocol::*;
use bytes::Bytes;
use support::*;

/// What the model knows of a pending call.
#[derive(Clone, Copy, Debug)]
struct Pending {
    deadline: Instant,
    overdue: bool,
    cancelled: bool,
}

/// A deterministic stream of numbers below `n` (xorshift).
fn numbers(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}

#[test]
fn host_session_deadlines_match_a_model_that_scans_every_call() {
    let mut rnd = numbers(0xdead_beef_1234_5678);
    for round in 0..24 {
        let grace = Duration::from_millis([0, 1, 5, 50, 500, 5000][round % 6]);
        let config = HostConfig::default().cancel_grace(grace).unwrap();
        let mut pair = Pair::ready_with(config, &["echo"]);
        let t0 = pair.now;
        let mut clock = 0u64;
        let mut model: HashMap<CallId, Pending> = HashMap::new();
        let mut expected: Vec<(CallId, Outcome)> = Vec::new();
        let mut closed = false;
        for _ in 0..5000 {
            let now = t0 + Duration::from_millis(clock);
            match rnd(11) {
                // Begin a call: mostly one timeout (in order), some sooner or later.
                0..=4 if model.len() < 200 => {
                    let span = match rnd(5) {
                        0 => rnd(2000),
                        1 => 1,
                        _ => 100,
                    };
                    let deadline = now + Duration::from_millis(span);
                    let id = pair
                        .host
                        .begin_call("echo", Bytes::from_static(b"x"), deadline, &mut pair.rng)
                        .unwrap();
                    let pending = Pending {
                        deadline,
                        overdue: false,
                        cancelled: false,
                    };
                    model.insert(id, pending);
                }
                // The worker answers a call, overdue ones first where there are any.
                5 | 6 => {
                    let overdue = model.iter().find(|(_, m)| m.overdue).map(|(id, _)| *id);
                    let pick = if overdue.is_some() && rnd(4) != 0 {
                        overdue
                    } else {
                        let at = rnd(model.len() as u64 + 1) as usize;
                        model.keys().nth(at).copied()
                    };
                    let Some(id) = pick else { continue };
                    // Time before frames.
                    if pair.host.poll_timeout().is_some_and(|at| at <= now) {
                        pair.host.handle_timeout(now);
                        closed |= expire(&mut model, &mut expected, now, grace);
                    }
                    if closed {
                        break;
                    }
                    let pending = model.remove(&id).unwrap();
                    pair.inject_frame(&forged_return(id, "echo", b"ok"));
                    if !pending.cancelled && !pending.overdue {
                        assert!(pending.deadline > now, "a call past its deadline got Ok");
                        expected.push((id, Outcome::Returned(Bytes::from_static(b"ok"))));
                    }
                }
                7 => {
                    let at = rnd(model.len() as u64 + 1) as usize;
                    if let Some(id) = model.keys().nth(at).copied() {
                        let pending = model.get_mut(&id).unwrap();
                        assert_eq!(pair.host.cancel(id), !pending.cancelled);
                        if !pending.cancelled {
                            pending.cancelled = true;
                            expected.push((id, Outcome::Cancelled));
                        }
                    }
                }
                8 => clock += rnd(25),
                _ => {
                    if pair.host.poll_timeout().is_some_and(|at| at <= now) {
                        pair.host.handle_timeout(now);
                        closed |= expire(&mut model, &mut expected, now, grace);
                    }
                }
            }
            while pair.host.poll_transmit().is_some() {}
            pair.drain();
            if closed {
                break;
            }
            let soonest = model.values().map(|m| m.deadline).min();
            assert_eq!(pair.host.poll_timeout(), soonest, "round {round}");
            assert_eq!(pair.outcomes(), expected, "round {round}");
        }
        pair.drain();
        let reason = closed.then_some(CloseReason::CallTimeout);
        assert_eq!(pair.close_reason(), reason, "round {round}");
        if closed {
            // The step that closed the session: what the model expects, then every call it
            // still holds that was not cancelled, lost with the session.
            let outcomes = pair.outcomes();
            let (before, after) = outcomes.split_at(expected.len().min(outcomes.len()));
            assert_eq!(
                before,
                &expected[..],
                "round {round}: outcomes through the close"
            );
            let mut lost: Vec<CallId> = after
                .iter()
                .map(|(id, outcome)| {
                    let want = Outcome::Lost(CloseReason::CallTimeout);
                    assert_eq!(outcome, &want, "round {round}: after the close");
                    *id
                })
                .collect();
            let mut held: Vec<CallId> = model
                .iter()
                .filter(|(_, pending)| !pending.cancelled)
                .map(|(id, _)| *id)
                .collect();
            lost.sort();
            held.sort();
            assert_eq!(lost, held, "round {round}: the calls lost at the close");
        }
    }
}

/// The model's `handle_timeout`: calls past their deadline time out (once) and get the grace;
/// true if one was past its grace, which closes the session.
fn expire(
    model: &mut HashMap<CallId, Pending>,
    expected: &mut Vec<(CallId, Outcome)>,
    now: Instant,
    grace: Duration,
) -> bool {
    let mut past_grace = false;
    loop {
        let soonest = model.iter().map(|(id, m)| (m.deadline, *id)).min();
        let Some((deadline, id)) = soonest.filter(|(deadline, _)| *deadline <= now) else {
            return past_grace;
        };
        let pending = model.get_mut(&id).unwrap();
        if pending.overdue {
            past_grace = true;
            pending.deadline = now + Duration::from_secs(1_000_000);
            continue;
        }
        if !pending.cancelled {
            pending.cancelled = true;
            expected.push((id, Outcome::TimedOut));
        }
        pending.overdue = true;
        pending.deadline = deadline + grace;
    }
}
