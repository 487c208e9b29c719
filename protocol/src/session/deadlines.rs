//! The host session's call deadlines, soonest first.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

use crate::CallId;

/// An entry: a call and the instant it is due.
pub(crate) type Due = (Instant, CallId);

/// Every pending call's deadline, soonest first, with entries checked against the call table
/// (`live`) as they come to the front.
///
/// Calls made with one timeout are due in the order they began, so an entry due no sooner
/// than the last one joins the back of a queue in order (`run`); any other goes to a min-heap
/// (`rest`). The soonest entry is the sooner of the two fronts.
///
/// A call that finishes leaves its entry behind, so finishing costs no search, and a call
/// whose deadline moves (to the end of its cancel grace) gets a second entry. An entry counts
/// only while `live` says its call is pending with that deadline. Stale entries are dropped
/// when they come to the front, and all at once when they would outnumber the live ones: the
/// two never hold more than twice the calls in flight plus [`SLACK`] entries, whatever order
/// calls finish in.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    run: VecDeque<Due>,
    rest: BinaryHeap<Reverse<Due>>,
}

/// Stale entries tolerated beyond twice the calls in flight before they are swept out.
const SLACK: usize = 64;

impl Deadlines {
    /// Adds `due`. `pending` is the number of calls in flight; `live` tells a pending call's
    /// entry from a stale one.
    pub(crate) fn push(&mut self, due: Due, pending: usize, live: impl Fn(&Due) -> bool) {
        if self.len() >= pending.saturating_mul(2).saturating_add(SLACK) {
            self.run.retain(&live);
            self.rest.retain(|Reverse(entry)| live(entry));
        }
        if self.run.back().is_none_or(|last| *last <= due) {
            self.run.push_back(due);
        } else {
            self.rest.push(Reverse(due));
        }
    }

    /// The soonest live entry, dropping the stale ones in front of it.
    pub(crate) fn first(&mut self, live: impl Fn(&Due) -> bool) -> Option<Due> {
        while self.run.front().is_some_and(|entry| !live(entry)) {
            self.run.pop_front();
        }
        while self.rest.peek().is_some_and(|Reverse(entry)| !live(entry)) {
            self.rest.pop();
        }
        self.soonest().map(|(entry, _)| entry)
    }

    /// Removes the soonest entry (the one [`first`](Self::first) returned).
    pub(crate) fn pop_first(&mut self) {
        match self.soonest() {
            Some((_, Front::Run)) => {
                self.run.pop_front();
            }
            Some((_, Front::Rest)) => {
                self.rest.pop();
            }
            None => {}
        }
    }

    /// The sooner of the two fronts, and which it is.
    fn soonest(&self) -> Option<(Due, Front)> {
        let run = self.run.front().map(|entry| (*entry, Front::Run));
        let rest = self.rest.peek().map(|Reverse(entry)| (*entry, Front::Rest));
        match (run, rest) {
            (Some(run), Some(rest)) => Some(if rest.0 < run.0 { rest } else { run }),
            (run, rest) => run.or(rest),
        }
    }

    /// Forgets every entry.
    pub(crate) fn clear(&mut self) {
        self.run.clear();
        self.rest.clear();
    }

    /// How many entries it holds, stale ones included.
    fn len(&self) -> usize {
        self.run.len() + self.rest.len()
    }
}

/// Where the soonest entry is.
#[derive(Clone, Copy)]
enum Front {
    Run,
    Rest,
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;

    fn id(n: u8) -> CallId {
        CallId::from_bytes([n; 16])
    }

    #[test]
    fn the_soonest_live_deadline_comes_first_and_stale_entries_are_skipped() {
        let t0 = Instant::now();
        let mut pending: HashMap<CallId, Instant> = HashMap::new();
        let mut deadlines = Deadlines::default();
        for (n, secs) in [(1, 3), (2, 1), (3, 2)] {
            let due = t0 + Duration::from_secs(secs);
            pending.insert(id(n), due);
            deadlines.push((due, id(n)), pending.len(), |_| true);
        }
        let live = |pending: &HashMap<CallId, Instant>| {
            let pending = pending.clone();
            move |(at, id): &Due| pending.get(id) == Some(at)
        };
        assert_eq!(
            deadlines.first(live(&pending)),
            Some((t0 + Duration::from_secs(1), id(2)))
        );
        // Call 2 finishes; call 3's deadline moves later (a second entry).
        pending.remove(&id(2));
        let moved = t0 + Duration::from_secs(5);
        pending.insert(id(3), moved);
        deadlines.push((moved, id(3)), pending.len(), live(&pending));
        assert_eq!(
            deadlines.first(live(&pending)),
            Some((t0 + Duration::from_secs(3), id(1)))
        );
        deadlines.pop_first();
        pending.remove(&id(1));
        assert_eq!(deadlines.first(live(&pending)), Some((moved, id(3))));
        pending.clear();
        assert_eq!(deadlines.first(live(&pending)), None);
        assert_eq!(deadlines.len(), 0, "stale entries in front were dropped");
    }

    #[test]
    fn deadlines_pushed_in_any_order_come_out_soonest_first() {
        let t0 = Instant::now();
        let order = [5u8, 1, 9, 3, 3, 7, 2, 8, 6, 4, 0];
        let mut deadlines = Deadlines::default();
        for (n, secs) in order.iter().enumerate() {
            let due = (t0 + Duration::from_secs(u64::from(*secs)), id(n as u8));
            deadlines.push(due, order.len(), |_| true);
        }
        let mut out = Vec::new();
        while let Some((at, _)) = deadlines.first(|_| true) {
            out.push(at.duration_since(t0).as_secs());
            deadlines.pop_first();
        }
        assert_eq!(out, [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn stale_entries_behind_a_long_call_never_pile_up() {
        // One call that stays pending with the soonest deadline keeps every later entry from
        // reaching the top: a million short calls behind it must not grow the heap.
        let t0 = Instant::now();
        let long = (t0, id(0));
        let mut deadlines = Deadlines::default();
        deadlines.push(long, 1, |_| true);
        let only_the_long_call = |due: &Due| *due == long;
        for n in 1..=1_000_000u32 {
            let mut bytes = [0u8; 16];
            bytes[..4].copy_from_slice(&n.to_le_bytes());
            let due = (
                t0 + Duration::from_nanos(u64::from(n)),
                CallId::from_bytes(bytes),
            );
            // Two calls pending while this one is begun; it finishes before the next.
            deadlines.push(due, 2, only_the_long_call);
            assert!(deadlines.len() <= 2 * 2 + SLACK + 1);
        }
        assert_eq!(deadlines.first(only_the_long_call), Some(long));
    }
}
