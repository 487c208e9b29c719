//! The one place this crate needs `unsafe`: code that runs in the forked child before `exec`,
//! the clones that start a worker without a fork (an unconfined one from the host,
//! [`spawn_vforked`]; a confined one from the sandbox's init, [`exec_in_sandbox`]) and their
//! children's steps, one read of this process's `SIGCHLD` disposition
//! (`children_reaped_by_kernel`), one probe for a thread of this process (`thread_exists`),
//! and the page that `fork` wipes ([`WipeOnForkPage`], which holds the randomness of call
//! ids).
//!
//! Between `fork` (or the clone) and `exec` only async-signal-safe operations are allowed: no
//! allocation, no locks. Everything below is a bare system call on values prepared before.

#![allow(unsafe_code)]

use std::os::fd::RawFd;

use tokio::process::Command;

/// A step of the child's set-up (the confinement), run between fork and `exec`.
pub(crate) type SetUp = Box<dyn FnMut() -> std::io::Result<()> + Send + Sync>;

/// Arranges for the child, between fork and `exec`, in this order:
/// 1. every descriptor from 3 up closed on exec, so nothing the host holds leaks into the
///    worker; SIGKILL when the thread that forked it dies (`PR_SET_PDEATHSIG`) — the dedicated
///    spawner thread, which lives as long as the host process (see `spawner`) — and an
///    immediate exit if the host is already gone;
/// 2. `set_up`, if any (the confinement: with namespaces it returns only in the worker);
/// 3. `channel` (the inherited socket, if any) moved to fd 3, the last step before `exec`.
///
/// The channel goes last because `dup2` onto fd 3 closes whatever the child has there, and
/// that can be a descriptor the set-up needs: the host opens them while other threads open
/// and close descriptors, so any of them can get number 3, and the set-up's writes to it
/// (a pid or `0` to a cgroup's descriptor, a report) would go into the channel.
/// Last, only the worker's own copy goes, after the set-up's last use of it.
pub(crate) fn prepare_child(
    command: &mut Command,
    set_up: Option<SetUp>,
    channel: Option<std::os::fd::OwnedFd>,
) {
    let parent = rustix::process::getpid();
    // Taken before the fork (reading a directory allocates): the descriptors open now, for
    // the fallback below on kernels without `close_range`.
    let open_now = open_descriptors();
    // SAFETY: the closure runs in the child between fork and exec. It only makes system calls
    // (close_range or fcntl, prctl, getppid) on integers captured by value; it allocates
    // nothing (errors are raw OS codes), takes no lock and touches no shared state, so it is
    // async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            close_on_exec_from_3(&open_now);
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The host may have died before the prctl took effect: then nobody would kill us.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    if let Some(set_up) = set_up {
        // SAFETY: `set_up` is the confinement child's body: system calls and plain memory
        // writes into the plan it owns (a copy in the child), no allocation, no lock (see
        // `confinement::child`).
        unsafe {
            command.pre_exec(set_up);
        }
    }
    if let Some(channel) = channel {
        // SAFETY: in the child between fork and exec: `fcntl` or `dup2` on the channel's
        // descriptor, which the closure owns (so the number still names the channel however
        // late the fork runs), and on fd 3. No allocation, no lock: async-signal-safe.
        unsafe {
            command.pre_exec(move || move_channel_to_3(std::os::fd::AsRawFd::as_raw_fd(&channel)));
        }
    }
}

/// True if thread `tid` exists in this process (`tgkill(getpid(), tid, 0)`: no signal is
/// sent, only the existence and permission checks run). Thread ids are read in this process's
/// own PID namespace, whatever `/proc` is mounted.
pub(crate) fn thread_exists(tid: i32) -> bool {
    let pid = rustix::process::getpid().as_raw_nonzero().get();
    // SAFETY: a plain system call on integers; signal 0 delivers nothing.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// True if this process ignores `SIGCHLD` or has `SA_NOCLDWAIT` set on it: the kernel then
/// reaps each child as it exits, freeing its pid while the host still acts on that number
/// (a process-group kill, a socket peer's pid check). Either is inherited across `exec` from
/// whatever started the host, so it is checked rather than assumed.
pub(crate) fn children_reaped_by_kernel() -> bool {
    // SAFETY: an all-zero `sigaction` is a valid value of the plain C struct (no references,
    // no niches); it is only written to.
    let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: with a null new action, `sigaction` only reads the current disposition of
    // SIGCHLD into `current`, a valid, writable struct; it changes nothing.
    let rc = unsafe { libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut current) };
    rc == 0 && (current.sa_sigaction == libc::SIG_IGN || current.sa_flags & libc::SA_NOCLDWAIT != 0)
}

/// The descriptor numbers open in this process, from `/proc/self/fd`.
fn open_descriptors() -> Vec<RawFd> {
    std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Marks every descriptor from 3 up close-on-exec: `close_range` where the kernel allows it
/// (Linux 5.11+, and not refused by a seccomp profile); otherwise one `fcntl` for each
/// descriptor open before the fork and each number below the soft descriptor limit (a
/// descriptor opened since by another thread without close-on-exec takes the lowest free
/// number, so it is below the limit). Async-signal-safe: system calls and reads of memory
/// prepared before the fork.
fn close_on_exec_from_3(open_before_fork: &[RawFd]) {
    // SAFETY: a plain system call with integer arguments.
    let marked = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if marked == 0 {
        return;
    }
    let mark = |fd: RawFd| {
        // SAFETY: a plain system call; EBADF for a descriptor that is not open is expected.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    };
    open_before_fork
        .iter()
        .copied()
        .filter(|fd| *fd >= 3)
        .for_each(mark);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // Without a snapshot (no /proc) cover the hard limit, else the soft one; at most 2^20.
    // SAFETY: `limit` is a valid, writable rlimit for the call to fill.
    let bound = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
        if open_before_fork.is_empty() {
            limit.rlim_max
        } else {
            limit.rlim_cur
        }
        .min(1 << 20) as RawFd
    } else {
        1 << 16
    };
    (3..bound).for_each(mark);
}

/// Puts the channel at fd 3, the number the worker is told, open across `exec`.
fn move_channel_to_3(fd: RawFd) -> std::io::Result<()> {
    const CHANNEL_FD: RawFd = 3;
    if fd == CHANNEL_FD {
        // `dup2(3, 3)` would do nothing and leave close-on-exec set: clear it instead.
        // SAFETY: a plain system call on an integer descriptor that is open.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        return Ok(());
    }
    if fd < CHANNEL_FD {
        // std already placed stdio over 0-2: the channel was clobbered.
        return Err(std::io::Error::from_raw_os_error(libc::EBADF));
    }
    // `dup2` leaves the copy without close-on-exec; the original (above 3) closes on exec.
    // SAFETY: a plain system call on two integers; `fd` is open in the child because the
    // command that forked it owns it (`prepare_child`).
    if unsafe { libc::dup2(fd, CHANNEL_FD) } != CHANNEL_FD {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Everything a worker started by [`spawn_vforked`] needs, prepared before the clone: the
/// child shares this process's memory and may allocate nothing, so it only reads these.
#[derive(Debug)]
pub(crate) struct ExecImage {
    /// The paths to `execve`, in order (several when the program is looked up in `PATH`).
    pub(crate) programs: Vec<std::ffi::CString>,
    /// `argv`, the program's name first.
    pub(crate) argv: Vec<std::ffi::CString>,
    /// The whole environment, as `KEY=value`.
    pub(crate) envp: Vec<std::ffi::CString>,
    /// The directory to enter, if any.
    pub(crate) cwd: Option<std::ffi::CString>,
    /// The child's stdin, stdout and stderr, each numbered 3 or above (so that placing one
    /// over 0-2 never overwrites another before it is placed).
    pub(crate) stdio: [std::os::fd::OwnedFd; 3],
    /// The channel to move to fd 3 (the inherited socket), numbered 3 or above.
    pub(crate) channel: Option<std::os::fd::OwnedFd>,
}

/// What the vfork child reads, in memory it shares with the suspended spawner thread, and the
/// one word it writes: `errno`, the reason it could not `exec`.
struct VforkArgs<'image> {
    programs: &'image [*const libc::c_char],
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    stdio: [RawFd; 3],
    channel: Option<RawFd>,
    parent: libc::pid_t,
    open_before_clone: &'image [RawFd],
    errno: std::sync::atomic::AtomicI32,
}

/// The vfork child's stack. Its steps are a few dozen system calls through libc; 64 KiB is
/// many times what they use (glibc's `posix_spawn` gives its child 32 KiB plus the arguments).
const VFORK_STACK: usize = 64 * 1024;

/// The vfork child's stack: a mapping of its own with an inaccessible guard page below it, so
/// an overflow faults in the child instead of writing into this process's memory. Unmapped
/// when dropped.
struct VforkStack {
    start: *mut libc::c_void,
    len: usize,
}

impl VforkStack {
    fn new() -> std::io::Result<Self> {
        let guard = rustix::param::page_size();
        let len = VFORK_STACK + guard;
        // SAFETY: a fresh private anonymous mapping at an address the kernel chooses: it
        // overlaps nothing of ours.
        let start = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::STACK,
            )
        }?;
        let stack = Self { start, len };
        // SAFETY: the lowest page of the mapping made above, which nothing refers to yet.
        unsafe { rustix::mm::mprotect(start, guard, rustix::mm::MprotectFlags::empty()) }?;
        Ok(stack)
    }

    /// Adds the whole mapping, guard page included, to `kept`.
    fn footprint(&self, kept: &mut crate::confinement::Kept) {
        kept.bytes(self.start as usize, self.len);
    }

    /// The top of the stack (it grows down): page-aligned, so 16-byte aligned as the x86-64
    /// and AArch64 ABIs require.
    fn top(&self) -> *mut libc::c_void {
        self.start.wrapping_byte_add(self.len)
    }
}

