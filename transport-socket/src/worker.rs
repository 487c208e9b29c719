//! The worker's side: find the channel the host set up, from the environment.

use std::io;

use airlock_transport_pipe::StreamConfig;

use crate::env::AIRLOCK_SOCKET_NAME;
use crate::{worker_connect_named, worker_inherited, SocketTransport};

/// How the worker reaches its host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SocketMode {
    /// A socket-pair end inherited at a descriptor number.
    Inherited,
    /// A named socket to connect to, with a token to quote.
    Named,
}

impl SocketMode {
    /// [`SocketMode::Named`] if [`AIRLOCK_SOCKET_NAME`](crate::AIRLOCK_SOCKET_NAME) is set,
    /// else [`SocketMode::Inherited`].
    pub fn from_env() -> Self {
        if std::env::var_os(AIRLOCK_SOCKET_NAME).is_some() {
            Self::Named
        } else {
            Self::Inherited
        }
    }
}

/// Worker side, either mode: connects to [`AIRLOCK_SOCKET_NAME`](crate::AIRLOCK_SOCKET_NAME)
/// if it is set ([`worker_connect_named`]), else adopts the inherited socket
/// ([`worker_inherited`], whose calling contract applies). In named mode the worker's `Hello`
/// must carry [`token_from_env`](crate::token_from_env).
pub async fn worker_from_env(config: StreamConfig) -> io::Result<SocketTransport> {
    match SocketMode::from_env() {
        SocketMode::Named => worker_connect_named(config).await,
        SocketMode::Inherited => worker_inherited(config),
    }
}
