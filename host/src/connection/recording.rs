//! A frame sender for the connection's unit tests: it takes every batch at once and records
//! the heads of each write.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use airlock_protocol::transport::{FrameSender, Outgoing, SendProgress};
use airlock_protocol::{Transmit, TransportError};
use bytes::Bytes;

use super::wire::Wire;

/// The heads of every write so far, one list per write.
pub(super) type Writes = Arc<Mutex<Vec<Vec<Bytes>>>>;

struct Recorder(Writes);

#[async_trait::async_trait]
impl FrameSender for Recorder {
    fn poll_send(
        &mut self,
        _: &mut Context<'_>,
        batch: &[Transmit],
        _: &mut SendProgress,
    ) -> Poll<Result<(), TransportError>> {
        let heads = batch.iter().map(|t| t.head.clone()).collect();
        self.0.lock().unwrap().push(heads);
        Poll::Ready(Ok(()))
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}

/// A wire (callers may write directly) whose writes are recorded into the returned list.
/// Must be made inside a runtime, as every `Wire`.
pub(super) fn recording_wire() -> (Arc<Wire>, Writes) {
    let writes = Writes::default();
    let outgoing = Outgoing::new(Box::new(Recorder(Arc::clone(&writes))));
    (Arc::new(Wire::new(outgoing, true)), writes)
}
