//! The reader's side of the low-latency mode (`HostBuilder::low_latency`): whether a turn of
//! the reader's loop spins, sleeps, or sleeps until the next call grants a window, and how it
//! spins on the runtime it runs on ([`Polling`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use airlock_protocol::spin::{poll_in_place, SpinPolicy};
use airlock_protocol::transport::FrameReceiver;

use super::Live;

/// How the reader polls while it spins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Polling {
    /// By yielding to the runtime, which looks for the worker's frames as it polls its I/O:
    /// every look is a turn of the runtime (a system call to poll for events, the timers, the
    /// scheduler), and the reader reads only when the OS says input came.
    Yielding,
    /// By reading the channel itself ([`FrameReceiver::read_now`]), up to
    /// [`IN_PLACE_SLICE`](airlock_protocol::spin::IN_PLACE_SLICE) at a time, then yielding once. A look is one `read`: on a
    /// current-thread runtime a small call in the mode took 6.8 µs against 10.6 µs polling by
    /// yielding (BENCHMARKS.md, "Polling in place"). On a multi-thread runtime a task that
    /// yields over and over keeps its threads waking one another: two busy host threads and a
    /// spinning worker on two CPUs starve each other, and one call at a time took about three
    /// times as long as without the mode ("The low-latency mode on a multi-thread runtime").
    InPlace,
}

impl Polling {
    /// How a reader of `receiver` polls: in place where it can read the channel so and may
    /// (`direct`: the worker runs under the host's own verified filter, so it cannot hold its
    /// pipe's lock in the kernel for good, and a read not preceded by the OS's word that input
    /// came cannot sleep for good on it; the rule callers' own reads and writes follow).
    pub(super) fn for_reader(receiver: &dyn FrameReceiver, direct: bool) -> Self {
        if direct && receiver.reads_now() {
            Self::InPlace
        } else {
            Self::Yielding
        }
    }
}

/// What the reader does this turn of its loop, in the low-latency mode.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// Take what has come if it makes a frame, or yield and turn again, instead of sleeping.
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
///
/// Waits for calls begun alone and for calls begun while others were in flight are measured
/// apart, each kind by a policy of its own. Under pipelined calls the wait for the next frame
/// is the worker's queue, whatever the reader does, and it says nothing about calls made one at
/// a time: measured together, a host that had just pipelined kept sleeping through the windows
/// of its next calls made one at a time (BENCHMARKS.md, "The low-latency mode on a
/// multi-thread runtime").
pub(super) struct ReaderSpin {
    window: Duration,
    /// The policy for calls begun alone, and the one for calls begun beside others.
    alone: SpinPolicy,
    beside_others: SpinPolicy,
    /// Which of the two the latest grant opened a window on: the one the reader follows.
    latest_alone: bool,
    polling: Polling,
    /// The reader has yielded since it last took frames. Polling in place waits for this: the
    /// callers those frames answered were woken into this thread's own slot, which no other
    /// thread takes from, so they run (and begin their next calls) only once the reader yields.
    yielded_since_frames: bool,
    /// The latest grant seen, as [`Live::granted_until`] gives it.
    seen: u64,
}

impl ReaderSpin {
    pub(super) fn new(window: Duration, polling: Polling) -> Self {
        Self {
            window,
            alone: SpinPolicy::default(),
            beside_others: SpinPolicy::default(),
            latest_alone: true,
            polling,
            yielded_since_frames: false,
            seen: 0,
        }
    }

    /// The policy the reader follows: that of the kind of call that granted the latest window.
    fn policy(&mut self) -> &mut SpinPolicy {
        if self.latest_alone {
            &mut self.alone
        } else {
            &mut self.beside_others
        }
    }

