//! The worker's own seccomp allowlist, the innermost confinement layer.
//!
//! The host confines every worker program before `exec` (namespaces, Landlock, a seccomp
//! denylist, rlimits). A worker built on this crate narrows that further itself, once its
//! set-up is over and right before its `Hello`: from then on the process may compute, use
//! memory, threads and the descriptors it already holds, read and write files its sandbox
//! grants, and nothing else. In particular no `execve`, no `fork` (threads only), no new
//! socket, no `connect`, `bind` or `accept`, no `kill` of another process. A call outside the
//! list fails with `EPERM`; nothing is killed, so a handler sees an ordinary error.
//!
//! The host asks for it by setting [`CONFINE_ENV`] in the worker's environment (it does under
//! `Confinement::strict()`), and verifies from outside that the filter is in place
//! (`Seccomp_filters` in `/proc/<pid>/status`) before the first call.
//!
//! Filters here and the host's share [`compile`], which closes the x32 back door: on x86_64
//! the x32 ABI reaches the same system calls with bit 30 set in the number and the same
//! architecture value, so a filter that only matches plain numbers would let them through.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// Environment variable by which the host asks the worker to install its allowlist (`1`).
pub const CONFINE_ENV: &str = "AIRLOCK_CONFINE_SELF";

/// Why a filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfineError {
    /// This architecture has no filter here (x86_64 and aarch64 do).
    #[error("seccomp filters are not built for this architecture")]
    UnsupportedArchitecture,
    /// The filter did not compile (a bug in the rule set).
    #[error("the seccomp filter did not compile: {0}")]
    Compile(String),
    /// The kernel refused the filter.
    #[error("the kernel refused the seccomp filter: {0}")]
    Install(String),
}

/// The architecture filters are compiled for.
pub fn target_arch() -> Result<TargetArch, ConfineError> {
    #[cfg(target_arch = "x86_64")]
    return Ok(TargetArch::x86_64);
    #[cfg(target_arch = "aarch64")]
    return Ok(TargetArch::aarch64);
    #[allow(unreachable_code)]
    Err(ConfineError::UnsupportedArchitecture)
}

/// Compiles `rules` into a BPF program: a syscall that matches a rule gets `on_match`, any
/// other `otherwise`; a foreign architecture kills the process; on x86_64 any x32 system call
/// gets `EPERM` before the rules are consulted.
pub fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    otherwise: SeccompAction,
    on_match: SeccompAction,
) -> Result<BpfProgram, ConfineError> {
    let filter = SeccompFilter::new(rules, otherwise, on_match, target_arch()?)
        .map_err(|e| ConfineError::Compile(e.to_string()))?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| ConfineError::Compile(e.to_string()))?;
    Ok(with_x32_guard(program))
}

#[cfg(target_arch = "x86_64")]
fn with_x32_guard(program: BpfProgram) -> BpfProgram {
    use seccompiler::sock_filter;
    const BPF_LD_W_ABS: u16 = 0x20;
    const BPF_JMP_JGE_K: u16 = 0x35;
    const BPF_RET_K: u16 = 0x06;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const RET_EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
    // Load the number (offset 0 of seccomp_data); x32 numbers are >= bit 30; else fall
    // through to the compiled program, which starts by loading the architecture itself.
    let guard = [
        sock_filter {
            code: BPF_LD_W_ABS,
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: BPF_JMP_JGE_K,
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        sock_filter {
            code: BPF_RET_K,
            jt: 0,
            jf: 0,
            k: RET_EPERM,
        },
    ];
    guard.into_iter().chain(program).collect()
}

#[cfg(not(target_arch = "x86_64"))]
fn with_x32_guard(program: BpfProgram) -> BpfProgram {
    program
}

fn arg_eq(index: u8, value: u64) -> Result<SeccompRule, ConfineError> {
    let condition = SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
        .map_err(|e| ConfineError::Compile(e.to_string()))?;
    SeccompRule::new(vec![condition]).map_err(|e| ConfineError::Compile(e.to_string()))
}

fn arg_has(index: u8, bits: u64) -> Result<SeccompRule, ConfineError> {
    let condition = SeccompCondition::new(
        index,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(bits),
        bits,
    )
    .map_err(|e| ConfineError::Compile(e.to_string()))?;
    SeccompRule::new(vec![condition]).map_err(|e| ConfineError::Compile(e.to_string()))
}

/// System calls a computing worker needs whatever its arguments: memory, threads and
/// synchronisation, time, I/O on descriptors it holds, files its sandbox grants, signals to
/// itself.
const ALWAYS_ALLOWED: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_fcntl,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_pipe2,
    libc::SYS_eventfd2,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_openat,
    libc::SYS_getdents64,
    libc::SYS_readlinkat,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_getcwd,
    libc::SYS_mkdirat,
    libc::SYS_unlinkat,
    libc::SYS_renameat2,
    libc::SYS_ftruncate,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_get_robust_list,
    libc::SYS_rseq,
    libc::SYS_set_tid_address,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_getrandom,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getppid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getrlimit,
    libc::SYS_getrusage,
    libc::SYS_uname,
    libc::SYS_sysinfo,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_membarrier,
    // Answered by the ENOSYS filter below (so that glibc falls back to `clone`).
    libc::SYS_clone3,
];

