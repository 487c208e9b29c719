//! Starting a worker: a child process, or (in-process mode) a task in this process speaking the
//! same protocol over an in-memory stream.

use std::sync::Arc;
use std::time::Duration;

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_transport_pipe::StreamTransport;
use airlock_worker::Worker;
use tokio::task::JoinHandle;

use crate::config::Settings;
use crate::stats::Counters;
use crate::stderr::StderrRelay;
use crate::{ExitInfo, SpawnError};

/// Bytes buffered in each direction of an in-process worker's stream.
const IN_PROCESS_BUFFER: usize = 1 << 20;

/// Builds a fresh worker for in-process mode, once per (re)start.
pub(crate) type WorkerFactory = Arc<dyn Fn() -> Worker + Send + Sync>;

/// How workers are started.
#[derive(Clone)]
pub(crate) enum Launcher {
    /// A child process from `Settings::program`.
    Process,
    /// A task in this process.
    InProcess(WorkerFactory),
}

/// A started worker, before its handshake.
pub(crate) struct Launched {
    pub(crate) process: WorkerProcess,
    pub(crate) sender: Box<dyn FrameSender>,
    pub(crate) receiver: Box<dyn FrameReceiver>,
    /// A first frame already read while authenticating the peer.
    pub(crate) hello: Option<bytes::Bytes>,
    /// The token the session must require in the `Hello`.
    pub(crate) token: Option<[u8; airlock_protocol::TOKEN_LEN]>,
    pub(crate) stderr: Option<StderrRelay>,
    /// What the worker was verified to run under.
    pub(crate) confinement: crate::ConfinementReport,
}

/// What runs the worker's code. One per worker, so the variants' size difference is moot.
#[allow(clippy::large_enum_variant)]
pub(crate) enum WorkerProcess {
    /// A child process leading its own process group.
    Child {
        /// The host's child: the worker, or the keeper of a worker in namespaces.
        child: crate::child::WorkerChild,
        /// The worker's pid; without namespaces also its process group id.
        pid: u32,
        /// A pidfd for the worker when it is not `child` itself (it runs in namespaces: its
        /// PID namespace, not a process group, holds everything it started).
        pidfd: Option<std::os::fd::OwnedFd>,
        /// The worker's own cgroup, removed once it is reaped.
        cgroup: Option<crate::confinement::WorkerCgroup>,
        /// Set once it has been reaped (its group was killed at that moment).
        exited: Option<ExitInfo>,
    },
    /// A task (in-process mode).
    Task {
        /// The serving task.
        task: JoinHandle<()>,
        /// Set once the task has been awaited to completion (it must not be polled again).
        done: bool,
    },
}

impl Launcher {
    pub(crate) async fn launch(
        &self,
        settings: &Settings,
        counters: &Counters,
    ) -> Result<Launched, SpawnError> {
        match self {
            Launcher::Process => {
                let turn = counters.stderr_tail.clear();
                let mut spawned = crate::spawn::spawn(settings).await?;
                let stderr = match spawned.stderr.take().map(|stderr| {
                    StderrRelay::start(
                        stderr,
                        format!("{}[{}]", settings.label, spawned.pid),
                        settings.stderr,
                        Arc::clone(&counters.stderr_dropped),
                        (Arc::clone(&counters.stderr_tail), turn),
                    )
                }) {
                    None => None,
                    Some(Ok(relay)) => Some(relay),
                    Some(Err(err)) => {
                        // No thread to read it (the process is out of threads): the worker
                        // is not kept without one.
                        spawned.kill().await;
                        return Err(SpawnError::Transport(err));
                    }
                };
                Ok(Launched {
                    process: WorkerProcess::Child {
                        child: spawned.child,
                        pid: spawned.pid,
                        pidfd: spawned.pidfd,
                        cgroup: spawned.cgroup,
                        exited: None,
                    },
                    sender: spawned.sender,
                    receiver: spawned.receiver,
                    hello: spawned.hello,
                    token: spawned.token,
                    stderr,
                    confinement: spawned.confinement,
                })
            }
            Launcher::InProcess(factory) => {
                let (host_end, worker_end) = tokio::io::duplex(IN_PROCESS_BUFFER);
                let (host_read, host_write) = tokio::io::split(host_end);
                let (worker_read, worker_write) = tokio::io::split(worker_end);
                let config = crate::spawn::stream_config(settings);
                // The worker's side is not capped for the handshake: it raises its own cap
                // from the `Welcome` anyway, and trusts nothing before it.
                let worker_config = airlock_transport_pipe::StreamConfig {
                    max_frame: settings.protocol.frame_limit(),
                    ..config
                };
                let worker_transport =
                    StreamTransport::new(worker_read, worker_write, worker_config);
                let worker = factory();
                let task = tokio::spawn(async move {
                    if let Err(err) = worker.serve_on(worker_transport).await {
                        tracing::debug!(target: "airlock::in_process", "worker ended: {err}");
                    }
                });
                let (sender, receiver) =
                    StreamTransport::new(host_read, host_write, config).split();
                Ok(Launched {
                    process: WorkerProcess::Task { task, done: false },
                    sender: Box::new(sender),
                    receiver: Box::new(receiver),
                    hello: None,
                    token: None,
                    stderr: None,
                    confinement: crate::ConfinementReport::unconfined(
                        std::process::id(),
                        rustix::process::geteuid().as_raw(),
                    ),
                })
            }
        }
    }
}

