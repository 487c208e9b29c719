//! What the connection's unit tests share: a frame sender that takes every batch at once and
//! records each write, a host session past its handshake with its worker's session, a frame
//! receiver whose frames are all ready at once, and calls begun on such a connection.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use airlock_protocol::transport::{FrameReceiver, FrameSender, Outgoing, SendProgress};
use airlock_protocol::{
    CallId, FrameDecoder, HostConfig, HostSession, Transmit, TransportError, WorkerConfig,
    WorkerEvent, WorkerSession,
};
use bytes::Bytes;
use tokio::sync::oneshot;

use super::inlet::Inlet;
use super::reader::{read_frames, take_turn, Received, Turned, ITEMS_IN_TURN};
use super::wire::now_or_never;
use super::wire::Wire;
use super::{Core, Live, Party, ReaderTurn};
use crate::host::decode_response;
use crate::reply::{pair, Decoded, Reply};
use crate::response::ResponseDecoding;
use crate::supervisor::CallRequest;
use crate::updates::{Cost, UpdateBudget, Updates};

/// The frames of every write so far (each whole, as the worker would read it), one list per
/// write.
pub(super) type Writes = Arc<Mutex<Vec<Vec<Bytes>>>>;

struct Recorder(Writes);

#[async_trait::async_trait]
impl FrameSender for Recorder {
    fn poll_send(
        &mut self,
        _: &mut Context<'_>,
        batch: &[Transmit],
        _: &mut SendProgress,
    ) -> Poll<Result<(), TransportError>> {
        let frames = batch.iter().map(|t| Bytes::from(t.to_vec())).collect();
        self.0.lock().unwrap().push(frames);
        Poll::Ready(Ok(()))
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}

/// A wire (callers may write directly) whose writes are recorded into the returned list.
/// Must be made inside a runtime, as every `Wire`.
pub(super) fn recording_wire() -> (Arc<Wire>, Writes) {
    let writes = Writes::default();
    let outgoing = Outgoing::new(Box::new(Recorder(Arc::clone(&writes))));
    (Arc::new(Wire::new(outgoing, true)), writes)
}

/// A host session past its handshake with a worker serving `echo`, and that worker's session.
pub(super) fn ready_sessions() -> (HostSession, WorkerSession) {
    let mut host = HostSession::new(HostConfig::default(), Instant::now());
    let mut config = WorkerConfig::new("test-worker", "1.0.0");
    config.methods = vec!["echo".into()];
    let mut worker = WorkerSession::new(&config);
    loop {
        let mut moved = false;
        while let Some(t) = worker.poll_transmit() {
            host.handle_bytes(&t.to_vec());
            moved = true;
        }
        while let Some(t) = host.poll_transmit() {
            worker.handle_bytes(&t.to_vec());
            moved = true;
        }
        if !moved {
            break;
        }
    }
    assert!(host.is_ready());
    while host.poll_event().is_some() {}
    while worker.poll_event().is_some() {}
    (host, worker)
}

/// A receiver whose frames are all ready at once, as when the worker wrote them in one
/// write; after them it waits for ever.
/// It counts the frames `poll_recv` gave (those a read brought, in a real receiver).
pub(super) struct AllReady(pub(super) VecDeque<Bytes>, pub(super) Arc<AtomicUsize>);

#[async_trait::async_trait]
impl FrameReceiver for AllReady {
    fn poll_recv(&mut self, _: &mut Context<'_>) -> Poll<Received> {
        match self.recv_buffered() {
            Some(item) => {
                self.1.fetch_add(1, Ordering::SeqCst);
                Poll::Ready(item)
            }
            None => Poll::Pending,
        }
    }

    fn recv_buffered(&mut self) -> Option<Received> {
        self.0.pop_front().map(|frame| Ok(Some(frame)))
    }
}

/// A connected worker's session and the host's calls on it, each answered with a `T`.
pub(super) struct Calls<T: Send + 'static> {
    pub(super) live: Arc<Live>,
    pub(super) worker: WorkerSession,
    pub(super) ids: Vec<CallId>,
    pub(super) answers: Vec<Reply<T>>,
    /// Frames the reader's receiver gave through `poll_recv`.
    pub(super) reads: Arc<AtomicUsize>,
}

