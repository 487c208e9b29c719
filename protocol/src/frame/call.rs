//! `Call`: host → worker, run a method.

use serde::{Deserialize, Serialize};

use crate::CallId;

/// Run `method` on `body` (the encoded request) under a fresh `id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call<'a> {
    /// A fresh random id the worker must echo in every frame about this call.
    pub id: CallId,
    /// The method's name.
    pub method: &'a str,
    /// The request, encoded with airlock-codec; opaque to the protocol.
    #[serde(with = "serde_bytes")]
    pub body: &'a [u8],
}
