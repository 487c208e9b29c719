//! The worker's side of the low-latency mode: after each frame, a window to spin through while
//! the next one is awaited.

use std::time::{Duration, Instant};

use airlock_protocol::spin::SpinPolicy;

/// The low-latency mode's state: each frame received opens a window to spin through while
/// the next one is awaited, where [`SpinPolicy`] finds that spinning pays.
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
}
