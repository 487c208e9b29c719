//! Relaying a worker's stderr into `tracing`, bounded.
//!
//! Read in fixed chunks and split on newlines; each line is cut at `max_line` bytes and every
//! character that could forge or hide log text (controls, line separators, bidi and invisible
//! format characters) replaced, so a worker cannot forge log lines or terminal escapes; lines
//! beyond `max_lines_per_second` are dropped and counted. The pipe is always drained, so a
//! flooding worker never stalls and never grows the host's memory.
//!
//! When the worker is gone the relay is told to stop: it logs what is already in the pipe and
//! ends, without waiting for more. A grandchild that escaped the worker's process group may
//! still hold the pipe; it must not keep a host task and descriptor, or the host's log.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::oneshot;

use crate::config::StderrPolicy;
use crate::{STDERR_TAIL_LINE, STDERR_TAIL_LINES};

const CHUNK: usize = 8192;

/// Once the worker is gone, how long a read may wait for its last buffered lines.
const LAST_LINES_WAIT: Duration = Duration::from_millis(10);

/// The last lines the current worker wrote to stderr, relayed or not: what a failed spawn's
/// [`HandshakeError`](crate::HandshakeError) shows. At most [`STDERR_TAIL_LINES`] lines of at
/// most [`STDERR_TAIL_LINE`] bytes, cleaned like relayed lines; the buffers are reused, so a
/// flood costs no allocation per line.
#[derive(Debug, Default)]
pub(crate) struct StderrTail {
    lines: Mutex<VecDeque<String>>,
}

impl StderrTail {
    /// Forgets the last worker's lines (a new worker starts).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// The lines kept, oldest first.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lock().iter().cloned().collect()
    }

    fn push(&self, line: &[u8]) {
        let mut lines = self.lock();
        let mut kept = if lines.len() >= STDERR_TAIL_LINES {
            lines.pop_front().unwrap_or_default()
        } else {
            String::new()
        };
        kept.clear();
        clean_into(&mut kept, &line[..line.len().min(STDERR_TAIL_LINE)]);
        lines.push_back(kept);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<String>> {
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Relays `stderr` until it ends. `dropped` counts lines not relayed (over rate or length);
/// `tail` keeps the last lines whether relayed or not.
pub(crate) async fn relay<R: AsyncRead + Unpin>(
    mut stderr: R,
    label: String,
    policy: StderrPolicy,
    dropped: Arc<AtomicU64>,
    tail: Arc<StderrTail>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut stopping = false;
    let mut chunk = vec![0u8; CHUNK];
    let mut line: Vec<u8> = Vec::with_capacity(policy.max_line.min(CHUNK));
    let mut truncated = false;
    let mut window_start = Instant::now();
    let mut in_window = 0u32;
    loop {
        let read = if stopping {
            // Take what is already buffered: a read that finds nothing within a few
            // milliseconds ends the relay. (Not "the first Pending": that can also mean the
            // runtime's task budget ran out, or the data's wake-up is still on its way.)
            match tokio::time::timeout(LAST_LINES_WAIT, stderr.read(&mut chunk)).await {
                Ok(read) => read,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                read = stderr.read(&mut chunk) => read,
                _ = &mut stop => {
                    stopping = true;
                    continue;
                }
            }
        };
        let read = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &byte in chunk.iter().take(read) {
            if byte != b'\n' {
                if line.len() < policy.max_line {
                    line.push(byte);
                } else {
                    truncated = true;
                }
                continue;
            }
            tail.push(&line);
            if window_start.elapsed() >= Duration::from_secs(1) {
                window_start = Instant::now();
                in_window = 0;
            }
            if in_window < policy.max_lines_per_second {
                in_window += 1;
                emit(&label, &line, truncated);
            } else {
                dropped.fetch_add(1, Ordering::Relaxed);
            }
            line.clear();
            truncated = false;
        }
    }
    if !line.is_empty() {
        tail.push(&line);
        emit(&label, &line, truncated);
    }
}

fn emit(label: &str, line: &[u8], truncated: bool) {
    let mut text = String::with_capacity(line.len());
    clean_into(&mut text, line);
    let marker = if truncated { " [truncated]" } else { "" };
    tracing::info!(target: "airlock::worker_stderr", worker = label, "{text}{marker}");
}

/// Appends `line` to `out` as text, every character that could forge or hide log text
/// replaced by a space (invalid UTF-8 by U+FFFD).
fn clean_into(out: &mut String, line: &[u8]) {
    out.extend(String::from_utf8_lossy(line).chars().map(|c| {
        if airlock_codec::is_unsafe_in_text(c) {
            ' '
        } else {
            c
        }
    }));
}
