//! The supervisor: one task per host that launches its worker, keeps time for it, watches its
//! process, takes the calls that find no worker ready, and replaces the worker when it is lost.
//!
//! ```text
//!   launch ──▶ drive (handshake, calls) ──▶ worker lost ──▶ backoff ──▶ launch ...
//!                   │                                        │
//!                   └── shutdown requested / host dropped ───┴──▶ end (every call answered)
//! ```
//!
//! Everything about one worker lives in one `drive` call; when it returns, the worker has been
//! SIGKILLed and reaped and every call that was on it has its outcome. The calls themselves do
//! not pass through here: callers begin them and the reader task completes them, on the shared
//! connection (see `connection.rs`). The supervisor never reads or writes the worker's channel,
//! so a worker that stalls a read or a write inside the kernel cannot stop it from seeing a
//! deadline pass and killing the worker.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_protocol::transport::FrameSender;
use airlock_protocol::{AbortReason, CloseReason, Event, HostSession, Transmit, TransportError};
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::config::Settings;
use crate::connection::{deliver, fail, read_frames, Core, Live};
use crate::launch::{Launched, Launcher, WorkerProcess};
use crate::stats::Counters;
use crate::{CallError, ExitInfo, LostReason, SpawnError, WorkerInfo};

/// How long a closing session's last frames (a `Refuse`) may take to be written.
const LAST_WORDS: Duration = Duration::from_millis(100);
/// How long the stderr relay may take to log a dead worker's last lines (then it is aborted).
const STDERR_DRAIN: Duration = Duration::from_millis(100);
/// How long frames already written by an exited worker may take to arrive.
const EXIT_DRAIN: Duration = Duration::from_millis(100);
/// Longest wait to reap a SIGKILLed worker.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// A call handed to the supervisor.
pub(crate) struct CallRequest {
    /// Local handle for cancellation; never sent anywhere.
    pub(crate) key: u64,
    pub(crate) method: &'static str,
    pub(crate) body: Bytes,
    pub(crate) deadline: Instant,
    /// Decodes the method's response; run by the reader task before it accepts another frame.
    pub(crate) decode: Decode,
    pub(crate) reply: oneshot::Sender<CallReply>,
}

/// Decodes a response body into the method's response type, boxed for the caller.
pub(crate) type Decode = fn(
    &[u8],
    &airlock_codec::Limits,
) -> Result<Box<dyn std::any::Any + Send>, airlock_codec::DecodeError>;

/// What the supervisor answers a call with.
pub(crate) enum CallReply {
    /// The worker's response, decoded (to the method's response type) where it was accepted.
    Returned(Box<dyn std::any::Any + Send>),
    /// Any failure.
    Failed(CallError),
}

pub(crate) enum Command {
    Call(CallRequest),
    /// The caller dropped its call.
    Cancel(u64),
    /// Shut down gracefully; answered when done.
    Shutdown(oneshot::Sender<()>),
}

pub(crate) struct Supervisor {
    settings: Arc<Settings>,
    launcher: Launcher,
    commands: mpsc::UnboundedReceiver<Command>,
    counters: Arc<Counters>,
    alive: Arc<AtomicBool>,
    /// The connection callers and the reader task share with this supervisor.
    live: Arc<Live>,
    /// Calls accepted but not yet on a worker (handshake or restart in progress).
    waiting: VecDeque<CallRequest>,
    generation: u64,
    restart_times: VecDeque<Instant>,
    shutdown: Option<Vec<oneshot::Sender<()>>>,
}

/// How one worker's life ended.
struct WorkerEnd {
    reason: LostReason,
}

impl Supervisor {
    pub(crate) fn new(
        settings: Arc<Settings>,
        launcher: Launcher,
        commands: mpsc::UnboundedReceiver<Command>,
        counters: Arc<Counters>,
        alive: Arc<AtomicBool>,
        live: Arc<Live>,
    ) -> Self {
        Self {
            settings,
            launcher,
            commands,
            counters,
            alive,
            live,
            waiting: VecDeque::new(),
            generation: 0,
            restart_times: VecDeque::new(),
            shutdown: None,
        }
    }