impl Drop for VforkStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, which nothing uses any more: the child that ran
        // on it has called `execve` or exited before `clone` returned (CLONE_VFORK).
        let _ = unsafe { rustix::mm::munmap(self.start, self.len) };
    }
}

/// `value` as a C string; one holding a NUL byte is refused, as `std::process::Command`
/// refuses it.
pub(crate) fn c_string(value: impl AsRef<std::ffi::OsStr>) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(value.as_ref().as_bytes()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    })
}

/// An environment entry as `execve` takes it: `KEY=value`.
pub(crate) fn env_entry(
    key: &std::ffi::OsStr,
    value: &std::ffi::OsStr,
) -> std::io::Result<std::ffi::CString> {
    let mut entry = key.to_os_string();
    entry.push("=");
    entry.push(value);
    c_string(entry)
}

/// The null-terminated array of pointers to `strings` that `execve` takes; valid while the
/// strings' buffers are.
fn pointers(strings: &[std::ffi::CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Sets this thread's signal mask to `mask` (the kernel's 64-signal set, glibc's own signals
/// included, which `sigprocmask` would not touch) and returns the mask it had, or the `errno`.
/// A bare system call: safe between clone and `exec`.
fn swap_signal_mask(mask: u64) -> Result<u64, i32> {
    let mut previous = 0u64;
    // SAFETY: `rt_sigprocmask` on two 8-byte kernel signal sets (the kernel's size on Linux), a
    // readable one and a writable one, both live for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &mask,
            &mut previous,
            8usize,
        )
    };
    if rc == 0 {
        Ok(previous)
    } else {
        Err(errno_now())
    }
}

/// Sets glibc's own signals, 32 and 33 (thread cancellation and `setxid` broadcast), back to
/// the default action, in a clone child about to unblock signals before `exec`: glibc's
/// `sigaction` refuses these two numbers, so a reset through it leaves glibc's handlers
/// installed, and neither may run on memory the child shares with its parent. A bare system
/// call: the child has a handler table of its own (no `CLONE_SIGHAND`).
fn default_glibc_signals() {
    // The kernel's `struct sigaction` (handler, flags, restorer where the architecture has one,
    // mask): all zero is `SIG_DFL` with no flags and an empty mask, whatever the layout.
    let default = [0u64; 4];
    for signal in [32, 33] {
        // SAFETY: `rt_sigaction` reading a zeroed kernel `sigaction` from this stack, at least
        // as large as the kernel's struct, with no old action asked for.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                &default,
                std::ptr::null_mut::<u64>(),
                8usize,
            )
        };
    }
}

