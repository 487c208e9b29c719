//! The raw baselines' far ends: this binary re-executed as `airlock-bench peer <role>`, doing
//! with plain blocking system calls what an airlock worker does with frames.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use ipc_channel::ipc::{self, IpcSender};

/// Bytes each way per small round trip, the same as airlock's 64-byte `Echo` body.
pub const SMALL: usize = 64;

/// Runs `role` until the bench closes the channel.
pub fn run(role: &str, args: &[String]) -> std::io::Result<()> {
    match role {
        // Pipes: the bench's writes arrive on stdin, answers leave on stdout.
        "echo-pipe" => echo(std::io::stdin().lock(), stdout_file()?),
        // A socket pair: the peer's end is its stdin, read and written.
        "echo-socket" => {
            let socket = std::fs::File::from(stdin_fd()?);
            let writer = socket.try_clone()?;
            echo(socket, writer)
        }
        "bulk-store" => bulk(std::io::stdin().lock(), stdout_file()?, false),
        "bulk-stream" => bulk(std::io::stdin().lock(), stdout_file()?, true),
        "first-byte" => std::io::stdout().write_all(b"!"),
        "ipc" => ipc_echo(args.first().map(String::as_str).unwrap_or_default()),
        // airlock's worker session alone on stdin and stdout: see `session_echo`.
        "session-echo" => session_echo(std::io::stdin().lock(), stdout_file()?),
        other => Err(std::io::Error::other(format!("unknown peer role {other}"))),
    }
}

/// This process's stdin as an owned descriptor (the socket pair's far end).
fn stdin_fd() -> std::io::Result<OwnedFd> {
    use std::os::fd::AsFd;
    std::io::stdin().as_fd().try_clone_to_owned()
}

/// This process's stdout as a plain file: std's `Stdout` buffers by line, which would hold
/// every answer back.
fn stdout_file() -> std::io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    Ok(std::io::stdout().as_fd().try_clone_to_owned()?.into())
}

/// Each whole message written back as it is read, one write per message: what a raw blocking
/// echo costs. (Stdin is buffered: when messages are pipelined, one read takes many of them.)
fn echo(mut from: impl Read, mut to: impl Write) -> std::io::Result<()> {
    let mut message = [0u8; SMALL];
    loop {
        if let Err(err) = from.read_exact(&mut message) {
            return ended(err);
        }
        to.write_all(&message)?;
    }
}

/// airlock's sans-IO `WorkerSession` and nothing else, blocking: it sends its `Hello`, and
/// answers every call by returning the request's encoded body as the response's (a `ByteBuf`
/// echo is the same bytes both ways). The worker side of the bound a host made of its session
/// alone reaches, with none of the bundled worker's runtime, dispatch or handler codec.
fn session_echo(mut from: impl Read, mut to: impl Write) -> std::io::Result<()> {
    use airlock_protocol::{WorkerConfig, WorkerEvent, WorkerSession};
    let mut session = WorkerSession::new(&WorkerConfig::new("session-echo", "1.0"));
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        while let Some(event) = session.poll_event() {
            if let WorkerEvent::Call { id, body, .. } = event {
                session
                    .reply_return(id, body)
                    .map_err(std::io::Error::other)?;
            }
        }
        while let Some(frame) = session.poll_transmit() {
            write_frame(&mut to, &frame)?;
        }
        if session.is_closed() {
            return Ok(());
        }
        let read = from.read(&mut chunk)?;
        if read == 0 {
            return Ok(());
        }
        session.handle_bytes(&chunk[..read]);
    }
}

/// Writes one frame, head and body in one vectored write (the rest, if it fell short, after).
pub fn write_frame(to: &mut impl Write, frame: &airlock_protocol::Transmit) -> std::io::Result<()> {
    let slices = [
        std::io::IoSlice::new(&frame.head),
        std::io::IoSlice::new(&frame.body),
    ];
    let written = to.write_vectored(&slices)?;
    if written < frame.len() {
        to.write_all(&frame.to_vec()[written..])?;
    }
    Ok(())
}

/// Echoes length-prefixed bodies (8-byte little-endian length): whole (`stream` false: read all
/// of it, then write it back) or chunk by chunk as it arrives.
fn bulk(mut from: impl Read, mut to: impl Write, stream: bool) -> std::io::Result<()> {
    let mut body = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let mut len = [0u8; 8];
        if let Err(err) = from.read_exact(&mut len) {
            return ended(err);
        }
        let len = usize::try_from(u64::from_le_bytes(len)).map_err(std::io::Error::other)?;
        if stream {
            let mut left = len;
            while left > 0 {
                let want = left.min(chunk.len());
                let n = from.read(&mut chunk[..want])?;
                if n == 0 {
                    return Ok(());
                }
                to.write_all(&chunk[..n])?;
                left -= n;
            }
        } else {
            body.resize(len, 0);
            from.read_exact(&mut body)?;
            to.write_all(&body)?;
        }
    }
}

fn ended(err: std::io::Error) -> std::io::Result<()> {
    if err.kind() == std::io::ErrorKind::UnexpectedEof {
        Ok(())
    } else {
        Err(err)
    }
}

/// A typed message as ipc-channel moves it (serde, then bincode, over its own Unix sockets).
pub type IpcMessage = serde_bytes::ByteBuf;

/// What the ipc-channel peer sends the bench once: where to send requests, where answers come.
pub type IpcBoot = (IpcSender<IpcMessage>, ipc::IpcReceiver<IpcMessage>);

/// The ipc-channel echo: connects to the bench's one-shot server, hands it both ends it needs,
/// then answers each request with the same value.
fn ipc_echo(server: &str) -> std::io::Result<()> {
    let boot = IpcSender::<IpcBoot>::connect(server.to_owned())?;
    let (request_tx, request_rx) = ipc::channel::<IpcMessage>()?;
    let (answer_tx, answer_rx) = ipc::channel::<IpcMessage>()?;
    boot.send((request_tx, answer_rx))
        .map_err(std::io::Error::other)?;
    while let Ok(message) = request_rx.recv() {
        if answer_tx.send(message).is_err() {
            break;
        }
    }
    Ok(())
}
