//! Writing to the worker: frames queued in the session's order, at most one writer at a time,
//! and the writer task that finishes what a non-blocking write could not.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use airlock_protocol::transport::Outgoing;
use airlock_protocol::{Transmit, TransportError};
use tokio::sync::Notify;

use super::Live;

/// The write side of one worker's channel: frames queued in the order the session produced
/// them, and at most one party writing at a time.
///
/// Whoever queues frames while nobody is writing becomes the writer and makes one
/// non-blocking write itself ([`write_now`](Self::write_now)); a write the OS cannot take at
/// once, or frames queued meanwhile, go to the writer task ([`drive_writes`]), which keeps the
/// send deadline. A failed write may have stopped inside a frame: nothing is written after it.
pub(crate) struct Wire {
    /// Whether callers and the reader may write themselves. Only when the worker cannot hold
    /// its pipes' locks inside the kernel for as long as it likes (its verified filter denies
    /// `userfaultfd` and answers `splice`, `tee`, `vmsplice` and `sendfile` `ENOSYS`; a copy
    /// it makes slow still holds one for seconds, SECURITY.md): otherwise every write goes
    /// through the writer task, so that a caller can always give up its call.
    pub(super) direct: bool,
    /// The host's runtime: a write that has to wait arms its send deadline on this runtime's
    /// timer, whichever runtime the caller that began it runs on.
    runtime: tokio::runtime::Handle,
    queue: Mutex<Queue>,
    /// The sender; taken out by the writer while it writes.
    outgoing: Mutex<Option<Outgoing>>,
    /// Wakes the writer task: a write is in flight, or frames wait.
    resume: Notify,
    /// Tells whoever waits that nobody is writing any more.
    idle: Notify,
    failed: AtomicBool,
}

#[derive(Default)]
struct Queue {
    frames: Vec<Transmit>,
    /// Someone is writing (or a write failed and nothing more will be written).
    writing: bool,
    /// The session closed: call frames are dropped; only last words go out.
    closed: bool,
    /// An emptied batch buffer, reused.
    spare: Vec<Transmit>,
    /// The writer should let other tasks run once before it writes: their frames join the
    /// same write.
    gather: bool,
}

