//! Everything a confined spawn needs, prepared in the host before the fork, and what the host
//! reads back afterwards.
//!
//! [`prepare`] resolves the policy against this machine (paths, the program, the kernel's
//! features) into a [`ChildPlan`], moved into the child, and a [`Prepared`] the host keeps:
//! the report pipe's read end and what the worker must be found running under.

use std::ffi::{CString, OsString};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use seccompiler::BpfProgram;

use super::error::{ConfinementError, ConfinementStep, Feature};
use super::host_memory::Kept;
use super::landlock::LandlockPlan;
use super::mounts::{Grant, MountTable};
use super::namespaces::Identity;
use super::policy::{Confinement, ConfinementMode};
use super::process::Limits;
use super::report::ConfinementReport;

/// Report record kinds on the report pipe (8 bytes: kind, step, 2 zero bytes, i32 LE).
pub(crate) const REPORT_PID: u8 = b'P';
pub(crate) const REPORT_ERROR: u8 = b'E';
/// Init could not `exec` the worker's program: the errno, as `std` reports a failed `exec`.
pub(crate) const REPORT_EXEC: u8 = b'X';

/// What the child runs with (moved into the `pre_exec` closure).
pub(crate) struct ChildPlan {
    pub(crate) namespaced: bool,
    pub(crate) identity: Identity,
    pub(crate) mounts: Option<MountTable>,
    pub(crate) landlock: Option<LandlockPlan>,
    pub(crate) seccomp: Vec<BpfProgram>,
    pub(crate) limits: Limits,
    /// Working directory when there is no mount namespace (with one, `mounts` enters it).
    pub(crate) cwd: Option<CString>,
    pub(crate) report: OwnedFd,
    pub(crate) go_read: Option<OwnedFd>,
    pub(crate) go_write: Option<OwnedFd>,
    /// Init → keeper: the worker's raw wait status, so the keeper ends as the worker did.
    pub(crate) status_read: Option<OwnedFd>,
    pub(crate) status_write: Option<OwnedFd>,
    /// The worker's cgroup, to join before it runs anything.
    pub(crate) cgroup: Option<super::cgroup::CgroupJoin>,
    /// The host's pid, for a child confined in place to check it still has its parent.
    pub(crate) host: rustix::process::Pid,
    /// How init starts the worker (namespaces only; the spawn sets it once the command is
    /// complete). A child confined in place goes on to `std`'s own `exec` instead.
    pub(crate) worker: Option<crate::sys::WorkerExec>,
}

impl ChildPlan {
    /// Adds to `kept` every byte the keeper and init read through this plan once the keeper
    /// has dropped the host's memory: the plan itself and each buffer it owns. Each field is
    /// named, here and in the parts' own `footprint`s, so that a new one cannot be left out
    /// unseen: a buffer missing here is unmapped before init reads it, and init faults.
    pub(crate) fn footprint(&self, kept: &mut Kept) {
        let Self {
            namespaced: _,
            identity,
            mounts,
            landlock,
            seccomp,
            limits,
            cwd,
            report: _,
            go_read: _,
            go_write: _,
            status_read: _,
            status_write: _,
            cgroup,
            host: _,
            worker,
        } = self;
        kept.value(self);
        identity.footprint(kept);
        if let Some(mounts) = mounts {
            mounts.footprint(kept);
        }
        if let Some(landlock) = landlock {
            landlock.footprint(kept);
        }
        kept.slice(seccomp);
        for program in seccomp {
            kept.slice(program);
        }
        limits.footprint(kept);
        if let Some(cwd) = cwd {
            kept.c_str(cwd);
        }
        if let Some(cgroup) = cgroup {
            cgroup.footprint(kept);
        }
        if let Some(worker) = worker {
            worker.footprint(kept);
        }
    }
}

/// What the host keeps of a confined spawn.
pub(crate) struct Prepared {
    /// The program to exec, absolute (it names the same file inside the worker's root).
    pub(crate) program: PathBuf,
    /// Environment the confined worker gets on top of the caller's.
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) report_read: OwnedFd,
    pub(crate) expected: ConfinementReport,
    /// The worker's cgroup, removed once the worker is reaped.
    pub(crate) cgroup: Option<super::cgroup::WorkerCgroup>,
    /// Placeholders holding whichever of fds 0-3 were free while the plan was made.
    _low_fds: Vec<OwnedFd>,
}

