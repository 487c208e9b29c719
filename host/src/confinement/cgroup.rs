//! A cgroup per worker, where the host may create one: a memory limit that counts what
//! rlimits cannot (shared memory, `memfd`s, tmpfs pages, kernel memory charged to the worker)
//! and a process limit for the whole namespace.
//!
//! The host may create one when it is root, or when its own cgroup v2 is delegated to it (its
//! `cgroup.subtree_control` enables the controllers and the directory is writable). Both
//! hierarchies are handled: cgroup v2 (`memory.max`, `pids.max`), or the v1 `memory` and
//! `pids` controllers mounted separately (`memory.limit_in_bytes`, `pids.max`). Elsewhere the
//! rlimits stand alone and [`ConfinementReport::cgroup`](crate::ConfinementReport::cgroup)
//! says so.
//!
//! The directories and the descriptors that join them are made before the fork; init joins
//! before it starts the worker, so the worker runs nothing outside its cgroup. Once the
//! worker is reaped, whatever is left in the cgroup is killed and the directories are
//! removed: in a PID namespace nothing is left (it died with the worker); without one, a
//! descendant that left the worker's process group still is, and dies there.
//!
//! How init joins decides how long a spawn takes. Moving a whole process (`cgroup.procs`)
//! takes the kernel's global lock on thread groups, whose write side waits for an RCU grace
//! period unless another move ended just before: 7–10 ms on a host that has not moved a
//! process for a moment. A single thread that moves itself (`0` written to a v1 `tasks`
//! file) skips that lock, and init is a single thread, so on v1 init moves itself that way,
//! in about 50 µs. v2 has no such file outside threaded subtrees: there the keeper moves
//! init by its pid, while init builds its root.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

/// How long a reaped worker's cgroup is waited for where the worker was reaped: one pass that
/// kills what is left, then removals [`PASS_GAP`] apart, until the directories go.
const IN_PLACE: std::time::Duration = std::time::Duration::from_millis(100);

/// How many more passes a thread of its own makes, before the cgroup is left behind (with a
/// warning).
const REMOVAL_PASSES: usize = 500;

/// The time between two passes.
const PASS_GAP: std::time::Duration = std::time::Duration::from_millis(2);

/// A worker's cgroup directories (one for v2, one per controller for v1), each with the
/// hierarchy `/proc/<pid>/cgroup` names it by (`""` for v2, else the v1 controller).
#[derive(Debug)]
pub(crate) struct WorkerCgroup {
    dirs: Vec<(PathBuf, &'static str)>,
}

/// The descriptors that move init (and so the worker it starts) into the cgroup.
pub(crate) struct CgroupJoin {
    /// v2 `cgroup.procs`: the keeper writes init's pid.
    by_pid: Vec<OwnedFd>,
    /// v1 `tasks`, one per controller: init writes `0`, moving its own (only) thread.
    by_self: Vec<OwnedFd>,
}

/// Where new cgroups can go: a v2 directory, or v1 `memory` and `pids` directories.
enum Parent {
    V2(PathBuf),
    V1 { memory: PathBuf, pids: PathBuf },
}

/// The mount points of cgroup filesystems, from `/proc/self/mountinfo`: `(path, fstype,
/// super options)`.
fn cgroup_mounts() -> Vec<(PathBuf, String, String)> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            let mut right = right.split_whitespace();
            let fstype = right.next()?;
            let _source = right.next()?;
            let options = right.next().unwrap_or("");
            (fstype == "cgroup" || fstype == "cgroup2").then(|| {
                (
                    PathBuf::from(mount_point),
                    fstype.to_string(),
                    options.to_string(),
                )
            })
        })
        .collect()
}

/// The cgroup path in hierarchy `controller` (`""` for v2, else a v1 controller) that `text`,
/// a `/proc/<pid>/cgroup` file, gives.
fn cgroup_in<'t>(text: &'t str, controller: &str) -> Option<&'t str> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        let matches = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matches.then_some(path)
    })
}

/// This process's own cgroup path in hierarchy `controller` (`""` for v2, else a controller).
fn own_cgroup(controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_in(&text, controller).map(|path| PathBuf::from(path.trim_start_matches('/')))
}

fn writable_dir(path: &Path) -> bool {
    rustix::fs::access(
        path,
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    )
    .is_ok()
}

