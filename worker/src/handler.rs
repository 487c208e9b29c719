//! Type-erased handlers: decode the request, run the user's function, encode the response.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use airlock_codec::Limits;
use airlock_protocol::{ErrorKind, Method, RemoteError};
use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use crate::HandlerError;

/// What running one call produces: the encoded response or the error to send.
pub(crate) type Reply = Result<Bytes, RemoteError>;

pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// A registered method: takes the raw request body, the decoding budgets and the concurrency
/// permit (held until the handler has really finished), returns the eventual reply.
pub(crate) type ErasedHandler =
    Arc<dyn Fn(Bytes, Limits, OwnedSemaphorePermit) -> BoxFuture + Send + Sync>;

/// A request that did not decode; one over a budget says where the worker's budgets are set.
fn bad_request(err: airlock_codec::DecodeError) -> RemoteError {
    let message = match err.budget() {
        Some(_) => format!("{err}; the worker's request budgets are set with Worker::limits"),
        None => err.to_string(),
    };
    RemoteError::new(ErrorKind::BadRequest, &message)
}

fn encode_response<T: serde::Serialize>(result: Result<T, HandlerError>) -> Reply {
    let response = result.map_err(HandlerError::into_remote)?;
    airlock_codec::to_vec(&response)
        .map(Bytes::from)
        .map_err(|e| {
            RemoteError::new(
                ErrorKind::Internal,
                &format!("response did not encode: {e}"),
            )
        })
}

/// Wraps an async handler for method `M`.
pub(crate) fn erase_async<M, F, Fut>(handler: F) -> ErasedHandler
where
    M: Method,
    F: Fn(M::Request) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<M::Response, HandlerError>> + Send + 'static,
{
    let handler = Arc::new(handler);
    Arc::new(
        move |body: Bytes, limits: Limits, permit: OwnedSemaphorePermit| -> BoxFuture {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                let _permit = permit;
                // Decoded inside the call's future: a panicking `Deserialize` is this call's
                // `Panic`, not the serving loop's death. A large body's call runs in a task of its
                // own from its first poll, so its decoding does not stall other calls.
                let request =
                    airlock_codec::from_slice::<M::Request>(&body, &limits).map_err(bad_request)?;
                encode_response(handler(request).await)
            })
        },
    )
}

/// Wraps a blocking handler for method `M`: it runs on tokio's blocking pool, so it cannot
/// stall other calls. A cancelled blocking handler is answered at once but runs to its end.
pub(crate) fn erase_blocking<M, F>(handler: F) -> ErasedHandler
where
    M: Method,
    F: Fn(M::Request) -> Result<M::Response, HandlerError> + Send + Sync + 'static,
{
    let handler = Arc::new(handler);
    Arc::new(
        move |body: Bytes, limits: Limits, permit: OwnedSemaphorePermit| -> BoxFuture {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                let request =
                    airlock_codec::from_slice::<M::Request>(&body, &limits).map_err(bad_request)?;
                // The permit moves onto the blocking thread: if the call is cancelled, the
                // handler still runs to its end there, and still counts against the limit.
                let run = move || {
                    let _permit = permit;
                    encode_response(handler(request))
                };
                match tokio::task::spawn_blocking(run).await {
                    Ok(reply) => reply,
                    // A panic in the blocking handler: resume it here so the serving loop reports
                    // it the same way as an async handler's panic.
                    Err(join) => match join.try_into_panic() {
                        Ok(payload) => std::panic::resume_unwind(payload),
                        Err(_) => Err(RemoteError::new(
                            ErrorKind::Internal,
                            "runtime shutting down",
                        )),
                    },
                }
            })
        },
    )
}
