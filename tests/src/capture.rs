//! Capturing what the host logs through `tracing`, so a test can read exactly what reached the
//! host's log: the worker stderr lines it relays ([`captured`]), and every event with its level,
//! target, message and fields ([`events`]).

use std::sync::{Arc, Mutex, OnceLock};

/// The relayed lines, in order.
#[derive(Debug, Default)]
pub struct Captured(pub Mutex<Vec<String>>);

/// One event the host logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedEvent {
    /// Its level.
    pub level: tracing::Level,
    /// Its target (`airlock::host`, `airlock::worker_stderr`...).
    pub target: String,
    /// Its message.
    pub message: String,
    /// Its other fields, by name, as `Debug` shows them (a `%`-recorded string unquoted).
    pub fields: Vec<(String, String)>,
}

impl LoggedEvent {
    /// The value of field `name`, if the event has one.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Every event logged in this test process, in order.
#[derive(Debug, Default)]
pub struct CapturedEvents(pub Mutex<Vec<LoggedEvent>>);

impl CapturedEvents {
    /// The events logged so far that `keep` selects.
    pub fn matching(&self, keep: impl Fn(&LoggedEvent) -> bool) -> Vec<LoggedEvent> {
        self.0
            .lock()
            .map(|events| events.iter().filter(|e| keep(e)).cloned().collect())
            .unwrap_or_default()
    }
}

struct Capture {
    lines: Arc<Captured>,
    events: Arc<CapturedEvents>,
}

#[derive(Default)]
struct FieldVisitor {
    message: String,
    fields: Vec<(String, String)>,
}

impl tracing::field::Visit for FieldVisitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.fields.push((field.name().to_owned(), text));
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.fields
                .push((field.name().to_owned(), value.to_owned()));
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
        let mut visitor = FieldVisitor::default();
        event.record(&mut visitor);
        let metadata = event.metadata();
        if metadata.target() == "airlock::worker_stderr" {
            if let Ok(mut lines) = self.lines.0.lock() {
                lines.push(visitor.message.clone());
            }
        }
        if let Ok(mut events) = self.events.0.lock() {
            events.push(LoggedEvent {
                level: *metadata.level(),
                target: metadata.target().to_owned(),
                message: visitor.message,
                fields: visitor.fields,
            });
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn installed() -> &'static (Arc<Captured>, Arc<CapturedEvents>) {
    static CELL: OnceLock<(Arc<Captured>, Arc<CapturedEvents>)> = OnceLock::new();
    CELL.get_or_init(|| {
        let lines = Arc::new(Captured::default());
        let events = Arc::new(CapturedEvents::default());
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

/// Installs (once per test process) the same subscriber, and returns its record of every
/// event. Panics if another global subscriber is installed.
pub fn events() -> &'static Arc<CapturedEvents> {
    &installed().1
}
