//! `cargo xtask ci`: every check a change should pass, cheapest first: formatting, the
//! dependency policy (`deny.toml`: licences, bans, sources), the MSRV build, clippy, the `test`
//! steps, each feature set alone, the fuzz seed corpus, then the docs.

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
    dependency_policy()?;
    msrv()?;
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

/// `cargo deny check licenses bans sources` against `deny.toml`, installing cargo-deny first
/// when it is missing.
fn dependency_policy() -> Result {
    if !run::probe(&mut cargo(["deny", "--version"])) {
        println!("cargo-deny is not installed; installing it");
        run::run(&mut cargo(["install", "--locked", "cargo-deny"]))?;
    }
    run::run(&mut cargo([
        "deny", "--locked", "check", "licenses", "bans", "sources",
    ]))
}

/// The workspace's `rust-version` (its MSRV), read from the root manifest.
fn rust_version() -> Result<String> {
    let manifest = std::fs::read_to_string(run::root().join("Cargo.toml"))
        .map_err(|e| Error::new(format!("cannot read Cargo.toml: {e}")))?;
    manifest
        .lines()
        .find_map(|line| line.trim().strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .ok_or_else(|| Error::new("Cargo.toml states no rust-version"))
}

/// Builds the library crates with the MSRV toolchain when rustup has it installed; says so
/// and skips otherwise (this machine's rustup cannot fetch toolchains).
fn msrv() -> Result {
    let version = rust_version()?;
    let toolchain = format!("+{version}");
    if !run::probe(std::process::Command::new("cargo").args([toolchain.as_str(), "--version"])) {
        println!(
            "MSRV {version}: toolchain not installed (rustup toolchain install {version}); skipped"
        );
        return Ok(());
    }
    run::run(
        std::process::Command::new("cargo")
            .args([
                toolchain.as_str(),
                "check",
                "--locked",
                "-p",
                "airlock-codec",
                "-p",
                "airlock-protocol",
                "-p",
                "airlock-transport-pipe",
                "-p",
                "airlock-transport-socket",
                "-p",
                "airlock-worker",
                "-p",
                "airlock-host",
            ])
            .current_dir(run::root()),
    )
}
