//! Starting one worker process and wiring its channel and stderr.

use std::process::Stdio;

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_protocol::TOKEN_LEN;
use airlock_transport_pipe::StreamConfig;
#[cfg(feature = "pipe")]
use airlock_transport_pipe::StreamTransport;
use bytes::Bytes;
use tokio::process::{Child, ChildStderr, Command};

use crate::config::{Settings, TransportChoice};
use crate::SpawnError;

/// A started worker process, before its handshake.
pub(crate) struct Spawned {
    pub(crate) child: Child,
    pub(crate) pid: u32,
    pub(crate) sender: Box<dyn FrameSender>,
    pub(crate) receiver: Box<dyn FrameReceiver>,
    pub(crate) stderr: Option<ChildStderr>,
    /// A first frame already read while authenticating the peer (named sockets).
    pub(crate) hello: Option<Bytes>,
    /// The token the session must find in that `Hello` (named sockets).
    pub(crate) token: Option<[u8; TOKEN_LEN]>,
}

/// The stream settings for a new worker's channel. Frames are capped at the handshake's
/// limit until the worker has completed its handshake (the supervisor raises it then), so an
/// unauthenticated peer cannot make the host buffer a `max_frame`-sized frame.
pub(crate) fn stream_config(settings: &Settings) -> StreamConfig {
    StreamConfig {
        max_frame: settings
            .protocol
            .frame_limit()
            .min(airlock_protocol::HANDSHAKE_MAX_FRAME),
        send_timeout: settings.send_timeout,
    }
}

/// The command every transport starts from: its own process group, a cleared environment
/// holding only what the caller added, the chosen working directory, stderr captured.
fn base_command(settings: &Settings) -> Command {
    let mut command = Command::new(&settings.program);
    command
        .args(&settings.args)
        .env_clear()
        .envs(settings.env.iter().map(|(k, v)| (k, v)))
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = &settings.cwd {
        command.current_dir(cwd);
    }
    command
}

fn started(
    mut child: Child,
    sender: Box<dyn FrameSender>,
    receiver: Box<dyn FrameReceiver>,
) -> Spawned {
    let pid = child.id().unwrap_or(0);
    let stderr = child.stderr.take();
    Spawned {
        child,
        pid,
        sender,
        receiver,
        stderr,
        hello: None,
        token: None,
    }
}

/// Spawns the worker with the configured transport. Besides the command's setup, every
/// descriptor but stdio and the channel is closed on exec and the worker dies with its host
/// (see `sys::prepare_child`).
pub(crate) async fn spawn(settings: &Settings) -> Result<Spawned, SpawnError> {
    if crate::sys::children_reaped_by_kernel() {
        return Err(SpawnError::ChildrenReapedByKernel);
    }
    let mut command = base_command(settings);
    match settings.transport {
        #[cfg(feature = "pipe")]
        TransportChoice::Pipe => {
            command.stdin(Stdio::piped()).stdout(Stdio::piped());
            crate::sys::prepare_child(&mut command, None);
            let mut child = crate::spawner::spawn(command)
                .await
                .map_err(SpawnError::Exec)?;
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err(SpawnError::Transport(std::io::Error::other(
                    "child stdio missing",
                )));
            };
            let (sender, receiver) =
                StreamTransport::new(stdout, stdin, stream_config(settings)).split();
            Ok(started(child, Box::new(sender), Box::new(receiver)))
        }
        #[cfg(feature = "socket")]
        TransportChoice::SocketInherited => {
            use airlock_transport_socket::{inherited_pair, AIRLOCK_SOCKET_FD, CHILD_SOCKET_FD};
            use std::os::fd::AsRawFd;
            let (transport, child_end) =
                inherited_pair(stream_config(settings)).map_err(SpawnError::Transport)?;
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .env(AIRLOCK_SOCKET_FD, CHILD_SOCKET_FD.to_string());
            crate::sys::prepare_child(&mut command, Some(child_end.as_raw_fd()));
            let child = crate::spawner::spawn(command)
                .await
                .map_err(SpawnError::Exec)?;
            // Our copy of the child's end must go, or the worker exiting is never seen as the
            // end of the stream.
            drop(child_end);
            let (sender, receiver) = transport.split();
            Ok(started(child, Box::new(sender), Box::new(receiver)))
        }
        #[cfg(feature = "socket")]
        TransportChoice::SocketNamed => spawn_named(settings, command).await,
    }
}

/// Named socket: listen in a fresh private directory, start the child with the name and a
/// one-time token, and accept only a connection from that very process holding the token.
#[cfg(feature = "socket")]
async fn spawn_named(settings: &Settings, mut command: Command) -> Result<Spawned, SpawnError> {
    use airlock_transport_socket::{AcceptError, NamedConfig, NamedListener, PeerExpectation};

    let config = NamedConfig::default().stream(stream_config(settings));
    let listener = NamedListener::bind(config).map_err(SpawnError::Transport)?;
    for (key, value) in listener.env() {
        command.env(key, value);
    }
    command.stdin(Stdio::null()).stdout(Stdio::null());
    crate::sys::prepare_child(&mut command, None);
    let mut child = crate::spawner::spawn(command)
        .await
        .map_err(SpawnError::Exec)?;
    // The pid to expect: never a stand-in (a 0 would match peers from an ancestor PID
    // namespace). `None` only once the child has been reaped, which it cannot have been yet.
    let Some(pid) = child.id() else {
        return Err(SpawnError::Handshake(crate::LostReason::TransportFailed));
    };
    let token = *listener.token();
    let deadline = std::time::Instant::now() + settings.protocol.handshake_limit();
    match listener
        .accept_worker(PeerExpectation::process(pid), deadline)
        .await
    {
        Ok(accepted) => {
            let (sender, receiver) = accepted.transport.split();
            let mut spawned = started(child, Box::new(sender), Box::new(receiver));
            spawned.hello = Some(accepted.hello);
            spawned.token = Some(token);
            Ok(spawned)
        }
        Err(err) => {
            crate::launch::kill_group(pid);
            let _ = child.start_kill();
            let _ = child.wait().await;
            Err(match err {
                AcceptError::Deadline { .. } => {
                    SpawnError::Handshake(crate::LostReason::HandshakeTimeout)
                }
                other => SpawnError::Transport(std::io::Error::other(other)),
            })
        }
    }
}
