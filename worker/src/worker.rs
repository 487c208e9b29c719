//! The `Worker` builder: register methods, then serve.

use std::collections::HashMap;
use std::future::Future;

use airlock_protocol::transport::Transport;
use airlock_protocol::{is_valid_method_name, Method, WorkerConfig};

use crate::handler::{
    erase_async, erase_blocking, erase_cancellable_blocking, erase_streaming, Dynamic,
    ErasedHandler, Typed,
};
use crate::serve::{serve_on, ServeSpec};
use crate::{HandlerError, ServeError};

/// Default for [`Worker::max_concurrency`]: 64 handlers running at once.
///
/// More calls than this wait in the worker for a slot (the host bounds how many it sends).
pub const DEFAULT_MAX_CONCURRENCY: usize = 64;

/// A worker: a set of methods and how to serve them.
///
/// Guarantees, whatever a handler does: every call received is answered exactly once — with
/// its response, a `Fail` of kind `Panic` if the handler panicked (the worker keeps serving),
/// `UnknownMethod` for a name not registered, `BadRequest` for a request that does not decode,
/// `Cancelled` when the host cancelled it first.
pub struct Worker {
    name: String,
    version: String,
    methods: HashMap<String, ErasedHandler>,
    max_concurrency: usize,
    limits: Option<airlock_codec::Limits>,
    error: Option<String>,
    /// Served by [`serve_blocking`](Self::serve_blocking), on a runtime and thread of its own.
    pub(crate) owns_thread: bool,
    /// See [`idle_wait_in_os`](Self::idle_wait_in_os).
    pub(crate) idle_wait_in_os: bool,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut methods: Vec<_> = self.methods.keys().collect();
        methods.sort();
        f.debug_struct("Worker")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("methods", &methods)
            .finish()
    }
}

impl Default for Worker {
    fn default() -> Self {
        Self::new()
    }
}

impl Worker {
    /// A worker with no methods, named `airlock-worker` at this crate's version.
    pub fn new() -> Self {
        Self {
            name: "airlock-worker".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            methods: HashMap::new(),
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            limits: None,
            error: None,
            owns_thread: false,
            idle_wait_in_os: false,
        }
    }

    /// Sets the name and version the worker reports in its `Hello` (method-name characters).
    #[must_use]
    pub fn identity(mut self, name: &str, version: &str) -> Self {
        self.name = name.into();
        self.version = version.into();
        self
    }

    /// Most handlers running at once. Default [`DEFAULT_MAX_CONCURRENCY`].
    ///
    /// It also decides where blocking handlers run ([`blocking_method`](Self::blocking_method)):
    /// with more than one slot, each call gets a thread of tokio's blocking pool (at most this
    /// many at once); with one slot, a worker process ([`serve`](Self::serve)) runs them on
    /// its serving thread itself, with no thread hop per call.
    #[must_use]
    pub fn max_concurrency(mut self, handlers: usize) -> Self {
        self.max_concurrency = handlers.max(1);
        self
    }

    /// Lets a worker served by [`serve_blocking`](Self::serve_blocking) wait for the host's
    /// next frame in the OS while it is idle (over a pipe where the kernel honours `RWF_NOWAIT`
    /// on it, one blocking `read`; else one `ppoll` and one `read`) instead of through a turn
    /// of its runtime (BENCHMARKS.md measures what it saves).
    /// Off by default; without `serve_blocking` it does nothing.
    ///
    /// The loop waits so only while nothing else of the worker's is under way on the runtime:
    /// no call running, no answer or update waiting to be written, and no task alive on the
    /// runtime but the loop's own (a task a handler spawned keeps the loop on the runtime's
    /// wait until it ends, so it is never held up). What the runtime would do for code that
    /// is not one of its tasks cannot be seen, and waits, possibly until the host has sent many
    /// more calls (the loop lets the runtime turn only about once every hundred calls):
    /// - a task spawned onto the runtime from another thread: through a `Handle` a handler
    ///   passed out, or from a detached `spawn_blocking` closure, which runs with the
    ///   runtime's context;
    /// - a future another thread runs with `Handle::block_on`, whose timers and I/O the
    ///   runtime drives.
    ///
    /// Turn it on only for a worker whose code does none of these. The bundled
    /// `airlock-worker` turns it on: its handlers do none of them.
    #[must_use]
    pub fn idle_wait_in_os(mut self, on: bool) -> Self {
        self.idle_wait_in_os = on;
        self
    }

