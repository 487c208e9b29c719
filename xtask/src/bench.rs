//! `cargo xtask bench [--quick]`: release builds of the bundled worker and `airlock-bench`,
//! then one table of airlock beside its baselines, measured in the same run (see
//! `bench/src/main.rs`). Writes `target/airlock-bench.json` and the generated part of
//! `BENCHMARKS.md`.
//!
//! `cargo xtask bench --compare REV` also builds the bundled worker at git revision `REV` (in a
//! worktree under `target/bench-compare/`) and measures it beside the current one, so a change
//! to the worker is seen before and after in the same run.
//!
//! `cargo xtask bench --criterion [ARGS...]` runs the crates' own criterion micro-benchmarks
//! instead (ARGS go to `cargo bench` unchanged: `--bench codec`, `-- --save-baseline main`...).

use crate::run::{self, cargo, Error, Result};

pub fn main(args: &[String]) -> Result {
    if args.first().map(String::as_str) == Some("--criterion") {
        let mut bench = cargo([
            "bench",
            "--workspace",
            "--locked",
            "--exclude",
            "airlock-bench",
        ]);
        bench.args(&args[1..]);
        return run::run(&mut bench);
    }
    let mut quick = false;
    let mut compare = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--compare" => compare = Some(rest.next().ok_or_else(usage)?.clone()),
            _ => return Err(usage()),
        }
    }
    run::run(&mut cargo([
        "build",
        "--release",
        "--locked",
        "-p",
        "airlock-worker",
        "-p",
        "airlock-bench",
        // `--bin` applies to every package named: both binaries must be listed, or the
        // table's own binary would be left stale.
        "--bin",
        "airlock-worker",
        "--bin",
        "airlock-bench",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| run::root().join("target"));
    let release = target.join("release");
    let mut table = std::process::Command::new(release.join("airlock-bench"));
    table
        .arg("--worker")
        .arg(release.join("airlock-worker"))
        .arg("--json")
        .arg(target.join("airlock-bench.json"))
        .arg("--markdown")
        .arg(run::root().join("BENCHMARKS.md"));
    if quick {
        table.arg("--quick");
    }
    if let Some(rev) = compare {
        table.arg("--compare-worker").arg(worker_at(&rev, &target)?);
    }
    run::run(&mut table)
}

fn usage() -> Error {
    Error::usage("bench: takes [--quick] [--compare REV], or --criterion [ARGS...]")
}

/// Builds the bundled worker as it was at `rev`, in a worktree of its own; returns the binary.
fn worker_at(rev: &str, target: &std::path::Path) -> Result<std::path::PathBuf> {
    let base = target.join("bench-compare");
    let tree = base.join("tree");
    if tree.exists() {
        remove_worktree(&tree)?;
    }
    run::run(
        std::process::Command::new("git")
            .args(["worktree", "add", "--detach"])
            .arg(&tree)
            .arg(rev)
            .current_dir(run::root()),
    )?;
    let build_target = base.join("target");
    run::run(
        cargo([
            "build",
            "--release",
            "--locked",
            "-p",
            "airlock-worker",
            "--bin",
            "airlock-worker",
        ])
        .current_dir(&tree)
        .env("CARGO_TARGET_DIR", &build_target),
    )?;
    // The binary is built outside the tree: the worktree goes, so the repository is left with
    // none but its own.
    remove_worktree(&tree)?;
    Ok(build_target.join("release").join("airlock-worker"))
}

fn remove_worktree(tree: &std::path::Path) -> Result<()> {
    run::run(
        std::process::Command::new("git")
            .args(["worktree", "remove", "--force"])
            .arg(tree)
            .current_dir(run::root()),
    )
}
