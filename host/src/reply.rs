//! One call's outcome, from the connection to its caller, without an allocation per call.
//!
//! The caller waits on a [`Reply`]; the connection holds the matching [`Replier`]. Both point at
//! one [`Cell`] that holds the outcome as the method's own response type: the reader decodes
//! a `Return` straight into it (no box to carry a type-erased value), and the caller takes it
//! out. Cells are recycled per response type through a free list of the thread that takes the
//! outcome ([`pair`]): a cell goes back when its caller has taken the outcome and the
//! connection has let go of it, so a host making sequential calls allocates none after its
//! first. The lists are per thread, not per host, so that callers on the runtime's threads
//! never contend for one lock or one cache line to begin a call. So cells outlive the host
//! that used them, until their thread ends: at most [`KEPT_PER_TYPE`] per response type on each
//! thread that took outcomes (a cell holds the response type inline, so a large type makes
//! large cells). A call begun on one thread and finished on another takes its cell from the
//! first thread's list and gives it to the second's, so a thread that only begins calls
//! allocates a cell for each.
//!
//! Rules: an outcome is delivered at most once (the `Replier` is consumed by it); a `Replier`
//! dropped without one answers [`CallError::Shutdown`], so no caller waits on a connection that
//! is gone; a cell is reused only when nothing but the free list refers to it.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use airlock_codec::DecodeError;

use crate::response::ResponseDecoding;
use crate::CallError;

/// Decodes a response body into `T` within the host's budgets.
pub(crate) type DecodeInto<T> = fn(&[u8], &ResponseDecoding) -> Result<T, DecodeError>;

/// Most recycled cells a thread keeps per response type: enough for the calls in flight on
/// one runtime thread in practice; beyond it, cells are freed.
const KEPT_PER_TYPE: usize = 64;

/// Where one call's outcome waits for its caller.
pub(crate) struct Cell<T> {
    inner: Mutex<Inner<T>>,
}

struct Inner<T> {
    state: State<T>,
    /// How this call's response decodes (one type can decode two ways: typed, or as a
    /// dynamic `Value`); set again each time the cell is reused.
    decode: DecodeInto<T>,
}

enum State<T> {
    /// No outcome yet; the caller's waker, once it has polled.
    Waiting(Option<Waker>),
    /// The response, decoded but not yet given to the caller (see [`Decoded`]); the caller
    /// waits on as in `Waiting`.
    Held(T, Option<Waker>),
    /// The outcome, not yet taken, with when the host accepted it if the worker gave it (a
    /// response or the handler's own error; none for a failure of the host's).
    Ready(Result<T, CallError>, Option<Instant>),
    /// Taken by the caller (or never to be: the caller is gone).
    Taken,
}

impl<T> Cell<T> {
    fn new(decode: DecodeInto<T>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                state: State::Waiting(None),
                decode,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `outcome` (over a response still held back), accepted `at` if the worker gave
    /// it; returns the caller's waker, to wake once the cell is let go. A second outcome, or
    /// one for a caller that is gone, is dropped.
    #[must_use]
    fn set(&self, outcome: Result<T, CallError>, at: Option<Instant>) -> Option<Waker> {
        // What is displaced (a held response) is dropped after the lock is released: a
        // value's `Drop` never runs under it.
        let (waker, _displaced) = {
            let mut inner = self.lock();
            match std::mem::replace(&mut inner.state, State::Taken) {
                State::Waiting(waker) => {
                    inner.state = State::Ready(outcome, at);
                    (waker, None)
                }
                State::Held(held, waker) => {
                    inner.state = State::Ready(outcome, at);
                    (waker, Some(held))
                }
                earlier => {
                    inner.state = earlier;
                    (None, None)
                }
            }
        };
        waker
    }
}

/// The connection's side of a cell, type-erased.
trait Deliver: Send + Sync {
    /// Decodes `body` into the cell, held back from the caller until
    /// [`publish`](Self::publish); on a decode error stores nothing.
    fn decode(&self, body: &[u8], limits: &ResponseDecoding) -> Result<(), DecodeError>;
    /// Gives a held response, accepted by the reader's turn that began `at`, to the caller;
    /// returns its waker.
    fn publish(&self, at: Instant) -> Option<Waker>;
    /// Stores the failure, accepted `at` if the worker gave it; returns the caller's waker.
    fn fail(&self, err: CallError, at: Option<Instant>) -> Option<Waker>;
}

impl<T: Send + 'static> Deliver for Cell<T> {
    fn decode(&self, body: &[u8], limits: &ResponseDecoding) -> Result<(), DecodeError> {
        // Decoded outside the lock: the caller may poll meanwhile.
        let decode = self.lock().decode;
        let value = crate::response::unless_it_panics(|| decode(body, limits))?;
        let mut inner = self.lock();
        match std::mem::replace(&mut inner.state, State::Taken) {
            State::Waiting(waker) => inner.state = State::Held(value, waker),
            // The caller is gone (or has an outcome): the value is not wanted.
            earlier => {
                inner.state = earlier;
                drop(inner);
                drop(value);
            }
        }
        Ok(())
    }

