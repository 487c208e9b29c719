//! The two session state machines and what they share.

mod deadlines;
pub(crate) mod host;
pub(crate) mod worker;

use std::collections::{HashSet, VecDeque};

use crate::{CallId, RefuseReason, Violation};

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// The peer broke the protocol.
    Violation(Violation),
    /// The host refused the worker's `Hello`.
    Refused(RefuseReason),
    /// No valid `Hello` arrived in time.
    HandshakeTimeout,
    /// A call passed its deadline; the worker cannot be trusted to stop it, so it is ended.
    CallTimeout,
    /// The peer's stream ended while the session still expected frames.
    WorkerClosed,
    /// A graceful shutdown completed.
    Shutdown,
    /// The runtime ended the session for a reason outside the protocol.
    Aborted(AbortReason),
}

/// Reasons a runtime gives [`HostSession::abort`](crate::HostSession::abort).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AbortReason {
    /// A response body did not decode to the method's response type: the worker lied.
    UndecodableResponse,
    /// The transport failed (I/O error, send deadline passed).
    TransportFailed,
    /// The worker process exited or was killed.
    ProcessExited,
    /// The host is going away.
    HostShutdown,
    /// The host found, from outside, that the worker does not run under the confinement it
    /// asked for.
    ConfinementNotVerified,
}

impl core::fmt::Display for CloseReason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            CloseReason::Violation(v) => write!(f, "{v}"),
            CloseReason::Refused(r) => write!(f, "handshake refused: {r:?}"),
            CloseReason::HandshakeTimeout => f.write_str("handshake timed out"),
            CloseReason::CallTimeout => f.write_str(
                "a call's handler was still running after its deadline and the cancel grace",
            ),
            CloseReason::WorkerClosed => f.write_str("the worker closed the connection"),
            CloseReason::Shutdown => f.write_str("shut down"),
            CloseReason::Aborted(r) => write!(f, "aborted: {r:?}"),
        }
    }
}

/// What a worker said about itself in its `Hello`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The methods it serves.
    pub methods: Vec<String>,
}

/// The fewest finished ids a session remembers: 4096 ids = 64 KiB.
///
/// The host uses them to tell a late or replayed frame
/// ([`ViolationCode::FinishedCallId`](crate::ViolationCode::FinishedCallId)) from a forged one
/// ([`ViolationCode::UnknownCallId`](crate::ViolationCode::UnknownCallId)); either is fatal.
/// The worker needs them so that a `Cancel` crossing its answer is not mistaken for a forged
/// one: every such `Cancel` names one of the last `max_in_flight` calls it finished, so a
/// worker remembers at least twice `max_in_flight` ids.
pub const FINISHED_ID_MEMORY: usize = 4096;

/// A bounded memory of recently finished ids.
#[derive(Debug)]
pub(crate) struct FinishedIds {
    /// Oldest first, to forget in order.
    order: VecDeque<CallId>,
    /// The same ids, for constant-time lookup where it is asked often (the worker asks on
    /// every `Call`); `None` where it is asked only as a session ends (the host, to name a
    /// violation), so finishing a call costs no hashing there.
    ids: Option<HashSet<CallId, crate::BuildIdHasher>>,
    capacity: usize,
}

impl Default for FinishedIds {
    fn default() -> Self {
        Self::with_capacity(FINISHED_ID_MEMORY)
    }
}

impl FinishedIds {
    /// A memory of at least `capacity` ids (and of [`FINISHED_ID_MEMORY`]), looked up in
    /// constant time.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            order: VecDeque::new(),
            ids: Some(HashSet::default()),
            capacity: capacity.max(FINISHED_ID_MEMORY),
        }
    }

    /// A memory of [`FINISHED_ID_MEMORY`] ids without an index: remembering is cheap, a lookup
    /// scans them all.
    pub(crate) fn unindexed() -> Self {
        Self {
            order: VecDeque::new(),
            ids: None,
            capacity: FINISHED_ID_MEMORY,
        }
    }

    pub(crate) fn remember(&mut self, id: CallId) {
        if self.order.len() >= self.capacity {
            if let (Some(oldest), Some(ids)) = (self.order.pop_front(), self.ids.as_mut()) {
                ids.remove(&oldest);
            }
        }
        // An id remembered twice is kept once where there is an index to tell.
        let new = self.ids.as_mut().is_none_or(|ids| ids.insert(id));
        if new {
            self.order.push_back(id);
        }
    }

    pub(crate) fn contains(&self, id: &CallId) -> bool {
        match &self.ids {
            Some(ids) => ids.contains(id),
            None => self.order.contains(id),
        }
    }
}
