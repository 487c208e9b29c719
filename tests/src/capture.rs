//! Capturing what the host logs into `tracing`, so a test can read exactly what reached the
//! host's log: the worker stderr lines it relays ([`captured`]), and every event on an
//! `airlock::*` target with its fields ([`events`]).

use std::collections::BTreeMap;
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

/// One event the host logged.
#[derive(Clone, Debug)]
pub struct TracedEvent {
    /// Its target (`airlock::call`, ...).
    pub target: String,
    /// Its level.
    pub level: tracing::Level,
    /// Its fields, the message under `message`, each as the subscriber would print it
    /// (strings unquoted, `?value` as its `Debug`, `%value` as its `Display`).
    pub fields: BTreeMap<String, String>,
}

impl TracedEvent {
    /// The field `name`, or `""` if the event has none of that name.
    pub fn field(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", String::as_str)
    }
}

/// The events on `airlock::*` targets, in order.
#[derive(Debug, Default)]
pub struct Events(pub Mutex<Vec<TracedEvent>>);

impl Events {
    /// The events so far that `keep` keeps, in order.
    pub fn matching(&self, keep: impl Fn(&TracedEvent) -> bool) -> Vec<TracedEvent> {
        self.0
            .lock()
            .map(|events| events.iter().filter(|e| keep(e)).cloned().collect())
            .unwrap_or_default()
    }

    /// The events so far on `target` whose `worker` field is `worker`.
    pub fn of(&self, target: &str, worker: &str) -> Vec<TracedEvent> {
        self.0
            .lock()
            .map(|events| {
                events
                    .iter()
                    .filter(|e| e.target == target && e.field("worker") == worker)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }
}

struct Capture {
    lines: Arc<Captured>,
    events: Arc<Events>,
}

#[derive(Default)]
struct FieldVisitor(BTreeMap<String, String>);

impl tracing::field::Visit for FieldVisitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
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
        let target = event.metadata().target();
        if !target.starts_with("airlock::") {
            return;
        }
        let mut visitor = FieldVisitor::default();
        event.record(&mut visitor);
        if target == "airlock::worker_stderr" {
            if let Ok(mut lines) = self.lines.0.lock() {
                lines.push(visitor.0.get("message").cloned().unwrap_or_default());
            }
        }
        if let Ok(mut events) = self.events.0.lock() {
            events.push(TracedEvent {
                target: target.into(),
                level: *event.metadata().level(),
                fields: visitor.0,
            });
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Installs (once per test process) the global subscriber that records both.
fn installed() -> &'static (Arc<Captured>, Arc<Events>) {
    static CELL: OnceLock<(Arc<Captured>, Arc<Events>)> = OnceLock::new();
    CELL.get_or_init(|| {
        let (lines, events) = (Arc::default(), Arc::default());
        let capture = Capture {
            lines: Arc::clone(&lines),
            events: Arc::clone(&events),
        };
        tracing::subscriber::set_global_default(capture)
            .expect("no other subscriber in this test binary");
        (lines, events)
    })
}

/// Installs (once per test process) a global subscriber that records every relayed worker
/// stderr line, and returns the record. Panics if another global subscriber is installed.
pub fn captured() -> &'static Arc<Captured> {
    &installed().0
}

/// Installs (once per test process) a global subscriber that records every event on an
/// `airlock::*` target, at every level, and returns the record. Panics if another global
/// subscriber is installed.
pub fn events() -> &'static Arc<Events> {
    &installed().1
}
