//! A private directory: created fresh by this process, owned by it, mode `0700`.

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{fchmod, fstat, lstat, mkdir, open, unlinkat, AtFlags, FileType, Mode, OFlags};

use crate::env::invalid;

/// Prefix of the directories [`PrivateDir::create_random_in`] names.
pub const PRIVATE_DIR_PREFIX: &str = "airlock-";

/// Random bytes in a generated directory name (128 bits: never guessed, never repeated).
const NAME_RANDOM_BYTES: usize = 16;

/// The only mode a private directory may have: owner read, write and search; nobody else
/// anything.
const PRIVATE_MODE: u32 = 0o700;

/// A directory this process just created, owned by its effective uid, mode exactly `0700`.
///
/// Creation never reuses and never follows anything already there: `mkdir` fails on any
/// existing entry, a planted symlink included (the last component of a `mkdir` path is never
/// followed); the directory is then opened with `O_NOFOLLOW | O_DIRECTORY` and checked through
/// that descriptor (`fstat`: a directory, our uid, mode `0700`), and the path is checked to
/// still name that same directory. Entries are removed through the held descriptor, so a
/// directory swapped in under the same path is never touched. Dropping it removes the
/// directory if it is empty and still the one created.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
    fd: OwnedFd,
    dev: u64,
    ino: u64,
}

impl PrivateDir {
    /// Creates `parent/airlock-<32 random hex digits>`. Fails, rather than retrying, if that
    /// name exists: with 128 random bits, it can only be there because someone planted it.
    pub fn create_random_in(parent: &Path) -> io::Result<Self> {
        let mut random = [0u8; NAME_RANDOM_BYTES];
        getrandom::fill(&mut random).map_err(|err| io::Error::other(err.to_string()))?;
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        Self::create_in(parent, OsStr::new(&format!("{PRIVATE_DIR_PREFIX}{hex}")))
    }

    /// Creates `parent/name` (`name` must be one plain path component). Fails with
    /// [`io::ErrorKind::AlreadyExists`] if anything, a symlink included, is already there.
    pub fn create_in(parent: &Path, name: &OsStr) -> io::Result<Self> {
        let mut components = Path::new(name).components();
        if !matches!(
            (components.next(), components.next()),
            (Some(Component::Normal(_)), None)
        ) {
            return Err(invalid(format!("{name:?} is not a single path component")));
        }
        let path = parent.join(name);
        mkdir(&path, Mode::from_raw_mode(PRIVATE_MODE))?;
        let fd = open(
            &path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let stat = fstat(&fd)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
            return Err(not_private(&path, "is not a directory"));
        }
        if stat.st_uid != rustix::process::geteuid().as_raw() {
            return Err(not_private(&path, "is owned by another user"));
        }
        // The umask can only have removed bits, and a set-group-id parent can have added one:
        // set the mode exactly, then check it took.
        if stat.st_mode & 0o7777 != PRIVATE_MODE {
            fchmod(&fd, Mode::from_raw_mode(PRIVATE_MODE))?;
            if fstat(&fd)?.st_mode & 0o7777 != PRIVATE_MODE {
                return Err(not_private(&path, "does not keep mode 0700"));
            }
        }
        let dir = Self {
            path,
            fd,
            dev: stat.st_dev,
            ino: stat.st_ino,
        };
        dir.verify()?;
        Ok(dir)
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks that the path still names the directory that was created (same device and
    /// inode, not a symlink).
    pub fn verify(&self) -> io::Result<()> {
        let stat = lstat(&self.path)?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::Directory
            || stat.st_dev != self.dev
            || stat.st_ino != self.ino
        {
            return Err(not_private(&self.path, "was replaced"));
        }
        Ok(())
    }

    /// Removes the entry `name` from this directory, through the held descriptor.
    pub fn remove_entry(&self, name: &OsStr) -> io::Result<()> {
        unlinkat(&self.fd, name, AtFlags::empty())?;
        Ok(())
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        // Remove the path only while it is still ours; `rmdir` refuses a non-empty directory.
        let removed = self.verify().and_then(|()| std::fs::remove_dir(&self.path));
        if let Err(err) = removed {
            tracing::debug!(path = %self.path.display(), %err, "private directory left in place");
        }
    }
}

fn not_private(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{} {what}; refusing to use it", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    use super::*;

    fn scratch() -> PrivateDir {
        PrivateDir::create_random_in(&std::env::temp_dir()).unwrap()
    }

    #[test]
    fn created_directory_is_private_and_removed_on_drop() {
        let dir = scratch();
        let meta = std::fs::symlink_metadata(dir.path()).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.permissions().mode() & 0o7777, PRIVATE_MODE);
        assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        let path = dir.path().to_owned();
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn random_names_never_repeat() {
        let a = scratch();
        let b = scratch();
        assert_ne!(a.path(), b.path());
        assert!(a
            .path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(PRIVATE_DIR_PREFIX));
    }

    #[test]
    fn existing_directory_is_never_reused() {
        let parent = scratch();
        let first = PrivateDir::create_in(parent.path(), OsStr::new("d")).unwrap();
        let err = PrivateDir::create_in(parent.path(), OsStr::new("d")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        drop(first);
    }

    #[test]
    fn planted_symlink_is_never_followed() {
        let parent = scratch();
        let target = parent.path().join("target");
        std::fs::create_dir(&target).unwrap();
        symlink(&target, parent.path().join("link")).unwrap();
        symlink(
            parent.path().join("missing"),
            parent.path().join("dangling"),
        )
        .unwrap();
        for name in ["link", "dangling"] {
            let err = PrivateDir::create_in(parent.path(), OsStr::new(name)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::AlreadyExists, "{name}");
        }
        // Neither the target nor the dangling link's destination was created or touched.
        assert!(!parent.path().join("missing").exists());
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
        std::fs::remove_file(parent.path().join("link")).unwrap();
        std::fs::remove_file(parent.path().join("dangling")).unwrap();
        std::fs::remove_dir(&target).unwrap();
    }

    #[test]
    fn name_must_be_one_component() {
        let parent = scratch();
        for name in ["", ".", "..", "a/b", "/abs"] {
            let err = PrivateDir::create_in(parent.path(), OsStr::new(name)).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
    }

    #[test]
    fn narrowed_mode_is_set_back_to_exactly_0700() {
        let parent = scratch();
        // A set-group-id parent makes new directories set-group-id too; the result must still
        // be exactly 0700.
        std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o2700)).unwrap();
        let dir = PrivateDir::create_in(parent.path(), OsStr::new("child")).unwrap();
        let mode = std::fs::symlink_metadata(dir.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, PRIVATE_MODE);
    }

    #[test]
    fn replaced_directory_is_detected_and_left_alone() {
        let parent = scratch();
        let dir = PrivateDir::create_in(parent.path(), OsStr::new("d")).unwrap();
        std::fs::rename(dir.path(), parent.path().join("moved")).unwrap();
        std::fs::create_dir(parent.path().join("d")).unwrap();
        std::fs::write(parent.path().join("d/keep"), b"x").unwrap();
        assert!(dir.verify().is_err());
        drop(dir);
        // The impostor at the old path was not removed, nor was anything inside it.
        assert!(parent.path().join("d/keep").exists());
        std::fs::remove_file(parent.path().join("d/keep")).unwrap();
        std::fs::remove_dir(parent.path().join("d")).unwrap();
        std::fs::remove_dir(parent.path().join("moved")).unwrap();
    }
}
