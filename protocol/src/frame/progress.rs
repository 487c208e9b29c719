//! `Progress`: worker → host, an intermediate update for a running call.

use serde::{Deserialize, Serialize};

use crate::CallId;

/// An update for call `id`, which must still be running; at most the host's per-call quota.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress<'a> {
    /// The call's id.
    pub id: CallId,
    /// The call's method name, which must match the call's.
    pub method: &'a str,
    /// Opaque update bytes.
    #[serde(with = "serde_bytes")]
    pub body: &'a [u8],
}
