//! The `Method` trait and method names.

use core::fmt;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};

/// Longest method name, in bytes.
pub const MAX_METHOD_NAME: usize = 64;

/// A method a worker serves: its name on the wire and both of its types, fixed at compile time.
///
/// ```
/// use airlock_protocol::Method;
/// struct Sum;
/// impl Method for Sum {
///     const NAME: &'static str = "sum";
///     type Request = Vec<i64>;
///     type Response = i64;
/// }
/// assert!(airlock_protocol::is_valid_method_name(Sum::NAME));
/// ```
///
/// `Response` is decoded from bytes the worker chose. Keep it plain data: its `Deserialize` is
/// the only code that input can reach, so it must have no side effects, and any invariant its
/// constructor would check must be checked again after the call returns.
pub trait Method: 'static {
    /// The name on the wire: 1–64 bytes of `[A-Za-z0-9._-]`.
    const NAME: &'static str;
    /// What the host sends.
    type Request: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// What the worker answers.
    type Response: Serialize + DeserializeOwned + Send + Sync + 'static;
    /// True if running the method twice with the same request does no harm beyond running it
    /// once (a read, a pure computation, a write of a fixed value), so that a call lost
    /// through no fault of its own may be sent again on another worker. Default `false`: the
    /// host never runs a method twice unless it says so. A call lost with its worker may
    /// have run there in full, partly or not at all, and the host cannot tell which.
    ///
    /// Only an opt-in of the host acts on it (`PoolBuilder::retry_lost_calls` in
    /// `airlock-host`); [`method!`](crate::method!) sets it with a trailing `idempotent`.
    ///
    /// ```
    /// use airlock_protocol::Method;
    /// struct Lookup;
    /// impl Method for Lookup {
    ///     const NAME: &'static str = "lookup";
    ///     type Request = String;
    ///     type Response = Option<String>;
    ///     const IDEMPOTENT: bool = true;
    /// }
    /// assert!(Lookup::IDEMPOTENT);
    /// ```
    const IDEMPOTENT: bool = false;
}

/// A [`Method`] whose worker sends typed updates (`Progress` frames) before its answer: a
/// progress bar, partial results, log lines.
///
/// The host decodes each update with the same budgeted codec as a response, where its frame is
/// accepted; an update that does not decode is a lie that ends the worker. At most
/// `max_progress_per_call` updates per call are accepted (one more is a violation).
///
/// ```
/// airlock_protocol::method!(
///     /// Counts to a number, reporting each step.
///     pub CountTo, "count_to", u32 => u32, progress u32
/// );
/// fn progress_type<M: airlock_protocol::Streaming>() -> &'static str {
///     core::any::type_name::<M::Progress>()
/// }
/// assert_eq!(progress_type::<CountTo>(), "u32");
/// ```
pub trait Streaming: Method {
    /// What each update carries. Plain data, like [`Method::Response`].
    type Progress: Serialize + DeserializeOwned + Send + Sync + 'static;
}

/// Declares a [`Method`] in one line, in a crate both sides share: a unit struct named `$ty`
/// whose wire name is `$name`, with its request and response types. An invalid name fails the
/// build. A trailing `, idempotent` declares it safe to run twice ([`Method::IDEMPOTENT`]);
/// a trailing `, progress $p` makes it a [`Streaming`] method whose updates are `$p`.
///
/// ```
/// airlock_protocol::method!(
///     /// Greets someone by name.
///     pub Greet, "greet", String => String
/// );
/// airlock_protocol::method!(
///     /// Reads a setting: safe to run twice.
///     pub Setting, "setting", String => Option<String>, idempotent
/// );
/// use airlock_protocol::Method;
/// assert_eq!(Greet::NAME, "greet");
/// assert!(!Greet::IDEMPOTENT && Setting::IDEMPOTENT);
/// ```
///
/// ```compile_fail
/// airlock_protocol::method!(pub Spaced, "not a method name", () => ());
/// ```
#[macro_export]
macro_rules! method {
    ($(#[$doc:meta])* $vis:vis $ty:ident, $name:literal, $req:ty => $resp:ty, progress $prog:ty) => {
        $crate::method!($(#[$doc])* $vis $ty, $name, $req => $resp);
        impl $crate::Streaming for $ty {
            type Progress = $prog;
        }
    };
    ($(#[$doc:meta])* $vis:vis $ty:ident, $name:literal, $req:ty => $resp:ty) => {
        $crate::method!(@declare $(#[$doc])* $vis $ty, $name, $req => $resp, false);
    };
    ($(#[$doc:meta])* $vis:vis $ty:ident, $name:literal, $req:ty => $resp:ty, idempotent) => {
        $crate::method!(@declare $(#[$doc])* $vis $ty, $name, $req => $resp, true);
    };
    (@declare $(#[$doc:meta])* $vis:vis $ty:ident, $name:literal, $req:ty => $resp:ty, $idempotent:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis struct $ty;
        impl $crate::Method for $ty {
            const NAME: &'static str = $name;
            type Request = $req;
            type Response = $resp;
            const IDEMPOTENT: bool = $idempotent;
        }
        const _: () = assert!(
            $crate::is_valid_method_name($name),
            "a method name is 1-64 bytes of [A-Za-z0-9._-]"
        );
    };
}

/// True if `name` is 1–[`MAX_METHOD_NAME`] bytes of `[A-Za-z0-9._-]`. A `const fn`, so a
/// caller can refuse an invalid [`Method::NAME`] at compile time.
pub const fn is_valid_method_name(name: &str) -> bool {
    is_valid_name_bytes(name.as_bytes())
}

pub(crate) const fn is_valid_name_bytes(name: &[u8]) -> bool {
    if name.is_empty() || name.len() > MAX_METHOD_NAME {
        return false;
    }
    let mut i = 0;
    while i < name.len() {
        let b = name[i];
        if !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            return false;
        }
        i += 1;
    }
    true
}

/// A validated method name received from the peer, sharing the frame's buffer (no copy).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct MethodName(Bytes);

impl MethodName {
    /// Wraps `bytes` if they form a valid method name.
    pub fn new(bytes: Bytes) -> Option<Self> {
        is_valid_name_bytes(&bytes).then_some(Self(bytes))
    }

    /// The name's bytes, as validated on construction (ASCII), without checking them again.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The name's length in bytes (at most [`MAX_METHOD_NAME`](crate::MAX_METHOD_NAME)).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true: a method name has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name. Always ASCII.
    pub fn as_str(&self) -> &str {
        // Validated as ASCII on construction, so this never takes the fallback.
        core::str::from_utf8(&self.0).unwrap_or("")
    }
}

impl fmt::Debug for MethodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for MethodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
