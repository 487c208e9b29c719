//! Why a worker could not be started under the confinement asked for.

use std::path::PathBuf;

use thiserror::Error;

/// A kernel feature a confinement layer needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// User, PID, mount, network, IPC and UTS namespaces (an unprivileged user namespace
    /// when the host is not root).
    Namespaces,
    /// Landlock with signal and abstract-socket scoping (ABI 6, Linux 6.12).
    Landlock,
    /// seccomp filters.
    Seccomp,
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Feature::Namespaces => "namespaces",
            Feature::Landlock => "Landlock ABI 6",
            Feature::Seccomp => "seccomp",
        })
    }
}

/// A step of setting up the worker's confinement, run between fork and `exec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfinementStep {
    /// Creating the namespaces (`clone` with `CLONE_NEW*`).
    CreateNamespaces,
    /// Writing the worker's uid and gid maps.
    MapIdentity,
    /// Moving the worker into its cgroup.
    Cgroup,
    /// Waiting for the process that created the namespaces, or, for the one that made them,
    /// for the sandbox's init to start the worker: at most 20 s, then `ETIMEDOUT` (init was
    /// stopped, most likely by a process of the worker's uid, and has been killed).
    Synchronise,
    /// Taking a copy of a path the worker is granted (`open_tree`).
    CopyPath,
    /// Becoming the worker's user and group.
    SwitchIdentity,
    /// Building the worker's root (tmpfs, bind mounts, `/proc`, `/dev`, `/tmp`).
    BuildRoot,
    /// Making a granted path read-only.
    ReadOnly,
    /// Switching to the new root (`pivot_root`).
    PivotRoot,
    /// Entering the working directory.
    WorkingDirectory,
    /// Starting the worker from init in a session of its own (the clone, its signal mask,
    /// `setsid`).
    Session,
    /// Setting resource limits.
    ResourceLimits,
    /// Dropping every capability.
    DropCapabilities,
    /// Setting `no_new_privs`.
    NoNewPrivs,
    /// Applying the Landlock ruleset.
    Landlock,
    /// Installing the seccomp filter.
    Seccomp,
}

impl ConfinementStep {
    pub(crate) const ALL: [ConfinementStep; 16] = [
        ConfinementStep::CreateNamespaces,
        ConfinementStep::MapIdentity,
        ConfinementStep::Cgroup,
        ConfinementStep::Synchronise,
        ConfinementStep::CopyPath,
        ConfinementStep::SwitchIdentity,
        ConfinementStep::BuildRoot,
        ConfinementStep::ReadOnly,
        ConfinementStep::PivotRoot,
        ConfinementStep::WorkingDirectory,
        ConfinementStep::Session,
        ConfinementStep::ResourceLimits,
        ConfinementStep::DropCapabilities,
        ConfinementStep::NoNewPrivs,
        ConfinementStep::Landlock,
        ConfinementStep::Seccomp,
    ];

    pub(crate) fn code(self) -> u8 {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) as u8
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code)).copied()
    }
}

/// Why a worker could not be started under the confinement asked for.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfinementError {
    /// The kernel (or the container the host runs in) lacks a feature the policy needs.
    #[error(
        "this system does not offer {feature}, which Confinement::strict() needs ({detail}); \
         use Confinement::strict().best_effort() to start without it, or Confinement::none()"
    )]
    Unsupported {
        /// The missing feature.
        feature: Feature,
        /// What was found.
        detail: String,
    },
    /// A root host's worker without namespaces (`best_effort()` where the kernel refused
    /// them) cannot connect a named socket: dropped to a uid of its own with no mount
    /// namespace of its own, it cannot enter the host's private socket directory.
    #[error(
        "a root host's worker cannot connect a named socket without namespaces (dropped to \
         a uid of its own, it cannot enter the host's socket directory); use TransportChoice::Pipe \
         or TransportChoice::SocketInherited"
    )]
    NamedSocketNeedsNamespaces,
    /// A path the policy grants cannot be used.
    #[error("the confinement grants {path:?}, which cannot be used: {source}")]
    Path {
        /// The path as given.
        path: PathBuf,
        /// Why (usually: it does not exist).
        #[source]
        source: std::io::Error,
    },
    /// A path the policy grants (the program's included) names another file than when the
    /// host first spawned under this policy: it was replaced since, so its grant (pinned to
    /// the file's device and inode) is not extended to the newcomer.
    #[error("the confinement grants {path:?}, which names another file than when the host first spawned (it was replaced since)")]
    GrantReplaced {
        /// The path as given.
        path: PathBuf,
    },
    /// The worker program cannot be found or named inside the worker's root.
    #[error("the worker program {program:?} cannot be confined: {source}")]
    Program {
        /// The program as given.
        program: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A limit is out of range.
    #[error("Confinement::{setting}({value}) is out of range: {expected}")]
    InvalidLimit {
        /// The setter.
        setting: &'static str,
        /// The value given.
        value: u64,
        /// What it must be.
        expected: &'static str,
    },
    /// A step between fork and `exec` failed.
    #[error("setting up the worker's confinement failed at {step:?}: {source}")]
    Step {
        /// The step.
        step: ConfinementStep,
        /// The system call's error.
        #[source]
        source: std::io::Error,
    },
    /// The worker, checked from outside, does not run under what was asked.
    #[error("the worker does not run under the confinement asked for: {check} (expected {expected}, found {found})")]
    Verification {
        /// What was checked (`/proc/<pid>/status` field or namespace).
        check: &'static str,
        /// What the policy requires.
        expected: String,
        /// What was found.
        found: String,
    },
}
