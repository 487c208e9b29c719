//! The serving loop's polling under load, seen from its receiver: how often the loop polls it
//! while nothing comes, after one call alone and after calls that came together.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use airlock_protocol::frame::{encode_frame, Call, Frame, Shutdown, Welcome};
use airlock_protocol::transport::{FrameReceiver, Transport};
use airlock_protocol::{decode_frame, CallId, FrameDecoder, TransportError};
use airlock_transport_pipe::{StreamConfig, StreamTransport};
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::serve_on;
use crate::builtin::builtin_worker;

/// A transport whose receiver counts the loop's polls.
struct Counting<T> {
    inner: T,
    polls: Arc<AtomicUsize>,
}

struct CountingReceiver<R> {
    inner: R,
    polls: Arc<AtomicUsize>,
}

impl<T: Transport> Transport for Counting<T> {
    type Sender = T::Sender;
    type Receiver = CountingReceiver<T::Receiver>;

    fn split(self) -> (Self::Sender, Self::Receiver) {
        let (sender, inner) = self.inner.split();
        let polls = self.polls;
        (sender, CountingReceiver { inner, polls })
    }
}

impl<R: FrameReceiver> FrameReceiver for CountingReceiver<R> {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, TransportError>> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.poll_recv(cx)
    }

    fn recv_buffered(&mut self) -> Option<Result<Option<Bytes>, TransportError>> {
        self.inner.recv_buffered()
    }

    fn set_max_frame(&mut self, max_frame: u32) {
        self.inner.set_max_frame(max_frame);
    }
}

/// The host's ends of a worker served with polling window `load_poll`, and the receiver's
/// poll count.
struct Served {
    to_worker: DuplexStream,
    from_worker: DuplexStream,
    decoder: FrameDecoder,
    polls: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<Result<(), crate::ServeError>>,
    /// Calls made so far: each call's id is fresh, as the worker's session requires.
    calls: u8,
}

impl Served {
    /// A worker served with polling window `load_poll` and, if `spin`, the low-latency mode
    /// with that window.
    async fn start(load_poll: Option<Duration>, spin: Option<Duration>) -> Self {
        let (to_worker, worker_r) = tokio::io::duplex(1 << 16);
        let (worker_w, from_worker) = tokio::io::duplex(1 << 16);
        let polls = Arc::new(AtomicUsize::new(0));
        let transport = Counting {
            inner: StreamTransport::new(worker_r, worker_w, StreamConfig::default()),
            polls: Arc::clone(&polls),
        };
        let mut spec = builtin_worker().into_spec(None).unwrap();
        spec.load_poll = load_poll;
        spec.spin = spin;
        let task = tokio::spawn(serve_on(spec, transport));
        let mut served = Self {
            to_worker,
            from_worker,
            decoder: FrameDecoder::new(1 << 20),
            polls,
            task,
            calls: 0,
        };
        assert!(matches!(served.frames(1).await[0], FrameKind::Hello));
        let welcome = encode_frame(&Frame::Welcome(Welcome {
            max_frame: 1 << 20,
            max_in_flight: 64,
            max_progress_per_call: 16,
        }));
        served.to_worker.write_all(&welcome).await.unwrap();
        // The loop runs as soon as this task waits, and takes the Welcome alone: had a call
        // been written behind it first, the two would have come together.
        tokio::time::sleep(Duration::from_millis(10)).await;
        served
    }

    /// Sends `n` echo calls in one write and waits for their answers.
    async fn calls_together(&mut self, n: u8) {
        let body = airlock_codec::to_vec(&serde_bytes::ByteBuf::from(vec![7u8; 8])).unwrap();
        self.send_together("echo", &body, n).await;
        self.answers(n).await;
    }

    /// Batches of four echo calls, one after another's answers: enough for the windows to
    /// open (`load_poll::STREAK`).
    async fn batches_back_to_back(&mut self) {
        for _ in 0..3 {
            self.calls_together(4).await;
        }
    }

