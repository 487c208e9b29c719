//! `Host`: the handle applications call through, and its builder.

use std::borrow::Cow;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock_codec::Limits;
use airlock_protocol::{Body, HostConfig, Method};

use crate::{Confinement, WorkerInfo};
use tokio::sync::{mpsc, oneshot};

use crate::config::{RestartPolicy, Settings, StderrPolicy, TransportChoice};
use crate::connection::{Live, Party};
use crate::launch::Launcher;
use crate::reply::{DecodeInto, Reply};
use crate::response::ResponseDecoding;
use crate::stats::{Counters, HostStats};
use crate::supervisor::{CallRequest, Command, Supervisor, Updates};
use crate::updates::Cost;
use crate::{CallError, SpawnError};

/// Configures and spawns a [`Host`]. Every setting has a safe default.
#[derive(Clone, Debug)]
pub struct HostBuilder {
    pub(crate) settings: Settings,
}

impl HostBuilder {
    /// Adds an argument for the worker program.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.settings.args.push(arg.into());
        self
    }

    /// Adds an environment variable. The worker's environment is otherwise empty: nothing of
    /// the host's own environment is passed on.
    #[must_use]
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.settings.env.push((key.into(), value.into()));
        self
    }

    /// The worker's working directory (default: the host's).
    #[must_use]
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.settings.cwd = Some(dir.into());
        self
    }

    /// The channel to the worker. Default [`TransportChoice::Pipe`].
    #[must_use]
    pub fn transport(mut self, transport: TransportChoice) -> Self {
        self.settings.transport = transport;
        self
    }

    /// Budgets for decoding the worker's responses. Default: [`Limits::default`] with
    /// `max_bytes` and `max_len` raised to the frame cap, so every response an honest worker
    /// can send fits. Budgets smaller than the frame cap make a larger response a decode
    /// failure, which is fatal to the worker (it cannot know the host's budget). Their
    /// `max_items` also caps the items of the streaming updates callers have not taken yet
    /// (see [`CallStream`](crate::CallStream)).
    #[must_use]
    pub fn limits(mut self, limits: Limits) -> Self {
        self.settings.limits = Some(limits);
        self
    }

    /// Protocol limits: frame size, in-flight calls, progress quota, handshake deadline.
    #[must_use]
    pub fn protocol(mut self, config: HostConfig) -> Self {
        self.settings.protocol = config;
        self
    }

    /// Deadline of a call made with [`Host::call`] (and the other calls without a deadline of
    /// their own), counted from the moment the call is made, before its request is encoded.
    /// Default [`DEFAULT_CALL_TIMEOUT`](crate::DEFAULT_CALL_TIMEOUT).
    #[must_use]
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.settings.call_timeout = timeout;
        self
    }

    /// Time between `Shutdown` and SIGKILL. Default
    /// [`DEFAULT_SHUTDOWN_GRACE`](crate::DEFAULT_SHUTDOWN_GRACE).
    #[must_use]
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.settings.shutdown_grace = grace;
        self
    }

    /// Longest a write to the worker may block before it is declared dead. Default
    /// [`DEFAULT_SEND_TIMEOUT`](crate::DEFAULT_SEND_TIMEOUT).
    #[must_use]
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.settings.send_timeout = timeout;
        self
    }

    /// When a lost worker is replaced. Default [`RestartPolicy::default`].
    #[must_use]
    pub fn restart_policy(mut self, policy: RestartPolicy) -> Self {
        self.settings.restart = policy;
        self
    }

    /// How the worker's stderr is relayed. Default [`StderrPolicy::default`].
    #[must_use]
    pub fn stderr_policy(mut self, policy: StderrPolicy) -> Self {
        self.settings.stderr = policy;
        self
    }

    /// The OS confinement the worker runs under. Default [`Confinement::strict`]: its own
    /// namespaces and minimal read-only root, Landlock, seccomp, no capabilities, rlimits.
    /// Open what its handlers need with [`Confinement::read_only`] and
    /// [`Confinement::read_write`]; [`Confinement::none`] opts out (logged at WARN).
    #[must_use]
    pub fn confinement(mut self, confinement: Confinement) -> Self {
        self.settings.confinement = confinement;
        self
    }

    /// Opt-in low-latency mode: the host's reader spins for up to `window` after each call
    /// this host begins, and the worker for up to `window` after each frame it receives
    /// (polling their channel instead of sleeping), so an answer that comes within it is seen
    /// without a wake-up. A worker's frames never extend the host's spin. Off by default. At most
    /// [`MAX_SPIN`](airlock_protocol::spin::MAX_SPIN) (10 ms; more fails the spawn with
    /// `ConfigError::SpinTooLong`); 20–100 µs covers a worker's turnaround for small calls.
    ///
    /// Cost: each side keeps a CPU busy for up to `window` after every message (at 10,000
    /// calls/s a 50 µs window is half a CPU on each side). Each side turns it off by itself
    /// when it may run on one CPU only, where spinning would only delay its peer, and sleeps
    /// instead of spinning where spinning does not pay: it measures how soon it sees the
    /// peer's messages when it spins and when it sleeps, and sleeps while spinning measures
    /// more than a quarter slower ([`SpinPolicy`](airlock_protocol::spin::SpinPolicy)). On a
    /// contended CPU (other busy processes, or other guests of a shared VM) spinning takes the
    /// time the peer needs to answer: with two busy processes beside host and worker on the
    /// 2-vCPU development VM, small calls took 34 µs with the mode on, 41–46 µs with it off,
    /// and 30–83 µs (median 68) with the mode on before this rule (six interleaved rounds). A
    /// host's reader that sleeps when a call begins is woken by it if it would spin. Where the
    /// worker runs under the host's own verified filter (the default confinement), the reader
    /// polls its channel itself with non-blocking reads, in slices of at most 20 µs between
    /// turns of the runtime, and a caller that wrote its call alone polls for its answer the
    /// same way: on a current-thread runtime other tasks then wait up to one slice. An answer
    /// a caller takes so counts in the reader's measure of whether spinning pays as one the
    /// reader took. With an
    /// unconfined worker the reader yields to the runtime between looks instead (a read made
    /// without the OS's word that input came could sleep on a pipe lock the worker holds). A
    /// worker built on `airlock-worker` that is alone on its thread polls in place too. A
    /// small call in the mode, unpinned, took 5.6 µs (median) against 11.4 µs polling by
    /// yielding (BENCHMARKS.md, "Polling in place"). A worker learns the window from
    /// `AIRLOCK_SPIN_MICROS` in its environment (`PROTOCOL.md`); one not built on
    /// `airlock-worker` may ignore it.
    #[must_use]
    pub fn low_latency(mut self, window: Duration) -> Self {
        self.settings.low_latency = Some(window);
        self
    }

    /// How long the worker polls for the host's next calls, instead of sleeping, once it has
    /// answered calls that came together. Default: 50 µs
    /// ([`DEFAULT_LOAD_POLL`](airlock_protocol::spin::DEFAULT_LOAD_POLL)), or off for a
    /// [`Pool`](crate::Pool) of more workers than this machine has CPUs; `None` turns it off.
    /// At most [`MAX_SPIN`](airlock_protocol::spin::MAX_SPIN) (more fails the spawn with
    /// `ConfigError::LoadPollTooLong`).
    ///
    /// A worker that found several frames ready at once (this host pipelining calls) polls
    /// its channel for up to `window` once it has answered them and has nothing else to do, so
    /// the host's next batch is taken in without a wake-up. Windows open only after two
    /// batches in a row each came soon after the worker went idle (within the window if it
    /// polled through the wait, within two if it slept through it, its wake-up included); a
    /// later batch, or one after the worker went quiet last on a frame alone, starts the
    /// count again. So a host that sends a few rounds of calls and then pauses pays at most
    /// the window after a burst's last round. One frame alone never opens a window, so calls
    /// made one at a time are served as with it off (that is
    /// [`low_latency`](Self::low_latency)'s job; a call and its cancel read together count
    /// as two frames). With the low-latency mode on, its own windows, opened after every
    /// frame, replace these. Off in a worker that may run on one CPU only; through an open
    /// window the worker sleeps instead while its
    /// [`SpinPolicy`](airlock_protocol::spin::SpinPolicy) measures spun-through waits more
    /// than a quarter longer than slept-through ones, as on CPUs kept busy by other work.
    /// The host itself never polls for it.
    ///
    /// Cost: up to `window` of one CPU after each batch the worker answers, while batches
    /// keep coming close together. Under steady pipelined load it saves more CPU than it
    /// spends: on the 2-vCPU development VM, 300,000 calls 256 at a time on a 2-thread host
    /// took 1.13–1.36 µs each and 589–728 ms of CPU across both processes with it, against
    /// 1.34–1.54 µs and 685–723 ms with a worker that ignores it, with less than two thirds
    /// of the context switches (three rounds; `BENCHMARKS.md`, "Pipelined"). A host that
    /// sends calls together steadily, but with gaps of up to a window between them, can keep
    /// its worker's CPU busier than without it, which a
    /// [`Confinement::cpu_time`](crate::Confinement::cpu_time) limit counts. The rule for a
    /// `Pool` does not see other hosts: several `Host`s whose workers outnumber the CPUs, each
    /// busy beside work of the host's own, can make fewer calls a second with it on
    /// (`BENCHMARKS.md`); turn it off there. The worker learns the window from
    /// `AIRLOCK_LOAD_POLL_MICROS` in its environment (`PROTOCOL.md`); one not built on
    /// `airlock-worker` may ignore it.
    #[must_use]
    pub fn poll_under_load(mut self, window: Option<Duration>) -> Self {
        self.settings.poll_under_load = Some(window);
        self
    }

    /// The name logs use for this worker. Default: the program's file name.
    #[must_use]
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.settings.label = label.into();
        self
    }

    /// Starts the worker and completes its handshake. Fails if the program cannot run or the
    /// handshake fails; after that, lost workers are replaced by the supervisor.
    ///
    /// A confined worker's sandbox is built by a fork of this process (under
    /// `Confinement::strict()`, a keeper, which makes the sandbox's init; init then starts the
    /// worker without a fork), and a fork copies the page tables of all the memory the process
    /// holds: a spawn takes longer the larger the host has grown (measured on a 2-vCPU VM with
    /// 512 MiB resident: about 20 ms, against about 5 ms in a small process). Start long-lived
    /// workers and pools early. The keeper gives its children (init among them) only the
    /// spawn's own plan of this process's memory, and unmaps its copy once the sandbox is
    /// built, so a worker does not keep the host's memory resident as it was at the spawn. An unconfined
    /// worker (`Confinement::none()`) is not forked but cloned sharing this process's memory
    /// until it `exec`s, as `posix_spawn` does: its spawn costs the same whatever the host's
    /// size (Linux 5.4 or later: it is held by a pidfd).
    pub async fn spawn(self) -> Result<Host, SpawnError> {
        if !self.settings.confinement.is_confined() {
            tracing::warn!(
                target: "airlock::confinement",
                worker = %self.settings.label,
                "Confinement::none(): the worker runs unconfined and can reach everything this \
                 host's user can"
            );
        }
        let mut settings = self.settings;
        if settings.confinement.is_confined() {
            // A program that cannot be found is the same mistake with or without confinement,
            // and gets the same error.
            let program = crate::confinement::resolve_program(&settings.program, &settings.env)
                .map_err(|err| match err {
                    crate::ConfinementError::Program { program, source } => {
                        SpawnError::Exec { program, source }
                    }
                    other => SpawnError::Confinement(other),
                })?;
            settings.confinement.pin(program)?;
        }
        let windows = [
            (airlock_protocol::spin::SPIN_ENV, settings.low_latency),
            (airlock_protocol::spin::LOAD_POLL_ENV, settings.load_poll()),
        ];
        for (name, asked) in windows {
            if let Some(window) = airlock_protocol::spin::host_window(asked) {
                // Whole microseconds, at least one: a window under a microsecond asked for
                // is not turned off by rounding.
                let micros = window.as_micros().max(1);
                settings.env.push((name.into(), micros.to_string().into()));
            }
        }
        Host::start(settings, Launcher::Process).await
    }

    pub(crate) async fn spawn_with(self, launcher: Launcher) -> Result<Host, SpawnError> {
        Host::start(self.settings, launcher).await
    }
}

