//! Polling under load: once the loop has answered frames that came together (the host
//! pipelining calls) and has nothing left to do, a window through which it polls for the host's
//! next batch instead of sleeping, while batches keep coming soon after the loop goes idle.

use std::time::{Duration, Instant};

use airlock_protocol::spin::SpinPolicy;

/// How many batches in a row must each have come soon after the loop went idle before windows
/// open: a window only pays when the next batch comes while it is open, and one batch that
/// did says little. "Soon" is within the window when the loop spun through the wait (later,
/// the window closed empty), and within [`SLEPT_REACH`] windows when it slept through it, as
/// the time then includes its own wake-up. A batch that came later, or one the loop cannot
/// tell the wait of (it went idle last after frames that came alone), starts the count again.
/// So a host that sends calls in short bursts (a few rounds of calls, then a pause) pays at
/// most the window after each burst's last round, and none for bursts of two rounds, while
/// one that pipelines steadily keeps the windows opening.
const STREAK: u32 = 2;

/// How many windows after the loop went idle a batch may come, when the loop slept through
/// the wait, and still count towards [`STREAK`]: on the development VM a wake-up alone can
/// take most of a 50 µs window.
const SLEPT_REACH: u32 = 2;

/// The polling window's state. The loop calls [`frames_in`](Self::frames_in) and
/// [`turn`](Self::turn), which read the clock only while a batch or a window is under way, so a
/// worker called one call at a time pays nothing for it; the rest take the time, so the rules
/// can be checked without a clock.
pub(super) struct LoadPoll {
    window: Duration,
    /// Spins through an open window only while spinning measures to pay, as in the
    /// low-latency mode (on a contended CPU the spinning would take the host's time).
    policy: SpinPolicy,
    /// Frames came together since the loop last went idle: it opens a window when it does.
    batch: bool,
    /// When the loop went idle after a batch, until the next frame came.
    idle_since: Option<Instant>,
    /// Batches in a row, up to [`STREAK`], whose first frame came within a window of the
    /// loop going idle after the one before: windows open once it reaches [`STREAK`].
    streak: u32,
    /// The loop spun through the current wait (since it last went idle after a batch).
    spun: bool,
    /// The wait before the frames that came since the loop was last quiet was timed: a batch
    /// that comes without it (the loop went quiet last after a frame alone) starts the
    /// count again.
    timed: bool,
}

