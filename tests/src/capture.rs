//! Capturing the worker stderr lines the host relays into `tracing`, so a test can read exactly
//! what reached the host's log.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The relayed lines, in order.
#[derive(Debug, Default)]
pub struct Captured(pub Mutex<Vec<String>>);

impl Captured {
    /// The lines relayed so far that contain `marker`.
    pub fn lines_containing(&self, marker: &str) -> Vec<String> {
        let lines = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        lines
            .iter()
            .filter(|line| line.contains(marker))
            .cloned()
            .collect()
    }

    /// The first relayed line that contains `marker`, waiting for it (polling) at most
    /// `within`; panics, naming the marker, if none has arrived by then.
    pub async fn first_line_containing(&self, marker: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            if let Some(line) = self.lines_containing(marker).into_iter().next() {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "no relayed line with {marker:?} arrived within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

struct Capture(Arc<Captured>);

struct MessageVisitor(String);

impl tracing::field::Visit for MessageVisitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            use std::fmt::Write;
            let _ = write!(self.0, "{value:?}");
        }
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target() == "airlock::worker_stderr" {
            let mut visitor = MessageVisitor(String::new());
            event.record(&mut visitor);
            if let Ok(mut lines) = self.0 .0.lock() {
                lines.push(visitor.0);
            }
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Installs (once per test process) a global subscriber that records every relayed worker
/// stderr line, and returns the record. Panics if another global subscriber is installed.
pub fn captured() -> &'static Arc<Captured> {
    static CELL: OnceLock<Arc<Captured>> = OnceLock::new();
    CELL.get_or_init(|| {
        let captured = Arc::new(Captured::default());
        tracing::subscriber::set_global_default(Capture(Arc::clone(&captured)))
            .expect("no other subscriber in this test binary");
        captured
    })
}