/// A supervised worker, called with typed methods. Cheap to clone; every clone talks to the
/// same worker. When the last clone is dropped the worker is shut down.
///
/// Guarantees: every call ends with exactly one outcome; a response reaches a call only if
/// the worker's frame matched the call's fresh random id, method and state; a worker that
/// breaks the protocol, sends an undecodable response, misses a deadline, stops reading or
/// exits is SIGKILLed with its whole process group, reaped, never reused, and its calls fail
/// with [`CallError::WorkerLost`] naming why.
#[derive(Clone, Debug)]
pub struct Host {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    commands: mpsc::UnboundedSender<Command>,
    /// The current worker's connection: calls begin and complete here without the supervisor.
    live: Arc<Live>,
    counters: Arc<Counters>,
    alive: Arc<AtomicBool>,
    next_key: AtomicU64,
    call_timeout: Duration,
    /// `HostConfig::max_in_flight`: calls past it fail with `Overloaded`.
    in_flight_limit: u64,
    worker: WorkerInfo,
    /// The worker's name in logs ([`HostBuilder::label`]).
    label: String,
}

impl Host {
    /// Starts configuring a host for the worker program at `program`.
    pub fn builder(program: impl Into<PathBuf>) -> HostBuilder {
        HostBuilder {
            settings: Settings::new(program.into()),
        }
    }

