//! The worker's side of the low-latency mode (after each frame, a window to spin through while
//! the next one is awaited) and of polling under load (the same, after frames that came
//! together).

use std::time::{Duration, Instant};

use airlock_protocol::spin::SpinPolicy;

/// A spin window's state: each time the loop calls [`frame_in`](Self::frame_in) it opens a
/// window to spin through while the next frame is awaited, where [`SpinPolicy`] finds that
/// spinning pays.
pub(super) struct Spin {
    window: Duration,
    policy: SpinPolicy,
}

impl Spin {
    pub(super) fn new(window: Duration) -> Self {
        Self {
            window,
            policy: SpinPolicy::default(),
        }
    }

    /// Frames came in (if the mode is on).
    pub(super) fn frame_in(spin: &mut Option<Self>) {
        if let Some(spin) = spin {
            let now = Instant::now();
            spin.policy.arrived(now);
            spin.policy.open(now, now + spin.window, now);
        }
    }

    pub(super) fn spinning(&mut self) -> bool {
        self.policy.spinning(Instant::now())
    }

    /// Whether either window says to spin. Both are asked every time, so each policy counts
    /// the wait as what the loop did in it.
    pub(super) fn either(first: &mut Option<Self>, second: &mut Option<Self>) -> bool {
        let first = first.as_mut().is_some_and(Self::spinning);
        let second = second.as_mut().is_some_and(Self::spinning);
        first || second
    }
}
