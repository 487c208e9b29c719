//! Running a test's "other process" as another uid.

use std::path::Path;

/// The arguments that make `setpriv` run its program as uid/gid 65534 with no groups.
pub const AS_NOBODY: [&str; 3] = ["--reuid=65534", "--regid=65534", "--clear-groups"];

/// `setpriv`'s path, or why a test cannot switch uids here (not root, or no `setpriv`); the test
/// then prints the reason and skips.
pub fn setpriv() -> Result<&'static str, String> {
    if !rustix::process::geteuid().is_root() {
        return Err("not running as root, so cannot switch to another uid".into());
    }
    ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or_else(|| "setpriv is not installed".into())
}
