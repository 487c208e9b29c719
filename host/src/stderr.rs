//! Relaying a worker's stderr into `tracing`, bounded, on a thread of its own.
//!
//! Read in fixed chunks and split on newlines; each line is cut at `max_line` bytes and every
//! character that could forge or hide log text (controls, line separators, bidi and invisible
//! format characters) replaced, so a worker cannot forge log lines or terminal escapes; lines
//! beyond `max_lines_per_second` are dropped and counted. The pipe is always drained, so a
//! flooding worker never stalls and never grows the host's memory.
//!
//! The pipe is read on a thread of its own, never on the runtime's: a worker's write to the
//! pipe holds the pipe's lock while it copies, a worker can hold it in the kernel (a `splice`
//! from an empty socket into the pipe, where no filter refuses it) or make the copy last
//! seconds (SECURITY.md), and a read of the pipe waits for that lock. Only this thread waits;
//! the runtime, the worker's deadlines and every other worker go on. (A Unix socket would share
//! no lock, but `/dev/stderr` cannot be opened on one, and before Linux 6.16 a descriptor
//! passed over it would be closed by the reader.)
//!
//! When the worker is gone the relay is told to stop: it logs what is already in the pipe and
//! ends, without waiting for more, within [`STOPPING_AT_MOST`]. A grandchild that escaped the
//! worker's process group may still hold the pipe; it must not keep a host thread and
//! descriptor, or the host's log. One that holds the pipe's lock in the kernel for good (only
//! an unconfined one can) keeps this thread until it lets go.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use tokio::sync::oneshot;

use crate::config::StderrPolicy;
use crate::{STDERR_TAIL_LINE, STDERR_TAIL_LINES};

const CHUNK: usize = 8192;

/// Once the worker is gone, how long a read may wait for its last buffered lines.
const LAST_LINES_WAIT: Duration = Duration::from_millis(10);

/// The last lines the current worker wrote to stderr, relayed or not: what a failed spawn's
/// [`HandshakeError`](crate::HandshakeError) shows. At most [`STDERR_TAIL_LINES`] lines of at
/// most [`STDERR_TAIL_LINE`] bytes, cleaned like relayed lines; the buffers are reused, so a
/// flood costs no allocation per line. Each worker's relay writes under the worker's own
/// turn ([`clear`](Self::clear) starts one): a relay of an earlier worker still running (held
/// on its pipe's lock, or reading its last lines) never writes into a later worker's tail.
#[derive(Debug, Default)]
pub(crate) struct StderrTail {
    lines: Mutex<Tail>,
}

#[derive(Debug, Default)]
struct Tail {
    /// Whose lines these are: bumped by each `clear`.
    turn: u64,
    lines: VecDeque<String>,
}

impl StderrTail {
    /// Forgets the last worker's lines and starts the next worker's turn, which its relay
    /// writes under.
    pub(crate) fn clear(&self) -> u64 {
        let mut tail = self.lock();
        tail.lines.clear();
        tail.turn += 1;
        tail.turn
    }

