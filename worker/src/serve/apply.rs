//! Applying what the session decided: frames fed to it (and those already readable gathered),
//! its events turned into calls, cancels and the end of serving, and each call's updates and
//! one terminal frame sent.

use airlock_codec::Limits;
use airlock_protocol::transport::FrameReceiver;
use airlock_protocol::{
    CallId, CloseReason, ErrorKind, RemoteError, ReplyError, Transmit, TransportError, WorkerEvent,
    WorkerSession,
};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::calls::Calls;
use super::Stop;
use crate::handler::Reply;
use crate::progress::Update;
use crate::ServeError;

/// Most frames [`gather`] applies in one turn: enough that pipelined answers share writes, few
/// enough that a long run of them does not hold up the first answers.
const GATHER: usize = 64;

/// Hands the session what the receiver produced: `Ok(true)` for a frame, `Ok(false)` at the
/// end of the stream.
pub(super) fn feed(
    session: &mut WorkerSession,
    incoming: Result<Option<Bytes>, TransportError>,
) -> Result<bool, ServeError> {
    match incoming {
        Ok(Some(frame)) => {
            session.handle_frame(frame);
            Ok(true)
        }
        // End of stream, or a stream the host broke: either way the host is gone.
        Ok(None) | Err(TransportError::Frame(_)) => {
            session.handle_eof();
            Ok(false)
        }
        Err(err) => Err(ServeError::Connection(err)),
    }
}

/// Applies up to [`GATHER`] more frames that need no waiting: decoded already, or readable at
/// once (`poll_recv` with a waker that does nothing; a frame not yet whole stays buffered).
/// What the session queued to send moves into `outbox` as it goes, so a blocking handler may
/// run on the loop only while that is empty and no write is in flight (`writing`): nothing
/// gathered so far then waits for it. It stops after such a handler ran, whose answer must
/// not wait either. Returns how many frames it applied, or how serving ends.
pub(super) fn gather<R: FrameReceiver>(
    applying: &mut Applying<'_, R>,
    outbox: &mut Vec<Transmit>,
    writing: bool,
) -> Result<usize, Stop> {
    let mut frames = 0;
    while frames < GATHER && !applying.calls.ran_on_loop {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let std::task::Poll::Ready(incoming) = applying.receiver.poll_recv(&mut cx) else {
            break;
        };
        let was_frame = feed(applying.session, incoming).map_err(Err)?;
        outbox.extend(std::iter::from_fn(|| applying.session.poll_transmit()));
        if let Some(end) = applying.events(!writing && outbox.is_empty()) {
            return Err(end);
        }
        if !was_frame {
            break;
        }
        frames += 1;
    }
    Ok(frames)
}

/// Sends a handler's progress update. One the session refuses (over the frame cap, a call
/// already cancelled) is dropped: the handler's quota was checked when it sent it, and a
/// cancelled call's updates are nobody's business.
pub(super) fn send_update(session: &mut WorkerSession, id: CallId, body: Bytes) {
    let _ = session.reply_progress(id, body);
}

/// Sends a finished call's one terminal frame, after every update its handler sent (they are
/// queued before the handler returns, so draining the queue first keeps them ahead of the
/// answer). A response the session cannot send (larger than the host's `max_frame`) becomes a
/// `Fail`: a call is never left unanswered.
pub(super) fn answer(
    session: &mut WorkerSession,
    id: CallId,
    reply: Reply,
    pending_updates: &mut mpsc::Receiver<Update>,
) {
    while let Ok((update_id, body)) = pending_updates.try_recv() {
        send_update(session, update_id, body);
    }
    let refused = match reply {
        Ok(body) => match session.reply_return(id, body) {
            Err(ReplyError::TooLarge { len, max }) => Some(RemoteError::new(
                ErrorKind::Limit,
                &format!(
                    "the response is {len} bytes, too large for the host's frame limit of {max} \
                     bytes (HostConfig::max_frame, set with HostBuilder::protocol)"
                ),
            )),
            _ => None,
        },
        Err(error) => {
            let _ = session.reply_fail(id, &error);
            None
        }
    };
    if let Some(error) = refused {
        let _ = session.reply_fail(id, &error);
    }
}

/// The loop's state that applying the session's events touches.
pub(super) struct Applying<'a, R> {
    pub(super) session: &'a mut WorkerSession,
    pub(super) calls: &'a mut Calls,
    pub(super) limits: &'a mut Limits,
    pub(super) chosen_limits: bool,
    pub(super) receiver: &'a mut R,
    pub(super) pending_updates: &'a mut mpsc::Receiver<Update>,
}

impl<R: FrameReceiver> Applying<'_, R> {
    /// Applies the session's events; `Some` when serving should stop with that result.
    /// `loop_free`: nothing is being or waiting to be written, so a blocking handler run on the
    /// loop's thread holds up nothing but its own answer.
    pub(super) fn events(&mut self, loop_free: bool) -> Option<Stop> {
        while let Some(event) = self.session.poll_event() {
            match event {
                WorkerEvent::Welcomed(welcome) => {
                    // Frames behind the Welcome may be as large as it allows; the receiver has
                    // not looked at their prefixes yet, and adopts the cap before it does.
                    self.receiver.set_max_frame(welcome.max_frame);
                    self.calls.progress_quota = welcome.max_progress_per_call;
                    if !self.chosen_limits {
                        *self.limits = Limits::default()
                            .max_bytes(welcome.max_frame as usize)
                            .max_len(welcome.max_frame as usize);
                    }
                }
                WorkerEvent::Call { id, method, body } => {
                    let started = self.calls.start(id, &method, body, self.limits, loop_free);
                    if let Some(reply) = started {
                        answer(self.session, id, reply, self.pending_updates);
                    }
                }
                WorkerEvent::Cancel { id } => {
                    if let Some(reply) = self.calls.cancel(id) {
                        answer(self.session, id, reply, self.pending_updates);
                    }
                }
                WorkerEvent::Shutdown => {}
                WorkerEvent::Closed(reason) => {
                    return Some(match reason {
                        CloseReason::Shutdown | CloseReason::WorkerClosed => Ok(()),
                        CloseReason::Refused(r) => Err(ServeError::Refused(r)),
                        CloseReason::Violation(v) => Err(ServeError::Violation(v)),
                        _ => Ok(()),
                    });
                }
                _ => {}
            }
        }
        None
    }
}
