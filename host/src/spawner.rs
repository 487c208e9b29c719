//! Every worker is forked from one of a few dedicated threads that live as long as the host
//! process (as many as the machine has CPUs, at most [`MAX_SPAWNERS`]: a fork blocks its
//! thread until the child has set up its confinement and called `exec`, so one thread would
//! serialise a `Pool`'s spawns).
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process.
//! Tokio retires its threads in normal operation (a blocking-pool thread idles out after ten
//! seconds), so a worker forked from one of them would be SIGKILLed while its host is alive and
//! well. Forking from a thread that never exits makes the signal mean what it should: the host
//! process is gone.
//!
//! The thread belongs to the process that started it: a process forked from the host has no
//! such thread, so it starts its own. The thread is recognised by its pid *and* its thread id
//! still naming a thread of this process (`tgkill` with no signal; a descendant in a new PID
//! namespace could reuse the pid). Not through `/proc`, which may belong to another PID
//! namespace and would then never recognise the thread. A thread that
//! failed to start, or a spawn that timed out, makes the next spawn start a fresh thread, and
//! every wait for it is bounded.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::SpawnerError;

type Job = Box<dyn FnOnce() + Send>;

/// How long a spawn may wait for the spawner thread: forking takes milliseconds.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(30);

/// The spawner thread: the pid of the process it runs in, its thread id, and its queue.
struct Spawner {
    pid: u32,
    tid: i32,
    jobs: mpsc::Sender<Job>,
}

impl Spawner {
    /// True if this is the calling process's own live spawner thread.
    fn is_ours(&self) -> bool {
        self.pid == std::process::id() && crate::sys::thread_exists(self.tid)
    }
}

/// The most spawner threads a process starts.
const MAX_SPAWNERS: usize = 4;

/// The spawner threads, started on first use, one slot each.
static SPAWNERS: [Mutex<Option<Spawner>>; MAX_SPAWNERS] =
    [const { Mutex::new(None) }; MAX_SPAWNERS];

/// The slot the next spawn uses (round robin).
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// How many slots are in use: the machine's CPUs, within 1..=MAX_SPAWNERS. Read once per
/// process: finding them reads the process's cgroup and its CPU quota (a dozen system calls),
/// which every spawn would otherwise pay.
fn spawners_in_use() -> usize {
    static IN_USE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *IN_USE.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_SPAWNERS)
    })
}

