//! `cargo xtask ci`: every check a change should pass, cheapest first: formatting, clippy,
//! the `test` steps, each feature set alone, the fuzz seed corpus, then the docs.

use crate::run::{self, cargo, Error, Result};
use crate::test;

/// A package tested on its own with default features off and exactly these features on, so a
/// feature combination that only compiles thanks to workspace feature unification is caught.
#[derive(Debug)]
struct FeatureSet {
    package: &'static str,
    features: &'static [&'static str],
}

/// The feature combinations `ci` tests one by one. Add a row per meaningful combination as
/// crates gain features (a transport per feature, `std` on the codec...).
const FEATURE_SETS: &[FeatureSet] = &[
    FeatureSet {
        package: "airlock-codec",
        features: &[],
    },
    FeatureSet {
        package: "airlock-host",
        features: &["pipe"],
    },
    FeatureSet {
        package: "airlock-host",
        features: &["socket"],
    },
    FeatureSet {
        package: "airlock-worker",
        features: &["pipe"],
    },
    FeatureSet {
        package: "airlock-worker",
        features: &["socket"],
    },
];

/// Crates deliberately outside the workspace (see the root `Cargo.toml`).
const OUTSIDE_WORKSPACE: &[&str] = &["fuzz/Cargo.toml", "nostd-check/Cargo.toml"];

pub fn main(args: &[String]) -> Result {
    if let Some(arg) = args.first() {
        return Err(Error::usage(format!("ci: unknown argument `{arg}`")));
    }
    run::run(&mut cargo(["fmt", "--all", "--", "--check"]))?;
    // `--all` covers the workspace only; the two crates outside it are checked by manifest.
    for manifest in OUTSIDE_WORKSPACE {
        run::run(&mut cargo([
            "fmt",
            "--manifest-path",
            manifest,
            "--",
            "--check",
        ]))?;
    }
    run::run(&mut cargo([
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]))?;
    test::run(test::Options::default())?;
    for set in FEATURE_SETS {
        let mut command = cargo(["test", "--locked", "--package", set.package]);
        command.arg("--no-default-features");
        if !set.features.is_empty() {
            command.args(["--features", &set.features.join(",")]);
        }
        run::run(&mut command)?;
    }
    // The feature sets above rebuilt `target/debug/airlock-worker` (and friends) with fewer
    // features (a socket-only worker, say); the suites spawn those binaries, so put the
    // default builds back before anyone runs `cargo test` after this.
    run::run(&mut cargo(["build", "--workspace", "--bins", "--locked"]))?;
    // The committed fuzz seeds still decode (or are refused) as their names say.
    run::run(&mut cargo([
        "test",
        "--locked",
        "--manifest-path",
        "fuzz/Cargo.toml",
    ]))?;
    let mut doc = cargo(["doc", "--workspace", "--no-deps", "--locked"]);
    doc.env("RUSTDOCFLAGS", "-D warnings");
    run::run(&mut doc)
}