    /// Adopts a window granted since the last look (it began when its call did), at `now`, on
    /// the policy for the kind of call that granted it.
    fn observe(&mut self, live: &Live, now: Instant) {
        let granted = live.granted_until();
        if granted > self.seen {
            self.seen = granted;
            let alone = live.granted_alone(granted);
            if alone != self.latest_alone {
                // The reader turns to the other policy as it is, asleep or not.
                let (from, to) = if alone {
                    (&self.beside_others, &mut self.alone)
                } else {
                    (&self.alone, &mut self.beside_others)
                };
                to.take_over_from(from);
                self.latest_alone = alone;
            }
            let end = live.epoch + Duration::from_nanos(granted);
            let at = end.checked_sub(self.window).unwrap_or(end);
            self.policy().open(at, end, now);
        }
    }

    /// This turn of the reader's loop: a look at the windows granted, polling in place while
    /// one is spun through (where the reader does) until input comes or the slice ends, then
    /// what follows. Input that is not yet a whole frame (a frame split across writes) makes
    /// a turn like any other: the reader finds no frame, yields and polls on. While the rest of
    /// a large frame is due, which only `poll_recv` reads, every look ends at once, so the
    /// reader polls by yielding until the frame is in.
    /// `answered`: the answer a caller's look took since the last turn, if any, as the grant
    /// of the call it answered (`Live::granted_until` when it looked) and when it came; it ends
    /// that call's wait as a frame the reader took would, if no call has been granted since.
    pub(super) fn turn(
        &mut self,
        live: &Live,
        receiver: &mut dyn FrameReceiver,
        answered: Option<(u64, Instant)>,
    ) -> Turn {
        let now = Instant::now();
        self.observe(live, now);
        if let Some((_, at)) = answered.filter(|&(grant, _)| grant == self.seen) {
            self.policy().arrived(at);
        }
        let mut spinning = self.policy().spinning(now);
        if spinning && self.polling == Polling::InPlace && self.yielded_since_frames {
            let policy = self.policy();
            poll_in_place(receiver, |now| {
                spinning = policy.spinning(now);
                spinning
            });
        }
        let turn = self.after_look(live, spinning);
        if turn == Turn::Spin {
            self.yielded_since_frames = true;
        }
        turn
    }