impl Wire {
    /// A wire over `outgoing`, on the current (the supervisor's) runtime.
    pub(crate) fn new(outgoing: Outgoing, direct: bool) -> Self {
        Self {
            direct,
            runtime: tokio::runtime::Handle::current(),
            queue: Mutex::new(Queue::default()),
            outgoing: Mutex::new(Some(outgoing)),
            resume: Notify::new(),
            idle: Notify::new(),
            failed: AtomicBool::new(false),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn sender(&self) -> MutexGuard<'_, Option<Outgoing>> {
        self.outgoing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a write failed: the connection can no longer be written.
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    pub(super) fn take_spare(&self) -> Vec<Transmit> {
        std::mem::take(&mut self.queue().spare)
    }

    /// Returns a batch buffer [`take_spare`](Self::take_spare) lent that was not needed.
    pub(super) fn give_back(&self, unused: Vec<Transmit>) {
        keep_larger(&mut self.queue().spare, unused);
    }

    /// Queues `frames`; returns the batch to write if the caller became the writer.
    pub(super) fn push(&self, mut frames: Vec<Transmit>) -> Option<Vec<Transmit>> {
        let mut queue = self.queue();
        if queue.closed {
            return None;
        }
        if queue.writing {
            queue.frames.append(&mut frames);
            queue.spare = frames;
            return None;
        }
        queue.writing = true;
        if queue.frames.is_empty() {
            // Nothing queued before: these frames are the batch, as they are.
            return Some(frames);
        }
        queue.frames.append(&mut frames);
        queue.spare = frames;
        Some(std::mem::take(&mut queue.frames))
    }

    /// The session closed: frames not yet written are dropped (their calls are reported lost
    /// and must never reach a worker being put down), and nothing more is queued.
    pub(super) fn close(&self) {
        let mut queue = self.queue();
        queue.closed = true;
        queue.frames.clear();
    }

    /// Writes `batch` (this party is the writer) with one non-blocking attempt; hands what is
    /// left to the writer task. True if the write failed (the supervisor must hear of it).
    pub(super) fn write_now(&self, batch: Vec<Transmit>) -> bool {
        let Some(mut outgoing) = self.sender().take() else {
            return self.fail();
        };
        // Inside the host's runtime, whatever runtime (or none) this caller runs on: a write
        // that has to wait registers its readiness and its send deadline there, where the
        // writer task finishes it.
        let started = {
            let _host_runtime = self.runtime.enter();
            now_or_never(outgoing.start(batch))
        };
        let spare = outgoing.take_buffer();
        *self.sender() = Some(outgoing);
        match started {
            // Written whole: done, unless frames were queued meanwhile.
            Some(Some(Ok(()))) => {
                let mut queue = self.queue();
                keep_larger(&mut queue.spare, spare);
                if queue.frames.is_empty() {
                    queue.writing = false;
                    drop(queue);
                    self.idle.notify_waiters();
                } else {
                    drop(queue);
                    self.resume.notify_one();
                }
                false
            }
            Some(Some(Err(_))) => self.fail(),
            // In flight (the pipe is full): the writer task finishes it under the deadline.
            Some(None) | None => {
                self.resume.notify_one();
                false
            }
        }
    }

    /// This party became the writer but must not write itself: the writer task writes the
    /// batch (ahead of anything queued since, which came after it).
    pub(super) fn hand_off(&self, mut batch: Vec<Transmit>, gather: bool) {
        let mut queue = self.queue();
        queue.gather |= gather;
        if queue.frames.is_empty() {
            // The batch becomes the queue, and the queue's empty buffer the next spare.
            std::mem::swap(&mut queue.frames, &mut batch);
            keep_larger(&mut queue.spare, batch);
        } else {
            queue.frames.splice(0..0, batch);
        }
        drop(queue);
        self.resume.notify_one();
    }

    fn fail(&self) -> bool {
        self.failed.store(true, Ordering::Release);
        self.idle.notify_waiters();
        true
    }

    /// Replaces whatever is queued with the closed session's last frames and waits, at most
    /// `within`, until they are written.
    ///
    /// The writer task writes them (the supervisor, which calls this, never writes itself).
    pub(crate) async fn write_last_words(&self, words: Vec<Transmit>, within: std::time::Duration) {
        let idle = self.idle.notified();
        let mut idle = std::pin::pin!(idle);
        idle.as_mut().enable();
        let start_writer = {
            let mut queue = self.queue();
            queue.frames = words;
            !std::mem::replace(&mut queue.writing, true)
        };
        if start_writer {
            self.resume.notify_one();
        }
        if !self.failed() {
            let _ = tokio::time::timeout(within, idle).await;
        }
    }
}

/// The writer task: finishes writes the OS could not take at once (under the sender's send
/// deadline) and writes frames queued meanwhile, then hands writing back. Ends when a write
/// fails, after telling the supervisor.
pub(crate) async fn drive_writes(wire: Arc<Wire>, live: Arc<Live>) {
    loop {
        wire.resume.notified().await;
        if std::mem::take(&mut wire.queue().gather) {
            tokio::task::yield_now().await;
        }
        let Some(outgoing) = wire.sender().take() else {
            continue;
        };
        if write_queued(&wire, outgoing).await.is_err() {
            wire.fail();
            live.wake.notify_one();
            return;
        }
        wire.idle.notify_waiters();
    }
}

/// Finishes the write in flight, then writes queued batches until the queue is empty, when
/// writing is handed back: the sender is put back and the flag cleared under the queue's lock,
/// so a party that queues after that finds the sender and writes itself. A failed write keeps
/// the flag set: nothing is written after it.
async fn write_queued(wire: &Wire, mut outgoing: Outgoing) -> Result<(), TransportError> {
    loop {
        if outgoing.is_busy() {
            outgoing.finish().await?;
        }
        let batch = {
            let mut queue = wire.queue();
            keep_larger(&mut queue.spare, outgoing.take_buffer());
            if queue.frames.is_empty() {
                *wire.sender() = Some(outgoing);
                queue.writing = false;
                return Ok(());
            }
            std::mem::take(&mut queue.frames)
        };
        if let Some(result) = outgoing.start(batch).await {
            result?;
        }
    }
}

/// Keeps the emptied batch buffer with more room in `spare`, so the next batch is gathered
/// without an allocation.
fn keep_larger(spare: &mut Vec<Transmit>, mut other: Vec<Transmit>) {
    if other.capacity() > spare.capacity() {
        other.clear();
        *spare = other;
    }
}

/// Polls `future` once, with a waker that does nothing: for futures that finish on their first
/// poll or hand their remaining work to a task that will poll them again.
pub(super) fn now_or_never<F: Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::recording::recording_wire;
    use bytes::Bytes;

    fn frame(name: &'static [u8]) -> Vec<Transmit> {
        vec![Transmit {
            head: Bytes::from_static(name),
            body: Bytes::new(),
        }]
    }

    /// Runs the writer task on a current-thread runtime with two callers ready beside it, each
    /// queueing one frame; returns the writes made.
    fn writes_after(gather: bool) -> Vec<Vec<Bytes>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (wire, writes) = recording_wire();
            let writer = tokio::spawn(drive_writes(Arc::clone(&wire), Arc::new(Live::new(None))));
            // The first caller became the writer and leaves its write to the writer task; two
            // more callers, ready to run, queue theirs (and write them themselves if they find
            // nobody writing).
            let first = wire.push(frame(b"a")).expect("nobody was writing");
            wire.hand_off(first, gather);
            let later: Vec<_> = [b"b", b"c"]
                .into_iter()
                .map(|name| {
                    let wire = Arc::clone(&wire);
                    tokio::spawn(async move {
                        if let Some(batch) = wire.push(frame(name)) {
                            assert!(!wire.write_now(batch), "the write failed");
                        }
                    })
                })
                .collect();
            for caller in later {
                caller.await.unwrap();
            }
            // Let the writer finish whatever it started.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            writer.abort();
            let writes = writes.lock().unwrap().clone();
            writes
        })
    }

    #[test]
    fn frames_queued_while_a_gathering_writer_yields_join_its_write() {
        let heads = |writes: Vec<Vec<Bytes>>| -> Vec<Vec<&'static [u8]>> {
            let name = |head: &Bytes| -> &'static [u8] {
                match &head[..] {
                    b"a" => b"a",
                    b"b" => b"b",
                    _ => b"c",
                }
            };
            writes
                .iter()
                .map(|w| w.iter().map(name).collect())
                .collect()
        };
        let a: &[u8] = b"a";
        let (b, c): (&[u8], &[u8]) = (b"b", b"c");
        // Without gathering the writer writes the first frame before the others are queued,
        // and each of them then writes its own.
        assert_eq!(heads(writes_after(false)), vec![vec![a], vec![b], vec![c]]);
        // Gathering, it lets the ready callers run first: one write for all three, in order.
        assert_eq!(heads(writes_after(true)), vec![vec![a, b, c]]);
    }
}
