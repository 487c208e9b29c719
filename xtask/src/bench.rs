//! `cargo xtask bench [ARGS...]`: every benchmark in the workspace (ARGS go to `cargo bench`
//! unchanged: `--bench codec`, `-- --save-baseline main`...), then the spawn cost of
//! confinement (`tests/examples/spawn_cost.rs`: strict vs none, interleaved, release build).

use crate::run::{self, cargo, Result};

pub fn main(args: &[String]) -> Result {
    let mut bench = cargo(["bench", "--workspace", "--locked"]);
    bench.args(args);
    run::run(&mut bench)?;
    spawn_cost()
}

fn spawn_cost() -> Result {
    run::run(&mut cargo([
        "build",
        "--release",
        "--locked",
        "-p",
        "airlock-worker",
        "--bin",
        "airlock-worker",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| run::root().join("target"));
    let mut cost = cargo([
        "run",
        "--release",
        "--quiet",
        "--locked",
        "-p",
        "airlock-tests",
        "--example",
        "spawn_cost",
        "--",
    ]);
    cost.arg(target.join("release").join("airlock-worker"));
    run::run(&mut cost)
}
