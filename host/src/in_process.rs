//! In-process mode: the same handlers, codec and session state machines, without a process.

use std::sync::Arc;
use std::time::Instant;

use airlock_protocol::Method;
use airlock_worker::Worker;

use crate::host::HostBuilder;
use crate::launch::Launcher;
use crate::{CallError, Host, HostStats, SpawnError};

/// A worker run as a task inside the host process, reached through an in-memory stream with
/// exactly the frames, codec, budgets and state machines a real worker gets. For development
/// and tests: it gives identical results (a parity suite checks), but no isolation at all.
#[derive(Clone, Debug)]
pub struct InProcess {
    host: Host,
}

impl InProcess {
    /// Starts an in-process worker built by `worker` (called again for each restart).
    pub async fn new(
        worker: impl Fn() -> Worker + Send + Sync + 'static,
    ) -> Result<Self, SpawnError> {
        Self::with_builder(Host::in_process_builder(), worker).await
    }

    /// Like [`new`](Self::new), with the host settings of `builder` (limits, deadlines,
    /// restart policy; the program, arguments and environment are ignored).
    pub async fn with_builder(
        builder: HostBuilder,
        worker: impl Fn() -> Worker + Send + Sync + 'static,
    ) -> Result<Self, SpawnError> {
        let host = builder
            .spawn_with(Launcher::InProcess(Arc::new(worker)))
            .await?;
        Ok(Self { host })
    }

    /// Calls `M`, as [`Host::call`].
    pub async fn call<M: Method>(&self, request: &M::Request) -> Result<M::Response, CallError> {
        self.host.call::<M>(request).await
    }

    /// Calls `M` with a deadline, as [`Host::call_with_deadline`].
    pub async fn call_with_deadline<M: Method>(
        &self,
        request: &M::Request,
        deadline: Instant,
    ) -> Result<M::Response, CallError> {
        self.host.call_with_deadline::<M>(request, deadline).await
    }

    /// The underlying host handle.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The counters so far.
    pub fn stats(&self) -> HostStats {
        self.host.stats()
    }

    /// Shuts the in-process worker down.
    pub async fn shutdown(&self) {
        self.host.shutdown().await;
    }
}
