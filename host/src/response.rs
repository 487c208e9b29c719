//! Decoding a worker's response: the budgets it is decoded under, and the warning a refused
//! one is logged with before its worker is killed.

use std::sync::Arc;

use airlock_codec::{DecodeError, Limits};

use crate::config::Settings;

/// What decoding one worker's responses needs: the host's response budgets, and the worker's
/// label for the log.
#[derive(Clone, Debug)]
pub(crate) struct ResponseDecoding {
    pub(crate) limits: Limits,
    label: Arc<str>,
}

impl ResponseDecoding {
    pub(crate) fn new(settings: &Settings) -> Self {
        Self {
            limits: settings.response_limits(),
            label: settings.label.as_str().into(),
        }
    }

    /// The same budgets with at most `items` sequence elements and map entries: a narrower
    /// budget for a decode that is tried first and, refused, made again within these.
    pub(crate) fn with_items_at_most(&self, items: usize) -> Self {
        Self {
            limits: self.limits.max_items(self.limits.items_budget().min(items)),
            label: Arc::clone(&self.label),
        }
    }

    /// Default budgets, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        Self {
            limits: Limits::default(),
            label: "test".into(),
        }
    }

    /// Logs, at WARN on target `airlock::host`, that the response to `method` was refused and
    /// why: the budget, its value and the setting, when it was over one. Called where the
    /// response is decoded, before the worker is cut off and killed, so the log says why the
    /// worker went before the loss is reported. A worker cannot know the host's budgets, so an
    /// honest one over them is killed too; this line is how its operator finds out.
    pub(crate) fn refused(&self, method: &str, err: &DecodeError) {
        match err.budget() {
            Some((budget, max)) => tracing::warn!(
                target: "airlock::host",
                worker = %self.label,
                method,
                budget,
                max,
                "the response to {method} is over the host's response budget {budget} \
                 ({max}): {err}; the worker is killed, as a response that breaks the host's \
                 budgets is treated as a lie. If the worker is honest, raise Limits::{budget} \
                 in HostBuilder::limits"
            ),
            None => tracing::warn!(
                target: "airlock::host",
                worker = %self.label,
                method,
                "the response to {method} does not decode as its response type: {err}; the \
                 worker is killed as a liar"
            ),
        }
    }
}

/// Runs `decode`, a decode of the worker's bytes into a caller's type, taking a panic in that
/// type's `Deserialize` as a response that does not decode: the worker chose the bytes, so its
/// worker is cut off as a liar, and the panic never reaches the task or caller that took the
/// reader's turn (a caller's look takes it in the caller's own call).
pub(crate) fn unless_it_panics<T>(
    decode: impl FnOnce() -> Result<T, DecodeError>,
) -> Result<T, DecodeError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).unwrap_or_else(|_| {
        Err(serde::de::Error::custom(
            "its Deserialize panicked on the worker's bytes",
        ))
    })
}
