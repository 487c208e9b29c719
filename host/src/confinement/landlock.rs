//! Landlock: the filesystem access the worker keeps, no TCP bind or connect, and signals and
//! abstract Unix sockets scoped to the worker's own domain.
//!
//! A second wall behind the mount namespace: even a path that is visible (a device node, a
//! system library) is only as usable as its rule says, and the rules hold for a worker whose
//! namespaces could not be created ([`best_effort`](crate::Confinement::best_effort)).
//!
//! The ruleset is built in the host with the `landlock` crate, at the best ABI the kernel has
//! (up to the newest this code knows); rules attach to inodes, so those added for the host's
//! paths hold for the same inodes bound into the worker's root. The two filesystems the child
//! creates itself (its `/proc` and `/tmp`) get their rules in the child, then the child
//! restricts itself just before `exec`, after which the ruleset binds every program it runs.

use std::path::Path;

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};
use rustix::io::Errno;

use super::error::{ConfinementError, ConfinementStep, Feature};
use super::mounts::Grant;

/// The lowest ABI `strict()` accepts: 6 brings signal and abstract-socket scoping.
pub(crate) const MIN_STRICT_ABI: i32 = 6;

/// The kernel's Landlock ABI version (0: none).
pub(crate) fn kernel_abi() -> i32 {
    crate::sys::landlock_abi_version()
}

fn abi_of(version: i32) -> ABI {
    match version {
        i32::MIN..=0 => ABI::Unsupported,
        1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        _ => ABI::V7,
    }
}

/// A ruleset ready for the child, and what it still needs there.
pub(crate) struct LandlockPlan {
    ruleset: Option<RulesetCreated>,
    abi: ABI,
    /// The ABI version applied.
    pub(crate) version: i32,
}

fn rule_error(path: &Path, source: impl Into<std::io::Error>) -> ConfinementError {
    ConfinementError::Path {
        path: path.to_path_buf(),
        source: source.into(),
    }
}

/// The ruleset for `grants`, or `None` if the kernel has no Landlock (only allowed when
/// `required` is false).
pub(crate) fn plan(
    grants: &[Grant],
    required: bool,
) -> Result<Option<LandlockPlan>, ConfinementError> {
    let version = kernel_abi();
    if version < MIN_STRICT_ABI {
        if required {
            return Err(ConfinementError::Unsupported {
                feature: Feature::Landlock,
                detail: format!("the kernel offers Landlock ABI {version}"),
            });
        }
        if version <= 0 {
            return Ok(None);
        }
    }
    let abi = abi_of(version);
    let unsupported = |err: landlock::RulesetError| ConfinementError::Unsupported {
        feature: Feature::Landlock,
        detail: err.to_string(),
    };
    let mut ruleset = landlock::Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(unsupported)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(unsupported)?
        .scope(Scope::from_all(abi))
        .map_err(unsupported)?
        .create()
        .map_err(unsupported)?;
    for grant in grants {
        let access = access_for(abi, grant.writable, grant.is_dir);
        let fd = rustix::fs::open(
            &grant.path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| rule_error(&grant.path, e))?;
        if let Some((dev, ino)) = grant.identity {
            let found = rustix::fs::fstat(&fd).map_err(|e| rule_error(&grant.path, e))?;
            if found.st_dev != dev || found.st_ino != ino {
                return Err(ConfinementError::GrantReplaced {
                    path: grant.path.clone(),
                });
            }
        }
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            // Landlock's own error, kept whole as the source.
            .map_err(|e| rule_error(&grant.path, std::io::Error::other(e)))?;
    }
    Ok(Some(LandlockPlan {
        ruleset: Some(ruleset),
        abi,
        version,
    }))
}

fn access_for(abi: ABI, writable: bool, is_dir: bool) -> BitFlags<AccessFs> {
    let access = if writable {
        AccessFs::from_all(abi)
    } else {
        AccessFs::from_read(abi)
    };
    if is_dir {
        access
    } else {
        access & AccessFs::from_file(abi)
    }
}

impl LandlockPlan {
    /// Owns no buffer: the ruleset is a descriptor and flags, held in the plan itself (as
    /// `landlock`'s `RulesetCreated` is in 0.4). See `ChildPlan::footprint`.
    pub(crate) fn footprint(&self, _kept: &mut super::host_memory::Kept) {
        let Self {
            ruleset: _,
            abi: _,
            version: _,
        } = self;
    }

    /// In the child, after it entered its root: adds the rules for its own `/tmp`
    /// (read-write) and `/proc` (read-only) and restricts itself. Allocates nothing: the
    /// crate's rule and restrict calls are system calls on the ruleset descriptor.
    pub(crate) fn restrict_self(
        &mut self,
        namespaced: bool,
    ) -> Result<(), (ConfinementStep, Errno)> {
        let fail = |_| (ConfinementStep::Landlock, Errno::PERM);
        let Some(mut ruleset) = self.ruleset.take() else {
            return Err((ConfinementStep::Landlock, Errno::BADF));
        };
        if namespaced {
            for (path, writable) in [(c"/tmp", true), (c"/proc", false)] {
                let fd = rustix::fs::open(
                    path,
                    rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .map_err(|e| (ConfinementStep::Landlock, e))?;
                ruleset = ruleset
                    .add_rule(PathBeneath::new(fd, access_for(self.abi, writable, true)))
                    .map_err(fail)?;
            }
        }
        ruleset.restrict_self().map_err(fail)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn a_grant_naming_another_file_than_its_pin_is_refused_as_replaced() {
        let dir = std::env::temp_dir().canonicalize().unwrap();
        let meta = std::fs::metadata(&dir).unwrap();
        let grant = |identity| Grant {
            path: dir.clone(),
            writable: false,
            is_dir: true,
            identity: Some(identity),
        };
        // The path still names the file it was pinned to: the ruleset is built.
        assert!(
            matches!(plan(&[grant((meta.dev(), meta.ino()))], false), Ok(Some(_))),
            "this kernel builds no Landlock ruleset, so nothing below is checked"
        );
        // Pinned to another file: refused, naming the path.
        match plan(&[grant((meta.dev(), meta.ino() + 1))], false) {
            Err(ConfinementError::GrantReplaced { path }) => assert_eq!(path, dir),
            Err(other) => panic!("expected GrantReplaced, got {other}"),
            Ok(_) => panic!("a replaced grant was accepted"),
        }
    }
}