/// Starts `image` the way glibc's `posix_spawn` does: `clone(CLONE_VM | CLONE_VFORK)`, so the
/// cost does not grow with this process's memory (a `fork` copies its page tables), then
/// `execve` in the child. Returns the child's pid and a pidfd for it, taken atomically with
/// the clone (`CLONE_PIDFD`), so nothing ever acts on a pid that was reused.
///
/// Runs on a spawner thread: the child's parent-death signal follows the calling thread. The
/// calling thread is suspended until the child has called `execve` or exited; every signal
/// is blocked in it meanwhile, so no handler of this process runs on the child's shared
/// memory before the child has reset them all. In the child, in this order (see
/// [`vfork_child`]): every signal with a handler and `SIGPIPE` back to the default; an empty
/// signal mask; its own process group; stdio; every other descriptor from 3 up closed on exec,
/// the channel moved to fd 3; `SIGKILL` when the spawner thread dies, and an immediate exit
/// if it is already gone; the working directory; `execve`. A failed step ends the child with
/// 127 and comes back here as the step's `errno`; the child is reaped before this returns.
pub(crate) fn spawn_vforked(image: &ExecImage) -> std::io::Result<(u32, std::os::fd::OwnedFd)> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::atomic::Ordering;
    let programs = pointers(&image.programs);
    let argv = pointers(&image.argv);
    let envp = pointers(&image.envp);
    let open_before_clone = open_descriptors();
    let args = VforkArgs {
        programs: &programs[..programs.len() - 1],
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: image
            .cwd
            .as_ref()
            .map_or(std::ptr::null(), |cwd| cwd.as_ptr()),
        stdio: image.stdio.each_ref().map(AsRawFd::as_raw_fd),
        channel: image.channel.as_ref().map(AsRawFd::as_raw_fd),
        parent: rustix::process::getpid().as_raw_nonzero().get(),
        open_before_clone: &open_before_clone,
        errno: std::sync::atomic::AtomicI32::new(0),
    };
    let stack = VforkStack::new()?;
    let mut pidfd: libc::c_int = -1;
    // Every signal blocked, glibc's own (SIGCANCEL, SIGSETXID) included, as `posix_spawn`
    // does.
    let saved_mask = swap_signal_mask(!0).map_err(std::io::Error::from_raw_os_error)?;
    // SAFETY: the child runs `vfork_child` on `stack`, which nothing else uses and which lives
    // until after this returns; it shares this process's memory, and this thread is suspended
    // until the child has called `execve` or `_exit` (CLONE_VFORK), so `args` and everything
    // it points at (owned by this frame and by `image`) stays alive and unchanged while the
    // child reads it. The child writes only `args.errno` (atomic) and its own stack, touches
    // no allocator and no lock, and runs no handler of ours: signals are blocked here, and it
    // resets every handler before it unblocks any. `pidfd` is a valid `int` for the kernel to
    // fill (CLONE_PIDFD writes the child's pidfd through the parent-tid argument); the tls and
    // child-tid arguments are unused without CLONE_SETTLS / CLONE_CHILD_*TID.
    let pid = unsafe {
        libc::clone(
            vfork_child,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            std::ptr::addr_of!(args).cast_mut().cast::<libc::c_void>(),
            std::ptr::addr_of_mut!(pidfd),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::pid_t>(),
        )
    };
    let clone_error = std::io::Error::last_os_error();
    let _ = swap_signal_mask(saved_mask);
    drop(stack);
    if pid < 0 {
        return Err(clone_error);
    }
    if pidfd < 0 {
        // A kernel before 5.2 ignores CLONE_PIDFD: the child runs (or has failed) held by
        // nothing but its pid, which stays ours until it is reaped here.
        reap_by_pid(pid, true);
        return Err(needs_pidfds());
    }
    // SAFETY: CLONE_PIDFD took effect (the descriptor is set), so the kernel stored a new
    // descriptor, owned by nobody else, in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let errno = args.errno.load(Ordering::SeqCst);
    if errno != 0 {
        // The child has exited (with 127) or is about to: reap it.
        reap_by_pid(pid, false);
        return Err(std::io::Error::from_raw_os_error(errno));
    }
    // The host waits for its workers with `waitid` on their pidfd (Linux 5.4): a kernel
    // without it answers this probe, which neither waits nor reaps, with EINVAL.
    let probe = rustix::process::waitid(
        rustix::process::WaitId::PidFd(std::os::fd::AsFd::as_fd(&pidfd)),
        rustix::process::WaitIdOptions::EXITED
            | rustix::process::WaitIdOptions::NOHANG
            | rustix::process::WaitIdOptions::NOWAIT,
    );
    if matches!(probe, Err(rustix::io::Errno::INVAL)) {
        reap_by_pid(pid, true);
        return Err(needs_pidfds());
    }
    Ok((pid as u32, pidfd))
}

/// Why an unconfined worker cannot be started on this kernel.
fn needs_pidfds() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "an unconfined worker needs Linux 5.4 or later: the host holds it by a pidfd \
         (CLONE_PIDFD, waitid on a pidfd)",
    )
}

/// Reaps this process's child `pid`, killing it first if `kill`. Only for a child not yet
/// reaped: until then its pid cannot name another process.
fn reap_by_pid(pid: libc::pid_t, kill: bool) {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return;
    };
    if kill {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
    while matches!(
        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()),
        Err(rustix::io::Errno::INTR)
    ) {}
}

/// The vfork child's body: the steps of [`spawn_vforked`], then `execve`. It returns only by
/// ending the process: with 127 and the failed step's `errno` in `args.errno`.
extern "C" fn vfork_child(args: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `args` is the `VforkArgs` that `spawn_vforked` passed to clone; its thread is
    // suspended until this process execs or exits, so it is alive and nothing writes to it.
    let args = unsafe { &*args.cast_const().cast::<VforkArgs<'_>>() };
    fail_child(&args.errno, vfork_child_steps(args))
}

/// Ends a clone child that could not `exec`: its `errno` (never 0) where its parent, which
/// shares its memory, reads it once the clone returns, then `_exit(127)`.
fn fail_child(slot: &std::sync::atomic::AtomicI32, errno: i32) -> ! {
    slot.store(errno.max(1), std::sync::atomic::Ordering::SeqCst);
    exit_now(127)
}

/// The `errno` the last failed libc call left.
fn errno_now() -> i32 {
    last_errno().raw_os_error()
}

/// The child's steps; returns only on failure, with the `errno` to report. Async-signal-safe
/// and allocation-free: libc's system call wrappers on integers and on memory prepared by
/// the parent. (A wrapper that fails sets `errno` in the suspended thread's thread-local
/// storage, which this child shares, as glibc's own `posix_spawn` child does.)
fn vfork_child_steps(args: &VforkArgs<'_>) -> i32 {
    // Signals first: no handler of the host may run on this shared memory, and the worker
    // starts, as `std::process::Command` starts it, with SIGPIPE at its default and nothing
    // blocked. Ignored signals stay ignored across exec, as they do for std's children.
    default_handled_signals();
    default_glibc_signals();
    if let Err(errno) = swap_signal_mask(0) {
        return errno;
    }
    // SAFETY: plain system calls on integers.
    if unsafe { libc::setpgid(0, 0) } != 0 {
        return errno_now();
    }
    for (fd, target) in args.stdio.iter().zip(0..) {
        // SAFETY: a plain system call on integers; `fd` (3 or above) is open in this child,
        // whose descriptor table is a copy of the parent's taken while `ExecImage` owned it.
        if unsafe { libc::dup2(*fd, target) } != target {
            return errno_now();
        }
    }
    close_on_exec_from_3(args.open_before_clone);
    if let Some(channel) = args.channel {
        if let Err(err) = move_channel_to_3(channel) {
            return err.raw_os_error().unwrap_or(libc::EBADF);
        }
    }
    if let Err(err) =
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
    {
        return err.raw_os_error();
    }
    // The spawner thread may have died before the prctl took effect: nobody would kill us.
    if rustix::process::getppid().map(|pid| pid.as_raw_nonzero().get()) != Some(args.parent) {
        return libc::ESRCH;
    }
    // SAFETY: `cwd` is null or a NUL-terminated string owned by the suspended parent frame.
    if !args.cwd.is_null() && unsafe { libc::chdir(args.cwd) } != 0 {
        return errno_now();
    }
    exec_first(args)
}

/// `execve` of each candidate in turn, as `execvp` searches `PATH`: a candidate that is
/// missing (or whose directory is) is skipped; one that is there but refused (EACCES) is
/// remembered and skipped; any other failure ends the search. Returns the `errno` to report.
fn exec_first(args: &VforkArgs<'_>) -> i32 {
    let mut refused = false;
    let mut last = libc::ENOENT;
    for program in args.programs {
        // SAFETY: `program`, `argv` and `envp` are NUL-terminated strings and null-terminated
        // pointer arrays owned by the suspended parent frame. On success it does not return.
        unsafe { libc::execve(*program, args.argv, args.envp) };
        last = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        match last {
            libc::EACCES => refused = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => return last,
        }
    }
    if refused {
        libc::EACCES
    } else {
        last
    }
}

/// Sets every signal that has a handler, and `SIGPIPE`, back to the default action (between
/// clone and `exec`). Numbers the kernel or libc refuse (32 and 33 under glibc) are skipped.
fn default_handled_signals() {
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: an all-zero `sigaction` is a valid value of the plain C struct (with
        // `SIG_DFL`, 0, as its handler); the first call only reads the disposition into a
        // live struct on this child's stack, the second installs the default, which runs no
        // code of ours.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
                continue;
            }
            let handled =
                current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN;
            if handled || signal == libc::SIGPIPE {
                let default: libc::sigaction = std::mem::zeroed();
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
    }
}

/// Registers `pidfd` with the current runtime's reactor, to learn when its process ends;
/// gives it back with the reason if that fails. Must run inside a tokio runtime.
pub(crate) fn register_pidfd(
    pidfd: std::os::fd::OwnedFd,
) -> Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>, (std::os::fd::OwnedFd, std::io::Error)>
{
    // SAFETY: an `OwnedFd` keeps its descriptor open, and always returns the same number from
    // `as_raw_fd`, until it is dropped; the `AsyncFd` owns it until it is dropped or
    // `into_inner` gives it back.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }
    .map_err(tokio::io::unix::AsyncFdRegisterError::into_parts)
}

/// The kernel's Landlock ABI version, 0 if it has none (`landlock_create_ruleset` with the
/// version flag).
pub(crate) fn landlock_abi_version() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the version flag the call reads and
    // writes no memory; it returns the ABI version or an error.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(rc).unwrap_or(0).max(0)
}