    pub(crate) fn in_process_builder() -> HostBuilder {
        let mut builder = Self::builder("in-process");
        builder.settings.label = "in-process".into();
        builder
    }

    async fn start(settings: Settings, launcher: Launcher) -> Result<Host, SpawnError> {
        settings.validate()?;
        let settings = Arc::new(settings);
        let (commands, receiver) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let alive = Arc::new(AtomicBool::new(true));
        let live = Arc::new(Live::new(airlock_protocol::spin::host_window(
            settings.low_latency,
        )));
        let a_process = matches!(launcher, Launcher::Process);
        let supervisor = Supervisor::new(
            Arc::clone(&settings),
            launcher,
            receiver,
            Arc::clone(&counters),
            Arc::clone(&alive),
            Arc::clone(&live),
        );
        let (ready_tx, ready_rx) = oneshot::channel();
        tokio::spawn(supervisor.run(ready_tx));
        let worker = match ready_rx.await {
            Ok(Ok(worker)) => worker,
            Ok(Err(SpawnError::Handshake(failure))) => {
                let failure = explained(failure, &settings, &counters, a_process);
                return Err(SpawnError::Handshake(failure));
            }
            Ok(Err(err)) => return Err(err),
            Err(_) => return Err(SpawnError::SupervisorEnded),
        };
        Ok(Host {
            shared: Arc::new(Shared {
                commands,
                live,
                counters,
                alive,
                next_key: AtomicU64::new(0),
                call_timeout: settings.call_timeout,
                in_flight_limit: u64::from(settings.protocol.in_flight_limit()),
                worker,
                label: settings.label.clone(),
            }),
        })
    }

