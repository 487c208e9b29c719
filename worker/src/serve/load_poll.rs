//! Polling under load: once the loop has answered frames that came together (the host
//! pipelining calls) and has nothing left to do, a window through which it polls for the host's
//! next batch instead of sleeping, for as long as batches keep coming within reach of it.

use std::time::{Duration, Instant};

use airlock_protocol::spin::SpinPolicy;

/// How far past the moment the loop went idle a batch may come and still keep the windows
/// opening, in windows. A batch that came later says the host is not pipelining steadily (a
/// burst now and then): windows would only burn a CPU until then, so they stop opening until a
/// batch comes within reach again, which the loop learns by sleeping through the wait.
const REACH: u32 = 2;

/// The polling window's state. Every method takes the time, so the rules can be checked
/// without a clock.
pub(super) struct LoadPoll {
    window: Duration,
    /// Spins through an open window only while spinning measures to pay, as in the
    /// low-latency mode (on a contended CPU the spinning would take the host's time).
    policy: SpinPolicy,
    /// Frames came together since the loop last went idle: it opens a window when it does.
    batch: bool,
    /// When the loop went idle after a batch, until the next frame came.
    idle_since: Option<Instant>,
    /// Whether the next batch opens a window: the last frame after a batch came within
    /// [`REACH`] windows of the loop going idle (or none has been measured yet).
    armed: bool,
}

impl LoadPoll {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            policy: SpinPolicy::default(),
            batch: false,
            idle_since: None,
            armed: true,
        }
    }

    /// Frames came in at `now`: `together` when the turn found more than one.
    pub(super) fn frames_in(&mut self, now: Instant, together: bool) {
        if let Some(since) = self.idle_since.take() {
            self.armed = now.saturating_duration_since(since) < self.window * REACH;
        }
        self.policy.arrived(now);
        self.batch |= together;
    }

    /// The loop has answered everything and has nothing to do but wait for the host: after a
    /// batch, the window opens now, if it is armed.
    pub(super) fn idle(&mut self, now: Instant) {
        if !std::mem::take(&mut self.batch) {
            return;
        }
        self.idle_since = Some(now);
        if self.armed {
            self.policy.open(now, now + self.window, now);
        }
    }

    /// Whether to poll rather than sleep at `now`.
    pub(super) fn spinning(&mut self, now: Instant) -> bool {
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
        poll.frames_in(t, true);
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
            poll.frames_in(at, false);
            poll.idle(at + us(5));
            assert!(!poll.spinning(at + us(6)));
        }
    }

    #[test]
    fn frames_together_open_the_window_once_answered_and_it_closes() {
        let mut poll = LoadPoll::new(WINDOW);
        let t = Instant::now();
        poll.frames_in(t, true);
        // Still answering them (a handler running): no window yet.
        assert!(!poll.spinning(t + us(1)));
        poll.idle(t + us(40));
        assert!(poll.spinning(t + us(41)));
        assert!(poll.spinning(t + us(40) + WINDOW - us(1)));
        assert!(!poll.spinning(t + us(40) + WINDOW));
    }

    #[test]
    fn a_batch_out_of_reach_stops_the_windows_until_one_comes_within_it() {
        let mut poll = LoadPoll::new(WINDOW);
        let mut t = Instant::now();
        // Bursts 1 ms apart: the first opens a window, its wait runs past reach, and the
        // bursts after it open none.
        let idle = batch_at(&mut poll, t);
        assert!(poll.spinning(idle + us(1)));
        for _ in 0..20 {
            t += us(1000);
            let idle = batch_at(&mut poll, t);
            assert!(!poll.spinning(idle + us(1)), "a burst now and then");
        }
        // A batch within reach of the last going idle (slept through) arms it again.
        let idle = batch_at(&mut poll, t + us(1000));
        let next = idle + WINDOW * REACH - us(1);
        let idle = batch_at(&mut poll, next);
        assert!(poll.spinning(idle + us(1)), "batches back to back");
    }

    #[test]
    fn batches_back_to_back_keep_the_windows_opening() {
        let mut poll = LoadPoll::new(WINDOW);
        let mut t = Instant::now();
        let mut spun = 0;
        for _ in 0..1000 {
            let idle = batch_at(&mut poll, t);
            spun += u32::from(poll.spinning(idle + us(1)));
            t = idle + us(20);
        }
        // All but the waits the policy explores sleeping in.
        let exploring = 1000 / SpinPolicy::EXPLORE;
        assert!(spun >= 1000 - exploring - 1, "{spun} of 1000 windows spun");
    }
}
