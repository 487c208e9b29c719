//! Live two-process channels to time: airlock's (a `Host` or `Pool` over the bundled worker)
//! and the baselines' (raw pipes and sockets to a blocking echo, ipc-channel, Python).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use airlock_host::Method;
use airlock_host::{Confinement, Host, Pool, TransportChoice};
use airlock_worker::builtin::Echo;
use ipc_channel::ipc::{IpcOneShotServer, IpcReceiver, IpcSender};
use serde_bytes::ByteBuf;
use tokio::runtime::Runtime;

use crate::peer::{IpcBoot, IpcMessage, SMALL};

/// Any failure while measuring: the bench stops and says what failed.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A blocking echo peer over a pipe pair or a socket pair: the raw floor under a transport.
pub struct RawLink {
    to: Box<dyn Write + Send>,
    from: Box<dyn Read + Send>,
    child: Child,
}

/// Which OS channel a [`RawLink`] uses.
#[derive(Clone, Copy, Debug)]
pub enum Raw {
    /// Two pipes, the peer's stdin and stdout.
    Pipe,
    /// A Unix stream socket pair, the peer's end as its stdin.
    Socket,
}

/// This binary started as the peer in `role` (`peer.rs`).
fn peer(role: &str) -> Command {
    let mut command =
        Command::new(std::env::current_exe().unwrap_or_else(|_| "airlock-bench".into()));
    command
        .args(["peer", role])
        .env_clear()
        .stderr(Stdio::inherit());
    command
}

impl RawLink {
    /// Starts a peer echoing 64-byte messages over `kind`.
    pub fn echo(kind: Raw) -> Result<Self, Error> {
        match kind {
            Raw::Pipe => Self::piped("echo-pipe"),
            Raw::Socket => {
                let (ours, theirs) = UnixStream::pair()?;
                let child = peer("echo-socket")
                    .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
                    .stdout(Stdio::null())
                    .spawn()?;
                Ok(Self {
                    to: Box::new(ours.try_clone()?),
                    from: Box::new(ours),
                    child,
                })
            }
        }
    }

