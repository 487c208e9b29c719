//! Type-erased handlers: decode the request, run the user's function, encode the response, in
//! the typed encoding of a `Method`'s types or the dynamic `Value` encoding.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

use airlock_codec::{DecodeError, EncodeError, Limits, Value};
use airlock_protocol::{Body, ErrorKind, Method, RemoteError};
use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use crate::progress::{CallContext, Progress};
use crate::HandlerError;

/// What running one call produces: the encoded response or the error to send.
pub(crate) type Reply = Result<Body, RemoteError>;

pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// An async handler: takes the raw request body, the decoding budgets and the concurrency
/// permit (held until the handler has really finished), returns the eventual reply.
pub(crate) type AsyncHandler =
    Arc<dyn Fn(Bytes, Limits, OwnedSemaphorePermit, CallContext) -> BoxFuture + Send + Sync>;

/// A blocking handler: decodes the request within the budgets, runs the user's function and
/// encodes its response, all on the thread that calls it.
pub(crate) type BlockingHandler = Arc<dyn Fn(&Bytes, &Limits, &CancelToken) -> Reply + Send + Sync>;

/// A registered method, as the serving loop runs it.
#[derive(Clone)]
pub(crate) enum ErasedHandler {
    /// Polled first on the serving loop, then (if it has to wait) in a task of its own.
    Async(AsyncHandler),
    /// Run on a thread: the serving loop's own when the worker runs one handler at a time,
    /// else a pool thread (see `serve::calls::Calls::start`).
    Blocking {
        run: BlockingHandler,
        /// Whether the handler watches its [`CancelToken`]: such a handler is never run on the
        /// serving loop, which must stay free to read the `Cancel` that stops it.
        watches_token: bool,
    },
}

/// How a method's bodies cross the wire: how its request is decoded and its response encoded.
pub(crate) trait Bodies: 'static {
    type Request: Send + 'static;
    type Response: Send + 'static;
    /// Decodes a request within the worker's budgets.
    fn decode(body: &[u8], limits: &Limits) -> Result<Self::Request, DecodeError>;
    /// [`decode`](Self::decode), with `body` lent to the request's large
    /// [`Blob`](airlock_protocol::Blob)s (they keep the frame's bytes instead of copying them).
    fn lend(body: &Bytes, limits: &Limits) -> Result<Self::Request, DecodeError> {
        airlock_protocol::blob::lending(body, || Self::decode(body, limits))
    }
    /// Encodes a response.
    fn encode(response: &Self::Response) -> Result<Body, EncodeError>;
}

/// The typed encoding of `M`'s request and response types.
pub(crate) struct Typed<M>(PhantomData<M>);

impl<M: Method> Bodies for Typed<M> {
    type Request = M::Request;
    type Response = M::Response;
    fn decode(body: &[u8], limits: &Limits) -> Result<M::Request, DecodeError> {
        airlock_codec::from_slice(body, limits)
    }
    fn encode(response: &M::Response) -> Result<Body, EncodeError> {
        // A large response goes into the buffer of an earlier one, if one is free, and a
        // large `Blob` that ends it is written from its own buffer.
        airlock_protocol::reuse::encode_body(response)
    }
}

/// The dynamic [`Value`] encoding, both ways.
pub(crate) struct Dynamic;

impl Bodies for Dynamic {
    type Request = Value;
    type Response = Value;
    fn decode(body: &[u8], limits: &Limits) -> Result<Value, DecodeError> {
        Value::from_slice(body, limits)
    }
    fn encode(response: &Value) -> Result<Body, EncodeError> {
        Ok(Body::from(response.to_vec()))
    }
}

/// A request that did not decode; one over a budget says where the worker's budgets are set.
fn bad_request(err: airlock_codec::DecodeError) -> RemoteError {
    let message = match err.budget() {
        Some(_) => format!("{err}; the worker's request budgets are set with Worker::limits"),
        None => err.to_string(),
    };
    RemoteError::new(ErrorKind::BadRequest, &message)
}

fn encode_response<B: Bodies>(result: Result<B::Response, HandlerError>) -> Reply {
    let response = result.map_err(HandlerError::into_remote)?;
    B::encode(&response).map_err(|e| {
        RemoteError::new(
            ErrorKind::Internal,
            &format!("response did not encode: {e}"),
        )
    })
}