    /// Calls `M` with the host's call deadline.
    ///
    /// `M::NAME` is checked when the program is built: a method whose name is not 1–64 bytes
    /// of `[A-Za-z0-9._-]` cannot be called at all.
    ///
    /// ```compile_fail
    /// use airlock_host::Host;
    /// struct Spaced;
    /// impl airlock_protocol::Method for Spaced {
    ///     const NAME: &'static str = "not a method name";
    ///     type Request = ();
    ///     type Response = ();
    /// }
    /// fn call_it(host: &Host, runtime: &tokio::runtime::Runtime) {
    ///     let _ = runtime.block_on(host.call::<Spaced>(&()));
    /// }
    /// fn main() {
    ///     let _built: fn(&Host, &tokio::runtime::Runtime) = call_it;
    /// }
    /// ```
    pub async fn call<M: Method>(&self, request: &M::Request) -> Result<M::Response, CallError> {
        self.call_due::<M>(request, Due::After(self.shared.call_timeout))
            .await
    }

    /// Calls `M`, which must finish by `deadline`. Dropping the returned future cancels the
    /// call (a `Cancel` is sent to the worker). A deadline more than
    /// [`MAX_TIMEOUT`](airlock_protocol::MAX_TIMEOUT) (365 days) away is held to that.
    pub async fn call_with_deadline<M: Method>(
        &self,
        request: &M::Request,
        deadline: Instant,
    ) -> Result<M::Response, CallError> {
        self.call_due::<M>(request, Due::By(deadline)).await
    }