    /// Starts a peer in `role` on two pipes.
    pub fn piped(role: &str) -> Result<Self, Error> {
        let mut child = peer(role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let to = child.stdin.take().ok_or("no stdin")?;
        let from = child.stdout.take().ok_or("no stdout")?;
        Ok(Self {
            to: Box::new(to),
            from: Box::new(from),
            child,
        })
    }

    /// The peer's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `n` round trips of one 64-byte message.
    pub fn round_trips(&mut self, n: u32) -> Result<Duration, Error> {
        let mut message = [0x5au8; SMALL];
        let started = Instant::now();
        for _ in 0..n {
            self.to.write_all(&message)?;
            self.from.read_exact(&mut message)?;
        }
        Ok(started.elapsed())
    }

    /// `n` messages with `window` in flight, one write per message on both sides.
    pub fn pipelined(&mut self, n: u32, window: u32) -> Result<Duration, Error> {
        let message = [0x5au8; SMALL];
        let mut answer = [0u8; SMALL];
        let started = Instant::now();
        let mut sent = 0;
        while sent < window.min(n) {
            self.to.write_all(&message)?;
            sent += 1;
        }
        for _ in 0..n {
            self.from.read_exact(&mut answer)?;
            if sent < n {
                self.to.write_all(&message)?;
                sent += 1;
            }
        }
        Ok(started.elapsed())
    }

    /// One length-prefixed body of `len` bytes echoed back (the peer decides whether it stores
    /// the body or streams it): written by one thread while this one reads.
    pub fn bulk(&mut self, body: &[u8], back: &mut Vec<u8>) -> Result<Duration, Error> {
        back.resize(body.len(), 0);
        let started = Instant::now();
        let to = &mut self.to;
        let from = &mut self.from;
        std::thread::scope(|scope| -> Result<(), Error> {
            let writer = scope.spawn(move || -> std::io::Result<()> {
                to.write_all(&(body.len() as u64).to_le_bytes())?;
                to.write_all(body)
            });
            from.read_exact(back)?;
            writer.join().map_err(|_| "bulk writer panicked")??;
            Ok(())
        })?;
        Ok(started.elapsed())
    }
}

impl Drop for RawLink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The raw blocking echo peer called from a tokio current-thread runtime with nothing on top:
/// `block_on`'s own future writes each message and then awaits the answer on the pipe itself,
/// with no task, channel, timer or check between. What any async round trip on tokio costs
/// before it does anything of its own (a read that finds nothing, the runtime's park in
/// `epoll_wait`, the read again), so the floor under `Host::call`.
pub struct TokioLink {
    to: tokio::net::unix::pipe::Sender,
    from: tokio::net::unix::pipe::Receiver,
    child: Child,
}

/// The raw echo peer (each 64-byte message written back as it is read) on two pipes,
/// registered with `rt`'s reactor: the pipe to it, the pipe from it, and the peer.
pub fn async_echo_peer(
    rt: &Runtime,
) -> Result<
    (
        tokio::net::unix::pipe::Sender,
        tokio::net::unix::pipe::Receiver,
        Child,
    ),
    Error,
> {
    use std::os::fd::OwnedFd;
    let mut child = peer("echo-pipe")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let to = OwnedFd::from(child.stdin.take().ok_or("no stdin")?);
    let from = OwnedFd::from(child.stdout.take().ok_or("no stdout")?);
    let _reactor = rt.enter();
    Ok((
        tokio::net::unix::pipe::Sender::from_owned_fd(to)?,
        tokio::net::unix::pipe::Receiver::from_owned_fd(from)?,
        child,
    ))
}

impl TokioLink {
    /// Starts the raw echo peer on two pipes, registered with `rt`'s reactor.
    pub fn echo(rt: &Runtime) -> Result<Self, Error> {
        let (to, from, child) = async_echo_peer(rt)?;
        Ok(Self { to, from, child })
    }

    /// `n` round trips of one 64-byte message, from `block_on`'s own future.
    pub fn round_trips(&mut self, rt: &Runtime, n: u32) -> Result<Duration, Error> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut message = [0x5au8; SMALL];
        rt.block_on(async {
            let started = Instant::now();
            for _ in 0..n {
                self.to.write_all(&message).await?;
                self.from.read_exact(&mut message).await?;
            }
            Ok(started.elapsed())
        })
    }
}

impl Drop for TokioLink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// servo's `ipc-channel`, typed: a `ByteBuf` serialised with bincode each way, no checks.
pub struct IpcLink {
    requests: IpcSender<IpcMessage>,
    answers: IpcReceiver<IpcMessage>,
    child: Child,
}

impl IpcLink {
    /// Starts the ipc-channel echo peer and takes its channel ends.
    pub fn start() -> Result<Self, Error> {
        let (server, name) = IpcOneShotServer::<IpcBoot>::new()?;
        let child = peer("ipc")
            .arg(name)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        let (_, (requests, answers)) = server.accept()?;
        Ok(Self {
            requests,
            answers,
            child,
        })
    }

    /// `n` typed round trips of a 64-byte value.
    pub fn round_trips(&mut self, n: u32) -> Result<Duration, Error> {
        let mut message = ByteBuf::from(vec![0x5au8; SMALL]);
        let started = Instant::now();
        for _ in 0..n {
            self.requests.send(message)?;
            message = self.answers.recv()?;
        }
        Ok(started.elapsed())
    }
}

impl Drop for IpcLink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Python's `multiprocessing.Pipe` with pickle, timed inside Python (its start-up is not in
/// the figure).
const PYTHON_ECHO: &str = r#"
import sys, time
from multiprocessing import Pipe, Process
def echo(conn):
    while True:
        m = conn.recv()
        if m is None:
            return
        conn.send(m)
