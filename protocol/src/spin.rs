//! The opt-in low-latency mode: both sides spin briefly before they block.
//!
//! A round trip between processes on different CPUs pays a wake-up on each side: the reader
//! sleeps in the kernel until the writer's data arrives, and waking a sleeping thread costs
//! several microseconds (more in a VM). In the low-latency mode each side keeps polling its
//! channel for a short window after its last message before it sleeps, so an answer that comes
//! within the window is seen without a wake-up.
//!
//! The cost is CPU: each side keeps one CPU busy for up to the window after every message it
//! handles (a window of 50 µs at 10,000 calls/s is half a CPU per side). It is never worth it
//! when both processes share one CPU (the spinner would only delay the peer it waits for), so
//! each side turns it off when it may run on one CPU only.
//!
//! Spinning also stops by itself where it does not pay ([`SpinPolicy`]): each side measures how
//! soon it sees the peer's messages when it spins and when it sleeps, and sleeps (as with the
//! mode off) when spinning is the slower. On a contended CPU (other work, or other guests of a
//! shared VM) spinning takes the time the peer needs to answer.
//!
//! The host asks for it with `HostBuilder::low_latency`; a worker learns the window from its
//! environment ([`SPIN_ENV`]), in whole microseconds. A worker that ignores it is still correct.
//!
//! **Polling under load** is the same mechanism on the worker's side only, on by default, for
//! pipelined calls: a worker that found frames that had come together (calls pipelined by the
//! host) polls for the next ones for a short window ([`LOAD_POLL_ENV`], default
//! [`DEFAULT_LOAD_POLL`]) once it has answered them, before it sleeps. A single frame never
//! opens that window, so calls made one at a time cost what they cost without it, and windows
//! open only while batches keep coming soon after the worker goes idle. Under pipelined load the worker then takes in the host's next batch
//! without a wake-up; on a machine where waking a sleeping process takes tens of microseconds
//! (a VM), that wake-up, not CPU, is what limits the rate, and polling costs less CPU than the
//! wake-ups it saves (`BENCHMARKS.md`, "Pipelined"). The same rules apply: off when the worker
//! may run on one CPU only, and off while it measures not to pay.

use core::time::Duration;
use std::time::Instant;

use crate::transport::FrameReceiver;

/// The environment variable that carries the spin window to a worker, in microseconds.
pub const SPIN_ENV: &str = "AIRLOCK_SPIN_MICROS";

/// Longest spin window a host may ask for: 10 ms. Beyond that a spinning side is simply busy.
pub const MAX_SPIN: Duration = Duration::from_millis(10);

/// The window a worker spins for, given the one its host told it: `None` (do not spin) when
/// none was told, when it is zero, or when this thread may run on one CPU only (its affinity
/// mask, one system call). A host tells a window only where its own rule
/// ([`host_window`]) allows it, quota included, so this is all a worker checks on its way to
/// its `Hello`. If the mask cannot be read, one CPU is assumed: no spinning.
pub fn effective_window(asked: Option<Duration>) -> Option<Duration> {
    let window = asked.filter(|w| !w.is_zero())?.min(MAX_SPIN);
    may_run_on_several_cpus().then_some(window)
}

/// The window a host spins for, or tells its worker, given the one asked for:
/// [`effective_window`], and `None` too where the process has fewer than two CPUs by its
/// cgroup's CPU quota (a side spinning under a quota of less than one CPU only gets throttled,
/// which measured slower than sleeping). The quota is read once per process:
/// `std::thread::available_parallelism` reads the process's cgroup files, 65–200 µs on the
/// development VM, which every spawn paid before. The affinity is read on every call.
pub fn host_window(asked: Option<Duration>) -> Option<Duration> {
    static CPUS_BY_QUOTA: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let window = effective_window(asked)?;
    let cpus =
        *CPUS_BY_QUOTA.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from));
    (cpus > 1).then_some(window)
}

/// Whether this thread may run on more than one CPU: its affinity mask.
fn may_run_on_several_cpus() -> bool {
    rustix::thread::sched_getaffinity(None).is_ok_and(|cpus| cpus.count() > 1)
}

/// The environment variable that carries the worker's polling window under load, in
/// microseconds (see the module's docs). Absent or 0: the worker does not poll under load.
pub const LOAD_POLL_ENV: &str = "AIRLOCK_LOAD_POLL_MICROS";

