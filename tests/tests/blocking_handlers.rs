//! Where blocking handlers run. A worker process with `max_concurrency(1)` runs them on its
//! serving thread (no thread hop per call); any other worker runs each on a pool thread. Either
//! way a panic is that call's `Panic`, replies are not held back behind later calls, and a
//! handler that watches its cancel token still sees its `Cancel`.

use std::time::{Duration, Instant};

use airlock_host::{CallError, ErrorKind, Host};
use airlock_tests::e2e::worker_bin;
use airlock_worker::builtin::{
    BlockingThread, Crunch, CrunchesCancelled, Echo, EchoBlocking, PanicBlocking,
};
use serde_bytes::ByteBuf;

async fn spawn_with_slots(slots: Option<usize>) -> Host {
    let mut builder = Host::builder(worker_bin());
    if let Some(slots) = slots {
        builder = builder.arg("--max-concurrency").arg(slots.to_string());
    }
    builder.spawn().await.expect("spawn the bundled worker")
}

#[tokio::test]
async fn a_one_slot_worker_runs_blocking_handlers_on_its_serving_thread_and_others_on_a_pool() {
    let one_slot = spawn_with_slots(Some(1)).await;
    let default = spawn_with_slots(None).await;
    let two_slots = spawn_with_slots(Some(2)).await;
    // The serving loop runs on the main thread of `serve_blocking`'s runtime.
    assert_eq!(one_slot.call::<BlockingThread>(&0).await.unwrap(), "main");
    for host in [&default, &two_slots] {
        let thread = host.call::<BlockingThread>(&0).await.unwrap();
        assert_ne!(
            thread, "main",
            "a worker with spare slots ran a blocking handler inline"
        );
    }
    let payload = ByteBuf::from(vec![7u8; 300]);
    for host in [&one_slot, &default] {
        assert_eq!(host.call::<EchoBlocking>(&payload).await.unwrap(), payload);
    }
    for host in [one_slot, default, two_slots] {
        host.shutdown().await;
    }
}

#[tokio::test]
async fn a_blocking_handler_that_panics_on_the_serving_thread_fails_its_call_only() {
    for slots in [Some(1), None] {
        let host = spawn_with_slots(slots).await;
        match host.call::<PanicBlocking>(&"boom".to_string()).await {
            Err(CallError::Remote(remote)) => {
                assert_eq!(remote.kind(), ErrorKind::Panic, "{slots:?}: {remote}");
                assert!(remote.message().contains("boom"), "{slots:?}: {remote}");
            }
            other => panic!("{slots:?}: a panicking handler answered {other:?}"),
        }
        let payload = ByteBuf::from(vec![1u8; 10]);
        assert_eq!(host.call::<Echo>(&payload).await.unwrap(), payload);
        assert_eq!(
            host.stats().restarts,
            0,
            "{slots:?}: the worker was replaced"
        );
        host.shutdown().await;
    }
}

/// Three 300 ms calls to a one-slot worker run one after another on its serving thread. The
/// second and third are sent while the first runs, so the worker reads them together; each
/// answer must still leave as its handler returns, not when the last one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_serving_thread_each_answer_leaves_before_the_next_handler_runs() {
    let host = spawn_with_slots(Some(1)).await;
    let started = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for queued in [false, true, true] {
        if queued {
            // The first handler is running: these two wait in the pipe, and arrive together.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let host = host.clone();
        calls.spawn(async move {
            let thread = host.call::<BlockingThread>(&300).await;
            (thread, started.elapsed())
        });
    }
    let mut finished = Vec::new();
    while let Some(done) = calls.join_next().await {
        let (thread, at) = done.unwrap();
        assert_eq!(thread.unwrap(), "main");
        finished.push(at);
    }
    finished.sort();
    // Held back, the last two answers would leave together, when the third handler returns.
    assert!(
        finished[2] - finished[1] >= Duration::from_millis(150),
        "an answer waited for the handler behind it: {finished:?}"
    );
    host.shutdown().await;
}