    /// What follows a look that found the reader `spinning` or not. Asleep but willing to
    /// spin, the reader is woken by the next call's grant. A grant made after the look but
    /// before the flag is stored did not see the flag: look again. One made after it either
    /// stores a permit in the `Notify` or wakes the wait; a stale permit costs one more turn.
    fn after_look(&self, live: &Live, spinning: bool) -> Turn {
        // A grant of either kind may come next, and each is judged by its own policy.
        let awaits_alone = !spinning && self.alone.would_spin();
        let awaits_beside = !spinning && self.beside_others.would_spin();
        live.awaits_grant(true)
            .store(awaits_alone, Ordering::SeqCst);
        live.awaits_grant(false)
            .store(awaits_beside, Ordering::SeqCst);
        let awaits_grant = awaits_alone || awaits_beside;
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
        self.policy().arrived(now);
        self.yielded_since_frames = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::wire::now_or_never;

    const WINDOW: Duration = Duration::from_millis(1);

    /// A host's connection state in the low-latency mode at `window`, its reader polling as
    /// `polling` says, and a channel that never has input.
    fn reading(window: Duration, polling: Polling) -> (Live, ReaderSpin, Channel) {
        (
            Live::new(Some(window)),
            ReaderSpin::new(window, polling),
            Channel::empty(),
        )
    }

    /// A channel the reader may read in place: its input comes at the `ready_at`-th look.
    struct Channel {
        looks: usize,
        ready_at: Option<usize>,
        reads_now: bool,
    }

    impl Channel {
        fn empty() -> Self {
            Self::ready_at(None)
        }

        fn ready_at(ready_at: Option<usize>) -> Self {
            Self {
                looks: 0,
                ready_at,
                reads_now: true,
            }
        }
    }

    #[async_trait::async_trait]
    impl FrameReceiver for Channel {
        fn poll_recv(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<Option<bytes::Bytes>, airlock_protocol::TransportError>>
        {
            std::task::Poll::Pending
        }

        fn read_now(&mut self) -> bool {
            self.looks += 1;
            self.ready_at.is_some_and(|at| self.looks >= at)
        }

        fn reads_now(&self) -> bool {
            self.reads_now
        }
    }

    /// In place only where the channel can be read without the runtime and the worker runs
    /// under the host's own filter; otherwise every look waits for the OS's word.
    #[test]
    fn a_reader_polls_in_place_only_where_it_may_read_the_channel_itself() {
        let readable = Channel::empty();
        let unreadable = Channel {
            reads_now: false,
            ..Channel::empty()
        };
        assert_eq!(Polling::for_reader(&readable, true), Polling::InPlace);
        assert_eq!(Polling::for_reader(&readable, false), Polling::Yielding);
        assert_eq!(Polling::for_reader(&unreadable, true), Polling::Yielding);
    }

    #[test]
    fn in_place_the_reader_yields_once_after_frames_then_reads_the_channel_itself() {
        // Long enough that no pause of the test's thread closes it.
        let window = Duration::from_secs(10);
        let live = Live::new(Some(window));
        let mut spin = ReaderSpin::new(window, Polling::InPlace);
        let mut channel = Channel::ready_at(Some(3));
        live.grant_spin(true);
        // Frames were just taken: the callers they answered run first.
        spin.frame_in(&live);
        assert_eq!(spin.turn(&live, &mut channel, None), Turn::Spin);
        assert_eq!(channel.looks, 0, "it yielded without reading");
        // Then it polls the channel itself until the input comes.
        assert_eq!(spin.turn(&live, &mut channel, None), Turn::Spin);
        assert_eq!(channel.looks, 3, "it looked on after the input came");
        // Taking it, it yields again before its next look.
        spin.frame_in(&live);
        live.grant_spin(true);
        assert_eq!(spin.turn(&live, &mut channel, None), Turn::Spin);
        assert_eq!(channel.looks, 3);
    }

    #[test]
    fn in_place_the_reader_yields_after_each_slice_and_sleeps_once_the_window_closes() {
        // Many slices long, so that a pause of the test's thread leaves some of it.
        let window = Duration::from_millis(200);
        let (live, mut spin, mut channel) = reading(window, Polling::InPlace);
        live.grant_spin(true);
        let granted = Instant::now();
        assert_eq!(
            spin.turn(&live, &mut channel, None),
            Turn::Spin,
            "the first yield"
        );
        let mut slices = 0;
        let last = loop {
            let before = Instant::now();
            match spin.turn(&live, &mut channel, None) {
                Turn::Spin => {
                    slices += 1;
                    assert!(
                        before.elapsed() >= airlock_protocol::spin::IN_PLACE_SLICE,
                        "a slice cut short"
                    );
                }
                other => break other,
            }
        };
        assert!(slices >= 1, "no slice ended in a yield");
        assert!(granted.elapsed() >= window, "it stopped inside the window");
        assert_eq!(
            last,
            Turn::SleepUntilGranted,
            "it sleeps, to be woken by the next call"
        );
        let looks = channel.looks;
        assert_eq!(
            spin.turn(&live, &mut channel, None),
            Turn::SleepUntilGranted
        );
        assert_eq!(channel.looks, looks, "no look once the window is closed");
    }

    /// Teaches `policy` that sleeping pays: three hundred waits, each spun through taking
    /// three windows and each slept through a tenth of one, on a clock of their own that ends
    /// with the last window closed.
    fn teach_to_sleep(policy: &mut SpinPolicy, window: Duration) {
        let start = Instant::now();
        let mut at = start;
        for _ in 0..300 {
            policy.open(at, at + window, at);
            let took = if policy.spinning(at) {
                window * 3
            } else {
                window / 10
            };
            policy.arrived(at + took);
            at += window * 10;
        }
        assert!(!policy.spinning(at), "the last window is closed");
    }

    #[test]
    fn pipelined_calls_do_not_teach_the_reader_to_sleep_through_calls_made_alone() {
        let window = Duration::from_secs(10);
        let (live, mut spin, mut channel) = reading(window, Polling::Yielding);
        teach_to_sleep(&mut spin.beside_others, window);
        // The lesson took: a call begun beside others is slept through, and the reader
        // sleeps until a call begun alone, which it would spin for, wakes it.
        live.grant_spin(false);
        assert!(!live.granted_alone(live.granted_until()));
        assert_eq!(
            spin.turn(&live, &mut channel, None),
            Turn::SleepUntilGranted
        );
        live.grant_spin(false);
        assert!(
            now_or_never(live.grant_wake.notified()).is_none(),
            "a call beside others does not wake it"
        );
        // A call begun alone is judged by what calls begun alone measured: nothing yet, so it
        // wakes the reader, which spins.
        live.grant_spin(true);
        assert!(live.granted_alone(live.granted_until()));
        assert!(now_or_never(live.grant_wake.notified()).is_some());
        assert_eq!(spin.turn(&live, &mut channel, None), Turn::Spin);
        // And the other way round; taught both ways, it sleeps through either.
        teach_to_sleep(&mut spin.alone, window);
        live.grant_spin(true);
        assert_eq!(spin.turn(&live, &mut channel, None), Turn::Sleep);
    }

    /// A reader in the mode (10 s windows) whose policy for calls begun `alone`, or beside
    /// others, measured sleeping to pay, brought by its calls to a spin that explores.
    fn exploring(alone: bool) -> (Live, ReaderSpin, Channel) {
        let window = Duration::from_secs(10);
        let (live, mut spin, mut channel) = reading(window, Polling::Yielding);
        let policy = if alone {
            &mut spin.alone
        } else {
            &mut spin.beside_others
        };
        teach_to_sleep(policy, window);
        let explores = (0..2 * SpinPolicy::EXPLORE).any(|_| {
            live.grant_spin(alone);
            spin.turn(&live, &mut channel, None) == Turn::Spin
        });
        assert!(explores, "the policy explores spinning");
        (live, spin, channel)
    }

    /// An answer a caller's look took ends the reader's wait for it as a frame the reader took
    /// would: a reader that measured sleeping to pay, exploring a spin, ends the exploration
    /// and sleeps through the next call; without the answer it would go on spinning through
    /// every window. An answer to a call since superseded by another grant is not counted.
    #[test]
    fn an_answer_a_callers_look_took_ends_the_readers_wait_for_it() {
        let (live, mut spin, mut channel) = exploring(true);
        // Answers the reader never sees: the exploration goes on, call after call.
        live.grant_spin(true);
        assert_eq!(spin.turn(&live, &mut channel, None), Turn::Spin);
        // An answer to an earlier call, which the reader learns of only once it has spun for a
        // later one: not counted.
        let stale = Some((live.granted_until(), Instant::now()));
        live.grant_spin(true);
        assert_eq!(spin.turn(&live, &mut channel, None), Turn::Spin);
        assert_eq!(spin.turn(&live, &mut channel, stale), Turn::Spin);
        live.grant_spin(true);
        assert_eq!(
            spin.turn(&live, &mut channel, None),
            Turn::Spin,
            "the stale answer ended the exploration"
        );
        // The answer to the latest call, which a look took: the exploration ends with it.
        let answered = Some((live.granted_until(), Instant::now()));
        assert_eq!(spin.turn(&live, &mut channel, answered), Turn::Spin);
        live.grant_spin(true);
        assert_ne!(spin.turn(&live, &mut channel, None), Turn::Spin);
    }

    /// A look's answer is matched to its own call's grant: where a call begun beside it (on
    /// another thread) while it looked has been granted since, the answer ends nothing, and
    /// the later call's wait, in the other policy, goes on.
    #[test]
    fn a_looks_answer_never_ends_the_wait_of_a_call_begun_while_it_looked() {
        let (live, mut spin, mut channel) = exploring(false);
        // Call A begins alone, and the reader sees it.
        let a = live.grant_spin(true);
        assert_eq!(spin.turn(&live, &mut channel, None), Turn::Spin);
        // While A's caller looks, call B begins beside it (A in flight): its grant is the
        // latest; B's answer has not come.
        live.grant_spin(false);
        assert_eq!(
            spin.turn(&live, &mut channel, None),
            Turn::Spin,
            "B explores"
        );
        // A's look takes A's answer and records A's grant, as `Inlet::look` does.
        let recorded = Some((a, Instant::now()));
        assert_eq!(spin.turn(&live, &mut channel, recorded), Turn::Spin);
        // B's answer has not come: its exploration goes on.
        live.grant_spin(false);
        assert_eq!(
            spin.turn(&live, &mut channel, None),
            Turn::Spin,
            "A's answer ended B's (beside-others) exploration"
        );
    }

    #[test]
    fn the_reader_turns_to_the_other_policy_as_it_is_asleep_or_not() {
        let window = Duration::from_secs(10);
        let (live, mut spin, mut channel) = reading(window, Polling::Yielding);
        live.grant_spin(true);
        assert_eq!(spin.turn(&live, &mut channel, None), Turn::Spin);
        // The policy for calls beside others was last told to sleep.
        teach_to_sleep(&mut spin.beside_others, window);
        assert!(spin.beside_others.asleep());
        // A call beside others: the reader, spinning until now, follows that policy awake.
        live.grant_spin(false);
        spin.observe(&live, Instant::now());
        assert!(!spin.latest_alone);
        assert!(!spin.beside_others.asleep(), "it spun until now");
    }

    #[test]
    fn yielding_the_reader_never_reads_the_channel_itself() {
        let live = Live::new(Some(WINDOW));
        let mut spin = ReaderSpin::new(WINDOW, Polling::Yielding);
        let mut channel = Channel::ready_at(Some(1));
        live.grant_spin(true);
        for _ in 0..3 {
            assert_eq!(spin.turn(&live, &mut channel, None), Turn::Spin);
        }
        assert_eq!(channel.looks, 0);
    }

    #[test]
    fn a_grant_made_between_the_readers_look_and_its_flag_sends_it_round_again() {
        let live = Live::new(Some(WINDOW));
        let mut spin = ReaderSpin::new(WINDOW, Polling::Yielding);
        // The look: no window yet, so no spinning (nothing measured yet: it would spin).
        let now = Instant::now();
        spin.observe(&live, now);
        assert!(!spin.alone.spinning(now));
        // A caller's grant lands before the flag is stored: no wake is sent.
        live.grant_spin(true);
        assert!(now_or_never(live.grant_wake.notified()).is_none());
        assert_eq!(spin.after_look(&live, false), Turn::LookAgain);
        assert_eq!(
            spin.turn(&live, &mut Channel::empty(), None),
            Turn::Spin,
            "and the next turn spins through it"
        );
    }

    #[test]
    fn a_grant_made_after_the_reader_flags_that_it_sleeps_wakes_it() {
        let live = Live::new(Some(WINDOW));
        let mut spin = ReaderSpin::new(WINDOW, Polling::Yielding);
        assert_eq!(
            spin.turn(&live, &mut Channel::empty(), None),
            Turn::SleepUntilGranted
        );
        live.grant_spin(true);
        // The wait the reader is about to enter (or is in) completes.
        assert!(now_or_never(live.grant_wake.notified()).is_some());
        assert!(
            !live.awaits_grant(true).load(Ordering::SeqCst),
            "one wake per sleep"
        );
        live.grant_spin(true);
        assert!(
            now_or_never(live.grant_wake.notified()).is_none(),
            "no stale permit piles up"
        );
    }

    #[test]
    fn with_the_mode_off_a_call_neither_grants_nor_wakes() {
        let live = Live::new(None);
        live.awaits_grant(true).store(true, Ordering::SeqCst);
        live.awaits_grant(false).store(true, Ordering::SeqCst);
        live.grant_spin(true);
        assert_eq!(live.granted_until(), 0);
        assert!(now_or_never(live.grant_wake.notified()).is_none());
    }
}