    /// Runs until shutdown. `ready` learns whether the first worker completed its handshake.
    pub(crate) async fn run(mut self, ready: oneshot::Sender<Result<WorkerInfo, SpawnError>>) {
        let mut ready = Some(ready);
        let mut backoff = self.settings.restart.initial_backoff;
        loop {
            self.generation += 1;
            let started = Instant::now();
            let end = match self
                .launcher
                .launch(&self.settings, &self.counters.stderr_dropped)
                .await
            {
                Ok(launched) => {
                    if let WorkerProcess::Child { pid, .. } = &launched.process {
                        self.counters.worker_pid.store(*pid, Ordering::Relaxed);
                    }
                    self.drive(launched, &mut ready).await
                }
                Err(err) => {
                    tracing::warn!(target: "airlock::host", worker = %self.settings.label, "launch failed: {err}");
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(Err(err));
                        return self.finish();
                    }
                    // A replacement that failed its handshake before a session existed (the
                    // named socket's listener waited out its deadline) is lost for that reason.
                    let reason = match err {
                        SpawnError::Handshake(reason) => reason,
                        _ => LostReason::TransportFailed,
                    };
                    WorkerEnd { reason }
                }
            };
            if let Some(ready) = ready.take() {
                // The first worker never became ready: the spawn fails, nothing restarts.
                let _ = ready.send(Err(SpawnError::Handshake(end.reason)));
                return self.finish();
            }
            if self.shutdown.is_some() {
                return self.finish();
            }
            tracing::warn!(target: "airlock::host", worker = %self.settings.label, reason = %end.reason, "worker lost");
            if !self.restart_allowed() {
                tracing::error!(target: "airlock::host", worker = %self.settings.label, "restart budget exhausted; calls now fail fast");
                return self.exhausted().await;
            }
            if started.elapsed() > self.settings.restart.window {
                // It ran well for a whole window: this failure starts a fresh backoff.
                backoff = self.settings.restart.initial_backoff;
            }
            if !self.pause(backoff).await {
                return self.finish();
            }
            backoff = (backoff * 2).min(self.settings.restart.max_backoff);
            self.counters.restarts.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn restart_allowed(&mut self) -> bool {
        let policy = self.settings.restart;
        let now = Instant::now();
        while self
            .restart_times
            .front()
            .is_some_and(|t| now.duration_since(*t) > policy.window)
        {
            self.restart_times.pop_front();
        }
        if self.restart_times.len() >= policy.max_restarts as usize {
            return false;
        }
        self.restart_times.push_back(now);
        true
    }

    /// Waits out a backoff while still taking commands. False if the host is shutting down.
    async fn pause(&mut self, backoff: Duration) -> bool {
        let until = tokio::time::Instant::now() + backoff;
        loop {
            self.expire_waiting(Instant::now());
            let next_expiry = self.next_waiting_deadline();
            tokio::select! {
                _ = tokio::time::sleep_until(until) => return true,
                _ = sleep_until_opt(next_expiry) => {}
                command = self.commands.recv() => match command {
                    None => return false,
                    Some(Command::Shutdown(done)) => {
                        self.shutdown.get_or_insert_with(Vec::new).push(done);
                        return false;
                    }
                    Some(Command::Call(call)) => self.queue(call),
                    Some(Command::Cancel(key)) => self.cancel_waiting(key),
                },
            }
        }
    }

    /// The restart budget is spent: answer every call at once until the host goes away.
    async fn exhausted(mut self) {
        self.alive.store(false, Ordering::Relaxed);
        for call in self.waiting.drain(..) {
            fail(
                call.reply,
                CallError::WorkerLost(LostReason::RestartBudgetExhausted),
            );
        }
        while let Some(command) = self.commands.recv().await {
            match command {
                Command::Call(call) => fail(
                    call.reply,
                    CallError::WorkerLost(LostReason::RestartBudgetExhausted),
                ),
                Command::Shutdown(done) => {
                    let _ = done.send(());
                    break;
                }
                Command::Cancel(_) => {}
            }
        }
        self.finish();
    }

    /// Ends the host: every call still waiting fails with `Shutdown`, shutdown waiters learn
    /// it is done, and later calls find the channel closed.
    fn finish(mut self) {
        self.alive.store(false, Ordering::Relaxed);
        self.commands.close();
        for call in self.waiting.drain(..) {
            fail(call.reply, CallError::Shutdown);
        }
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Call(call) => fail(call.reply, CallError::Shutdown),
                Command::Shutdown(done) => {
                    let _ = done.send(());
                }
                Command::Cancel(_) => {}
            }
        }
        for done in self.shutdown.take().into_iter().flatten() {
            let _ = done.send(());
        }
    }

    fn queue(&mut self, call: CallRequest) {
        if self.waiting.len() >= self.settings.protocol.in_flight_limit() as usize {
            fail(call.reply, CallError::Overloaded);
        } else {
            self.waiting.push_back(call);
        }
    }

    fn cancel_waiting(&mut self, key: u64) {
        self.waiting.retain(|call| call.key != key);
    }

    fn next_waiting_deadline(&self) -> Option<Instant> {
        self.waiting.iter().map(|c| c.deadline).min()
    }

    /// Calls that waited past their deadline for a worker time out without being sent.
    fn expire_waiting(&mut self, now: Instant) {
        let (expired, kept): (VecDeque<_>, VecDeque<_>) =
            self.waiting.drain(..).partition(|c| c.deadline <= now);
        self.waiting = kept;
        for call in expired {
            fail(call.reply, CallError::Timeout);
        }
    }

    /// One worker's whole life: handshake, calls, and its end. Returns once the worker is
    /// killed and reaped and every call that was on it has an outcome.
    async fn drive(
        &mut self,
        launched: Launched,
        ready: &mut Option<oneshot::Sender<Result<WorkerInfo, SpawnError>>>,
    ) -> WorkerEnd {
        let Launched {
            mut process,
            sender,
            receiver,
            hello,
            token,
            mut stderr,
            mut confinement,
        } = launched;
        let mut config = self.settings.protocol.clone();
        if let Some(token) = token {
            // The transport already checked the token; the session checks it again.
            config = config.clone().token(token).unwrap_or(config);
        }
        let mut session = HostSession::new(config, Instant::now());
        let limits = self.settings.response_limits();
        if let Some(hello) = hello {
            session.handle_frame(hello);
        }
        let (batches_tx, batches_rx) = mpsc::unbounded_channel::<Vec<Transmit>>();
        *self.live.lock() = Some(Core::new(session, batches_tx));
        let (raise_tx, raise_rx) = oneshot::channel();
        let mut raise_tx = Some(raise_tx);
        let mut reader = tokio::spawn(read_frames(
            receiver,
            Arc::clone(&self.live),
            raise_rx,
            limits,
        ));
        let mut reader_done = false;
        let mut writer = tokio::spawn(write_frames(sender, batches_rx));
        let mut writer_done = false;

        let mut exited: Option<(ExitInfo, Instant)> = None;
        let mut grace_until: Option<Instant> = None;
        let mut handles_gone = false;
        // One timer for the whole life, moved only when the next deadline changes. It is left
        // armed at a deadline that has since been met (see `Live::try_begin`), and re-armed
        // when it fires.
        let mut timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        let mut timer_set_for: Option<Instant> = None;

        let close_reason = loop {
            // 1. Events the session left for the supervisor.
            self.expire_waiting(Instant::now());
            let events = self.with_core(|core| std::mem::take(&mut core.events));
            let mut closed = None;
            for event in events {
                match event {
                    Event::Ready(info) => {
                        // The worker installs its own filter before its Hello: check it now,
                        // before the first call is sent.
                        if let Err(err) = crate::confinement::verify_worker_filter(
                            &mut confinement,
                            self.settings.confinement.require_worker_filter,
                        ) {
                            tracing::warn!(target: "airlock::confinement", worker = %self.settings.label, "{err}");
                            if let Some(ready) = ready.take() {
                                let _ = ready.send(Err(SpawnError::Confinement(err)));
                            }
                            self.with_core(|core| {
                                core.session.abort(CloseReason::Aborted(
                                    AbortReason::ConfinementNotVerified,
                                ));
                            });
                            continue;
                        }
                        if let Some(raise) = raise_tx.take() {
                            let _ = raise.send(self.settings.protocol.frame_limit());
                        }
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(Ok(WorkerInfo::new(info, confinement.clone())));
                        }
                        let waiting = std::mem::take(&mut self.waiting);
                        let shutting_down = self.shutdown.is_some();
                        self.with_core(|core| {
                            for call in waiting {
                                core.begin(call);
                            }
                            core.accepting = !shutting_down && core.session.is_ready();
                        });
                    }
                    Event::Closed(reason) => closed = Some(reason),
                    _ => {}
                }
            }
            if let Some(reason) = closed {
                break reason;
            }

            // 2. Arm the timer for the next deadline. Under the lock, with the session's own
            // deadline and the record callers compare theirs against in one step, so a call
            // begun meanwhile either sees the new timer or wakes this loop.
            let others = [
                self.next_waiting_deadline(),
                grace_until,
                exited.map(|(_, at)| at + EXIT_DRAIN),
            ]
            .into_iter()
            .flatten()
            .min();
            let more_events = {
                let mut guard = self.live.lock();
                let Some(core) = guard.as_mut() else {
                    break CloseReason::Aborted(AbortReason::TransportFailed);
                };
                let next = core.session.poll_timeout().into_iter().chain(others).min();
                // Moved only to an earlier deadline, or once it has fired: a later one is
                // reached by re-arming when the earlier fires.
                if let Some(at) = next {
                    if timer_set_for.is_none_or(|set| at < set) {
                        timer.as_mut().reset(tokio::time::Instant::from_std(at));
                        timer_set_for = Some(at);
                    }
                }
                core.timer_at = timer_set_for;
                !core.events.is_empty()
            };
            if more_events {
                continue;
            }

            // 3. Wait for the next input: a command, a wake-up, time, the process, the tasks.
            tokio::select! {
                command = self.commands.recv(), if !handles_gone => match command {
                    Some(Command::Call(call)) => {
                        if let Err(call) = self.live.try_begin(call) {
                            self.queue(call);
                        }
                    }
                    Some(Command::Cancel(key)) => {
                        let on_worker = self.with_core(|core| match core.link.keys.remove(&key) {
                            Some(id) => {
                                core.session.cancel(id);
                                true
                            }
                            None => false,
                        });
                        if !on_worker {
                            self.cancel_waiting(key);
                        }
                    }
                    Some(Command::Shutdown(done)) => {
                        self.shutdown.get_or_insert_with(Vec::new).push(done);
                        self.begin_shutdown();
                        grace_until.get_or_insert(Instant::now() + self.settings.shutdown_grace);
                    }
                    None => {
                        // Every handle is gone: shut down as if asked.
                        handles_gone = true;
                        self.shutdown.get_or_insert_with(Vec::new);
                        self.begin_shutdown();
                        grace_until.get_or_insert(Instant::now() + self.settings.shutdown_grace);
                    }
                },
                () = self.live.wake.notified() => {}
                result = &mut reader, if !reader_done => {
                    reader_done = true;
                    if result.is_err() {
                        self.with_core(|core| {
                            core.session.abort(CloseReason::Aborted(AbortReason::TransportFailed));
                        });
                    }
                },
                result = &mut writer, if !writer_done => {
                    writer_done = true;
                    if !matches!(result, Ok(Ok(()))) {
                        self.with_core(|core| {
                            core.session.abort(CloseReason::Aborted(AbortReason::TransportFailed));
                        });
                    }
                },
                info = process.wait(), if exited.is_none() => {
                    exited = Some((info, Instant::now()));
                    if let Some(relay) = &mut stderr {
                        relay.worker_gone();
                    }
                }
                () = &mut timer, if timer_set_for.is_some() => {
                    // Fired: re-armed next turn if a deadline is still pending.
                    timer_set_for = None;
                    let now = Instant::now();
                    let grace_over = grace_until.is_some_and(|t| now >= t);
                    let drained = exited.is_some_and(|(_, at)| now >= at + EXIT_DRAIN);
                    self.with_core(|core| {
                        core.session.handle_timeout(now);
                        if grace_over {
                            core.session.abort(CloseReason::Aborted(AbortReason::HostShutdown));
                        } else if drained {
                            core.session.abort(CloseReason::Aborted(AbortReason::ProcessExited));
                        }
                    });
                }
            }
        };

        // 4. The worker is over. No caller can reach it now; write what the session still has
        // to say (a `Refuse` telling a refused worker why), for a bounded moment, then kill
        // and reap it, stop its tasks, and answer its lost calls.
        let mut core = self.live.lock().take();
        let last_words = core
            .as_mut()
            .map(|core| std::mem::take(&mut core.last_words))
            .unwrap_or_default();
        reader.abort();
        if last_words.is_empty() || writer_done {
            // Nothing more to say: stop the writer before the kill, so no batch it still holds
            // (calls now reported lost) reaches whoever may drain the pipe meanwhile.
            writer.abort();
        } else if core
            .as_mut()
            .is_some_and(|core| core.send_last_words(last_words))
        {
            let _ = tokio::time::timeout(LAST_WORDS, &mut writer).await;
            // An honest worker exits when refused; give it the moment to read why.
            if exited.is_none() {
                if let Ok(info) = tokio::time::timeout(LAST_WORDS, process.wait()).await {
                    exited = Some((info, Instant::now()));
                }
            }
        }
        // A worker that ended by itself (an exit, a crash, a signal from elsewhere) is reported
        // as exited whatever the session noticed first (often a failed write).
        let ended_by_itself = exited.map(|(info, _)| info).or_else(|| process.ended());
        let exit = match ended_by_itself {
            Some(info) => Some(info),
            None => process.kill_and_reap(REAP_TIMEOUT).await,
        };
        writer.abort();
        if let Some(mut relay) = stderr {
            // The worker is reaped: the relay logs what is buffered and ends. A grandchild
            // that escaped the process group may still hold the pipe; it gets nothing more.
            relay.worker_gone();
            if tokio::time::timeout(STDERR_DRAIN, &mut relay.task)
                .await
                .is_err()
            {
                relay.task.abort();
            }
        }
        if let WorkerProcess::Task { .. } = process {
            let _ = process.kill_and_reap(REAP_TIMEOUT).await;
        }
        let reason = match (&close_reason, ended_by_itself) {
            (CloseReason::Aborted(AbortReason::TransportFailed), Some(info)) => {
                LostReason::Exited(info)
            }
            _ => lost_reason(&close_reason, exit),
        };
        if let Some(code) = reason.violation_code() {
            self.counters.violation(code);
            tracing::warn!(target: "airlock::host", worker = %self.settings.label, "protocol violation: {reason}");
        }
        if let Some(core) = &mut core {
            core.link.fail_all(&reason);
        }
        WorkerEnd { reason }
    }

    /// Runs `f` on the connected worker's core (and settles what it changed); `f`'s default
    /// result when no worker is connected.
    fn with_core<T: Default>(&self, f: impl FnOnce(&mut Core) -> T) -> T {
        let (result, settled) = {
            let mut guard = self.live.lock();
            let Some(core) = guard.as_mut() else {
                return T::default();
            };
            let result = f(core);
            (result, core.settle())
        };
        deliver(&self.live, settled, &self.settings.response_limits());
        result
    }

    /// Stops callers from beginning calls on this worker and asks it to finish.
    fn begin_shutdown(&self) {
        self.with_core(|core| {
            core.accepting = false;
            core.session.shutdown();
        });
    }
}

