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
    /// Number of workers. Default 1. Zero is refused by [`spawn`](Self::spawn) with
    /// [`SpawnError::EmptyPool`].
    #[must_use]
    pub fn size(mut self, workers: usize) -> Self {
        self.size = workers;
        self
    }

    /// Starts every worker, all at once; fails if any fails to start (those started are shut
    /// down, and the first error is returned).
    pub async fn spawn(self) -> Result<Pool, SpawnError> {
        if self.size == 0 {
            return Err(SpawnError::EmptyPool);
        }
        let mut starting = tokio::task::JoinSet::new();
        for i in 0..self.size {
            let builder = self.host.clone().label(format!("worker-{i}"));
            starting.spawn(async move { (i, builder.spawn().await) });
        }
        let mut hosts: Vec<Option<Host>> = (0..self.size).map(|_| None).collect();
        let mut failure = None;
        while let Some(joined) = starting.join_next().await {
            match joined {
                Ok((i, Ok(host))) => hosts[i] = Some(host),
                Ok((_, Err(err))) => {
                    failure.get_or_insert(err);
                }
                Err(_) => {
                    failure.get_or_insert(SpawnError::SupervisorEnded);
                }
            }
        }
        let hosts: Vec<Host> = hosts.into_iter().flatten().collect();
        if let Some(err) = failure {
            for host in &hosts {
                host.shutdown().await;
            }
            return Err(err);
        }
        Ok(Pool { hosts })
    }
}

/// Several supervised workers behind one call API. A worker's failure affects only the calls
/// on that worker; each is replaced by its own supervisor.
///
/// airlock's channel keeps one worker's frames from reaching another's calls, and the default
/// confinement (each worker in namespaces of its own) keeps a hostile worker from reaching its
/// siblings through the operating system. Under [`Confinement::none`](crate::Confinement::none)
/// it can (signals, ptrace of the host, the host's ends of their pipes under
/// `/proc/<host>/fd`): see SECURITY.md.
#[derive(Clone, Debug)]
pub struct Pool {
    hosts: Vec<Host>,
}

/// A snapshot of a [`Pool`]'s counters: each worker's, and their sum.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Every worker's counters added up ([`HostStats::merge`]): per-method percentiles here
    /// are those of all the pool's calls to the method.
    pub total: HostStats,
    /// Each worker's counters, in the order of [`Pool::hosts`].
    pub workers: Vec<HostStats>,
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

    pub(crate) fn pick(&self) -> Result<&Host, CallError> {
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

    /// The pool's counters: each worker's, and their total.
    pub fn stats(&self) -> PoolStats {
        let workers: Vec<HostStats> = self.hosts.iter().map(Host::stats).collect();
        let mut total = HostStats::default();
        for worker in &workers {
            total.merge(worker);
        }
        PoolStats { total, workers }
    }

    /// Shuts every worker down.
    pub async fn shutdown(&self) {
        for host in &self.hosts {
            host.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pool_of_no_workers_is_refused_before_anything_is_spawned() {
        // The program does not exist: a clamp to one worker would fail with `Exec` instead.
        let result = Pool::builder(Host::builder("/nonexistent/airlock-worker"))
            .size(0)
            .spawn()
            .await;
        assert!(matches!(result, Err(SpawnError::EmptyPool)), "{result:?}");
    }
}
