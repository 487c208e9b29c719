//! The one place that starts processes: print the command, run it, turn failure into an error
//! that names it.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why a subcommand stopped.
#[derive(Debug)]
pub struct Error {
    message: String,
    usage: bool,
}

impl Error {
    /// A failure while running: a command that failed, or output that made no sense.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            usage: false,
        }
    }

    /// A mistake in the command line; `main` prints the usage after it.
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            usage: true,
        }
    }

    /// Whether this is a command-line mistake.
    pub fn is_usage(&self) -> bool {
        self.usage
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// What every subcommand returns.
pub type Result<T = ()> = std::result::Result<T, Error>;

/// The repository root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// `cargo <args>`, to run from the repository root.
pub fn cargo<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut command = Command::new("cargo");
    command.args(args).current_dir(root());
    command
}

/// Prints `command`, runs it with inherited stdio, and fails unless it exits successfully.
pub fn run(command: &mut Command) -> Result {
    announce(command);
    let status = command.status().map_err(|e| cannot_start(command, &e))?;
    succeeded(command, status)
}

/// `Ok` if `command` exited with `status` successfully, else the error that names it.
fn succeeded(command: &Command, status: std::process::ExitStatus) -> Result {
    if status.success() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "command failed ({status}): {}",
            display(command)
        )))
    }
}

/// Like [`run`], but returns the command's standard output (standard error is inherited).
pub fn stdout(command: &mut Command) -> Result<String> {
    announce(command);
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| cannot_start(command, &e))?;
    succeeded(command, output.status)?;
    String::from_utf8(output.stdout)
        .map_err(|_| Error::new(format!("output is not UTF-8: {}", display(command))))
}

/// Like [`run`], but also hands each line of standard error to `on_line` as it is echoed.
pub fn run_scanning_stderr(command: &mut Command, mut on_line: impl FnMut(&str)) -> Result {
    announce(command);
    let mut child = command
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| cannot_start(command, &e))?;
    if let Some(stderr) = child.stderr.take() {
        let mut echo = std::io::stderr().lock();
        for line in BufReader::new(stderr).lines() {
            // libFuzzer output is ASCII; a line that is not valid UTF-8 is echoed as nothing.
            let line = line.unwrap_or_default();
            let _ = writeln!(echo, "{line}");
            on_line(&line);
        }
    }
    let status = child.wait().map_err(|e| cannot_start(command, &e))?;
    succeeded(command, status)
}

/// Prints `command`, runs it with its output discarded, and says whether it succeeded.
/// For probes such as "is this tool installed?"; a command that cannot start is `false`.
pub fn probe(command: &mut Command) -> bool {
    announce(command);
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn announce(command: &Command) {
    println!("+ {}", display(command));
    let _ = std::io::stdout().flush();
}

fn cannot_start(command: &Command, error: &std::io::Error) -> Error {
    Error::new(format!("could not start `{}`: {error}", display(command)))
}

/// The command as a shell line: `(cd DIR &&) VAR=value program args`, the directory shown
/// only when it is not the repository root.
fn display(command: &Command) -> String {
    let mut parts = Vec::new();
    if let Some(dir) = command.get_current_dir() {
        if dir != root() {
            let shown = dir.strip_prefix(root()).unwrap_or(dir);
            parts.push(format!("cd {} &&", quote(&shown.to_string_lossy())));
        }
    }
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            parts.push(format!(
                "{}={}",
                key.to_string_lossy(),
                quote(&value.to_string_lossy())
            ));
        }
    }
    parts.push(quote(&command.get_program().to_string_lossy()));
    parts.extend(command.get_args().map(|arg| quote(&arg.to_string_lossy())));
    parts.join(" ")
}

fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_=./:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