    /// Sends `n` calls of `method` with `body` in one write.
    async fn send_together(&mut self, method: &str, body: &[u8], n: u8) {
        let mut bytes = Vec::new();
        for _ in 0..n {
            self.calls += 1;
            bytes.extend(encode_frame(&Frame::Call(Call {
                id: CallId::from_bytes([self.calls; 16]),
                method,
                body,
            })));
        }
        self.to_worker.write_all(&bytes).await.unwrap();
    }

    /// Waits for `n` answers, each a `Return`.
    async fn answers(&mut self, n: u8) {
        let answers = self.frames(usize::from(n)).await;
        assert!(answers.iter().all(|f| matches!(f, FrameKind::Return)));
    }

    /// How often the loop polls its receiver in the next 30 ms, with nothing coming.
    async fn polls_while_idle(&self) -> usize {
        self.polls.store(0, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(30)).await;
        self.polls.load(Ordering::Relaxed)
    }

    async fn frames(&mut self, n: usize) -> Vec<FrameKind> {
        let mut kinds = Vec::new();
        let mut chunk = vec![0u8; 1 << 16];
        let read = async {
            while kinds.len() < n {
                while let Some(frame) = self.decoder.next_frame().unwrap() {
                    kinds.push(match decode_frame(&frame).unwrap() {
                        Frame::Hello(_) => FrameKind::Hello,
                        Frame::Return(_) => FrameKind::Return,
                        _ => FrameKind::Other,
                    });
                }
                if kinds.len() < n {
                    let got = self.from_worker.read(&mut chunk).await.unwrap();
                    assert_ne!(got, 0, "the worker closed its side");
                    self.decoder.extend(&chunk[..got]);
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("the worker did not answer");
        kinds
    }

    async fn shut_down(mut self) {
        let shutdown = encode_frame(&Frame::Shutdown(Shutdown));
        self.to_worker.write_all(&shutdown).await.unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    }
}

#[derive(Debug)]
enum FrameKind {
    Hello,
    Return,
    Other,
}

/// Longer than the 30 ms looked at, so a window that opens is open throughout.
const WINDOW: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "current_thread")]
async fn calls_that_came_together_keep_the_loop_polling_through_the_load_window() {
    let mut served = Served::start(Some(WINDOW), None).await;
    served.batches_back_to_back().await;
    let polls = served.polls_while_idle().await;
    assert!(polls > 100, "{polls} polls in 30 ms of the window");
    served.shut_down().await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_call_alone_never_opens_the_load_window() {
    let mut served = Served::start(Some(WINDOW), None).await;
    for _ in 0..4 {
        served.calls_together(1).await;
        let polls = served.polls_while_idle().await;
        assert!(polls < 10, "{polls} polls in 30 ms after a call alone");
    }
    served.shut_down().await;
}

#[tokio::test(flavor = "current_thread")]
async fn without_a_load_window_calls_that_came_together_leave_the_loop_asleep() {
    let mut served = Served::start(None, None).await;
    served.batches_back_to_back().await;
    let polls = served.polls_while_idle().await;
    assert!(polls < 10, "{polls} polls in 30 ms with no window");
    served.shut_down().await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_window_opens_once_a_batch_is_answered_not_while_its_handlers_run() {
    let mut served = Served::start(Some(WINDOW), None).await;
    served.calls_together(4).await;
    served.calls_together(4).await;
    // The third batch, which would open the window: two calls that take 60 ms each.
    let millis = airlock_codec::to_vec(&60u64).unwrap();
    served.send_together("sleep", &millis, 2).await;
    let polls = served.polls_while_idle().await;
    assert!(polls < 10, "{polls} polls in 30 ms while the handlers ran");
    served.answers(2).await;
    let polls = served.polls_while_idle().await;
    assert!(
        polls > 100,
        "{polls} polls in 30 ms of the window, once answered"
    );
    served.shut_down().await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_low_latency_mode_replaces_polling_under_load() {
    // Its own windows (here too short to see) open after every frame; the load window,
    // however long, is not used beside them.
    let mut served = Served::start(Some(WINDOW), Some(Duration::from_micros(1))).await;
    served.batches_back_to_back().await;
    let polls = served.polls_while_idle().await;
    assert!(polls < 10, "{polls} polls in 30 ms");
    served.shut_down().await;
}
