//! `cargo xtask fuzz [--seconds N] [TARGET...]`: runs each fuzz target in `fuzz/` (or the
//! named ones) for a bounded time and reports how many inputs each executed.
//!
//! Works on the stable toolchain: with `--sanitizer none`, cargo-fuzz passes only stable
//! `-C` flags (SanitizerCoverage instrumentation), so no nightly and no `RUSTC_BOOTSTRAP`
//! are needed. Debug assertions are on, so an arithmetic overflow in a decoder is a crash.
//! New inputs the fuzzer finds are kept in `fuzz/corpus/<target>/` (only `seed-*` files are
//! committed); crashing inputs land in `fuzz/artifacts/<target>/`.

use std::process::Command;

use crate::run::{self, cargo, root, Error, Result};

const DEFAULT_SECONDS: u64 = 30;

pub fn main(args: &[String]) -> Result {
    let mut seconds = DEFAULT_SECONDS;
    let mut targets = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "--seconds" => args.next().map(String::as_str),
            other => match other.strip_prefix("--seconds=") {
                Some(value) => Some(value),
                None if other.starts_with('-') => {
                    return Err(Error::usage(format!("fuzz: unknown argument `{other}`")));
                }
                None => {
                    targets.push(other.to_string());
                    continue;
                }
            },
        };
        seconds = value
            .and_then(|v| v.parse().ok())
            .filter(|&s| s > 0)
            .ok_or_else(|| Error::usage("fuzz: --seconds needs a positive whole number"))?;
    }

    if !run::probe(&mut cargo(["fuzz", "--version"])) {
        println!("cargo-fuzz is not installed; installing it");
        run::run(&mut cargo(["install", "--locked", "cargo-fuzz"]))?;
    }
    let listed: Vec<String> = run::stdout(&mut in_fuzz_dir(["list"]))?
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(String::from)
        .collect();
    if targets.is_empty() {
        targets = listed;
    } else if let Some(unknown) = targets.iter().find(|t| !listed.contains(t)) {
        return Err(Error::usage(format!(
            "fuzz: no target `{unknown}` (targets: {})",
            listed.join(", ")
        )));
    }
    if targets.is_empty() {
        return Err(Error::new("fuzz: `cargo fuzz list` found no targets"));
    }

    let mut report = Vec::new();
    for target in &targets {
        let mut runs = None;
        let max_time = format!("-max_total_time={seconds}");
        let mut command = in_fuzz_dir([
            "run",
            "--sanitizer",
            "none",
            "--debug-assertions",
            target,
            "--",
            &max_time,
        ]);
        run::run_scanning_stderr(&mut command, |line| {
            runs = parse_done(line).or(runs);
        })?;
        report.push((target, runs));
    }

    println!("\nfuzzed each target for {seconds} s:");
    for (target, runs) in report {
        match runs {
            Some((runs, secs)) => println!("  {target}: {runs} executions in {secs} s"),
            None => println!("  {target}: finished, but libFuzzer printed no `Done N runs` line"),
        }
    }
    Ok(())
}

/// `cargo fuzz <args>`, run inside `fuzz/`.
fn in_fuzz_dir<const N: usize>(args: [&str; N]) -> Command {
    let mut command = cargo(["fuzz"]);
    command.args(args).current_dir(root().join("fuzz"));
    command
}

/// Parses libFuzzer's closing line, `Done 1500992 runs in 6 second(s)`.
fn parse_done(line: &str) -> Option<(u64, u64)> {
    let rest = line.trim().strip_prefix("Done ")?;
    let (runs, rest) = rest.split_once(" runs in ")?;
    let secs = rest.split_whitespace().next()?;
    Some((runs.parse().ok()?, secs.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::parse_done;

    #[test]
    fn parses_libfuzzer_done_line() {
        assert_eq!(
            parse_done("Done 1500992 runs in 6 second(s)"),
            Some((1_500_992, 6))
        );
        assert_eq!(parse_done("#1500992 DONE cov: 12"), None);
    }
}
