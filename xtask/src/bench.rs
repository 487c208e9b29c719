//! `cargo xtask bench [ARGS...]`: every benchmark in the workspace; ARGS go to `cargo bench`
//! unchanged (`--bench codec`, `-- --save-baseline main`...).

use crate::run::{self, cargo, Result};

pub fn main(args: &[String]) -> Result {
    let mut bench = cargo(["bench", "--workspace", "--locked"]);
    bench.args(args);
    run::run(&mut bench)
}
