//! `cargo xtask test [--stress]`: the workspace tests, then the proof that the codec builds
//! without `std`.

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
    // worker): build them all first, so no test runs a stale one.
    // `airlock-bench` is left out: it measures, it tests nothing, and its baselines'
    // dependencies (ipc-channel) would only slow the build.
    run::run(&mut cargo([
        "build",
        "--workspace",
        "--bins",
        "--locked",
        "--exclude",
        "airlock-bench",
    ]))?;
    let mut test = cargo([
        "test",
        "--workspace",
        "--locked",
        "--exclude",
        "airlock-bench",
    ]);
    if options.stress {
        // `residual_*` tests are ignored on purpose: each pins a stated residual (SECURITY.md)
        // that only OS confinement will close, and fails until then.
        test.args(["--", "--include-ignored", "--skip", "residual_"]);
    }
    run::run(&mut test)?;
    nostd_check()
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
