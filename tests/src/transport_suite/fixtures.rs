//! One fixture per transport: how to get a connected transport and the raw peer behind it.

use std::time::{Duration, Instant};

use airlock_transport_pipe::{PipeReader, PipeWriter, StreamConfig, StreamTransport, WorkerPipe};
use airlock_transport_socket::{
    inherited_pair, NamedConfig, NamedListener, PeerExpectation, SocketTransport,
};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::net::UnixStream;

use super::{Connected, Fixture};
use crate::support::hello_frame;

/// The pipe transport over two real OS pipes (`pipe(2)`), as a worker holds them: its read
/// end's description left blocking where the kernel allows, as a worker that waits for the host
/// in the OS leaves it (`StreamTransport::with_blocking_read`), so every read the suite makes
/// through the transport must not block on it.
#[derive(Clone, Copy, Debug)]
pub struct PipeFixture;

impl Fixture for PipeFixture {
    type Transport = WorkerPipe;

    async fn connect(&self, config: StreamConfig) -> Connected<WorkerPipe> {
        let (from_peer, to_transport) = rustix::pipe::pipe().expect("pipe");
        let to_transport = pipe::Sender::from_owned_fd(to_transport).expect("register");
        let from_peer = PipeReader::new(from_peer).expect("register");
        let (from_transport, to_peer) = rustix::pipe::pipe().expect("pipe");
        let from_transport = pipe::Receiver::from_owned_fd(from_transport).expect("register");
        let to_peer = PipeWriter::new(to_peer).expect("a pipe");
        let transport = StreamTransport::new(from_peer, to_peer, config)
            .with_blocking_read()
            .expect("blocking read");
        Connected {
            transport,
            peer_read: Box::new(from_transport),
            peer_write: Box::new(to_transport),
        }
    }
}

/// The socket transport, inherited mode: the host's end of a socket pair; the peer is the end
/// a worker would adopt.
#[derive(Clone, Copy, Debug)]
pub struct InheritedFixture;

impl Fixture for InheritedFixture {
    type Transport = SocketTransport;

    async fn connect(&self, config: StreamConfig) -> Connected<SocketTransport> {
        let (transport, child_end) = inherited_pair(config).expect("socket pair");
        let peer = std::os::unix::net::UnixStream::from(child_end);
        peer.set_nonblocking(true).expect("nonblocking");
        let (read, write) = UnixStream::from_std(peer).expect("register").into_split();
        Connected {
            transport,
            peer_read: Box::new(read),
            peer_write: Box::new(write),
        }
    }
}

/// The socket transport, named mode: the host's accepted connection, after a real listener
/// screened the peer's credentials and `Hello`.
#[derive(Clone, Copy, Debug)]
pub struct NamedFixture;

impl Fixture for NamedFixture {
    type Transport = SocketTransport;

    async fn connect(&self, config: StreamConfig) -> Connected<SocketTransport> {
        let listener = NamedListener::bind(NamedConfig::default().stream(config)).expect("bind");
        let name = listener.name().to_owned();
        let token = *listener.token();
        let accept = tokio::spawn(listener.accept_worker(
            PeerExpectation::process(std::process::id()),
            Instant::now() + Duration::from_secs(10),
        ));
        let mut client = UnixStream::connect(&name).await.expect("connect");
        client
            .write_all(&hello_frame(Some(&token)))
            .await
            .expect("hello");
        let accepted = accept.await.expect("join").expect("accept");
        assert_eq!(accepted.refused, 0, "{:?}", accepted.refusals);
        assert!(!name.exists(), "the name outlived the accept");
        let (read, write) = client.into_split();
        Connected {
            transport: accepted.transport,
            peer_read: Box::new(read),
            peer_write: Box::new(write),
        }
    }
}
