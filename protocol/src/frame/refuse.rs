//! `Refuse`: host → worker, the handshake failed; the host closes the connection.

use serde::{Deserialize, Serialize};

/// Why the host refused a worker's `Hello`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RefuseReason {
    /// The worker speaks another protocol version. Wire value 0.
    VersionMismatch,
    /// The token was missing or wrong. Wire value 1.
    BadToken,
    /// The `Hello` broke a rule (bad name, too many methods, duplicate method). Wire value 2.
    InvalidHello,
}

/// The host's refusal: a reason and the protocol version the host speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refuse {
    /// Why.
    pub reason: RefuseReason,
    /// The host's [`PROTOCOL_VERSION`](crate::PROTOCOL_VERSION).
    pub host_protocol: u32,
}
