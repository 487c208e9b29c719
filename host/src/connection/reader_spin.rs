//! The reader's side of the low-latency mode (`HostBuilder::low_latency`): whether a turn of
//! the reader's loop spins, sleeps, or sleeps until the next call grants a window.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use airlock_protocol::spin::SpinPolicy;

use super::Live;

/// What the reader does this turn of its loop, in the low-latency mode.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// Poll again instead of sleeping.
    Spin,
    /// Sleep until a frame comes.
    Sleep,
    /// Sleep until a frame comes or a call grants a window (`Live::grant_wake`).
    SleepUntilGranted,
    /// A call granted a window while the reader decided: decide again.
    LookAgain,
}

/// The reader's side of the low-latency mode: the windows callers grant, spun through where
/// [`SpinPolicy`] finds that spinning pays, as the worker's frames come in.
pub(super) struct ReaderSpin {
    window: Duration,
    policy: SpinPolicy,
    /// The latest grant seen, as [`Live::granted_until`] gives it.
    seen: u64,
}

impl ReaderSpin {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            policy: SpinPolicy::default(),
            seen: 0,
        }
    }

    /// Adopts a window granted since the last look (it began when its call did), at `now`.
    fn observe(&mut self, live: &Live, now: Instant) {
        let granted = live.granted_until();
        if granted > self.seen {
            self.seen = granted;
            let end = live.epoch + Duration::from_nanos(granted);
            let at = end.checked_sub(self.window).unwrap_or(end);
            self.policy.open(at, end, now);
        }
    }

    /// This turn of the reader's loop: a look at the windows granted, then what follows.
    pub(super) fn turn(&mut self, live: &Live) -> Turn {
        let now = Instant::now();
        self.observe(live, now);
        let spinning = self.policy.spinning(now);
        self.after_look(live, spinning)
    }

    /// What follows a look that found the reader `spinning` or not. Asleep but willing to
    /// spin, the reader is woken by the next call's grant. A grant made after the look but
    /// before the flag is stored did not see the flag: look again. One made after it either
    /// stores a permit in the `Notify` or wakes the wait; a stale permit costs one more turn.
    fn after_look(&self, live: &Live, spinning: bool) -> Turn {
        let awaits_grant = !spinning && self.policy.would_spin();
        live.reader_awaits_grant
            .store(awaits_grant, Ordering::SeqCst);
        match (spinning, awaits_grant) {
            (true, _) => Turn::Spin,
            (false, true) if live.granted_until() > self.seen => Turn::LookAgain,
            (false, true) => Turn::SleepUntilGranted,
            (false, false) => Turn::Sleep,
        }
    }

    /// A frame came in: the wait for it is measured.
    pub(super) fn frame_in(&mut self, live: &Live) {
        let now = Instant::now();
        self.observe(live, now);
        self.policy.arrived(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::wire::now_or_never;

    const WINDOW: Duration = Duration::from_millis(1);

    #[test]
    fn a_grant_made_between_the_readers_look_and_its_flag_sends_it_round_again() {
        let live = Live::new(Some(WINDOW));
        let mut spin = ReaderSpin::new(WINDOW);
        // The look: no window yet, so no spinning (nothing measured yet: it would spin).
        let now = Instant::now();
        spin.observe(&live, now);
        assert!(!spin.policy.spinning(now));
        // A caller's grant lands before the flag is stored: no wake is sent.
        live.grant_spin();
        assert!(now_or_never(live.grant_wake.notified()).is_none());
        assert_eq!(spin.after_look(&live, false), Turn::LookAgain);
        assert_eq!(
            spin.turn(&live),
            Turn::Spin,
            "and the next turn spins through it"
        );
    }

    #[test]
    fn a_grant_made_after_the_reader_flags_that_it_sleeps_wakes_it() {
        let live = Live::new(Some(WINDOW));
        let mut spin = ReaderSpin::new(WINDOW);
        assert_eq!(spin.turn(&live), Turn::SleepUntilGranted);
        live.grant_spin();
        // The wait the reader is about to enter (or is in) completes.
        assert!(now_or_never(live.grant_wake.notified()).is_some());
        assert!(
            !live.reader_awaits_grant.load(Ordering::SeqCst),
            "one wake per sleep"
        );
        live.grant_spin();
        assert!(
            now_or_never(live.grant_wake.notified()).is_none(),
            "no stale permit piles up"
        );
    }

    #[test]
    fn with_the_mode_off_a_call_neither_grants_nor_wakes() {
        let live = Live::new(None);
        live.reader_awaits_grant.store(true, Ordering::SeqCst);
        live.grant_spin();
        assert_eq!(live.granted_until(), 0);
        assert!(now_or_never(live.grant_wake.notified()).is_none());
    }
}
