//! Choosing the transport the host set up for this process.

#[allow(unused_imports)]
use crate::{ServeError, Worker};

#[cfg(feature = "socket")]
fn socket_requested() -> bool {
    std::env::var_os(airlock_transport_socket::AIRLOCK_SOCKET_FD).is_some()
        || std::env::var_os(airlock_transport_socket::AIRLOCK_SOCKET_NAME).is_some()
}

pub(crate) async fn serve_from_env(worker: Worker) -> Result<(), ServeError> {
    #[cfg(feature = "socket")]
    if socket_requested() {
        let config = airlock_transport_pipe::StreamConfig::default();
        let transport = airlock_transport_socket::worker_from_env(config)
            .await
            .map_err(ServeError::Transport)?;
        let token = airlock_transport_socket::token_from_env();
        return worker.serve_with_token(transport, token).await;
    }
    #[cfg(feature = "pipe")]
    {
        let config = airlock_transport_pipe::StreamConfig::default();
        let transport =
            airlock_transport_pipe::take_worker_stdio(config).map_err(ServeError::Transport)?;
        worker.serve_with_token(transport, None).await
    }
    #[cfg(not(feature = "pipe"))]
    {
        let _ = worker;
        Err(ServeError::NoTransport(
            "the pipe transport is not compiled in and no socket was given",
        ))
    }
}
