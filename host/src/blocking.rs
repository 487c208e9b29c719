//! A blocking API for programs without an async runtime: [`Host`] and [`Pool`] with the same
//! calls, errors and guarantees as their async counterparts, each owning the runtime it needs.
//!
//! Each spawned `Host` or `Pool` starts one thread of its own (`airlock-runtime`) running a
//! single-threaded tokio runtime, which drives the supervisor and the reads and writes on the
//! worker's channels. A call runs on the calling thread and blocks it until the call ends,
//! while the runtime thread keeps time: every deadline, kill, restart and budget is enforced
//! exactly as in the async API (the blocking types wrap it). Many threads may call one `Host`
//! or `Pool` at once; each clone shares the same workers.
//!
//! Dropping the last clone shuts the workers down gracefully (as
//! [`shutdown`](Host::shutdown) does) and stops the runtime thread.
//!
//! ```no_run
//! use airlock_host::blocking;
//! use airlock_host::{CallError, Host, Pool};
//!
//! airlock_host::method!(
//!     /// Adds integers; an overflow is a handler error.
//!     pub Sum, "sum", Vec<i64> => i64
//! );
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // No `#[tokio::main]`, no runtime: the host brings its own.
//!     let host = blocking::Host::spawn(Host::builder("target/debug/airlock-worker"))?;
//!     assert_eq!(host.call::<Sum>(&vec![1, 2, 3])?, 6);
//!     let overflow = host.call::<Sum>(&vec![i64::MAX, 1]);
//!     assert!(matches!(overflow, Err(CallError::Remote(_))));
//!
//!     // Three workers, called from six threads at once.
//!     let workers = Pool::builder(Host::builder("target/debug/airlock-worker")).size(3);
//!     let pool = &blocking::Pool::spawn(workers)?;
//!     let totals: Vec<i64> = std::thread::scope(|s| {
//!         let calls: Vec<_> = (0..6)
//!             .map(|i| s.spawn(move || pool.call::<Sum>(&vec![i, i])))
//!             .collect();
//!         calls.into_iter().map(|c| c.join().unwrap()).collect::<Result<_, _>>()
//!     })?;
//!     assert_eq!(totals, [0, 2, 4, 6, 8, 10]);
//!     Ok(())
//! }
//! ```
//!
//! # Panics
//!
//! The blocking calls must not be made from inside an async runtime: they block the thread
//! they run on, and tokio refuses to block one of its own (it panics, "Cannot start a runtime
//! from within a runtime"). Async code uses [`crate::Host`] and [`crate::Pool`] directly.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use airlock_protocol::Method;
use tokio::sync::oneshot;

use crate::{CallError, HostBuilder, HostStats, PoolBuilder, SpawnError, WorkerInfo};

/// A supervised worker, called with blocking calls. Cheap to clone; every clone talks to the
/// same worker. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Host {
    shared: Arc<Shared<crate::Host>>,
}

impl Host {
    /// Starts the worker configured by `builder` and completes its handshake, on a runtime
    /// thread of its own. Fails as [`HostBuilder::spawn`] does, or with
    /// [`SpawnError::Runtime`] if the runtime thread cannot be started.
    pub fn spawn(builder: HostBuilder) -> Result<Self, SpawnError> {
        let runtime = RuntimeThread::start()?;
        let host = runtime.block_on(builder.spawn())?;
        Ok(Self {
            shared: Arc::new(Shared::new(host, runtime)),
        })
    }

    /// Calls `M` with the host's call deadline, blocking until the call ends. As
    /// [`crate::Host::call`].
    pub fn call<M: Method>(&self, request: &M::Request) -> Result<M::Response, CallError> {
        self.shared.block_on(self.shared.inner().call::<M>(request))
    }

    /// Calls `M`, which must finish by `deadline`. As [`crate::Host::call_with_deadline`].
    pub fn call_with_deadline<M: Method>(
        &self,
        request: &M::Request,
        deadline: Instant,
    ) -> Result<M::Response, CallError> {
        self.shared.block_on(
            self.shared
                .inner()
                .call_with_deadline::<M>(request, deadline),
        )
    }

    /// Shuts the worker down gracefully, blocking until it is gone. As
    /// [`crate::Host::shutdown`]; later calls fail with [`CallError::Shutdown`].
    pub fn shutdown(&self) {
        self.shared.block_on(self.shared.inner().shutdown());
    }

    /// The counters so far.
    pub fn stats(&self) -> HostStats {
        self.shared.inner().stats()
    }

    /// Calls in flight now.
    pub fn in_flight(&self) -> u64 {
        self.shared.inner().in_flight()
    }

