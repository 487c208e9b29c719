//! Starting one worker process and wiring its channel and stderr.

use std::process::Stdio;

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_transport_pipe::{StreamConfig, StreamTransport};
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
}

pub(crate) fn stream_config(settings: &Settings) -> StreamConfig {
    StreamConfig {
        max_frame: settings.protocol.frame_limit(),
        send_timeout: settings.send_timeout,
    }
}

/// Spawns the worker: its own process group, a cleared environment holding only what the
/// caller added, the chosen working directory, no inherited descriptors beyond stdio and the
/// channel, and death with its host.
pub(crate) fn spawn(settings: &Settings) -> Result<Spawned, SpawnError> {
    let mut command = Command::new(&settings.program);
    command
        .args(&settings.args)
        .env_clear()
        .envs(settings.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = &settings.cwd {
        command.current_dir(cwd);
    }
    match settings.transport {
        TransportChoice::Pipe => {
            crate::sys::prepare_child(&mut command, None);
            let mut child = command.spawn().map_err(SpawnError::Exec)?;
            let pid = child.id().unwrap_or(0);
            let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                return Err(SpawnError::Transport(std::io::Error::other(
                    "child stdio missing",
                )));
            };
            let stderr = child.stderr.take();
            let (sender, receiver) =
                StreamTransport::new(stdout, stdin, stream_config(settings)).split();
            Ok(Spawned {
                child,
                pid,
                sender: Box::new(sender),
                receiver: Box::new(receiver),
                stderr,
            })
        }
    }
}