/// The polling window under load a host gives its workers unless told otherwise
/// (`HostBuilder::poll_under_load`): 50 µs, what `BENCHMARKS.md` measured on the 2-vCPU
/// development VM, where a wake-up takes tens of microseconds.
pub const DEFAULT_LOAD_POLL: Duration = Duration::from_micros(50);

/// The window a worker was given in its environment, if any (an unparsable value is none).
pub fn window_from_env() -> Option<Duration> {
    micros_from_env(SPIN_ENV)
}

/// The polling window under load a worker was given in its environment, if any (an
/// unparsable value is none).
pub fn load_poll_from_env() -> Option<Duration> {
    micros_from_env(LOAD_POLL_ENV)
}

fn micros_from_env(name: &str) -> Option<Duration> {
    effective_window(Some(parse_micros(&std::env::var(name).ok()?)?))
}

/// Whole microseconds, in decimal, surrounding whitespace allowed.
fn parse_micros(value: &str) -> Option<Duration> {
    value.trim().parse().ok().map(Duration::from_micros)
}

/// Longest a side polls its channel in place ([`poll_in_place`]) before it lets its runtime
/// turn (its I/O, timers and other tasks): tokio's own advice for the time between two yields
/// is 10–100 µs.
pub const IN_PLACE_SLICE: Duration = Duration::from_micros(20);

/// Polls `receiver` in place, one [`read_now`](FrameReceiver::read_now) a look and no turn of
/// the runtime, until a look brings something, `keep_on` (asked with the time after each look
/// that found nothing) says to stop, or [`IN_PLACE_SLICE`] passes. Whether something came.
/// A look of a turn of the runtime costs a system call to poll for events and a trip through
/// the scheduler; one in place costs one `read`.
pub fn poll_in_place(
    receiver: &mut dyn FrameReceiver,
    mut keep_on: impl FnMut(Instant) -> bool,
) -> bool {
    let slice_end = Instant::now() + IN_PLACE_SLICE;
    loop {
        if receiver.read_now() {
            return true;
        }
        core::hint::spin_loop();
        let now = Instant::now();
        if !keep_on(now) || now >= slice_end {
            return false;
        }
    }
}

/// Decides, window by window, whether a side spins, by measuring whether spinning pays.
///
/// A window `[at, end)` is opened by [`open`](Self::open) (on the host, by each call it begins;
/// on a worker, by each frame it receives, or under load once it has answered a batch), or
/// extends the one open. Either begins a wait for the peer's next message; the first one that
/// [`arrived`](Self::arrived) after it tells how long that wait was, as this side saw it. The policy keeps a running mean of the waits it
/// spun through and of those it slept through, and spins through the next unless the spun
/// mean is more than a quarter above the slept one. Every [`EXPLORE`](Self::EXPLORE) waits
/// the other choice is taken until one wait has been spun or slept through under it, so both
/// means stay current.
///
/// So the rule measures what spinning is for: on a quiet machine a spinning side sees the
/// answer at once where a sleeping one is woken microseconds later, and it keeps spinning; on
/// a contended one, where its spinning takes the CPU time the peer needs, the peer's answers
/// come later when it spins, and it stops. Waits longer than four windows (an idle gap, a slow
/// handler) say nothing about spinning and are not counted. So where spinning stretches every
/// answer past four windows, the spun mean is not updated and the side keeps spinning: at most
/// one window per wait, as before this policy.
#[derive(Debug, Default)]
pub struct SpinPolicy {
    /// The current window's end, while one is open.
    end: Option<Instant>,
    /// When the wait being measured began: the window's opening or latest extension. Taken by
    /// the first message that arrives.
    waiting_since: Option<Instant>,
    /// Waits longer than this are not counted: four times the window.
    cap: Duration,
    /// Whether the side spins through the current wait.
    spin: bool,
    /// What the side did in the current wait, as [`spinning`](Self::spinning) answered it:
    /// spun, or went to sleep. A wait in which it did neither (a worker whose next frame came
    /// while it was still busy with the last) says nothing about spinning; one it learned of
    /// only when its message came (a host's reader asleep when the call began) was slept
    /// through, whatever was decided.
    spun_in_wait: bool,
    slept_in_wait: bool,
    /// The side's last answer from [`spinning`](Self::spinning) was to sleep, and no message
    /// has come since.
    asleep: bool,
    /// Mean waits spun and slept through.
    spun: Mean,
    slept: Mean,
    /// Waits begun so far, for the exploring one in [`EXPLORE`](Self::EXPLORE).
    waits: u32,
    /// The choice being explored (the one the means do not favour), from when it is due until
    /// a wait has been spun or slept through under it: a wait the side could not act on (a
    /// host's reader asleep while the call began, which learns of it with its answer) does not
    /// use it up.
    exploring: Option<bool>,
}