    /// The lines kept, oldest first.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lock().lines.iter().cloned().collect()
    }

    /// Keeps `line`, if `turn` is still the current worker's.
    fn push(&self, turn: u64, line: &[u8]) {
        let mut tail = self.lock();
        if tail.turn != turn {
            return;
        }
        let lines = &mut tail.lines;
        let mut kept = if lines.len() >= STDERR_TAIL_LINES {
            lines.pop_front().unwrap_or_default()
        } else {
            String::new()
        };
        kept.clear();
        clean_into(&mut kept, &line[..line.len().min(STDERR_TAIL_LINE)]);
        lines.push_back(kept);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tail> {
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A worker's stderr relay: the switch that tells its thread the worker is gone, and word
/// of the thread's end.
pub(crate) struct StderrRelay {
    /// Dropped when the worker is gone: the thread sees its pipe's end.
    stop: Option<OwnedFd>,
    ended: oneshot::Receiver<()>,
}

impl StderrRelay {
    /// Starts relaying `stderr` (the host's end of the worker's stderr pipe) on a thread of its
    /// own, under `label`. `dropped` counts lines not relayed (over rate or length); `tail`
    /// keeps the last lines whether relayed or not, under the worker's `turn` of it. Lines go
    /// to the `tracing` dispatcher of the calling thread, or to the global one at each line if
    /// the calling thread has none (one installed later is then used; so does a thread that
    /// set `NoSubscriber` as its default to silence logging).
    pub(crate) fn start(
        stderr: OwnedFd,
        label: String,
        policy: StderrPolicy,
        dropped: Arc<AtomicU64>,
        (tail, turn): (Arc<StderrTail>, u64),
    ) -> std::io::Result<Self> {
        rustix::fs::fcntl_setfl(&stderr, rustix::fs::OFlags::NONBLOCK)?;
        let (stopped, stop) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let (end, ended) = oneshot::channel();
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        let dispatch = (!dispatch.is::<tracing::subscriber::NoSubscriber>()).then_some(dispatch);
        let mut lines = Lines::new(label, policy, dropped, (tail, turn));
        // The default stack: the lines go through the application's subscriber, whose stack
        // needs are its own (an overflow would abort the host).
        std::thread::Builder::new()
            .name("airlock-stderr".into())
            .spawn(move || {
                let mut work = || {
                    relay(&stderr, &stopped, &mut lines);
                    lines.finish();
                };
                match &dispatch {
                    Some(dispatch) => tracing::dispatcher::with_default(dispatch, work),
                    None => work(),
                }
                // Both descriptors closed before the word goes out: whoever waits for the
                // relay's end finds none of its descriptors left open.
                drop(stderr);
                drop(stopped);
                let _ = end.send(());
            })?;
        Ok(Self {
            stop: Some(stop),
            ended,
        })
    }

    /// Tells the relay the worker is gone: it logs what is buffered and ends.
    pub(crate) fn worker_gone(&mut self) {
        self.stop = None;
    }

    /// Resolves once the relay's thread has ended (or was lost).
    pub(crate) async fn ended(&mut self) {
        let _ = (&mut self.ended).await;
    }
}

/// Once the worker is gone, the longest the relay goes on reading what a worker's escaped
/// descendants keep writing: half the supervisor's wait for it (`STDERR_DRAIN`), so that on a
/// busy machine too the relay has ended, its descriptors closed, when the wait does.
const STOPPING_AT_MOST: Duration = Duration::from_millis(50);

/// Reads `stderr` into `lines` until it ends, or until `stopped` (the read end of the stop
/// switch) says the worker is gone and nothing more comes within [`LAST_LINES_WAIT`] (and at
/// most [`STOPPING_AT_MOST`]).
fn relay(stderr: &OwnedFd, stopped: &OwnedFd, lines: &mut Lines) {
    let mut chunk = vec![0u8; CHUNK];
    let mut stopping_until: Option<Instant> = None;
    loop {
        let (ready, stop) = match stopping_until {
            None => {
                let mut fds = [
                    PollFd::new(stderr, PollFlags::IN),
                    PollFd::new(stopped, PollFlags::IN),
                ];
                match poll(&mut fds, None) {
                    Ok(_) => (!fds[0].revents().is_empty(), !fds[1].revents().is_empty()),
                    Err(Errno::INTR) => continue,
                    Err(_) => return,
                }
            }
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                let Ok(wait) = Timespec::try_from(left.min(LAST_LINES_WAIT)) else {
                    return;
                };
                if left.is_zero() {
                    return;
                }
                let mut fds = [PollFd::new(stderr, PollFlags::IN)];
                match poll(&mut fds, Some(&wait)) {
                    Ok(0) => return,
                    Ok(_) => (true, false),
                    Err(Errno::INTR) => continue,
                    Err(_) => return,
                }
            }
        };
        if stop && stopping_until.is_none() {
            stopping_until = Some(Instant::now() + STOPPING_AT_MOST);
        }
        if !ready {
            continue;
        }
        match rustix::io::read(stderr, &mut chunk) {
            Ok(0) => return,
            Ok(read) => lines.take(chunk.get(..read).unwrap_or_default()),
            Err(Errno::AGAIN | Errno::INTR) => {}
            Err(_) => return,
        }
    }
}

/// The relay's line state: the line being read, the rate window, and where lines go.
struct Lines {
    label: String,
    policy: StderrPolicy,
    dropped: Arc<AtomicU64>,
    tail: Arc<StderrTail>,
    /// The worker's turn of `tail`.
    turn: u64,
    line: Vec<u8>,
    truncated: bool,
    window_start: Instant,
    in_window: u32,
}

impl Lines {
    fn new(
        label: String,
        policy: StderrPolicy,
        dropped: Arc<AtomicU64>,
        (tail, turn): (Arc<StderrTail>, u64),
    ) -> Self {
        Self {
            turn,
            line: Vec::with_capacity(policy.max_line.min(CHUNK)),
            label,
            policy,
            dropped,
            tail,
            truncated: false,
            window_start: Instant::now(),
            in_window: 0,
        }
    }

    /// Takes bytes read: each whole line is kept in the tail and relayed within the rate.
    fn take(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if byte != b'\n' {
                if self.line.len() < self.policy.max_line {
                    self.line.push(byte);
                } else {
                    self.truncated = true;
                }
                continue;
            }
            self.tail.push(self.turn, &self.line);
            if self.window_start.elapsed() >= Duration::from_secs(1) {
                self.window_start = Instant::now();
                self.in_window = 0;
            }
            if self.in_window < self.policy.max_lines_per_second {
                self.in_window += 1;
                emit(&self.label, &self.line, self.truncated);
            } else {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            self.line.clear();
            self.truncated = false;
        }
    }

    /// The stream is over: a last line without its newline is kept and relayed.
    fn finish(&mut self) {
        if !self.line.is_empty() {
            self.tail.push(self.turn, &self.line);
            emit(&self.label, &self.line, self.truncated);
            self.line.clear();
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A relay of an earlier worker (held on its pipe's lock, or reading its last lines) never
    /// writes into a later worker's tail, which a failed spawn of that worker would show.
    #[test]
    fn a_relay_of_an_earlier_worker_never_writes_into_a_later_workers_tail() {
        let tail = StderrTail::default();
        let first = tail.clear();
        tail.push(first, b"first's line");
        assert_eq!(tail.lines(), ["first's line"]);
        let second = tail.clear();
        tail.push(first, b"first's late line");
        tail.push(second, b"second's line");
        assert_eq!(tail.lines(), ["second's line"]);
    }
}
