//! OS confinement of worker processes: what a worker may reach outside its channel.
//!
//! airlock's channel checks make the IPC boundary sound; confinement makes the rest of the
//! machine unreachable. A [`Confinement`] is set with
//! [`HostBuilder::confinement`](crate::HostBuilder::confinement); [`Confinement::strict`] is
//! the default. Layers, outermost first, each in its own module:
//!
//! | layer | module | applied by | why there |
//! | --- | --- | --- | --- |
//! | user, PID (own `/proc`), mount (minimal read-only root), network, IPC and UTS namespaces | `namespaces`, `mounts` | the host, between fork and `exec` | only a process that is not yet running the worker's code can be put in them |
//! | Landlock: filesystem access limited to the policy, TCP bind/connect denied, signals and abstract sockets scoped | `landlock` | the host, before `exec` | inherited across `exec`, so it confines any program |
//! | seccomp denylist (`ptrace`, `process_vm_*`, `pidfd_getfd`, `userfaultfd`, `unshare`, `setns`, mounts, `bpf`, `perf_event_open`, keys, `kexec`, modules, io_uring, namespace flags on `clone`; System V IPC without an IPC namespace and a cgroup of its own; `bind`, `listen`, credential passing and datagram sockets without a network namespace) | `seccomp` | the host, last step before `exec` | any program, whatever language it is written in |
//! | seccomp allowlist (no `execve`, no new sockets, no `fork`) | `airlock_worker::confine` | the worker itself, right before its `Hello` | only the worker knows when its own set-up (loading libraries, connecting its socket) is over |
//! | `no_new_privs`, no capabilities, parent-death signal, own session, rlimits | `process` | the host, before `exec` | as above |
//! | a cgroup with a memory and a process limit, where the host may create one | `cgroup` | the host, before the worker runs | counts what rlimits cannot (shared memory, tmpfs pages) |
//! | non-dumpable | the worker library | the worker itself | `exec` resets it |
//!
//! The host then verifies from outside, through `/proc/<pid>/status` and the namespace links,
//! that the worker runs under what was asked ([`verify`](self)), before its first call, and
//! refuses one that does not. It never takes the worker's word.

mod cgroup;
mod child;
mod error;
mod host_memory;
mod landlock;
mod mounts;
mod namespaces;
mod plan;
mod policy;
mod process;
mod report;
mod seccomp;
mod verify;

pub use error::{ConfinementError, ConfinementStep, Feature};
pub use namespaces::WORKER_UIDS;
pub use policy::{
    Confinement, ConfinementMode, DEFAULT_MAX_FILE_SIZE, DEFAULT_MAX_OPEN_FILES,
    DEFAULT_MAX_PENDING_SIGNALS, DEFAULT_MAX_PROCESSES, DEFAULT_MEMORY_LIMIT, DEFAULT_TMP_SIZE,
};
pub use report::ConfinementReport;

pub(crate) use cgroup::WorkerCgroup;
pub(crate) use host_memory::Kept;
pub(crate) use plan::{prepare, resolve_program, Prepared, Reports, SpawnInputs};
pub(crate) use verify::{
    filters_of_this_thread, runs_the_hosts_filter, verify_spawned, verify_worker_filter,
};
