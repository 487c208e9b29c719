//! The deadline thread: one thread per process keeps every supervisor's next deadline, so a
//! host's tokio runtime parks without a timeout between calls.
//!
//! A timer on the host's runtime would make each park of that runtime arm a kernel timer
//! (tokio parks until its next timer), and a runtime parks at least once per call. A
//! supervisor's next deadline moves seldom (a steady stream of calls with one timeout moves it
//! once per timeout: see `Live::try_begin`), so a thread that sleeps until the earliest
//! deadline of every host in the process wakes seldom too, and a call costs it nothing.
//!
//! The rule: an armed [`Alarm`] fires (its supervisor's [`fired`](Alarm::fired) completes) at
//! or after the instant it is armed for, never before, and always, for as long as it stays
//! armed. A fire may also come that is stale (armed for an instant since replaced): the
//! supervisor only ever takes a fire as "look at the time now", so that is harmless.
//!
//! The thread takes the scheduling of the process's main thread (policy, nice value, CPUs)
//! as it starts, not that of whichever thread spawned the first host: an application's
//! idle-priority background thread must not make every host's deadlines late.
//!
//! **After a `fork`.** The thread belongs to the process that started it. A process forked
//! from it has no such thread, and its copy of the thread's lock may be held forever (a fork
//! copies a lock as it is, held by a thread that is not copied). So the thread's state is
//! never touched in a forked child ([`kept_here`] is false there): its alarms are kept by the
//! runtime's timer, as they are where the thread could not be started. A supervisor that was
//! waiting for the thread when the fork came switches at its next turn, which the child's
//! next call on that host brings (`Live::try_begin` wakes it), as does any command or event
//! (`invariant_04_ids_stay_fresh_on_both_sides_of_a_fork` and `fork_deadlines.rs` use hosts
//! across a fork this way).
//!
//! What a child does not get: a call that was *in flight* across the fork, awaited in the
//! child with no other use of its host there, is timed out only at the host's next turn in
//! the child. Such a call is as much the parent's as the child's (both hold the worker's
//! channel, and either may read its answer); a host's calls belong to one process. Forks that
//! bypass the C library's `fork` (a raw `clone`, `_Fork`) are not seen at all: a process made
//! that way must not use a host it inherited.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

use crate::sys::{count_forks, forks};

/// The deadlines every alarm kept by the thread is armed for.
struct Deadlines {
    /// The armed alarms, earliest first; an alarm's id makes its key unique.
    armed: BTreeMap<(Instant, u64), Arc<Notify>>,
}

static DEADLINES: Mutex<Deadlines> = Mutex::new(Deadlines {
    armed: BTreeMap::new(),
});

/// The next alarm's id.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Signalled when an alarm is armed earlier than every other: the thread's sleep is too long.
static EARLIER: Condvar = Condvar::new();

/// No process of this one's line has started the thread yet (or a start failed: the next
/// alarm tries again).
const NOT_STARTED: u64 = u64::MAX;
/// Or'ed with a process id: a thread of that process is starting the deadline thread.
const STARTING: u64 = 1 << 62;

/// Which process the thread serves, as its fork count ([`forks`]), or one of the two states
/// above. Copied by a fork, after which the child's fork count differs from it.
static SERVES: AtomicU64 = AtomicU64::new(NOT_STARTED);

/// True if this process's alarms are kept by the deadline thread: it started in this process,
/// not in a parent this process was forked from.
pub(crate) fn kept_here() -> bool {
    SERVES.load(Ordering::Acquire) == forks()
}

/// Starts the thread if no process of this line has, or waits while another thread of this
/// process starts it. A forked child whose parent started one (or was starting one) does not
/// start another, as that would take the lock the fork copied.
fn start_once() {
    let pid = u64::from(std::process::id());
    let starting = SERVES.compare_exchange(
        NOT_STARTED,
        STARTING | pid,
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    match starting {
        Ok(_) => {
            // Forks are counted before the thread serves anyone: a child forked from here on
            // never finds its count equal to `SERVES`. One forked before sees `STARTING` and
            // another pid, and keeps its alarms on its runtime.
            let started = count_forks().and_then(|()| {
                std::thread::Builder::new()
                    .name("airlock-timers".into())
                    .spawn(keep_deadlines)
            });
            match started {
                Ok(_) => SERVES.store(forks(), Ordering::Release),
                Err(err) => {
                    // Deadlines stay with the runtime's timer until a later alarm starts it.
                    tracing::warn!(
                        target: "airlock::spawn",
                        %err,
                        "airlock's deadline thread did not start; deadlines are kept by the runtime's timer"
                    );
                    SERVES.store(NOT_STARTED, Ordering::Release);
                }
            }
        }
        // Being started in this process: a thread starts within microseconds.
        Err(serves) if serves == STARTING | pid => {
            while SERVES.load(Ordering::Acquire) == STARTING | pid {
                std::thread::yield_now();
            }
        }
        Err(_) => {}
    }
}

/// The deadlines, even if a thread panicked while holding them (every change to them is
/// complete before anything that can panic runs).
fn deadlines() -> MutexGuard<'static, Deadlines> {
    DEADLINES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One supervisor's alarm: armed for at most one instant at a time. Disarmed when dropped.
pub(crate) struct Alarm {
    id: u64,
    /// The instant it is armed for, as last set (the thread may have fired it since).
    at: Option<Instant>,
    /// The instant under which it is in the thread's [`DEADLINES`], if it is there: only in
    /// the process whose thread it is.
    with_thread: Option<Instant>,
    fired: Arc<Notify>,
}

impl Alarm {
    /// A disarmed alarm; starts the deadline thread if this process has none yet.
    pub(crate) fn new() -> Self {
        start_once();
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            at: None,
            with_thread: None,
            fired: Arc::new(Notify::new()),
        }
    }

    /// Arms the alarm for `at`, replacing the instant it was armed for, or disarms it
    /// (`None`).
    pub(crate) fn set(&mut self, at: Option<Instant>) {
        self.at = at;
        if !kept_here() {
            // A forked child (or the thread never started): the runtime's timer keeps it
            // (see `fired`).
            self.with_thread = None;
            return;
        }
        let mut deadlines = deadlines();
        if let Some(old) = self.with_thread.take() {
            deadlines.armed.remove(&(old, self.id));
        }
        if let Some(at) = at {
            let earliest = deadlines
                .armed
                .first_key_value()
                .is_none_or(|(&(first, _), _)| at < first);
            deadlines
                .armed
                .insert((at, self.id), Arc::clone(&self.fired));
            self.with_thread = Some(at);
            if earliest {
                EARLIER.notify_one();
            }
        }
    }

    /// Completes when the alarm fires: at once if the thread fired it since the last wait
    /// (one fire is kept while nobody waits). Where the thread does not keep this process's
    /// alarms, the runtime's timer waits for the instant; a disarmed alarm never fires.
    pub(crate) async fn fired(&self) {
        match self.at {
            Some(at) if self.with_thread.is_none() || !kept_here() => {
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            }
            Some(_) => self.fired.notified().await,
            None => std::future::pending().await,
        }
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        self.set(None);
    }
}