if __name__ == "__main__":
    n = int(sys.argv[1])
    ours, theirs = Pipe()
    child = Process(target=echo, args=(theirs,))
    child.start()
    message = bytes(64)
    for _ in range(200):
        ours.send(message); ours.recv()
    started = time.perf_counter_ns()
    for _ in range(n):
        ours.send(message); ours.recv()
    elapsed = time.perf_counter_ns() - started
    ours.send(None)
    child.join()
    print(elapsed)
"#;

/// Whether `python3` runs here.
pub fn python_available() -> bool {
    Command::new("python3")
        .arg("-c")
        .arg("import multiprocessing")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `n` Python round trips, in a fresh interpreter.
pub fn python_round_trips(n: u32) -> Result<Duration, Error> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(PYTHON_ECHO)
        .arg(n.to_string())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("python3 failed: {}", out.status).into());
    }
    let nanos: u64 = String::from_utf8(out.stdout)?.trim().parse()?;
    Ok(Duration::from_nanos(nanos))
}

/// A spawn of this binary to the first byte it writes: the raw floor under spawn-to-ready.
pub fn raw_spawn() -> Result<Duration, Error> {
    let started = Instant::now();
    let mut child = peer("first-byte")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut byte = [0u8; 1];
    child
        .stdout
        .take()
        .ok_or("no stdout")?
        .read_exact(&mut byte)?;
    let elapsed = started.elapsed();
    child.wait()?;
    Ok(elapsed)
}

/// A runtime of the given flavour (`threads` 0: current-thread).
pub fn runtime(threads: usize) -> Result<Runtime, Error> {
    let mut builder = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    Ok(builder.enable_all().build()?)
}

/// Spawns the bundled worker under the default confinement (or `policy`) over `transport`.
pub fn spawn_host(
    rt: &Runtime,
    worker: &str,
    transport: TransportChoice,
    policy: Confinement,
) -> Result<Host, Error> {
    Ok(rt.block_on(
        Host::builder(worker)
            .transport(transport)
            .confinement(policy)
            .spawn(),
    )?)
}

/// A host over a pipe pair to a `strict()`-confined worker: the bench's default.
pub fn spawn_piped(rt: &Runtime, worker: &str) -> Result<Host, Error> {
    spawn_host(rt, worker, TransportChoice::Pipe, Confinement::strict())
}

/// A default-confined host over the pipe in the opt-in low-latency mode (`window` of spin).
pub fn spawn_low_latency_host(rt: &Runtime, worker: &str, window: Duration) -> Result<Host, Error> {
    Ok(rt.block_on(Host::builder(worker).low_latency(window).spawn())?)
}

/// A default-confined host over the pipe whose worker runs one handler at a time
/// (`--max-concurrency 1`), so it runs blocking handlers on its serving thread.
pub fn spawn_one_slot_host(rt: &Runtime, worker: &str) -> Result<Host, Error> {
    Ok(rt.block_on(
        Host::builder(worker)
            .arg("--max-concurrency")
            .arg("1")
            .spawn(),
    )?)
}

/// A `Pool` of `size` default-confined workers.
pub fn spawn_pool(rt: &Runtime, worker: &str, size: usize) -> Result<Pool, Error> {
    Ok(rt.block_on(Pool::builder(Host::builder(worker)).size(size).spawn())?)
}

fn small() -> ByteBuf {
    ByteBuf::from(vec![0x5au8; SMALL])
}

/// `n` sequential 64-byte `Echo` calls.
pub fn calls(rt: &Runtime, host: &Host, n: u32) -> Result<Duration, Error> {
    calls_to::<Echo>(rt, host, n)
}

/// `n` sequential calls of the echo method `M` with a 64-byte payload, from `block_on`'s own
/// future (as from `#[tokio::main]`).
pub fn calls_to<M>(rt: &Runtime, host: &Host, n: u32) -> Result<Duration, Error>
where
    M: Method<Request = ByteBuf, Response = ByteBuf>,
{
    rt.block_on(call_loop::<M>(host.clone(), n))
}

