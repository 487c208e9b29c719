//! The host's seccomp denylist: system calls no worker program gets, whatever its language.
//!
//! A denylist, not an allowlist, because it must let any program start (an interpreter's
//! start-up touches a long tail of calls). It lists what reaches outside the sandbox or into
//! the kernel's riskiest surfaces: tracing and reading other processes (`ptrace`,
//! `process_vm_readv/writev`, `pidfd_getfd`), leaving or rebuilding the sandbox (`unshare`,
//! `setns`, `clone` with a namespace flag, every mount call, `chroot`), kernel attack surface
//! (`bpf`, `perf_event_open`, `userfaultfd`, io_uring, keyrings, `kexec`, modules), and
//! machine-wide state (clock, swap, reboot, accounting, quotas). Each gets `EPERM`. A second
//! filter answers `ENOSYS`, so that programs fall back to what they would use where the call
//! does not exist: `clone3`, whose flags live in memory a filter cannot read (glibc falls back
//! to `clone`, whose flags the first filter checks), `splice`, `tee`, `vmsplice` and
//! `sendfile` ([`PIPE_LOCK_HOLDERS`]: Rust's `io::copy` and Python's `shutil` fall back to
//! `read` and `write`), and the calls that draw on a budget the worker shares with every
//! process of a user or of the machine ([`SHARED_BUDGET_CALLS`]: inotify, fanotify, AIO).
//!
//! Installed last before `exec`, after every step that needs a listed call (the mounts).
//! The worker library later adds its own allowlist on top (`airlock_worker::confine`).

use std::collections::BTreeMap;

use airlock_worker::confine::{compile, ConfineError};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule,
};

use super::error::{ConfinementError, Feature};

/// Number of filters [`denylist`] returns: the host's share of `Seccomp_filters`.
pub(crate) const HOST_FILTERS: u32 = 2;

const DENIED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_userfaultfd,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    // open_tree_attr (Linux 6.15); libc has no name for it yet.
    #[cfg(target_arch = "x86_64")]
    467,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_vhangup,
    libc::SYS_personality,
];

/// Calls that move data into or out of a pipe holding the pipe's lock while they wait: a
/// `splice` from an empty socket into the worker's output pipe, or from its input pipe into a
/// full socket, or a `sendfile` from an empty socket into the output pipe, sleeps with that
/// pipe's lock held for as long as the worker likes, and any
/// `read(2)` or `write(2)` of the pipe's other end, non-blocking or not, sleeps on the lock
/// with it. The host reads and writes a confined worker's pipes on its callers' threads (a
/// caller writes its own frame and looks for its own answer), so no worker under the host's
/// filter may make them. Answered `ENOSYS`: a program that tries them falls back to plain
/// copies.
const PIPE_LOCK_HOLDERS: [i64; 4] = [
    libc::SYS_splice,
    libc::SYS_tee,
    libc::SYS_vmsplice,
    libc::SYS_sendfile,
];

/// Calls that draw on a kernel budget kept for a whole user or machine, not for the worker:
/// inotify instances and fanotify groups count against the user that created the worker's
/// user namespace (root, for a root host: 128 each for every root process of the machine),
/// and AIO contexts against one budget of the whole machine (`fs.aio-max-nr`). A worker that
/// took them all would deny them to its host, its siblings and every other process of that
/// user, for as long as it lives. Answered `ENOSYS`: file watchers fall back to polling,
/// `libaio` users to plain reads and writes.
const SHARED_BUDGET_CALLS: &[i64] = &[
    #[cfg(target_arch = "x86_64")]
    libc::SYS_inotify_init,
    libc::SYS_inotify_init1,
    libc::SYS_fanotify_init,
    libc::SYS_io_setup,
];