/// `clone(flags | SIGCHLD)` with no new stack: like `fork`, returns 0 in the child and the
/// child's pid in the parent. Only called in a child between fork and `exec`, which has a
/// single thread.
pub(crate) fn clone_into_namespaces(flags: i32) -> Result<i32, rustix::io::Errno> {
    // SAFETY: the raw clone syscall with a null stack duplicates the calling (single)
    // thread like fork(): the child resumes here on a copy-on-write copy of this stack. No
    // atfork handler runs, and the child only makes system calls on memory prepared before
    // the first fork, so nothing it touches can be mid-update. The pointer arguments are null
    // (no tid or tls writes).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if rc < 0 {
        Err(last_errno())
    } else {
        Ok(rc as i32)
    }
}

/// The stack of [`clone_user_namespace_anchor`]'s child: mapped before the keeper reads the
/// host's memory, so that it is unmapped with the rest once the child is gone.
pub(crate) struct AnchorStack(VforkStack);

impl AnchorStack {
    /// Maps it (no allocation: between fork and `exec`).
    pub(crate) fn new() -> Result<Self, rustix::io::Errno> {
        VforkStack::new()
            .map(Self)
            .map_err(|e| rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::NOMEM))
    }
}

/// A child that shares this process's memory (`CLONE_VM`: no copy of it is made) in a user
/// namespace of its own, which the kernel gives this thread's effective uid as owner: on
/// `stack`, with every signal blocked, it closes every descriptor but `hold`, waits until
/// `hold` gives a byte or its end, and ends. Returns its pid. Only called in a child between
/// fork and `exec`, which has a single thread.
pub(crate) fn clone_user_namespace_anchor(
    hold: RawFd,
    stack: AnchorStack,
) -> Result<i32, rustix::io::Errno> {
    extern "C" fn anchor(hold: *mut libc::c_void) -> libc::c_int {
        let hold = hold as usize as RawFd;
        close_all_except(&[hold]);
        let mut byte = 0u8;
        // SAFETY: reads at most one byte into this function's own stack.
        unsafe { libc::read(hold, std::ptr::addr_of_mut!(byte).cast(), 1) };
        exit_now(0)
    }
    let saved_mask = swap_signal_mask(!0).map_err(rustix::io::Errno::from_raw_os_error)?;
    // SAFETY: the child runs `anchor` on `stack`, a mapping nothing else uses, which stays
    // mapped (forgotten below) until the keeper, once the child is reaped, unmaps its copy of
    // the host's memory. It shares this process's memory but touches only its own stack: its
    // system calls take integers and a pointer to its own byte, none fails in it but for a
    // signal that ends it, and no handler runs in it (every signal is blocked in it, as here
    // around the clone). No pidfd, tls or tid is asked for, so the remaining pointers are
    // unused.
    let pid = unsafe {
        libc::clone(
            anchor,
            stack.0.top(),
            libc::CLONE_VM | libc::CLONE_NEWUSER | libc::SIGCHLD,
            hold as usize as *mut libc::c_void,
        )
    };
    let failed = (pid < 0).then(last_errno);
    let _ = swap_signal_mask(saved_mask);
    std::mem::forget(stack);
    match failed {
        Some(errno) => Err(errno),
        None => Ok(pid),
    }
}

/// What the namespace's init needs to start the worker without a fork: the worker's command,
/// built before the spawn's first fork (`std::process::Command`'s own program, arguments and
/// environment, so the worker runs what `std` would have run), and a stack for the child.
pub(crate) struct WorkerExec {
    program: std::ffi::CString,
    _argv: Vec<std::ffi::CString>,
    _envp: Vec<std::ffi::CString>,
    /// Null-terminated arrays of pointers into `_argv` and `_envp`, whose heap buffers do not
    /// move when this value does.
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// The channel to move to fd 3 (the inherited socket), as numbered in the forked child.
    channel: Option<RawFd>,
    stack: VforkStack,
}

// SAFETY: the raw pointers point into strings this value owns (heap buffers that stay put when
// it moves) and into its own mapping; they are read only by the clone child in
// `exec_in_sandbox`, in a process with one thread. Sending or sharing the value between threads
// of the host, which never dereference them, cannot race.
unsafe impl Send for WorkerExec {}
// SAFETY: as for `Send`: nothing reachable through a shared reference is ever written (the one
// use of the stack, `exec_in_sandbox`, takes the value exclusively). `Sync` is needed because
// the plan holding it lives in a `pre_exec` closure, which must be `Sync`.
unsafe impl Sync for WorkerExec {}

impl std::fmt::Debug for WorkerExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerExec")
            .field("program", &self.program)
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

impl WorkerExec {
    /// Adds every buffer this value owns, and its stack, to `kept`: init reads them after the
    /// keeper withheld the host's memory from it (see `ChildPlan::footprint`).
    pub(crate) fn footprint(&self, kept: &mut crate::confinement::Kept) {
        let Self {
            program,
            _argv: args,
            _envp: vars,
            argv,
            envp,
            channel: _,
            stack,
        } = self;
        kept.c_str(program);
        kept.c_strings(args);
        kept.c_strings(vars);
        kept.slice(argv);
        kept.slice(envp);
        stack.footprint(kept);
    }
    /// The exec of `command` (its program and arguments, and exactly the variables set on it:
    /// the command's environment must have been cleared), with `channel` moved to fd 3 first.
    /// Refuses a string holding a NUL byte, as `Command::spawn` does.
    pub(crate) fn of(
        command: &std::process::Command,
        channel: Option<RawFd>,
    ) -> std::io::Result<Self> {
        let program = c_string(command.get_program())?;
        let argv = std::iter::once(command.get_program())
            .chain(command.get_args())
            .map(c_string)
            .collect::<std::io::Result<Vec<_>>>()?;
        let envp = command
            .get_envs()
            .filter_map(|(key, value)| value.map(|value| env_entry(key, value)))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            argv: pointers(&argv),
            envp: pointers(&envp),
            program,
            _argv: argv,
            _envp: envp,
            channel,
            stack: VforkStack::new()?,
        })
    }
}

/// What init's clone child reads, in memory it shares with init (suspended meanwhile), and
/// what it writes: the `errno` of the step that failed, and whether that was a start-up step
/// (the signal mask, `setsid`) rather than the channel or `execve`.
struct SandboxArgs<'exec> {
    exec: &'exec WorkerExec,
    errno: std::sync::atomic::AtomicI32,
    starting: std::sync::atomic::AtomicBool,
}

