//! What runs between fork and `exec`: the keeper creates init in the worker's namespaces,
//! init builds the sandbox and locks itself down, then starts the worker, in this order:
//!
//! ```text
//! host ──fork──▶ keeper ──clone(CLONE_NEW*)──▶ init (PID 1) ──clone(VM|VFORK)──▶ worker (PID 2)
//!                  │ (a root host with a worker uid of its own makes the user namespace
//!                  │  first, as that uid, in an anchor child; a second child joins it and
//!                  │  makes init there, beside the keeper: `create_init`)
//!                  │ list the host's memory;      │ parent-death signal,   │ own session
//!                  │   withhold it from children  │   wait for "go"        │ channel to fd 3
//!                  │   but for the plan;          │                        │
//!                  │   a "started" pipe           │                        │
//!                  │ write uid/gid maps           │                        │
//!                  │ oom_score_adj, "go"          │ copy granted paths     ▼ execve
//!                  │ cgroup v2: move init in;     │   (open_tree)
//!                  │   "joined"                   │
//!                  │ report init's pid            │
//!                  │ close every descriptor but   │
//!                  │   "started"; wait ≤ 20 s for │
//!                  │   init to close its end      │
//!                  │ drop the host's memory       │
//!                  │ wait; end as the worker did  │ become uid/gid (root host: nobody),
//!                  ▼                              │   parent-death signal again
//!                                                 │ build root, pivot_root, read-only
//!                                                 │ hostname; wait for "joined",
//!                                                 │   cgroup v1: move itself in,
//!                                                 │   cgroup namespace
//!                                                 │ rlimits, no capabilities
//!                                                 │ no_new_privs, Landlock, seccomp
//!                                                 │ start the worker, close everything
//!                                                 │   ("started" with it)
//!                                                 │ drop the plan's pages
//!                                                 ▼ reap; report the worker's status; exit
//! ```
//!
//! Only system calls run here, on memory prepared before the first fork (see `plan`); a
//! failing step writes `(step, errno)` to the report pipe so the host can name it. Init, on a
//! failure, reports it there (a failed `exec` of the worker's program too) and exits with
//! [`INIT_SET_UP_FAILED`]: it never returns into `std`'s code after the fork, which aborts
//! where its own error pipe is gone with the host, and `abort` faults in a PID namespace's
//! init (`ChildPlan::end_init`). The keeper is the one fork of the host: its children are
//! given only the plan's pages (`host_memory`), so init never holds the host's memory and no
//! later fork copies it. The keeper and init never `exec`: once only their wait is left, they
//! unmap what they still hold of it, which they would otherwise keep for the worker's whole
//! life. The worker is not a fork: it shares init's memory until its own `exec`
//! (`sys::exec_in_sandbox`, as `posix_spawn` does).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::io::Errno;

use super::error::ConfinementStep;
use super::host_memory::{HostMemory, Kept};
use super::plan::{ChildPlan, REPORT_ERROR, REPORT_EXEC, REPORT_PID};

type StepResult = Result<(), (ConfinementStep, Errno)>;

/// Init's exit code when its set-up failed ([`ChildPlan::end_init`]), and the keeper's when
/// it ended an init that did not start the worker in time: a code of their own, apart from
/// the 127 of a worker that died by a signal (which init reports as its own exit), as `env`
/// and container runtimes keep 125 for their own failure.
const INIT_SET_UP_FAILED: i32 = 125;

/// Which process a clone in [`ChildPlan::create_init`] left running this code.
enum Made {
    /// The keeper, with init's pid.
    Keeper { init: i32 },
    /// Init.
    Init,
}

/// Why the child stopped before the worker ran.
enum ChildFailure {
    /// A confinement step, named on the report pipe.
    Step(ConfinementStep, Errno),
    /// The worker's `execve`: the program's own failure, which the spawn reports as `std`
    /// reports a failed `exec`, from the error alone.
    Exec(Errno),
}

