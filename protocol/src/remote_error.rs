//! The error descriptor a worker sends in a `Fail` frame: data only.

/// Longest [`RemoteError`] message, in bytes.
///
/// Enough for a useful sentence and a short context; small enough that a worker cannot flood
/// the host's logs or memory through error messages.
pub const MAX_ERROR_MESSAGE: usize = 4096;

/// Why a remote handler failed: a closed set of kinds, each a number on the wire.
///
/// The host never rebuilds an error type by name (rebuilding one would run the named type's constructor in the host). Host-side
/// outcomes such as a timeout are not kinds here: a worker cannot claim one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The handler returned an error. Wire value 0.
    Handler,
    /// The handler panicked. Wire value 1.
    Panic,
    /// The worker serves no method of that name. Wire value 2.
    UnknownMethod,
    /// The request did not decode to the method's request type. Wire value 3.
    BadRequest,
    /// The handler stopped because the host cancelled the call. Wire value 4.
    Cancelled,
    /// The worker refused the call for one of its own budgets. Wire value 5.
    Limit,
    /// The worker failed outside the handler. Wire value 6.
    Internal,
}

impl ErrorKind {
    /// The kind's wire value.
    pub const fn to_wire(self) -> u8 {
        match self {
            Self::Handler => 0,
            Self::Panic => 1,
            Self::UnknownMethod => 2,
            Self::BadRequest => 3,
            Self::Cancelled => 4,
            Self::Limit => 5,
            Self::Internal => 6,
        }
    }

    /// The kind for a wire value; `None` for any value outside the closed set.
    pub const fn from_wire(value: u8) -> Option<Self> {
        Some(match value {
            0 => Self::Handler,
            1 => Self::Panic,
            2 => Self::UnknownMethod,
            3 => Self::BadRequest,
            4 => Self::Cancelled,
            5 => Self::Limit,
            6 => Self::Internal,
            _ => return None,
        })
    }
}

/// A remote handler's failure, as data: a kind, a bounded message, an optional code.
///
/// Built with [`RemoteError::new`], which makes any message safe to send. On receipt the host
/// is strict instead: a message over [`MAX_ERROR_MESSAGE`] bytes or holding a control character
/// is a protocol violation, because an honest worker never sends one. "Control character" here
/// means [`airlock_codec::is_unsafe_in_text`]: C0/C1 controls, DEL, U+2028/U+2029, and the
/// bidirectional and invisible format characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteError {
    kind: ErrorKind,
    message: String,
    code: Option<u32>,
}

impl RemoteError {
    /// A descriptor with `message` made safe: each character that could forge or hide log text
    /// (controls, line separators, bidi and invisible format characters; see
    /// [`airlock_codec::is_unsafe_in_text`]) becomes a space, and the result is cut to
    /// [`MAX_ERROR_MESSAGE`] bytes on a character boundary.
    pub fn new(kind: ErrorKind, message: &str) -> Self {
        let mut clean = String::with_capacity(message.len().min(MAX_ERROR_MESSAGE));
        for c in message.chars() {
            let c = if airlock_codec::is_unsafe_in_text(c) {
                ' '
            } else {
                c
            };
            if clean.len() + c.len_utf8() > MAX_ERROR_MESSAGE {
                break;
            }
            clean.push(c);
        }
        Self {
            kind,
            message: clean,
            code: None,
        }
    }

    /// Adds an application-defined numeric code.
    #[must_use]
    pub fn with_code(mut self, code: u32) -> Self {
        self.code = Some(code);
        self
    }

    /// Checks a received descriptor without changing it; `None` if it breaks a rule.
    pub(crate) fn from_wire(kind: u8, message: &str, code: Option<u32>) -> Option<Self> {
        let kind = ErrorKind::from_wire(kind)?;
        if !is_clean_message(message) {
            return None;
        }
        Some(Self {
            kind,
            message: message.into(),
            code,
        })
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message: at most [`MAX_ERROR_MESSAGE`] bytes, no control characters.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The application-defined code, if any.
    pub fn code(&self) -> Option<u32> {
        self.code
    }
}

impl core::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)?;
        if let Some(code) = self.code {
            write!(f, " (code {code})")?;
        }
        Ok(())
    }
}

impl std::error::Error for RemoteError {}

/// True if `message` may cross as an error message: bounded, and free of characters that could
/// forge or hide log text.
pub(crate) fn is_clean_message(message: &str) -> bool {
    message.len() <= MAX_ERROR_MESSAGE && !message.chars().any(airlock_codec::is_unsafe_in_text)
}