/// Why init could not start the worker.
#[derive(Debug)]
pub(crate) enum SandboxExecError {
    /// The clone itself, the worker's signal mask or its own session (`setsid`).
    Start(rustix::io::Errno),
    /// Moving the channel to fd 3, or `execve`: the program's own failure, as `std` reports
    /// its `exec`.
    Exec(rustix::io::Errno),
}

/// Init starts the worker: `clone(CLONE_VM | CLONE_VFORK)` onto the worker's own stack, then in
/// the child an empty signal mask, a session of its own, the channel moved to fd 3, and
/// `execve`. The child shares init's memory until its `exec` (init is suspended until then), so
/// no copy of the host's memory is made for it, nor torn down by its `exec`. Everything else
/// the worker runs under (namespaces, identity, root, limits, capabilities, Landlock, seccomp)
/// it inherits from init, which applied it before this call. Returns the worker's pid, or why it could not start (the
/// child is reaped then).
///
/// Only in init, a process with one thread (`exec` is borrowed exclusively, so no other call
/// can use its stack meanwhile). Every signal is blocked in init around the clone, as
/// `spawn_vforked` blocks them, and the child sets glibc's own two (32 and 33, which init's
/// reset through `sigaction` cannot change) back to the default before it unblocks any, so no
/// handler runs on the shared memory.
pub(crate) fn exec_in_sandbox(exec: &mut WorkerExec) -> Result<i32, SandboxExecError> {
    use std::sync::atomic::Ordering;
    let exec: &WorkerExec = exec;
    let args = SandboxArgs {
        exec,
        errno: std::sync::atomic::AtomicI32::new(0),
        starting: std::sync::atomic::AtomicBool::new(false),
    };
    let saved_mask = swap_signal_mask(!0)
        .map_err(|errno| SandboxExecError::Start(rustix::io::Errno::from_raw_os_error(errno)))?;
    // SAFETY: the child runs `sandbox_child` on `exec.stack`, which nothing else uses; it shares
    // this process's memory while this single thread is suspended until it has called `execve`
    // or `_exit` (CLONE_VFORK), so `args` and what it points at stay alive and unchanged. The
    // child writes only `args`' two atomics, its own stack and, when a call fails, `errno` in
    // init's thread-local storage (as glibc's `posix_spawn` child does); it allocates nothing
    // and takes no lock, and no handler runs in it before it has set glibc's two back to the
    // default (all are blocked above, and init's others are the default already).
    // No pidfd, tls or tid is asked for, so the remaining pointers are unused.
    let pid = unsafe {
        libc::clone(
            sandbox_child,
            exec.stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::addr_of!(args).cast_mut().cast::<libc::c_void>(),
        )
    };
    let clone_error = last_errno();
    let _ = swap_signal_mask(saved_mask);
    if pid < 0 {
        return Err(SandboxExecError::Start(clone_error));
    }
    let errno = args.errno.load(Ordering::SeqCst);
    if errno != 0 {
        reap_by_pid(pid, false);
        let errno = rustix::io::Errno::from_raw_os_error(errno);
        return Err(if args.starting.load(Ordering::SeqCst) {
            SandboxExecError::Start(errno)
        } else {
            SandboxExecError::Exec(errno)
        });
    }
    Ok(pid)
}

/// Init's clone child: the steps of [`exec_in_sandbox`]. It returns only by ending the
/// process: with 127 and the failed step's `errno` in `args.errno`.
extern "C" fn sandbox_child(args: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `args` is the `SandboxArgs` that `exec_in_sandbox` passed to clone; init is
    // suspended until this process execs or exits, so it is alive and nothing writes to it.
    let args = unsafe { &*args.cast_const().cast::<SandboxArgs<'_>>() };
    fail_child(&args.errno, sandbox_child_steps(args))
}

/// The worker's last steps before `execve`; returns only on failure, with the `errno` to
/// report. System calls on memory prepared before the spawn's first fork, nothing else.
fn sandbox_child_steps(args: &SandboxArgs<'_>) -> i32 {
    let exec = args.exec;
    // Nothing blocked, as an unconfined worker starts: whatever mask the host's thread had
    // (`std` leaves it to the child), and the full one init holds around the clone. Init's
    // handlers are the default already, but for glibc's own two.
    default_glibc_signals();
    if let Err(errno) = swap_signal_mask(0) {
        args.starting
            .store(true, std::sync::atomic::Ordering::SeqCst);
        return errno;
    }
    // A session (and process group) of its own: no controlling terminal, and no signal aimed
    // at the host's group reaches it.
    // SAFETY: a plain system call.
    if unsafe { libc::setsid() } < 0 {
        args.starting
            .store(true, std::sync::atomic::Ordering::SeqCst);
        return errno_now();
    }
    if let Some(channel) = exec.channel {
        if let Err(err) = move_channel_to_3(channel) {
            return err.raw_os_error().unwrap_or(libc::EBADF);
        }
    }
    // SAFETY: `program` is a NUL-terminated string and `argv`, `envp` null-terminated arrays
    // of such strings, all owned by `exec`, which the suspended init keeps alive. On success
    // it does not return.
    unsafe {
        libc::execve(
            exec.program.as_ptr(),
            exec.argv.as_ptr(),
            exec.envp.as_ptr(),
        )
    };
    errno_now()
}

/// Removes capability number `cap` from the bounding set (`PR_CAPBSET_DROP`).
pub(crate) fn drop_bounding_capability(cap: u32) -> Result<(), rustix::io::Errno> {
    // SAFETY: a plain prctl on integers; it touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(last_errno())
    }
}

/// Ends this process at once with `code`, running nothing registered (no atexit handler, no
/// stdio flush): what a forked child that must not return into its parent's code does.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` is async-signal-safe and never returns.
    unsafe { libc::_exit(code) }
}

/// Closes every descriptor of this process but those in `keep` (negative entries: none).
/// Between fork and `exec`: no allocation (the list is sorted on the stack).
pub(crate) fn close_all_except(keep: &[RawFd]) {
    let mut sorted = [u32::MAX; 4];
    let mut n = 0;
    for fd in keep
        .iter()
        .copied()
        .filter(|fd| *fd >= 0)
        .take(sorted.len())
    {
        sorted[n] = fd as u32;
        n += 1;
    }
    sorted[..n].sort_unstable();
    let close = |first: u32, last: u32| {
        if first <= last {
            // SAFETY: a plain system call on integers; closing descriptors this child owns.
            unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
        }
    };
    let mut next = 0u32;
    for fd in &sorted[..n] {
        if *fd > next {
            close(next, fd - 1);
        }
        next = fd.saturating_add(1);
    }
    close(next, u32::MAX);
}

/// Unmaps `len` bytes at `start`: the host's memory in a forked copy of it that never
/// `exec`s (see `confinement::host_memory`). Errors are ignored: a range that is no longer
/// mapped has nothing to drop.
pub(crate) fn unmap_forked_host_memory(start: usize, len: usize) {
    // SAFETY: called only by the keeper and init, single-threaded forks of the host, once
    // their set-up is done: from then on they run only system calls on integers and on their
    // own stack, which is never in the list, and never return into the host's code. Nothing
    // they still run refers to the heap or the other anonymous mappings unmapped here, and a
    // stray access would fault (ending that process), not read other memory.
    let _ = unsafe { rustix::mm::munmap(start as *mut std::ffi::c_void, len) };
}