impl From<(ConfinementStep, Errno)> for ChildFailure {
    fn from((step, errno): (ConfinementStep, Errno)) -> Self {
        Self::Step(step, errno)
    }
}

impl ChildPlan {
    /// The closure body run in the forked child before `exec`. With namespaces it returns only
    /// on failure: the worker is started, and `exec`s, from init.
    pub(crate) fn run(&mut self) -> std::io::Result<()> {
        let result = if self.namespaced {
            self.keep()
        } else {
            self.confine_in_place().map_err(ChildFailure::from)
        };
        result.map_err(|failure| {
            let errno = match failure {
                ChildFailure::Step(step, errno) => {
                    self.report(REPORT_ERROR, step.code(), errno.raw_os_error());
                    errno
                }
                ChildFailure::Exec(errno) => errno,
            };
            std::io::Error::from_raw_os_error(errno.raw_os_error())
        })
    }

    /// Init's end when it could not start the worker: the failure goes to the report pipe and
    /// init exits, never returning into `std`'s code after the fork. That code writes the
    /// error to the spawn's exec pipe and aborts if the write fails, as it does once the host
    /// is gone; a PID namespace's init ignores its own `SIGABRT`, so `abort` would end at its
    /// last resort, a faulting instruction the kernel logs as a general protection trap.
    ///
    /// Init still holds `started` here, and `exit` closes it with the spawn's exec pipe, in
    /// one step no signal can come between: an init stopped before it exits is still the
    /// keeper's to end, and so cannot hold the spawn.
    fn end_init(&self, failure: ChildFailure, started: OwnedFd) -> ! {
        match failure {
            ChildFailure::Step(step, errno) => {
                self.report(REPORT_ERROR, step.code(), errno.raw_os_error());
            }
            ChildFailure::Exec(errno) => self.report(REPORT_EXEC, 0, errno.raw_os_error()),
        }
        std::mem::forget(started);
        crate::sys::exit_now(INIT_SET_UP_FAILED)
    }

    fn report(&self, kind: u8, step: u8, value: i32) {
        let v = value.to_le_bytes();
        let record = [kind, step, 0, 0, v[0], v[1], v[2], v[3]];
        let _ = rustix::io::write(&self.report, &record);
    }