    /// Calls `M`, due as `due` says.
    async fn call_due<M: Method>(
        &self,
        request: &M::Request,
        due: Due,
    ) -> Result<M::Response, CallError> {
        // The deadline runs from before the request is encoded.
        let when = due.starting_now();
        // A method's name is fixed at compile time, so an invalid one is refused there: a
        // `Host::call::<M>` with such an `M` does not build (see `Host::call`).
        const {
            assert!(
                airlock_protocol::is_valid_method_name(M::NAME),
                "Method::NAME must be 1-64 bytes of [A-Za-z0-9._-]"
            )
        };
        let body = airlock_protocol::reuse::encode_body(request).map_err(CallError::Encode);
        let method = Cow::Borrowed(M::NAME);
        self.call_named(method, body, decode_response::<M::Response>, when)
            .await
    }

    /// The path of every call, typed or named at run time (`Host::call_value`): `method` is a
    /// valid method name, `body` the encoded request (or why it did not encode), and `decode`
    /// turns the worker's answer into a `T`.
    pub(crate) async fn call_named<T: Send + 'static>(
        &self,
        method: Cow<'static, str>,
        body: Result<Body, CallError>,
        decode: DecodeInto<T>,
        when: When,
    ) -> Result<T, CallError> {
        self.begin_call(method, body, decode, when, None)
            .finish()
            .await
    }

    /// Begins a call (counted in flight from here; dropping the returned handle cancels it).
    /// `updates` is a streaming call's update channel.
    pub(crate) fn begin_call<T: Send + 'static>(
        &self,
        method: Cow<'static, str>,
        body: Result<Body, CallError>,
        decode: DecodeInto<T>,
        When { now, deadline }: When,
        updates: Option<Updates>,
    ) -> Begun<'_, T> {
        self.shared.counters.started.fetch_add(1, Ordering::Relaxed);
        let key = self.shared.next_key.fetch_add(1, Ordering::Relaxed);
        // The guard keeps the method's name for the stats: a copy only for a name given at
        // run time; a typed call's name is a `&'static str`.
        let mut guard = InFlight::new(&self.shared, method.clone(), key, now);
        let answer = self.send_call(method, body, decode, deadline, updates, &mut guard);
        Begun { guard, answer }
    }

    fn send_call<T: Send + 'static>(
        &self,
        method: Cow<'static, str>,
        body: Result<Body, CallError>,
        decode: DecodeInto<T>,
        deadline: Instant,
        updates: Option<Updates>,
        guard: &mut InFlight<'_>,
    ) -> Result<Reply<T>, CallError> {
        let body = body?;
        let (answer, reply) = crate::reply::pair(decode);
        let call = CallRequest {
            key: guard.key,
            method,
            body,
            deadline,
            reply,
            updates,
        };
        // Begun here, on the connected worker, with no hop through the supervisor; while no
        // worker takes calls (a handshake, a restart) the supervisor queues it.
        if let Err(call) = self.shared.live.try_begin(call, Party::Caller) {
            self.shared
                .commands
                .send(Command::Call(call))
                .map_err(|_| CallError::Shutdown)?;
        }
        guard.registered = true;
        Ok(answer)
    }

    /// Shuts the worker down gracefully: `Shutdown`, up to the grace period for calls in
    /// flight to finish, then SIGKILL. Every pending call gets an outcome; later calls fail
    /// with [`CallError::Shutdown`].
    pub async fn shutdown(&self) {
        let (done, finished) = oneshot::channel();
        if self.shared.commands.send(Command::Shutdown(done)).is_ok() {
            let _ = finished.await;
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> HostStats {
        self.shared.counters.snapshot()
    }

    /// The worker's name in logs ([`HostBuilder::label`]).
    pub(crate) fn label(&self) -> &str {
        &self.shared.label
    }

    /// True if both handles talk to the same worker.
    pub(crate) fn same_host(&self, other: &Host) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// The deadline, from now, of a call made without one.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.shared.call_timeout
    }

    /// Calls in flight now.
    pub fn in_flight(&self) -> u64 {
        self.shared.counters.in_flight.load(Ordering::Relaxed)
    }

    /// The pid of the current worker process as this host sees it (inside its own PID
    /// namespace a confined worker is pid 2, under the sandbox's init), `None` in-process or before the first spawn.
    /// It changes when the supervisor replaces the worker.
    pub fn worker_pid(&self) -> Option<u32> {
        match self.shared.counters.worker_pid.load(Ordering::Relaxed) {
            0 => None,
            pid => Some(pid),
        }
    }

    /// False once the host is shut down or its restart budget is exhausted.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::Relaxed)
    }

    /// True while a worker takes calls at once: connected, through its handshake and
    /// verification, and neither shutting down nor lost. False while a worker is started,
    /// reaped or replaced; a call made then waits for the next worker (or its deadline).
    pub fn is_taking_calls(&self) -> bool {
        self.shared.live.taking_calls()
    }

    /// Whether a call made now would fail with `Overloaded`: `max_in_flight` calls are on the
    /// worker or waiting for it.
    pub(crate) fn is_full(&self) -> bool {
        self.in_flight() >= self.shared.in_flight_limit
    }

    /// What the first worker said about itself in its handshake, and the confinement it was
    /// verified to run under.
    pub fn worker_info(&self) -> &WorkerInfo {
        &self.shared.worker
    }
}