/// Leaves `len` bytes at `start` out of every child this process makes from now on
/// (`MADV_DONTFORK`): the child has nothing mapped there. Errors are ignored: a range not
/// marked is copied into the child, as without this call. See `confinement::host_memory`.
pub(crate) fn withhold_from_children(start: usize, len: usize) {
    // SAFETY: `madvise` changes no memory of this process and no mapping's contents or
    // protection, only whether a child made later gets a copy of the range. Called only by
    // the keeper, whose children (made by raw `clone`, with no atfork handler) read nothing
    // of the host's memory outside what it keeps (`confinement::host_memory::Kept`).
    let _ = unsafe {
        rustix::mm::madvise(
            start as *mut std::ffi::c_void,
            len,
            rustix::mm::Advice::LinuxDontFork,
        )
    };
}

/// Ignores every signal this process has a handler for, but `SIGCHLD`, which goes back to its
/// default: a forked copy of the host about to unmap the host's memory (see
/// `confinement::host_memory`) must never run one of the host's handlers, which would fault
/// on that memory. Ignoring keeps what the handler's return meant (the process goes on);
/// `SIGCHLD` ignored would have the kernel reap children before `wait` reports them.
/// Dispositions left default or ignored stay as they are.
pub(crate) fn ignore_handled_signals() {
    for signal in catchable_signals() {
        // SAFETY: an all-zero `sigaction` is a valid value of the plain C struct; with a null
        // new action the first call only reads the disposition into it, and the second
        // installs `SIG_IGN` or `SIG_DFL`, neither of which runs code here. Numbers the
        // kernel does not accept (32 and 33 under glibc) fail the read and are skipped.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0
                || current.sa_sigaction == libc::SIG_DFL
                || current.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let mut replacement: libc::sigaction = std::mem::zeroed();
            replacement.sa_sigaction = if signal == libc::SIGCHLD {
                libc::SIG_DFL
            } else {
                libc::SIG_IGN
            };
            libc::sigaction(signal, &replacement, std::ptr::null_mut());
        }
    }
}

/// Ignores `SIGPIPE` in this process, so that a write to a pipe whose reader is gone fails
/// with `EPIPE` instead of ending it: for the keeper once its children exist (none of them
/// inherits it), whose last reports may come after the host has stopped reading.
pub(crate) fn ignore_sigpipe() {
    // SAFETY: a plain system call on integers; `SIG_IGN` runs no code in this process.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Ends this process by `signal` (its default action), as the process it mirrors ended; if
/// the signal does not end it, exits with 128 + signal.
pub(crate) fn die_by_signal(signal: i32) -> ! {
    // SAFETY: plain system calls on integers: restore the default action, unblock, raise.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
    }
    exit_now(128 + signal)
}

/// A new cgroup namespace for this process, rooted at its current cgroup.
pub(crate) fn unshare_cgroup_namespace() -> Result<(), rustix::io::Errno> {
    // SAFETY: unshare(CLONE_NEWCGROUP) shares or copies no memory or descriptor table; it
    // only gives this process a namespace of its own.
    if unsafe { libc::unshare(libc::CLONE_NEWCGROUP) } == 0 {
        Ok(())
    } else {
        Err(last_errno())
    }
}

/// The calling thread's last OS error, as rustix's type.
/// The calling thread's `errno` as an `Errno`; `EINVAL` where it holds none (0), which
/// `Errno` cannot carry.
fn last_errno() -> rustix::io::Errno {
    let raw = std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|raw| *raw > 0)
        .unwrap_or(libc::EINVAL);
    rustix::io::Errno::from_raw_os_error(raw)
}

/// Every signal number whose disposition can be changed (all but SIGKILL and SIGSTOP).
fn catchable_signals() -> impl Iterator<Item = i32> {
    (1..=64).filter(|signal| *signal != libc::SIGKILL && *signal != libc::SIGSTOP)
}

/// Resets every signal's disposition to the default (between fork and `exec`).
pub(crate) fn reset_signal_handlers() {
    for signal in catchable_signals() {
        // SAFETY: an all-zero `sigaction` with `SIG_DFL` (0) as its handler is a valid value;
        // `sigaction` is async-signal-safe and only reads it. Numbers the kernel does not
        // accept (32 and 33 under glibc) fail harmlessly.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(signal, &default, std::ptr::null_mut());
        }
    }
}

/// The size of a [`WipeOnForkPage`]: one page on every Linux target (larger pages round up).
pub(crate) const WIPED_PAGE: usize = 4096;

/// A private anonymous page that the kernel hands a `fork`ed child zeroed
/// (`MADV_WIPEONFORK`): secrets kept in it are never inherited. Unmapped when dropped.
pub(crate) struct WipeOnForkPage {
    start: std::ptr::NonNull<u8>,
}

impl WipeOnForkPage {
    /// Maps the page, zeroed. Fails on a kernel without `MADV_WIPEONFORK` (before 4.14), so
    /// the caller never keeps a secret in a page a child would inherit.
    pub(crate) fn new() -> std::io::Result<Self> {
        use rustix::mm::{madvise, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags};
        // SAFETY: a new anonymous mapping at an address the kernel picks overlaps nothing this
        // process uses; it is private, so no other process sees it.
        let start = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                WIPED_PAGE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }?;
        // SAFETY: advises only the mapping made above, which nothing references yet. A core
        // dump need not carry the ids of calls not yet made either.
        let advised = unsafe { madvise(start, WIPED_PAGE, Advice::LinuxWipeOnFork) }
            .and_then(|()| unsafe { madvise(start, WIPED_PAGE, Advice::LinuxDontDump) });
        let mapped = std::ptr::NonNull::new(start.cast::<u8>());
        match (advised, mapped) {
            (Ok(()), Some(start)) => Ok(Self { start }),
            (advised, _) => {
                // SAFETY: unmaps the mapping made above; no reference to it exists.
                let _ = unsafe { munmap(start, WIPED_PAGE) };
                Err(advised.err().map_or_else(
                    || std::io::Error::other("mmap returned a null page"),
                    std::io::Error::from,
                ))
            }
        }
    }

    /// The page in two parts: its first 8 bytes as a [`WipeMarker`], and the rest.
    pub(crate) fn split(&mut self) -> (WipeMarker<'_>, &mut [u8; WIPED_PAGE - 8]) {
        let start = self.start.as_ptr();
        // SAFETY: `start` is the start of a live, readable and writable private mapping of
        // WIPED_PAGE bytes that `self` owns until it is dropped. The marker's 8 bytes and the
        // rest do not overlap, `&mut self` makes these the only references into the page for
        // as long as they live, and the start is page-aligned, so aligned for a `u64`.
        unsafe {
            let rest = &mut *start.add(8).cast::<[u8; WIPED_PAGE - 8]>();
            let marker = WipeMarker {
                at: std::ptr::NonNull::new_unchecked(start.cast::<u64>()),
                _page: std::marker::PhantomData,
            };
            (marker, rest)
        }
    }
}

/// The first 8 bytes of a [`WipeOnForkPage`], which a fork in a signal handler can zero
/// between two instructions of the code reading them: every access is volatile and fenced, so
/// the compiler neither elides nor reorders it against the page's other accesses.
pub(crate) struct WipeMarker<'page> {
    at: std::ptr::NonNull<u64>,
    _page: std::marker::PhantomData<&'page mut u64>,
}

