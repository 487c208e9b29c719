//! Process hardening: resource limits, no capabilities, `no_new_privs`, a session of its own.
//!
//! rlimits bound what one worker can take from the machine (address space, CPU time,
//! processes and threads, descriptors, file size, queued signals and timers) and forbid core
//! dumps, which would write the worker's memory (call data) to disk, and POSIX message queues.
//! Queued signals and message queues are counted, through the worker's user namespace, against
//! the user that owns it too (the host's user for an unprivileged host; root for a root host
//! in a container's namespace): without the worker's own bound one worker could take the
//! whole of that user's. Capabilities are dropped from every set, the bounding
//! set included, so nothing the worker execs can regain one; `no_new_privs` makes set-uid and
//! file-capability binaries powerless and is what lets an unprivileged process install
//! seccomp and Landlock.

use rustix::io::Errno;
use rustix::process::{Resource, Rlimit};

use super::error::{ConfinementError, ConfinementStep};
use super::policy::Confinement;

/// The limits to set in the child, each as soft = hard.
#[derive(Clone, Debug, Default)]
pub(crate) struct Limits {
    entries: Vec<(Resource, u64)>,
}

impl Limits {
    /// Adds the buffer this value owns to `kept` (see `ChildPlan::footprint`).
    pub(crate) fn footprint(&self, kept: &mut super::host_memory::Kept) {
        let Self { entries } = self;
        kept.slice(entries);
    }

    /// The limits `policy` asks for, checked.
    pub(crate) fn from_policy(policy: &Confinement) -> Result<Self, ConfinementError> {
        let check =
            |setting: &'static str, value: Option<u64>, min: u64, expected: &'static str| {
                match value {
                    Some(v) if v < min => Err(ConfinementError::InvalidLimit {
                        setting,
                        value: v,
                        expected,
                    }),
                    _ => Ok(value),
                }
            };
        let mut entries = vec![(Resource::Core, 0)];
        if let Some(bytes) = check(
            "memory_limit",
            policy.memory_limit,
            1 << 20,
            "at least 1 MiB",
        )? {
            entries.push((Resource::As, bytes));
        }
        if let Some(cpu) = policy.cpu_time {
            let seconds = cpu.as_secs() + u64::from(cpu.subsec_nanos() > 0);
            let seconds = check("cpu_time", Some(seconds), 1, "at least one second")?;
            entries.extend(seconds.map(|s| (Resource::Cpu, s)));
        }
        // In namespaces init counts too: with one process, the worker could never start.
        if let Some(n) = check(
            "max_processes",
            policy.max_processes,
            2,
            "at least 2 (the worker's init is one of them)",
        )? {
            entries.push((Resource::Nproc, n));
        }
        if let Some(n) = check("max_open_files", policy.max_open_files, 16, "at least 16")? {
            entries.push((Resource::Nofile, n));
        }
        if let Some(bytes) = policy.max_file_size {
            entries.push((Resource::Fsize, bytes));
        }
        if let Some(n) = check(
            "max_pending_signals",
            policy.max_pending_signals,
            1,
            "at least 1",
        )? {
            entries.push((Resource::Sigpending, n));
        }
        // A POSIX message queue's bytes count against the user that owns the worker's user
        // namespace as well as the worker's: none at all, as no worker shares one with anyone.
        entries.push((Resource::Msgqueue, 0));
        Ok(Self { entries })
    }

    /// In the child: sets every limit.
    pub(crate) fn apply(&self) -> Result<(), (ConfinementStep, Errno)> {
        for (resource, value) in &self.entries {
            rustix::process::setrlimit(
                *resource,
                Rlimit {
                    current: Some(*value),
                    maximum: Some(*value),
                },
            )
            .map_err(|e| (ConfinementStep::ResourceLimits, e))?;
        }
        Ok(())
    }
}

/// In the child: empties the bounding, ambient, inheritable, permitted and effective
/// capability sets. Needs `CAP_SETPCAP` in the current user namespace for the bounding set;
/// a process without it (an unprivileged host without namespaces) has nothing to drop there.
pub(crate) fn drop_capabilities() -> Result<(), (ConfinementStep, Errno)> {
    drop_bounding_set()?;
    clear_capability_sets()
}

/// In the child: empties the bounding set (needs `CAP_SETPCAP`), so nothing this process
/// execs can ever hold a capability.
pub(crate) fn drop_bounding_set() -> Result<(), (ConfinementStep, Errno)> {
    let step = |e| (ConfinementStep::DropCapabilities, e);
    // Every number a capability can have; the kernel answers EINVAL past its last one.
    for cap in 0..64 {
        match crate::sys::drop_bounding_capability(cap) {
            Ok(()) | Err(Errno::INVAL) => {}
            Err(e) => return Err(step(e)),
        }
    }
    Ok(())
}

/// In the child: empties the ambient, inheritable, permitted and effective sets.
pub(crate) fn clear_capability_sets() -> Result<(), (ConfinementStep, Errno)> {
    let step = |e| (ConfinementStep::DropCapabilities, e);
    rustix::thread::clear_ambient_capability_set().map_err(step)?;
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: rustix::thread::CapabilitySet::empty(),
            permitted: rustix::thread::CapabilitySet::empty(),
            inheritable: rustix::thread::CapabilitySet::empty(),
        },
    )
    .map_err(step)
}

/// In the child: sets `no_new_privs`.
pub(crate) fn no_new_privs() -> Result<(), (ConfinementStep, Errno)> {
    rustix::thread::set_no_new_privs(true).map_err(|e| (ConfinementStep::NoNewPrivs, e))
}