/// The allowlist: [`ALWAYS_ALLOWED`], plus calls allowed only with safe arguments.
fn allowlist_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, ConfineError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALWAYS_ALLOWED.iter().map(|nr| (*nr, Vec::new())).collect();
    #[cfg(target_arch = "x86_64")]
    for nr in [
        libc::SYS_open,
        libc::SYS_stat,
        libc::SYS_lstat,
        libc::SYS_access,
        libc::SYS_readlink,
        libc::SYS_poll,
        libc::SYS_select,
        libc::SYS_epoll_wait,
        libc::SYS_dup2,
        libc::SYS_pipe,
        libc::SYS_arch_prctl,
        libc::SYS_mkdir,
        libc::SYS_unlink,
        libc::SYS_rename,
    ] {
        rules.insert(nr, Vec::new());
    }
    // Threads, never processes: `clone` only with CLONE_THREAD.
    rules.insert(
        libc::SYS_clone,
        vec![arg_has(0, libc::CLONE_THREAD as u64)?],
    );
    // Signals to threads (abort): the worker's PID namespace holds only its own process,
    // and `kill` is not on the list.
    rules.insert(libc::SYS_tgkill, Vec::new());
    rules.insert(libc::SYS_tkill, Vec::new());
    // Naming threads; nothing else `prctl` can do (PR_SET_DUMPABLE back on, for one).
    rules.insert(
        libc::SYS_prctl,
        vec![
            arg_eq(0, libc::PR_SET_NAME as u64)?,
            arg_eq(0, libc::PR_GET_NAME as u64)?,
        ],
    );
    // Descriptor flags and queries only; TIOCSTI and friends are not on the list.
    rules.insert(
        libc::SYS_ioctl,
        [
            libc::FIONBIO,
            libc::FIOCLEX,
            libc::FIONCLEX,
            libc::FIONREAD,
            libc::TCGETS,
            libc::TIOCGWINSZ,
        ]
        .into_iter()
        .map(|request| arg_eq(1, request))
        .collect::<Result<_, _>>()?,
    );
    // `preadv2` only as the channel's reader makes it: with `RWF_NOWAIT` and no other flag.
    rules.insert(libc::SYS_preadv2, vec![arg_eq(5, libc::RWF_NOWAIT as u64)?]);
    // Lowering its own limits is harmless; `prlimit` on another process is not on the list.
    rules.insert(libc::SYS_prlimit64, vec![arg_eq(0, 0)?]);
    Ok(rules)
}

/// The worker's filters, in the order to install them: `clone3` answered with `ENOSYS` (glibc
/// then creates threads with `clone`, whose flags a filter can see), then the allowlist.
pub fn allowlist() -> Result<Vec<BpfProgram>, ConfineError> {
    let clone3 = compile(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )?;
    let allow = compile(
        allowlist_rules()?,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
    )?;
    Ok(vec![clone3, allow])
}

/// Installs the allowlist on every thread of this process.
pub fn install_allowlist() -> Result<(), ConfineError> {
    for program in allowlist()? {
        seccompiler::apply_filter_all_threads(&program)
            .map_err(|e| ConfineError::Install(e.to_string()))?;
    }
    Ok(())
}

/// True if the host asked this process to confine itself.
pub fn requested() -> bool {
    std::env::var_os(CONFINE_ENV).is_some_and(|v| v == "1")
}
