//! `Shutdown`: host → worker, finish the calls in flight, then exit.

use serde::{Deserialize, Serialize};

/// Take no new calls, answer the ones in flight, then close the connection and exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shutdown;
