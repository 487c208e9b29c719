//! The peer processes of the socket security tests: the real worker, and the local processes
//! that try to take its place. `airlock-test-peer ROLE [ARG]`; it reports on stdout, one line
//! per event, so a test can wait for each step.
//!
//! Roles:
//! - `worker`: finds its channel from the environment (`worker_from_env`), sends a `Hello` with
//!   the token from `AIRLOCK_TOKEN` if set, then echoes every frame until end of stream.
//! - `hello`: connects to `AIRLOCK_SOCKET_NAME`, sends a `Hello` with `AIRLOCK_TOKEN` (whatever
//!   it is), prints `sent`, and waits for the host to close the connection (`closed`). If the
//!   host closed before the `Hello` could be written, it prints only `closed`.
//! - `squat`: connects, prints `connected`, says nothing, and waits for `closed`.
//! - `hello_and_exit`: connects, sends a `Hello` with `AIRLOCK_TOKEN`, prints `sent`, and
//!   exits at once, leaving the connection behind.
//! - `squat_then_work`: connects and says nothing until the host closes that connection
//!   (`closed`), then plays `worker` on a second connection.
//! - `connect`: tries to connect; prints `connected` (exit 0) or `error <kind>` (exit 3).
//! - `listen PARENT`: binds a named listener under PARENT, prints its name, and blocks until
//!   killed: an earlier run that died and left its name behind.
//! - `epoll_watch`: adds a descriptor to an epoll instance (before any runtime, which needs
//!   watches of its own); prints `added` (exit 0) or `error <OS error>` (exit 3): whether the
//!   kernel's epoll budget for this process's uid has room.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_tests::support::{hello_frame, raw_frame};
use airlock_transport_socket::{
    token_from_env, worker_from_env, NamedConfig, NamedListener, StreamConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("epoll_watch") {
        return epoll_watch();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match runtime.block_on(run(&args)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("airlock-test-peer {args:?}: {err}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: &[String]) -> std::io::Result<ExitCode> {
    match args.first().map(String::as_str) {
        Some("worker") => worker().await,
        Some("hello") => {
            let mut stream = connect_raw().await?;
            let token = token_from_env();
            let hello = hello_frame(token.as_ref().map(|t| &t[..]));
            if stream.write_all(&hello).await.is_err() {
                // The host refused us from our credentials alone and closed first.
                say("closed");
                return Ok(ExitCode::SUCCESS);
            }
            say("sent");
            wait_for_close(stream).await
        }
        Some("hello_and_exit") => {
            // Connects, says a Hello with whatever token it holds, and exits at once, leaving
            // the connection (and the credentials the kernel recorded for it) behind.
            let mut stream = connect_raw().await?;
            let token = token_from_env();
            stream
                .write_all(&hello_frame(token.as_ref().map(|t| &t[..])))
                .await?;
            say("sent");
            std::mem::forget(stream); // exit without a shutdown: the queued bytes stay
            Ok(ExitCode::SUCCESS)
        }
        Some("squat_then_work") => {
            // Connects and says nothing until the host gives up on that connection, then
            // connects again as an honest worker.
            wait_for_close(connect_raw().await?).await?;
            worker().await
        }
        Some("squat") => {
            let stream = connect_raw().await?;
            say("connected");
            wait_for_close(stream).await
        }
        Some("connect") => match connect_raw().await {
            Ok(_) => {
                say("connected");
                Ok(ExitCode::SUCCESS)
            }
            Err(err) => {
                say(&format!("error {:?}", err.kind()));
                Ok(ExitCode::from(3))
            }
        },
        Some("listen") => {
            let parent = args.get(1).expect("listen PARENT");
            let listener = NamedListener::bind(NamedConfig::default().parent_dir(parent))?;
            say(&listener.name().display().to_string());
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(listener);
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprintln!(
                "usage: airlock-test-peer worker|hello|hello_and_exit|squat|squat_then_work|connect|listen PARENT"
            );
            Ok(ExitCode::from(64))
        }
    }
}

/// The real worker: `Hello` (with the token when one was given), then echo until the end.
async fn worker() -> std::io::Result<ExitCode> {
    let transport = worker_from_env(StreamConfig::default()).await?;
    let (mut send, mut recv) = transport.split();
    let token = token_from_env();
    let hello = hello_frame(token.as_ref().map(|t| &t[..]));
    send.send(&[raw_frame(hello[4..].to_vec().into())])
        .await
        .map_err(std::io::Error::other)?;
    say("ready");
    while let Some(frame) = recv.recv().await.map_err(std::io::Error::other)? {
        send.send(&[raw_frame(frame)])
            .await
            .map_err(std::io::Error::other)?;
    }
    say("done");
    Ok(ExitCode::SUCCESS)
}

/// A plain connection to `AIRLOCK_SOCKET_NAME`, for the roles that speak raw bytes.
async fn connect_raw() -> std::io::Result<UnixStream> {
    let name = std::env::var_os(airlock_transport_socket::AIRLOCK_SOCKET_NAME)
        .ok_or_else(|| std::io::Error::other("AIRLOCK_SOCKET_NAME is not set"))?;
    UnixStream::connect(name).await
}

/// Waits (at most a minute) for the host to close the connection, and says so.
async fn wait_for_close(mut stream: UnixStream) -> std::io::Result<ExitCode> {
    let mut sink = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    say(if closed.is_ok() {
        "closed"
    } else {
        "still open"
    });
    Ok(ExitCode::SUCCESS)
}

/// Adds an eventfd to a new epoll instance: one epoll watch of this process's uid.
fn epoll_watch() -> ExitCode {
    use rustix::event::{epoll, eventfd, EventfdFlags};
    let added = epoll::create(epoll::CreateFlags::CLOEXEC).and_then(|instance| {
        let event = eventfd(0, EventfdFlags::CLOEXEC)?;
        epoll::add(
            &instance,
            &event,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )
    });
    match added {
        Ok(()) => {
            say("added");
            ExitCode::SUCCESS
        }
        Err(err) => {
            say(&format!("error {}", std::io::Error::from(err)));
            ExitCode::from(3)
        }
    }
}
