//! The worker's stderr reaches the host's log one line at a time, each line cut at
//! `StderrPolicy::max_line` bytes (and marked `[truncated]`), with every control character
//! replaced, so a worker can neither flood the log with one endless line nor write terminal
//! escapes or forged line breaks into it. Alone in its test binary: it installs the global
//! tracing subscriber that records the relayed lines.

use std::time::Duration;

use airlock_host::{Host, StderrPolicy};
use airlock_tests::capture::captured;
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::Print;

const MAX_LINE: usize = 64;

/// The relayed lines that contain `marker`, once at least one has arrived (at most 5 s), with
/// a moment more for a second copy (the pipe worker's stdout is its stderr too).
async fn relayed(marker: &str) -> Vec<String> {
    captured()
        .first_line_containing(marker, Duration::from_secs(5))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    captured().lines_containing(marker)
}

/// What the relay should log for `raw`: its first `MAX_LINE` bytes (ASCII here), each control
/// character replaced by a space.
fn sanitized_prefix(raw: &str) -> String {
    raw[..raw.len().min(MAX_LINE)]
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stderr_line_is_cut_at_max_line_and_stripped_of_controls() {
    captured();
    let host = Host::builder(worker_bin())
        .stderr_policy(StderrPolicy {
            max_line: MAX_LINE,
            ..StderrPolicy::default()
        })
        .spawn()
        .await
        .unwrap();

    // An escape sequence, a bell, a carriage return and a delete early in the line, then far
    // more than `MAX_LINE` bytes.
    let long = format!("long-marker \x1b[31mred\x07\rback\x7f {}", "x".repeat(1000));
    assert!(long.len() > MAX_LINE);
    assert!(long[..MAX_LINE].chars().filter(|c| c.is_control()).count() >= 4);
    assert_eq!(host.call::<Print>(&long).await, Ok(()));
    let lines = relayed("long-marker").await;
    let expected = format!("{} [truncated]", sanitized_prefix(&long));
    for line in &lines {
        assert_eq!(line, &expected, "relayed as {line:?}");
        assert!(!line.chars().any(|c| c.is_control()), "{line:?}");
    }

    // A short line keeps all of its text and gets no marker; its controls are replaced too.
    let short = "short-marker \x1b[2Jcleared";
    assert!(short.len() < MAX_LINE);
    assert_eq!(host.call::<Print>(&short.to_string()).await, Ok(()));
    for line in relayed("short-marker").await {
        assert_eq!(line, sanitized_prefix(short), "relayed as {line:?}");
    }

    // Cut lines are relayed, not dropped.
    assert_eq!(host.stats().stderr_lines_dropped, 0);
    host.shutdown().await;
}
