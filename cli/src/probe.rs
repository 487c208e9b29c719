//! `airlock probe`: spawn, handshake, report, shut down.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use airlock_host::{ConfinementMode, WorkerInfo, PROTOCOL_VERSION};

use crate::error::CliError;

/// `airlock probe WORKER [ARGS]...`
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The worker program.
    worker: PathBuf,
    /// Arguments for the worker program.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

/// Spawns the worker, prints [`report`] of it, and shuts it down.
pub async fn run(args: Args) -> Result<(), CliError> {
    let host = crate::host_builder(args.worker, args.args).spawn().await?;
    let text = report(host.worker_info());
    host.shutdown().await;
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .map_err(|err| CliError::local("could not write the report", err))
}

/// One `key: value` line per fact: the worker's identity from its `Hello` (its own word), the
/// protocol version the handshake pinned, and the confinement the host read back from
/// `/proc/<pid>` (its own check).
fn report(info: &WorkerInfo) -> String {
    let c = &info.confinement;
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let mode = match c.mode {
        ConfinementMode::Strict => "strict",
        ConfinementMode::BestEffort => "best-effort",
        ConfinementMode::None => "none",
        _ => "other",
    };
    let missing: Vec<String> = c.missing.iter().map(ToString::to_string).collect();
    let mut out = String::new();
    let mut line = |key: &str, value: &dyn std::fmt::Display| {
        let _ = writeln!(out, "{key}: {value}");
    };
    line("name", &info.name);
    line("version", &info.version);
    line("protocol", &PROTOCOL_VERSION);
    line("methods", &info.methods.join(" "));
    line("confinement", &mode);
    line("pid", &c.pid);
    line("uid", &c.uid);
    line("namespaces", &yes_no(c.namespaces));
    line(
        "landlock_abi",
        &c.landlock_abi
            .map_or_else(|| "none".to_owned(), |abi| abi.to_string()),
    );
    line("seccomp_filters", &c.seccomp_filters);
    line("inherited_filters", &c.inherited_filters);
    line("worker_filter", &yes_no(c.worker_filter));
    line("no_new_privs", &yes_no(c.no_new_privs));
    line("no_capabilities", &yes_no(c.no_capabilities));
    line("rlimits", &yes_no(c.rlimits));
    line("cgroup", &yes_no(c.cgroup));
    line(
        "missing",
        &if missing.is_empty() {
            "none".to_owned()
        } else {
            missing.join(" ")
        },
    );
    out
}
