//! `StreamSender::poll_send` and `StreamReceiver::poll_recv` against scripted peers:
//! partial writes, Pending between them, empty heads and bodies, more than 64 pieces, a slow
//! drip that must not reset the deadline, and reads split at every byte / EOF at every byte.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use airlock_protocol::transport::{FrameReceiver, FrameSender, Outgoing, Transport};
use airlock_protocol::{FrameError, Transmit, TransportError};
use airlock_transport_pipe::{StreamConfig, StreamTransport};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// A writer that takes a random number of bytes (across slices) or is Pending (and wakes at
/// once), as its script says.
struct Scripted {
    out: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    rng: Lcg,
    /// Largest write it takes.
    max: u64,
    /// Writes it has taken; a drip writer's Pending waits are real (a timer wakes it).
    drip: Option<Duration>,
    pending_now: bool,
}

impl AsyncWrite for Scripted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if let Some(every) = this.drip {
            // One byte, then Pending until a timer wakes it: progress forever, never done.
            if this.pending_now {
                this.pending_now = false;
                let waker = cx.waker().clone();
                std::thread::spawn(move || {
                    std::thread::sleep(every);
                    waker.wake();
                });
                return Poll::Pending;
            }
            this.pending_now = true;
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .expect("a non-empty slice");
            this.out.lock().unwrap().push(first[0]);
            return Poll::Ready(Ok(1));
        }
        if this.rng.below(3) == 0 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        assert!(total > 0, "an empty vectored write");
        let take = 1 + this.rng.below(this.max.min(total as u64)) as usize;
        let mut left = take;
        for b in bufs {
            let n = left.min(b.len());
            this.out.lock().unwrap().extend_from_slice(&b[..n]);
            left -= n;
            if left == 0 {
                break;
            }
        }
        Poll::Ready(Ok(take))
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

struct NoRead;
impl AsyncRead for NoRead {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Pending
    }
}

/// `frames` frames of random shapes, bodies up to `largest` bytes.
fn batch(rng: &mut Lcg, frames: usize, largest: u64) -> Vec<Transmit> {
    (0..frames)
        .map(|i| {
            let head_len = rng.below(4) as usize * rng.below(5) as usize;
            let body_len = match rng.below(4) {
                0 => 0,
                1 => rng.below(3) as usize,
                2 => rng.below(100) as usize,
                _ => rng.below(largest) as usize,
            };
            let tag = (i % 251) as u8;
            Transmit {
                head: Bytes::from((0..head_len).map(|j| tag ^ (j as u8)).collect::<Vec<_>>()),
                body: Bytes::from(
                    (0..body_len)
                        .map(|j| tag.wrapping_add(j as u8))
                        .collect::<Vec<_>>(),
                ),
            }
        })
        .collect()
}

fn scripted(
    seed: u64,
    max: u64,
    drip: Option<Duration>,
) -> (Scripted, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = Scripted {
        out: out.clone(),
        rng: Lcg(seed ^ 0xdead),
        max,
        drip,
        pending_now: false,
    };
    (writer, out)
}

#[tokio::test]
async fn partial_writes_and_pending_never_duplicate_skip_or_reorder() {
    for seed in 0..240u64 {
        let mut rng = Lcg(seed);
        let max = [1, 3, 7, 100, 10_000, 1 << 20][seed as usize % 6];
        // Writers of a few bytes at a time get small bodies, to keep the test quick.
        let (frames, largest) = if max < 100 { (40, 500) } else { (200, 5000) };
        let frames = 1 + rng.below(frames) as usize;
        let first = batch(&mut rng, frames, largest);
        let n2 = 1 + rng.below(80) as usize;
        let second = batch(&mut rng, n2, largest);
        let mut expected: Vec<u8> = first.iter().flat_map(|t| t.to_vec()).collect();
        expected.extend(second.iter().flat_map(|t| t.to_vec()));
        let (writer, out) = scripted(seed, max, None);
        let (sender, _) = StreamTransport::new(NoRead, writer, StreamConfig::default()).split();
        let mut outgoing = Outgoing::new(Box::new(sender));
        for b in [first, second] {
            if outgoing.start(b).await.is_none() {
                outgoing.finish().await.expect("written");
            }
        }
        assert_eq!(*out.lock().unwrap(), expected, "seed {seed} max {max}");
    }
}