fn find_parent() -> Option<Parent> {
    let mounts = cgroup_mounts();
    // cgroup v2 with both controllers delegated to our own cgroup.
    if let Some((mount, _, _)) = mounts.iter().find(|(_, t, _)| t == "cgroup2") {
        if let Some(own) = own_cgroup("") {
            let dir = mount.join(own);
            let enabled =
                std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
            let has = |c: &str| enabled.split_whitespace().any(|e| e == c);
            if has("memory") && has("pids") && writable_dir(&dir) {
                return Some(Parent::V2(dir));
            }
        }
    }
    // cgroup v1 memory and pids controllers.
    let v1 = |controller: &str| -> Option<PathBuf> {
        let (mount, _, _) = mounts
            .iter()
            .find(|(_, t, o)| t == "cgroup" && o.split(',').any(|c| c == controller))?;
        let dir = mount.join(own_cgroup(controller)?);
        writable_dir(&dir).then_some(dir)
    };
    Some(Parent::V1 {
        memory: v1("memory")?,
        pids: v1("pids")?,
    })
}

/// How old an empty `airlock-*` cgroup must be before a host removes it as left behind by a
/// host that died (younger ones may be another host's, about to be joined).
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Once per process: removes empty `airlock-*` cgroups older than [`STALE_AFTER`] under
/// `parent`, left by hosts that were killed before they could. The kernel refuses to remove
/// one that still holds a task, so a live worker's is never touched.
fn sweep_once(parent: &Parent) {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        let dirs: Vec<&Path> = match parent {
            Parent::V2(dir) => vec![dir],
            Parent::V1 { memory, pids } => vec![memory, pids],
        };
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let stale = entry.file_name().to_string_lossy().starts_with("airlock-")
                    && entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > STALE_AFTER);
                if stale {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
    });
}

fn random_name() -> Option<OsString> {
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).ok()?;
    Some(OsString::from(format!(
        "airlock-{}",
        random
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )))
}

impl WorkerCgroup {
    /// Creates a cgroup with `memory` bytes and `processes` tasks at most, if this host may;
    /// `None` where it may not (the rlimits then stand alone).
    pub(crate) fn create(
        memory: Option<u64>,
        processes: Option<u64>,
    ) -> Option<(Self, CgroupJoin)> {
        let name = random_name()?;
        let parent = find_parent()?;
        sweep_once(&parent);
        type Dirs = Vec<(PathBuf, &'static str)>;
        let (dirs, settings): (Dirs, Vec<(PathBuf, String)>) = match parent {
            Parent::V2(parent) => {
                let dir = parent.join(&name);
                let mut settings = Vec::new();
                if let Some(bytes) = memory {
                    settings.push((dir.join("memory.max"), bytes.to_string()));
                    settings.push((dir.join("memory.swap.max"), "0".to_string()));
                }
                if let Some(n) = processes {
                    settings.push((dir.join("pids.max"), n.to_string()));
                }
                (vec![(dir, "")], settings)
            }
            Parent::V1 { memory: m, pids } => {
                let (mdir, pdir) = (m.join(&name), pids.join(&name));
                let mut settings = Vec::new();
                if let Some(bytes) = memory {
                    settings.push((mdir.join("memory.limit_in_bytes"), bytes.to_string()));
                    // Memory plus swap, where swap is accounted: the worker cannot swap past
                    // its limit. (Set after the memory limit, which it may not be below.)
                    settings.push((mdir.join("memory.memsw.limit_in_bytes"), bytes.to_string()));
                }
                if let Some(n) = processes {
                    settings.push((pdir.join("pids.max"), n.to_string()));
                }
                (vec![(mdir, "memory"), (pdir, "pids")], settings)
            }
        };
        let cgroup = Self { dirs: Vec::new() };
        let mut cgroup = cgroup;
        for (dir, hierarchy) in dirs {
            std::fs::create_dir(&dir).ok()?;
            cgroup.dirs.push((dir, hierarchy));
        }
        for (file, value) in settings {
            // A setting that does not exist (no swap accounting) is not a reason to go
            // without the rest; one that exists and refuses the value is.
            match std::fs::write(&file, value) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => return None,
            }
        }
        let mut join = CgroupJoin {
            by_pid: Vec::new(),
            by_self: Vec::new(),
        };
        for (dir, hierarchy) in &cgroup.dirs {
            let (file, list) = match *hierarchy {
                "" => ("cgroup.procs", &mut join.by_pid),
                _ => ("tasks", &mut join.by_self),
            };
            let fd = rustix::fs::open(
                dir.join(file),
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .ok()?;
            list.push(fd);
        }
        Some((cgroup, join))
    }

    /// Whether process `pid` is in this cgroup (every hierarchy), read from
    /// `/proc/<pid>/cgroup` by the host.
    pub(crate) fn holds(&self, pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|text| self.holds_in(&text))
    }

