//! `Pool`: several supervised workers, each call sent to the least busy one taking calls.

use std::time::Instant;

use airlock_protocol::Method;

use crate::host::HostBuilder;
use crate::{CallError, Host, HostStats, SpawnError};

/// Builds a [`Pool`] of identical workers.
#[derive(Clone, Debug)]
pub struct PoolBuilder {
    host: HostBuilder,
    size: usize,
    retry_lost_calls: bool,
}

impl PoolBuilder {
    /// Number of workers. Default 1. Zero is refused by [`spawn`](Self::spawn) with
    /// [`SpawnError::EmptyPool`].
    #[must_use]
    pub fn size(mut self, workers: usize) -> Self {
        self.size = workers;
        self
    }

    /// Retry, once, a call lost to something that was not its own doing. Default `false`.
    ///
    /// With it on, a typed call ([`Pool::call`], [`Pool::call_with_deadline`]) of a method
    /// that declares itself safe to run twice ([`Method::IDEMPOTENT`]) and fails with
    /// [`CallError::WorkerLost`] for a reason that [`LostReason::not_caused_by_the_call`]
    /// accepts (another call on its worker timed out and ignored its cancel, or no worker took
    /// the call) is sent once more, on another live worker of the pool (chosen as
    /// [`Pool::call`] chooses; on the replacement of its own worker only if no other is alive,
    /// even when that replacement takes calls before another worker being replaced does),
    /// within the call's original deadline. The second outcome is the call's outcome.
    ///
    /// Never retried: a call that timed out itself, whose own answer did not decode, that was
    /// cancelled or refused; a call whose worker broke the protocol, lied in any answer,
    /// exited or stopped reading (this call may be what made it do so, and a retry would carry
    /// the same request to a second worker and its calls); a method that is not idempotent;
    /// and dynamic calls ([`Pool::call_value`], which cannot declare it). Each attempt is
    /// counted in its own worker's stats.
    ///
    /// [`LostReason::not_caused_by_the_call`]: crate::LostReason::not_caused_by_the_call
    #[must_use]
    pub fn retry_lost_calls(mut self, retry: bool) -> Self {
        self.retry_lost_calls = retry;
        self
    }

    /// Starts every worker, all at once; fails if any fails to start (those started are shut
    /// down, and the first error is returned).
    pub async fn spawn(self) -> Result<Pool, SpawnError> {
        if self.size == 0 {
            return Err(SpawnError::EmptyPool);
        }
        let mut host = self.host;
        // More workers than CPUs: workers polling for their next calls would take the CPUs
        // the others and the host need, so polling under load is off unless chosen.
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        if self.size > cpus && host.settings.poll_under_load.is_none() {
            host = host.poll_under_load(None);
        }
        let mut starting = tokio::task::JoinSet::new();
        for i in 0..self.size {
            let label = format!("{}-{i}", host.settings.label);
            let builder = host.clone().label(label);
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
        Ok(Pool {
            hosts,
            retry_lost_calls: self.retry_lost_calls,
        })
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
    retry_lost_calls: bool,
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
    /// A pool builder whose workers are all spawned from `host`, each labelled for the logs
    /// with `host`'s label and its index: `<label>-<i>` (`airlock-worker-0`, `airlock-worker-1`
    /// for the bundled worker's default label).
    pub fn builder(host: HostBuilder) -> PoolBuilder {
        PoolBuilder {
            host,
            size: 1,
            retry_lost_calls: false,
        }
    }

    /// Calls `M` on the worker taking calls with the fewest in flight (a worker being started
    /// or replaced, or at its `max_in_flight`, only when every worker is), with the pool's
    /// call deadline. A lost call may be retried once: see [`PoolBuilder::retry_lost_calls`].
    pub async fn call<M: Method>(&self, request: &M::Request) -> Result<M::Response, CallError> {
        let host = self.pick()?;
        // `call_timeout` is at most `MAX_TIMEOUT` (checked at spawn), so this cannot overflow.
        let deadline = Instant::now() + host.call_timeout();
        self.call_on::<M>(host, request, deadline).await
    }

    /// Like [`call`](Self::call), with an explicit deadline, which a retry keeps.
    pub async fn call_with_deadline<M: Method>(
        &self,
        request: &M::Request,
        deadline: Instant,
    ) -> Result<M::Response, CallError> {
        self.call_on::<M>(self.pick()?, request, deadline).await
    }

    async fn call_on<M: Method>(
        &self,
        host: &Host,
        request: &M::Request,
        deadline: Instant,
    ) -> Result<M::Response, CallError> {
        let first = host.call_with_deadline::<M>(request, deadline).await;
        let reason = match &first {
            Err(CallError::WorkerLost(reason))
                if self.retry_lost_calls && M::IDEMPOTENT && reason.not_caused_by_the_call() =>
            {
                reason
            }
            _ => return first,
        };
        let Some(other) = self.pick_other_than(host) else {
            return first;
        };
        tracing::debug!(
            target: "airlock::call",
            worker = %host.label(),
            method = M::NAME,
            retry_on = %other.label(),
            %reason,
            "retrying a lost call on another worker"
        );
        other.call_with_deadline::<M>(request, deadline).await
    }

    /// The live worker other than `lost` that [`pick`](Self::pick) prefers, or `lost` itself
    /// (its replacement) when it is the only one alive.
    fn pick_other_than<'a>(&'a self, lost: &'a Host) -> Option<&'a Host> {
        least_busy(self.hosts.iter().filter(|h| !h.same_host(lost)))
            .or_else(|| lost.is_alive().then_some(lost))
    }

    /// The worker a call goes to: of those taking calls now and below their `max_in_flight`,
    /// the one with the fewest calls in flight; only when none is (all starting, reaped,
    /// replaced or full) the live one with the fewest, where the call waits for its next
    /// worker.
    pub(crate) fn pick(&self) -> Result<&Host, CallError> {
        least_busy(self.hosts.iter()).ok_or(CallError::Shutdown)
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

/// Of `hosts`, the one [`Pool::pick`] prefers: taking calls and below its `max_in_flight`,
/// then fewest in flight; otherwise the live one with the fewest, where a call waits for its
/// next worker (or is refused as `Overloaded` if that one is full too).
fn least_busy<'a>(hosts: impl Iterator<Item = &'a Host> + Clone) -> Option<&'a Host> {
    let alive = hosts.filter(|h| h.is_alive());
    alive
        .clone()
        .filter(|h| h.is_taking_calls() && !h.is_full())
        .min_by_key(|h| h.in_flight())
        .or_else(|| alive.min_by_key(|h| h.in_flight()))
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
