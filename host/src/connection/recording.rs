//! What the connection's unit tests share: a frame sender that takes every batch at once and
//! records each write, and a host session past its handshake with its worker's session.

use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use std::time::Instant;

use airlock_protocol::transport::{FrameSender, Outgoing, SendProgress};
use airlock_protocol::{
    HostConfig, HostSession, Transmit, TransportError, WorkerConfig, WorkerSession,
};
use bytes::Bytes;

use super::wire::Wire;

/// The frames of every write so far (each whole, as the worker would read it), one list per
/// write.
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
        let frames = batch.iter().map(|t| Bytes::from(t.to_vec())).collect();
        self.0.lock().unwrap().push(frames);
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

/// A host session past its handshake with a worker serving `echo`, and that worker's session.
pub(super) fn ready_sessions() -> (HostSession, WorkerSession) {
    let mut host = HostSession::new(HostConfig::default(), Instant::now());
    let mut config = WorkerConfig::new("test-worker", "1.0.0");
    config.methods = vec!["echo".into()];
    let mut worker = WorkerSession::new(&config);
    loop {
        let mut moved = false;
        while let Some(t) = worker.poll_transmit() {
            host.handle_bytes(&t.to_vec());
            moved = true;
        }
        while let Some(t) = host.poll_transmit() {
            worker.handle_bytes(&t.to_vec());
            moved = true;
        }
        if !moved {
            break;
        }
    }
    assert!(host.is_ready());
    while host.poll_event().is_some() {}
    while worker.poll_event().is_some() {}
    (host, worker)
}