/// Namespace flags `clone` must not carry.
const NAMESPACE_FLAGS: [i32; 7] = [
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// Terminal requests that inject input into, or take over, a terminal.
const DENIED_IOCTLS: [u64; 2] = [libc::TIOCSTI, libc::TIOCLINUX];

fn unsupported(err: ConfineError) -> ConfinementError {
    ConfinementError::Unsupported {
        feature: Feature::Seccomp,
        detail: err.to_string(),
    }
}

/// A rule of one condition on argument `index`.
fn condition(
    index: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompRule, ConfinementError> {
    all_of(vec![argument(index, len, op, value)?])
}

/// A condition on argument `index`.
fn argument(
    index: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, ConfinementError> {
    SeccompCondition::new(index, len, op, value)
        .map_err(|e| unsupported(ConfineError::Compile(e.to_string())))
}

/// A rule that matches when all of `conditions` hold.
fn all_of(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, ConfinementError> {
    SeccompRule::new(conditions).map_err(|e| unsupported(ConfineError::Compile(e.to_string())))
}

/// System V IPC and POSIX message queues. Without an IPC namespace of its own these reach
/// every other process of the machine; without a cgroup their memory is bounded by no limit
/// of the worker's (a detached shared-memory segment keeps its pages but takes no address
/// space, and a message queue's messages are the kernel's memory).
const IPC_CALLS: &[i64] = &[
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semctl,
    libc::SYS_semtimedop,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_mq_open,
    libc::SYS_mq_unlink,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_notify,
    libc::SYS_mq_getsetattr,
];

/// `SO_PASSPIDFD` (Linux 6.5), which the `libc` crate does not name on every target.
const SO_PASSPIDFD: i32 = 76;

/// Socket families a worker in its own network namespace may create. Others (vsock, netlink,
/// packet, alg, bluetooth, ...) reach past a network namespace or into the kernel's less
/// travelled code; vsock in particular shares its port space with the host and the hypervisor.
const NAMESPACED_FAMILIES: [i32; 3] = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6];

/// What the sandbox around the filter lacks, so that the filter makes up for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Surroundings {
    /// The worker has its own namespaces (network, IPC, ...).
    pub(crate) namespaced: bool,
    /// A cgroup of the worker's own counts its memory, shared memory included.
    pub(crate) memory_counted: bool,
    /// The worker connects its channel itself (a named socket): it needs AF_UNIX sockets.
    pub(crate) connects_its_channel: bool,
}

impl Surroundings {
    /// The socket families allowed: without a network namespace of its own nothing reaches
    /// the network or another process's socket (Landlock does not govern connecting to a
    /// pathname Unix socket), so only the channel's own family is left, and only if needed.
    fn socket_families(self) -> Vec<i32> {
        if self.namespaced {
            NAMESPACED_FAMILIES.to_vec()
        } else if self.connects_its_channel {
            vec![libc::AF_UNIX]
        } else {
            Vec::new()
        }
    }
}

/// The `socket` calls refused. With its own network namespace, any socket of the allowed
/// families. Without one, every socket, but a Unix *stream* socket for a worker that connects
/// its channel itself: a datagram socket could `sendto` any Unix datagram socket it can name.
fn sockets_refused(around: Surroundings) -> Result<Vec<SeccompRule>, ConfinementError> {
    if around.namespaced || !around.connects_its_channel {
        return family_not_in(&around.socket_families());
    }
    all_but_unix_streams()
}

/// The `socketpair` calls refused. With its own network namespace, any pair of the allowed
/// families. Without one, all but a Unix *stream* pair, which is connected to itself and
/// reaches nobody (runtimes make one for their signal handling: tokio's signal driver does).
/// A datagram pair is not: an end can `sendto` any Unix datagram socket it can name, or be
/// disconnected and bound to a name others send to.
fn socket_pairs_refused(around: Surroundings) -> Result<Vec<SeccompRule>, ConfinementError> {
    if around.namespaced {
        return family_not_in(&around.socket_families());
    }
    all_but_unix_streams()
}

/// Rules matching a `socket` or `socketpair` call for anything but an `AF_UNIX` socket of
/// type `SOCK_STREAM`: the type is argument 1's low four bits (`SOCK_NONBLOCK` and
/// `SOCK_CLOEXEC` above them).
fn all_but_unix_streams() -> Result<Vec<SeccompRule>, ConfinementError> {
    const TYPE_MASK: u64 = 0xf;
    let mut rules = family_not_in(&[libc::AF_UNIX])?;
    for other in (0..=TYPE_MASK).filter(|t| *t != libc::SOCK_STREAM as u64) {
        rules.push(condition(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(TYPE_MASK),
            other,
        )?);
    }
    Ok(rules)
}

/// A rule matching argument 0 outside `allowed` (all of the conditions hold).
fn family_not_in(allowed: &[i32]) -> Result<Vec<SeccompRule>, ConfinementError> {
    if allowed.is_empty() {
        return Ok(Vec::new()); // match unconditionally
    }
    let conditions = allowed
        .iter()
        .map(|family| argument(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *family as u64))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(vec![all_of(conditions)?])
}

/// The host's filters, in the order the child installs them; compiled once per kind of
/// surroundings.
pub(crate) fn denylist(around: Surroundings) -> Result<Vec<BpfProgram>, ConfinementError> {
    static COMPILED: std::sync::Mutex<Vec<(Surroundings, Vec<BpfProgram>)>> =
        std::sync::Mutex::new(Vec::new());
    if let Ok(compiled) = COMPILED.lock() {
        if let Some((_, programs)) = compiled.iter().find(|(a, _)| *a == around) {
            return Ok(programs.clone());
        }
    }
    let programs = compile_denylist(around)?;
    if let Ok(mut compiled) = COMPILED.lock() {
        compiled.push((around, programs.clone()));
    }
    Ok(programs)
}

fn compile_denylist(around: Surroundings) -> Result<Vec<BpfProgram>, ConfinementError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|nr| (*nr, Vec::new())).collect();
    if !(around.namespaced && around.memory_counted) {
        rules.extend(IPC_CALLS.iter().map(|nr| (*nr, Vec::new())));
    }
    rules.insert(libc::SYS_socket, sockets_refused(around)?);
    rules.insert(libc::SYS_socketpair, socket_pairs_refused(around)?);
    if !around.namespaced {
        // Without a network namespace of its own a bound name (an abstract one above all) is
        // the machine's: nothing of the worker's may take one, nor listen on one. A socket
        // asking for its peer's credentials is given a name of the kernel's choosing as it
        // connects (autobind), so it may not ask.
        rules.insert(libc::SYS_bind, Vec::new());
        rules.insert(libc::SYS_listen, Vec::new());
        rules.insert(
            libc::SYS_setsockopt,
            [libc::SO_PASSCRED, SO_PASSPIDFD]
                .into_iter()
                .map(|option| {
                    let equal = |index, value| {
                        argument(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
                    };
                    all_of(vec![
                        equal(1, libc::SOL_SOCKET as u64)?,
                        equal(2, option as u64)?,
                    ])
                })
                .collect::<Result<_, _>>()?,
        );
    }
    // The parent-death signal is how the worker dies with its keeper: it may not clear it.
    rules.insert(
        libc::SYS_prctl,
        vec![condition(
            0,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            libc::PR_SET_PDEATHSIG as u64,
        )?],
    );
    rules.insert(
        libc::SYS_clone,
        NAMESPACE_FLAGS
            .iter()
            .map(|flag| {
                condition(
                    0,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(*flag as u64),
                    *flag as u64,
                )
            })
            .collect::<Result<_, _>>()?,
    );
    rules.insert(
        libc::SYS_ioctl,
        DENIED_IOCTLS
            .iter()
            .map(|request| condition(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, *request))
            .collect::<Result<_, _>>()?,
    );
    let deny = compile(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )
    .map_err(unsupported)?;
    let absent = std::iter::once(libc::SYS_clone3)
        .chain(PIPE_LOCK_HOLDERS)
        .chain(SHARED_BUDGET_CALLS.iter().copied())
        .map(|nr| (nr, Vec::new()))
        .collect();
    let absent = compile(
        absent,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )
    .map_err(unsupported)?;
    Ok(vec![deny, absent])
}
