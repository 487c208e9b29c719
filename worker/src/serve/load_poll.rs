//! Polling under load: once the loop has answered frames that came together (the host
//! pipelining calls) and has nothing left to do, a window through which it polls for the host's
//! next batch instead of sleeping, while batches keep coming within a window of each other.

use std::time::{Duration, Instant};

use airlock_protocol::spin::SpinPolicy;

/// How many batches in a row must each have come within a window of the loop going idle
/// before windows open: a window only pays when the next batch comes while it is open, and
/// one batch that did says little. A batch that came later (the window, if one was open,
/// closed empty) starts the count again. So a host that sends calls in short bursts (a few
/// rounds of calls, then a pause) pays at most the window after each burst's last round, and
/// none for bursts of two rounds, while one that pipelines steadily keeps the windows opening.
const STREAK: u32 = 2;

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
    /// The open window's end, until [`spinning`](Self::spinning) finds it past.
    open_until: Option<Instant>,
}

impl LoadPoll {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            policy: SpinPolicy::default(),
            batch: false,
            idle_since: None,
            streak: 0,
            open_until: None,
        }
    }

    /// Frames came in: `together` when the turn found more than one.
    pub(super) fn frames_in(&mut self, together: bool) {
        if self.idle_since.is_some() {
            self.frames_in_at(Instant::now(), together);
        } else {
            // No wait was measured since the last: nothing to time.
            self.batch |= together;
        }
    }

    /// A turn of the loop, `quiet` when it has nothing left to do but wait for the host:
    /// whether to poll rather than sleep.
    pub(super) fn turn(&mut self, quiet: bool) -> bool {
        if !(quiet && self.batch) && self.open_until.is_none() {
            return false;
        }
        let now = Instant::now();
        if quiet {
            self.idle(now);
        }
        self.spinning(now)
    }

    /// Frames came in at `now`: `together` when the turn found more than one.
    fn frames_in_at(&mut self, now: Instant, together: bool) {
        if let Some(since) = self.idle_since.take() {
            self.streak = if now.saturating_duration_since(since) < self.window {
                (self.streak + 1).min(STREAK)
            } else {
                0
            };
        }
        self.policy.arrived(now);
        self.batch |= together;
    }

    /// The loop has answered everything and has nothing to do but wait for the host: after a
    /// batch, the window opens now, if batches have been coming close enough together.
    fn idle(&mut self, now: Instant) {
        if !std::mem::take(&mut self.batch) {
            return;
        }
        self.idle_since = Some(now);
        if self.streak >= STREAK {
            let end = now + self.window;
            self.policy.open(now, end, now);
            self.open_until = Some(end);
        }
    }

    /// Whether to poll rather than sleep at `now`.
    fn spinning(&mut self, now: Instant) -> bool {
        if self.open_until.is_some_and(|end| now >= end) {
            self.open_until = None;
        }
        self.policy.spinning(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_micros(50);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
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
        let mut t = Instant::now();
        for _ in 0..2 {
            t = batch_at(&mut poll, t) + us(20);
        }
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
    fn a_batch_after_the_window_closed_stops_the_windows() {
        // Batches that come just after the window closes: every window would close empty.
        let opened = windows_in_bursts(1, WINDOW + us(20), Duration::ZERO);
        assert_eq!(opened, [0]);
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