fn start_thread() -> Result<Spawner, SpawnerError> {
    let (jobs, queue) = mpsc::channel::<Job>();
    let (tid_tx, tid_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("airlock-spawner".into())
        .spawn(move || {
            let _ = tid_tx.send(rustix::thread::gettid().as_raw_nonzero().get());
            for job in queue {
                // A failing spawn reports through its own channel; a panic must not take the
                // thread (and every later spawn) with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        })
        .map_err(SpawnerError::Start)?;
    let tid = tid_rx
        .recv_timeout(SPAWN_TIMEOUT)
        .map_err(|_| SpawnerError::StartTimeout)?;
    Ok(Spawner {
        pid: std::process::id(),
        tid,
        jobs,
    })
}

/// Spawner threads taken out of service. Their job queues stay open for the life of the
/// process: a thread whose queue closed would exit, and every worker it ever forked would get
/// its parent-death signal while the host lives on. One idle thread is kept per spawner
/// thread that ever failed to answer within [`SPAWN_TIMEOUT`] (a fork that hung for 30 s, which
/// a worker cannot cause: the fork and its set-up run before any of the worker's code).
static RETIRED: Mutex<Vec<Spawner>> = Mutex::new(Vec::new());

/// Where a job went: its slot, and the thread that held the slot then.
#[derive(Clone, Copy, Debug)]
struct Placed {
    slot: usize,
    tid: i32,
}

/// Forgets the spawner thread a job was `placed` on, so the next spawn in its slot starts a
/// fresh one. The thread itself is retired, not ended (see [`RETIRED`]): it may be stuck in a
/// fork now, but the workers it forked before must keep running. Only that thread: if it was
/// retired already (another of its jobs timed out first), the slot's present thread took no
/// part in this job and stays in service.
fn forget(placed: Placed) {
    let Ok(mut spawner) = SPAWNERS[placed.slot].lock() else {
        return;
    };
    if spawner.as_ref().map(|current| current.tid) != Some(placed.tid) {
        return;
    }
    if let Some(old) = spawner.take().filter(Spawner::is_ours) {
        RETIRED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(old);
    }
}

/// Hands `job` to one of this process's spawner threads, starting it if there is none; returns
/// where it went. A slot's lock is held only to read or install its thread, never while a
/// thread starts: a process forked from the host while the lock is held would inherit it
/// held for good, and its first spawn in that slot would never return.
fn submit(job: Job) -> Result<Placed, SpawnerError> {
    let slot = NEXT.fetch_add(1, Ordering::Relaxed) % spawners_in_use();
    let in_service = |spawner: &Option<Spawner>| {
        spawner
            .as_ref()
            .filter(|current| current.is_ours())
            .map(|current| (current.jobs.clone(), current.tid))
    };
    let current = in_service(&*SPAWNERS[slot].lock().map_err(|_| SpawnerError::Poisoned)?);
    let (jobs, tid) = match current {
        Some(current) => current,
        None => {
            let fresh = start_thread()?;
            let mut spawner = SPAWNERS[slot].lock().map_err(|_| SpawnerError::Poisoned)?;
            // Another spawn may have installed a thread meanwhile: that one serves, and the
            // fresh one, which forked nothing, ends as its queue closes.
            match in_service(&spawner) {
                Some(installed) => installed,
                None => {
                    let placed = (fresh.jobs.clone(), fresh.tid);
                    *spawner = Some(fresh);
                    placed
                }
            }
        }
    };
    jobs.send(job).map(|()| Placed { slot, tid }).map_err(|_| {
        // The thread is gone (it never is, but be ready): forget it so the next spawn retries.
        if let Ok(mut spawner) = SPAWNERS[slot].lock() {
            if spawner.as_ref().map(|current| current.tid) == Some(tid) {
                *spawner = None;
            }
        }
        SpawnerError::Gone
    })
}

/// Runs `start` (a fork or a clone) on a spawner thread, inside the calling task's runtime:
/// its result, or why the spawner thread could not give one. A result nobody takes any more
/// is dropped, which kills a child it holds.
pub(crate) async fn run<T: Send + 'static>(
    start: impl FnOnce() -> T + Send + 'static,
) -> Result<T, SpawnerError> {
    let (done, result) = oneshot::channel();
    let placed = submit(start_job(tokio::runtime::Handle::current(), start, done))?;
    match tokio::time::timeout(SPAWN_TIMEOUT, result).await {
        Ok(Ok(started)) => Ok(started),
        Ok(Err(_)) => Err(SpawnerError::Dropped),
        Err(_) => {
            // A thread that does not answer is not trusted again: the next spawn starts anew.
            forget(placed);
            Err(SpawnerError::NoAnswer)
        }
    }
}

/// The job that runs `start` inside `runtime` and sends the outcome to `done`; it starts
/// nothing if nobody waits for it any more. A job queued behind a spawn that hung runs only
/// when that one returns, long after its own caller was told [`SpawnerError::NoAnswer`]: a
/// worker started then would be started for nobody.
fn start_job<T: Send + 'static>(
    runtime: tokio::runtime::Handle,
    start: impl FnOnce() -> T + Send + 'static,
    done: oneshot::Sender<T>,
) -> Job {
    Box::new(move || {
        if done.is_closed() {
            return;
        }
        let _entered = runtime.enter();
        let _ = done.send(start());
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tests that retire or hang threads run one at a time: they watch the same slots.
    static RETIRING: Mutex<()> = Mutex::new(());

    /// A spawner thread that stopped answering is replaced, but keeps running: the workers it
    /// forked die with the thread (their parent-death signal), not with the host.
    #[test]
    fn a_forgotten_spawner_thread_keeps_running() {
        let _alone = RETIRING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (placed, tid) = submit_reporting_thread();
        forget(placed);
        // A thread whose queue closed ends at once; give it the moment it would take.
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            crate::sys::thread_exists(tid),
            "the forgotten spawner thread ended, and with it every worker it forked"
        );
    }

    /// Submits a job that reports the id of the thread running it; returns where it went and
    /// that id.
    fn submit_reporting_thread() -> (Placed, i32) {
        let (done, answered) = mpsc::channel();
        let placed = submit(Box::new(move || {
            let _ = done.send(rustix::thread::gettid().as_raw_nonzero().get());
        }))
        .expect("a spawner thread takes the job");
        let tid = answered
            .recv_timeout(SPAWN_TIMEOUT)
            .expect("the spawner thread runs its job");
        (placed, tid)
    }

    /// Submits trivial jobs until one lands in `slot`; returns the id of the thread that ran it.
    fn thread_serving(slot: usize) -> i32 {
        for _ in 0..64 {
            let (landed, tid) = submit_reporting_thread();
            if landed.slot == slot {
                return tid;
            }
        }
        panic!("no job landed in slot {slot}");
    }

    /// Two spawns queued on a thread that hangs both time out, 30 s apart at most: the second
    /// timeout must not retire the thread that took the slot after the first, which answers.
    #[test]
    fn a_timeout_on_a_retired_thread_leaves_its_successor_in_service() {
        let _alone = RETIRING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (release, hang) = mpsc::channel::<()>();
        let hanging = submit(Box::new(move || {
            let _ = hang.recv();
        }))
        .expect("a spawner thread takes the hanging job");
        let slot = hanging.slot;
        // A second job queued behind the hanging one, on the same thread.
        let queued = (0..64)
            .map(|_| submit(Box::new(|| {})).expect("a spawner thread takes the job"))
            .find(|landed| landed.slot == slot)
            .expect("a job lands in the hanging thread's slot");
        assert_eq!(queued.tid, hanging.tid, "queued behind the hanging job");
        forget(hanging); // the hanging job's spawn timed out
        let successor = thread_serving(slot);
        forget(queued); // the queued job's spawn timed out too
        let in_service = SPAWNERS[slot]
            .lock()
            .expect("the slot's lock")
            .as_ref()
            .map(|spawner| spawner.tid);
        let _ = release.send(());
        assert_eq!(
            in_service,
            Some(successor),
            "a thread that answers every job was taken out of service (and kept for ever)"
        );
    }

    /// Queues a spawn of `touch marker` behind jobs that hang every slot, with its caller
    /// waiting or gone, then lets the slots go; true if the command ran.
    fn queued_spawn_ran(caller_waits: bool, marker: &std::path::Path) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let mut releases = Vec::new();
        let mut hung = std::collections::BTreeSet::new();
        while hung.len() < spawners_in_use() {
            let (release, hang) = mpsc::channel::<()>();
            let placed = submit(Box::new(move || {
                let _ = hang.recv();
            }))
            .expect("a spawner thread takes the hanging job");
            hung.insert(placed.slot);
            releases.push(release);
        }
        let mut command = tokio::process::Command::new("touch");
        command.arg(marker).kill_on_drop(false);
        let (done, result) = oneshot::channel();
        let queued = submit(start_job(
            runtime.handle().clone(),
            move || command.spawn(),
            done,
        ))
        .expect("a spawner thread takes the spawn");
        if !caller_waits {
            drop(result); // the caller's spawn timed out
        }
        drop(releases);
        // Jobs run in order: one that ran after the spawn on the same thread says it is done.
        let _ = (0..64).find(|_| {
            let (ran, answered) = mpsc::channel();
            let placed = submit(Box::new(move || {
                let _ = ran.send(());
            }))
            .expect("a spawner thread takes the job");
            let _ = answered.recv_timeout(SPAWN_TIMEOUT);
            placed.tid == queued.tid
        });
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while caller_waits && !marker.exists() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !caller_waits {
            // Time for a child that was started to have run.
            std::thread::sleep(Duration::from_millis(500));
        }
        marker.exists()
    }

    #[test]
    fn a_spawn_whose_caller_gave_up_is_never_started() {
        let _alone = RETIRING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = std::env::temp_dir().join(format!("airlock-spawner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let (waited, abandoned) = (dir.join("waited"), dir.join("abandoned"));
        let ran_for_a_caller = queued_spawn_ran(true, &waited);
        let ran_for_nobody = queued_spawn_ran(false, &abandoned);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(ran_for_a_caller, "a queued spawn whose caller waits runs");
        assert!(
            !ran_for_nobody,
            "a queued spawn whose caller gave up was started"
        );
    }
}