/// When a call is due: after a span from when it begins (a host's or pool's call deadline), or
/// by a caller's instant.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Due {
    /// At most `MAX_TIMEOUT` (`call_timeout` is checked at spawn), so adding it to `now`
    /// cannot overflow.
    After(Duration),
    By(Instant),
}

impl Due {
    /// The clock read of a call's beginning, before its request is encoded: its deadline and
    /// its start in the stats. (Whether it is already over is checked again once the request
    /// is encoded.) A deadline beyond `MAX_TIMEOUT` from now means "no deadline" and is held to
    /// that: tokio's timers overflow near the largest `Instant`, and the supervisor must not.
    pub(crate) fn starting_now(self) -> When {
        let now = Instant::now();
        let latest = now + airlock_protocol::MAX_TIMEOUT;
        let deadline = match self {
            Self::After(span) => (now + span).min(latest),
            Self::By(deadline) => deadline.min(latest),
        };
        When { now, deadline }
    }
}

/// When a call began, and its deadline.
#[derive(Clone, Copy, Debug)]
pub(crate) struct When {
    now: Instant,
    deadline: Instant,
}

/// A call on its way: its answer, and the guard that counts it in flight and cancels it if
/// this is dropped first.
pub(crate) struct Begun<'a, T: Send + 'static> {
    guard: InFlight<'a>,
    answer: Result<Reply<T>, CallError>,
}

impl<T: Send + 'static> Begun<'_, T> {
    /// Waits for the call's one outcome and counts it.
    pub(crate) async fn finish(mut self) -> Result<T, CallError> {
        let result = match std::mem::replace(&mut self.answer, Err(CallError::Shutdown)) {
            Ok(answer) => {
                // The supervisor enforces the deadline (and kills the worker when it passes).
                // Every replier is answered, or answers `Shutdown` when dropped, when its
                // worker ends or the supervisor stops driving it, so this wait is bounded
                // without a timer of its own. The response was decoded where its frame was
                // accepted, with this call's decoder.
                let mut answer = answer;
                let outcome = (&mut answer).await;
                self.guard.registered = false;
                (outcome, answer.answered_at())
            }
            Err(err) => (Err(err), None),
        };
        let (result, answered_at) = result;
        self.guard.finish(result.as_ref().map(|_| ()), answered_at);
        result
    }
}

/// Counts a call in flight, and cancels it if its future is dropped before it finished.
/// Records its outcome, under its method, and traces it (target `airlock::call`).
struct InFlight<'a> {
    shared: &'a Shared,
    method: Cow<'static, str>,
    /// The call's local number: its cancellation key, and its `call` field in the trace.
    key: u64,
    started: Instant,
    /// The call is with the supervisor or on the worker: a drop must cancel it there.
    registered: bool,
    finished: bool,
}