    fn publish(&self, at: Instant) -> Option<Waker> {
        let mut inner = self.lock();
        match std::mem::replace(&mut inner.state, State::Taken) {
            State::Held(value, waker) => {
                inner.state = State::Ready(Ok(value), Some(at));
                waker
            }
            other => {
                inner.state = other;
                None
            }
        }
    }

    fn fail(&self, err: CallError, at: Option<Instant>) -> Option<Waker> {
        self.set(Err(err), at)
    }
}

/// Where the connection sends a call's outcome: exactly once, or [`CallError::Shutdown`] when
/// dropped without one.
pub(crate) struct Replier(Option<Arc<dyn Deliver>>);

impl Replier {
    /// Decodes a `Return`'s body into the call's response type, held back from the caller
    /// until [`Decoded::publish`] (so that when one of several responses read together is a
    /// lie, the worker is cut off before any of their callers hears back). A body that does
    /// not decode is given back with its error: the caller is answered by
    /// [`fail`](Self::fail), after the worker that lied is cut off.
    pub(crate) fn returned(
        self,
        body: &[u8],
        limits: &ResponseDecoding,
    ) -> Result<Decoded, (Self, DecodeError)> {
        let Some(cell) = self.0.as_ref() else {
            return Ok(Decoded(self));
        };
        match cell.decode(body, limits) {
            Ok(()) => Ok(Decoded(self)),
            Err(err) => Err((self, err)),
        }
    }

    /// Answers the caller with `err`.
    pub(crate) fn fail(self, err: CallError) {
        self.fail_at(err, None);
    }

    /// Answers the caller with `err`, which the worker gave in the reader's turn whose clock
    /// read was `at` (the handler's own error), if it did.
    pub(crate) fn fail_at(mut self, err: CallError, at: Option<Instant>) {
        if let Some(cell) = self.0.take() {
            wake_after_release(cell.fail(err, at), cell);
        }
    }
}

/// A decoded response not yet given to its caller. Dropped unpublished, the caller gets
/// [`CallError::Shutdown`], as from a dropped [`Replier`].
pub(crate) struct Decoded(Replier);

impl Decoded {
    /// Gives the response to its caller, as accepted by the reader's turn that began `at`.
    pub(crate) fn publish(mut self, at: Instant) {
        if let Some(cell) = self.0 .0.take() {
            wake_after_release(cell.publish(at), cell);
        }
    }
}

/// Lets go of the connection's hold on a cell, then wakes its caller: woken first, a caller on
/// another thread could find the cell still held and not recycle it.
fn wake_after_release(waker: Option<Waker>, cell: Arc<dyn Deliver>) {
    drop(cell);
    if let Some(waker) = waker {
        waker.wake();
    }
}

impl Drop for Replier {
    fn drop(&mut self) {
        if let Some(cell) = self.0.take() {
            wake_after_release(cell.fail(CallError::Shutdown, None), cell);
        }
    }
}

/// The caller's side: resolves to the call's outcome, and gives its cell back to the free list
/// of the thread it is taken on, once the connection has let go of it.
pub(crate) struct Reply<T: Send + 'static> {
    cell: Option<Arc<Cell<T>>>,
    /// When the reader's turn that accepted the response began, once it is taken.
    answered_at: Option<Instant>,
}

impl<T: Send + 'static> Reply<T> {
    /// When the host accepted this call's answer (a response or the handler's own error):
    /// known once the outcome is taken, so that a caller times its call without reading the
    /// clock again. `None` before, and for a failure of the host's (a timeout, a lost worker).
    pub(crate) fn answered_at(&self) -> Option<Instant> {
        self.answered_at
    }
}

impl<T: Send + 'static> Future for Reply<T> {
    type Output = Result<T, CallError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(cell) = self.cell.as_ref() else {
            return Poll::Ready(Err(CallError::Shutdown));
        };
        let (outcome, at) = {
            let mut inner = cell.lock();
            match std::mem::replace(&mut inner.state, State::Taken) {
                State::Ready(outcome, at) => (outcome, at),
                State::Waiting(waker) => {
                    inner.state = State::Waiting(Some(renewed(waker, cx)));
                    return Poll::Pending;
                }
                State::Held(value, waker) => {
                    inner.state = State::Held(value, Some(renewed(waker, cx)));
                    return Poll::Pending;
                }
                State::Taken => (Err(CallError::Shutdown), None),
            }
        };
        self.answered_at = at;
        if let Some(cell) = self.cell.take() {
            put_back(cell);
        }
        Poll::Ready(outcome)
    }
}

