//! The worker's namespaces and the identity it has in them.
//!
//! The process the host forks (the *keeper*) creates the sandbox's init with one `clone`:
//! new user, PID, mount, network, IPC and UTS namespaces (init adds a cgroup namespace once
//! it is in its cgroup). Init, the host's own code, is PID 1 and never execs; it forks the
//! worker (PID 2). When init dies the kernel kills everything in the namespace, and nothing
//! there can name a process outside. The keeper stays outside, in the host's namespaces: it
//! writes the uid and gid maps (only a process outside a user namespace may map ids other
//! than its own), then waits and exits with the worker's status, so the host sees the
//! worker's end as its child's.
//!
//! Identity: the worker's uid as the host sees it is never root, and a root host gives each
//! `Host` a uid of its own for its workers ([`WORKER_UIDS`]; a replacement keeps it), which
//! inside the worker's namespace is `nobody` (65534); where the host's own user namespace does
//! not map that range (a container's), `nobody` outside too, shared. The kernel keeps some
//! budgets per uid for the whole machine (epoll watches, pipe pages): a worker that used up
//! a uid its siblings (or any `nobody` daemon) also ran as would take the budget from them; a
//! uid of its own, it takes only its own. The same uid owns the worker's user namespace, so
//! what the kernel charges up the chain of namespaces lands on it, not on root
//! ([`Identity::namespace_owner`]). An unprivileged host may map only its own uid, and
//! does, inside and out. Either way the worker holds no capability in its namespace after
//! `exec`. Its group is `nogroup` (65534) for a root host, the host's own otherwise.

use std::ffi::CString;

use rustix::io::Errno;

/// The uid a root host's worker has inside its user namespace, and the gid it has inside and
/// out: `nobody`/`nogroup`.
pub(crate) const NOBODY: u32 = 65534;

/// The uids a root host's workers run as, as seen from outside their namespaces: one for each
/// [`Host`](crate::Host) (its replacements keep it), in turn from a random start, so that no
/// two hosts of a process share one (until the range wraps) and two processes' hosts share one
/// only by chance. The range is one no distribution or systemd hands out: above systemd's
/// container ranges (`0x0008_0000..0x7000_0000`) and below its foreign-image range (from
/// `0x7FFE_0000`).
pub const WORKER_UIDS: std::ops::Range<u32> = 0x7000_0000..0x7FFE_0000;

/// The uid a new host's workers run as, seen from outside: for a root host the next of
/// [`WORKER_UIDS`] where its user namespace maps them all (the machine's does), else `nobody`,
/// shared by every such host (a container's namespace usually maps only the container's own
/// range); for an unprivileged host its own uid.
pub(crate) fn uid_for_a_new_hosts_workers() -> u32 {
    let euid = rustix::process::geteuid().as_raw();
    if euid != 0 {
        return euid;
    }
    static MAPPED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let mapped = *MAPPED.get_or_init(|| {
        std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|map| maps_all(&map, &WORKER_UIDS))
    });
    if mapped {
        next_worker_uid()
    } else {
        NOBODY
    }
}

/// Whether one line of a `uid_map` (`inside outside count`) maps every uid of `uids`.
fn maps_all(map: &str, uids: &std::ops::Range<u32>) -> bool {
    map.lines().any(|line| {
        let mut fields = line.split_whitespace().map(str::parse::<u64>);
        match (fields.next(), fields.next(), fields.next()) {
            (Some(Ok(inside)), Some(Ok(_outside)), Some(Ok(count))) => {
                inside <= u64::from(uids.start) && u64::from(uids.end) <= inside + count
            }
            _ => false,
        }
    })
}

/// The next uid of [`WORKER_UIDS`].
fn next_worker_uid() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
    let span = WORKER_UIDS.end - WORKER_UIDS.start;
    let next = NEXT.get_or_init(|| {
        // Without OS randomness every host starts at the range's start: its workers still get
        // a uid each, only more likely one another host's worker has too.
        let mut start = [0u8; 4];
        let _ = getrandom::fill(&mut start);
        AtomicU32::new(u32::from_le_bytes(start) % span)
    });
    WORKER_UIDS.start + next.fetch_add(1, Ordering::Relaxed) % span
}

/// The namespaces a worker gets at once (its cgroup namespace comes later, once the keeper
/// has moved it into its cgroup).
pub(crate) const CLONE_FLAGS: i32 = libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// The namespaces init is made in once it has joined a user namespace made before it.
pub(crate) const CLONE_FLAGS_BESIDE_USER: i32 = CLONE_FLAGS & !libc::CLONE_NEWUSER;

