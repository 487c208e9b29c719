//! `cargo xtask bench [--quick]`: release builds of the bundled worker and `airlock-bench`,
//! then one table of airlock beside its baselines, measured in the same run (see
//! `bench/src/main.rs`). Writes `target/airlock-bench.json` and the generated part of
//! `BENCHMARKS.md`.
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
    let quick = match args {
        [] => false,
        [flag] if flag == "--quick" => true,
        _ => {
            return Err(Error::usage(
                "bench: takes --quick, or --criterion [ARGS...]",
            ))
        }
    };
    run::run(&mut cargo([
        "build",
        "--release",
        "--locked",
        "-p",
        "airlock-worker",
        "--bin",
        "airlock-worker",
        "-p",
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
    run::run(&mut table)
}