    /// Whether `text`, a `/proc/<pid>/cgroup` file, puts the process in each directory, each
    /// in its own hierarchy's line: v1 directories share one name, so the name on any line
    /// would let a process that joined the `pids` cgroup alone pass for one under the memory
    /// limit too.
    fn holds_in(&self, text: &str) -> bool {
        self.dirs.iter().all(|(dir, hierarchy)| {
            let name = dir.file_name().and_then(|n| n.to_str());
            let found = cgroup_in(text, hierarchy).and_then(|path| path.rsplit('/').next());
            name.is_some_and(|name| found == Some(name))
        })
    }

    /// Kills every process left in the cgroup and removes the directories. Called once the
    /// worker is reaped. One pass kills what is left; then the directories are waited for here
    /// for up to [`IN_PLACE`]: they go as soon as the worker's last processes have left them,
    /// so when this returns, a worker whose PID namespace died with it is gone, not still
    /// exiting. What resists longer (a worker without namespaces that left processes behind)
    /// is finished on a thread of its own (`airlock-cgroup`), so that it cannot hold up the
    /// host's task that reaped the worker any longer.
    pub(crate) fn remove(&mut self) {
        // A cgroup with no directories is dropped without coming back here.
        if self.dirs.is_empty() {
            return;
        }
        let mut left = Self {
            dirs: std::mem::take(&mut self.dirs),
        };
        if left.removal_pass() {
            return;
        }
        // Only removals from here on, which cost a system call each whatever the worker left:
        // a process that ignores its SIGKILL for a while (asleep in the kernel) cannot make
        // every wait here pay for the kill pass's reads of `/proc`.
        let in_place_until = std::time::Instant::now() + IN_PLACE;
        while std::time::Instant::now() + PASS_GAP < in_place_until {
            std::thread::sleep(PASS_GAP);
            if left.remove_dirs() {
                return;
            }
        }
        // Handed over once the thread runs, so that without one it is finished here.
        let (hand_over, handed) = std::sync::mpsc::channel::<Self>();
        let spawned = std::thread::Builder::new()
            .name("airlock-cgroup".into())
            .spawn(move || {
                if let Ok(left) = handed.recv() {
                    left.finish_removal();
                }
            });
        match spawned {
            Ok(_) => {
                if let Err(std::sync::mpsc::SendError(left)) = hand_over.send(left) {
                    left.finish_removal();
                }
            }
            // A host that cannot start a thread finishes here: killing what the worker left
            // matters more than the second or so this holds up the task that reaped it.
            Err(_) => left.finish_removal(),
        }
    }

    /// One pass: kills what is left, then tries to remove every directory; true once all are.
    fn removal_pass(&mut self) -> bool {
        self.kill_members();
        self.remove_dirs()
    }

    /// Tries to remove every directory; true once all are. The kernel refuses to remove one
    /// while a task is still leaving it.
    fn remove_dirs(&mut self) -> bool {
        self.dirs.retain(|(dir, _)| match std::fs::remove_dir(dir) {
            Ok(()) => false,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        });
        self.dirs.is_empty()
    }

    /// Passes [`REMOVAL_PASSES`] times at most, until the directories are gone;
    /// leaves none to its drop.
    fn finish_removal(mut self) {
        for _ in 0..REMOVAL_PASSES {
            std::thread::sleep(PASS_GAP);
            if self.removal_pass() {
                return;
            }
        }
        tracing::warn!(
            target: "airlock::confinement",
            "a worker's cgroup could not be emptied and removed: {:?}",
            self.dirs
        );
        self.dirs.clear();
    }

