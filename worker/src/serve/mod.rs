//! The serving loop: one task owns the [`WorkerSession`], reads frames, runs calls and writes
//! replies.
//!
//! ```text
//!   events ──▶ transmit ──▶ wait for: a frame │ a call finishing │ the write in flight
//! ```
//!
//! No reader or writer task: the loop reads the transport itself (`recv` is cancel-safe) and
//! writes through [`Outgoing`], which completes a write on the spot when the pipe has room. A
//! call whose handler finishes on its first poll (most do) is answered inline, in the same
//! turn that received it; only a handler that has to wait becomes a task of its own. Blocking
//! handlers run on a pool thread each, bounded by `max_concurrency`; a process worker that runs
//! one handler at a time runs them on the loop's own thread (no thread hop at all). A loop that
//! owns its runtime's thread and was asked to (`Worker::idle_wait_in_os`) waits for the host in
//! the OS while it is idle, instead of through a turn of the runtime.
//!
//! One file per job: [`apply`] (frames fed to the session, its events applied, answers sent),
//! [`calls`] (the calls running and their handlers), [`spin`] (the low-latency mode) and
//! [`load_poll`] (polling under load).

mod apply;
mod calls;
mod load_poll;
mod spin;
#[cfg(all(test, feature = "pipe"))]
mod tests;

use std::collections::HashMap;
use std::time::Duration;

use airlock_codec::Limits;
use airlock_protocol::transport::{next_frame, FrameReceiver, Outgoing, Transport};
use airlock_protocol::{WorkerConfig, WorkerSession};
use tokio::sync::mpsc;

use crate::handler::ErasedHandler;
use crate::progress::UPDATE_QUEUE;
use crate::ServeError;
use apply::{answer, feed, gather, send_update, Applying};
use calls::Calls;
use load_poll::LoadPoll;
use spin::Spin;

/// Whether the serving loop's task is the only one on `runtime`: a task of a handler's that
/// is still alive (waiting on a timer, say) must not wait behind a thread blocked in the OS.
fn only_task_on(runtime: &tokio::runtime::Handle) -> bool {
    runtime.metrics().num_alive_tasks() == 1
}

/// Everything the loop needs besides the transport.
pub(crate) struct ServeSpec {
    pub(crate) config: WorkerConfig,
    pub(crate) methods: HashMap<String, ErasedHandler>,
    pub(crate) max_concurrency: usize,
    /// Budgets for decoding requests; `None`: the default budgets, with bytes and lengths
    /// raised to the host's `max_frame` once it is known.
    pub(crate) limits: Option<Limits>,
    /// The low-latency spin window, if the host asked for one (`airlock_protocol::spin`).
    pub(crate) spin: Option<Duration>,
    /// The polling window under load, if the host gave one (`airlock_protocol::spin`): opened
    /// once frames that came together are answered, never by one alone (`load_poll.rs`).
    pub(crate) load_poll: Option<Duration>,
    /// Whether a blocking handler that does not watch its cancel token may run on the serving
    /// loop's own thread when its slot is free. Only for a process worker with
    /// `max_concurrency` 1: nothing else of the worker's could run beside the handler anyway,
    /// and no host runtime shares the thread (an in-process twin's loop runs on the host's).
    pub(crate) inline_blocking: bool,
    /// Whether the loop may block its thread in the OS while it has nothing else to wait for
    /// (`FrameReceiver::wait_blocking`): asked for (`Worker::idle_wait_in_os`) by a loop that
    /// owns its runtime's one thread (`Worker::serve_blocking`). It does so only while its
    /// task is the only one on the runtime.
    pub(crate) wait_blocking: bool,
}

