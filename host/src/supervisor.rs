//! The supervisor: one task per host that owns the current worker's session, moves bytes and
//! time into it, delivers outcomes, and replaces the worker when it is lost.
//!
//! ```text
//!   launch ──▶ drive (handshake, calls) ──▶ worker lost ──▶ backoff ──▶ launch ...
//!                   │                                        │
//!                   └── shutdown requested / host dropped ───┴──▶ end (every call answered)
//! ```
//!
//! Everything about one worker lives in one `drive` call; when it returns, the worker has been
//! SIGKILLed and reaped and every call that was on it has its outcome.
//!
//! The supervisor never reads or writes the worker's channel (see [`crate::connection`]): a
//! worker can make a pipe `read(2)` or `write(2)` sleep inside the kernel (holding the pipe's
//! lock from a page fault it never serves), and only a loop that is not itself in that system
//! call can still see the deadline pass and kill the worker, which ends the sleep. Calls begin
//! and complete without it; it wakes for the handshake, earlier deadlines, the process, and
//! the worker's end.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_protocol::transport::Outgoing;
use airlock_protocol::{AbortReason, CloseReason, Event, HostSession};
use tokio::sync::{mpsc, oneshot};

use crate::connection::{drive_writes, fail, read_frames, Core, Inlet, Live, Party, Wire};
use crate::reply::Replier;
pub(crate) use crate::updates::Updates;
use crate::updates::{Cost, UpdateBudget};

use crate::config::Settings;
use crate::launch::{Launched, Launcher, WorkerProcess};
use crate::stats::Counters;
use crate::{CallError, ExitInfo, HandshakeError, LostReason, SpawnError, WorkerInfo};

/// How long a closing session's last frames (a `Refuse`) may take to be written.
const LAST_WORDS: Duration = Duration::from_millis(100);
/// How long the supervisor waits for the stderr relay to log a dead worker's last lines and
/// end (it ends by itself within half of it, unless the pipe's lock is held: SECURITY.md).
const STDERR_DRAIN: Duration = Duration::from_millis(100);
/// How long frames already written by an exited worker may take to arrive.
const EXIT_DRAIN: Duration = Duration::from_millis(100);
/// Longest wait to reap a SIGKILLed worker.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// A call handed to the supervisor.
pub(crate) struct CallRequest {
    /// Local handle for cancellation; never sent anywhere.
    pub(crate) key: u64,
    /// Borrowed for a typed call; owned for one named at run time (`Host::call_value`).
    pub(crate) method: Cow<'static, str>,
    pub(crate) body: airlock_protocol::Body,
    pub(crate) deadline: Instant,
    /// Where the call's outcome goes; it decodes the method's response where the worker's
    /// `Return` is accepted.
    pub(crate) reply: Replier,
    /// A streaming call's update channel (`Host::call_streaming`); `None` drops updates.
    pub(crate) updates: Option<Updates>,
}

