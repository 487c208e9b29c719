//! Dynamic calls (`Host::call_value`): a method named at run time with `Value` bodies, against
//! the real bundled `airlock-worker` under the default confinement, and in process. The name is
//! checked before anything is sent; a `Value` reaches a typed method only as a request that
//! does not decode; a typed answer that is not a `Value` cuts the worker off like any answer
//! that does not decode.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use airlock_codec::{Key, Limits, Value};
use airlock_host::{CallError, ErrorKind, Host, InProcess, Pool};
use airlock_worker::builtin::{builtin_worker, fnv1a, ECHO_VALUE};
use airlock_worker::{HandlerError, Worker};

/// The bundled `airlock-worker`, beside this test's executable (`target/<profile>/`);
/// `cargo xtask test` builds every binary before the tests.
fn worker_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable lives in target/<profile>/deps");
    let path = dir.join("airlock-worker");
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo build -p airlock-worker`)",
        path.display()
    );
    path
}

async fn real_worker() -> Host {
    Host::builder(worker_bin())
        .call_timeout(Duration::from_secs(10))
        .spawn()
        .await
        .expect("the bundled worker starts under the default confinement")
}

/// A value with every variant, map keys of all three kinds, and nesting.
fn every_variant() -> Value {
    let map = [
        (Key::I64(-1), Value::Null),
        (Key::U64(1), Value::Bool(true)),
        (Key::from("f"), Value::F64(-0.5)),
        (Key::from("s"), Value::Str("h\u{e9}llo".into())),
        (Key::from("b"), Value::Bytes(vec![0, 255, 7])),
    ]
    .into_iter()
    .collect();
    Value::List(vec![
        Value::I64(i64::MIN),
        Value::U64(u64::MAX),
        Value::Map(map),
        Value::List(vec![Value::List(vec![])]),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_of_every_variant_round_trips_through_the_confined_worker() {
    let host = real_worker().await;
    assert!(host.worker_info().confinement.namespaces);
    let sent = every_variant();
    let answer = host.call_value(ECHO_VALUE, &sent).await;
    assert_eq!(answer, Ok(sent));
    assert_eq!(host.stats().calls_ok, 1);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_method_name_is_refused_before_anything_is_sent() {
    let host = real_worker().await;
    let too_long = "m".repeat(65);
    for name in ["", "has space", "semi;colon", "\u{e9}", too_long.as_str()] {
        let refused = host.call_value(name, &Value::Null).await;
        assert_eq!(refused, Err(CallError::InvalidMethodName), "{name:?}");
    }
    // Nothing reached the supervisor, and the worker serves on.
    assert_eq!(host.stats().calls_started, 0);
    let longest = "m".repeat(64);
    let unknown = host.call_value(&longest, &Value::Null).await;
    assert!(
        matches!(&unknown, Err(CallError::Remote(e)) if e.kind() == ErrorKind::UnknownMethod),
        "{unknown:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_sent_to_a_typed_method_is_a_bad_request_and_the_worker_serves_on() {
    let host = real_worker().await;
    let pid = host.worker_pid();
    let request = Value::List(vec![Value::I64(1), Value::I64(2)]);
    let refused = host.call_value("sum", &request).await;
    assert!(
        matches!(&refused, Err(CallError::Remote(e)) if e.kind() == ErrorKind::BadRequest),
        "{refused:?}"
    );
    assert_eq!(
        host.call_value(ECHO_VALUE, &request).await,
        Ok(request.clone())
    );
    assert_eq!(host.worker_pid(), pid, "a handler's refusal is not fatal");
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_answer_that_is_not_a_value_cuts_the_worker_off() {
    // Seven nulls encode as `08 07 00 00 00 00 00 00 00`: to the typed `digest` method that is
    // a valid 8-byte `ByteBuf`, so its handler runs and answers a `u64` varint.
    let request = Value::List(vec![Value::Null; 7]);
    let encoded = request.to_vec();
    let typed: serde_bytes::ByteBuf =
        airlock_codec::from_slice(&encoded, &Limits::default()).expect("a typed ByteBuf");
    let answer = airlock_codec::to_vec(&fnv1a(&typed)).expect("a u64 encodes");
    // The premise: that answer is not a `Value` encoding.
    assert!(Value::from_slice(&answer, &Limits::default()).is_err());

    let host = real_worker().await;
    let result = host.call_value("digest", &request).await;
    assert!(matches!(result, Err(CallError::Decode(_))), "{result:?}");
    // The liar was killed and replaced; the replacement serves.
    let replaced = Instant::now() + Duration::from_secs(10);
    while host.stats().restarts == 0 && Instant::now() < replaced {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(host.stats().restarts, 1);
    assert_eq!(
        host.call_value(ECHO_VALUE, &Value::U64(7)).await,
        Ok(Value::U64(7))
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_spreads_dynamic_calls_over_its_workers() {
    let pool = Pool::builder(Host::builder(worker_bin()))
        .size(2)
        .spawn()
        .await
        .expect("two bundled workers start");
    let calls = (0..8u64).map(|i| {
        let pool = pool.clone();
        async move { pool.call_value(ECHO_VALUE, &Value::U64(i)).await }
    });
    let answers = futures_join_all(calls).await;
    for (i, answer) in answers.into_iter().enumerate() {
        assert_eq!(answer, Ok(Value::U64(i as u64)));
    }
    let stats = pool.stats();
    let per_worker: Vec<u64> = stats.workers.iter().map(|s| s.calls_ok).collect();
    assert_eq!(per_worker.iter().sum::<u64>(), 8);
    assert!(per_worker.iter().all(|&n| n > 0), "{per_worker:?}");
    // The total adds the workers up, per method too.
    assert_eq!(stats.total.calls_ok, 8);
    let echo = &stats.total.methods[ECHO_VALUE];
    assert_eq!((echo.ok, echo.latency.count()), (8, 8));
    pool.shutdown().await;
}

/// Runs the futures concurrently, each as a task, and returns their outputs in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(tasks.len());
    for task in tasks {
        outputs.push(task.await.expect("call task"));
    }
    outputs
}

#[tokio::test]
async fn a_value_method_answers_in_process_exactly_as_in_the_worker() {
    let host = InProcess::new(builtin_worker).await.unwrap();
    let sent = every_variant();
    assert_eq!(host.call_value(ECHO_VALUE, &sent).await, Ok(sent));
    host.shutdown().await;
}

#[tokio::test]
async fn a_value_methods_error_and_the_workers_budgets_reach_the_host_as_data() {
    let host = InProcess::new(|| {
        Worker::new()
            .limits(Limits::default().max_depth(4))
            .value_method("count", |request| async move {
                match request {
                    Value::List(items) => Ok(Value::U64(items.len() as u64)),
                    _ => Err(HandlerError::new("expected a list").with_code(7)),
                }
            })
    })
    .await
    .unwrap();
    let three = Value::List(vec![Value::Null; 3]);
    assert_eq!(host.call_value("count", &three).await, Ok(Value::U64(3)));

    let refused = host.call_value("count", &Value::Null).await;
    match refused {
        Err(CallError::Remote(e)) => {
            assert_eq!(e.kind(), ErrorKind::Handler);
            assert_eq!(e.message(), "expected a list");
            assert_eq!(e.code(), Some(7));
        }
        other => panic!("expected the handler's error, got {other:?}"),
    }

    let mut deep = Value::Null;
    for _ in 0..5 {
        deep = Value::List(vec![deep]);
    }
    let over_budget = host.call_value("count", &deep).await;
    assert!(
        matches!(&over_budget, Err(CallError::Remote(e)) if e.kind() == ErrorKind::BadRequest),
        "{over_budget:?}"
    );
    host.shutdown().await;
}