impl WipeMarker<'_> {
    /// The marker as it is in memory now.
    pub(crate) fn get(&self) -> u64 {
        use std::sync::atomic::{compiler_fence, Ordering};
        compiler_fence(Ordering::SeqCst);
        // SAFETY: `at` points at 8 aligned bytes of the page that this marker's borrow keeps
        // mapped and that nothing else references; every bit pattern is a valid `u64`.
        let value = unsafe { self.at.as_ptr().read_volatile() };
        compiler_fence(Ordering::SeqCst);
        value
    }

    /// Writes the marker.
    pub(crate) fn set(&mut self, value: u64) {
        use std::sync::atomic::{compiler_fence, Ordering};
        compiler_fence(Ordering::SeqCst);
        // SAFETY: as in `get`, and `&mut self` makes this the only access.
        unsafe { self.at.as_ptr().write_volatile(value) };
        compiler_fence(Ordering::SeqCst);
    }
}

impl Drop for WipeOnForkPage {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping `self` owns; `drop` takes the last reference to it.
        let _ = unsafe { rustix::mm::munmap(self.start.as_ptr().cast(), WIPED_PAGE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::BorrowedFd;
    use std::process::Stdio;

    /// A fork that lands inside a draw (after `take` has read the count, before it has
    /// written the new one) must not leave the child a pool that is all zeros with a count
    /// that says it is full of unused randomness: the child would then send all-zero,
    /// predictable ids for up to 255 calls.
    ///
    /// The fork is pinned deterministically: the page is made read-only, so the draw's first
    /// write into it faults, and the `SIGSEGV` handler makes it writable again and forks
    /// (what any signal handler that forks does if the signal lands there). Parent and child
    /// both return from the handler and finish the draw; the child then draws three more ids.
    #[test]
    fn a_fork_inside_a_call_id_draw_never_leaves_the_child_zero_or_shared_ids() {
        use crate::ids::{this_threads_page, CallIdRng};
        use rand_core::RngCore;
        use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
        static PAGE_AT: AtomicUsize = AtomicUsize::new(0);
        static IN_CHILD: AtomicBool = AtomicBool::new(false);
        static CHILD: AtomicI32 = AtomicI32::new(0);
        static REPORT: AtomicI32 = AtomicI32::new(-1);
        let (mut report_in, report_out) = std::os::unix::net::UnixStream::pair().unwrap();
        REPORT.store(
            std::os::fd::AsRawFd::as_raw_fd(&report_out),
            Ordering::SeqCst,
        );

        extern "C" fn on_fault(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
            let page = PAGE_AT.load(Ordering::SeqCst);
            // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
            let addr = unsafe { (*info).si_addr() } as usize;
            if page == 0 || !(page..page + WIPED_PAGE).contains(&addr) {
                // SAFETY: not our fault: restore the default action; the access faults again.
                unsafe { libc::signal(libc::SIGSEGV, libc::SIG_DFL) };
                return;
            }
            PAGE_AT.store(0, Ordering::SeqCst);
            // SAFETY: system calls on integers and the page this test owns; the raw fork
            // (clone with SIGCHLD, as `sys::clone_into_namespaces`) runs no atfork handler.
            unsafe {
                libc::mprotect(
                    page as *mut libc::c_void,
                    WIPED_PAGE,
                    libc::PROT_READ | libc::PROT_WRITE,
                );
                let pid = libc::syscall(
                    libc::SYS_clone,
                    libc::SIGCHLD as libc::c_ulong,
                    0usize,
                    0usize,
                    0usize,
                    0usize,
                );
                if pid == 0 {
                    IN_CHILD.store(true, Ordering::SeqCst);
                } else {
                    CHILD.store(pid as i32, Ordering::SeqCst);
                }
            }
        }

        let mut rng = CallIdRng;
        // The page exists, is live and holds unused ids: the next draw's first write into it
        // is the zeroing of the bytes it took.
        let page = this_threads_page();
        // SAFETY: installs a handler (saving the old action, restored below) and makes the
        // test thread's own pool page read-only; nothing else writes to it.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fault as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGSEGV, &action, &mut old), 0);
            PAGE_AT.store(page, Ordering::SeqCst);
            assert_eq!(
                libc::mprotect(page as *mut libc::c_void, WIPED_PAGE, libc::PROT_READ),
                0
            );
        }

        let mut in_flight = [0u8; 16];
        rng.fill_bytes(&mut in_flight); // forks half-way through
                                        // The child reports through a pipe the id it drew in flight and three more.
        if IN_CHILD.load(Ordering::SeqCst) {
            let mut ids = [[0u8; 16]; 4];
            ids[0] = in_flight;
            ids[1..].iter_mut().for_each(|id| rng.fill_bytes(id));
            let out = REPORT.load(Ordering::SeqCst);
            // SAFETY: writes 64 bytes of a local array to the pipe's write end, then leaves
            // the forked child without running the harness's code.
            unsafe {
                libc::write(out, ids.as_ptr().cast(), 64);
                libc::_exit(0);
            }
        }
        // SAFETY: restores the action saved above.
        unsafe { libc::sigaction(libc::SIGSEGV, &old, std::ptr::null_mut()) };
        let child = CHILD.load(Ordering::SeqCst);
        assert!(child > 0, "the draw did not fault, so no fork happened");
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status),
            "the child did not exit: {status:#x}"
        );
        assert_eq!(libc::WEXITSTATUS(status), 0);
        drop(report_out);
        let mut reported = Vec::new();
        report_in.read_to_end(&mut reported).unwrap();
        let ids: Vec<&[u8]> = reported.chunks(16).collect();
        assert_eq!(ids.len(), 4, "the child did not report its ids");
        assert!(
            ids.iter().all(|id| *id != [0u8; 16]),
            "the forked child drew all-zero ids: {ids:02x?}"
        );
        assert_ne!(
            ids[0], in_flight,
            "parent and child both took the id drawn when the fork struck"
        );
        // The parent's next ids are its own.
        let mut next = [0u8; 16];
        rng.fill_bytes(&mut next);
        assert!(
            !ids.contains(&&next[..]),
            "the parent drew an id the child drew"
        );
    }

    /// Every instruction boundary of a draw is a place where a signal handler can fork. This
    /// single-steps a draw (the x86-64 trap flag, set in a signal handler's saved context) and,
    /// for each step `n`, repeats the draw from the same starting state with a fork in the
    /// `SIGTRAP` handler at step `n`. The child finishes the draw, draws three more ids and
    /// reports all four; the parent draws four more. For every fork point: no child id is all
    /// zero, no later child id is one of the parent's, and the in-flight id is shared only in
    /// a final run of steps (after the draw's last marker read: the child's stack then holds
    /// the id, as after any draw, which no check can help). A pool read moved past the last
    /// marker read would show as zero ids in that run. Three starting states: a live pool with
    /// unused ids, a pool that must refill, and the first draw of a new thread.
    ///
    /// Slow in a debug build (about 8,000 forks, 5 minutes); 6 s with `--release`.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[ignore = "slow in debug builds: cargo test --release -p airlock-host --lib sys:: -- --ignored"]
    fn every_fork_point_of_a_single_stepped_draw_leaves_the_child_its_own_ids() {
        use crate::ids::{this_threads_page, CallIdRng};
        use rand_core::RngCore;
        use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering::SeqCst};
        static STEP: AtomicUsize = AtomicUsize::new(0);
        static FORK_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
        static DONE: AtomicBool = AtomicBool::new(true);
        static IN_CHILD: AtomicBool = AtomicBool::new(false);
        static CHILD: AtomicI32 = AtomicI32::new(0);
        const TF: i64 = 0x100;

        extern "C" fn on_start(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
            // SAFETY: the kernel passes a valid ucontext to an SA_SIGINFO handler.
            unsafe {
                (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_EFL as usize] |= TF;
            }
        }
        extern "C" fn on_trap(_: libc::c_int, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
            // SAFETY: as above; the raw fork (clone with SIGCHLD) runs no atfork handler.
            unsafe {
                let flags = &mut (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs
                    [libc::REG_EFL as usize];
                if DONE.load(SeqCst) {
                    *flags &= !TF;
                    return;
                }
                if STEP.fetch_add(1, SeqCst) == FORK_AT.load(SeqCst) {
                    *flags &= !TF;
                    let pid =
                        libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0);
                    if pid == 0 {
                        IN_CHILD.store(true, SeqCst);
                    } else {
                        CHILD.store(pid as i32, SeqCst);
                    }
                }
            }
        }
        // SAFETY: installs handlers for two signals nothing else in this test binary uses.
        unsafe {
            for (signal, handler) in [
                (libc::SIGUSR1, on_start as *const () as usize),
                (libc::SIGTRAP, on_trap as *const () as usize),
            ] {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = handler;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                assert_eq!(libc::sigaction(signal, &action, std::ptr::null_mut()), 0);
            }
        }

        #[derive(PartialEq)]
        enum Outcome {
            NoFork,
            Own,
            SharedInFlight,
            Broken(&'static str),
        }
        // One stepped draw on this thread, forking at step `fork_at`.
        fn stepped_draw(fork_at: usize) -> Outcome {
            let (mut report_in, report_out) = std::os::unix::net::UnixStream::pair().unwrap();
            let mut rng = CallIdRng;
            let mut in_flight = [0u8; 16];
            STEP.store(0, SeqCst);
            FORK_AT.store(fork_at, SeqCst);
            CHILD.store(0, SeqCst);
            DONE.store(false, SeqCst);
            // SAFETY: the handler only sets the trap flag in the context it returns to.
            unsafe { libc::raise(libc::SIGUSR1) };
            rng.fill_bytes(&mut in_flight);
            DONE.store(true, SeqCst);
            if IN_CHILD.load(SeqCst) {
                let mut ids = [[0u8; 16]; 4];
                ids[0] = in_flight;
                ids[1..].iter_mut().for_each(|id| rng.fill_bytes(id));
                // SAFETY: writes a local array, then leaves without running the harness.
                unsafe {
                    libc::write(
                        std::os::fd::AsRawFd::as_raw_fd(&report_out),
                        ids.as_ptr().cast(),
                        64,
                    );
                    libc::_exit(0);
                }
            }
            let child = CHILD.load(SeqCst);
            if child <= 0 {
                return Outcome::NoFork;
            }
            let mut status = 0;
            // SAFETY: waits for the child forked above.
            assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child: {status:#x}"
            );
            drop(report_out);
            let mut ids = [[0u8; 16]; 4];
            report_in
                .read_exact(ids.as_flattened_mut())
                .expect("the child's ids");
            let mut parents = [[0u8; 16]; 4];
            parents.iter_mut().for_each(|id| rng.fill_bytes(id));
            if ids.contains(&[0u8; 16]) {
                Outcome::Broken("an all-zero id")
            } else if ids[1..]
                .iter()
                .any(|id| parents.contains(id) || *id == in_flight)
            {
                Outcome::Broken("a later id shared with the parent")
            } else if ids[0] == in_flight {
                Outcome::SharedInFlight
            } else {
                Outcome::Own
            }
        }
        // Every fork point of `draw` (which sets its starting state); returns the failures.
        fn every_fork_point(name: &str, draw: &dyn Fn(usize) -> Outcome) -> Vec<String> {
            let (mut failures, mut shared) = (Vec::new(), Vec::new());
            let mut n = 0;
            loop {
                match draw(n) {
                    Outcome::NoFork => break,
                    Outcome::Own => {}
                    Outcome::SharedInFlight => shared.push(n),
                    Outcome::Broken(what) => {
                        failures.push(format!("{name}: fork at step {n}: {what}"))
                    }
                }
                n += 1;
            }
            if shared
                .first()
                .is_some_and(|first| shared != (*first..n).collect::<Vec<_>>())
            {
                failures.push(format!(
                    "{name}: in-flight id shared at steps {shared:?} of {n}"
                ));
            }
            assert!(n > 50, "{name}: only {n} steps");
            eprintln!(
                "{name}: {n} fork points, in-flight id shared at the last {}",
                shared.len()
            );
            failures
        }

        let page = this_threads_page();
        // SAFETY: reads the count of this thread's own live page.
        let count = || unsafe { ((page + 8) as *const u64).read_volatile() };
        let live = |n| {
            if count() < 32 {
                CallIdRng.fill_bytes(&mut [0u8; 16]);
            }
            stepped_draw(n)
        };
        let refill = |n| {
            while count() >= 16 {
                CallIdRng.fill_bytes(&mut [0u8; 16]);
            }
            stepped_draw(n)
        };
        let first = |n| std::thread::scope(|s| s.spawn(move || stepped_draw(n)).join().unwrap());
        let mut failures = every_fork_point("live", &live);
        failures.extend(every_fork_point("refill", &refill));
        failures.extend(every_fork_point("first draw of a thread", &first));
        assert!(failures.is_empty(), "{failures:#?}");
    }

    /// A set-up step finds at fd 3 what the host had there, never the channel: a descriptor
    /// the set-up writes to can sit at 3 in the child, and a channel moved there first would
    /// take those writes. The worker then finds the channel at 3.
    #[tokio::test]
    async fn the_channel_takes_fd_3_only_after_the_set_up() {
        let (mut host_end, pair_end) = std::os::unix::net::UnixStream::pair().unwrap();
        // Above 3, so that only the move can put the channel there.
        let child_end = rustix::io::fcntl_dupfd_cloexec(&pair_end, 10).unwrap();
        drop(pair_end);
        let channel = rustix::fs::fstat(&child_end).unwrap().st_ino;
        let set_up: SetUp = Box::new(move || {
            // SAFETY: fd 3 is only inspected, while this single-threaded child runs.
            let at_3 = rustix::fs::fstat(unsafe { BorrowedFd::borrow_raw(3) });
            match at_3 {
                Ok(stat) if stat.st_ino == channel => {
                    Err(std::io::Error::from_raw_os_error(libc::EEXIST))
                }
                _ => Ok(()),
            }
        });
        let mut command = Command::new("/bin/sh");
        command
            .args(["-c", "printf worker >&3"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        prepare_child(&mut command, Some(set_up), Some(child_end));
        let mut child = command
            .spawn()
            .expect("the set-up did not find the channel at fd 3");
        drop(command);
        assert!(child.wait().await.unwrap().success());
        let mut received = String::new();
        host_end.read_to_string(&mut received).unwrap();
        assert_eq!(received, "worker");
    }
}
