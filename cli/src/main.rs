//! `airlock`: look at an airlock worker from the command line.
//!
//! ```text
//! airlock probe target/debug/airlock-worker          # who it is, what it serves, how it is confined
//! airlock call target/debug/airlock-worker echo_value '{"n": [1, 2]}'   # prints {"n":[1,2]}
//! airlock bench target/debug/airlock-worker          # round trip and throughput beside a raw pipe
//! ```
//!
//! Every subcommand spawns the worker the way an application's `airlock_host::Host` would,
//! under the default confinement (`Confinement::strict()`), and shuts it down before it exits.
//! `call` names its method at run time (`Host::call_value`): the method must take and answer
//! dynamic `Value`s, and the request and answer are JSON (see the `json` module for what JSON
//! cannot say exactly: bytes, integer map keys, integers beyond 64 bits). What the tool prints
//! of the worker's words (its name, version, methods, error messages) has already passed the
//! protocol's checks, which admit no control or invisible characters; an answer's strings,
//! which may hold any, print with those characters as JSON escapes.
//!
//! This is a crate of its own, not a binary of `airlock-host`, so that its command-line and
//! JSON dependencies (clap, serde_json) never enter the dependency tree of an application that
//! embeds the host library.
//!
//! `airlock --help` and `airlock <command> --help` list the options and these exit codes:
//!
#![doc = concat!("```text\n", include_str!("exit_codes.txt"), "```")]
#![forbid(unsafe_code)]

mod bench;
mod call;
mod error;
mod json;
mod probe;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use airlock_host::{Host, HostBuilder};
use clap::{Parser, Subcommand};

use error::CliError;

/// The exit codes, shown after every `--help`.
const EXIT_CODES: &str = include_str!("exit_codes.txt");

/// Look at an airlock worker: who it is, what it answers, how fast.
///
/// Each command spawns the worker under the default confinement, as an application's host
/// would, and shuts it down before it exits.
#[derive(Debug, Parser)]
#[command(name = "airlock", version, after_help = EXIT_CODES)]
struct Cli {
    /// Also show the host's INFO logs (among them the worker's stderr lines); warnings and
    /// errors are always shown.
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the worker, print its name, version, protocol version and methods and the
    /// confinement it was verified to run under, then shut it down.
    #[command(after_help = EXIT_CODES)]
    Probe(probe::Args),
    /// Call one method with a JSON request (as a dynamic `Value`) and print the answer as
    /// one line of JSON.
    ///
    /// The method must take and answer `Value`s (the bundled worker's is `echo_value`). JSON
    /// has no bytes and no integer map keys; an answer's bytes print as an array of numbers,
    /// its integer keys as strings, and a NaN or infinite float as null.
    #[command(after_help = EXIT_CODES)]
    Call(call::Args),
    /// Time the worker's `echo` method (64 bytes each way) beside a raw pipe echo, in the
    /// same run, interleaved: round-trip latency and pipelined throughput, medians.
    #[command(after_help = EXIT_CODES)]
    Bench(bench::Args),
    /// The raw pipe echo `bench` measures beside airlock: this tool re-executed.
    #[command(hide = true)]
    RawEcho,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::RawEcho => bench::raw_echo().map_err(|err| CliError::local("raw echo", err)),
        Command::Probe(args) => on_runtime(cli.verbose, probe::run(args)),
        Command::Call(args) => on_runtime(cli.verbose, call::run(args)),
        Command::Bench(args) => on_runtime(cli.verbose, bench::run(args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("airlock: {err}");
            err.exit_code()
        }
    }
}

/// Runs `command` on a current-thread runtime (every hop of a call stays on one thread), with
/// the host's logs on stderr.
fn on_runtime(
    verbose: bool,
    command: impl std::future::Future<Output = Result<(), CliError>>,
) -> Result<(), CliError> {
    log_to_stderr(verbose);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| CliError::local("could not start the async runtime", err))?;
    runtime.block_on(command)
}

/// A host for `worker` run with `args`, with every other setting at its default (the default
/// confinement among them).
fn host_builder(worker: PathBuf, args: Vec<OsString>) -> HostBuilder {
    args.into_iter()
        .fold(Host::builder(worker), |builder, arg| builder.arg(arg))
}

/// The host library's logs (`tracing`) on stderr: WARN and above, or INFO with `--verbose`.
fn log_to_stderr(verbose: bool) {
    let level = if verbose {
        tracing_subscriber::filter::LevelFilter::INFO
    } else {
        tracing_subscriber::filter::LevelFilter::WARN
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
