//! What the host knows of a worker: what it said in its handshake and what it was verified,
//! from outside, to run under.

use crate::ConfinementReport;

/// A worker's identity (from its `Hello`; the worker's word, used for logs and checks of
/// intent, never for security) and its confinement (checked by the host itself).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The methods it says it serves.
    pub methods: Vec<String>,
    /// The confinement it runs under, read from `/proc/<pid>` by the host.
    pub confinement: ConfinementReport,
}

impl WorkerInfo {
    pub(crate) fn new(hello: airlock_protocol::WorkerInfo, confinement: ConfinementReport) -> Self {
        Self {
            name: hello.name,
            version: hello.version,
            methods: hello.methods,
            confinement,
        }
    }
}