impl std::fmt::Debug for Alarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Alarm")
            .field("at", &self.at)
            .field("with_thread", &self.with_thread)
            .finish()
    }
}

/// The deadline thread: takes the main thread's scheduling, then fires every alarm whose
/// instant has come and sleeps until the earliest one left (or until one is armed earlier).
/// Nothing in it can panic.
fn keep_deadlines() {
    if let Err(err) = crate::sys::schedule_as_main_thread() {
        tracing::warn!(
            target: "airlock::spawn",
            %err,
            "airlock's deadline thread could not take the main thread's scheduling; it keeps the scheduling of the thread that spawned the process's first host"
        );
    }
    let mut due = Vec::new();
    let mut deadlines = deadlines();
    loop {
        let now = Instant::now();
        while let Some(entry) = deadlines.armed.first_entry().filter(|e| e.key().0 <= now) {
            due.push(entry.remove());
        }
        if !due.is_empty() {
            // Fired outside the lock: a supervisor arming its alarm never waits on a wake.
            drop(deadlines);
            due.drain(..).for_each(|fired| fired.notify_one());
            deadlines = self::deadlines();
            continue;
        }
        let next = deadlines.armed.first_key_value().map(|(&(at, _), _)| at);
        deadlines = match next {
            // A wake before the instant (spurious, or a notify for a later alarm) only makes
            // the loop look again.
            Some(at) => {
                EARLIER
                    .wait_timeout(deadlines, at.saturating_duration_since(now))
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0
            }
            None => EARLIER
                .wait(deadlines)
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn fired_within(alarm: &Alarm, within: Duration) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async { tokio::time::timeout(within, alarm.fired()).await.is_ok() })
    }

    #[test]
    fn an_alarm_fires_at_its_instant_and_not_before() {
        let mut alarm = Alarm::new();
        let at = Instant::now() + Duration::from_millis(50);
        alarm.set(Some(at));
        assert!(
            alarm.with_thread.is_some(),
            "kept by the thread in this process"
        );
        assert!(fired_within(&alarm, Duration::from_secs(10)), "it fired");
        assert!(Instant::now() >= at, "not before its instant");
    }

    #[test]
    fn an_alarm_armed_earlier_than_all_others_wakes_the_thread_early() {
        // The thread sleeps until the far one; the near one must not wait for it.
        let mut far = Alarm::new();
        far.set(Some(Instant::now() + Duration::from_secs(3600)));
        std::thread::sleep(Duration::from_millis(20));
        let mut near = Alarm::new();
        near.set(Some(Instant::now() + Duration::from_millis(20)));
        assert!(fired_within(&near, Duration::from_secs(10)));
        assert!(!fired_within(&far, Duration::from_millis(50)));
    }

    #[test]
    fn a_rearmed_alarm_fires_at_its_new_instant_and_a_disarmed_one_never() {
        let mut moved = Alarm::new();
        let start = Instant::now();
        moved.set(Some(start + Duration::from_secs(3600)));
        moved.set(Some(start + Duration::from_millis(30)));
        assert!(fired_within(&moved, Duration::from_secs(10)));

        let mut disarmed = Alarm::new();
        disarmed.set(Some(Instant::now() + Duration::from_millis(10)));
        disarmed.set(None);
        assert!(!fired_within(&disarmed, Duration::from_millis(200)));
    }

    #[test]
    fn a_dropped_alarm_leaves_nothing_armed() {
        let mut alarm = Alarm::new();
        let id = alarm.id;
        alarm.set(Some(Instant::now() + Duration::from_secs(3600)));
        let armed = |id| deadlines().armed.keys().any(|&(_, of)| of == id);
        assert!(armed(id));
        drop(alarm);
        assert!(!armed(id));
    }
}