#[tokio::test]
async fn a_drip_that_always_progresses_still_meets_the_send_deadline() {
    let mut rng = Lcg(1);
    let big = batch(&mut rng, 300, 5000);
    let (writer, out) = scripted(0, 0, Some(Duration::from_millis(1)));
    let config = StreamConfig {
        send_timeout: Duration::from_millis(200),
        ..StreamConfig::default()
    };
    let (mut sender, _) = StreamTransport::new(NoRead, writer, config).split();
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(5), sender.send(&big)).await;
    let took = started.elapsed();
    assert!(
        matches!(result, Ok(Err(TransportError::SendTimeout))),
        "{result:?} after {took:?}, {} bytes dripped",
        out.lock().unwrap().len()
    );
    assert!(took < Duration::from_millis(1000), "{took:?}");
}

/// A reader that hands out `data` in the given chunk sizes, then EOF.
struct Chunks {
    data: Vec<u8>,
    at: usize,
    rng: Lcg,
    max: u64,
}

impl AsyncRead for Chunks {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.rng.below(3) == 0 {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let left = this.data.len() - this.at;
        let n = (1 + this.rng.below(this.max) as usize)
            .min(left)
            .min(buf.remaining());
        buf.put_slice(&this.data[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}

fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
    payloads
        .iter()
        .flat_map(|p| {
            (p.len() as u32)
                .to_le_bytes()
                .into_iter()
                .chain(p.iter().copied())
        })
        .collect()
}

#[tokio::test]
async fn reads_split_anywhere_and_eof_anywhere() {
    let mut rng = Lcg(7);
    let payloads: Vec<Vec<u8>> = (0..12)
        .map(|i| {
            let len =
                [1, 2, 3, 100, 65_535, 65_536, 65_537, 200_000, 1_000_000][rng.below(9) as usize];
            (0..len).map(|j| (i * 31 + j) as u8).collect()
        })
        .collect();
    let wire = framed(&payloads);
    for (seed, max) in [(1u64, 1u64), (2, 7), (3, 4096), (4, 70_000), (5, 1 << 21)] {
        let reader = Chunks {
            data: wire.clone(),
            at: 0,
            rng: Lcg(seed),
            max,
        };
        let (_, mut receiver) =
            StreamTransport::new(reader, tokio::io::sink(), StreamConfig::default()).split();
        for (i, p) in payloads.iter().enumerate() {
            let got = receiver.recv().await.expect("a frame").expect("not EOF");
            assert_eq!(&got[..], &p[..], "frame {i} max {max}");
        }
        assert!(matches!(receiver.recv().await, Ok(None)));
    }
    // EOF at every byte of a small stream (and around the large frame's boundaries).
    let small = framed(&[vec![1, 2, 3], vec![9; 70_000], vec![4]]);
    let boundaries = [0, 7, 7 + 70_004, small.len()];
    let cuts: Vec<usize> = (0..small.len())
        .filter(|c| {
            *c < 200
                || c % 997 == 0
                || (small.len() - c) < 50
                || boundaries.iter().any(|b| b.abs_diff(*c) < 70)
        })
        .collect();
    for cut in cuts {
        let reader = Chunks {
            data: small[..cut].to_vec(),
            at: 0,
            rng: Lcg(cut as u64),
            max: 5000,
        };
        let (_, mut receiver) =
            StreamTransport::new(reader, tokio::io::sink(), StreamConfig::default()).split();
        let mut frames = 0;
        let end = loop {
            match receiver.recv().await {
                Ok(Some(_)) => frames += 1,
                other => break other,
            }
        };
        if boundaries.contains(&cut) {
            assert!(matches!(end, Ok(None)), "cut {cut}: {end:?}");
        } else {
            assert!(
                matches!(
                    end,
                    Err(TransportError::Frame(FrameError::Truncated { .. }))
                ),
                "cut {cut}: {end:?} after {frames} frames"
            );
        }
    }
}