/// `n` sequential 64-byte `Echo` calls from a spawned task: tokio runs a woken task from its
/// queue, where it first polls the OS for events (one `epoll_wait`) before it polls
/// `block_on`'s own future again.
pub fn calls_from_task(rt: &Runtime, host: &Host, n: u32) -> Result<Duration, Error> {
    rt.block_on(async { tokio::spawn(call_loop::<Echo>(host.clone(), n)).await? })
}

async fn call_loop<M>(host: Host, n: u32) -> Result<Duration, Error>
where
    M: Method<Request = ByteBuf, Response = ByteBuf>,
{
    let message = small();
    let started = Instant::now();
    for _ in 0..n {
        host.call::<M>(&message).await?;
    }
    Ok(started.elapsed())
}

/// Something `Echo` can be called on: a `Host` or a `Pool`.
pub trait Caller: Clone + Send + Sync + 'static {
    /// One 64-byte echo.
    fn echo(
        &self,
        message: &ByteBuf,
    ) -> impl std::future::Future<Output = Result<ByteBuf, airlock_host::CallError>> + Send;
}

impl Caller for Host {
    fn echo(
        &self,
        message: &ByteBuf,
    ) -> impl std::future::Future<Output = Result<ByteBuf, airlock_host::CallError>> + Send {
        self.call::<Echo>(message)
    }
}

impl Caller for Pool {
    fn echo(
        &self,
        message: &ByteBuf,
    ) -> impl std::future::Future<Output = Result<ByteBuf, airlock_host::CallError>> + Send {
        self.call::<Echo>(message)
    }
}

/// `n` 64-byte `Echo` calls, `window` of them in flight until fewer than `window` are left to
/// begin (one task per slot of the window, each taking its next call from the burst's
/// [`Budget`]).
pub fn pipelined<C: Caller>(
    rt: &Runtime,
    caller: &C,
    n: u32,
    window: u32,
) -> Result<Duration, Error> {
    let budget = Budget::of(n);
    rt.block_on(async {
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..window {
            let caller = caller.clone();
            let budget = budget.clone();
            tasks.spawn(async move {
                let message = small();
                while budget.take_one() {
                    caller.echo(&message).await?;
                }
                Ok::<(), airlock_host::CallError>(())
            });
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        Ok(started.elapsed())
    })
}

/// The calls of a pipelined burst still to begin, shared by its tasks: a task that finishes a
/// call takes the next one from here, so the window stays full until the last calls, as the
/// raw echo's does. (With a fixed share per task, the tasks that the runtime served less would
/// be left running alone at the end, with fewer calls in flight.)
#[derive(Clone)]
pub struct Budget(std::sync::Arc<std::sync::atomic::AtomicU32>);

impl Budget {
    /// `n` calls to begin.
    pub fn of(n: u32) -> Self {
        Self(std::sync::Arc::new(std::sync::atomic::AtomicU32::new(n)))
    }

    /// Takes one call to begin: `false` once none is left.
    pub fn take_one(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.0
            .fetch_update(Relaxed, Relaxed, |left| left.checked_sub(1))
            .is_ok()
    }
}

/// One `Echo` of `body`.
pub fn bulk<M>(rt: &Runtime, host: &Host, body: &M::Request) -> Result<Duration, Error>
where
    M: Method<Response = <M as Method>::Request>,
    M::Request: AsRef<[u8]>,
{
    rt.block_on(async {
        let started = Instant::now();
        let back = host.call::<M>(body).await?;
        let elapsed = started.elapsed();
        if back.as_ref().len() != body.as_ref().len() {
            return Err("bulk echo came back short".into());
        }
        Ok(elapsed)
    })
}

/// Spawn to ready (handshake done) under `policy`; the shutdown is not timed.
pub fn spawn_to_ready(rt: &Runtime, worker: &str, policy: Confinement) -> Result<Duration, Error> {
    rt.block_on(async {
        let started = Instant::now();
        let host = Host::builder(worker).confinement(policy).spawn().await?;
        let elapsed = started.elapsed();
        host.shutdown().await;
        Ok(elapsed)
    })
}
