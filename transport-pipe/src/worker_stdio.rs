//! The worker's end of the pipe transport: the protocol channel moved off fds 0 and 1.
//!
//! A handler that prints (`println!`, a C library's `printf`) writes to fd 1; one that reads
//! stdin reads fd 0. If either were the channel, a handler could corrupt or steal frames. So at
//! start-up the worker duplicates both channel ends to private close-on-exec descriptors, points
//! fd 1 at stderr and fd 0 at `/dev/null`, and speaks the protocol only on the private copies.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;

use rustix::io::fcntl_dupfd_cloexec;

use crate::{PipeReader, PipeWriter, StreamConfig, StreamTransport};

/// The lowest descriptor number the private channel copies may take (0–2 are the stdio).
const FIRST_PRIVATE_FD: i32 = 3;

/// The pipe transport a worker speaks on, taken over from its stdin and stdout.
pub type WorkerPipe = StreamTransport<PipeReader, PipeWriter>;

/// Takes the protocol channel over from stdin/stdout and relocates the stdio descriptors (see
/// the module docs). Call once, early, before any handler runs and before anything else could
/// write to stdout. Must run inside a tokio runtime with I/O enabled. Fails if stdin/stdout
/// are not pipes.
pub fn take_worker_stdio(config: StreamConfig) -> io::Result<WorkerPipe> {
    let stdin = io::stdin();
    let stdout = io::stdout();
    let channel_in = fcntl_dupfd_cloexec(stdin.as_fd(), FIRST_PRIVATE_FD)?;
    let channel_out = fcntl_dupfd_cloexec(stdout.as_fd(), FIRST_PRIVATE_FD)?;
    // From here on, fd 1 is stderr and fd 0 is empty: stray output lands in the host's log,
    // stray reads see end of file.
    rustix::stdio::dup2_stdout(io::stderr().as_fd())?;
    let null = File::open("/dev/null")?;
    rustix::stdio::dup2_stdin(null.as_fd())?;
    let receiver = PipeReader::new(channel_in)?;
    let sender = PipeWriter::new(channel_out)?;
    Ok(StreamTransport::new(receiver, sender, config))
}
