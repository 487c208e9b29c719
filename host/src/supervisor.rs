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
//! The host's reads and writes to the worker stay in tasks of their own, not in this loop: a
//! worker can make a pipe `read(2)` or `write(2)` sleep inside the kernel (holding the pipe's
//! lock from a page fault it never serves), and only a loop that is not itself in that system
//! call can still see the deadline pass and kill the worker, which ends the sleep.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_protocol::transport::{FrameReceiver, FrameSender};
use airlock_protocol::{
    AbortReason, BeginCallError, BuildIdHasher, CallId, CloseReason, Event, HostSession, Outcome,
    Transmit, TransportError,
};
use bytes::Bytes;
use rand_core::{OsRng, UnwrapErr};
use tokio::sync::{mpsc, oneshot};

use crate::config::Settings;
use crate::launch::{Launched, Launcher, WorkerProcess};
use crate::stats::Counters;
use crate::{CallError, ExitInfo, LostReason, SpawnError, WorkerInfo};

/// Frames read ahead of the session per worker. With the decoder's own buffer, a worker can make
/// the host hold at most `READ_AHEAD + 1` frames (each at most `max_frame`) at once.
const READ_AHEAD: usize = 8;
/// How long a closing session's last frames (a `Refuse`) may take to be written.
const LAST_WORDS: Duration = Duration::from_millis(100);
/// How long the stderr relay may take to log a dead worker's last lines (then it is aborted).
const STDERR_DRAIN: Duration = Duration::from_millis(100);
/// Batches queued for the writer task. When it is full, frames wait in the supervisor's outbox
/// (bounded: every frame belongs to a call in flight, or is one `Shutdown`); a worker that stops
/// reading is detected by the writer's send deadline, never by the queue filling up.
const WRITE_QUEUE: usize = 16;
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
    pub(crate) body: Bytes,
    pub(crate) deadline: Instant,
    /// Decodes the method's response; run where the worker's `Return` is accepted.
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
    /// One `getrandom` per call id, on purpose. A buffer of OS randomness would save that
    /// system call (about 250 ns), but `fork` copies it: a host used on both sides of a fork
    /// would send the same ids in the same order, and a worker that saw one side's could forge
    /// the other's next `Return` (`invariant_04_ids_stay_fresh_on_both_sides_of_a_fork`).
    rng: UnwrapErr<OsRng>,
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
    ) -> Self {
        Self {
            settings,
            launcher,
            commands,
            counters,
            alive,
            rng: UnwrapErr(OsRng),
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
            let end = match self.launch_taking_commands().await {
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
        queue_call(&mut self.waiting, &self.settings, call);
    }

    fn cancel_waiting(&mut self, key: u64) {
        cancel(&mut self.waiting, key);
    }

    fn next_waiting_deadline(&self) -> Option<Instant> {
        next_deadline(&self.waiting)
    }

    /// Calls that waited past their deadline for a worker time out without being sent.
    fn expire_waiting(&mut self, now: Instant) {
        expire(&mut self.waiting, now);
    }

    /// Launches the next worker while still taking commands: a call made meanwhile waits for
    /// the worker (or times out at its own deadline), a cancel removes it, a shutdown is kept
    /// for `drive` to carry out once the worker is up. A launch can take a while (a slow
    /// handshake, a loaded machine): nothing waits on it unanswered.
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
        let launch = launcher.launch(settings, &counters.stderr_dropped);
        let mut launch = std::pin::pin!(launch);
        let mut handles_gone = false;
        loop {
            expire(waiting, Instant::now());
            let next = next_deadline(waiting);
            tokio::select! {
                launched = &mut launch => return launched,
                () = sleep_until_opt(next) => {}
                command = commands.recv(), if !handles_gone => match command {
                    Some(Command::Call(call)) => queue_call(waiting, settings, call),
                    Some(Command::Cancel(key)) => cancel(waiting, key),
                    Some(Command::Shutdown(done)) => {
                        shutdown.get_or_insert_with(Vec::new).push(done);
                    }
                    None => handles_gone = true,
                },
            }
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
        let (frames_tx, mut frames_rx) = mpsc::channel(READ_AHEAD);
        let (raise_tx, raise_rx) = oneshot::channel();
        let mut raise_tx = Some(raise_tx);
        let reader = tokio::spawn(read_frames(receiver, frames_tx, raise_rx));
        let (batches_tx, batches_rx) = mpsc::channel::<Vec<Transmit>>(WRITE_QUEUE);
        let mut writer = tokio::spawn(write_frames(sender, batches_rx));
        let mut writer_done = false;
        // Frames the writer queue had no room for yet, oldest first.
        let mut outbox: Vec<Transmit> = Vec::new();

        let mut link = Link {
            responders: HashMap::default(),
            keys: HashMap::default(),
            lost: Vec::new(),
            timed_out: Vec::new(),
        };
        let mut exited: Option<(ExitInfo, Instant)> = None;
        let mut grace_until: Option<Instant> = None;
        let mut handles_gone = false;
        if self.shutdown.is_some() {
            // Asked for while this worker was being launched: carried out now (before its
            // handshake, that ends it at once).
            session.shutdown();
            grace_until = Some(Instant::now() + self.settings.shutdown_grace);
        }
        // One timer for the whole life, moved only when the next deadline changes: a fresh
        // `sleep` per turn of the loop would enter and leave tokio's timer wheel several times
        // per call.
        let mut timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        let mut timer_set_for: Option<Instant> = None;

        let close_reason = loop {
            // 1. Outcomes and frames the session produced.
            let mut closed = None;
            while let Some(event) = session.poll_event() {
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
                            session
                                .abort(CloseReason::Aborted(AbortReason::ConfinementNotVerified));
                            continue;
                        }
                        if let Some(raise) = raise_tx.take() {
                            let _ = raise.send(self.settings.protocol.frame_limit());
                        }
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(Ok(WorkerInfo::new(info, confinement.clone())));
                        }
                        while let Some(call) = self.waiting.pop_front() {
                            link.begin(&mut session, call, &mut self.rng);
                        }
                    }
                    Event::Completed { id, outcome } => {
                        // A response that does not decode is a lie: the worker is cut off
                        // here, before the session takes another frame from it.
                        let completion = link.complete(id, outcome, &limits);
                        if completion == Completion::Lied {
                            session.abort(CloseReason::Aborted(AbortReason::UndecodableResponse));
                        }
                    }
                    Event::Closed(reason) => closed = Some(reason),
                    _ => {}
                }
            }
            if let Some(reason) = closed {
                break reason;
            }
            outbox.extend(std::iter::from_fn(|| session.poll_transmit()));
            if !outbox.is_empty() {
                match batches_tx.try_send(std::mem::take(&mut outbox)) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(batch)) => outbox = batch,
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        session.abort(CloseReason::Aborted(AbortReason::TransportFailed));
                        continue;
                    }
                }
            }

            // 2. Wait for the next input: a command, a frame, time, the process, the writer.
            let now = Instant::now();
            self.expire_waiting(now);
            let next_deadline = [
                session.poll_timeout(),
                self.next_waiting_deadline(),
                grace_until,
                exited.map(|(_, at)| at + EXIT_DRAIN),
            ]
            .into_iter()
            .flatten()
            .min();
            if next_deadline != timer_set_for {
                if let Some(at) = next_deadline {
                    timer.as_mut().reset(tokio::time::Instant::from_std(at));
                }
                timer_set_for = next_deadline;
            }
            tokio::select! {
                command = self.commands.recv(), if !handles_gone => match command {
                    Some(Command::Call(call)) => {
                        if session.is_ready() {
                            link.begin(&mut session, call, &mut self.rng);
                        } else {
                            self.queue(call);
                        }
                    }
                    Some(Command::Cancel(key)) => match link.keys.remove(&key) {
                        Some(id) => {
                            session.cancel(id);
                        }
                        None => self.cancel_waiting(key),
                    },
                    Some(Command::Shutdown(done)) => {
                        self.shutdown.get_or_insert_with(Vec::new).push(done);
                        session.shutdown();
                        grace_until.get_or_insert(Instant::now() + self.settings.shutdown_grace);
                    }
                    None => {
                        // Every handle is gone: shut down as if asked.
                        handles_gone = true;
                        self.shutdown.get_or_insert_with(Vec::new);
                        session.shutdown();
                        grace_until.get_or_insert(Instant::now() + self.settings.shutdown_grace);
                    }
                },
                frame = frames_rx.recv() => match frame {
                    Some(Ok(Some(payload))) => {
                        // Time before frames: a deadline that passed while this frame waited
                        // is seen first, so the frame cannot complete a call already over.
                        let now = Instant::now();
                        if session.poll_timeout().is_some_and(|at| at <= now) {
                            session.handle_timeout(now);
                        }
                        session.handle_frame(payload)
                    }
                    Some(Ok(None)) | None => session.handle_eof(),
                    Some(Err(TransportError::Frame(err))) => session.handle_framing_error(err),
                    Some(Err(_)) => session.abort(CloseReason::Aborted(AbortReason::TransportFailed)),
                },
                permit = batches_tx.reserve(), if !outbox.is_empty() => {
                    if let Ok(permit) = permit {
                        permit.send(std::mem::take(&mut outbox));
                    }
                },
                result = &mut writer, if !writer_done => {
                    writer_done = true;
                    if !matches!(result, Ok(Ok(()))) {
                        session.abort(CloseReason::Aborted(AbortReason::TransportFailed));
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
                    session.handle_timeout(now);
                    if grace_until.is_some_and(|t| now >= t) {
                        session.abort(CloseReason::Aborted(AbortReason::HostShutdown));
                    } else if exited.is_some_and(|(_, at)| now >= at + EXIT_DRAIN) {
                        session.abort(CloseReason::Aborted(AbortReason::ProcessExited));
                    }
                }
            }
        };

        // 3. The worker is over. Write what the session still has to say (a `Refuse` telling a
        // refused worker why), for a bounded moment, then kill and reap it, stop its tasks,
        // and answer its lost calls.
        // Only the session's own last frames: what waited in the outbox (calls now reported
        // lost) must never reach a worker that is being put down.
        outbox.clear();
        let last_words: Vec<Transmit> = std::iter::from_fn(|| session.poll_transmit()).collect();
        if last_words.is_empty() {
            // Nothing more to say: stop the writer before the kill, so no batch it still holds
            // (calls now reported lost) reaches whoever may drain the pipe meanwhile.
            writer.abort();
        }
        if !last_words.is_empty() && batches_tx.try_send(last_words).is_ok() {
            drop(batches_tx);
            if !writer_done {
                let _ = tokio::time::timeout(LAST_WORDS, &mut writer).await;
            }
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
        reader.abort();
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
        link.fail_all(&reason);
        WorkerEnd { reason }
    }
}