    /// The pid of the current worker process, as [`crate::Host::worker_pid`].
    pub fn worker_pid(&self) -> Option<u32> {
        self.shared.inner().worker_pid()
    }

    /// False once the host is shut down or its restart budget is exhausted.
    pub fn is_alive(&self) -> bool {
        self.shared.inner().is_alive()
    }

    /// What the first worker said about itself and the confinement it was verified to run
    /// under.
    pub fn worker_info(&self) -> &WorkerInfo {
        self.shared.inner().worker_info()
    }
}

/// Several supervised workers behind one blocking call API, as [`crate::Pool`]. Cheap to
/// clone. See the [module docs](self).
#[derive(Clone, Debug)]
pub struct Pool {
    shared: Arc<Shared<crate::Pool>>,
}

impl Pool {
    /// Starts every worker configured by `builder`, on one runtime thread for the whole
    /// pool. Fails as [`PoolBuilder::spawn`] does, or with [`SpawnError::Runtime`].
    pub fn spawn(builder: PoolBuilder) -> Result<Self, SpawnError> {
        let runtime = RuntimeThread::start()?;
        let pool = runtime.block_on(builder.spawn())?;
        Ok(Self {
            shared: Arc::new(Shared::new(pool, runtime)),
        })
    }

    /// Calls `M` on the worker taking calls with the fewest in flight, blocking until the call
    /// ends. As [`crate::Pool::call`].
    pub fn call<M: Method>(&self, request: &M::Request) -> Result<M::Response, CallError> {
        self.shared.block_on(self.shared.inner().call::<M>(request))
    }

    /// Like [`call`](Self::call), with an explicit deadline.
    pub fn call_with_deadline<M: Method>(
        &self,
        request: &M::Request,
        deadline: Instant,
    ) -> Result<M::Response, CallError> {
        self.shared.block_on(
            self.shared
                .inner()
                .call_with_deadline::<M>(request, deadline),
        )
    }

    /// Shuts every worker down, blocking until they are gone.
    pub fn shutdown(&self) {
        self.shared.block_on(self.shared.inner().shutdown());
    }

    /// The pool's counters: totals and each worker's.
    pub fn stats(&self) -> crate::PoolStats {
        self.shared.inner().stats()
    }
}

/// What both blocking types wrap: how their async counterpart shuts down when dropped.
trait ShutDown: std::fmt::Debug + Send + Sync + 'static {
    fn shut_down(&self) -> impl std::future::Future<Output = ()> + Send + '_;
}

impl ShutDown for crate::Host {
    fn shut_down(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        self.shutdown()
    }
}

impl ShutDown for crate::Pool {
    fn shut_down(&self) -> impl std::future::Future<Output = ()> + Send + '_ {
        self.shutdown()
    }
}

/// An async host or pool and the runtime thread that drives it. Dropped with the last clone of
/// its blocking handle: the workers are shut down gracefully first, then (fields drop in
/// order) the handle, then the runtime thread.
#[derive(Debug)]
struct Shared<T: ShutDown> {
    inner: T,
    runtime: RuntimeThread,
}

impl<T: ShutDown> Shared<T> {
    fn new(inner: T, runtime: RuntimeThread) -> Self {
        Self { inner, runtime }
    }

    fn inner(&self) -> &T {
        &self.inner
    }

    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

impl<T: ShutDown> Drop for Shared<T> {
    fn drop(&mut self) {
        // Inside an async runtime a blocking wait would panic (and a panic in a drop can
        // abort): the workers are then left to the runtime thread's end, which drops their
        // supervisors, and a worker whose supervisor is dropped is killed.
        if tokio::runtime::Handle::try_current().is_err() {
            self.runtime.block_on(self.inner.shut_down());
        }
    }
}

/// A single-threaded tokio runtime driven by a thread of its own, until dropped.
///
/// Callers run their futures with [`RuntimeThread::block_on`] on their own threads; tasks those
/// futures spawn, timers and I/O readiness are driven by the runtime thread, which sits in
/// `Runtime::block_on` (only that drives a current-thread runtime's I/O and timers).
#[derive(Debug)]
struct RuntimeThread {
    handle: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl RuntimeThread {
    fn start() -> Result<Self, SpawnError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(SpawnError::Runtime)?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("airlock-runtime".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                // Dropping the runtime drops every task still on it: a worker whose
                // supervisor is dropped is killed (its child handle kills on drop).
            })
            .map_err(SpawnError::Runtime)?;
        Ok(Self {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.handle.block_on(future)
    }
}

impl Drop for RuntimeThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
