//! A test that runs part of itself in a process of its own.
//!
//! Some things a test must show cannot happen inside the test process: a stack overflow
//! aborts the whole process, a seccomp filter cannot be taken back, a host process is to be
//! SIGKILLed. Such a test re-runs its own test binary for itself alone, with
//! [`CHILD_VAR`] naming it; in that child the test sees [`ChildMode::in_child`] true, does its
//! child's part and nothing else. In a normal run the variable is unset, the test does its
//! whole job, and there is no separate helper test that a run of the ignored tests could pass
//! without doing anything.
//!
//! The child says on stdout that it entered its part ([`CHILD_MARKER`]), and
//! the parent checks [`ChildMode::ran`], so a child that ran nothing (a renamed test, a
//! filter that matched none) fails the test instead of passing it.
//!
//! ```no_run
//! use airlock_test_support::ChildMode;
//!
//! #[test]
//! fn plain_recursion_overflows_a_small_stack() {
//!     let child = ChildMode::of(module_path!(), "plain_recursion_overflows_a_small_stack");
//!     if child.in_child() {
//!         // The child's part: whatever aborts the process.
//!         return;
//!     }
//!     let output = child.command().output().unwrap();
//!     assert!(child.ran(&output.stdout));
//!     assert!(!output.status.success());
//! }
//! ```

use std::process::Command;
use std::time::{Duration, Instant};

/// The environment variable that starts a test in child mode; its value is the test's full
/// name, so a child that runs other tests by mistake finds none of them in child mode.
pub const CHILD_VAR: &str = "AIRLOCK_TEST_CHILD";

/// What a child prints on stdout, followed by a space and its test's name, once it is in its
/// child mode.
pub const CHILD_MARKER: &str = "airlock-test-child-entered";

/// One test's child mode. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct ChildMode {
    /// The test's name as the test harness knows it: its path within the test crate.
    test: String,
}

impl ChildMode {
    /// The child mode of the test `test` (its function name) defined in the module whose
    /// `module_path!()` is `module_path`.
    pub fn of(module_path: &str, test: &str) -> Self {
        // libtest names a test by its path without the crate: `suite::test`, or `test` alone.
        let within_crate = module_path.split_once("::").map(|(_, rest)| rest);
        let test = match within_crate {
            Some(module) => format!("{module}::{test}"),
            None => test.to_owned(),
        };
        Self { test }
    }

    /// The test's full name, as given to the harness.
    pub fn test_name(&self) -> &str {
        &self.test
    }

    /// Whether this process is the child the test started for itself. When it is, this also
    /// prints [`CHILD_MARKER`] on stdout (for [`ChildMode::ran`]).
    pub fn in_child(&self) -> bool {
        let is_child = std::env::var_os(CHILD_VAR).is_some_and(|name| name == *self.test);
        if is_child {
            println!("{CHILD_MARKER} {}", self.test);
        }
        is_child
    }

    /// The command that re-runs this test binary for the test alone, in child mode, with
    /// its output uncaptured. The caller adds what the child needs (more variables, pipes)
    /// and runs it.
    pub fn command(&self) -> Command {
        // The test binary can always name itself; if it cannot, nothing here can run.
        let exe = std::env::current_exe().expect("the test binary's own path");
        let mut command = Command::new(exe);
        command
            .arg(&self.test)
            .args(["--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_VAR, &self.test);
        command
    }

    /// Whether `stdout`, the child's, shows that it entered its child mode.
    pub fn ran(&self, stdout: &[u8]) -> bool {
        let marker = format!("{CHILD_MARKER} {}", self.test);
        String::from_utf8_lossy(stdout)
            .lines()
            .any(|line| line.ends_with(&marker))
    }
}

/// Waits for `pid`, a process this test forked, to end, polling every 20 ms for at most
/// `limit`. Past that the process is SIGKILLed and reaped, and this panics saying that `what`
/// never finished. Returns the exit code, or `None` if a signal ended the process.
pub fn wait_for_forked(pid: i32, limit: Duration, what: &str) -> Option<i32> {
    use rustix::process::{kill_process, waitpid, Pid, Signal, WaitOptions};
    let pid = Pid::from_raw(pid).expect("a forked child's pid is positive");
    let deadline = Instant::now() + limit;
    loop {
        match waitpid(Some(pid), WaitOptions::NOHANG) {
            Ok(Some((_, status))) => return status.exit_status(),
            Ok(None) => {}
            Err(err) => panic!("cannot wait for {what} (pid {pid:?}): {err}"),
        }
        if Instant::now() > deadline {
            let _ = kill_process(pid, Signal::KILL);
            let _ = waitpid(Some(pid), WaitOptions::empty());
            panic!("{what} never finished");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_is_named_by_its_path_within_the_crate() {
        assert_eq!(ChildMode::of("suite", "t").test_name(), "t");
        assert_eq!(
            ChildMode::of("adversarial::socket_named", "deep_nesting").test_name(),
            "socket_named::deep_nesting"
        );
    }

    #[test]
    fn this_test_in_child_mode_says_so_and_its_parent_sees_it() {
        let child = ChildMode::of(
            module_path!(),
            "this_test_in_child_mode_says_so_and_its_parent_sees_it",
        );
        if child.in_child() {
            std::process::exit(7);
        }
        let output = child.command().output().unwrap();
        assert!(child.ran(&output.stdout), "{output:?}");
        assert_eq!(output.status.code(), Some(7));
        // Live: output without the marker (another test's, or none) is not taken as a run.
        assert!(!child.ran(b"test other ... ok\n"));
        assert!(!ChildMode::of(module_path!(), "other").ran(&output.stdout));
    }

    // The child is reaped by `wait_for_forked`, through its pid: that is what is under test.
    #[allow(clippy::zombie_processes)]
    fn spawned(script: &str) -> i32 {
        let child = Command::new("/bin/sh")
            .args(["-c", script])
            .spawn()
            .unwrap();
        i32::try_from(child.id()).unwrap()
    }

    #[test]
    fn a_forked_process_that_exits_gives_its_exit_code() {
        let pid = spawned("exit 3");
        assert_eq!(wait_for_forked(pid, Duration::from_secs(10), "sh"), Some(3));
    }

    #[test]
    fn a_forked_process_killed_by_a_signal_gives_none() {
        let pid = spawned("kill -9 $$");
        assert_eq!(wait_for_forked(pid, Duration::from_secs(10), "sh"), None);
    }

    #[test]
    #[should_panic(expected = "the sleeper never finished")]
    fn a_forked_process_past_its_limit_is_killed_and_the_wait_panics() {
        let pid = spawned("exec sleep 30");
        wait_for_forked(pid, Duration::from_millis(50), "the sleeper");
    }
}
