//! `Fail`: worker → host, a call's failed terminal frame, carrying an error descriptor.

use serde::{Deserialize, Serialize};

use crate::CallId;

/// Call `id` failed; the error is data only (see [`RemoteError`](crate::RemoteError)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fail<'a> {
    /// The call's id.
    pub id: CallId,
    /// The call's method name, which must match the call's.
    pub method: &'a str,
    /// [`ErrorKind`](crate::ErrorKind) wire value.
    pub kind: u8,
    /// At most [`MAX_ERROR_MESSAGE`](crate::MAX_ERROR_MESSAGE) bytes, no control characters.
    pub message: &'a str,
    /// An optional application-defined code.
    pub code: Option<u32>,
}
