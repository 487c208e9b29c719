//! `Return`: worker → host, a call's successful terminal frame.

use serde::{Deserialize, Serialize};

use crate::CallId;

/// The answer to call `id`: `body` is the encoded response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Return<'a> {
    /// The call's id.
    pub id: CallId,
    /// The call's method name, which must match the call's.
    pub method: &'a str,
    /// The response, encoded with airlock-codec; decoded later against the method's type.
    #[serde(with = "serde_bytes")]
    pub body: &'a [u8],
}