/// The waker to keep: the one stored, if it wakes the same task as this poll's.
fn renewed(stored: Option<Waker>, cx: &Context<'_>) -> Waker {
    match stored {
        Some(waker) if waker.will_wake(cx.waker()) => waker,
        _ => cx.waker().clone(),
    }
}

impl<T: Send + 'static> Drop for Reply<T> {
    fn drop(&mut self) {
        if let Some(cell) = self.cell.take() {
            // The caller is gone: an outcome that still comes is dropped with the cell. One
            // already here is dropped after the lock is released.
            let _outcome = std::mem::replace(&mut cell.lock().state, State::Taken);
        }
    }
}

/// The free cells of one `Cell<T>` type, each a type-erased `Arc<Cell<T>>`.
type FreeCells = (TypeId, Vec<Arc<dyn Any + Send + Sync>>);

thread_local! {
    /// This thread's cells not in use, per response type.
    static FREE: RefCell<Vec<FreeCells>> = const { RefCell::new(Vec::new()) };
}

/// A reply and its replier for a call whose response decodes with `decode`: a cell from this
/// thread's free list, or a new one.
pub(crate) fn pair<T: Send + 'static>(decode: DecodeInto<T>) -> (Reply<T>, Replier) {
    let cell = take(decode).unwrap_or_else(|| Arc::new(Cell::new(decode)));
    let replier = Replier(Some(Arc::clone(&cell) as Arc<dyn Deliver>));
    (
        Reply {
            cell: Some(cell),
            answered_at: None,
        },
        replier,
    )
}

/// A free cell of `T` from this thread's list, reset to wait for a new outcome decoded with
/// `decode`. None when the list has none (or the thread is ending).
fn take<T: Send + 'static>(decode: DecodeInto<T>) -> Option<Arc<Cell<T>>> {
    let cell = FREE
        .try_with(|free| {
            let mut free = free.try_borrow_mut().ok()?;
            let (_, cells) = free
                .iter_mut()
                .find(|(ty, _)| *ty == TypeId::of::<Cell<T>>())?;
            cells.pop()
        })
        .ok()??;
    // Nothing else holds it: it was put back only when its caller's was its one reference,
    // and only this takes it out of the list.
    let cell = Arc::downcast::<Cell<T>>(cell).ok()?;
    *cell.lock() = Inner {
        state: State::Waiting(None),
        decode,
    };
    Some(cell)
}