/// The calls on the current worker and their repliers.
/// How a completed call went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Completion {
    /// Its caller has its outcome (or will, once the worker is reaped).
    Answered,
    /// The worker's response did not decode: its caller got `Decode`, and the worker lied.
    Lied,
}

struct Link {
    responders: HashMap<CallId, (u64, Decode, oneshot::Sender<CallReply>), BuildIdHasher>,
    keys: HashMap<u64, CallId, BuildIdHasher>,
    /// Calls lost when the session closed, answered once the worker is reaped.
    lost: Vec<oneshot::Sender<CallReply>>,
    /// Calls that timed out: answered once the worker is reaped, so a caller that sees
    /// `Timeout` knows the worker that missed the deadline is already dead.
    timed_out: Vec<oneshot::Sender<CallReply>>,
}

impl Link {
    fn begin(&mut self, session: &mut HostSession, call: CallRequest, rng: &mut UnwrapErr<OsRng>) {
        // A call already past its deadline is not sent: it would only time out on the worker
        // and take the worker, and every call beside it, down for nothing.
        if call.deadline <= Instant::now() {
            return fail(call.reply, CallError::Timeout);
        }
        match session.begin_call(call.method, call.body, call.deadline, rng) {
            Ok(id) => {
                self.keys.insert(call.key, id);
                self.responders
                    .insert(id, (call.key, call.decode, call.reply));
            }
            Err(err) => fail(
                call.reply,
                match err {
                    BeginCallError::Overloaded { .. } => CallError::Overloaded,
                    BeginCallError::TooLarge { len, .. } => CallError::TooLarge { len },
                    BeginCallError::InvalidMethodName => {
                        CallError::Remote(airlock_protocol::RemoteError::new(
                            airlock_protocol::ErrorKind::UnknownMethod,
                            "invalid method name",
                        ))
                    }
                    _ => CallError::Shutdown,
                },
            ),
        }
    }

