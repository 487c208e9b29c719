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
//! Identity: the worker's uid as the host sees it is never root. A root host maps the worker
//! to `nobody` (65534); an unprivileged host maps its own uid. Inside, the worker has the same
//! number, so it holds no capability in its namespace after `exec` either.

use std::ffi::CString;

use rustix::io::Errno;

/// The uid and gid a root host's workers run as: `nobody`/`nogroup`.
pub(crate) const NOBODY: u32 = 65534;

/// The namespaces a worker gets at once (its cgroup namespace comes later, once the keeper
/// has moved it into its cgroup).
pub(crate) const CLONE_FLAGS: i32 = libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// The namespace links the host compares with its own, with what each one proves.
pub(crate) const CHECKED_NAMESPACES: [&str; 6] = ["user", "pid", "mnt", "net", "ipc", "uts"];

/// Who the worker is, inside and out, and the maps that make it so.
#[derive(Clone, Debug)]
pub(crate) struct Identity {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// The host is root: the worker must switch to `uid`/`gid` itself after its mounts
    /// (it still holds the host's uid 0, unmapped, until then).
    pub(crate) host_is_root: bool,
    uid_map: CString,
    gid_map: CString,
}

impl Identity {
    /// The identity for a worker of this host.
    pub(crate) fn for_this_host() -> Self {
        let euid = rustix::process::geteuid().as_raw();
        let egid = rustix::process::getegid().as_raw();
        let host_is_root = euid == 0;
        let (uid, gid) = if host_is_root {
            (NOBODY, NOBODY)
        } else {
            (euid, egid)
        };
        let map = |id: u32| CString::new(format!("{id} {id} 1\n")).unwrap_or_default();
        Self {
            uid,
            gid,
            host_is_root,
            uid_map: map(uid),
            gid_map: map(gid),
        }
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

    /// Run by the worker after its mounts: becomes `uid`/`gid` with no supplementary group
    /// (a root host's groups would otherwise follow it).
    pub(crate) fn become_worker(&self) -> Result<(), Errno> {
        use rustix::process::{Gid, Uid};
        if !self.host_is_root {
            return Ok(());
        }
        rustix::thread::set_thread_groups(&[])?;
        let gid = Gid::from_raw(self.gid);
        let uid = Uid::from_raw(self.uid);
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

/// Writes `contents` to `/proc/<pid>/<name>` without allocating (the path is built on the
/// stack): it runs between fork and `exec`.
fn write_proc_file(pid: i32, name: &[u8], contents: &[u8]) -> Result<(), Errno> {
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
    let fd = rustix::fs::open(
        path,
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let written = rustix::io::write(&fd, contents)?;
    if written != contents.len() {
        return Err(Errno::IO);
    }
    Ok(())
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
