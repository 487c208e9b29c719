//! A writer registers with the runtime's event loop only as it is made: waiting for room, and
//! having it again, adds no registration and removes none (`WriteDirect`). A process forked
//! from the host shares that event loop, and a registration made in it would point into its
//! own memory (SECURITY.md, "A forked child's write that waits for room leaves its parent's
//! runtime whole").
//!
//! Its own test binary, with one test: the registrations of every `epoll` instance in the
//! process are compared, and another test's runtime would change them.

use std::collections::BTreeSet;
use std::future::poll_fn;
use std::io::{IoSlice, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::task::{Context, Poll};
use std::time::Duration;

use airlock_transport_pipe::WriteDirect;
use rustix::pipe::{pipe_with, PipeFlags};

/// Every registration of every `epoll` instance of this process: (the instance's descriptor,
/// the descriptor it watches), from `/proc/self/fdinfo`.
fn registrations() -> BTreeSet<(i32, i32)> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir("/proc/self/fdinfo").unwrap() {
        let entry = entry.unwrap();
        let Ok(instance) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let info = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in info.lines().filter(|line| line.starts_with("tfd:")) {
            let watched = line.split_whitespace().nth(1).unwrap().parse().unwrap();
            found.insert((instance, watched));
        }
    }
    found
}

fn write_now(writer: &mut WriteDirect, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<usize> {
    writer
        .poll_write_with(cx, &[IoSlice::new(bytes)], |fd, bufs| {
            rustix::io::writev(fd, bufs).map_err(std::io::Error::from)
        })
        .map(|wrote| wrote.unwrap())
}

/// Fills the pipe until a write has to wait, lets a reader drain it, and waits for the write
/// to go through: twice.
async fn wait_for_room_twice(writer: &mut WriteDirect, read: OwnedFd) {
    // The reader waits for the writer's last chunk: its end blocks.
    rustix::io::ioctl_fionbio(&read, false).unwrap();
    let mut reader = std::fs::File::from(read);
    for _ in 0..2 {
        let chunk = [7u8; 4096];
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut filled = 0;
        while let Poll::Ready(wrote) = write_now(writer, &mut cx, &chunk) {
            filled += wrote;
        }
        let drained = std::thread::spawn(move || {
            let mut sink = vec![0u8; filled + chunk.len()];
            reader.read_exact(&mut sink).unwrap();
            reader
        });
        let wrote = poll_fn(|cx| write_now(writer, cx, &chunk));
        let wrote = tokio::time::timeout(Duration::from_secs(10), wrote)
            .await
            .expect("the room the reader made never woke the writer");
        assert_eq!(wrote, chunk.len());
        reader = drained.join().unwrap();
    }
}

/// Makes a writer of a fresh pipe's write end with `make`, has it wait for room twice, and
/// checks that the process's registrations are then what they were once it was made; returns
/// those registrations and the write end's number.
async fn waits_for_room(
    make: fn(OwnedFd) -> std::io::Result<WriteDirect>,
) -> (BTreeSet<(i32, i32)>, i32) {
    let (read, write) = pipe_with(PipeFlags::NONBLOCK).unwrap();
    let write_fd = write.as_raw_fd();
    let mut writer = make(write).unwrap();
    let made = registrations();
    wait_for_room_twice(&mut writer, read).await;
    assert_eq!(registrations(), made, "the writer's registrations changed");
    (made, write_fd)
}

#[test]
fn a_writer_waiting_for_room_registers_nothing_it_did_not_as_it_was_made() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // A pipe's write end, registered itself.
        let (made, write_fd) = waits_for_room(WriteDirect::registered).await;
        assert!(
            made.iter().any(|&(_, watched)| watched == write_fd),
            "the write end is not registered, or this test cannot see registrations: {made:?}"
        );

        // A descriptor watched through an instance of the writer's own, armed while full.
        let (made, write_fd) = waits_for_room(WriteDirect::armed_while_full).await;
        let own = made
            .iter()
            .find(|&&(_, watched)| watched == write_fd)
            .map(|&(instance, _)| instance)
            .expect("the writer's own instance does not watch its descriptor");
        assert!(
            made.iter().any(|&(_, watched)| watched == own),
            "the runtime does not watch the writer's own instance: {made:?}"
        );
    });
}