impl<'a> InFlight<'a> {
    fn new(shared: &'a Shared, method: Cow<'static, str>, key: u64, now: Instant) -> Self {
        shared.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        Self {
            shared,
            method,
            key,
            started: now,
            registered: false,
            finished: false,
        }
    }

    /// The call ended with `outcome`; `answered_at` is when its response was accepted, if
    /// it had one (else the clock is read now).
    fn finish(&mut self, outcome: Result<(), &CallError>, answered_at: Option<Instant>) {
        self.finished = true;
        let ended = answered_at.unwrap_or_else(Instant::now);
        let elapsed = ended.saturating_duration_since(self.started);
        self.shared.counters.record(&self.method, outcome, elapsed);
        trace_call(self, outcome, elapsed);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shared
            .counters
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
        if self.registered {
            // On the worker: cancelled there. Still waiting for a worker (or in the command
            // channel): the supervisor removes it, or cancels it once it has begun it.
            if !self.shared.live.cancel(self.key, Party::Caller) {
                let _ = self.shared.commands.send(Command::Cancel(self.key));
            }
        }
        if !self.finished {
            // The caller dropped the call's future.
            self.finish(Err(&CallError::Cancelled), None);
        }
    }
}

/// One DEBUG event per call, at its outcome. Its fields are formatted only when a subscriber
/// takes the event: with DEBUG off for `airlock::call` this is a check of the callsite's
/// cached interest.
fn trace_call(call: &InFlight<'_>, outcome: Result<(), &CallError>, elapsed: Duration) {
    let duration_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    match outcome {
        Ok(()) => tracing::debug!(
            target: "airlock::call",
            worker = %call.shared.label,
            method = %call.method,
            call = call.key,
            outcome = "ok",
            duration_us,
            "call ended"
        ),
        Err(err) => tracing::debug!(
            target: "airlock::call",
            worker = %call.shared.label,
            method = %call.method,
            call = call.key,
            outcome = crate::stats::outcome_name(Err(err)),
            duration_us,
            error = %err,
            "call ended"
        ),
    }
}

/// A failed handshake with what the host knows about it: the program, the deadline, the
/// channel, and the worker's last stderr lines (the supervisor drained its stderr before it
/// reported the failure).
fn explained(
    mut failure: crate::HandshakeError,
    settings: &Settings,
    counters: &Counters,
    a_process: bool,
) -> crate::HandshakeError {
    failure.program = settings.program.clone();
    failure.handshake_timeout = settings.protocol.handshake_limit();
    failure.channel_is_stdout = a_process && stdout_is_the_channel(settings.transport);
    failure.stderr = counters.stderr_tail.lines();
    failure
}

/// Whether a worker process on `transport` talks to the host over its stdout.
fn stdout_is_the_channel(transport: TransportChoice) -> bool {
    #[cfg(feature = "pipe")]
    return transport == TransportChoice::Pipe;
    #[cfg(not(feature = "pipe"))]
    {
        let _ = transport;
        false
    }
}

/// The decoder for a response of type `T`, run where the worker's frame is accepted: the
/// non-executing, budgeted codec. The caller of the decoder logs a refusal (with the method)
/// before the worker is cut off.
pub(crate) fn decode_response<T>(
    body: &[u8],
    decoding: &ResponseDecoding,
) -> Result<T, airlock_codec::DecodeError>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    airlock_codec::from_slice::<T>(body, &decoding.limits)
}

/// [`decode_response`] for a streaming call's update, boxed (updates share one channel type),
/// with what holding it costs its worker's update budget ([`Cost::of_update`]).
pub(crate) fn decode_update<T>(
    body: &[u8],
    decoding: &ResponseDecoding,
) -> Result<(Box<dyn std::any::Any + Send>, Cost), airlock_codec::DecodeError>
where
    T: serde::de::DeserializeOwned + Send + 'static,
{
    airlock_codec::from_slice_counted::<T>(body, &decoding.limits).map(|(value, items)| {
        let cost = Cost::of_update::<T>(body.len(), items);
        (Box::new(value) as Box<dyn std::any::Any + Send>, cost)
    })
}