/// The namespace links the host compares with its own, with what each one proves.
pub(crate) const CHECKED_NAMESPACES: [&str; 6] = ["user", "pid", "mnt", "net", "ipc", "uts"];

/// Who the worker is, inside and out, and the maps that make it so.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    /// Its uid as the host sees it.
    pub(crate) uid: u32,
    /// Its gid, the same inside and out.
    pub(crate) gid: u32,
    /// The uid it switches to: inside its user namespace when it has one, else `uid` itself.
    own_uid: u32,
    /// The host is root: the worker must switch to `own_uid`/`gid` itself after its mounts
    /// (it still holds the host's uid 0, unmapped, until then).
    pub(crate) host_is_root: bool,
    /// Who must make the worker's user namespace, where not its host: see
    /// [`namespace_owner`](Self::namespace_owner).
    owner: Option<u32>,
    uid_map: CString,
    gid_map: CString,
}

impl Identity {
    /// The identity of a worker that runs as `worker_uid` as seen from outside
    /// ([`uid_for_a_new_hosts_workers`]), in user namespaces of its own when `namespaced`.
    pub(crate) fn for_worker(worker_uid: u32, namespaced: bool) -> Self {
        let euid = rustix::process::geteuid().as_raw();
        let egid = rustix::process::getegid().as_raw();
        let host_is_root = euid == 0;
        let (uid, gid, inside) = if host_is_root {
            (worker_uid, NOBODY, NOBODY)
        } else {
            (euid, egid, euid)
        };
        let map = |inside: u32, outside: u32| {
            CString::new(format!("{inside} {outside} 1\n")).unwrap_or_default()
        };
        Self {
            uid,
            gid,
            own_uid: if namespaced { inside } else { uid },
            host_is_root,
            owner: (host_is_root && namespaced && uid != NOBODY && set_uid_dumps_are_off())
                .then_some(uid),
            uid_map: map(inside, uid),
            gid_map: map(gid, gid),
        }
    }

    /// The uid that must own the worker's user namespace, where it is not the host's: a root
    /// host's worker uid of its own. The kernel charges what it counts per user (queued
    /// signals, message queues, inotify instances) to every namespace's owner up the chain as
    /// well as to the process's own uid, so a namespace made by root would charge root's
    /// budgets, shared by every root process of the machine, and one made by the worker's uid
    /// charges only that uid's. `None` for a shared `nobody` (a `nobody` process outside would
    /// own the namespace), for an unprivileged host (it owns the namespace anyway) and where
    /// `fs.suid_dumpable` is not 0 (see [`set_uid_dumps_are_off`]). The keeper hands the
    /// namespace over only where it can (it needs `CAP_SYS_ADMIN` and `CAP_SYS_PTRACE` to
    /// map, open and join a namespace it does not own, besides the `CAP_SETUID` any root host
    /// needs to map ids); otherwise root owns the namespace, as here.
    pub(crate) fn namespace_owner(&self) -> Option<u32> {
        self.owner
    }

    /// Adds the buffers this value owns (its maps) to `kept` (see `ChildPlan::footprint`).
    pub(crate) fn footprint(&self, kept: &mut super::host_memory::Kept) {
        let Self {
            uid: _,
            gid: _,
            own_uid: _,
            host_is_root: _,
            owner: _,
            uid_map,
            gid_map,
        } = self;
        kept.c_str(uid_map);
        kept.c_str(gid_map);
    }

    /// Run by the keeper once the worker exists: writes its maps. An unprivileged keeper may
    /// only map its own ids, and only after denying `setgroups` to the namespace.
    pub(crate) fn write_maps(&self, worker: i32) -> Result<(), Errno> {
        if !self.host_is_root {
            write_proc_file(worker, b"setgroups", b"deny")?;
        }
        write_proc_file(worker, b"uid_map", self.uid_map.as_bytes())?;
        write_proc_file(worker, b"gid_map", self.gid_map.as_bytes())
    }

    /// Run by the worker after its mounts: becomes its own uid and `gid` with no
    /// supplementary group (a root host's groups would otherwise follow it).
    pub(crate) fn become_worker(&self) -> Result<(), Errno> {
        use rustix::process::{Gid, Uid};
        if !self.host_is_root {
            return Ok(());
        }
        rustix::thread::set_thread_groups(&[])?;
        let gid = Gid::from_raw(self.gid);
        let uid = Uid::from_raw(self.own_uid);
        rustix::thread::set_thread_res_gid(gid, gid, gid)?;
        rustix::thread::set_thread_res_uid(uid, uid, uid)
    }
}

