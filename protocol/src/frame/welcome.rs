//! `Welcome`: host → worker, the handshake succeeded.

use serde::{Deserialize, Serialize};

/// The host accepts the worker and states the limits it will enforce on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// Largest frame the host accepts, in bytes (the length prefix's value).
    pub max_frame: u32,
    /// Most calls the host keeps in flight on this worker.
    pub max_in_flight: u32,
    /// Most `Progress` frames the host accepts for one call.
    pub max_progress_per_call: u32,
}
