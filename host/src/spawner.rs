//! Every worker is forked from one dedicated thread that lives as long as the host process.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process.
//! Tokio retires its threads in normal operation (a blocking-pool thread idles out after ten
//! seconds), so a worker forked from one of them would be SIGKILLed while its host is alive and
//! well. Forking from a thread that never exits makes the signal mean what it should: the host
//! process is gone.

use std::sync::mpsc;
use std::sync::OnceLock;

use tokio::process::{Child, Command};
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce() + Send>;

fn spawner() -> Option<&'static mpsc::Sender<Job>> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();
    SPAWNER
        .get_or_init(|| {
            let (jobs, queue) = mpsc::channel::<Job>();
            std::thread::Builder::new()
                .name("airlock-spawner".into())
                .spawn(move || {
                    for job in queue {
                        // A failing spawn reports through its own channel; a panic must not
                        // take the thread (and every later spawn) with it.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .ok()
                .map(|_| jobs)
        })
        .as_ref()
}

/// Spawns `command` from the spawner thread, registered with the calling task's runtime.
pub(crate) async fn spawn(mut command: Command) -> std::io::Result<Child> {
    let runtime = tokio::runtime::Handle::current();
    let (done, result) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _entered = runtime.enter();
        let _ = done.send(command.spawn());
    });
    let Some(spawner) = spawner() else {
        return Err(std::io::Error::other(
            "the airlock spawner thread could not start",
        ));
    };
    spawner
        .send(job)
        .map_err(|_| std::io::Error::other("the airlock spawner thread is gone"))?;
    result
        .await
        .map_err(|_| std::io::Error::other("the airlock spawner thread dropped a spawn"))?
}
