//! `airlock call`: one dynamic call, JSON in and out.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use airlock_host::{is_valid_method_name, DEFAULT_CALL_TIMEOUT, MAX_TIMEOUT};

use crate::error::CliError;

/// `airlock call [--timeout SECONDS] WORKER METHOD JSON [-- ARGS...]`
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The call's deadline, in seconds (decimals allowed); when it passes, the call fails and
    /// the worker is killed. Default: the host's own, 30 seconds.
    #[arg(long, value_name = "SECONDS", value_parser = parse_timeout)]
    timeout: Option<Duration>,
    /// The worker program.
    worker: PathBuf,
    /// The method to call: 1-64 bytes of [A-Za-z0-9._-].
    method: String,
    /// The request, one JSON value.
    json: String,
    /// Arguments for the worker program, after `--`.
    #[arg(last = true)]
    args: Vec<OsString>,
}

/// A deadline in seconds: more than zero, at most `MAX_TIMEOUT`.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    match Duration::try_from_secs_f64(seconds) {
        Ok(timeout) if !timeout.is_zero() && timeout <= MAX_TIMEOUT => Ok(timeout),
        _ => Err(format!(
            "a timeout is more than 0 and at most {} seconds",
            MAX_TIMEOUT.as_secs()
        )),
    }
}

/// Checks the method name and the JSON, spawns the worker, makes the call, prints the answer.
/// Nothing is started unless the request is well formed.
pub async fn run(args: Args) -> Result<(), CliError> {
    if !is_valid_method_name(&args.method) {
        return Err(CliError::Usage(format!(
            "`{}` is not a method name: a method name is 1-64 bytes of [A-Za-z0-9._-]",
            args.method.escape_debug()
        )));
    }
    let request = crate::json::parse(&args.json)
        .map_err(|err| CliError::Usage(format!("the request is not JSON: {err}")))?;
    let host = crate::host_builder(args.worker, args.args)
        .call_timeout(args.timeout.unwrap_or(DEFAULT_CALL_TIMEOUT))
        .spawn()
        .await?;
    let answer = host.call_value(&args.method, &request).await;
    host.shutdown().await;
    let answer = answer.map_err(|err| CliError::call(&args.method, err))?;
    writeln!(std::io::stdout().lock(), "{}", crate::json::render(&answer))
        .map_err(|err| CliError::local("could not write the answer", err))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_timeout_is_the_one_the_help_names() {
        assert_eq!(DEFAULT_CALL_TIMEOUT, Duration::from_secs(30));
    }

    #[test]
    fn a_timeout_is_positive_finite_and_within_max_timeout() {
        assert_eq!(parse_timeout("0.25"), Ok(Duration::from_millis(250)));
        for refused in ["0", "-1", "NaN", "inf", "1e12", "soon"] {
            assert!(parse_timeout(refused).is_err(), "{refused}");
        }
    }
}
