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

use tokio::process::{Child, Command};
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

/// How many slots are in use: the machine's CPUs, within 1..=MAX_SPAWNERS.
fn spawners_in_use() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_SPAWNERS)
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
/// its parent-death signal while the host lives on.
static RETIRED: Mutex<Vec<Spawner>> = Mutex::new(Vec::new());

/// Forgets the spawner thread in `slot`, so the next spawn there starts a fresh one. The thread
/// itself is retired, not ended (see [`RETIRED`]): it may be stuck in a fork now, but the
/// workers it forked before must keep running.
fn forget(slot: usize) {
    let Ok(mut spawner) = SPAWNERS[slot].lock() else {
        return;
    };
    if let Some(old) = spawner.take().filter(Spawner::is_ours) {
        RETIRED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(old);
    }
}

/// Hands `job` to one of this process's spawner threads, starting it if there is none; returns
/// the slot it went to.
fn submit(job: Job) -> Result<usize, SpawnerError> {
    let slot = NEXT.fetch_add(1, Ordering::Relaxed) % spawners_in_use();
    let mut spawner = SPAWNERS[slot].lock().map_err(|_| SpawnerError::Poisoned)?;
    let jobs = match spawner.as_ref() {
        Some(current) if current.is_ours() => current.jobs.clone(),
        _ => {
            let fresh = start_thread()?;
            let jobs = fresh.jobs.clone();
            *spawner = Some(fresh);
            jobs
        }
    };
    jobs.send(job).map(|()| slot).map_err(|_| {
        // The thread is gone (it never is, but be ready): forget it so the next spawn retries.
        *spawner = None;
        SpawnerError::Gone
    })
}

/// Spawns `command` from the spawner thread, registered with the calling task's runtime: the
/// spawn's own result, or why the spawner thread could not give one.
pub(crate) async fn spawn(mut command: Command) -> Result<std::io::Result<Child>, SpawnerError> {
    let runtime = tokio::runtime::Handle::current();
    let (done, result) = oneshot::channel();
    let slot = submit(Box::new(move || {
        let _entered = runtime.enter();
        let _ = done.send(command.spawn());
    }))?;
    match tokio::time::timeout(SPAWN_TIMEOUT, result).await {
        Ok(Ok(spawned)) => Ok(spawned),
        Ok(Err(_)) => Err(SpawnerError::Dropped),
        Err(_) => {
            // A thread that does not answer is not trusted again: the next spawn starts anew.
            forget(slot);
            Err(SpawnerError::NoAnswer)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spawner thread that stopped answering is replaced, but keeps running: the workers it
    /// forked die with the thread (their parent-death signal), not with the host.
    #[test]
    fn a_forgotten_spawner_thread_keeps_running() {
        let (done, answered) = mpsc::channel();
        let slot = submit(Box::new(move || {
            let _ = done.send(rustix::thread::gettid().as_raw_nonzero().get());
        }))
        .expect("a spawner thread starts");
        let tid = answered
            .recv_timeout(SPAWN_TIMEOUT)
            .expect("the spawner thread runs its job");
        forget(slot);
        // A thread whose queue closed ends at once; give it the moment it would take.
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            crate::sys::thread_exists(tid),
            "the forgotten spawner thread ended, and with it every worker it forked"
        );
    }
}