/// `cancellable_blocking_method` handlers never run on the serving thread: the loop must stay
/// free to read the `Cancel` that stops them, even in a one-slot worker.
#[tokio::test]
async fn a_one_slot_worker_still_delivers_a_cancel_to_a_token_watching_handler() {
    let host = spawn_with_slots(Some(1)).await;
    let deadline = Instant::now() + Duration::from_millis(100);
    assert_eq!(
        host.call_with_deadline::<Crunch>(&10_000, deadline).await,
        Err(CallError::Timeout)
    );
    let started = Instant::now();
    while host.call::<CrunchesCancelled>(&()).await != Ok(1) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the handler never saw its token cancelled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(host.stats().restarts, 0, "the worker was killed");
    host.shutdown().await;
}

/// A one-slot worker reads an `Echo` and then a 500 ms blocking call together (both sent, in
/// that order, while a first blocking call holds its serving thread). The echo is answered at
/// once; the blocking handler must not run on the serving thread before that answer is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_read_beside_a_blocking_call_does_not_wait_for_its_handler() {
    let host = spawn_with_slots(Some(1)).await;
    let first = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<BlockingThread>(&300).await })
    };
    // The first handler is running: the next two frames wait in the pipe, and arrive together.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let echo = {
        let host = host.clone();
        tokio::spawn(async move {
            let payload = ByteBuf::from(vec![3u8; 64]);
            let echoed = host.call::<Echo>(&payload).await;
            assert_eq!(echoed.unwrap(), payload);
            started.elapsed()
        })
    };
    // Behind the echo's frame, not beside it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let slow = host.call::<BlockingThread>(&500).await;
    let slow_done = started.elapsed();
    slow.unwrap();
    let echoed = echo.await.unwrap();
    first.await.unwrap().unwrap();
    assert!(
        slow_done - echoed >= Duration::from_millis(250),
        "the echo's answer waited for the blocking handler read behind it: echo at {echoed:?}, \
         blocking call at {slow_done:?}"
    );
    host.shutdown().await;
}

/// A one-slot worker that reads the host's `Welcome` and a first blocking call in one chunk
/// (a busy machine delays the worker until both are in the pipe) still runs that call on its
/// serving thread: nothing is waiting to be written while it runs. Driven by a scripted host
/// that writes both frames in one `write`, so the chunk is certain.
#[test]
fn a_call_read_together_with_the_welcome_still_runs_on_the_serving_thread() {
    use std::io::{Read, Write};
    use std::process::{Command, Stdio};

    use airlock_protocol::{Event, HostConfig, HostSession, Method, Outcome};

    let mut worker = Command::new(worker_bin())
        .args(["--max-concurrency", "1"])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the bundled worker");
    let mut to_worker = worker.stdin.take().unwrap();
    let mut from_worker = worker.stdout.take().unwrap();
    let now = Instant::now();
    let mut session = HostSession::new(HostConfig::default(), now);
    let mut chunk = [0u8; 4096];
    let mut next_event = |session: &mut HostSession| loop {
        if let Some(event) = session.poll_event() {
            return event;
        }
        let read = from_worker
            .read(&mut chunk)
            .expect("read the worker's frames");
        assert!(read > 0, "the worker closed its channel");
        session.handle_bytes(&chunk[..read]);
    };
    assert!(matches!(next_event(&mut session), Event::Ready(_)));
    // The Welcome is queued; the call joins it, and both leave in one write.
    let request = airlock_codec::to_vec(&0u64).unwrap();
    let deadline = now + Duration::from_secs(10);
    let mut rng = rand_core::UnwrapErr(rand_core::OsRng);
    let id = session
        .begin_call(BlockingThread::NAME, request, deadline, &mut rng)
        .unwrap();
    let mut both = Vec::new();
    while let Some(transmit) = session.poll_transmit() {
        both.extend_from_slice(&transmit.to_vec());
    }
    to_worker.write_all(&both).unwrap();
    let Event::Completed {
        id: answered,
        outcome: Outcome::Returned(body),
    } = next_event(&mut session)
    else {
        panic!("the call was not answered");
    };
    assert_eq!(answered, id);
    let thread: String =
        airlock_codec::from_slice(&body, &airlock_codec::Limits::default()).unwrap();
    assert_eq!(
        thread, "main",
        "the call read beside the Welcome went to a pool thread"
    );
    drop(to_worker);
    assert!(worker.wait().unwrap().success());
}