    fn complete(
        &mut self,
        id: CallId,
        outcome: Outcome,
        limits: &airlock_codec::Limits,
    ) -> Completion {
        let Some((key, decode, reply)) = self.responders.remove(&id) else {
            return Completion::Answered;
        };
        self.keys.remove(&key);
        let answer = match outcome {
            Outcome::Returned(body) => match decode(&body, limits) {
                Ok(value) => CallReply::Returned(value),
                Err(err) => {
                    let _ = reply.send(CallReply::Failed(CallError::Decode(err)));
                    return Completion::Lied;
                }
            },
            Outcome::Failed(err) => CallReply::Failed(CallError::Remote(err)),
            Outcome::TimedOut => {
                self.timed_out.push(reply);
                return Completion::Answered;
            }
            Outcome::Cancelled => CallReply::Failed(CallError::Cancelled),
            Outcome::Lost(_) => {
                self.lost.push(reply);
                return Completion::Answered;
            }
            _ => CallReply::Failed(CallError::WorkerLost(LostReason::TransportFailed)),
        };
        let _ = reply.send(answer);
        Completion::Answered
    }

    fn fail_all(&mut self, reason: &LostReason) {
        for reply in self.timed_out.drain(..) {
            let _ = reply.send(CallReply::Failed(CallError::Timeout));
        }
        let remaining = self.responders.drain().map(|(_, (_, _, reply))| reply);
        for reply in self.lost.drain(..).chain(remaining) {
            let _ = reply.send(CallReply::Failed(CallError::WorkerLost(reason.clone())));
        }
        self.keys.clear();
    }
}