impl<T: serde::de::DeserializeOwned + Send + 'static> Calls<T> {
    /// Begins one `echo` call for each entry of `updates` (a streaming call's channel, or
    /// none), due in a minute, and lets the worker's session take them. Inside a runtime.
    pub(super) fn begin(updates: Vec<Option<Updates>>) -> Self {
        let due = Instant::now() + Duration::from_secs(60);
        Self::begin_each(updates.into_iter().map(|updates| (updates, due)).collect())
    }

    /// [`begin`](Self::begin) with a deadline per call, none streaming.
    pub(super) fn begin_due(deadlines: Vec<Instant>) -> Self {
        Self::begin_each(deadlines.into_iter().map(|due| (None, due)).collect())
    }

    /// [`begin`](Self::begin) in the low-latency mode with window `window`.
    pub(super) fn begin_spinning(updates: Vec<Option<Updates>>, window: Duration) -> Self {
        let due = Instant::now() + Duration::from_secs(60);
        let calls = updates.into_iter().map(|updates| (updates, due)).collect();
        Self::begin_with(calls, Some(window))
    }

    fn begin_each(calls: Vec<(Option<Updates>, Instant)>) -> Self {
        Self::begin_with(calls, None)
    }

    fn begin_with(calls: Vec<(Option<Updates>, Instant)>, spin: Option<Duration>) -> Self {
        let (wire, writes) = recording_wire();
        let live = Arc::new(Live::new(spin));
        let (host, mut worker) = ready_sessions();
        let mut core = Core::new(1, host, wire);
        core.accepting = true;
        *live.lock() = Some(core);
        let mut answers = Vec::new();
        for (key, (updates, deadline)) in (0..).zip(calls) {
            let (answer, reply) = pair(decode_response::<T>);
            let call = CallRequest {
                key,
                method: "echo".into(),
                body: Bytes::from_static(&[0]).into(),
                deadline,
                reply,
                updates,
            };
            assert!(live.try_begin(call, Party::Caller).is_ok());
            answers.push(answer);
        }
        for frame in writes.lock().unwrap().concat() {
            worker.handle_bytes(&frame);
        }
        let ids: Vec<_> = std::iter::from_fn(|| worker.poll_event())
            .filter_map(|event| match event {
                WorkerEvent::Call { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        assert_eq!(
            ids.len(),
            answers.len(),
            "the worker did not see every call"
        );
        Self {
            live,
            worker,
            ids,
            answers,
            reads: Arc::default(),
        }
    }

    /// The frames the worker has written since, as the host's receiver gives them.
    pub(super) fn written(&mut self) -> VecDeque<Bytes> {
        let mut decoder = FrameDecoder::new(u32::MAX);
        while let Some(transmit) = self.worker.poll_transmit() {
            decoder.extend(&transmit.to_vec());
        }
        std::iter::from_fn(|| decoder.next_frame().unwrap()).collect()
    }

    /// The worker answers its calls in order, one `Return` with each of `bodies`.
    pub(super) fn answer(&mut self, bodies: Vec<Bytes>) {
        for (id, body) in self.ids.clone().into_iter().zip(bodies) {
            self.worker.reply_return(id, body).unwrap();
        }
    }

    /// One turn of the reader under the lock over `taken`, within the in-turn budgets.
    pub(super) fn turn(
        &self,
        taken: &mut VecDeque<Received>,
        decoded: &mut Vec<Decoded>,
    ) -> Turned {
        let in_turn = ResponseDecoding::for_tests().with_items_at_most(ITEMS_IN_TURN);
        let mut guard = self.live.lock();
        take_turn(guard.as_mut().unwrap(), taken, &in_turn, decoded)
    }

    /// Finishes a turn as the reader does, outside the lock. True if the worker lied.
    pub(super) fn finish(&self, turned: Turned, decoded: &mut Vec<Decoded>) -> bool {
        let limits = ResponseDecoding::for_tests();
        let turn = ReaderTurn {
            limits: &limits,
            generation: 1,
            decoded,
            at: turned.at,
        };
        turned.settled.finish(&self.live, Party::Reader, Some(turn))
    }

    /// The reader of `frames`, all ready at once, as if written in one write.
    pub(super) fn reader(
        &self,
        frames: VecDeque<Bytes>,
        budget: Arc<UpdateBudget>,
    ) -> impl std::future::Future<Output = ()> {
        let receiver = Box::new(AllReady(frames, Arc::clone(&self.reads)));
        self.reader_over(receiver, budget).1
    }

    /// The reader of `receiver`, and the inlet it shares with callers; the frame cap stays as
    /// it is (its sender is dropped, which the reader takes as raised).
    pub(super) fn reader_over(
        &self,
        receiver: Box<dyn FrameReceiver>,
        budget: Arc<UpdateBudget>,
    ) -> (Arc<Inlet>, impl std::future::Future<Output = ()>) {
        let (raise_sender, raise) = oneshot::channel();
        drop(raise_sender);
        let inlet = Arc::new(Inlet::new(receiver, 1, ResponseDecoding::for_tests()));
        let reader = read_frames(Arc::clone(&inlet), Arc::clone(&self.live), raise, budget);
        (inlet, reader)
    }
}

/// What is in a [`Piped`] receiver's pipe, and how it was read.
#[derive(Default)]
pub(super) struct Pipe {
    /// Frames written and not yet read.
    pub(super) frames: VecDeque<Bytes>,
    /// Reads through the runtime (`poll_recv`) that found frames.
    pub(super) runtime_reads: usize,
    /// Reads without it (`read_now`), whether they found frames or not.
    pub(super) direct_reads: usize,
}

/// A receiver over a pipe the test writes frames into, readable through the runtime and
/// without it. Writing to the pipe wakes nobody: as when a caller's look takes the frames
/// before the runtime sees them (the test polls the reader itself).
pub(super) struct Piped {
    pub(super) pipe: Arc<Mutex<Pipe>>,
    held: VecDeque<Bytes>,
}

impl Piped {
    pub(super) fn new() -> (Box<Self>, Arc<Mutex<Pipe>>) {
        let pipe = Arc::<Mutex<Pipe>>::default();
        let receiver = Box::new(Self {
            pipe: Arc::clone(&pipe),
            held: VecDeque::new(),
        });
        (receiver, pipe)
    }

    /// Reads whatever is in the pipe into the receiver; false if there was nothing.
    fn read(&mut self, pipe: &mut Pipe) -> bool {
        let came = !pipe.frames.is_empty();
        self.held.append(&mut pipe.frames);
        came
    }
}

#[async_trait::async_trait]
impl FrameReceiver for Piped {
    fn poll_recv(&mut self, _: &mut Context<'_>) -> Poll<Received> {
        if self.held.is_empty() {
            let pipe = Arc::clone(&self.pipe);
            let mut pipe = pipe.lock().unwrap();
            if !self.read(&mut pipe) {
                return Poll::Pending;
            }
            pipe.runtime_reads += 1;
        }
        Poll::Ready(Ok(self.held.pop_front()))
    }

    fn recv_buffered(&mut self) -> Option<Received> {
        self.held.pop_front().map(|frame| Ok(Some(frame)))
    }

    fn read_now(&mut self) -> bool {
        let pipe = Arc::clone(&self.pipe);
        let mut pipe = pipe.lock().unwrap();
        pipe.direct_reads += 1;
        self.read(&mut pipe) || !self.held.is_empty()
    }

    fn reads_now(&self) -> bool {
        true
    }
}

/// A sender that hands every frame written to `worker` at once, as a worker sharing the
/// caller's CPU does when the write wakes it: the worker answers each `echo` call it finds
/// with the call's body, into `pipe`, before the write returns.
struct Answering {
    worker: Arc<Mutex<WorkerSession>>,
    pipe: Arc<Mutex<Pipe>>,
}

#[async_trait::async_trait]
impl FrameSender for Answering {
    fn poll_send(
        &mut self,
        _: &mut Context<'_>,
        batch: &[Transmit],
        _: &mut SendProgress,
    ) -> Poll<Result<(), TransportError>> {
        let mut worker = self.worker.lock().unwrap();
        for transmit in batch {
            worker.handle_bytes(&transmit.to_vec());
        }
        while let Some(event) = worker.poll_event() {
            if let WorkerEvent::Call { id, body, .. } = event {
                worker.reply_return(id, body).unwrap();
            }
        }
        let mut decoder = FrameDecoder::new(u32::MAX);
        while let Some(transmit) = worker.poll_transmit() {
            decoder.extend(&transmit.to_vec());
        }
        let mut pipe = self.pipe.lock().unwrap();
        pipe.frames
            .extend(std::iter::from_fn(|| decoder.next_frame().unwrap()));
        Poll::Ready(Ok(()))
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}

/// A connected worker that answers every call as it is written, into a [`Piped`] receiver's
/// pipe ([`Answering`]), and the host's side of it: the connection state, the writer task, and
/// the inlet's reader, started and polled once (so it waits, open to callers' looks). `direct`: whether
/// callers may write their own frames (a worker whose confinement is verified), and so look.
/// Inside a runtime.
pub(super) struct AnsweringWorker {
    pub(super) live: Arc<Live>,
    pub(super) pipe: Arc<Mutex<Pipe>>,
    pub(super) reader: Started,
    /// The switch that would raise the frame cap, held unused.
    _unraised: Option<oneshot::Sender<u32>>,
}

impl AnsweringWorker {
    pub(super) fn new(direct: bool) -> Self {
        Self::with(direct, None, true)
    }

    /// As [`new`](Self::new), in the low-latency mode with window `spin` if given. If not
    /// `raised`, the reader is never told the frame cap the handshake raises.
    pub(super) fn with(direct: bool, spin: Option<Duration>, raised: bool) -> Self {
        let live = Arc::new(Live::new(spin));
        let (host, worker) = ready_sessions();
        let (receiver, pipe) = Piped::new();
        let worker = Arc::new(Mutex::new(worker));
        let answering = Answering {
            worker,
            pipe: Arc::clone(&pipe),
        };
        let wire = Arc::new(Wire::new(Outgoing::new(Box::new(answering)), direct));
        tokio::spawn(super::drive_writes(Arc::clone(&wire), Arc::clone(&live)));
        let inlet = Arc::new(Inlet::new(receiver, 1, ResponseDecoding::for_tests()));
        let mut core = Core::new(1, host, wire);
        core.accepting = true;
        core.inlet = Some(Arc::clone(&inlet));
        *live.lock() = Some(core);
        let (raising, raise) = oneshot::channel();
        // Dropped, the switch counts as raised (the supervisor gave up on it); kept, it is not.
        let held = if raised {
            drop(raising);
            None
        } else {
            Some(raising)
        };
        let budget = UpdateBudget::new(Cost::default());
        let mut reader: Started = Box::pin(read_frames(
            Arc::clone(&inlet),
            Arc::clone(&live),
            raise,
            budget,
        ));
        assert!(now_or_never(reader.as_mut()).is_none());
        Self {
            live,
            pipe,
            reader,
            _unraised: held,
        }
    }

    /// Begins an `echo` of `value` as `by` does, answered as a `T`.
    pub(super) fn call<T: serde::de::DeserializeOwned + Send + 'static>(
        &self,
        key: u64,
        value: u64,
        by: Party,
    ) -> Reply<T> {
        let (answer, reply) = pair(decode_response::<T>);
        let call = CallRequest {
            key,
            method: "echo".into(),
            body: encoded(value).into(),
            deadline: Instant::now() + Duration::from_secs(60),
            reply,
            updates: None,
        };
        assert!(self.live.try_begin(call, by).is_ok());
        answer
    }
}

pub(super) fn encoded(value: u64) -> Bytes {
    airlock_protocol::reuse::encode_body(&value).unwrap().into()
}

pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// A reader, started and polled once, that may have had a caller take frames first.
pub(super) type Started = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// A streaming call's update and its answer, written together while the updates' budget is
/// held full: `start` is given the calls, the two frames and the budget, and starts the reader
/// (a caller may take the frames before it). Checks that the update waits for room and that
/// the answer reaches the caller only after it.
pub(super) fn update_then_answer(
    start: impl FnOnce(&mut Calls<u64>, VecDeque<Bytes>, Arc<UpdateBudget>) -> Started,
) {
    runtime().block_on(async {
        let (sender, mut updates) = tokio::sync::mpsc::unbounded_channel();
        let streaming = Updates {
            decode: crate::host::decode_update::<u64>,
            sender,
        };
        let mut calls = Calls::<u64>::begin(vec![Some(streaming)]);
        let id = calls.ids[0];
        calls.worker.reply_progress(id, encoded(1)).unwrap();
        calls.worker.reply_return(id, encoded(2)).unwrap();
        let frames = calls.written();
        assert_eq!(frames.len(), 2);
        let held = Cost { bytes: 1, items: 1 };
        let budget = UpdateBudget::new(held);
        assert!(now_or_never(budget.take(held)).is_some());
        let mut reader = start(&mut calls, frames, Arc::clone(&budget));
        assert!(now_or_never(reader.as_mut()).is_none());
        assert!(
            updates.try_recv().is_err(),
            "the update did not wait for room"
        );
        let early = now_or_never(&mut calls.answers[0]);
        assert!(
            early.is_none(),
            "the answer reached the caller before the call's update: {early:?}"
        );
        budget.give_back(held);
        assert!(now_or_never(reader.as_mut()).is_none());
        let update = updates.try_recv().expect("the update, once there is room");
        assert_eq!(update.update.downcast_ref::<u64>(), Some(&1));
        assert_eq!(now_or_never(&mut calls.answers[0]), Some(Ok(2)));
    });
}

/// What the supervisor does once the worker is reaped: every call still waiting on it is
/// answered (`Decode` for a liar's call, `WorkerLost` for the rest).
pub(super) fn reaped(live: &Live) {
    if let Some(core) = live.lock().as_mut() {
        core.link.fail_all(&crate::LostReason::HandshakeTimeout);
    }
}
