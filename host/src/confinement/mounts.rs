//! The worker's root: a fresh tmpfs holding only what the worker program needs to run, its own
//! `/proc`, a private `/tmp`, a few device nodes and the paths the policy grants, then made
//! read-only. Like bubblewrap's `--ro-bind`/`--proc`/`--dev`/`--tmpfs`, built in the worker's
//! new mount namespace and entered with `pivot_root`.
//!
//! Everything is prepared in the host ([`MountTable::new`]): every path the child names is a
//! `CString` allocated before the fork. In the child ([`MountTable::copy_sources`],
//! [`MountTable::build_and_enter`]) only system calls run. Granted paths are copied with
//! `open_tree(OPEN_TREE_CLONE)` *before* anything is mounted, while the host's whole tree is
//! still visible, then attached with `move_mount`: the staging tmpfs may cover a granted path
//! (it is mounted on `/tmp`) without hiding it.

use std::collections::BTreeSet;
use std::ffi::{CString, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, StatVfsMountFlags, CWD};
use rustix::io::Errno;
use rustix::mount::{
    MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags,
};

use super::error::{ConfinementError, ConfinementStep};

/// Where the new root is assembled, in the worker's own mount namespace (invisible to the
/// host): any directory that exists everywhere will do.
const STAGE: &str = "/tmp";

/// System trees a dynamically linked program needs. Each is bound read-only if it is a
/// directory and recreated as the same symlink if it is one (merged-`/usr` systems).
pub(crate) const SYSTEM_TREES: [&str; 8] = [
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
    "/etc/ld.so.cache",
];

/// Device nodes every program may expect; bound from the host's `/dev`.
pub(crate) const DEVICES: [&str; 5] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// `/dev` links into the worker's own `/proc`.
const DEV_LINKS: [(&str, &str); 4] = [
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
];

/// Size of the root tmpfs, which holds only empty directories and mount points.
const ROOT_OPTIONS: &str = "mode=0755,size=1m,nr_inodes=4096";

/// A host path the worker sees at the same path.
struct Bind {
    /// The host path (canonical).
    source: CString,
    /// The staged mount point.
    target: CString,
    /// Ancestors of `target` to create first, outermost first.
    ancestors: Vec<CString>,
    is_dir: bool,
    writable: bool,
    /// What the source must still be (see [`Grant::identity`]).
    identity: Option<(u64, u64)>,
    /// The copy taken by `copy_sources`.
    tree: Option<OwnedFd>,
}

/// A path the worker sees, as the host resolved it.
#[derive(Clone, Debug)]
pub(crate) struct Grant {
    /// Canonical host path.
    pub(crate) path: PathBuf,
    /// Readable and writable (else read-only).
    pub(crate) writable: bool,
    /// A directory (else a file).
    pub(crate) is_dir: bool,
    /// The `(dev, ino)` it must still name (pinned at the first spawn), if any.
    pub(crate) identity: Option<(u64, u64)>,
}

/// Everything the child needs to build the worker's root and enter it.
pub(crate) struct MountTable {
    binds: Vec<Bind>,
    /// Staged directories to create before any bind (`/proc`, `/tmp`, `/dev`).
    dirs: Vec<CString>,
    links: Vec<(CString, CString)>,
    stage: CString,
    root_options: CString,
    proc_target: CString,
    tmp_target: CString,
    tmp_options: CString,
    cwd: CString,
}

fn cstring(bytes: &[u8]) -> Result<CString, Errno> {
    CString::new(bytes).map_err(|_| Errno::INVAL)
}

fn staged(path: &Path) -> Result<CString, Errno> {
    let mut bytes = STAGE.as_bytes().to_vec();
    bytes.extend_from_slice(path.as_os_str().as_bytes());
    cstring(&bytes)
}

/// The proper ancestors of `path` below the root, outermost first, staged.
fn staged_ancestors(path: &Path) -> Result<Vec<CString>, Errno> {
    let mut ancestors: Vec<&Path> = path
        .ancestors()
        .skip(1)
        .filter(|a| a.as_os_str().len() > 1)
        .collect();
    ancestors.reverse();
    ancestors.into_iter().map(staged).collect()
}

impl MountTable {
    /// Adds every buffer this table owns to `kept` (see `ChildPlan::footprint`).
    pub(crate) fn footprint(&self, kept: &mut super::host_memory::Kept) {
        let Self {
            binds,
            dirs,
            links,
            stage,
            root_options,
            proc_target,
            tmp_target,
            tmp_options,
            cwd,
        } = self;
        kept.slice(binds);
        for bind in binds {
            let Bind {
                source,
                target,
                ancestors,
                is_dir: _,
                writable: _,
                identity: _,
                tree: _,
            } = bind;
            kept.c_str(source);
            kept.c_str(target);
            kept.c_strings(ancestors);
        }
        kept.c_strings(dirs);
        kept.slice(links);
        for (link, target) in links {
            kept.c_str(link);
            kept.c_str(target);
        }
        for string in [
            stage,
            root_options,
            proc_target,
            tmp_target,
            tmp_options,
            cwd,
        ] {
            kept.c_str(string);
        }
    }

