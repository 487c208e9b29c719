//! The bundled worker driven by airlock's sans-IO `HostSession` and nothing else: the bound a
//! host with no task between its caller and the pipe could reach.
//!
//! The caller does all of it in line: encode the request, `begin_call`, write the queued
//! frames, then read, feed the clock and the bytes to the session and take its `Completed`
//! event, decoding the answer. Every check the session makes is made; on tokio the call's
//! deadline is kept by a timer while the answer is awaited (on blocking pipes it is not).
//! What `Host::call` adds around it is not: the reader and supervisor tasks, the reply cell
//! and its wake, the confinement, the stats. The worker is the same bundled
//! `airlock-worker`, started unconfined on two pipes, or airlock's worker session alone
//! (`peer session-echo`).

use std::io::{IoSlice, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use airlock_protocol::{Event, HostConfig, HostSession, Method, Outcome};
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

use crate::links::Error;
use crate::peer::{write_frame, SMALL};

/// Call ids from OS randomness fetched a page at a time, as the host's own ids are: a system
/// call per id would be a cost `Host::call` does not pay.
struct PagedIds {
    page: [u8; 4096],
    used: usize,
}

impl PagedIds {
    fn new() -> Self {
        Self {
            page: [0; 4096],
            used: 4096,
        }
    }
}

impl rand_core::RngCore for PagedIds {
    fn next_u32(&mut self) -> u32 {
        rand_core::impls::next_u32_via_fill(self)
    }

    fn next_u64(&mut self) -> u64 {
        rand_core::impls::next_u64_via_fill(self)
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for byte in dst {
            if self.used == self.page.len() {
                // A bench has no way on without randomness; the host proper returns an error.
                #[allow(clippy::expect_used)]
                getrandom::fill(&mut self.page).expect("OS randomness");
                self.used = 0;
            }
            *byte = self.page[self.used];
            self.used += 1;
        }
    }
}

impl rand_core::CryptoRng for PagedIds {}

/// The host's side: its session, the worker process and the ends of its two pipes.
pub struct SessionLink<W, R> {
    session: HostSession,
    ids: PagedIds,
    chunk: Vec<u8>,
    to: W,
    from: R,
    child: Reaped,
}

/// The worker process, killed and reaped when its link is dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Which worker answers.
#[derive(Clone, Copy, Debug)]
pub enum Worker<'a> {
    /// The bundled `airlock-worker` at this path, unconfined.
    Bundled(&'a str),
    /// This binary's `peer session-echo`: airlock's worker session and nothing else.
    SessionAlone,
}

/// Starts the worker on two blocking pipes and runs the handshake: the session is ready, its
/// `Welcome` written.
fn handshake(worker: Worker<'_>) -> Result<SessionLink<std::fs::File, std::fs::File>, Error> {
    let mut command = match worker {
        Worker::Bundled(path) => Command::new(path),
        Worker::SessionAlone => {
            let mut command = Command::new(std::env::current_exe()?);
            command.args(["peer", "session-echo"]);
            command
        }
    };
    let mut child = command
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let to = std::os::fd::OwnedFd::from(child.stdin.take().ok_or("no stdin")?);
    let from = std::os::fd::OwnedFd::from(child.stdout.take().ok_or("no stdout")?);
    let mut link = SessionLink {
        session: HostSession::new(HostConfig::default(), Instant::now()),
        ids: PagedIds::new(),
        chunk: vec![0; 1 << 16],
        to: std::fs::File::from(to),
        from: std::fs::File::from(from),
        child: Reaped(child),
    };
    loop {
        match link.session.poll_event() {
            Some(Event::Ready(_)) => break,
            Some(other) => return Err(format!("handshake: {other:?}").into()),
            None => {}
        }
        let read = link.from.read(&mut link.chunk)?;
        link.feed(read)?;
    }
    link.transmit_blocking()?;
    Ok(link)
}

impl SessionLink<std::fs::File, std::fs::File> {
    /// The worker on blocking pipes, past its handshake.
    pub fn blocking(worker: Worker<'_>) -> Result<Self, Error> {
        handshake(worker)
    }

    fn transmit_blocking(&mut self) -> Result<(), Error> {
        while let Some(frame) = self.session.poll_transmit() {
            write_frame(&mut self.to, &frame)?;
        }
        Ok(())
    }

    /// `n` 64-byte `Echo` calls, blocking on the pipes.
    pub fn round_trips_blocking(&mut self, n: u32) -> Result<Duration, Error> {
        let message = ByteBuf::from(vec![0x5au8; SMALL]);
        let started = Instant::now();
        for _ in 0..n {
            // No deadline is kept while blocked in `read`: a host would need a timed wait
            // (see BENCHMARKS.md for what one costs).
            self.begin(&message)?;
            self.transmit_blocking()?;
            loop {
                if let Some(answer) = self.answer()? {
                    std::hint::black_box(answer);
                    break;
                }
                let read = self.from.read(&mut self.chunk)?;
                self.feed(read)?;
            }
        }
        Ok(started.elapsed())
    }
}

impl SessionLink<tokio::net::unix::pipe::Sender, tokio::net::unix::pipe::Receiver> {
    /// The worker on pipes registered with `rt`'s reactor, past its handshake.
    pub fn on_tokio(rt: &Runtime, worker: Worker<'_>) -> Result<Self, Error> {
        let ready = handshake(worker)?;
        let _reactor = rt.enter();
        Ok(Self {
            session: ready.session,
            ids: ready.ids,
            chunk: ready.chunk,
            to: tokio::net::unix::pipe::Sender::from_file(ready.to)?,
            from: tokio::net::unix::pipe::Receiver::from_file(ready.from)?,
            child: ready.child,
        })
    }

    /// `n` 64-byte `Echo` calls from `block_on`'s own future, awaiting each answer on the pipe.
    pub fn round_trips_async(&mut self, rt: &Runtime, n: u32) -> Result<Duration, Error> {
        let message = ByteBuf::from(vec![0x5au8; SMALL]);
        rt.block_on(async {
            let started = Instant::now();
            for _ in 0..n {
                let deadline = tokio::time::Instant::from_std(self.begin(&message)?);
                while let Some(frame) = self.session.poll_transmit() {
                    let slices = [IoSlice::new(&frame.head), IoSlice::new(&frame.body)];
                    let written = self.to.write_vectored(&slices).await?;
                    if written < frame.len() {
                        self.to.write_all(&frame.to_vec()[written..]).await?;
                    }
                }
                loop {
                    if let Some(answer) = self.answer()? {
                        std::hint::black_box(answer);
                        break;
                    }
                    // The deadline is kept while the answer is awaited, as a host must: a
                    // timer per call, which the runtime arms at each park.
                    match tokio::time::timeout_at(deadline, self.from.read(&mut self.chunk)).await {
                        Ok(read) => self.feed(read?)?,
                        Err(_) => self.session.handle_timeout(Instant::now()),
                    }
                }
            }
            Ok(started.elapsed())
        })
    }

    /// `n` 64-byte `Echo` calls with `window` in flight, from `block_on`'s own future: the
    /// frames of the calls begun in a turn leave in one write, the answers are read in chunks,
    /// and each answer taken lets the next call begin. The earliest deadline is kept by a
    /// timer.
    pub fn pipelined_async(
        &mut self,
        rt: &Runtime,
        n: u32,
        window: u32,
    ) -> Result<Duration, Error> {
        let message = ByteBuf::from(vec![0x5au8; SMALL]);
        let mut batch = Vec::new();
        rt.block_on(async {
            let started = Instant::now();
            let (mut begun, mut answered) = (0u32, 0u32);
            loop {
                while let Some(answer) = self.answer()? {
                    std::hint::black_box(answer);
                    answered += 1;
                }
                if answered == n {
                    return Ok(started.elapsed());
                }
                while begun < n && begun - answered < window {
                    self.begin(&message)?;
                    begun += 1;
                }
                batch.clear();
                while let Some(frame) = self.session.poll_transmit() {
                    batch.extend_from_slice(&frame.head);
                    batch.extend_from_slice(&frame.body);
                }
                self.to.write_all(&batch).await?;
                let due = self.session.poll_timeout().ok_or("no call in flight")?;
                let due = tokio::time::Instant::from_std(due);
                match tokio::time::timeout_at(due, self.from.read(&mut self.chunk)).await {
                    Ok(read) => self.feed(read?)?,
                    Err(_) => self.session.handle_timeout(Instant::now()),
                }
            }
        })
    }
}

impl<W, R> SessionLink<W, R> {
    /// Encodes `message` and begins its call, as `Host::call` does: a 30 s deadline, returned.
    fn begin(&mut self, message: &ByteBuf) -> Result<Instant, Error> {
        let body = airlock_codec::to_vec(message)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        self.session
            .begin_call(Echo::NAME, body, deadline, &mut self.ids)?;
        Ok(deadline)
    }

    /// Time first, then the bytes read, as the host's reader feeds them.
    fn feed(&mut self, read: usize) -> Result<(), Error> {
        if read == 0 {
            return Err("the worker closed its channel".into());
        }
        self.session.handle_timeout(Instant::now());
        self.session.handle_bytes(&self.chunk[..read]);
        Ok(())
    }

    /// The decoded answer, if the session has completed the call.
    fn answer(&mut self) -> Result<Option<ByteBuf>, Error> {
        match self.session.poll_event() {
            None => Ok(None),
            Some(Event::Completed {
                outcome: Outcome::Returned(body),
                ..
            }) => Ok(Some(airlock_codec::from_slice(
                &body,
                &airlock_codec::Limits::default(),
            )?)),
            Some(other) => Err(format!("the call did not return: {other:?}").into()),
        }
    }
}
