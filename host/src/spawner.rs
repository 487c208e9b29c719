//! Every worker is forked from one dedicated thread that lives as long as the host process.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process.
//! Tokio retires its threads in normal operation (a blocking-pool thread idles out after ten
//! seconds), so a worker forked from one of them would be SIGKILLed while its host is alive and
//! well. Forking from a thread that never exits makes the signal mean what it should: the host
//! process is gone.
//!
//! The thread belongs to the process that started it: a process forked from the host has no
//! such thread, so it starts its own (keyed by pid). A thread that failed to start is retried
//! on the next spawn, and every wait for it is bounded.

use std::sync::{mpsc, Mutex};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send>;

/// How long a spawn may wait for the spawner thread: forking takes milliseconds.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(30);

/// The spawner thread of this process: its pid and the queue it reads.
static SPAWNER: Mutex<Option<(u32, mpsc::Sender<Job>)>> = Mutex::new(None);

fn start_thread() -> std::io::Result<mpsc::Sender<Job>> {
    let (jobs, queue) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("airlock-spawner".into())
        .spawn(move || {
            for job in queue {
                // A failing spawn reports through its own channel; a panic must not take the
                // thread (and every later spawn) with it.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            }
        })?;
    Ok(jobs)
}

/// Hands `job` to this process's spawner thread, starting one if there is none.
fn submit(job: Job) -> std::io::Result<()> {
    let mut spawner = SPAWNER
        .lock()
        .map_err(|_| std::io::Error::other("the airlock spawner lock is poisoned"))?;
    let pid = std::process::id();
    let jobs = match spawner.as_ref() {
        Some((owner, jobs)) if *owner == pid => jobs.clone(),
        _ => {
            let jobs = start_thread()?;
            *spawner = Some((pid, jobs.clone()));
            jobs
        }
    };
    jobs.send(job).map_err(|_| {
        // The thread is gone (it never is, but be ready): forget it so the next spawn retries.
        *spawner = None;
        std::io::Error::other("the airlock spawner thread is gone")
    })
}

/// Spawns `command` from the spawner thread, registered with the calling task's runtime.
pub(crate) async fn spawn(mut command: Command) -> std::io::Result<Child> {
    let runtime = tokio::runtime::Handle::current();
    let (done, result) = oneshot::channel();
    submit(Box::new(move || {
        let _entered = runtime.enter();
        let _ = done.send(command.spawn());
    }))?;
    match tokio::time::timeout(SPAWN_TIMEOUT, result).await {
        Ok(Ok(spawned)) => spawned,
        Ok(Err(_)) => Err(std::io::Error::other(
            "the airlock spawner thread dropped a spawn",
        )),
        Err(_) => Err(std::io::Error::other(
            "the airlock spawner thread did not answer",
        )),
    }
}