/// A path the worker program will be found at, without a search through `PATH` in the child
/// (which would look in the worker's root, or in the host's before it exists).
pub(crate) fn resolve_program(
    program: &Path,
    env: &[(OsString, OsString)],
) -> Result<PathBuf, ConfinementError> {
    let not_found = |source| ConfinementError::Program {
        program: program.to_path_buf(),
        source,
    };
    if program.as_os_str().is_empty() {
        return Err(not_found(std::io::Error::from(
            std::io::ErrorKind::NotFound,
        )));
    }
    if program.components().count() > 1 || program.is_absolute() {
        return std::fs::canonicalize(program).map_err(not_found);
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(program);
        if candidate.is_file() {
            return std::fs::canonicalize(&candidate).map_err(not_found);
        }
    }
    Err(not_found(std::io::Error::from(
        std::io::ErrorKind::NotFound,
    )))
}

/// The inputs of a spawn that confinement depends on.
pub(crate) struct SpawnInputs<'a> {
    pub(crate) program: &'a Path,
    pub(crate) env: &'a [(OsString, OsString)],
    pub(crate) cwd: Option<&'a Path>,
    /// Files the transport needs inside the worker's root (a named socket), read-write.
    pub(crate) transport_files: &'a [PathBuf],
}

/// Resolves `policy` for one spawn. `namespaces`: try to create them (false when
/// `best_effort` already found they cannot be had).
pub(crate) fn prepare(
    policy: &Confinement,
    inputs: &SpawnInputs<'_>,
    namespaces: bool,
) -> Result<(ChildPlan, Prepared), ConfinementError> {
    // Nothing the child needs may sit at fds 0-2: the spawn puts stdio there before the first
    // set-up step. Fd 3 is held as well, so that the spawn's own exec-error pipe, made at the
    // fork, is not where the worker's last step puts the channel. Only the numbers free now
    // can be held: one another thread frees later can still be taken, which at 3 is harmless
    // to the plan (`sys::prepare_child` moves the channel there after the set-up).
    let low_fds = hold_low_descriptors();
    let strict = policy.mode == ConfinementMode::Strict;
    let pins = match &policy.pins {
        Some(pins) => pins.clone(),
        None => {
            let mut fresh = policy.clone();
            fresh.pin(resolve_program(inputs.program, inputs.env)?)?;
            fresh.pins.ok_or(ConfinementError::Program {
                program: inputs.program.to_path_buf(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })?
        }
    };
    let program = pins.program.path.clone();
    let pinned = |pin: &super::policy::Pinned, writable: bool| Grant {
        path: pin.path.clone(),
        writable,
        is_dir: pin.is_dir,
        identity: Some((pin.dev, pin.ino)),
    };
    let mut grants = vec![pinned(&pins.program, false)];
    grants.extend(pins.read_only.iter().map(|p| pinned(p, false)));
    grants.extend(pins.read_write.iter().map(|p| pinned(p, true)));
    for path in inputs.transport_files {
        let canonical = super::mounts::canonical(path)?;
        let is_dir = canonical.is_dir();
        grants.push(Grant {
            path: canonical,
            writable: true,
            is_dir,
            identity: None,
        });
    }
    let cwd = match inputs.cwd {
        Some(dir) => super::mounts::canonical(dir)?,
        None => PathBuf::from("/"),
    };
    if namespaces && !super::mounts::visible(&cwd, &grants) {
        return Err(ConfinementError::Path {
            path: cwd,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the working directory is not visible to the worker: grant it with \
                 Confinement::read_only or read_write",
            ),
        });
    }
    if !namespaces && !inputs.transport_files.is_empty() && rustix::process::geteuid().is_root() {
        return Err(ConfinementError::NamedSocketNeedsNamespaces);
    }
    let limits = Limits::from_policy(policy)?;
    let mut missing = Vec::new();
    let landlock = super::landlock::plan(&landlock_grants(&grants, namespaces), strict)?;
    if landlock.is_none()
        || landlock
            .as_ref()
            .is_some_and(|l| l.version < super::landlock::MIN_STRICT_ABI)
    {
        missing.push(Feature::Landlock);
    }
    // Made before the filter, which refuses System V IPC to a worker no cgroup counts.
    let cgroup = super::cgroup::WorkerCgroup::create(policy.memory_limit, policy.max_processes);
    let around = super::seccomp::Surroundings {
        namespaced: namespaces,
        memory_counted: cgroup.is_some(),
        connects_its_channel: !inputs.transport_files.is_empty(),
    };
    let seccomp = match super::seccomp::denylist(around) {
        Ok(programs) => programs,
        Err(err) if strict => return Err(err),
        Err(_) => {
            missing.push(Feature::Seccomp);
            Vec::new()
        }
    };
    if !namespaces {
        missing.push(Feature::Namespaces);
    }
    let mounts = if namespaces {
        Some(MountTable::new(&grants, policy.tmp_size, &cwd)?)
    } else {
        None
    };
    let identity = Identity::for_worker(pins.worker_uid, namespaces);
    let (cgroup, cgroup_join) = match cgroup {
        Some((cgroup, join)) => (Some(cgroup), Some(join)),
        None => (None, None),
    };
    let pipe = || {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| {
            ConfinementError::Step {
                step: ConfinementStep::Synchronise,
                source: e.into(),
            }
        })
    };
    let (report_read, report) = pipe()?;
    rustix::fs::fcntl_setfl(&report_read, rustix::fs::OFlags::NONBLOCK).map_err(|e| {
        ConfinementError::Step {
            step: ConfinementStep::Synchronise,
            source: e.into(),
        }
    })?;
    let (go_read, go_write) = if namespaces {
        let (r, w) = pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let (status_read, status_write) = if namespaces {
        let (r, w) = pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    let expected = ConfinementReport {
        mode: policy.mode,
        pid: 0,
        uid: identity.uid,
        namespaces,
        landlock_abi: landlock.as_ref().map(|l| l.version),
        seccomp_filters: if seccomp.is_empty() {
            0
        } else {
            super::seccomp::HOST_FILTERS
        },
        // Known once the spawner thread that forks the worker has counted its own.
        inherited_filters: 0,
        worker_filter: false,
        no_new_privs: true,
        no_capabilities: true,
        rlimits: true,
        cgroup: cgroup.is_some(),
        missing,
    };
    let child = ChildPlan {
        namespaced: namespaces,
        identity,
        mounts,
        landlock,
        seccomp,
        limits,
        cwd: if namespaces {
            None
        } else {
            super::mounts::os_cstring(cwd.as_os_str())
        },
        report,
        go_read,
        go_write,
        status_read,
        status_write,
        cgroup: cgroup_join,
        host: rustix::process::getpid(),
        worker: None,
    };
    let prepared = Prepared {
        program,
        env: vec![(
            OsString::from(airlock_worker::confine::CONFINE_ENV),
            OsString::from("1"),
        )],
        report_read,
        expected,
        cgroup,
        _low_fds: low_fds,
    };
    Ok((child, prepared))
}

/// Landlock rules: the grants, and without a mount namespace also the system trees and
/// devices (with one, those are inside the bound trees' rules already: they are grants of the
/// mount table, added here too).
fn landlock_grants(grants: &[Grant], _namespaces: bool) -> Vec<Grant> {
    let mut all = grants.to_vec();
    for tree in super::mounts::SYSTEM_TREES {
        let path = Path::new(tree);
        if let Ok(meta) = std::fs::metadata(path) {
            if let Ok(canonical) = std::fs::canonicalize(path) {
                all.push(Grant {
                    path: canonical,
                    writable: false,
                    is_dir: meta.is_dir(),
                    identity: None,
                });
            }
        }
    }
    for device in super::mounts::DEVICES {
        all.push(Grant {
            path: PathBuf::from(device),
            writable: true,
            is_dir: false,
            identity: None,
        });
    }
    all
}

/// One record read back from the report pipe.
#[derive(Debug, Default)]
pub(crate) struct Reports {
    pub(crate) worker_pid: Option<i32>,
    pub(crate) failure: Option<(ConfinementStep, i32)>,
    /// The errno of the worker's failed `exec`, where init reported one.
    pub(crate) exec_failure: Option<i32>,
}

impl Prepared {
    /// Reads what the keeper and the worker reported. Called once the spawn has returned:
    /// every write to the pipe happened before the `exec` (or failure) that let it return.
    pub(crate) fn read_reports(&self) -> Reports {
        let mut reports = Reports::default();
        let mut record = [0u8; 8];
        while let Ok(8) = rustix::io::read(&self.report_read, &mut record) {
            let value = i32::from_le_bytes([record[4], record[5], record[6], record[7]]);
            match record[0] {
                REPORT_PID => reports.worker_pid = Some(value),
                REPORT_ERROR => {
                    if let Some(step) = ConfinementStep::from_code(record[1]) {
                        reports.failure.get_or_insert((step, value));
                    }
                }
                REPORT_EXEC => {
                    reports.exec_failure.get_or_insert(value);
                }
                _ => {}
            }
        }
        reports
    }
}

/// Opens `/dev/null` until the descriptor it gets is above 3, keeping those at 0-3: while they
/// are held, nothing else can be given those numbers.
fn hold_low_descriptors() -> Vec<OwnedFd> {
    use std::os::fd::AsRawFd;
    let mut held = Vec::new();
    while let Ok(fd) = rustix::fs::open(
        c"/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        if fd.as_raw_fd() > 3 {
            break;
        }
        held.push(fd);
    }
    held
}