    /// The mount plan for `grants` (the policy's paths and the worker program), the system
    /// trees, `/dev`, `/proc` and a `/tmp` of `tmp_size` bytes, entering `cwd`.
    pub(crate) fn new(
        grants: &[Grant],
        tmp_size: u64,
        cwd: &Path,
    ) -> Result<Self, ConfinementError> {
        let invalid = |path: &Path| ConfinementError::Path {
            path: path.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        };
        let mut all: Vec<Grant> = Vec::new();
        let mut links = Vec::new();
        for tree in SYSTEM_TREES {
            let path = Path::new(tree);
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    let target =
                        std::fs::read_link(path).map_err(|source| ConfinementError::Path {
                            path: path.to_path_buf(),
                            source,
                        })?;
                    links.push((
                        cstring(target.as_os_str().as_bytes()).map_err(|_| invalid(path))?,
                        staged(path).map_err(|_| invalid(path))?,
                    ));
                }
                Ok(meta) => all.push(Grant {
                    path: path.to_path_buf(),
                    writable: false,
                    is_dir: meta.is_dir(),
                    identity: None,
                }),
                Err(_) => {}
            }
        }
        for device in DEVICES {
            all.push(Grant {
                path: PathBuf::from(device),
                writable: true,
                is_dir: false,
                identity: None,
            });
        }
        // A grant inside a tree already bound with the same access adds nothing.
        for grant in grants {
            let covered = all.iter().any(|g| {
                g.is_dir && g.writable == grant.writable && grant.path.starts_with(&g.path)
            });
            if !covered {
                all.push(grant.clone());
            }
        }
        // Parents before children, so a grant nested in another is mounted on top of it.
        all.sort_by(|a, b| a.path.cmp(&b.path));
        let mut binds = Vec::with_capacity(all.len());
        for grant in &all {
            let bad = || invalid(&grant.path);
            binds.push(Bind {
                source: cstring(grant.path.as_os_str().as_bytes()).map_err(|_| bad())?,
                target: staged(&grant.path).map_err(|_| bad())?,
                ancestors: staged_ancestors(&grant.path).map_err(|_| bad())?,
                is_dir: grant.is_dir,
                writable: grant.writable,
                identity: grant.identity,
                tree: None,
            });
        }
        for (target, link) in DEV_LINKS {
            links.push((
                cstring(target.as_bytes()).map_err(|_| invalid(Path::new(link)))?,
                staged(Path::new(link)).map_err(|_| invalid(Path::new(link)))?,
            ));
        }
        let dirs: BTreeSet<&str> = ["/proc", "/tmp", "/dev"].into_iter().collect();
        let dirs = dirs
            .into_iter()
            .map(|d| staged(Path::new(d)))
            .collect::<Result<_, _>>()
            .map_err(|_| invalid(Path::new(STAGE)))?;
        let cwd_c = cstring(cwd.as_os_str().as_bytes()).map_err(|_| invalid(cwd))?;
        Ok(Self {
            binds,
            dirs,
            links,
            stage: cstring(STAGE.as_bytes()).map_err(|_| invalid(Path::new(STAGE)))?,
            root_options: cstring(ROOT_OPTIONS.as_bytes()).map_err(|_| invalid(Path::new("/")))?,
            proc_target: staged(Path::new("/proc")).map_err(|_| invalid(Path::new("/proc")))?,
            tmp_target: staged(Path::new("/tmp")).map_err(|_| invalid(Path::new("/tmp")))?,
            // Inodes are bounded too: empty files cost kernel memory that no size counts.
            tmp_options: cstring(
                format!(
                    "mode=1777,size={tmp_size},nr_inodes={}",
                    (tmp_size / 16384).max(1024)
                )
                .as_bytes(),
            )
            .map_err(|_| invalid(Path::new("/tmp")))?,
            cwd: cwd_c,
        })
    }

    /// In the child, in its new mount namespace, before anything is mounted: takes a detached
    /// copy of every path the worker will see.
    pub(crate) fn copy_sources(&mut self) -> Result<(), (ConfinementStep, Errno)> {
        for bind in &mut self.binds {
            let tree = rustix::mount::open_tree(
                CWD,
                bind.source.as_c_str(),
                OpenTreeFlags::OPEN_TREE_CLONE
                    | OpenTreeFlags::OPEN_TREE_CLOEXEC
                    | OpenTreeFlags::AT_RECURSIVE,
            )
            .map_err(|e| (ConfinementStep::CopyPath, e))?;
            if let Some((dev, ino)) = bind.identity {
                let found = rustix::fs::fstat(&tree).map_err(|e| (ConfinementStep::CopyPath, e))?;
                if found.st_dev != dev || found.st_ino != ino {
                    // The path names something else than it did: refuse, never follow.
                    return Err((ConfinementStep::CopyPath, Errno::XDEV));
                }
            }
            bind.tree = Some(tree);
        }
        Ok(())
    }

    /// In the child, as the worker's identity: builds the new root, enters it, makes it
    /// read-only and enters the working directory.
    pub(crate) fn build_and_enter(&mut self) -> Result<(), (ConfinementStep, Errno)> {
        use ConfinementStep::{BuildRoot, PivotRoot, ReadOnly, WorkingDirectory};
        let build = |e| (BuildRoot, e);
        // Nothing mounted from here on propagates back to the host's namespace.
        rustix::mount::mount_change(
            c"/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        )
        .map_err(build)?;
        rustix::mount::mount(
            c"tmpfs",
            self.stage.as_c_str(),
            c"tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            self.root_options.as_c_str(),
        )
        .map_err(build)?;
        for dir in &self.dirs {
            mkdir_existing_ok(dir).map_err(build)?;
        }
        rustix::mount::mount(
            c"proc",
            self.proc_target.as_c_str(),
            c"proc",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            None,
        )
        .map_err(build)?;
        rustix::mount::mount(
            c"tmpfs",
            self.tmp_target.as_c_str(),
            c"tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            self.tmp_options.as_c_str(),
        )
        .map_err(build)?;
        for (target, link) in &self.links {
            match rustix::fs::symlink(target.as_c_str(), link.as_c_str()) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(build(e)),
            }
        }
        for bind in &mut self.binds {
            for ancestor in &bind.ancestors {
                mkdir_existing_ok(ancestor).map_err(build)?;
            }
            if bind.is_dir {
                mkdir_existing_ok(&bind.target).map_err(build)?;
            } else {
                match rustix::fs::open(
                    bind.target.as_c_str(),
                    OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                ) {
                    Ok(_) | Err(Errno::EXIST) | Err(Errno::ROFS) => {}
                    Err(e) => return Err(build(e)),
                }
            }
            let Some(tree) = bind.tree.take() else {
                return Err(build(Errno::BADF));
            };
            rustix::mount::move_mount(
                &tree,
                c"",
                CWD,
                bind.target.as_c_str(),
                MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
            )
            .map_err(build)?;
            drop(tree);
            let readonly = if bind.writable {
                MountFlags::empty()
            } else {
                MountFlags::RDONLY
            };
            remount_keeping_locked_flags(&bind.target, readonly | MountFlags::NOSUID)
                .map_err(|e| (ReadOnly, e))?;
        }
        // Enter the new root; the old one is stacked under it and detached at once.
        rustix::process::chdir(self.stage.as_c_str()).map_err(|e| (PivotRoot, e))?;
        rustix::process::pivot_root(c".", c".").map_err(|e| (PivotRoot, e))?;
        rustix::mount::unmount(c".", UnmountFlags::DETACH).map_err(|e| (PivotRoot, e))?;
        rustix::process::chdir(c"/").map_err(|e| (PivotRoot, e))?;
        rustix::mount::mount_remount(
            c"/",
            MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
            c"",
        )
        .map_err(|e| (ReadOnly, e))?;
        rustix::process::chdir(self.cwd.as_c_str()).map_err(|e| (WorkingDirectory, e))?;
        Ok(())
    }
}