impl WorkerProcess {
    /// Waits for the worker to end on its own. A child's process group is killed the moment the
    /// child is reaped, so a grandchild holding the channel open dies with it.
    pub(crate) async fn wait(&mut self) -> ExitInfo {
        match self {
            WorkerProcess::Child {
                child,
                pid,
                pidfd,
                cgroup,
                exited,
            } => {
                if let Some(info) = exited {
                    return *info;
                }
                let info = exit_info(child.wait().await.ok());
                if pidfd.is_none() {
                    kill_group(*pid);
                }
                remove_cgroup(cgroup);
                *exited = Some(info);
                info
            }
            WorkerProcess::Task { task, done } => {
                if !*done {
                    let _ = task.await;
                    *done = true;
                }
                ExitInfo {
                    code: Some(0),
                    signal: None,
                }
            }
        }
    }

    /// The exit of a worker that already ended on its own (reaping it, and killing what is
    /// left of its group), without waiting; `None` if it still runs.
    pub(crate) fn ended(&mut self) -> Option<ExitInfo> {
        match self {
            WorkerProcess::Child {
                child,
                pid,
                pidfd,
                cgroup,
                exited,
            } => {
                if exited.is_none() {
                    if let Ok(Some(status)) = child.try_wait() {
                        if pidfd.is_none() {
                            kill_group(*pid);
                        }
                        remove_cgroup(cgroup);
                        *exited = Some(exit_info(Some(status)));
                    }
                }
                *exited
            }
            WorkerProcess::Task { task, .. } => task.is_finished().then_some(ExitInfo {
                code: Some(0),
                signal: None,
            }),
        }
    }

    /// Kills the worker and everything it started (its whole process group), then reaps it.
    /// Bounded: gives up waiting after `reap_timeout` (the process is already SIGKILLed).
    pub(crate) async fn kill_and_reap(&mut self, reap_timeout: Duration) -> Option<ExitInfo> {
        match self {
            WorkerProcess::Child {
                child,
                pid,
                pidfd,
                cgroup,
                exited,
            } => {
                if let Some(info) = exited {
                    return Some(*info);
                }
                kill_worker(*pid, pidfd.as_ref());
                // A keeper exits as soon as its worker (and with it the worker's whole PID
                // namespace) is gone; killing it too would leave the worker to be reaped by
                // someone else, later.
                if pidfd.is_none() {
                    let _ = child.start_kill();
                }
                let mut info = match tokio::time::timeout(reap_timeout, child.wait()).await {
                    Ok(status) => Some(exit_info(status.ok())),
                    Err(_) => None,
                };
                if info.is_none() && pidfd.is_some() {
                    let _ = child.start_kill();
                    info = tokio::time::timeout(reap_timeout, child.wait())
                        .await
                        .ok()
                        .map(|status| exit_info(status.ok()));
                }
                if info.is_some() {
                    remove_cgroup(cgroup);
                }
                *exited = info;
                info
            }
            WorkerProcess::Task { task, done } => {
                task.abort();
                if !*done && tokio::time::timeout(reap_timeout, &mut *task).await.is_ok() {
                    *done = true;
                }
                None
            }
        }
    }
}

/// A worker dropped before it was reaped (its host's runtime ended without `shutdown`) takes
/// what it started with it, as a reaped one does. In namespaces the keeper's death does that
/// (init follows it, and the kernel empties the PID namespace); otherwise the worker leads a
/// process group, which is killed here while the unreaped leader still holds its id (the
/// child itself is then killed by its own drop).
impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let WorkerProcess::Child {
            pid,
            pidfd: None,
            exited: None,
            ..
        } = self
        {
            kill_group(*pid);
        }
    }
}

/// Removes a reaped worker's cgroup, killing whatever of the worker is still in it (see
/// `WorkerCgroup::remove`).
fn remove_cgroup(cgroup: &mut Option<crate::confinement::WorkerCgroup>) {
    if let Some(mut cgroup) = cgroup.take() {
        cgroup.remove();
    }
}

/// SIGKILLs the worker and everything it started: through its pidfd when it runs in
/// namespaces (its init then exits, and the kernel kills the rest of the PID namespace), else
/// its process group.
pub(crate) fn kill_worker(pid: u32, pidfd: Option<&std::os::fd::OwnedFd>) {
    match pidfd {
        Some(pidfd) => {
            let _ = rustix::process::pidfd_send_signal(pidfd, rustix::process::Signal::KILL);
        }
        None => kill_group(pid),
    }
}

/// SIGKILLs every process in the group led by `pid`. Called only while the leader is
/// unreaped or just reaped, so the group id cannot have been reused.
pub(crate) fn kill_group(pid: u32) {
    if let Some(pgid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
}

fn exit_info(status: Option<std::process::ExitStatus>) -> ExitInfo {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(status) => ExitInfo {
            code: status.code(),
            signal: status.signal(),
        },
        None => ExitInfo::default(),
    }
}