    /// SIGKILLs every process in the cgroup. In a PID namespace nothing is left once the
    /// worker is reaped (the namespace died with it); without one, a descendant that left the
    /// worker's process group is still here, as no process of the worker may leave its
    /// cgroup (the files are the host's). v2 asks the kernel (`cgroup.kill`, which also
    /// catches processes forked meanwhile); v1, or a kernel before 5.14, kills each process
    /// listed. So that a pass cannot be outrun by forks made while it kills, the cgroup's
    /// process limit is first set to 0 (the kernel takes a limit below the count): a fork
    /// that began before that is caught by the next pass, and none begins after it.
    fn kill_members(&self) {
        if let Some((dir, _)) = self.dirs.iter().find(|(_, hierarchy)| hierarchy.is_empty()) {
            if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
                return;
            }
        }
        // The directory that counts processes (v2's, or v1's `pids`).
        let counting = self
            .dirs
            .iter()
            .find(|(_, hierarchy)| matches!(*hierarchy, "" | "pids"));
        if let Some((dir, _)) = counting {
            let _ = std::fs::write(dir.join("pids.max"), "0");
        }
        // Every process is in every directory (init joins them all before the worker runs,
        // and none may leave), so one listing names them all: the counting one where there
        // is one, whose limit keeps it short.
        let Some((listed, _)) = counting.or(self.dirs.first()) else {
            return;
        };
        let Ok(members) = std::fs::read_to_string(listed.join("cgroup.procs")) else {
            return;
        };
        for pid in members.lines().filter_map(|line| line.parse::<i32>().ok()) {
            self.kill_member(pid);
        }
    }

    /// Kills process `pid` if a thread of it is in this cgroup. The pidfd is opened before the
    /// check, so the process signalled is the one checked: if it ended since (and its pid went
    /// to a process elsewhere), the signal goes nowhere.
    fn kill_member(&self, pid: i32) {
        let Some(pid) = rustix::process::Pid::from_raw(pid) else {
            return;
        };
        let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        else {
            return;
        };
        if self.holds_a_thread_of(pid.as_raw_nonzero().get().unsigned_abs()) {
            let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
        }
    }

    /// Whether any thread of process `pid` is in this cgroup (`/proc/<pid>/task/*/cgroup`).
    /// Not `/proc/<pid>/cgroup` alone: on v1, once a process's first thread has exited, that
    /// file names the root of every hierarchy while its other threads still run here.
    fn holds_a_thread_of(&self, pid: u32) -> bool {
        let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        threads.flatten().any(|thread| {
            std::fs::read_to_string(thread.path().join("cgroup"))
                .is_ok_and(|text| self.holds_in(&text))
        })
    }
}

impl Drop for WorkerCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

impl CgroupJoin {
    /// Adds the buffers this value owns to `kept` (see `ChildPlan::footprint`).
    pub(crate) fn footprint(&self, kept: &mut super::host_memory::Kept) {
        let Self { by_pid, by_self } = self;
        kept.slice(by_pid);
        kept.slice(by_self);
    }

    /// Moves process `pid` into the directories joined by pid (v2), from its parent. Writes
    /// the decimal pid from a stack buffer: it runs between fork and `exec`.
    pub(crate) fn join_by_pid(&self, pid: i32) -> Result<(), Errno> {
        let mut digits = [0u8; 10];
        let pid = super::namespaces::decimal(pid.unsigned_abs(), &mut digits);
        for fd in &self.by_pid {
            rustix::io::write(fd, pid)?;
        }
        Ok(())
    }

    /// Moves the calling thread into the directories it joins itself (v1). The caller must be
    /// a single-threaded process, so that the thread is the whole process: init, or a forked
    /// child confining itself in place.
    pub(crate) fn join_self(&self) -> Result<(), Errno> {
        for fd in &self.by_self {
            rustix::io::write(fd, b"0")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 worker that joined its `pids` cgroup but not its `memory` one runs without its
    /// memory limit: it is not taken for one in both.
    #[test]
    fn a_worker_in_one_v1_hierarchy_is_not_in_its_cgroup() {
        let name = "airlock-00112233";
        let cgroup = WorkerCgroup {
            dirs: vec![
                (
                    PathBuf::from(format!("/nonexistent/memory/host/{name}")),
                    "memory",
                ),
                (PathBuf::from(format!("/nonexistent/pids/{name}")), "pids"),
            ],
        };
        let pids_only = format!("8:pids:/{name}\n4:memory:/host\n0::/\n");
        // The name is there, on the other hierarchy's line.
        assert!(pids_only.lines().any(|l| l.ends_with(&format!("/{name}"))));
        assert!(!cgroup.holds_in(&pids_only));
        let memory_only = format!("8:pids:/\n4:memory:/host/{name}\n0::/\n");
        assert!(!cgroup.holds_in(&memory_only));
        let both = format!("8:pids:/{name}\n4:memory:/host/{name}\n0::/\n");
        assert!(cgroup.holds_in(&both));
    }

    /// A v2 cgroup is found on the v2 line (`0::`), not on a v1 controller's.
    #[test]
    fn a_v2_cgroup_is_read_from_the_unified_line() {
        let name = "airlock-44556677";
        let cgroup = WorkerCgroup {
            dirs: vec![(PathBuf::from(format!("/nonexistent/unified/{name}")), "")],
        };
        assert!(!cgroup.holds_in(&format!("4:memory:/{name}\n0::/host\n")));
        assert!(cgroup.holds_in(&format!("4:memory:/\n0::/host/{name}\n")));
    }
}