fn mkdir_existing_ok(path: &CString) -> Result<(), Errno> {
    match rustix::fs::mkdir(path.as_c_str(), Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(Errno::EXIST) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Remounts the bind mount at `target` with `extra` flags added to those it has. A mount
/// copied from a more privileged namespace has its flags locked: a remount that would clear
/// one (`nodev`, `noexec`, an atime flag) is refused, so every flag it has is kept.
fn remount_keeping_locked_flags(target: &CString, extra: MountFlags) -> Result<(), Errno> {
    let current = rustix::fs::statvfs(target.as_c_str())?.f_flag;
    let mut flags = MountFlags::BIND | extra;
    for (have, keep) in [
        (StatVfsMountFlags::RDONLY, MountFlags::RDONLY),
        (StatVfsMountFlags::NODEV, MountFlags::NODEV),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
        (StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (StatVfsMountFlags::RELATIME, MountFlags::RELATIME),
    ] {
        if current.contains(have) {
            flags |= keep;
        }
    }
    rustix::mount::mount_remount(target.as_c_str(), flags, c"")
}

/// Whether `path` is visible inside the worker's root as described by `grants` (or is one of
/// the directories every worker root has).
pub(crate) fn visible(path: &Path, grants: &[Grant]) -> bool {
    path == Path::new("/")
        || path.starts_with("/tmp")
        || grants.iter().any(|g| path.starts_with(&g.path))
        || SYSTEM_TREES.iter().any(|t| path.starts_with(t))
}

/// `path` made absolute and canonical, for a grant.
pub(crate) fn canonical(path: &Path) -> Result<PathBuf, ConfinementError> {
    std::fs::canonicalize(path).map_err(|source| ConfinementError::Path {
        path: path.to_path_buf(),
        source,
    })
}

/// Makes the file name of `path` a C string (for messages that must not allocate later).
pub(crate) fn os_cstring(s: &OsStr) -> Option<CString> {
    CString::new(s.as_bytes()).ok()
}