fn fail(reply: oneshot::Sender<CallReply>, err: CallError) {
    let _ = reply.send(CallReply::Failed(err));
}

fn queue_call(waiting: &mut VecDeque<CallRequest>, settings: &Settings, call: CallRequest) {
    if waiting.len() >= settings.protocol.in_flight_limit() as usize {
        fail(call.reply, CallError::Overloaded);
    } else {
        waiting.push_back(call);
    }
}

fn cancel(waiting: &mut VecDeque<CallRequest>, key: u64) {
    waiting.retain(|call| call.key != key);
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

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

type Incoming = Result<Option<Bytes>, TransportError>;

/// Forwards frames to the supervisor. `raise` carries the connection's `max_frame` once the
/// handshake is done (`recv` is cancel-safe, so switching mid-wait loses nothing).
async fn read_frames(
    mut receiver: Box<dyn FrameReceiver>,
    frames: mpsc::Sender<Incoming>,
    mut raise: oneshot::Receiver<u32>,
) {
    let mut raised = false;
    loop {
        let item = tokio::select! {
            item = receiver.recv() => item,
            max = &mut raise, if !raised => {
                raised = true;
                if let Ok(max) = max {
                    receiver.set_max_frame(max);
                }
                continue;
            }
        };
        let last = !matches!(item, Ok(Some(_)));
        if frames.send(item).await.is_err() || last {
            return;
        }
    }
}

async fn write_frames(
    mut sender: Box<dyn FrameSender>,
    mut batches: mpsc::Receiver<Vec<Transmit>>,
) -> Result<(), TransportError> {
    while let Some(mut batch) = batches.recv().await {
        // Coalesce whatever else is queued into one vectored write.
        while let Ok(more) = batches.try_recv() {
            batch.extend(more);
        }
        sender.send(&batch).await?;
    }
    Ok(())
}