    /// Budgets for decoding each request. Default: [`Limits::default`](airlock_codec::Limits)
    /// with `max_bytes` and `max_len` raised to the host's `max_frame`, so every request the
    /// host can send fits its byte budgets; set this to hold requests to less (or, for a plain
    /// `Vec<u8>` field, more items). A request over a budget is answered with a `Fail` of
    /// kind `BadRequest` naming the budget; the worker serves on.
    #[must_use]
    pub fn limits(mut self, limits: airlock_codec::Limits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Registers an async handler for `M`.
    ///
    /// For speed, a call with a body of up to 64 KiB is first polled on the serving loop
    /// itself: a handler that is ready at once is answered in the same turn, with no task. One
    /// that is not ready moves to a task of its own, which polls it again; so the handler's
    /// future must register the waker of *every* poll, as the `Future` contract requires and
    /// every tokio primitive does (a hand-written future that keeps only the first waker it saw
    /// would never be woken). Work before the handler's first `.await` runs on the serving
    /// loop: keep it short, or use [`blocking_method`](Self::blocking_method).
    #[must_use]
    pub fn method<M, F, Fut>(self, handler: F) -> Self
    where
        M: Method,
        F: Fn(M::Request) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Response, HandlerError>> + Send + 'static,
    {
        self.register(M::NAME, erase_async::<Typed<M>, F, Fut>(handler))
    }

    /// Registers an async handler for the method `name` whose request and response are
    /// dynamic [`Value`](airlock_codec::Value)s in their own self-describing encoding
    /// (`PROTOCOL.md` §4), for hosts that name the method at run time
    /// (`airlock_host::Host::call_value`). The request is decoded within the worker's budgets
    /// ([`limits`](Self::limits)), like a typed one; one that does not decode is answered with
    /// a `Fail` of kind `BadRequest`. An invalid `name` makes serving fail with
    /// [`ServeError::InvalidMethod`], as for a typed method.
    ///
    /// ```
    /// use airlock_worker::{Value, Worker};
    /// let worker = Worker::new().value_method("count", |request| async move {
    ///     match request {
    ///         Value::List(items) => Ok(Value::U64(items.len() as u64)),
    ///         _ => Err(airlock_worker::HandlerError::new("expected a list")),
    ///     }
    /// });
    /// assert_eq!(worker.method_names(), ["count"]);
    /// ```
    #[must_use]
    pub fn value_method<F, Fut>(self, name: &str, handler: F) -> Self
    where
        F: Fn(airlock_codec::Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<airlock_codec::Value, HandlerError>> + Send + 'static,
    {
        self.register(name, erase_async::<Dynamic, F, Fut>(handler))
    }

    /// Registers a blocking handler for `M`; it runs on a thread of tokio's blocking pool, so it
    /// cannot stall other calls.
    ///
    /// The fast path: a worker process served with [`max_concurrency(1)`](Self::max_concurrency)
    /// runs it on the serving thread itself instead, when no reply is still being written
    /// (nothing else could run beside it anyway), saving two thread switches per call. While it
    /// runs, that worker reads nothing: a `Cancel` for the call is seen only after it returns
    /// (the host answers the caller `Cancelled` at once either way), and tasks a handler
    /// spawned on the serving runtime wait for it. A
    /// [`cancellable_blocking_method`](Self::cancellable_blocking_method), which must see its
    /// `Cancel` while it runs, always gets a thread of its own.
    #[must_use]
    pub fn blocking_method<M, F>(self, handler: F) -> Self
    where
        M: Method,
        F: Fn(M::Request) -> Result<M::Response, HandlerError> + Send + Sync + 'static,
    {
        self.register(M::NAME, erase_blocking::<Typed<M>, F>(handler))
    }

    /// Registers an async handler for the [`Streaming`](airlock_protocol::Streaming) method
    /// `M`: it also gets a [`Progress`](crate::Progress) sender whose updates reach the host,
    /// in order, before the call's answer (`Host::call_streaming` yields them). Runs like
    /// [`method`](Self::method)'s handlers.
    ///
    /// ```
    /// use airlock_worker::{method, Worker};
    /// method!(pub CountTo, "count_to", u32 => u32, progress u32);
    /// let worker = Worker::new().streaming_method::<CountTo, _, _>(|n, mut progress| async move {
    ///     for step in 1..=n {
    ///         progress
    ///             .send(&step)
    ///             .await
    ///             .map_err(|e| airlock_worker::HandlerError::new(e.to_string()))?;
    ///     }
    ///     Ok(n)
    /// });
    /// assert_eq!(worker.method_names(), ["count_to"]);
    /// ```
    #[must_use]
    pub fn streaming_method<M, F, Fut>(self, handler: F) -> Self
    where
        M: airlock_protocol::Streaming,
        F: Fn(M::Request, crate::Progress<M::Progress>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Response, HandlerError>> + Send + 'static,
    {
        self.register(M::NAME, erase_streaming::<M, F, Fut>(handler))
    }

    /// Registers a blocking handler for `M` that can stop early: it gets a
    /// [`CancelToken`](crate::CancelToken) that is cancelled when the host cancels the call or
    /// its deadline passes. A plain [`blocking_method`](Self::blocking_method)'s call is
    /// answered `Cancelled` at once too, but its handler runs to its end on its thread,
    /// holding a concurrency slot; this one can return as soon as it sees the token.
    ///
    /// ```
    /// use airlock_worker::{method, HandlerError, Worker};
    /// method!(pub Crunch, "crunch", u64 => u64);
    /// let worker = Worker::new().cancellable_blocking_method::<Crunch, _>(|rounds, cancel| {
    ///     let mut acc = 0u64;
    ///     for round in 0..rounds {
    ///         if cancel.is_cancelled() {
    ///             return Err(HandlerError::new("cancelled"));
    ///         }
    ///         acc = acc.wrapping_mul(31).wrapping_add(round);
    ///     }
    ///     Ok(acc)
    /// });
    /// assert_eq!(worker.method_names(), ["crunch"]);
    /// ```
    #[must_use]
    pub fn cancellable_blocking_method<M, F>(self, handler: F) -> Self
    where
        M: Method,
        F: Fn(M::Request, &crate::CancelToken) -> Result<M::Response, HandlerError>
            + Send
            + Sync
            + 'static,
    {
        self.register(M::NAME, erase_cancellable_blocking::<M, F>(handler))
    }

    fn register(mut self, name: &str, handler: ErasedHandler) -> Self {
        if !is_valid_method_name(name) {
            self.error
                .get_or_insert_with(|| format!("invalid method name {name:?}"));
        } else if self.methods.insert(name.into(), handler).is_some() {
            self.error
                .get_or_insert_with(|| format!("method {name:?} registered twice"));
        }
        self
    }

    /// The names of the registered methods, sorted.
    pub fn method_names(&self) -> Vec<String> {
        let mut names: Vec<_> = self.methods.keys().cloned().collect();
        names.sort();
        names
    }

    pub(crate) fn into_spec(
        self,
        token: Option<[u8; airlock_protocol::TOKEN_LEN]>,
    ) -> Result<ServeSpec, ServeError> {
        if let Some(err) = self.error {
            return Err(ServeError::InvalidMethod(err));
        }
        let mut config = WorkerConfig::new(&self.name, &self.version);
        config.methods = {
            let mut names: Vec<_> = self.methods.keys().cloned().collect();
            names.sort();
            names
        };
        config.token = token;
        Ok(ServeSpec {
            config,
            methods: self.methods,
            max_concurrency: self.max_concurrency,
            limits: self.limits,
            spin: None,
            load_poll: None,
            inline_blocking: false,
            wait_blocking: false,
        })
    }

    /// Serves over `transport` until the host shuts the worker down or goes away.
    pub async fn serve_on<T: Transport>(self, transport: T) -> Result<(), ServeError> {
        serve_on(self.into_spec(None)?, transport).await
    }

    /// Serves over the transport the host chose for this process (from the environment:
    /// a socket when `AIRLOCK_SOCKET_FD` or `AIRLOCK_SOCKET_NAME` is set and the `socket`
    /// feature is on, otherwise the pipe on stdin/stdout). Must run in a tokio runtime.
    ///
    /// On Linux it first makes the process non-dumpable (`PR_SET_DUMPABLE` = 0), before it
    /// touches its channel: other processes of the same uid (a hostile sibling worker) can then
    /// neither ptrace this process nor open its own descriptors through `/proc/<pid>/fd`. The
    /// host's copies of the same channel are not covered, nor are programs a handler execs; see
    /// SECURITY.md, "Residuals". It also means no core dumps. Fails with
    /// [`ServeError::Undumpable`] if that cannot be done.
    /// [`serve_on`](Self::serve_on), which an in-process twin uses inside the host, does not.
    pub async fn serve(self) -> Result<(), ServeError> {
        make_undumpable()?;
        crate::env_transport::serve_from_env(self).await
    }

    #[cfg(any(feature = "pipe", feature = "socket"))]
    pub(crate) async fn serve_with_token<T: Transport>(
        self,
        transport: T,
        token: Option<[u8; airlock_protocol::TOKEN_LEN]>,
    ) -> Result<(), ServeError> {
        let wait_blocking = self.waits_in_os();
        let mut spec = self.into_spec(token)?;
        spec.wait_blocking = wait_blocking;
        // A process worker spins only if its host asked for it (and it has CPUs to spare).
        spec.spin = airlock_protocol::spin::window_from_env();
        spec.load_poll = airlock_protocol::spin::load_poll_from_env();
        // One handler at a time: a blocking one may as well run on the serving thread.
        spec.inline_blocking = spec.max_concurrency == 1;
        serve_on(spec, transport).await
    }

    /// Whether an idle serving loop waits for the host in the OS: only on
    /// [`serve_blocking`](Self::serve_blocking)'s own thread, and only if asked for
    /// ([`idle_wait_in_os`](Self::idle_wait_in_os)).
    pub(crate) fn waits_in_os(&self) -> bool {
        self.owns_thread && self.idle_wait_in_os
    }

    /// [`serve`](Self::serve) on a single-threaded runtime of its own, for binaries that have
    /// none. Async handlers share that thread (cooperatively); register CPU-heavy or blocking
    /// work with [`blocking_method`](Self::blocking_method), which runs on a thread pool (or,
    /// with [`max_concurrency(1)`](Self::max_concurrency), on this thread).
    /// With [`idle_wait_in_os`](Self::idle_wait_in_os), an idle worker waits for the host in
    /// the OS rather than through a turn of this runtime.
    pub fn serve_blocking(mut self) -> Result<(), ServeError> {
        self.owns_thread = true;
        // One thread: every hop of a call (reader, serving loop, handler, writer) stays on it,
        // instead of paying a cross-thread wake-up (often an idle vCPU's) at each. Handlers still
        // run concurrently; blocking ones go to tokio's blocking pool unless there is one slot.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ServeError::Runtime)?;
        // The serving loop runs as a task, not as `block_on`'s own future: tokio wakes a task
        // by queueing it, but wakes `block_on`'s future by polling the OS for events first,
        // two extra system calls per call.
        runtime.block_on(async {
            match tokio::spawn(self.serve()).await {
                Ok(served) => served,
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(_cancelled) => Err(ServeError::ServingCancelled),
            }
        })
    }
}

/// See [`Worker::serve`]. A process that is not dumpable has its `/proc/<pid>` entries owned by
/// root and refuses ptrace from anything without `CAP_SYS_PTRACE`.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn make_undumpable() -> Result<(), ServeError> {
    use rustix::process::{set_dumpable_behavior, DumpableBehavior};
    set_dumpable_behavior(DumpableBehavior::NotDumpable)
        .map_err(|errno| ServeError::Undumpable(errno.into()))
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn make_undumpable() -> Result<(), ServeError> {
    Ok(())
}