/// Wraps an async handler whose bodies are encoded as `B` says.
pub(crate) fn erase_async<B, F, Fut>(handler: F) -> ErasedHandler
where
    B: Bodies,
    F: Fn(B::Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<B::Response, HandlerError>> + Send + 'static,
{
    erase_async_with_context::<B, _, _>(move |request, _: CallContext| handler(request))
}

/// An async handler that also gets its call's [`CallContext`] (its progress channel).
fn erase_async_with_context<B, F, Fut>(handler: F) -> ErasedHandler
where
    B: Bodies,
    F: Fn(B::Request, CallContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<B::Response, HandlerError>> + Send + 'static,
{
    let handler = Arc::new(handler);
    ErasedHandler::Async(Arc::new(
        move |body: Bytes,
              limits: Limits,
              permit: OwnedSemaphorePermit,
              context: CallContext|
              -> BoxFuture {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                let _permit = permit;
                // Decoded inside the call's future: a panicking `Deserialize` is this call's
                // `Panic`, not the serving loop's death. A large body's call runs in a task of its
                // own from its first poll, so its decoding does not stall other calls.
                let request = B::lend(&body, &limits).map_err(bad_request)?;
                encode_response::<B>(handler(request, context).await)
            })
        },
    ))
}

/// Wraps a blocking handler that also gets the call's [`CancelToken`]. The token is cancelled
/// when the host cancels the call (or its deadline passes and the host sends `Cancel`); the
/// handler can then stop early instead of running to its end on its thread.
pub(crate) fn erase_cancellable_blocking<M, F>(handler: F) -> ErasedHandler
where
    M: Method,
    F: Fn(M::Request, &CancelToken) -> Result<M::Response, HandlerError> + Send + Sync + 'static,
{
    erase_blocking_with_token::<Typed<M>, F>(handler, true)
}

/// A blocking handler, with the call's [`CancelToken`]: decoding, the handler and encoding all
/// run on the thread the serving loop chose, never on the loop's async tasks.
fn erase_blocking_with_token<B, F>(handler: F, watches_token: bool) -> ErasedHandler
where
    B: Bodies,
    F: Fn(B::Request, &CancelToken) -> Result<B::Response, HandlerError> + Send + Sync + 'static,
{
    ErasedHandler::Blocking {
        run: Arc::new(move |body: &Bytes, limits: &Limits, token: &CancelToken| {
            let request = B::lend(body, limits).map_err(bad_request)?;
            encode_response::<B>(handler(request, token))
        }),
        watches_token,
    }
}

/// Whether the host still wants a blocking handler's result (see
/// [`Worker::cancellable_blocking_method`](crate::Worker::cancellable_blocking_method)).
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<std::sync::atomic::AtomicBool>);

impl CancelToken {
    /// True once the host has cancelled the call (its answer will be discarded): stop and
    /// return any error.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn cancel(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Cancels its token when dropped: a blocking call waiting for its thread is cancelled however
/// its wait ends.
pub(crate) struct CancelOnDrop(pub(crate) CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// A blocking handler's outcome on a pool thread, awaited by a task: a panic is resumed here,
/// so the serving loop reports it the same way as an async handler's panic.
pub(crate) fn join_blocking(joined: Result<Reply, tokio::task::JoinError>) -> Reply {
    match joined {
        Ok(reply) => reply,
        Err(join) => match join.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(_) => Err(RemoteError::new(
                ErrorKind::Internal,
                "runtime shutting down",
            )),
        },
    }
}

/// Wraps an async handler of the streaming method `M`, which also gets the call's
/// [`Progress`] sender.
pub(crate) fn erase_streaming<M, F, Fut>(handler: F) -> ErasedHandler
where
    M: airlock_protocol::Streaming,
    F: Fn(M::Request, Progress<M::Progress>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M::Response, HandlerError>> + Send + 'static,
{
    erase_async_with_context::<Typed<M>, _, _>(move |request, context| {
        handler(request, Progress::new(context))
    })
}

/// Wraps a blocking handler whose bodies are encoded as `B` says. A cancelled blocking handler
/// is answered at once but runs to its end.
pub(crate) fn erase_blocking<B, F>(handler: F) -> ErasedHandler
where
    B: Bodies,
    F: Fn(B::Request) -> Result<B::Response, HandlerError> + Send + Sync + 'static,
{
    erase_blocking_with_token::<B, _>(move |request, _: &CancelToken| handler(request), false)
}