impl LoadPoll {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            policy: SpinPolicy::default(),
            batch: false,
            idle_since: None,
            streak: 0,
            spun: false,
            timed: false,
        }
    }

    /// Frames came in: `together` when the turn found more than one.
    pub(super) fn frames_in(&mut self, together: bool) {
        self.frames_in_with(together, Instant::now);
    }

    /// [`frames_in`](Self::frames_in), with the clock `now` read only if a wait is timed.
    fn frames_in_with(&mut self, together: bool, now: impl FnOnce() -> Instant) {
        let Some(since) = self.idle_since.take() else {
            // No wait to time: a batch the loop cannot judge starts the count again.
            if together && !self.timed {
                self.streak = 0;
            }
            self.batch |= together;
            return;
        };
        let now = now();
        let reach = if self.spun {
            self.window
        } else {
            self.window * SLEPT_REACH
        };
        self.streak = if now.saturating_duration_since(since) < reach {
            (self.streak + 1).min(STREAK)
        } else {
            0
        };
        self.timed = true;
        self.policy.arrived(now);
        self.batch |= together;
    }

    /// A turn of the loop, `quiet` when it has nothing left to do but wait for the host:
    /// whether to poll rather than sleep.
    pub(super) fn turn(&mut self, quiet: bool) -> bool {
        self.turn_with(quiet, Instant::now).unwrap_or(false)
    }

    /// [`turn`](Self::turn), with the clock `now` read only if needed: `None` when it was not.
    fn turn_with(&mut self, quiet: bool, now: impl FnOnce() -> Instant) -> Option<bool> {
        if quiet {
            self.timed = false;
        }
        let under_way = self.policy.window_open() || (quiet && self.batch);
        if !under_way {
            return None;
        }
        let now = now();
        if quiet {
            self.idle(now);
        }
        Some(self.spinning(now))
    }

    /// The loop has answered everything and has nothing to do but wait for the host: after a
    /// batch, the window opens now, if batches have been coming close enough together.
    fn idle(&mut self, now: Instant) {
        if !std::mem::take(&mut self.batch) {
            return;
        }
        self.idle_since = Some(now);
        self.spun = false;
        if self.streak >= STREAK {
            let end = now + self.window;
            self.policy.open(now, end, now);
        }
    }

    /// Whether to poll rather than sleep at `now`.
    fn spinning(&mut self, now: Instant) -> bool {
        let spinning = self.policy.spinning(now);
        self.spun |= spinning;
        spinning
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_micros(50);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    impl LoadPoll {
        /// [`LoadPoll::turn`] at `now`.
        fn turn_at(&mut self, now: Instant, quiet: bool) -> Option<bool> {
            self.turn_with(quiet, || now)
        }

        /// [`LoadPoll::frames_in`] at `now`.
        fn frames_in_at(&mut self, now: Instant, together: bool) {
            self.frames_in_with(together, || now);
        }
    }

    /// Frames together at `t`, answered and idle at `t + 5 µs`.
    fn batch_at(poll: &mut LoadPoll, t: Instant) -> Instant {
        poll.frames_in_at(t, true);
        let idle = t + us(5);
        poll.idle(idle);
        idle
    }

    #[test]
    fn a_frame_alone_never_opens_the_window() {
        let mut poll = LoadPoll::new(WINDOW);
        let t = Instant::now();
        for i in 0..10 {
            let at = t + us(100 * i);
            poll.frames_in_at(at, false);
            poll.idle(at + us(5));
            assert!(!poll.spinning(at + us(6)));
        }
    }

    #[test]
    fn frames_together_open_the_window_once_answered_and_it_closes() {
        let mut poll = LoadPoll::new(WINDOW);
        let (_, t) = batches(&mut poll, Instant::now(), 2, |_| us(20));
        poll.frames_in_at(t, true);
        // Still answering them (a handler running): no window yet.
        assert!(!poll.spinning(t + us(1)));
        poll.idle(t + us(40));
        assert!(poll.spinning(t + us(41)));
        assert!(poll.spinning(t + us(40) + WINDOW - us(1)));
        assert!(!poll.spinning(t + us(40) + WINDOW));
    }

    /// `n` batches from `t`, each coming `wait(spinning)` after the loop went idle after the
    /// one before; returns how many windows were spun through, and the time.
    fn batches(
        poll: &mut LoadPoll,
        mut t: Instant,
        n: u32,
        wait: impl Fn(bool) -> Duration,
    ) -> (u32, Instant) {
        let mut spun = 0;
        for _ in 0..n {
            let idle = batch_at(poll, t);
            let spinning = poll.spinning(idle + us(1));
            spun += u32::from(spinning);
            t = idle + wait(spinning);
        }
        (spun, t)
    }

    /// Bursts of `rounds` batches, each `within` after the loop went idle, `apart` between
    /// bursts; returns the windows opened after each round (by round), over `bursts` bursts.
    fn windows_in_bursts(rounds: usize, within: Duration, apart: Duration) -> Vec<u32> {
        let mut poll = LoadPoll::new(WINDOW);
        let mut t = Instant::now();
        let mut opened = vec![0; rounds];
        for _ in 0..100 {
            for round in &mut opened {
                let idle = batch_at(&mut poll, t);
                *round += u32::from(poll.spinning(idle + us(1)));
                t = idle + within;
            }
            t += apart;
        }
        opened
    }

    #[test]
    fn bursts_of_two_rounds_open_no_window() {
        let opened = windows_in_bursts(2, us(30), us(1000));
        assert_eq!(opened, [0, 0]);
    }

    #[test]
    fn bursts_of_more_rounds_pay_at_most_the_window_after_the_last() {
        // The window after round 3 catches round 4; the one after round 4 closes empty.
        let opened = windows_in_bursts(4, us(30), us(1000));
        assert_eq!(opened[..2], [0, 0]);
        assert!(opened[2] >= 98 && opened[3] >= 98, "{opened:?}");
    }

    #[test]
    fn a_batch_after_the_window_closed_starts_the_count_again() {
        // Batches that come just after the window closes: each window closes empty and starts
        // the count again, which waits slept through (a wake-up's reach) then rebuild.
        let opened = windows_in_bursts(1, WINDOW + us(20), Duration::ZERO);
        assert!(
            opened[0] <= 34,
            "{opened:?} windows of 100, each closing empty"
        );
        // Back to back after that, windows open again from the third batch.
        let mut poll = LoadPoll::new(WINDOW);
        let mut t = Instant::now();
        let mut spun = Vec::new();
        for _ in 0..5 {
            let idle = batch_at(&mut poll, t);
            spun.push(poll.spinning(idle + us(1)));
            t = idle + us(20);
        }
        assert_eq!(spun, [false, false, true, true, true]);
    }

    #[test]
    fn a_wake_up_longer_than_the_window_does_not_keep_the_windows_shut() {
        // A VM whose wake-ups take longer than the window: a slept-through wait ends after
        // it, a spun-through one well within it. Windows open for a fresh worker, and keep
        // opening across the waits the policy explores sleeping through.
        let mut poll = LoadPoll::new(WINDOW);
        let wait = |spinning| if spinning { us(20) } else { us(60) };
        let (spun, _) = batches(&mut poll, Instant::now(), 3200, wait);
        let slept = 2 + 3200 / SpinPolicy::EXPLORE;
        assert!(spun + slept >= 3200, "{spun} of 3200 windows spun");
    }

    #[test]
    fn a_batch_after_a_frame_alone_cannot_be_timed_and_starts_the_count_again() {
        // Bursts: calls together, then a call alone 20 µs after they are answered, then a
        // pause. The loop went quiet last after the call alone, so the next burst's batch
        // finds no wait timed: it must not count towards the streak.
        let mut poll = LoadPoll::new(WINDOW);
        let mut t = Instant::now();
        for burst in 0..50 {
            // The first frame, then the others already behind it (the loop's order).
            poll.frames_in_at(t, false);
            poll.frames_in_at(t, true);
            let spinning = poll.turn_at(t + us(5), true);
            assert_ne!(spinning, Some(true), "a window after burst {burst}'s batch");
            let alone = t + us(25);
            poll.frames_in_at(alone, false);
            let _ = poll.turn_at(alone + us(5), true);
            t = alone + us(1000);
        }
    }

    #[test]
    fn a_window_read_no_clock_once_closed() {
        let mut poll = LoadPoll::new(WINDOW);
        let (_, t) = batches(&mut poll, Instant::now(), 3, |_| us(20));
        assert!(poll.policy.window_open());
        assert!(!poll.spinning(t + WINDOW));
        assert!(
            !poll.policy.window_open(),
            "closed: the next turns need no clock"
        );
        // Quiet, with no batch and no window: the turn decides without the clock.
        assert_eq!(poll.turn_at(t + WINDOW, true), None);
        // A frame alone after the timed one: nothing to time, no clock.
        poll.frames_in_at(t + WINDOW, false);
        poll.frames_in_with(false, || panic!("the clock was read for a frame alone"));
    }

    #[test]
    fn where_spinning_delays_the_next_batch_nearly_every_window_sleeps() {
        // A contended machine: a spun-through wait ends later than a slept one.
        let mut poll = LoadPoll::new(WINDOW);
        let wait = |spinning| if spinning { us(40) } else { us(25) };
        let (spun, _) = batches(&mut poll, Instant::now(), 3200, wait);
        let most = SpinPolicy::EXPLORE + 3200 / SpinPolicy::EXPLORE;
        assert!(spun <= most, "{spun} windows spun, more than {most}");
    }

    #[test]
    fn batches_back_to_back_keep_the_windows_opening() {
        let mut poll = LoadPoll::new(WINDOW);
        // The first two batches only start the streak.
        let (_, t) = batches(&mut poll, Instant::now(), 2, |_| us(20));
        let (spun, _) = batches(&mut poll, t, 1000, |_| us(20));
        // All but the waits the policy explores sleeping in.
        let exploring = 1000 / SpinPolicy::EXPLORE;
        assert!(spun >= 1000 - exploring - 1, "{spun} of 1000 windows spun");
    }
}