    /// The keeper: creates init, maps its ids, lets it go, reports its pid, then stays as its
    /// parent until it ends. Returns only on failure (in the keeper, or in init).
    fn keep(&mut self) -> Result<(), ChildFailure> {
        // The keeper, and what it makes, are copies of the host: none may ever dump core (the
        // keeper re-raises the signal that killed the worker, and a dump would hold the host's
        // memory).
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Core,
            rustix::process::Rlimit {
                current: Some(0),
                maximum: Some(0),
            },
        );
        // The anchor's stack, if it will have one, is mapped first, so that the host's memory
        // read next takes it in, and the keeper unmaps it with the rest.
        let anchor_stack = self
            .identity
            .namespace_owner()
            .and_then(|_| crate::sys::AnchorStack::new().ok());
        // Read while this is still the host's `/proc`; init inherits the list with the stack.
        let host_memory = HostMemory::read();
        // Made here, after the fork, so that no other process of the host (another spawn's
        // keeper or init, a fork of the host) ever holds an end of it: init holds the write
        // end until it has started the worker, and the keeper sees it hang up then (or when
        // init ends), whatever else the host forked meanwhile.
        let (started_read, started_write) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|e| ChildFailure::Step(ConfinementStep::Synchronise, e))?;
        // No child forked from here (init, and the child that makes it) gets the host's
        // memory, but for the pages the plan lies on: each copies, and tears down, only
        // those, whatever the host's size. (The anchor shares the keeper's memory as it is.)
        // A plan too scattered to list is copied whole, as the host is.
        let mut kept = Kept::new();
        self.footprint(&mut kept);
        host_memory.withhold_from_children_except(&mut kept);
        let pid = match self.create_init(anchor_stack)? {
            Made::Init => {
                drop(started_read);
                let failure = self.init(&host_memory, &started_write);
                self.end_init(failure, started_write);
            }
            Made::Keeper { init } => init,
        };
        // Init exists: from here a write to a pipe whose reader is gone (the report pipe once
        // the host's spawn has returned, `go` once init has died) must fail, not kill the
        // keeper before it has ended init.
        crate::sys::ignore_sigpipe();
        drop(started_write);
        let go = self.go_write.take();
        // Init may not have run yet (a process of the worker's uid may have stopped it before
        // it armed its parent-death signal): a failure from here on ends it.
        let started = self.start_init(pid, go.as_ref());
        if let Err(failed) = started {
            end_child(pid);
            return Err(failed.into());
        }
        self.report(REPORT_PID, 0, pid);
        // Nothing of the host's stays open here: not the channel, not stdio (so the worker's
        // exit is the end of its streams), and, once init has started the worker, not the
        // report pipe. Only `go`, whose closing tells init the keeper is gone, and the read
        // end of init's status pipe.
        self.status_write = None;
        let status = self.status_read.take();
        let fd = |f: &Option<OwnedFd>| f.as_ref().map_or(-1, |f| f.as_raw_fd());
        crate::sys::close_all_except(&[
            fd(&go),
            fd(&status),
            self.report.as_raw_fd(),
            started_read.as_raw_fd(),
        ]);
        if let Err(errno) = init_starts_the_worker_within(&started_read, INIT_SET_UP) {
            // Stopped, most likely, by a process of the worker's uid: init would hold the
            // spawn (it holds the descriptor that tells the host the child started) and stay
            // stopped for as long as the host lives.
            self.report(
                REPORT_ERROR,
                ConfinementStep::Synchronise.code(),
                errno.raw_os_error(),
            );
            end_child(pid);
            // Init's set-up never finished: its code, which the host sees as the worker's exit
            // where the spawn had already returned.
            crate::sys::exit_now(INIT_SET_UP_FAILED);
        }
        crate::sys::close_all_except(&[fd(&go), fd(&status)]);
        // No core dump either way (`RLIMIT_CORE` is 0 since the keeper began): the keeper
        // re-raises the signal that killed the worker.
        let _ =
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
        // From here on only the wait below runs, on this stack: the host's memory goes.
        host_memory.drop_all();
        loop {
            match rustix::process::waitpid(
                rustix::process::Pid::from_raw(pid),
                rustix::process::WaitOptions::empty(),
            ) {
                Ok(Some((_, init_status))) => {
                    // The worker's own status, if init reported it; else init's.
                    let ended = status
                        .as_ref()
                        .and_then(reported_status)
                        .unwrap_or(init_status.as_raw());
                    if libc::WIFEXITED(ended) {
                        crate::sys::exit_now(libc::WEXITSTATUS(ended));
                    }
                    if libc::WIFSIGNALED(ended) {
                        crate::sys::die_by_signal(libc::WTERMSIG(ended));
                    }
                    crate::sys::exit_now(127);
                }
                Err(Errno::INTR) => continue,
                _ => crate::sys::exit_now(127),
            }
        }
    }

    /// The keeper's steps for init once it exists: its OOM score, "go", its cgroups by pid,
    /// "joined".
    fn start_init(&self, pid: i32, go: Option<&OwnedFd>) -> StepResult {
        // Under memory pressure the kernel kills the worker before its host.
        super::namespaces::prefer_for_oom_kill(pid)
            .map_err(|e| (ConfinementStep::MapIdentity, e))?;
        if let Some(go) = go {
            rustix::io::write(go, b"g").map_err(|e| (ConfinementStep::Synchronise, e))?;
        }
        // Moving a process by its pid can wait for an RCU grace period (`cgroup`): done while
        // init builds its root, and init waits for "joined" before it joins the rest itself,
        // starts the worker or enters a cgroup namespace.
        if let Some(cgroup) = &self.cgroup {
            cgroup
                .join_by_pid(pid)
                .map_err(|e| (ConfinementStep::Cgroup, e))?;
        }
        if let Some(go) = go {
            rustix::io::write(go, b"j").map_err(|e| (ConfinementStep::Synchronise, e))?;
        }
        Ok(())
    }

    /// Creates init in the worker's namespaces, its ids mapped: returns in the keeper with
    /// init's pid, and in init. Where the namespace should be the worker uid's
    /// ([`Identity::namespace_owner`](super::namespaces::Identity::namespace_owner)), it is
    /// handed over ([`hand_over`](Self::hand_over)); where that cannot be done before init
    /// exists (a capability the keeper lacks, user namespaces refused to non-root), the keeper
    /// makes the namespaces as root, as for every other host, and the worker is confined the
    /// same, its namespace's counts charged to root.
    fn create_init(
        &mut self,
        anchor_stack: Option<crate::sys::AnchorStack>,
    ) -> Result<Made, (ConfinementStep, Errno)> {
        use super::namespaces::CLONE_FLAGS;
        use ConfinementStep::{CreateNamespaces, MapIdentity};
        if let (Some(owner), Some(stack)) = (self.identity.namespace_owner(), anchor_stack) {
            if let Some(made) = self.hand_over(owner, stack)? {
                return Ok(made);
            }
        }
        let pid =
            crate::sys::clone_into_namespaces(CLONE_FLAGS).map_err(|e| (CreateNamespaces, e))?;
        if pid == 0 {
            return Ok(Made::Init);
        }
        self.identity
            .write_maps(pid)
            .map_err(|e| (MapIdentity, e))?;
        Ok(Made::Keeper { init: pid })
    }

    /// Makes init in a user namespace owned by `owner`. The namespace comes first, made by an
    /// *anchor*: a child, sharing the keeper's memory and running on `stack`, made while the
    /// keeper takes `owner` as its effective uid (the kernel takes a namespace's owner, and
    /// the user its members' counts are charged to, from its creator's effective uid), which
    /// then waits. Init must still hold the host's uid 0 for its set-up (it reads the granted
    /// paths as root does), so a second child joins the anchor's namespace as root and makes
    /// init there, beside the keeper (`CLONE_PARENT`), in the other new namespaces. Then the
    /// anchor is killed and both children end. `None` where a step before init exists fails
    /// (nothing of it is left): the caller makes the namespaces as root instead. An error
    /// only where the keeper cannot go on (its host is gone, it could not become root again).
    fn hand_over(
        &mut self,
        owner: u32,
        stack: crate::sys::AnchorStack,
    ) -> Result<Option<Made>, (ConfinementStep, Errno)> {
        use super::namespaces::act_as;
        use rustix::thread::CapabilitySet;
        use ConfinementStep::{MapIdentity, Synchronise};
        // Writing the maps of a namespace the keeper does not own, opening its link (a
        // ptrace check against the anchor, whose uids differ) and joining it need these.
        let needed = CapabilitySet::SYS_ADMIN | CapabilitySet::SYS_PTRACE | CapabilitySet::SETUID;
        if !rustix::thread::capabilities(None).is_ok_and(|caps| caps.effective.contains(needed)) {
            return Ok(None);
        }
        // The children made from here (and init) live in a namespace the worker's uid owns,
        // so a process of that uid may signal them: undumpable, none of their memory or
        // descriptors can be taken from them (`/proc/<pid>/mem`, `pidfd_getfd`). The change
        // of effective uid below makes the keeper so where `fs.suid_dumpable` is 0, which the
        // hand-over requires; this does not rest on that. (A root keeper still writes their
        // maps and `oom_score_adj`.)
        if rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .is_err()
        {
            return Ok(None);
        }
        let (hold, release) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| (Synchronise, e))?;
        if act_as(owner).is_err() {
            return Ok(None);
        }
        // The anchor holds the namespace until the keeper lets go (or dies).
        let anchor = crate::sys::clone_user_namespace_anchor(hold.as_raw_fd(), stack);
        drop(hold);
        // A change of effective uid clears the parent-death signal: arm it again, and make
        // sure the host did not die in between (nobody would kill this process then).
        let restored = act_as(0)
            .map_err(|e| (MapIdentity, e))
            .and_then(|()| {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))
                .map_err(|e| (Synchronise, e))
            })
            .and_then(|()| match rustix::process::getppid() == Some(self.host) {
                true => Ok(()),
                false => Err((Synchronise, Errno::SRCH)),
            });
        if let Err(failed) = restored {
            if let Ok(anchor) = anchor {
                end_child(anchor);
            }
            return Err(failed);
        }
        let Ok(anchor) = anchor else {
            return Ok(None);
        };
        let made = self.make_init_in_namespace_of(anchor);
        drop(release);
        if !matches!(made, Ok(Some(Made::Init))) {
            end_child(anchor);
        }
        made
    }

    /// The rest of [`hand_over`](Self::hand_over) once `anchor` holds the worker's user
    /// namespace: its maps, then init made there by a child that joins it. `None` where a
    /// step fails before that child exists: nothing is left, and the caller may make the
    /// namespaces as root. Once it exists, init may exist too, so a failure is the spawn's:
    /// the child is killed, and so is every other child of the keeper's, an init it made
    /// included (stopped, that init would never see the keeper's `go` close). The
    /// keeper waits for the child's word for [`MAKER_WORD`] at most: a process of the
    /// worker's uid may signal it (it is in a namespace that uid owns), so it may be
    /// stopped.
    fn make_init_in_namespace_of(
        &mut self,
        anchor: i32,
    ) -> Result<Option<Made>, (ConfinementStep, Errno)> {
        use super::namespaces::{open_user_namespace, CLONE_FLAGS_BESIDE_USER};
        use ConfinementStep::CreateNamespaces;
        let before_the_maker = || -> Option<_> {
            self.identity.write_maps(anchor).ok()?;
            let namespace = open_user_namespace(anchor).ok()?;
            let (pid_read, pid_write) =
                rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).ok()?;
            Some((namespace, pid_read, pid_write))
        };
        let Some((namespace, pid_read, pid_write)) = before_the_maker() else {
            return Ok(None);
        };
        let Ok(maker) = crate::sys::clone_into_namespaces(0) else {
            return Ok(None);
        };
        if maker == 0 {
            let made = rustix::thread::move_into_link_name_space(
                namespace.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::User),
            )
            .and_then(|()| {
                crate::sys::clone_into_namespaces(CLONE_FLAGS_BESIDE_USER | libc::CLONE_PARENT)
            });
            match made {
                Ok(0) => return Ok(Some(Made::Init)),
                Ok(init) => {
                    let _ = rustix::io::write(&pid_write, &init.to_le_bytes());
                    crate::sys::exit_now(0);
                }
                Err(e) => {
                    self.report(REPORT_ERROR, CreateNamespaces.code(), e.raw_os_error());
                    crate::sys::exit_now(127);
                }
            }
        }
        drop(pid_write);
        let word = read_within(&pid_read, MAKER_WORD);
        end_child(maker);
        match word {
            Ok(init) => Ok(Some(Made::Keeper {
                init: i32::from_le_bytes(init),
            })),
            Err(e) => {
                // An init the child made before it was stopped (stopped with it, before it
                // could arm its parent-death signal) is the keeper's child (`CLONE_PARENT`):
                // it goes too, and so does every other child left.
                end_all_children();
                Err((CreateNamespaces, e))
            }
        }
    }

    /// PID 1 of the worker's namespaces, still running the host's code: it builds the sandbox,
    /// locks itself down, then starts the worker (PID 2), which `exec`s at once, and stays as
    /// the namespace's init. An init that never execs keeps its parent-death signal whatever
    /// the worker does (a thread's `execve` would reset the worker's own); when it dies, the
    /// kernel kills everything in the namespace; and nothing in the namespace can signal it.
    /// Returns only on failure, which [`end_init`](Self::end_init) reports.
    fn init(&mut self, host_memory: &HostMemory, started: &OwnedFd) -> ChildFailure {
        match self.init_steps(host_memory, started) {
            Err(failure) => failure,
            Ok(never) => match never {},
        }
    }

    /// [`init`](Self::init)'s steps: `Ok` is never made, as init ends as the worker does.
    fn init_steps(
        &mut self,
        host_memory: &HostMemory,
        started: &OwnedFd,
    ) -> Result<std::convert::Infallible, ChildFailure> {
        use ConfinementStep::Synchronise;
        self.go_write = None;
        self.status_read = None;
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(|e| (Synchronise, e))?;
        let Some(go) = self.go_read.take() else {
            return Err((Synchronise, Errno::BADF).into());
        };
        let mut byte = [0u8; 1];
        match rustix::io::read(&go, &mut byte) {
            Ok(1) => {}
            Ok(_) => return Err((Synchronise, Errno::PIPE).into()),
            Err(e) => return Err((Synchronise, e).into()),
        }
        keeper_alive(&go)?;
        // Init is a fork of the host's keeper, holding the plan (paths, the environment,
        // descriptors): never dumpable, so the worker (same uid when the host is
        // unprivileged) can open nothing of it in /proc (`mem`, `environ`, its descriptors).
        // Only now: the keeper, which writes this process's uid map and oom_score_adj, has
        // done so (it said "go"). And no handler of the host's: PID 1 takes the signals it
        // handles from inside its namespace.
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .map_err(|e| (Synchronise, e))?;
        crate::sys::reset_signal_handlers();
        if let Some(mounts) = &mut self.mounts {
            mounts.copy_sources()?;
        }
        self.identity
            .become_worker()
            .map_err(|e| (ConfinementStep::SwitchIdentity, e))?;
        // A change of uid clears the parent-death signal: arm it again, then make sure the
        // keeper did not die in between (nobody would kill this process then).
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(|e| (Synchronise, e))?;
        keeper_alive(&go)?;
        if let Some(mounts) = &mut self.mounts {
            mounts.build_and_enter()?;
        }
        let _ = rustix::system::sethostname(b"airlock");
        // The keeper has moved this process into the cgroups it joins by pid: wait for it to
        // say so, join the others from here (this process is one thread), then a cgroup
        // namespace rooted there.
        match rustix::io::read(&go, &mut byte) {
            Ok(1) if byte[0] == b'j' => {}
            Ok(_) => return Err((Synchronise, Errno::PIPE).into()),
            Err(e) => return Err((Synchronise, e).into()),
        }
        if let Some(cgroup) = &self.cgroup {
            cgroup
                .join_self()
                .map_err(|e| (ConfinementStep::Cgroup, e))?;
        }
        crate::sys::unshare_cgroup_namespace().map_err(|e| (ConfinementStep::Cgroup, e))?;
        self.limits.apply()?;
        super::process::drop_capabilities()?;
        self.lock_down(true)?;
        // The worker shares this process's memory until its `exec`: no copy of the host's.
        let Some(exec) = &mut self.worker else {
            return Err(ChildFailure::Step(
                ConfinementStep::Synchronise,
                Errno::INVAL,
            ));
        };
        let worker = crate::sys::exec_in_sandbox(exec).map_err(|err| match err {
            crate::sys::SandboxExecError::Start(errno) => {
                ChildFailure::Step(ConfinementStep::Session, errno)
            }
            crate::sys::SandboxExecError::Exec(errno) => ChildFailure::Exec(errno),
        })?;
        // Init: hold nothing of the host's (the channel, stdio and the spawn's error pipe
        // closed in the worker with its `exec`), reap whatever is orphaned here, and end as
        // the worker ends.
        drop(go);
        let status = self.status_write.take();
        let status_fd = status.as_ref().map_or(-1, |f| f.as_raw_fd());
        // `started` last: once it hangs up the keeper no longer watches this process, so the
        // spawn's exec pipe (`std`'s, its number unknown here) must be gone by then, or init
        // stopped in between would hold the spawn. (The caller's `started` is never dropped:
        // this process ends below, by `exit`.)
        crate::sys::close_all_except(&[status_fd, started.as_raw_fd()]);
        crate::sys::close_all_except(&[status_fd]);
        // Only the wait below runs from here, on this stack: the host's memory goes.
        host_memory.drop_all();
        loop {
            match rustix::process::wait(rustix::process::WaitOptions::empty()) {
                Ok(Some((pid, ended))) if pid.as_raw_nonzero().get() == worker => {
                    // Init cannot die by the worker's signal (PID 1 ignores its own): the
                    // keeper, told the status, ends as the worker did.
                    if let Some(fd) = &status {
                        let _ = rustix::io::write(fd, &ended.as_raw().to_le_bytes());
                    }
                    crate::sys::exit_now(ended.exit_status().unwrap_or(127));
                }
                Ok(_) | Err(Errno::INTR) => continue,
                Err(_) => crate::sys::exit_now(127),
            }
        }
    }

    /// Without namespaces (best effort): the forked child confines itself in place.
    fn confine_in_place(&mut self) -> StepResult {
        if let Some(cgroup) = &self.cgroup {
            // This child is a process of one thread: it joins v1 cgroups as init does.
            cgroup
                .join_by_pid(rustix::process::getpid().as_raw_nonzero().get())
                .and_then(|()| cgroup.join_self())
                .map_err(|e| (ConfinementStep::Cgroup, e))?;
        }
        self.limits.apply()?;
        // A root host still holds CAP_SETPCAP here: the bounding set goes before the uid.
        // Before the uid changes: after it the process is not dumpable and its /proc files
        // are root's. (A root host also sets the floor the worker cannot go under.)
        super::namespaces::prefer_for_oom_kill(0)
            .map_err(|e| (ConfinementStep::ResourceLimits, e))?;
        if self.identity.host_is_root {
            super::process::drop_bounding_set()?;
        }
        self.identity
            .become_worker()
            .map_err(|e| (ConfinementStep::SwitchIdentity, e))?;
        // A change of uid clears the parent-death signal `prepare_child` armed.
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(|e| (ConfinementStep::Synchronise, e))?;
        if rustix::process::getppid() != Some(self.host) {
            return Err((ConfinementStep::Synchronise, Errno::SRCH));
        }
        super::process::clear_capability_sets()?;
        if let Some(cwd) = &self.cwd {
            rustix::process::chdir(cwd.as_c_str())
                .map_err(|e| (ConfinementStep::WorkingDirectory, e))?;
        }
        self.lock_down(false)
    }

    /// The last steps, shared: `no_new_privs`, Landlock, the seccomp denylist.
    fn lock_down(&mut self, namespaced: bool) -> StepResult {
        super::process::no_new_privs()?;
        if let Some(landlock) = &mut self.landlock {
            landlock.restrict_self(namespaced)?;
        }
        for program in &self.seccomp {
            seccompiler::apply_filter(program)
                .map_err(|_| (ConfinementStep::Seccomp, Errno::PERM))?;
        }
        Ok(())
    }
}

