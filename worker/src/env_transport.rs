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
        let transport = waits_blocking(&worker, transport, |t| t.with_blocking_wait())?;
        confine_if_requested()?;
        return worker.serve_with_token(transport, token).await;
    }
    #[cfg(feature = "pipe")]
    {
        let config = airlock_transport_pipe::StreamConfig::default();
        let transport =
            airlock_transport_pipe::take_worker_stdio(config).map_err(ServeError::Transport)?;
        let transport = waits_blocking(&worker, transport, |t| t.with_blocking_read())?;
        confine_if_requested()?;
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

/// The transport of a worker that waits for the host in the OS while idle
/// ([`Worker::idle_wait_in_os`] under [`Worker::serve_blocking`]), made able to by `able`
/// (`FrameReceiver::wait_blocking`); any other worker's, unchanged. Over a pipe the wait is one
/// blocking `read` where the kernel allows (`with_blocking_read`); over a Unix socket it polls
/// first (`with_blocking_wait`), because there a blocking `read` measured slower than `ppoll`
/// and `read` (BENCHMARKS.md).
#[cfg(any(feature = "pipe", feature = "socket"))]
fn waits_blocking<T>(
    worker: &Worker,
    transport: T,
    able: impl FnOnce(T) -> std::io::Result<T>,
) -> Result<T, ServeError> {
    if worker.waits_in_os() {
        able(transport).map_err(ServeError::Transport)
    } else {
        Ok(transport)
    }
}

/// Installs the worker's own seccomp allowlist if the host asked for it: after the channel is
/// open (a named socket needs `connect`), before the `Hello`.
#[allow(dead_code)]
fn confine_if_requested() -> Result<(), ServeError> {
    if crate::confine::requested() {
        crate::confine::install_allowlist().map_err(ServeError::Confine)?;
    }
    Ok(())
}
