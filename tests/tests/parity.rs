//! Parity: the same call scenarios through `InProcess` and through a real spawned worker give
//! identical results, compared case by case. In-process mode shares the worker's handlers, the
//! codec and both session state machines; only the process boundary differs.

use std::time::{Duration, Instant};

use airlock_host::{CallError, Host, InProcess};
use airlock_protocol::Method;
use airlock_tests::e2e::{worker_bin, SumOfBytes};
use airlock_worker::builtin::{builtin_worker, Digest, Echo, Fail, Panic, Sleep, Sum};
use serde_bytes::ByteBuf;

/// Either mode, behind one call API.
enum Target {
    Real(Host),
    InProcess(InProcess),
}

impl Target {
    async fn call<M: Method>(
        &self,
        request: &M::Request,
        deadline: Instant,
    ) -> Result<M::Response, CallError> {
        match self {
            Target::Real(host) => host.call_with_deadline::<M>(request, deadline).await,
            Target::InProcess(host) => host.call_with_deadline::<M>(request, deadline).await,
        }
    }
}

airlock_host::method!(
    /// A method the worker does not serve.
    Unknown, "unknown.method", u8 => u8
);

airlock_host::method!(
    /// `echo` whose response is read as the wrong type: both modes must refuse it identically.
    EchoAsNumber, "echo", ByteBuf => u64
);

/// One scenario: its name and its outcome rendered for comparison.
async fn scenarios(target: &Target) -> Vec<(String, String)> {
    let deadline = || Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    macro_rules! case {
        ($name:expr, $method:ty, $request:expr) => {{
            let result = target.call::<$method>(&$request, deadline()).await;
            out.push(($name.to_string(), format!("{result:?}")));
        }};
    }
    for values in [
        vec![],
        vec![0],
        vec![1, 2, 3],
        vec![-5, 5],
        vec![i64::MAX],
        vec![i64::MIN],
        vec![i64::MAX, 1],
        vec![i64::MIN, -1],
        (0..1000).collect::<Vec<i64>>(),
        vec![7; 10_000],
    ] {
        case!(
            format!("sum {:?}", &values[..values.len().min(4)]),
            Sum,
            values
        );
    }
    for size in [0usize, 1, 127, 128, 65_536, 1 << 20] {
        let payload = ByteBuf::from((0..size).map(|i| (i * 31 % 251) as u8).collect::<Vec<_>>());
        case!(format!("echo {size} bytes"), Echo, payload.clone());
        case!(format!("digest {size} bytes"), Digest, payload);
    }
    for message in [
        "",
        "plain failure",
        "with\ncontrol\u{7}chars",
        &"long ".repeat(2000),
    ] {
        case!(
            format!("fail {:?}", &message[..message.len().min(12)]),
            Fail,
            message.to_string()
        );
    }
    for message in ["boom", "panic with \u{202e} bidi"] {
        case!(format!("panic {message:?}"), Panic, message.to_string());
    }
    case!("sleep 1 ms", Sleep, 1);
    case!("unknown method", Unknown, 1);
    case!("bad request", SumOfBytes, ByteBuf::from(vec![0x80]));
    case!(
        "response of the wrong type",
        EchoAsNumber,
        ByteBuf::from(vec![1, 2, 3])
    );
    case!("after a decode failure, sum", Sum, vec![1, 1]);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_and_real_worker_give_identical_results() {
    let real = Target::Real(Host::builder(worker_bin()).spawn().await.unwrap());
    let in_process = Target::InProcess(InProcess::new(builtin_worker).await.unwrap());
    let expected = scenarios(&real).await;
    let actual = scenarios(&in_process).await;
    assert!(expected.len() >= 30, "only {} scenarios", expected.len());
    for ((name, real_result), (_, in_process_result)) in expected.iter().zip(&actual) {
        assert_eq!(real_result, in_process_result, "scenario {name:?} differs");
    }
    // The scenarios are not vacuous: they cover successes and each kind of failure.
    let all: String = expected.iter().map(|(_, r)| r.as_str()).collect();
    for needle in [
        "Ok(",
        "Handler",
        "Panic",
        "UnknownMethod",
        "BadRequest",
        "Decode(",
    ] {
        assert!(all.contains(needle), "no scenario produced {needle}");
    }
    if let Target::Real(host) = real {
        host.shutdown().await;
    }
}