impl SpinPolicy {
    /// One wait in this many takes the choice the means do not favour.
    pub const EXPLORE: u32 = 128;

    /// Opens the window `[at, end)`, or extends the open one to `end`, at `now`; either way a
    /// new wait begins at `at`, and whether to spin through it is decided now.
    pub fn open(&mut self, at: Instant, end: Instant, now: Instant) {
        self.end = Some(match self.end.filter(|&open| now < open) {
            Some(open) => open.max(end),
            None => end,
        });
        self.cap = end.saturating_duration_since(at).saturating_mul(4);
        self.waits = self.waits.wrapping_add(1);
        let favoured = self.favoured();
        if self.waits % Self::EXPLORE == 0 && self.exploring.is_none() {
            self.exploring = Some(!favoured);
        }
        if self.exploring == Some(favoured) {
            // The means came round to it meanwhile.
            self.exploring = None;
        }
        self.spin = self.exploring.unwrap_or(favoured);
        self.waiting_since = Some(at);
        self.spun_in_wait = false;
        self.slept_in_wait = self.asleep;
    }

    /// The choice the means favour: spinning is kept unless sleeping measures clearly better
    /// (the waits also hold the peer's own time, which is noise to this comparison), and
    /// until spinning has been measured against sleeping.
    fn favoured(&self) -> bool {
        match (self.spun.get(), self.slept.get()) {
            (Some(spun), Some(slept)) => spun <= slept.saturating_add(slept / 4),
            _ => true,
        }
    }

    /// Takes over from `other`, the policy the side followed until now (one that judges
    /// another kind of wait): whether the side is asleep carries over, so that the next wait
    /// this policy opens is counted as what the side really does through it.
    pub fn take_over_from(&mut self, other: &SpinPolicy) {
        self.asleep = other.asleep;
    }

    /// Whether the side's last answer from [`spinning`](Self::spinning) was to sleep, with no
    /// message since (or, after [`take_over_from`](Self::take_over_from), the other policy's).
    pub fn asleep(&self) -> bool {
        self.asleep
    }

    /// Whether the next wait would be spun through, were it to begin now. A side that sleeps
    /// while this holds should be woken when its next wait begins, if it can only learn of
    /// the wait by running (a host's reader, whose windows its callers grant): otherwise one
    /// wait slept through (an exploring one) can keep it asleep at every wait after, when
    /// each answer comes too late in its window for the next call to find it still spinning.
    pub fn would_spin(&self) -> bool {
        self.exploring.unwrap_or_else(|| self.favoured())
    }

    /// Whether a window is open: opened and not yet found past its end by
    /// [`spinning`](Self::spinning). A side that reads the clock only for its windows can skip
    /// it while this is false.
    pub fn window_open(&self) -> bool {
        self.end.is_some()
    }

    /// A message arrived at `now`: the first since the window opened or was extended ends
    /// the wait being measured.
    pub fn arrived(&mut self, now: Instant) {
        self.asleep = false;
        if let Some(since) = self.waiting_since.take() {
            let waited = now.saturating_duration_since(since);
            let spun = match (self.spun_in_wait, self.slept_in_wait) {
                (true, _) => true,
                (false, true) => false,
                (false, false) => return,
            };
            // An exploration ends with its first wait, counted or not: one whose waits all run
            // over the cap would otherwise never end.
            if self.exploring == Some(spun) {
                self.exploring = None;
            }
            if waited > self.cap {
                return;
            }
            if spun {
                self.spun.add(waited);
            } else {
                self.slept.add(waited);
            }
        }
    }

    /// Whether to spin at `now` rather than sleep: a window is open and spun through. The side
    /// must do as it is told (sleep until its next message when this is false): that is what
    /// the wait is counted as.
    pub fn spinning(&mut self, now: Instant) -> bool {
        let spin = match self.end {
            Some(end) if now < end => self.spin,
            Some(_) => {
                self.end = None;
                false
            }
            None => false,
        };
        self.asleep = !spin;
        if spin {
            self.spun_in_wait = true;
        } else {
            self.slept_in_wait = true;
        }
        spin
    }
}

