//! Writing a descriptor straight away, without the runtime, while the OS takes the bytes at
//! once: the write loop under the pipe transport's writer ([`PipeWriter`]) and the socket
//! transport's write half.
//!
//! A write the OS takes at once needs nothing from the event loop, so each is one system call
//! with no readiness to check or clear around it. Only a write that fails with `EAGAIN` (the
//! buffer is full) turns to the event loop and waits for its word that there is room; writes
//! go straight to the descriptor again once one is taken whole. While writes come back partial
//! (a bulk transfer is under way) it keeps asking the event loop first.
//!
//! Everything the writer registers with the runtime's event loop (its `epoll` instance) is
//! registered when the writer is made, for its whole life, and nothing later. A process forked
//! from this one shares that instance; a registration it made there would hand the parent's
//! runtime events that point into the child's memory. And a registration made later could be
//! refused once a sibling of the same uid has used up the uid's watches (SECURITY.md). How the
//! writer learns there is room is the caller's choice:
//! - [`WriteDirect::registered`]: the descriptor itself is registered for writability (a pipe,
//!   which signals room only when it was full).
//! - [`WriteDirect::armed_while_full`]: the descriptor sits in an `epoll` instance of the
//!   writer's own, which is what the runtime watches, and the writer asks that instance for
//!   room only while the buffer is full (a Unix socket, which signals room each time its peer
//!   reads: watched all the time, it would wake its runtime for nothing once per frame the peer
//!   reads). The writer's instance names the descriptor by a number, not by an address, so a
//!   forked child that arms or drains it touches no memory of the parent's.
//!
//! [`PipeWriter`]: crate::PipeWriter

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::task::{ready, Context, Poll};

use rustix::event::epoll;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::read_window::register;

/// A non-blocking descriptor written directly, asking the runtime for room only when the OS
/// has none (see the module docs).
#[derive(Debug)]
pub struct WriteDirect {
    watch: Watch,
    /// The last write found no room (or only some): the next waits for the word that there is.
    full: bool,
}

#[derive(Debug)]
enum Watch {
    /// The descriptor itself, registered with the runtime for writability.
    Registered(AsyncFd<OwnedFd>),
    /// The descriptor in an `epoll` instance of the writer's own, registered with the runtime
    /// for readability; `armed` while that instance watches the descriptor for room.
    Armed {
        fd: OwnedFd,
        own: AsyncFd<OwnedFd>,
        armed: bool,
    },
}

/// What the writer's own `epoll` instance calls its one descriptor.
const WATCHED: epoll::EventData = epoll::EventData::new_u64(1);

impl WriteDirect {
    /// Writes `fd` (non-blocking), registered with the current runtime's event loop for
    /// writability now, for its whole life. Must be called inside a tokio runtime with I/O
    /// enabled.
    pub fn registered(fd: OwnedFd) -> io::Result<Self> {
        Ok(Self {
            watch: Watch::Registered(register(fd, Interest::WRITABLE)?),
            full: false,
        })
    }

    /// Writes `fd` (non-blocking), watched for room by an `epoll` instance of the writer's
    /// own, only while the OS has none; that instance is registered with the current runtime's
    /// event loop now, for the writer's whole life (see the module docs). Must be called inside
    /// a tokio runtime with I/O enabled.
    pub fn armed_while_full(fd: OwnedFd) -> io::Result<Self> {
        let own = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        // Unarmed: only an error or a hang-up, once each (edge-triggered), reaches the runtime.
        epoll::add(&own, &fd, WATCHED, epoll::EventFlags::ET)?;
        Ok(Self {
            watch: Watch::Armed {
                fd,
                own: register(own, Interest::READABLE)?,
                armed: false,
            },
            full: false,
        })
    }

    /// The descriptor written.
    pub fn fd(&self) -> BorrowedFd<'_> {
        match &self.watch {
            Watch::Registered(fd) => fd.get_ref().as_fd(),
            Watch::Armed { fd, .. } => fd.as_fd(),
        }
    }

    /// Writes `bufs` with `write_now`: one write that fails with `EAGAIN` (`WouldBlock`)
    /// rather than wait, retried on `EINTR` by the caller's function. `Pending` (with `cx`
    /// registered for the wake-up) while the OS has no room.
    pub fn poll_write_with(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
        write_now: impl Fn(BorrowedFd<'_>, &[IoSlice<'_>]) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        if !self.full {
            match write_now(self.fd(), bufs) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => self.full = true,
                result => return Poll::Ready(result),
            }
        }
        let requested: usize = bufs.iter().map(|b| b.len()).sum();
        // A partial write means the buffer filled again: a bulk transfer is under way, so the
        // next write asks the event loop first.
        let taken_whole = |result: &io::Result<usize>| !matches!(result, Ok(n) if *n < requested);
        loop {
            match &mut self.watch {
                Watch::Registered(registered) => {
                    let mut guard = ready!(registered.poll_write_ready(cx))?;
                    let Ok(result) = guard.try_io(|fd| write_now(fd.get_ref().as_fd(), bufs))
                    else {
                        continue; // still full; readiness cleared
                    };
                    self.full = !taken_whole(&result);
                    return Poll::Ready(result);
                }
                Watch::Armed { fd, own, armed } => {
                    if *armed {
                        let mut guard = ready!(own.poll_read_ready(cx))?;
                        // Its events taken, it is readable again only once more room comes
                        // (an event left there would make the next wait go round once more).
                        drain(own.get_ref())?;
                        guard.clear_ready();
                    } else {
                        // Room that came since the write that found none is there at once: the
                        // kernel looks at the descriptor as it arms the watch. The write is
                        // tried again below before anything waits.
                        let room = epoll::EventFlags::OUT | epoll::EventFlags::ET;
                        epoll::modify(own.get_ref(), &*fd, WATCHED, room)?;
                        *armed = true;
                    }
                    let result = match write_now(fd.as_fd(), bufs) {
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                        result => result,
                    };
                    if taken_whole(&result) {
                        self.full = false;
                        // Disarmed, the peer's reads no longer reach the runtime. Should that
                        // fail, the watch stays armed: wake-ups for nothing, never a lost one.
                        let quiet = epoll::EventFlags::ET;
                        if epoll::modify(own.get_ref(), &*fd, WATCHED, quiet).is_ok() {
                            *armed = false;
                        }
                    }
                    return Poll::Ready(result);
                }
            }
        }
    }
}