/// Decodes a streaming call's update into its type, boxed for the update channel.
pub(crate) type Decode =
    fn(
        &[u8],
        &crate::response::ResponseDecoding,
    ) -> Result<(Box<dyn std::any::Any + Send>, Cost), airlock_codec::DecodeError>;

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
    /// The current worker's connection, shared with the host's handles.
    live: Arc<Live>,
    /// Calls accepted but not yet on a worker (handshake or restart in progress).
    waiting: VecDeque<CallRequest>,
    generation: u64,
    restart_times: VecDeque<Instant>,
    shutdown: Option<Vec<oneshot::Sender<()>>>,
    /// When the current worker's launch ended: its handshake is timed from here.
    launched_at: Instant,
    /// The cap on what streaming callers have not taken yet, per worker process.
    update_cap: Cost,
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
        // Untaken updates may hold what one response could decode to.
        let update_cap = Cost {
            bytes: settings.protocol.frame_limit() as usize,
            items: settings.response_limits().items_budget(),
        };
        Self {
            update_cap,
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
            launched_at: Instant::now(),
        }
    }

    /// Runs until shutdown. `ready` learns whether the first worker completed its handshake.
    pub(crate) async fn run(mut self, ready: oneshot::Sender<Result<WorkerInfo, SpawnError>>) {
        let mut ready = Some(ready);
        let mut backoff = self.settings.restart.initial_backoff;
        loop {
            self.generation += 1;
            let started = Instant::now();
            let end = match self.launch_taking_commands().await {
                Ok(launched) => {
                    self.launched_at = Instant::now();
                    let settings = &self.settings;
                    tracing::debug!(
                        target: "airlock::spawn",
                        worker = %settings.label,
                        program = %settings.program.display(),
                        transport = ?settings.transport,
                        confinement = ?settings.confinement.mode(),
                        duration_us = micros(started.elapsed()),
                        "worker spawned"
                    );
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
                        SpawnError::Handshake(failure) => failure.reason,
                        _ => LostReason::TransportFailed,
                    };
                    WorkerEnd { reason }
                }
            };
            if let Some(ready) = ready.take() {
                // The first worker never became ready: the spawn fails, nothing restarts.
                let _ = ready.send(Err(SpawnError::Handshake(HandshakeError::new(end.reason))));
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
            tracing::debug!(
                target: "airlock::restart",
                worker = %self.settings.label,
                reason = %end.reason,
                backoff_us = micros(backoff),
                restart = self.counters.restarts.load(Ordering::Relaxed) + 1,
                "replacing the lost worker after the backoff"
            );
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
                    Some(Command::Cancel(key)) => {
                        self.cancel_waiting(key);
                    }
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
        queue_call(&mut self.waiting, &self.settings, call);
    }

    /// Removes a call still waiting for a worker; false if none had that key.
    fn cancel_waiting(&mut self, key: u64) -> bool {
        cancel(&mut self.waiting, key)
    }

    fn next_waiting_deadline(&self) -> Option<Instant> {
        next_deadline(&self.waiting)
    }

    /// Calls that waited past their deadline for a worker time out without being sent.
    fn expire_waiting(&mut self, now: Instant) {
        expire(&mut self.waiting, now);
    }

    /// Launches the next worker while still taking commands (see [`Intake`]). A launch can
    /// take a while (a slow handshake, a loaded machine): nothing waits on it unanswered.
    async fn launch_taking_commands(&mut self) -> Result<Launched, SpawnError> {
        let Self {
            launcher,
            settings,
            counters,
            commands,
            waiting,
            shutdown,
            ..
        } = self;
        let launch = launcher.launch(settings, counters);
        let intake = Intake {
            commands,
            waiting,
            settings,
            shutdown,
        };
        intake.until(launch).await
    }

    /// The calls, cancels and shutdowns that arrive while the supervisor waits on something
    /// other than a live worker.
    fn intake(&mut self) -> Intake<'_> {
        Intake {
            commands: &mut self.commands,
            waiting: &mut self.waiting,
            settings: &self.settings,
            shutdown: &mut self.shutdown,
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
            config = config.token(token);
        }
        let mut session = HostSession::new(config, Instant::now());
        if let Some(hello) = hello {
            session.handle_frame(hello);
        }
        let live = Arc::clone(&self.live);
        let direct_writes = crate::confinement::runs_the_hosts_filter(&confinement);
        // Large request bodies go back to be encoded into again once written.
        let mut outgoing = Outgoing::new(sender);
        outgoing.recycle_written_bodies();
        let wire = Arc::new(Wire::new(outgoing, direct_writes));
        let limits = crate::response::ResponseDecoding::new(&self.settings);
        let inlet = Arc::new(Inlet::new(receiver, self.generation, limits));
        let mut core = Core::new(self.generation, session, Arc::clone(&wire));
        core.inlet = Some(Arc::clone(&inlet));
        *live.lock() = Some(core);
        // However this future ends (even dropped with its runtime), no caller is left waiting
        // on a core nobody drives.
        let detach = Detach(&live);
        let (raise_tx, raise_rx) = oneshot::channel();
        let mut raise_tx = Some(raise_tx);
        let reader = tokio::spawn(read_frames(
            inlet,
            Arc::clone(&live),
            raise_rx,
            // Each worker process has its own: a lost worker's updates stay charged to its
            // budget until their callers take or drop them, and never hold up its successor.
            UpdateBudget::new(self.update_cap),
        ));
        let writer = tokio::spawn(drive_writes(Arc::clone(&wire), Arc::clone(&live)));

        let mut exited: Option<(ExitInfo, Instant)> = None;
        let mut grace_until: Option<Instant> = None;
        let mut handles_gone = false;
        if self.shutdown.is_some() {
            // Asked for while this worker was being launched: carried out now (before its
            // handshake, that ends it at once).
            live.with_core(|core| core.session.shutdown());
            grace_until = Some(Instant::now() + self.settings.shutdown_grace);
        }
        // One timer for the whole life, moved only when the next deadline changes: a fresh
        // `sleep` per turn of the loop would enter and leave tokio's timer wheel several times
        // per call.
        let mut timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        let mut timer_set_for: Option<Instant> = None;

        let close_reason = loop {
            // 1. Events the core kept for the supervisor, and a failed write.
            let events = live
                .with_core(|core| {
                    if wire.failed() && !core.session.is_closed() {
                        core.session
                            .abort(CloseReason::Aborted(AbortReason::TransportFailed));
                    }
                    std::mem::take(&mut core.events)
                })
                .unwrap_or_default();
            let mut closed = None;
            for event in events {
                match event {
                    Event::Ready(info) => {
                        self.on_ready(info, &mut confinement, ready, &mut raise_tx);
                    }
                    Event::Closed(reason) => closed = Some(reason),
                    _ => {}
                }
            }
            if let Some(reason) = closed {
                break reason;
            }

            // 2. Wait for the next input: a command, a wake from the core, time, the process.
            let now = Instant::now();
            self.expire_waiting(now);
            let own_deadline = [
                self.next_waiting_deadline(),
                grace_until,
                exited.map(|(_, at)| at + EXIT_DRAIN),
            ]
            .into_iter()
            .flatten()
            .min();
            // Read the session's deadline and publish the timer's in one hold of the lock: a
            // caller that begins a call after it compares against what the timer will be.
            let next_deadline = live
                .with_core(|core| {
                    let next = core
                        .session
                        .poll_timeout()
                        .into_iter()
                        .chain(own_deadline)
                        .min();
                    core.timer_at = next;
                    next
                })
                .flatten();
            if next_deadline != timer_set_for {
                if let Some(at) = next_deadline {
                    timer.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                timer_set_for = next_deadline;
            }
            tokio::select! {
                () = live.wake.notified() => {}
                command = self.commands.recv(), if !handles_gone => match command {
                    Some(Command::Call(call)) => {
                        if let Err(call) = live.try_begin(call, Party::Supervisor) {
                            self.queue(call);
                        }
                    }
                    Some(Command::Cancel(key)) => {
                        if !self.cancel_waiting(key) {
                            live.cancel(key, Party::Supervisor);
                        }
                    }
                    Some(Command::Shutdown(done)) => {
                        self.shutdown.get_or_insert_with(Vec::new).push(done);
                        self.begin_shutdown(&live, &mut grace_until);
                    }
                    None => {
                        // Every handle is gone: shut down as if asked.
                        handles_gone = true;
                        self.shutdown.get_or_insert_with(Vec::new);
                        self.begin_shutdown(&live, &mut grace_until);
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
                    live.with_core(|core| {
                        core.session.handle_timeout(now);
                        if grace_until.is_some_and(|t| now >= t) {
                            core.session.abort(CloseReason::Aborted(AbortReason::HostShutdown));
                        } else if exited.is_some_and(|(_, at)| now >= at + EXIT_DRAIN) {
                            core.session.abort(CloseReason::Aborted(AbortReason::ProcessExited));
                        }
                    });
                }
            }
        };

        // 3. The worker is over. Write what the session still has to say (a `Refuse` telling a
        // refused worker why), for a bounded moment, then kill and reap it, stop its tasks,
        // and answer its lost calls. The wire dropped every frame not yet written when the
        // session closed: calls now reported lost never reach a worker being put down.
        let last_words = live
            .with_core(|core| std::mem::take(&mut core.last_words))
            .unwrap_or_default();
        // Each wait below takes commands meanwhile (see `Intake`): how long a worker takes to
        // die is up to the worker, and no call made meanwhile waits on it.
        if last_words.is_empty() {
            // Nothing more to say: stop the writer before the kill, so no write it still has
            // in flight (calls now reported lost) reaches whoever may drain the pipe meanwhile.
            writer.abort();
        } else {
            let said = wire.write_last_words(last_words, LAST_WORDS);
            self.intake().until(said).await;
            // An honest worker exits when refused; give it the moment to read why.
            if exited.is_none() {
                let exit = tokio::time::timeout(LAST_WORDS, process.wait());
                if let Ok(info) = self.intake().until(exit).await {
                    exited = Some((info, Instant::now()));
                }
            }
        }
        // A worker that ended by itself (an exit, a crash, a signal from elsewhere) is reported
        // as exited whatever the session noticed first (often a failed write).
        let ended_by_itself = exited.map(|(info, _)| info).or_else(|| process.ended());
        let exit = match ended_by_itself {
            Some(info) => Some(info),
            None => {
                let reaped = process.kill_and_reap(REAP_TIMEOUT);
                self.intake().until(reaped).await
            }
        };
        // A worker that died by itself a moment before the kill (its keeper had not yet ended
        // when it was looked at) was reaped with its own ending: the kill's would be SIGKILL.
        let killed = rustix::process::Signal::KILL.as_raw();
        let own_ending =
            |info: &ExitInfo| info.signal.is_some_and(|s| s != killed) || info.code.is_some();
        let ended_by_itself = ended_by_itself.or_else(|| exit.filter(own_ending));
        reader.abort();
        writer.abort();
        if let Some(mut relay) = stderr {
            // The worker is reaped: the relay logs what is buffered and ends. A grandchild
            // that escaped the process group may still hold the pipe; it gets nothing more.
            relay.worker_gone();
            let drained = tokio::time::timeout(STDERR_DRAIN, relay.ended());
            let _ = self.intake().until(drained).await;
        }
        if let WorkerProcess::Task { .. } = process {
            let reaped = process.kill_and_reap(REAP_TIMEOUT);
            let _ = self.intake().until(reaped).await;
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
        if let Some(mut core) = live.lock().take() {
            core.link.fail_all(&reason);
        }
        drop(detach);
        WorkerEnd { reason }
    }

    /// The worker completed its handshake: check its own seccomp filter from outside before
    /// the first call, raise the frame cap, report the spawn, and begin the calls that waited.
    fn on_ready(
        &mut self,
        info: airlock_protocol::WorkerInfo,
        confinement: &mut crate::ConfinementReport,
        ready: &mut Option<oneshot::Sender<Result<WorkerInfo, SpawnError>>>,
        raise: &mut Option<oneshot::Sender<u32>>,
    ) {
        let live = Arc::clone(&self.live);
        if let Err(err) = crate::confinement::verify_worker_filter(
            confinement,
            self.settings.confinement.require_worker_filter,
        ) {
            tracing::warn!(target: "airlock::confinement", worker = %self.settings.label, "{err}");
            if let Some(ready) = ready.take() {
                let _ = ready.send(Err(SpawnError::Confinement(err)));
            }
            live.with_core(|core| {
                core.session
                    .abort(CloseReason::Aborted(AbortReason::ConfinementNotVerified));
            });
            return;
        }
        tracing::debug!(
            target: "airlock::handshake",
            worker = %self.settings.label,
            worker_name = %info.name,
            worker_version = %info.version,
            methods = info.methods.len(),
            duration_us = micros(self.launched_at.elapsed()),
            "worker ready"
        );
        if let Some(raise) = raise.take() {
            let _ = raise.send(self.settings.protocol.frame_limit());
        }
        let waiting = std::mem::take(&mut self.waiting);
        live.with_core(move |core| {
            if core.session.is_ready() {
                core.accepting = true;
                for call in waiting {
                    core.link.begin(&mut core.session, call);
                }
            } else {
                // The worker was lost at its Hello (its next frame broke a rule in the same
                // read): the calls that waited for it are lost with it, for its reason.
                core.link
                    .lost
                    .extend(waiting.into_iter().map(|call| call.reply));
            }
        });
        // Reported once the worker takes calls: a spawn that returns has a worker that does.
        if let Some(ready) = ready.take() {
            let _ = ready.send(Ok(WorkerInfo::new(info, confinement.clone())));
        }
    }

    /// Starts a graceful shutdown of the current worker: no new calls on it, `Shutdown` sent,
    /// the grace period armed.
    fn begin_shutdown(&self, live: &Live, grace_until: &mut Option<Instant>) {
        live.with_core(|core| {
            core.accepting = false;
            core.session.shutdown();
        });
        grace_until.get_or_insert(Instant::now() + self.settings.shutdown_grace);
    }
}

/// Detaches the core from the host when the supervisor stops driving it: calls still on it
/// fail with `Shutdown`, and later calls go to the (closed) command channel.
struct Detach<'a>(&'a Live);

impl Drop for Detach<'_> {
    fn drop(&mut self) {
        if let Some(mut core) = self.0.lock().take() {
            core.link.fail_all_with(&CallError::Shutdown);
        }
    }
}

