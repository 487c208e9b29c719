//! `Pool`: several supervised workers, each call sent to the least-loaded live one.

use std::time::Instant;

use airlock_protocol::Method;

use crate::host::HostBuilder;
use crate::{CallError, Host, HostStats, SpawnError};

/// Builds a [`Pool`] of identical workers.
#[derive(Clone, Debug)]
pub struct PoolBuilder {
    host: HostBuilder,
    size: usize,
}

impl PoolBuilder {
    /// Number of workers. Default 1; at least 1.
    #[must_use]
    pub fn size(mut self, workers: usize) -> Self {
        self.size = workers.max(1);
        self
    }

    /// Starts every worker; fails if any fails to start (those started are shut down).
    pub async fn spawn(self) -> Result<Pool, SpawnError> {
        let mut hosts = Vec::with_capacity(self.size);
        for i in 0..self.size {
            let label = format!("worker-{i}");
            match self.host.clone().label(label).spawn().await {
                Ok(host) => hosts.push(host),
                Err(err) => {
                    for host in &hosts {
                        host.shutdown().await;
                    }
                    return Err(err);
                }
            }
        }
        Ok(Pool { hosts })
    }
}

/// Several supervised workers behind one call API. A worker's failure affects only the calls
/// on that worker; each is replaced by its own supervisor.
///
/// A pool spreads load; it does not isolate its workers from each other. airlock's channel
/// keeps one worker's frames from reaching another's calls, but until OS confinement gives
/// each worker its own uid or namespaces, the workers run with the host's uid, and a hostile
/// one can reach its siblings through the operating system (signals; ptrace of the host; the
/// host's ends of their pipes under `/proc/<host>/fd` and of their sockets via `pidfd_getfd`):
/// see SECURITY.md, "Residuals". Send calls that must not see each other's data to workers
/// launched under different uids, not to workers of one pool.
#[derive(Clone, Debug)]
pub struct Pool {
    hosts: Vec<Host>,
}

impl Pool {
    /// A pool builder whose workers are all spawned from `host`, each relabelled `worker-<i>`
    /// (its index) for the logs.
    pub fn builder(host: HostBuilder) -> PoolBuilder {
        PoolBuilder { host, size: 1 }
    }

    /// Calls `M` on the live worker with the fewest calls in flight.
    pub async fn call<M: Method>(&self, request: &M::Request) -> Result<M::Response, CallError> {
        self.pick()?.call::<M>(request).await
    }

    /// Like [`call`](Self::call), with an explicit deadline.
    pub async fn call_with_deadline<M: Method>(
        &self,
        request: &M::Request,
        deadline: Instant,
    ) -> Result<M::Response, CallError> {
        self.pick()?
            .call_with_deadline::<M>(request, deadline)
            .await
    }

    fn pick(&self) -> Result<&Host, CallError> {
        self.hosts
            .iter()
            .filter(|h| h.is_alive())
            .min_by_key(|h| h.in_flight())
            .ok_or(CallError::Shutdown)
    }

    /// The pool's workers.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Each worker's counters.
    pub fn stats(&self) -> Vec<HostStats> {
        self.hosts.iter().map(Host::stats).collect()
    }

    /// Shuts every worker down.
    pub async fn shutdown(&self) {
        for host in &self.hosts {
            host.shutdown().await;
        }
    }
}