/// Takes whatever events the writer's own instance holds, without waiting.
fn drain(own: &OwnedFd) -> io::Result<()> {
    let mut events = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 4];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    loop {
        match epoll::wait(own, &mut events, Some(&now)) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;
    use std::io::Read;

    use rustix::pipe::{pipe_with, PipeFlags};

    use super::*;

    fn write_now(
        writer: &mut WriteDirect,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        writer.poll_write_with(cx, &[IoSlice::new(bytes)], |fd, bufs| {
            rustix::io::writev(fd, bufs).map_err(io::Error::from)
        })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .unwrap()
    }

    /// Fills the pipe through `writer`, until a write has to wait; returns the bytes written.
    fn fill(writer: &mut WriteDirect) -> usize {
        let chunk = [7u8; 4096];
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut filled = 0;
        while let Poll::Ready(wrote) = write_now(writer, &mut cx, &chunk) {
            filled += wrote.unwrap();
        }
        filled
    }

    /// Drains `filled` bytes on another thread while `writer`'s waiting write of 4 KiB goes
    /// through once there is room.
    async fn drain_and_write(writer: &mut WriteDirect, reader: std::fs::File, filled: usize) {
        let mut reader = reader;
        let drained = std::thread::spawn(move || {
            let mut sink = vec![0u8; filled];
            reader.read_exact(&mut sink).unwrap();
            reader
        });
        let chunk = [7u8; 4096];
        let wrote = poll_fn(|cx| write_now(writer, cx, &chunk));
        let wrote = tokio::time::timeout(std::time::Duration::from_secs(10), wrote)
            .await
            .expect("the room the reader made never woke the writer")
            .unwrap();
        assert_eq!(wrote, chunk.len());
        drained.join().unwrap();
    }

    /// The writer's own instance has its descriptor armed for room.
    fn armed(writer: &WriteDirect) -> bool {
        matches!(writer.watch, Watch::Armed { armed: true, .. })
    }

    #[test]
    fn a_registered_writer_waits_for_room_then_writes_directly_again() {
        runtime().block_on(async {
            let (read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
            let mut writer = WriteDirect::registered(write).unwrap();
            let filled = fill(&mut writer);
            assert!(writer.full);
            drain_and_write(&mut writer, std::fs::File::from(read), filled).await;
            assert!(!writer.full);
        });
    }

    #[test]
    fn a_writer_armed_while_full_waits_for_room_then_disarms() {
        runtime().block_on(async {
            let (read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
            let mut writer = WriteDirect::armed_while_full(write).unwrap();
            let mut cx = Context::from_waker(std::task::Waker::noop());
            assert!(matches!(
                write_now(&mut writer, &mut cx, b"frame"),
                Poll::Ready(Ok(5))
            ));
            assert!(!armed(&writer), "armed while the pipe had room");
            let filled = fill(&mut writer) + 5;
            assert!(writer.full && armed(&writer));
            drain_and_write(&mut writer, std::fs::File::from(read), filled).await;
            assert!(!writer.full && !armed(&writer));
        });
    }

    #[test]
    fn a_writer_armed_while_full_is_woken_by_room_that_comes_while_it_waits() {
        runtime().block_on(async {
            let (read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
            let mut reader = std::fs::File::from(read);
            let mut writer = WriteDirect::armed_while_full(write).unwrap();
            for _ in 0..3 {
                // Each round: full, waiting (registered for the wake-up), then room from a
                // reader that starts only once the write waits.
                let filled = fill(&mut writer);
                let waiting = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let started = std::sync::Arc::clone(&waiting);
                let drained = std::thread::spawn(move || {
                    while !started.load(std::sync::atomic::Ordering::Acquire) {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    let mut sink = vec![0u8; filled];
                    reader.read_exact(&mut sink).unwrap();
                    reader
                });
                let chunk = [9u8; 4096];
                let wrote = poll_fn(|cx| {
                    let polled = write_now(&mut writer, cx, &chunk);
                    if polled.is_pending() {
                        waiting.store(true, std::sync::atomic::Ordering::Release);
                    }
                    polled
                });
                let wrote = tokio::time::timeout(std::time::Duration::from_secs(10), wrote)
                    .await
                    .expect("the room that came never woke the writer")
                    .unwrap();
                assert_eq!(wrote, chunk.len());
                reader = drained.join().unwrap();
                let mut sink = vec![0u8; chunk.len()];
                reader.read_exact(&mut sink).unwrap();
            }
        });
    }
}