/// Keeps `cell` in this thread's list for a later call of the same type if nothing else
/// refers to it (the connection has dropped its replier), else lets it go. A cell not kept
/// (the list is full, or the thread is ending) is dropped outside the list's borrow.
fn put_back<T: Send + 'static>(cell: Arc<Cell<T>>) {
    if Arc::strong_count(&cell) != 1 {
        return;
    }
    let ty = TypeId::of::<Cell<T>>();
    let _not_kept = FREE
        .try_with(|free| {
            let Ok(mut free) = free.try_borrow_mut() else {
                return Some(cell);
            };
            let at = match free.iter().position(|(kept, _)| *kept == ty) {
                Some(at) => at,
                None => {
                    free.push((ty, Vec::new()));
                    free.len() - 1
                }
            };
            match free.get_mut(at) {
                Some((_, cells)) if cells.len() < KEPT_PER_TYPE => {
                    cells.push(cell);
                    None
                }
                _ => Some(cell),
            }
        })
        .ok()
        .flatten();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_response_reaches_its_caller_only_when_published() {
        let (reply, replier) = pair(decode_u8);
        let mut reply = Box::pin(reply);
        let Ok(decoded) = replier.returned(&[5], &limits()) else {
            panic!("a good body was refused");
        };
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            reply.as_mut().poll(&mut cx).is_pending(),
            "seen before it was published"
        );
        decoded.publish(Instant::now());
        assert_eq!(reply.await, Ok(5));
    }

    #[tokio::test]
    async fn a_held_response_dropped_unpublished_answers_shutdown() {
        let (reply, replier) = pair(decode_u8);
        let decoded = replier.returned(&[5], &limits());
        drop(decoded);
        assert_eq!(reply.await, Err(CallError::Shutdown));
    }

    fn decode_u8(body: &[u8], _: &ResponseDecoding) -> Result<u8, DecodeError> {
        body.first().copied().ok_or(DecodeError::UnexpectedEnd {
            needed: 1,
            remaining: 0,
        })
    }

    fn limits() -> ResponseDecoding {
        ResponseDecoding::for_tests()
    }

    #[tokio::test]
    async fn an_outcome_reaches_its_caller_once_and_the_cell_is_reused() {
        let (reply, replier) = pair(decode_u8);
        let first = Arc::as_ptr(reply.cell.as_ref().unwrap());
        let Ok(decoded) = replier.returned(&[7], &limits()) else {
            panic!("a good body was refused");
        };
        decoded.publish(Instant::now());
        assert_eq!(reply.await, Ok(7));
        let (reply, replier) = pair(decode_u8);
        assert_eq!(
            Arc::as_ptr(reply.cell.as_ref().unwrap()),
            first,
            "not reused"
        );
        replier.fail(CallError::Timeout);
        assert_eq!(reply.await, Err(CallError::Timeout));
    }

    /// Completes a call made through `pair` and takes its outcome, so its cell goes back to
    /// this thread's list; returns the cell's address.
    fn one_call_taken() -> *const Cell<u8> {
        let (mut reply, replier) = pair(decode_u8);
        let cell = Arc::as_ptr(reply.cell.as_ref().unwrap());
        replier.fail(CallError::Timeout);
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(
            Pin::new(&mut reply).poll(&mut cx),
            Poll::Ready(Err(CallError::Timeout))
        );
        cell
    }

    #[tokio::test]
    async fn a_response_carries_when_its_turn_accepted_it_and_a_failure_does_not() {
        let (mut reply, replier) = pair(decode_u8);
        let Ok(decoded) = replier.returned(&[3], &limits()) else {
            panic!("a good body was refused");
        };
        let at = Instant::now() - std::time::Duration::from_secs(1);
        decoded.publish(at);
        assert_eq!((&mut reply).await, Ok(3));
        assert_eq!(reply.answered_at(), Some(at));
        let (mut reply, replier) = pair(decode_u8);
        replier.fail(CallError::Timeout);
        assert_eq!((&mut reply).await, Err(CallError::Timeout));
        assert_eq!(reply.answered_at(), None);
    }

    #[test]
    fn a_cell_is_reused_only_by_the_thread_that_gave_it_back() {
        let freed_here = one_call_taken();
        // Another thread takes its cell from its own list: a new cell, never this thread's.
        let taken_there = std::thread::spawn(|| one_call_taken() as usize)
            .join()
            .unwrap();
        assert_ne!(taken_there, freed_here as usize, "a cell crossed threads");
        assert_eq!(one_call_taken(), freed_here, "not reused on its own thread");
    }

    #[test]
    fn a_thread_keeps_at_most_kept_per_type_cells_of_one_type() {
        std::thread::spawn(|| {
            let mut calls: Vec<_> = (0..KEPT_PER_TYPE + 8).map(|_| pair(decode_u8)).collect();
            let mut cx = Context::from_waker(Waker::noop());
            for (reply, replier) in &mut calls {
                replier_fail(replier);
                assert!(Pin::new(reply).poll(&mut cx).is_ready());
            }
            let kept = FREE.with(|free| {
                let free = free.borrow();
                let cells = free.iter().find(|(ty, _)| *ty == TypeId::of::<Cell<u8>>());
                cells.map_or(0, |(_, cells)| cells.len())
            });
            assert_eq!(kept, KEPT_PER_TYPE);
        })
        .join()
        .unwrap();
    }

    /// Fails the call behind `replier` in place, leaving a replier that holds no cell.
    fn replier_fail(replier: &mut Replier) {
        std::mem::replace(replier, Replier(None)).fail(CallError::Timeout);
    }

    #[tokio::test]
    async fn a_replier_dropped_without_an_outcome_answers_shutdown() {
        let (reply, replier) = pair(decode_u8);
        let waiting = tokio::spawn(reply);
        tokio::task::yield_now().await;
        drop(replier);
        assert_eq!(waiting.await.unwrap(), Err(CallError::Shutdown));
    }

    #[tokio::test]
    async fn a_body_that_does_not_decode_is_given_back_to_answer_after_the_cut_off() {
        let (reply, replier) = pair(decode_u8);
        let Err((replier, err)) = replier.returned(&[], &limits()) else {
            panic!("an empty body decoded");
        };
        replier.fail(CallError::Decode(err.clone()));
        assert_eq!(reply.await, Err(CallError::Decode(err)));
    }

    #[tokio::test]
    async fn a_cell_still_held_by_its_replier_is_not_reused() {
        let (reply, replier) = pair(decode_u8);
        let first = Arc::as_ptr(reply.cell.as_ref().unwrap());
        // The caller gives up; the connection still holds the replier.
        drop(reply);
        let (next, _next_replier) = pair(decode_u8);
        assert_ne!(Arc::as_ptr(next.cell.as_ref().unwrap()), first);
        // The late outcome goes nowhere, and nothing waits on it.
        if let Ok(decoded) = replier.returned(&[1], &limits()) {
            decoded.publish(Instant::now());
        }
    }
}
