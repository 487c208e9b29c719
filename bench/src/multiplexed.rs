//! The raw echo peer called by many tasks at once, each awaiting its own answer: the tasks
//! write their messages to one pipe, and one reader task hands each answer to the task waiting
//! for it. Nothing else: no framing, session, check, deadline, statistics or call table beyond
//! one slot per task. A rate that a multiplexed client on tokio reaches with this little work
//! per call (one that also batched its writes could go faster), measured beside pipelined
//! `Host::call`s on the same runtime.
//!
//! [`MultiplexedLink::with_work`] adds a fixed stretch of CPU work to each call, in its calling
//! task: how the rate falls as a client does more per call shows the budget of work per call
//! that a target ratio leaves on that runtime and machine.

use std::io::ErrorKind;
use std::process::Child;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe::{Receiver, Sender};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

use crate::links::{async_echo_peer, Budget, Error};
use crate::peer::SMALL;

/// The echo peer on two pipes registered with one runtime's reactor.
pub struct MultiplexedLink {
    shared: Arc<Shared>,
    /// Lent to the reader task for each burst.
    from: Option<Receiver>,
    child: Child,
    /// CPU work each calling task does before each message.
    work: Duration,
}

/// What the calling tasks and the reader task share.
struct Shared {
    /// Written by every calling task: a pipe takes a write of at most `PIPE_BUF` bytes whole
    /// or not at all, so messages never interleave.
    to: Sender,
    /// One slot per calling task, for the answer its message waits on; `None` once the
    /// reader has stopped, so that no task waits for an answer that cannot come.
    waiting: Mutex<Option<Vec<Option<oneshot::Sender<()>>>>>,
}

impl MultiplexedLink {
    /// Starts the raw echo peer (each 64-byte message written back as it is read), its pipes
    /// registered with `rt`'s reactor.
    pub fn echo(rt: &Runtime) -> Result<Self, Error> {
        Self::with_work(rt, Duration::ZERO)
    }

    /// The same, each calling task busy for `work` (spinning on the clock) before each
    /// message: a stand-in for what a client does per call beyond tokio's own work.
    pub fn with_work(rt: &Runtime, work: Duration) -> Result<Self, Error> {
        let (to, from, child) = async_echo_peer(rt)?;
        Ok(Self {
            shared: Arc::new(Shared {
                to,
                waiting: Mutex::new(None),
            }),
            from: Some(from),
            child,
            work,
        })
    }

    /// `n` 64-byte messages from `window` tasks of `rt` (at most 65,536), each writing its
    /// message itself and awaiting its answer before it takes the next from the burst's
    /// shared [`Budget`].
    pub fn pipelined(&mut self, rt: &Runtime, n: u32, window: u32) -> Result<Duration, Error> {
        if window == 0 {
            return Err("a window of at least one call".into());
        }
        let slots = u16::try_from(window - 1).map_err(|_| "window too large")?;
        let from = self
            .from
            .take()
            .ok_or("the reader was lost in an earlier burst")?;
        let shared = Arc::clone(&self.shared);
        let work = self.work;
        let (elapsed, from) = rt.block_on(async move {
            *lock(&shared.waiting) = Some((0..=slots).map(|_| None).collect());
            let started = Instant::now();
            let reader = tokio::spawn(answer_all(Arc::clone(&shared), from, n));
            let mut tasks = tokio::task::JoinSet::new();
            let budget = Budget::of(n);
            for slot in 0..=slots {
                tasks.spawn(call_in_turn(
                    Arc::clone(&shared),
                    slot,
                    budget.clone(),
                    work,
                ));
            }
            while let Some(done) = tasks.join_next().await {
                done??;
            }
            let from = reader.await??;
            Ok::<_, Error>((started.elapsed(), from))
        })?;
        self.from = Some(from);
        Ok(elapsed)
    }
}

impl Drop for MultiplexedLink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One task's calls, taken one by one from the burst's `budget`, each after `work` of CPU
/// work: its slot's number in the message's first two bytes.
async fn call_in_turn(
    shared: Arc<Shared>,
    slot: u16,
    budget: Budget,
    work: Duration,
) -> std::io::Result<()> {
    let mut message = [0x5au8; SMALL];
    message[..2].copy_from_slice(&slot.to_le_bytes());
    while budget.take_one() {
        busy_for(work);
        let (waiter, answer) = oneshot::channel();
        match lock(&shared.waiting).as_mut() {
            Some(waiting) => waiting[usize::from(slot)] = Some(waiter),
            None => return Err(std::io::Error::other("the reader stopped")),
        }
        loop {
            match shared.to.try_write(&message) {
                Ok(SMALL) => break,
                Ok(_) => return Err(std::io::Error::other("a message was written in part")),
                Err(err) if err.kind() == ErrorKind::WouldBlock => shared.to.writable().await?,
                Err(err) => return Err(err),
            }
        }
        answer
            .await
            .map_err(|_| std::io::Error::other("the reader stopped before this answer"))?;
    }
    Ok(())
}

/// Keeps this thread busy for `work`, reading the clock until it has passed.
fn busy_for(work: Duration) {
    if work.is_zero() {
        return;
    }
    let started = Instant::now();
    while started.elapsed() < work {
        std::hint::spin_loop();
    }
}

/// The reader task: takes what one read brings, then hands each whole answer to its slot's
/// task under one lock, until `n` have come back. However it ends, no task is left waiting.
async fn answer_all(shared: Arc<Shared>, from: Receiver, n: u32) -> std::io::Result<Receiver> {
    let read = read_answers(&shared, from, n).await;
    if read.is_err() {
        // Dropping the waiters' senders ends every task still waiting, with an error.
        lock(&shared.waiting).take();
    }
    read
}

async fn read_answers(shared: &Shared, mut from: Receiver, n: u32) -> std::io::Result<Receiver> {
    let mut buffer = vec![0u8; 1 << 16];
    let (mut held, mut answered) = (0, 0);
    while answered < n {
        let read = from.read(&mut buffer[held..]).await?;
        if read == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        held += read;
        let whole = held - held % SMALL;
        {
            let mut guard = lock(&shared.waiting);
            let waiting = guard.as_mut().ok_or(ErrorKind::BrokenPipe)?;
            for message in buffer[..whole].chunks_exact(SMALL) {
                let slot = usize::from(u16::from_le_bytes([message[0], message[1]]));
                let waiter = waiting.get_mut(slot).and_then(Option::take);
                let waiter = waiter
                    .ok_or_else(|| std::io::Error::other("an answer no task was waiting for"))?;
                let _ = waiter.send(());
                answered += 1;
            }
        }
        buffer.copy_within(whole..held, 0);
        held -= whole;
    }
    Ok(from)
}
