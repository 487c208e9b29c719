//! What confinement a worker actually runs under, as verified from outside.

use super::{ConfinementMode, Feature};

/// What confinement a worker runs under: what the host applied and then read back from
/// `/proc/<pid>` before the worker's first call. Part of
/// [`WorkerInfo`](crate::WorkerInfo).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfinementReport {
    /// The mode asked for.
    pub mode: ConfinementMode,
    /// The worker's pid as the host sees it (inside its own PID namespace it is 2, under the sandbox's init).
    pub pid: u32,
    /// Its uid as the host sees it: when the host is root and confinement is on, one of
    /// [`WORKER_UIDS`](crate::WORKER_UIDS), its own.
    pub uid: u32,
    /// It runs in user, PID, mount, network, IPC and UTS namespaces of its own (checked
    /// against the host's namespace links).
    pub namespaces: bool,
    /// The Landlock ABI version of the ruleset applied, if any.
    pub landlock_abi: Option<i32>,
    /// seccomp filters installed on the worker (`Seccomp_filters`), the host's included.
    pub seccomp_filters: u32,
    /// Of those, the filters the host's own spawning thread already ran under (a container's
    /// profile, say): the worker inherits them, but they are neither the host's nor the
    /// worker's own, and [`worker_filter`](Self::worker_filter) never counts them.
    pub inherited_filters: u32,
    /// The worker installed its own allowlist on top of the host's filters.
    pub worker_filter: bool,
    /// `NoNewPrivs` is set.
    pub no_new_privs: bool,
    /// Its effective, permitted and bounding capability sets are empty.
    pub no_capabilities: bool,
    /// Resource limits applied (`RLIMIT_AS`, `RLIMIT_NPROC`, ...).
    pub rlimits: bool,
    /// A cgroup of its own holds the worker, with its memory and process limits (only where
    /// the host may create one: root, or a delegated cgroup v2; elsewhere the rlimits stand
    /// alone, and System V IPC, whose memory they would not count, is refused).
    pub cgroup: bool,
    /// What [`best_effort`](crate::Confinement::best_effort) had to leave out.
    pub missing: Vec<Feature>,
}

impl ConfinementReport {
    pub(crate) fn unconfined(pid: u32, uid: u32) -> Self {
        Self {
            mode: ConfinementMode::None,
            pid,
            uid,
            namespaces: false,
            landlock_abi: None,
            seccomp_filters: 0,
            inherited_filters: 0,
            worker_filter: false,
            no_new_privs: false,
            no_capabilities: false,
            rlimits: false,
            cgroup: false,
            missing: Vec::new(),
        }
    }

    /// Counts `inherited` filters, those the thread that forks the worker runs under, in what
    /// the worker must be found running under: they come on top of the host's own.
    pub(crate) fn count_inherited(&mut self, inherited: u32) {
        self.inherited_filters = inherited;
        if self.seccomp_filters > 0 {
            self.seccomp_filters += inherited;
        }
    }
}