fn lost_reason(reason: &CloseReason, exit: Option<ExitInfo>) -> LostReason {
    let exited = || LostReason::Exited(exit.unwrap_or_default());
    match reason {
        CloseReason::Violation(v) => LostReason::Violation(v.clone()),
        CloseReason::Refused(r) => LostReason::Refused(*r),
        CloseReason::HandshakeTimeout => LostReason::HandshakeTimeout,
        CloseReason::CallTimeout => LostReason::OtherCallTimedOut,
        CloseReason::WorkerClosed => exited(),
        CloseReason::Shutdown => LostReason::Shutdown,
        CloseReason::Aborted(AbortReason::UndecodableResponse) => LostReason::UndecodableResponse,
        CloseReason::Aborted(AbortReason::ProcessExited) => exited(),
        CloseReason::Aborted(AbortReason::HostShutdown) => LostReason::Shutdown,
        CloseReason::Aborted(AbortReason::ConfinementNotVerified) => {
            LostReason::ConfinementNotVerified
        }
        CloseReason::Aborted(_) => LostReason::TransportFailed,
        _ => LostReason::TransportFailed,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// The writer task: writes each batch the session produced, coalescing what is queued into one
/// vectored write. It holds no lock: a write the worker stalls stalls only this task.
async fn write_frames(
    mut sender: Box<dyn FrameSender>,
    mut batches: mpsc::UnboundedReceiver<Vec<Transmit>>,
) -> Result<(), TransportError> {
    while let Some(mut batch) = batches.recv().await {
        while let Ok(more) = batches.try_recv() {
            batch.extend(more);
        }
        sender.send(&batch).await?;
    }
    Ok(())
}
