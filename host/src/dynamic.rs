//! Dynamic calls: a method named at run time, with [`Value`] bodies.
//!
//! A typed call ([`Host::call`]) fixes the method's name and both of its types when the program
//! is built. A dynamic call names the method with a string and sends and receives the closed
//! [`Value`] model in its own self-describing encoding (`PROTOCOL.md` §4), for tools, bridges
//! and workers written in other languages. It takes the same path as a typed call (fresh id,
//! deadline, the `(id, phase, name)` binding, decoding where the answer is accepted) and gives
//! the same guarantees; only the name's check moves from build time to the call.
//!
//! The worker's method must take and answer `Value`s in that encoding (an `airlock-worker`
//! registers one with `Worker::value_method`). Called on a typed method, the request does not
//! decode there (a `Fail` of kind `BadRequest`), and a typed answer that is not a valid `Value`
//! encoding is a response that does not decode: the worker is cut off as for any such answer.

use std::borrow::Cow;
use std::time::Instant;

use airlock_codec::{DecodeError, Value};
use airlock_protocol::is_valid_method_name;

use crate::host::Due;
use crate::{CallError, Host, InProcess, Pool};

impl Host {
    /// Calls the method named `method` with a [`Value`] request, with the host's call
    /// deadline, and returns its [`Value`] answer.
    ///
    /// `method` is checked before anything is sent: a name that is not 1–64 bytes of
    /// `[A-Za-z0-9._-]` is [`CallError::InvalidMethodName`], and nothing is counted.
    ///
    /// ```no_run
    /// use airlock_host::{Host, Value};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let host = Host::builder("target/debug/airlock-worker").spawn().await?;
    /// let request = Value::List(vec![Value::I64(1), Value::Str("two".into())]);
    /// let answer = host.call_value("echo_value", &request).await?;
    /// assert_eq!(answer, request);
    /// host.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub async fn call_value(&self, method: &str, request: &Value) -> Result<Value, CallError> {
        self.call_value_due(method, request, Due::After(self.call_timeout()))
            .await
    }

    /// Like [`call_value`](Self::call_value), finishing by `deadline` (as
    /// [`call_with_deadline`](Self::call_with_deadline): dropping the future cancels the call).
    pub async fn call_value_with_deadline(
        &self,
        method: &str,
        request: &Value,
        deadline: Instant,
    ) -> Result<Value, CallError> {
        self.call_value_due(method, request, Due::By(deadline))
            .await
    }

    async fn call_value_due(
        &self,
        method: &str,
        request: &Value,
        due: Due,
    ) -> Result<Value, CallError> {
        let when = due.starting_now();
        if !is_valid_method_name(method) {
            return Err(CallError::InvalidMethodName);
        }
        let method = Cow::Owned(method.to_owned());
        self.call_named(method, Ok(request.to_vec().into()), decode_value, when)
            .await
    }
}

impl Pool {
    /// Calls the method named `method` with a [`Value`] on the live worker with the fewest
    /// calls in flight, as [`Host::call_value`].
    pub async fn call_value(&self, method: &str, request: &Value) -> Result<Value, CallError> {
        self.pick()?.call_value(method, request).await
    }

    /// Like [`call_value`](Self::call_value), with an explicit deadline.
    pub async fn call_value_with_deadline(
        &self,
        method: &str,
        request: &Value,
        deadline: Instant,
    ) -> Result<Value, CallError> {
        self.pick()?
            .call_value_with_deadline(method, request, deadline)
            .await
    }
}

impl InProcess {
    /// Calls the method named `method` with a [`Value`], as [`Host::call_value`].
    pub async fn call_value(&self, method: &str, request: &Value) -> Result<Value, CallError> {
        self.host().call_value(method, request).await
    }
}

/// The supervisor's decoder for a dynamic answer: the closed `Value` model, within the host's
/// budgets.
fn decode_value(
    body: &[u8],
    decoding: &crate::response::ResponseDecoding,
) -> Result<Value, DecodeError> {
    Value::from_slice(body, &decoding.limits)
}
