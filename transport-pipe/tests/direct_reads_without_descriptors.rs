//! `StreamTransport::with_direct_reads` in a process with no descriptor left for the duplicate
//! it needs: it does not fail, the receiver says it cannot read now and never does, and it
//! reads through the runtime as before. One test in a process of its own, as it fills the
//! process's descriptor table.

use std::fs::File;
use std::io::Write;

use airlock_protocol::transport::{FrameReceiver, Transport};
use airlock_transport_pipe::{StreamConfig, StreamTransport};
use tokio::net::unix::pipe;

/// Most descriptors this test opens to fill the table; a higher soft limit is lowered to this
/// first (`prlimit`), so the test stays quick where the limit is large.
const MOST: u64 = 65_536;

fn soft_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap_or(u64::MAX)
}

/// Opens `/dev/null` until the process may open no more, and returns what it opened.
fn fill_the_descriptor_table() -> Vec<File> {
    if soft_limit() > MOST {
        let lowered = std::process::Command::new("prlimit")
            .arg(format!("--pid={}", std::process::id()))
            .arg(format!("--nofile={MOST}:"))
            .status()
            .unwrap();
        assert!(lowered.success(), "the soft limit could not be lowered");
    }
    let mut held = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(file) => held.push(file),
            Err(err) if err.raw_os_error() == Some(libc::EMFILE) => return held,
            Err(err) => panic!("opening /dev/null: {err}"),
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn without_a_free_descriptor_a_receiver_reads_only_through_the_runtime() {
    let (write, read) = pipe::pipe().unwrap();
    let transport = StreamTransport::new(read, tokio::io::sink(), StreamConfig::default());
    let table = fill_the_descriptor_table();
    assert!(
        File::open("/dev/null").is_err(),
        "the table is full: a duplicate cannot be made"
    );
    let mut receiver = transport.with_direct_reads().split().1;
    drop(table);
    assert!(!receiver.reads_now(), "it says it cannot read now");
    let mut writer = File::from(write.into_blocking_fd().unwrap());
    let frame = b"through the runtime";
    let mut bytes = u32::try_from(frame.len()).unwrap().to_le_bytes().to_vec();
    bytes.extend_from_slice(frame);
    writer.write_all(&bytes).unwrap();
    assert!(!receiver.read_now(), "it never reads now");
    let got = receiver.recv().await.unwrap().unwrap();
    assert_eq!(got.as_ref(), frame);
}