/// Sets `oom_score_adj` of `pid` (0: this process) to 1000, so that under memory pressure the
/// worker is the first process the kernel kills, never its host.
pub(crate) fn prefer_for_oom_kill(pid: i32) -> Result<(), Errno> {
    if pid == 0 {
        let fd = rustix::fs::open(
            c"/proc/self/oom_score_adj",
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        rustix::io::write(&fd, b"1000").map(|_| ())
    } else {
        write_proc_file(pid, b"oom_score_adj", b"1000")
    }
}

/// Whether the kernel makes a process that changed its uids undumpable
/// (`fs.suid_dumpable` 0, the default). Otherwise the keeper's memory, which the anchor
/// that makes a worker-owned namespace shares after a change of effective uid, could be
/// opened (`/proc/<pid>/mem`) by a process of the worker's uid.
fn set_uid_dumps_are_off() -> bool {
    std::fs::read_to_string("/proc/sys/fs/suid_dumpable").is_ok_and(|value| value.trim() == "0")
}

/// Makes this (single-threaded) process's effective uid `uid`, keeping root as its real and
/// saved uid so that it can become root again (`act_as(0)`). Between fork and `exec`.
pub(crate) fn act_as(uid: u32) -> Result<(), Errno> {
    use rustix::process::Uid;
    rustix::thread::set_thread_res_uid(Uid::ROOT, Uid::from_raw(uid), Uid::ROOT)
}

/// Opens `/proc/<pid>/ns/user`, to join that process's user namespace. Between fork and
/// `exec`.
pub(crate) fn open_user_namespace(pid: i32) -> Result<rustix::fd::OwnedFd, Errno> {
    open_proc_file(pid, b"ns/user", rustix::fs::OFlags::RDONLY)
}

/// Writes `contents` to `/proc/<pid>/<name>` without allocating (the path is built on the
/// stack): it runs between fork and `exec`.
fn write_proc_file(pid: i32, name: &[u8], contents: &[u8]) -> Result<(), Errno> {
    let fd = open_proc_file(pid, name, rustix::fs::OFlags::WRONLY)?;
    let written = rustix::io::write(&fd, contents)?;
    if written != contents.len() {
        return Err(Errno::IO);
    }
    Ok(())
}

/// Opens `/proc/<pid>/<name>` with `flags` (and close-on-exec) without allocating.
fn open_proc_file(
    pid: i32,
    name: &[u8],
    flags: rustix::fs::OFlags,
) -> Result<rustix::fd::OwnedFd, Errno> {
    let mut path = [0u8; 64];
    let mut len = 0;
    let mut push = |bytes: &[u8]| {
        for b in bytes {
            if len < path.len() - 1 {
                path[len] = *b;
                len += 1;
            }
        }
    };
    push(b"/proc/");
    let mut digits = [0u8; 10];
    push(decimal(pid.unsigned_abs(), &mut digits));
    push(b"/");
    push(name);
    let path = std::ffi::CStr::from_bytes_until_nul(&path[..=len]).map_err(|_| Errno::INVAL)?;
    rustix::fs::open(
        path,
        flags | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
}

/// `n` in decimal, written into `digits` without allocating (between fork and `exec`).
pub(crate) fn decimal(mut n: u32, digits: &mut [u8; 10]) -> &[u8] {
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &digits[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_uids_are_used_only_where_the_hosts_namespace_maps_them_all() {
        let range = WORKER_UIDS;
        assert!(maps_all("         0          0 4294967295\n", &range));
        // A container's namespace: its own 65,536 ids, or a range ending inside ours.
        assert!(!maps_all("         0     100000      65536\n", &range));
        assert!(!maps_all("0 0 1879048193\n", &range));
        assert!(maps_all(
            "0 0 100\n1879048192 1879048192 268304384\n",
            &range
        ));
        assert!(!maps_all("", &range));
    }

    #[test]
    fn a_root_hosts_workers_each_get_a_uid_of_their_own_in_the_range() {
        let uids: Vec<u32> = (0..1000).map(|_| next_worker_uid()).collect();
        assert!(uids.iter().all(|uid| WORKER_UIDS.contains(uid)));
        let distinct: std::collections::BTreeSet<_> = uids.iter().collect();
        assert_eq!(distinct.len(), uids.len());
    }
}
