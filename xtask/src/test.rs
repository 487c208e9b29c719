//! `cargo xtask test [--stress]`: the workspace tests, the call-id fork test in a release build,
//! the Python worker SDK's own tests, then the proof that the codec builds without `std`.

use crate::run::{self, cargo, Error, Result};

/// What `test` runs.
#[derive(Debug, Default, Clone, Copy)]
pub struct Options {
    /// Also run the `#[ignore]`d long stress tests.
    pub stress: bool,
}

pub fn main(args: &[String]) -> Result {
    let mut options = Options::default();
    for arg in args {
        match arg.as_str() {
            "--stress" => options.stress = true,
            other => return Err(Error::usage(format!("test: unknown argument `{other}`"))),
        }
    }
    run(options)
}

/// The test steps, shared with `ci`.
pub fn run(options: Options) -> Result {
    // The end-to-end suites spawn the workspace's binaries (the bundled worker, the rogue
    // worker): build them all first, so no test runs a stale one. `airlock-bench` is no such
    // binary (no test spawns it), so it is built only as its own unit tests need: how it
    // judges the targets.
    run::run(&mut cargo([
        "build",
        "--workspace",
        "--bins",
        "--locked",
        "--exclude",
        "airlock-bench",
    ]))?;
    let mut test = cargo(["test", "--workspace", "--locked"]);
    if options.stress {
        test.args(["--", "--include-ignored"]);
    }
    run::run(&mut test)?;
    fork_points()?;
    python_sdk_tests()?;
    nostd_check()
}

/// The host's call-id pool forked at every instruction of a draw (`host/src/sys.rs`). It is
/// `#[ignore]`d in the workspace run, where a debug build takes minutes; a release build takes
/// seconds, and is the build whose instruction order the test must hold for.
fn fork_points() -> Result {
    run::run(&mut cargo([
        "test",
        "--release",
        "--locked",
        "-p",
        "airlock-host",
        "--lib",
        "--",
        "--ignored",
        "--exact",
        "sys::tests::every_fork_point_of_a_single_stepped_draw_leaves_the_child_its_own_ids",
    ]))
}

/// The Python worker SDK's unit tests (`python/tests/`, standard library `unittest`), when a
/// `python3` is installed. Its end-to-end tests against the Rust host are in the cargo suite
/// (`tests/tests/python_worker.rs`).
fn python_sdk_tests() -> Result {
    if !run::probe(std::process::Command::new("python3").arg("--version")) {
        println!("python3 not found: the Python SDK's unit tests are skipped");
        return Ok(());
    }
    // -B: no bytecode files left in the source tree.
    let mut unittest = std::process::Command::new("python3");
    unittest
        .args(["-B", "-m", "unittest", "discover", "-s", "python/tests"])
        .current_dir(run::root());
    run::run(&mut unittest)
}

/// Builds `nostd-check/`, a `#![no_std]` staticlib with its own panic handler over
/// `airlock-codec`: if anything links `std` into the codec, the build fails with a duplicate
/// `panic_impl` lang item.
fn nostd_check() -> Result {
    run::run(&mut cargo([
        "build",
        "--locked",
        "--manifest-path",
        "nostd-check/Cargo.toml",
        "--release",
    ]))
}
