//! Counters a host keeps about its calls and workers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use airlock_protocol::ViolationCode;

use crate::CallError;

/// A snapshot of a host's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Calls begun.
    pub calls_started: u64,
    /// Calls that returned a response.
    pub calls_ok: u64,
    /// Calls that failed, by kind.
    pub calls_failed: FailureCounts,
    /// Protocol violations, by code.
    pub violations: BTreeMap<ViolationCode, u64>,
    /// Workers started after the first.
    pub restarts: u64,
    /// Calls in flight now.
    pub in_flight: u64,
    /// Worker stderr lines not relayed because they came faster than the rate limit. (Lines
    /// over the length limit are relayed, cut, and marked `[truncated]`.)
    pub stderr_lines_dropped: u64,
}

/// Failed calls by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailureCounts {
    /// The handler reported an error.
    pub remote: u64,
    /// The deadline passed.
    pub timeout: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// The worker was lost.
    pub worker_lost: u64,
    /// The response did not decode.
    pub decode: u64,
    /// Refused locally (overloaded, too large, encode failure).
    pub refused: u64,
    /// The host was shut down.
    pub shutdown: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) started: AtomicU64,
    pub(crate) ok: AtomicU64,
    pub(crate) remote: AtomicU64,
    pub(crate) timeout: AtomicU64,
    pub(crate) cancelled: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) decode: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) shutdown: AtomicU64,
    pub(crate) restarts: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) stderr_dropped: Arc<AtomicU64>,
    /// The current worker's last stderr lines, for a failed spawn's error.
    pub(crate) stderr_tail: Arc<crate::stderr::StderrTail>,
    pub(crate) violations: Mutex<BTreeMap<ViolationCode, u64>>,
    /// The current worker's pid as the host sees it (0: none running).
    pub(crate) worker_pid: std::sync::atomic::AtomicU32,
}

impl Counters {
    pub(crate) fn record(&self, result: &Result<(), &CallError>) {
        let counter = match result {
            Ok(()) => &self.ok,
            Err(CallError::Remote(_)) => &self.remote,
            Err(CallError::Timeout) => &self.timeout,
            Err(CallError::Cancelled) => &self.cancelled,
            Err(CallError::WorkerLost(_)) => &self.lost,
            Err(CallError::Decode(_)) => &self.decode,
            Err(CallError::Shutdown) => &self.shutdown,
            Err(_) => &self.refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn violation(&self, code: ViolationCode) {
        if let Ok(mut map) = self.violations.lock() {
            *map.entry(code).or_default() += 1;
        }
    }

    pub(crate) fn snapshot(&self) -> HostStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        HostStats {
            calls_started: get(&self.started),
            calls_ok: get(&self.ok),
            calls_failed: FailureCounts {
                remote: get(&self.remote),
                timeout: get(&self.timeout),
                cancelled: get(&self.cancelled),
                worker_lost: get(&self.lost),
                decode: get(&self.decode),
                refused: get(&self.refused),
                shutdown: get(&self.shutdown),
            },
            violations: self
                .violations
                .lock()
                .map(|m| m.clone())
                .unwrap_or_default(),
            restarts: get(&self.restarts),
            in_flight: get(&self.in_flight),
            stderr_lines_dropped: get(&self.stderr_dropped),
        }
    }
}
