//! `Cancel`: host → worker, stop a call. The worker still owes its terminal frame.

use serde::{Deserialize, Serialize};

use crate::CallId;

/// The host no longer wants the answer to `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    /// The call to stop.
    pub id: CallId,
}