/// The worker's wait status as init wrote it to `status` before it exited, if it did. Never
/// waits: init has been reaped, so what it wrote is there already, and a pipe whose other end
/// is still open elsewhere (the host holds a copy until its spawn returns, and the spawn waits
/// for this process) must not be read until it closes.
fn reported_status(status: &OwnedFd) -> Option<i32> {
    let mut fds = [rustix::event::PollFd::new(
        status,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).ok()?;
    if !fds[0].revents().contains(rustix::event::PollFlags::IN) {
        return None;
    }
    let mut raw = [0u8; 4];
    (rustix::io::read(status, &mut raw) == Ok(4)).then(|| i32::from_le_bytes(raw))
}

/// How long the keeper waits for the child that makes init in a worker-owned namespace to
/// give init's pid: far longer than a `clone` takes, far shorter than the host's spawn waits.
const MAKER_WORD: std::time::Duration = std::time::Duration::from_secs(5);

/// How long the keeper waits, once init exists, for init to start the worker: far longer
/// than building the sandbox takes (milliseconds), shorter than the host's spawn waits for
/// the keeper (30 s), so that the keeper, not the host, ends an init that never gets there.
const INIT_SET_UP: std::time::Duration = std::time::Duration::from_secs(20);

/// Waits until init has started the worker or ended: either way no write end of `started`
/// (made by the keeper after its fork, held only by init by now) is left, and its read end
/// hangs up. `TIMEDOUT` past `limit`.
fn init_starts_the_worker_within(
    started: &OwnedFd,
    limit: std::time::Duration,
) -> Result<(), Errno> {
    use rustix::event::{PollFd, PollFlags};
    poll_until(
        &mut [PollFd::new(started, PollFlags::IN)],
        std::time::Instant::now() + limit,
    )
}

/// Reads four bytes from `pipe` within `limit`: `TIMEDOUT` past it, `PIPE` if it ends first.
fn read_within(pipe: &OwnedFd, limit: std::time::Duration) -> Result<[u8; 4], Errno> {
    use rustix::event::{PollFd, PollFlags};
    let until = std::time::Instant::now() + limit;
    let mut word = [0u8; 4];
    let mut filled = 0;
    while filled < word.len() {
        poll_until(&mut [PollFd::new(pipe, PollFlags::IN)], until)?;
        match rustix::io::read(pipe, &mut word[filled..]) {
            Ok(0) => return Err(Errno::PIPE),
            Ok(n) => filled += n,
            Err(Errno::INTR | Errno::AGAIN) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(word)
}

/// Polls `fds` until one of them reports an event, through interruptions: `TIMEDOUT` once
/// `until` has passed. (A monotonic clock read is a system call or the vDSO: no allocation,
/// no lock.)
fn poll_until(
    fds: &mut [rustix::event::PollFd<'_>],
    until: std::time::Instant,
) -> Result<(), Errno> {
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(Errno::TIMEDOUT);
        }
        let wait = rustix::event::Timespec {
            tv_sec: left.as_secs() as i64,
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        match rustix::event::poll(fds, Some(&wait)) {
            Ok(0) | Err(Errno::INTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Kills and reaps every child of the keeper (`/proc/thread-self/children`, read into the
/// stack: between fork and `exec`). The keeper has one thread, so its children are all there.
fn end_all_children() {
    let Ok(list) = rustix::fs::open(
        c"/proc/thread-self/children",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return;
    };
    let mut text = [0u8; 512];
    let mut len = 0;
    while len < text.len() {
        match rustix::io::read(&list, &mut text[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(Errno::INTR) => {}
            Err(_) => break,
        }
    }
    for pid in text[..len].split(|b| *b == b' ' || *b == b'\n') {
        let pid = pid.iter().try_fold(0i32, |n, d| match d {
            b'0'..=b'9' => n.checked_mul(10)?.checked_add(i32::from(d - b'0')),
            _ => None,
        });
        if let Some(pid) = pid.filter(|pid| *pid > 0) {
            end_child(pid);
        }
    }
}

/// Kills the keeper's child `child` and reaps it: a child in a namespace the worker's uid owns
/// can be stopped by a process of that uid, so none is left to end on its own.
fn end_child(child: i32) {
    let Some(pid) = rustix::process::Pid::from_raw(child) else {
        return;
    };
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    while let Err(Errno::INTR) =
        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
    {}
}

/// The keeper holds the write end of `go` open for as long as it lives: a hang-up means it
/// died before the parent-death signal was armed, and nobody would kill this process.
fn keeper_alive(go: &OwnedFd) -> StepResult {
    let mut fds = [rustix::event::PollFd::new(go, rustix::event::PollFlags::IN)];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).map_err(|e| (ConfinementStep::Synchronise, e))?;
    if fds[0].revents().contains(rustix::event::PollFlags::HUP) {
        return Err((ConfinementStep::Synchronise, Errno::SRCH));
    }
    Ok(())
}
