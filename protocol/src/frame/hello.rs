//! `Hello`: worker → host, the first frame of every connection.

use serde::{Deserialize, Serialize};

/// Most method names a `Hello` may list.
pub const MAX_HELLO_METHODS: usize = 1024;

/// Length of a connection token, in bytes.
pub const TOKEN_LEN: usize = 32;

/// The worker introduces itself: protocol version, its name and version, the methods it
/// serves, and (on sockets) the connection token the host gave it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello<'a> {
    /// [`PROTOCOL_VERSION`](crate::PROTOCOL_VERSION) of the worker's build.
    pub protocol: u32,
    /// The worker's name: a valid method-name string (1–64 of `[A-Za-z0-9._-]`).
    pub worker_name: &'a str,
    /// The worker's version, same character rule.
    pub worker_version: &'a str,
    /// The methods it serves: at most [`MAX_HELLO_METHODS`] valid, distinct names.
    #[serde(borrow)]
    pub methods: Vec<&'a str>,
    /// The connection token, exactly [`TOKEN_LEN`] bytes, when the host asked for one.
    #[serde(with = "serde_bytes", borrow)]
    pub token: Option<&'a [u8]>,
}

/// True if `presented` is exactly the `expected` token, compared without an early exit so the
/// time taken does not reveal how many leading bytes of a guess were right. (The length is
/// public: every token has [`TOKEN_LEN`] bytes.) Used by the host session and by the named
/// socket listener's screening, so there is one comparison to audit.
pub fn token_matches(presented: &[u8], expected: &[u8; TOKEN_LEN]) -> bool {
    presented.len() == expected.len()
        && presented
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}
