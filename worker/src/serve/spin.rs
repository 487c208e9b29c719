//! The worker's side of the low-latency mode: after each frame, a window to spin through while
//! the next one is awaited.

use std::time::{Duration, Instant};

use airlock_protocol::spin::{poll_in_place, SpinPolicy};
use airlock_protocol::transport::FrameReceiver;

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

    /// Spins reading the channel itself ([`FrameReceiver::read_now`]) until it brings
    /// something, the window closes, or [`IN_PLACE_SLICE`](airlock_protocol::spin::IN_PLACE_SLICE) passes: for a loop alone on its
    /// thread, where a turn of the runtime between looks (a system call to poll for events,
    /// the timers, the scheduler) costs more than the look.
    pub(super) fn in_place(&mut self, receiver: &mut dyn FrameReceiver) {
        if !receiver.reads_now() {
            return;
        }
        poll_in_place(receiver, |now| self.policy.spinning(now));
    }
}
