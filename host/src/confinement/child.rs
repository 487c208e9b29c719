//! What runs between fork and `exec`: the keeper creates the worker in its namespaces, the
//! worker builds its root and locks itself down, in this order:
//!
//! ```text
//! host ──fork──▶ keeper ──clone(CLONE_NEW*)──▶ worker (PID 1 of its namespace)
//!                  │ write uid/gid maps            │ parent-death signal, wait for "go"
//!                  │ "go", report the worker's pid │ copy granted paths (open_tree)
//!                  │ close every descriptor        │ become uid/gid (root host: nobody)
//!                  │ wait, exit with its status    │ build root, pivot_root, read-only
//!                  ▼                               │ hostname, session, rlimits
//!                                                  │ drop capabilities, no_new_privs
//!                                                  │ Landlock, seccomp
//!                                                  ▼ exec
//! ```
//!
//! Only system calls run here, on memory prepared before the first fork (see `plan`); a
//! failing step writes `(step, errno)` to the report pipe so the host can name it.

use std::os::fd::{AsRawFd, OwnedFd};

use rustix::io::Errno;

use super::error::ConfinementStep;
use super::plan::{ChildPlan, REPORT_ERROR, REPORT_PID};

type StepResult = Result<(), (ConfinementStep, Errno)>;

impl ChildPlan {
    /// The closure body run in the forked child before `exec`.
    pub(crate) fn run(&mut self) -> std::io::Result<()> {
        let result = if self.namespaced {
            self.keep()
        } else {
            self.confine_in_place()
        };
        result.map_err(|(step, errno)| {
            self.report(REPORT_ERROR, step.code(), errno.raw_os_error());
            std::io::Error::from_raw_os_error(errno.raw_os_error())
        })
    }

    fn report(&self, kind: u8, step: u8, value: i32) {
        let v = value.to_le_bytes();
        let record = [kind, step, 0, 0, v[0], v[1], v[2], v[3]];
        let _ = rustix::io::write(&self.report, &record);
    }

    /// The keeper: creates the worker, maps its ids, lets it go, reports its pid, then stays
    /// as its parent until it ends. Returns only in the worker, or on failure.
    fn keep(&mut self) -> StepResult {
        let pid = crate::sys::clone_into_namespaces(super::namespaces::CLONE_FLAGS)
            .map_err(|e| (ConfinementStep::CreateNamespaces, e))?;
        if pid == 0 {
            return self.worker();
        }
        self.identity
            .write_maps(pid)
            .map_err(|e| (ConfinementStep::MapIdentity, e))?;
        if let Some(cgroup) = &self.cgroup {
            cgroup.join(pid).map_err(|e| (ConfinementStep::Cgroup, e))?;
        }
        // Under memory pressure the kernel kills the worker before its host.
        super::namespaces::prefer_for_oom_kill(pid)
            .map_err(|e| (ConfinementStep::MapIdentity, e))?;
        let go = self.go_write.take();
        if let Some(go) = &go {
            rustix::io::write(go, b"g").map_err(|e| (ConfinementStep::Synchronise, e))?;
        }
        self.report(REPORT_PID, 0, pid);
        // Nothing of the host's stays open here: not the channel, not stdio (so the worker's
        // exit is the end of its streams), not the report pipe. Only `go`, whose closing tells
        // the worker the keeper is gone.
        let keep_fd = go.as_ref().map(|fd| fd.as_raw_fd()).unwrap_or(-1);
        crate::sys::close_all_but(keep_fd);
        // The keeper is a copy of the host: if it ever dumped core (it re-raises the signal
        // that killed the worker), the dump would hold the host's memory.
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Core,
            rustix::process::Rlimit {
                current: Some(0),
                maximum: Some(0),
            },
        );
        let _ =
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
        loop {
            match rustix::process::waitpid(
                rustix::process::Pid::from_raw(pid),
                rustix::process::WaitOptions::empty(),
            ) {
                Ok(Some((_, status))) => {
                    if let Some(code) = status.exit_status() {
                        crate::sys::exit_now(code);
                    }
                    if let Some(signal) = status.terminating_signal() {
                        crate::sys::die_by_signal(signal);
                    }
                }
                Err(Errno::INTR) => continue,
                _ => crate::sys::exit_now(127),
            }
        }
    }

    /// The worker, PID 1 of its namespaces, still running the host's code.
    fn worker(&mut self) -> StepResult {
        use ConfinementStep::Synchronise;
        self.go_write = None;
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
            .map_err(|e| (Synchronise, e))?;
        let Some(go) = self.go_read.take() else {
            return Err((Synchronise, Errno::BADF));
        };
        let mut byte = [0u8; 1];
        match rustix::io::read(&go, &mut byte) {
            Ok(1) => {}
            Ok(_) => return Err((Synchronise, Errno::PIPE)),
            Err(e) => return Err((Synchronise, e)),
        }
        keeper_alive(&go)?;
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
        super::process::own_session()?;
        self.limits.apply()?;
        super::process::drop_capabilities()?;
        self.lock_down(true)
    }

    /// Without namespaces (best effort): the forked child confines itself in place.
    fn confine_in_place(&mut self) -> StepResult {
        if let Some(cgroup) = &self.cgroup {
            cgroup
                .join(rustix::process::getpid().as_raw_nonzero().get())
                .map_err(|e| (ConfinementStep::Cgroup, e))?;
        }
        self.limits.apply()?;
        // A root host still holds CAP_SETPCAP here: the bounding set goes before the uid.
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
        super::namespaces::prefer_for_oom_kill(0)
            .map_err(|e| (ConfinementStep::ResourceLimits, e))?;
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
