//! `cargo xtask <command>`: the project's automation, in plain Rust with no dependencies beyond
//! the codec the demo shows.
//!
//! Every command prints each process it starts (`+ cargo test --workspace --locked`) before it
//! starts it, and stops at the first one that fails, naming it. One module per subcommand;
//! `run` is the one place that starts processes.

#![forbid(unsafe_code)]

mod bench;
mod ci;
mod demo;
mod fuzz;
mod release;
mod run;
mod test;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  demo                     spawn the bundled worker, call it, watch hostile workers refused
  test [--stress]          workspace tests, then the no_std build check
                           (--stress also runs the #[ignore]d long tests)
  ci                       fmt, clippy, test, feature sets, docs: what CI runs
  fuzz [--seconds N] [TARGET...]
                           run each fuzz target for N seconds (default 30)
  bench [--quick] [--compare REV]
                           airlock beside raw pipes, sockets, ipc-channel and Python,
                           in one run; updates BENCHMARKS.md (--compare REV adds the
                           worker built at git revision REV)
  bench --criterion [ARGS...]
                           the crates' criterion micro-benchmarks (ARGS to cargo bench)
  release                  stripped airlock-worker and airlock binaries, licences, README
                           and SHA256SUMS in target/release/airlock-<version>-<target>.tar.gz;
                           unpacks it again and verifies the checksums";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let command = args.next();
    let rest: Vec<String> = args.collect();
    let result = match command.as_deref() {
        Some("demo") => demo::main(&rest),
        Some("test") => test::main(&rest),
        Some("ci") => ci::main(&rest),
        Some("fuzz") => fuzz::main(&rest),
        Some("bench") => bench::main(&rest),
        Some("release") => release::main(&rest),
        Some("help" | "-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(run::Error::usage(format!("unknown command `{other}`"))),
        None => Err(run::Error::usage("no command given")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: error: {error}");
            if error.is_usage() {
                eprintln!("\n{USAGE}");
            }
            ExitCode::FAILURE
        }
    }
}