/// What the supervisor takes while it waits on something other than a live worker (a launch,
/// a worker's death): a call made meanwhile waits for the next worker or times out at its own
/// deadline, a cancel removes a waiting call, and a shutdown is kept for the supervisor to
/// carry out when the wait is over.
struct Intake<'a> {
    commands: &'a mut mpsc::UnboundedReceiver<Command>,
    waiting: &'a mut VecDeque<CallRequest>,
    settings: &'a Settings,
    shutdown: &'a mut Option<Vec<oneshot::Sender<()>>>,
}

impl Intake<'_> {
    /// Runs `work` to its end, taking commands meanwhile.
    async fn until<F: std::future::Future>(self, work: F) -> F::Output {
        let mut work = std::pin::pin!(work);
        let mut handles_gone = false;
        loop {
            expire(self.waiting, Instant::now());
            let next = next_deadline(self.waiting);
            tokio::select! {
                out = &mut work => return out,
                () = sleep_until_opt(next) => {}
                command = self.commands.recv(), if !handles_gone => match command {
                    Some(Command::Call(call)) => queue_call(self.waiting, self.settings, call),
                    Some(Command::Cancel(key)) => {
                        cancel(self.waiting, key);
                    }
                    Some(Command::Shutdown(done)) => {
                        self.shutdown.get_or_insert_with(Vec::new).push(done);
                    }
                    // Every handle is gone: the channel stays closed, and the supervisor finds
                    // it so when it next reads it.
                    None => handles_gone = true,
                },
            }
        }
    }
}

fn queue_call(waiting: &mut VecDeque<CallRequest>, settings: &Settings, call: CallRequest) {
    let max = settings.protocol.in_flight_limit();
    if waiting.len() >= max as usize {
        fail(call.reply, CallError::Overloaded { max });
    } else {
        waiting.push_back(call);
    }
}

fn cancel(waiting: &mut VecDeque<CallRequest>, key: u64) -> bool {
    let before = waiting.len();
    waiting.retain(|call| call.key != key);
    waiting.len() != before
}

fn next_deadline(waiting: &VecDeque<CallRequest>) -> Option<Instant> {
    waiting.iter().map(|c| c.deadline).min()
}

fn expire(waiting: &mut VecDeque<CallRequest>, now: Instant) {
    let (expired, kept): (VecDeque<_>, VecDeque<_>) =
        waiting.drain(..).partition(|c| c.deadline <= now);
    *waiting = kept;
    for call in expired {
        fail(call.reply, CallError::Timeout);
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

/// A duration in whole microseconds, for a trace's `*_us` field.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}