/// Serves calls on `transport` until the session ends: `Ok` when the host shut it down or
/// closed the channel, an error when the channel failed or the host broke the protocol. What
/// the session still had to say is written before the channel is closed; calls left running
/// are aborted.
pub(crate) async fn serve_on<T: Transport>(
    spec: ServeSpec,
    transport: T,
) -> Result<(), ServeError> {
    let (sender, mut receiver) = transport.split();
    let mut outgoing = Outgoing::new(Box::new(sender));
    outgoing.recycle_written_bodies();
    let mut outbox = outgoing.take_buffer();
    let mut session = WorkerSession::new(&spec.config);
    let (updates, mut pending_updates) = mpsc::channel(UPDATE_QUEUE);
    let mut calls = Calls::new(spec.methods, spec.max_concurrency, updates);
    calls.inline_blocking = spec.inline_blocking;
    let chosen = spec.limits;
    let mut limits = chosen.unwrap_or_default();
    // Spinning runs from the last input until the window closes, while it pays.
    let mut spin = spec.spin.map(Spin::new);
    // Polling under load, unless the low-latency mode's windows (after every frame) cover it.
    let mut load_poll = spec.load_poll.filter(|_| spin.is_none()).map(LoadPoll::new);
    // The runtime whose tasks an idle wait in the OS must not hold up, if the loop may wait so.
    let waits_on = spec.wait_blocking.then(tokio::runtime::Handle::current);
    let outcome = loop {
        calls.ran_on_loop = false;
        // Apply what the session decided (which may answer calls inline), then write
        // everything it produced in one batch, before waiting for more input.
        let mut applying = Applying {
            session: &mut session,
            calls: &mut calls,
            limits: &mut limits,
            chosen_limits: chosen.is_some(),
            receiver: &mut receiver,
            pending_updates: &mut pending_updates,
        };
        // A blocking handler may run on the loop's thread only when nothing waits to be
        // written: what the session queued so far joins the outbox first.
        outbox.extend(std::iter::from_fn(|| applying.session.poll_transmit()));
        if let Some(end) = applying.events(!outgoing.is_busy() && outbox.is_empty()) {
            break end;
        }
        // Pipelined calls: frames that are here already are applied now, so their answers
        // leave in the same write as this turn's.
        match gather(&mut applying, &mut outbox, outgoing.is_busy()) {
            Ok(0) => {}
            // Frames that came together: the host is pipelining calls, and its next batch is
            // taken in without a wake-up if it comes within the load window.
            Ok(_) => {
                Spin::frame_in(&mut spin);
                if let Some(load) = &mut load_poll {
                    load.frames_in(true);
                }
            }
            Err(end) => break end,
        }
        outbox.extend(std::iter::from_fn(|| session.poll_transmit()));
        if !outbox.is_empty() && !outgoing.is_busy() {
            let batch = std::mem::replace(&mut outbox, outgoing.take_buffer());
            if let Some(Err(err)) = outgoing.start(batch).await {
                break Err(ServeError::Connection(err));
            }
        }
        if session.is_drained() && outbox.is_empty() && !outgoing.is_busy() {
            break Ok(());
        }
        // Nothing left to do but wait for the host.
        let quiet = calls.none_running()
            && pending_updates.is_empty()
            && outbox.is_empty()
            && !outgoing.is_busy();
        let spinning = match (&mut spin, &mut load_poll) {
            (Some(spin), _) => spin.spinning(),
            (None, Some(load)) => load.turn(quiet),
            (None, None) => false,
        };
        // A loop that owns its thread waits in the OS (one blocking `read`, or a `ppoll` and a
        // `read`, where a turn of the runtime would poll for events, turn its timers and
        // schedule this task). What came is taken by the `next_frame` arm below at once.
        let alone = quiet && waits_on.as_ref().is_some_and(only_task_on);
        if alone && !spinning {
            receiver.wait_blocking();
        } else if alone {
            if let Some(spin) = spin.as_mut() {
                spin.in_place(&mut receiver);
            }
        }
        tokio::select! {
            biased;
            incoming = next_frame(&mut receiver) => match feed(&mut session, incoming) {
                Ok(true) => {
                    Spin::frame_in(&mut spin);
                    if let Some(load) = &mut load_poll {
                        load.frames_in(false);
                    }
                }
                Ok(false) => {}
                Err(err) => break Err(err),
            },
            Some((id, reply)) = calls.next_finished() => {
                answer(&mut session, id, reply, &mut pending_updates);
            }
            Some((id, body)) = pending_updates.recv() => send_update(&mut session, id, body),
            // Low-latency mode or load: nothing is ready yet; go round again instead of
            // sleeping, so the runtime polls the channel without a wake-up, until the window
            // closes.
            () = tokio::task::yield_now(), if spinning => continue,
            written = outgoing.finish() => if let Err(err) = written {
                break Err(ServeError::Connection(err));
            },
        }
    };
    // Flush what is left (the last replies), then close our side.
    outbox.extend(std::iter::from_fn(|| session.poll_transmit()));
    let flushed = async {
        if outgoing.is_busy() {
            outgoing.finish().await?;
        }
        if !outbox.is_empty() {
            if let Some(written) = outgoing.start(outbox).await {
                written?;
            }
        }
        outgoing.close().await
    };
    let _ = flushed.await;
    calls.abort_all();
    outcome
}

/// How serving ends.
type Stop = Result<(), ServeError>;