/// A running mean of durations, each new one weighing an eighth.
#[derive(Debug, Default, Clone, Copy)]
struct Mean(Option<Duration>);

impl Mean {
    fn get(self) -> Option<Duration> {
        self.0
    }

    fn add(&mut self, sample: Duration) {
        self.0 = Some(match self.0 {
            None => sample,
            Some(mean) => mean - mean / 8 + sample / 8,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_micros(50);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// The rule is the thread's affinity: pinned to one CPU, it does not spin, whatever
    /// window is asked for (and whatever the machine has).
    #[test]
    fn a_thread_that_may_run_on_one_cpu_only_does_not_spin() {
        std::thread::spawn(|| {
            let mut one = rustix::thread::CpuSet::new();
            let first = (0..rustix::thread::CpuSet::MAX_CPU)
                .find(|&cpu| rustix::thread::sched_getaffinity(None).unwrap().is_set(cpu))
                .unwrap();
            one.set(first);
            rustix::thread::sched_setaffinity(None, &one).unwrap();
            assert_eq!(effective_window(Some(us(50))), None);
            assert_eq!(host_window(Some(us(50))), None);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn windows_from_the_environment_are_whole_decimal_microseconds() {
        assert_eq!(parse_micros("50"), Some(us(50)));
        assert_eq!(parse_micros(" 120\n"), Some(us(120)));
        assert_eq!(parse_micros("0"), Some(Duration::ZERO));
        for bad in ["", "-5", "5us", "0x10", "1.5"] {
            assert_eq!(parse_micros(bad), None, "{bad:?}");
        }
        // Zero means off, and a window is never longer than the maximum.
        assert_eq!(effective_window(Some(Duration::ZERO)), None);
        let cpus = rustix::thread::sched_getaffinity(None).unwrap().count();
        let longest = effective_window(Some(MAX_SPIN * 2));
        assert_eq!(longest, (cpus > 1).then_some(MAX_SPIN));
    }

    /// Runs `n` windows from `t`: each opens, is spun or slept through as the policy says, and
    /// its message arrives after `wait(spun)`. Returns the windows spun through, and the time.
    fn windows(
        policy: &mut SpinPolicy,
        t: Instant,
        n: u32,
        wait: impl Fn(bool) -> Duration,
    ) -> (u32, Instant) {
        windows_of(policy, t, n, W, wait)
    }

    /// [`windows`] of length `w`.
    fn windows_of(
        policy: &mut SpinPolicy,
        mut t: Instant,
        n: u32,
        w: Duration,
        wait: impl Fn(bool) -> Duration,
    ) -> (u32, Instant) {
        let mut spun = 0;
        for _ in 0..n {
            policy.open(t, t + w, t);
            let spinning = policy.spinning(t);
            spun += u32::from(spinning);
            t += wait(spinning);
            policy.arrived(t);
            // The side handles the message and the next window opens a little later.
            t += us(2);
        }
        (spun, t)
    }

    #[test]
    fn where_spinning_sees_answers_sooner_nearly_every_window_spins() {
        let mut policy = SpinPolicy::default();
        // Quiet machine: spinning sees the answer after 8 µs, sleeping after 8 + 20 of wake-up.
        let wait = |spun| if spun { us(8) } else { us(28) };
        let (spun, _) = windows(&mut policy, Instant::now(), 3200, wait);
        assert_eq!(
            spun,
            3200 - 3200 / SpinPolicy::EXPLORE,
            "only the exploring windows sleep"
        );
    }

    #[test]
    fn where_spinning_slows_the_peer_nearly_every_window_sleeps() {
        let mut policy = SpinPolicy::default();
        // Contended machine: the spinning side takes the CPU its peer needs.
        let wait = |spun| if spun { us(40) } else { us(25) };
        let (spun, _) = windows(&mut policy, Instant::now(), 3200, wait);
        // The first waits spin until sleeping has been measured (by the first exploring one).
        let most = SpinPolicy::EXPLORE + 3200 / SpinPolicy::EXPLORE;
        assert!(spun <= most, "{spun} windows spun, more than {most}");
    }

    #[test]
    fn it_follows_the_machine_when_it_changes() {
        let mut policy = SpinPolicy::default();
        let contended = |spun| if spun { us(40) } else { us(25) };
        let quiet = |spun| if spun { us(8) } else { us(28) };
        let (_, t) = windows(&mut policy, Instant::now(), 2000, contended);
        // The mean of the choice not favoured is refreshed by one wait in 128 only, so going
        // back to spinning takes a few of those: some 500 waits.
        let (spun, t) = windows(&mut policy, t, 2000, quiet);
        assert!(spun > 1300, "back to spinning once it pays: {spun} of 2000");
        let (spun, _) = windows(&mut policy, t, 2000, contended);
        assert!(spun < 300, "and back to sleeping: {spun} of 2000");
    }

    #[test]
    fn a_wait_learned_of_only_when_its_message_came_counts_as_slept_through() {
        let mut policy = SpinPolicy::default();
        // Both measured first: spinning sees answers after 8 µs, sleeping after 28.
        let quiet = |spun| if spun { us(8) } else { us(28) };
        let (_, mut t) = windows(&mut policy, Instant::now(), 1280, quiet);
        // A host's reader asleep while calls begin learns of each one with its answer, 40 µs
        // later. Were those counted as spun (what it would have decided), spinning would look
        // slower than sleeping and be given up.
        for _ in 0..200 {
            // Its window over, the reader goes to sleep; a call begins meanwhile.
            assert!(!policy.spinning(t));
            let began = t + us(1);
            t = began + us(40);
            policy.open(began, began + W, t);
            policy.arrived(t);
            t += W;
        }
        assert_eq!(
            policy.spun.get(),
            Some(us(8)),
            "the spun waits are untouched"
        );
        assert!(policy.slept.get() > Some(us(35)), "{policy:?}");
        policy.open(t, t + W, t);
        assert!(
            policy.spinning(t),
            "spinning still measures 8 µs, sleeping now 40"
        );
    }

    #[test]
    fn a_message_that_comes_while_the_side_is_busy_is_not_counted() {
        let mut policy = SpinPolicy::default();
        let quiet = |spun| if spun { us(8) } else { us(28) };
        let (_, mut t) = windows(&mut policy, Instant::now(), 1280, quiet);
        let (spun, slept) = (policy.spun, policy.slept);
        // A worker that finds the next frame already there when it finishes the last one
        // neither spun nor slept for it.
        for _ in 0..100 {
            policy.open(t, t + W, t);
            t += us(3);
            policy.arrived(t);
        }
        assert_eq!(
            (policy.spun.get(), policy.slept.get()),
            (spun.get(), slept.get())
        );
    }

    #[test]
    fn long_waits_are_not_counted() {
        let mut policy = SpinPolicy::default();
        // Idle gaps after every spun window would make spinning look slow if they counted.
        let wait = |spun| if spun { us(900) } else { us(28) };
        let (spun, _) = windows(&mut policy, Instant::now(), 320, wait);
        assert_eq!(
            spun,
            320 - 320 / SpinPolicy::EXPLORE,
            "no spun wait was measured"
        );
    }

    /// A host's reader with one sequential caller, in the order it runs: it learns of a call
    /// when it looks at its loop top if it is awake (spinning) then, else only with the
    /// answer. Returns the calls it spun through, and the time.
    fn host_calls(
        policy: &mut SpinPolicy,
        t: Instant,
        n: u32,
        wait: impl Fn(bool) -> Duration,
    ) -> (u32, Instant) {
        host_calls_in(policy, t, n, W, true, wait)
    }

    /// [`host_calls`] with window `w`, and with the reader woken by a call's grant when it
    /// sleeps but [`would_spin`](SpinPolicy::would_spin) (`woken`), as `read_frames` is.
    fn host_calls_in(
        policy: &mut SpinPolicy,
        mut t: Instant,
        n: u32,
        w: Duration,
        woken: bool,
        wait: impl Fn(bool) -> Duration,
    ) -> (u32, Instant) {
        let mut spun = 0;
        let mut awake = policy.spinning(t);
        for _ in 0..n {
            // The caller begins its next call 2 µs after its last answer was handled.
            let began = t + us(2);
            if awake {
                awake = policy.spinning(began);
            }
            if !awake && woken && policy.would_spin() {
                awake = true;
            }
            let spinning = if awake {
                policy.open(began, began + w, began);
                policy.spinning(began)
            } else {
                false
            };
            spun += u32::from(spinning);
            let arrival = began + wait(spinning);
            if !awake {
                policy.open(began, began + w, arrival);
            }
            policy.arrived(arrival);
            t = arrival + us(1);
            awake = policy.spinning(t);
        }
        (spun, t)
    }

    #[test]
    fn a_host_reader_that_learns_of_calls_late_still_goes_back_to_spinning() {
        let mut policy = SpinPolicy::default();
        let quiet = |spun| if spun { us(8) } else { us(28) };
        let contended = |spun| if spun { us(60) } else { us(30) };
        let (spun, t) = host_calls(&mut policy, Instant::now(), 2000, quiet);
        assert!(spun > 1900, "spins on a quiet machine: {spun} of 2000");
        let (spun, t) = host_calls(&mut policy, t, 2000, contended);
        assert!(spun < 300, "stops when contended: {spun} of 2000");
        // Asleep while sleeping is favoured, the reader learns of each call only with its
        // answer: an exploring wait decided then could not be spun through, and must not
        // use the exploration up.
        let (spun, _) = host_calls(&mut policy, t, 4000, quiet);
        assert!(spun > 3000, "back to spinning once it pays: {spun} of 4000");
    }

    #[test]
    fn a_host_reader_asleep_after_a_late_answer_is_woken_by_the_next_call_that_would_spin() {
        // A 30 µs window: an answer seen asleep (8 µs, woken 20 µs later) leaves too little of
        // its window for the next call to find the reader still spinning.
        let w = us(30);
        let quiet = |spun| if spun { us(8) } else { us(28) };
        let mut unwoken = SpinPolicy::default();
        let (spun, _) = host_calls_in(&mut unwoken, Instant::now(), 4000, w, false, quiet);
        assert!(
            spun < 200,
            "unwoken, one exploring sleep keeps it asleep: {spun} of 4000"
        );
        let mut woken = SpinPolicy::default();
        let (spun, _) = host_calls_in(&mut woken, Instant::now(), 4000, w, true, quiet);
        assert!(spun > 3900, "woken by the grant, it spins: {spun} of 4000");
    }

    #[test]
    fn an_exploration_whose_waits_run_over_the_cap_still_ends() {
        // A 10 µs window: answers come 6 µs after the call, a sleeping side sees them 40 µs
        // later, over the cap of four windows, so no slept wait is ever counted.
        let mut policy = SpinPolicy::default();
        let wait = |spun| if spun { us(6) } else { us(46) };
        let (spun, _) = windows_of(&mut policy, Instant::now(), 10_000, us(10), wait);
        assert!(
            spun > 9800,
            "one sleep in 128, not sleeping from the first on: {spun}"
        );
    }

    #[test]
    fn a_window_ends_at_its_end_and_extensions_move_it() {
        let mut policy = SpinPolicy::default();
        let t = Instant::now();
        policy.open(t, t + W, t);
        assert!(policy.spinning(t + us(49)));
        policy.open(t + us(40), t + us(90), t + us(40));
        assert!(policy.spinning(t + us(89)), "extended by a later call");
        assert!(!policy.spinning(t + us(90)));
        assert!(!policy.spinning(t + us(200)), "and closed");
    }

    #[test]
    fn a_policy_taking_over_counts_the_next_wait_as_what_the_side_did() {
        let t = Instant::now();
        // The side followed `followed` and spun.
        let mut followed = SpinPolicy::default();
        followed.open(t, t + W, t);
        assert!(followed.spinning(t));
        // `other` was last told to sleep, when its window ended.
        let mut other = SpinPolicy::default();
        other.open(t, t + W, t);
        assert!(!other.spinning(t + W));
        assert!(other.asleep());
        other.take_over_from(&followed);
        assert!(!other.asleep());
        // A wait it opens and the side does nothing about is not counted as slept through.
        let next = t + W * 2;
        other.open(next, next + W, next);
        other.arrived(next + us(5));
        assert_eq!(other.slept.get(), None);
        // Without the hand-over it would have been.
        let mut stale = SpinPolicy::default();
        stale.open(t, t + W, t);
        assert!(!stale.spinning(t + W));
        stale.open(next, next + W, next);
        stale.arrived(next + us(5));
        assert_eq!(stale.slept.get(), Some(us(5)));
    }
}
