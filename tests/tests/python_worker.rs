//! The Python worker SDK (`python/airlock_worker.py`), written from `PROTOCOL.md` alone,
//! against the real Rust host under the default `Confinement::strict()`, over the pipe, the
//! inherited socket and the named socket: the handshake and its refusal, dynamic and typed
//! calls, errors as data, cancellation and many calls at once. It is the proof that the spec
//! stands alone.
//!
//! Each test skips, saying so, only when there is no `python3` at all.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_codec::{from_value, to_value, Key, Value};
use airlock_host::{
    CallError, Confinement, ConfinementMode, ErrorKind, HandshakeError, Host, HostBuilder,
    LostReason, RefuseReason, SpawnError, TransportChoice,
};
use airlock_tests::dynamic::DynamicBody;
use airlock_tests::e2e::ScratchDir;

airlock_host::method!(
    /// The example's `echo`: any Value back unchanged.
    Echo, "echo", DynamicBody => DynamicBody);
airlock_host::method!(
    /// The example's `divide`: `{"a": number, "b": number}` to `a / b`.
    Divide, "divide", DynamicBody => DynamicBody);
airlock_host::method!(
    /// The example's `sleep`: milliseconds, cut short by a cancel.
    Sleep, "sleep", DynamicBody => DynamicBody);
airlock_host::method!(
    /// The example's `cancelled`: how many sleeps a cancel has stopped.
    Cancelled, "cancelled", DynamicBody => DynamicBody);
airlock_host::method!(
    /// A method the example does not serve.
    Missing, "missing", DynamicBody => DynamicBody);
airlock_host::method!(
    /// `echo` called with a typed `String`, whose encoding is not a Value's.
    TypedEcho, "echo", String => String);

/// The transports a Python worker finds for itself (PROTOCOL.md §1.1).
const TRANSPORTS: [TransportChoice; 3] = [
    TransportChoice::Pipe,
    TransportChoice::SocketInherited,
    TransportChoice::SocketNamed,
];

/// The interpreter the SDK runs on: the real binary, not a launcher such as a pyenv shim (a
/// shell script that execs the interpreter by a path the sandbox does not hold), and the
/// installation it loads its standard library from.
struct Python {
    interpreter: PathBuf,
    prefix: PathBuf,
}

/// The `python3` on `PATH` (or `/usr/bin/python3`), resolved to the interpreter it runs;
/// `None` only when there is no `python3` at all. A `python3` that exists but cannot say
/// where it lives fails the test.
fn python() -> Option<Python> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("python3"))
            .find(|candidate| candidate.is_file())
    });
    let Some(launcher) = on_path.or_else(|| {
        let system = PathBuf::from("/usr/bin/python3");
        system.is_file().then_some(system)
    }) else {
        eprintln!("skipped: no python3 on PATH or at /usr/bin/python3");
        return None;
    };
    let probe = std::process::Command::new(&launcher)
        .args([
            "-c",
            "import sys; print(sys.executable); print(sys.base_prefix)",
        ])
        .output()
        .unwrap_or_else(|e| panic!("{} does not run: {e}", launcher.display()));
    assert!(
        probe.status.success(),
        "{} failed to report its interpreter: {}",
        launcher.display(),
        String::from_utf8_lossy(&probe.stderr)
    );
    let text = String::from_utf8(probe.stdout).expect("paths in UTF-8");
    let mut lines = text.lines();
    let (Some(executable), Some(prefix)) = (lines.next(), lines.next()) else {
        panic!(
            "{} printed no interpreter path: {text:?}",
            launcher.display()
        );
    };
    Some(Python {
        interpreter: std::fs::canonicalize(executable).expect("the interpreter exists"),
        prefix: std::fs::canonicalize(prefix).expect("the installation exists"),
    })
}

/// `python/`, where the SDK and the example live.
fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("python")
        .canonicalize()
        .expect("the python/ directory")
}

/// Trees the default confinement binds for every worker; a Python installed under one needs
/// no grant of its own.
const SYSTEM_TREES: [&str; 5] = ["/usr", "/bin", "/sbin", "/lib", "/lib64"];

/// A host for the Python program `script` (its arguments after it), confined by
/// `Confinement::strict()` with read-only grants for the interpreter's installation (unless
/// the sandbox holds it already), the SDK and `extra`.
fn python_host(
    python: &Python,
    script: &Path,
    transport: TransportChoice,
    extra: Option<&Path>,
) -> HostBuilder {
    python_host_confined(python, script, transport, extra, Confinement::strict())
}

fn python_host_confined(
    python: &Python,
    script: &Path,
    transport: TransportChoice,
    extra: Option<&Path>,
    mut confinement: Confinement,
) -> HostBuilder {
    if !SYSTEM_TREES
        .iter()
        .any(|tree| python.prefix.starts_with(tree))
    {
        confinement = confinement.read_only(&python.prefix);
    }
    confinement = confinement.read_only(sdk_dir());
    if let Some(extra) = extra {
        confinement = confinement.read_only(extra);
    }
    // -B: write no bytecode (the sandbox's filesystem is read-only anyway).
    Host::builder(&python.interpreter)
        .arg("-B")
        .arg(script)
        .transport(transport)
        .confinement(confinement)
        .call_timeout(Duration::from_secs(20))
}

async fn example(python: &Python, transport: TransportChoice) -> Host {
    python_host(
        python,
        &sdk_dir().join("example_worker.py"),
        transport,
        None,
    )
    .spawn()
    .await
    .unwrap_or_else(|e| panic!("the Python example worker starts over {transport:?}: {e}"))
}

fn map(entries: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Map(
        entries
            .into_iter()
            .map(|(k, v)| (Key::from(k), v))
            .collect(),
    )
}

async fn echo(host: &Host, value: Value) -> Result<Value, CallError> {
    host.call::<Echo>(&DynamicBody(value)).await.map(|b| b.0)
}

fn remote(result: Result<DynamicBody, CallError>) -> airlock_host::RemoteError {
    match result {
        Err(CallError::Remote(error)) => error,
        other => panic!("expected an error reported by the worker, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_worker_shakes_hands_over_every_transport_and_lists_its_methods() {
    let Some(python) = python() else { return };
    for transport in TRANSPORTS {
        let host = example(&python, transport).await;
        let info = host.worker_info();
        assert_eq!(
            (info.name.as_str(), info.version.as_str()),
            ("example-py", "1.0.0")
        );
        assert_eq!(info.methods, ["echo", "divide", "sleep", "cancelled"]);
        assert_eq!(info.confinement.mode, ConfinementMode::Strict);
        assert!(info.confinement.namespaces, "{:?}", info.confinement);
        assert!(
            !info.confinement.worker_filter,
            "the Python SDK installs no filter of its own"
        );
        assert_eq!(
            echo(&host, Value::Str(format!("over {transport:?}"))).await,
            Ok(Value::Str(format!("over {transport:?}")))
        );
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_value_variant_comes_back_from_the_python_worker_with_its_tag() {
    let Some(python) = python() else { return };
    let value = Value::Map(BTreeMap::from([
        (Key::I64(-7), Value::Null),
        (Key::U64(7), Value::Bool(true)),
        (
            Key::Str("all".into()),
            Value::List(vec![
                Value::Bool(false),
                Value::I64(i64::MIN),
                Value::I64(3),
                Value::U64(3),
                Value::U64(u64::MAX),
                Value::F64(-2.5),
                Value::Str("é ☃ \u{202e}".into()),
                Value::Bytes(vec![0, 1, 254, 255]),
                Value::List(vec![]),
                Value::Map(BTreeMap::new()),
            ]),
        ),
    ]));
    for transport in [TransportChoice::Pipe, TransportChoice::SocketInherited] {
        let host = example(&python, transport).await;
        assert_eq!(echo(&host, value.clone()).await, Ok(value.clone()));
        let big = Value::Bytes((0..2_000_000u32).map(|i| (i % 251) as u8).collect());
        assert_eq!(echo(&host, big.clone()).await, Ok(big));
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_requests_and_responses_travel_as_values() {
    let Some(python) = python() else { return };
    #[derive(serde::Serialize)]
    struct Division {
        a: f64,
        b: i32,
    }
    let host = example(&python, TransportChoice::Pipe).await;
    let request = to_value(&Division { a: 7.0, b: 2 }).unwrap();
    let answer = host.call::<Divide>(&DynamicBody(request)).await.unwrap();
    assert_eq!(from_value::<f64>(answer.0), Ok(3.5));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_exceptions_come_back_as_errors_and_the_worker_serves_on() {
    let Some(python) = python() else { return };
    for transport in [TransportChoice::Pipe, TransportChoice::SocketInherited] {
        let host = example(&python, transport).await;
        let pid = host.worker_pid();

        // An exception the handler did not mean as its answer: Panic.
        let zero = map([("a", Value::I64(1)), ("b", Value::I64(0))]);
        let panic = remote(host.call::<Divide>(&DynamicBody(zero)).await);
        assert_eq!(panic.kind(), ErrorKind::Panic, "{panic:?}");
        assert_eq!(
            panic.message(),
            "handler raised ZeroDivisionError: division by zero"
        );

        // `HandlerError`: kind Handler, with its code.
        let shapeless = remote(
            host.call::<Divide>(&DynamicBody(Value::Str("1/0".into())))
                .await,
        );
        assert_eq!(shapeless.kind(), ErrorKind::Handler, "{shapeless:?}");
        assert_eq!(shapeless.code(), Some(1));

        // A method the worker does not serve, and a request that is not a Value.
        let missing = remote(host.call::<Missing>(&DynamicBody(Value::Null)).await);
        assert_eq!(missing.kind(), ErrorKind::UnknownMethod, "{missing:?}");
        match host.call::<TypedEcho>(&"hi".to_string()).await {
            Err(CallError::Remote(error)) => {
                assert_eq!(error.kind(), ErrorKind::BadRequest, "{error:?}");
                assert!(error.message().contains("TrailingBytes"), "{error:?}");
            }
            other => panic!("a typed String is not a Value: {other:?}"),
        }

        // All of it was data: the same worker answers on.
        assert_eq!(echo(&host, Value::I64(1)).await, Ok(Value::I64(1)));
        assert_eq!(host.worker_pid(), pid);
        assert_eq!(host.stats().restarts, 0);
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_sends_cancel_which_the_python_worker_answers_and_serves_on() {
    let Some(python) = python() else { return };
    for transport in [TransportChoice::Pipe, TransportChoice::SocketInherited] {
        let host = example(&python, transport).await;
        let pid = host.worker_pid();
        assert_eq!(echo(&host, Value::Null).await, Ok(Value::Null));
        // A deadline a short wait away: had the worker not answered the cancel with a terminal
        // frame, the host would kill it when this deadline passes. The call is dropped well
        // after it reached the worker (a call dropped before it is sent sends no Cancel).
        let deadline = Instant::now() + Duration::from_secs(3);
        let dropped = tokio::time::timeout(
            Duration::from_millis(500),
            host.call_with_deadline::<Sleep>(&DynamicBody(Value::I64(30_000)), deadline),
        )
        .await;
        assert!(
            dropped.is_err(),
            "the sleep outlasts its caller: {dropped:?}"
        );

        // The handler saw the cancel: the worker received it.
        let stopped = loop {
            let count = host.call::<Cancelled>(&DynamicBody(Value::Null)).await;
            match count {
                Ok(DynamicBody(Value::I64(0))) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => break other,
            }
        };
        assert_eq!(
            stopped,
            Ok(DynamicBody(Value::I64(1))),
            "over {transport:?}"
        );

        // Past the dropped call's deadline the worker is still the same one: it answered.
        tokio::time::sleep_until((deadline + Duration::from_millis(500)).into()).await;
        assert_eq!(echo(&host, Value::Null).await, Ok(Value::Null));
        assert_eq!(host.worker_pid(), pid, "over {transport:?}");
        let stats = host.stats();
        assert_eq!(stats.restarts, 0, "{stats:?}");
        assert!(stats.violations.is_empty(), "{stats:?}");
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_calls_each_get_their_own_answer() {
    let Some(python) = python() else { return };
    for transport in [TransportChoice::Pipe, TransportChoice::SocketInherited] {
        let host = example(&python, transport).await;
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..300u64 {
            let host = host.clone();
            calls.spawn(async move {
                let request = map([
                    ("n", Value::U64(i)),
                    (
                        "pad",
                        Value::Bytes(vec![i as u8; (i as usize % 7) * 10_000]),
                    ),
                ]);
                (request.clone(), echo(&host, request).await)
            });
        }
        // Some calls sleep meanwhile, holding handler threads, so answers come out of order.
        for _ in 0..8 {
            let host = host.clone();
            calls.spawn(async move {
                let request = Value::I64(50);
                let answer = host
                    .call::<Sleep>(&DynamicBody(request.clone()))
                    .await
                    .map(|b| b.0);
                (request, answer)
            });
        }
        let mut answered = 0;
        while let Some(joined) = calls.join_next().await {
            let (request, answer) = joined.expect("the call task");
            assert_eq!(answer, Ok(request), "over {transport:?}");
            answered += 1;
        }
        assert_eq!(answered, 308);
        assert_eq!(host.stats().restarts, 0);
        host.shutdown().await;
    }
}

/// A Python worker built on the SDK from `body`, written to a scratch directory.
fn script(dir: &ScratchDir, body: &str) -> PathBuf {
    let path = dir.join("worker.py");
    let sdk = sdk_dir();
    std::fs::write(
        &path,
        format!(
            "import sys\nsys.path.insert(0, {sdk:?})\nimport airlock_worker\n{body}\n",
            sdk = sdk.display().to_string()
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_with_another_protocol_version_is_refused() {
    let Some(python) = python() else { return };
    let dir = ScratchDir::new("python-version");
    let worker = script(
        &dir,
        r#"
airlock_worker.PROTOCOL_VERSION = 2
worker = airlock_worker.Worker("future", "2.0.0")
worker.add_method("echo", lambda value: value)
sys.exit(worker.run())
"#,
    );
    for transport in [TransportChoice::Pipe, TransportChoice::SocketInherited] {
        let spawned = python_host(&python, &worker, transport, Some(&dir))
            .spawn()
            .await;
        match spawned {
            Err(SpawnError::Handshake(HandshakeError {
                reason: LostReason::Refused(RefuseReason::VersionMismatch),
                ..
            })) => {}
            Err(other) => panic!("expected a VersionMismatch refusal, got {other}"),
            Ok(_) => panic!("a version-2 Hello was accepted over {transport:?}"),
        }
    }
    // The same script at version 1 is welcomed: the version was the refusal.
    let current = script(
        &dir,
        r#"
worker = airlock_worker.Worker("current", "1.0.0")
worker.add_method("echo", lambda value: value)
sys.exit(worker.run())
"#,
    );
    let host = python_host(&python, &current, TransportChoice::Pipe, Some(&dir))
        .spawn()
        .await
        .expect("a version-1 Hello is welcomed");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_print_in_a_handler_does_not_reach_the_pipe() {
    let Some(python) = python() else { return };
    let dir = ScratchDir::new("python-print");
    let worker = script(
        &dir,
        r#"
worker = airlock_worker.Worker("printer", "1.0.0")
def shout(text):
    print(text * 1000, flush=True)
    sys.stdout.buffer.write(b"\xff\xff\xff\x7f")
    sys.stdout.flush()
    return text
worker.add_method("echo", shout)
sys.exit(worker.run())
"#,
    );
    let host = python_host(&python, &worker, TransportChoice::Pipe, Some(&dir))
        .spawn()
        .await
        .expect("the printing worker starts");
    for _ in 0..3 {
        assert_eq!(
            echo(&host, Value::Str("loud".into())).await,
            Ok(Value::Str("loud".into()))
        );
    }
    let stats = host.stats();
    assert_eq!(stats.restarts, 0, "{stats:?}");
    assert!(stats.violations.is_empty(), "{stats:?}");
    host.shutdown().await;
}

/// Set when this test binary runs again under a seccomp filter installed before its `exec`,
/// as a container runtime installs its profile.
const UNDER_A_FILTER: &str = "AIRLOCK_TEST_UNDER_A_FILTER";

/// Installs one seccomp filter that allows everything (as a container's profile would add one
/// to every process in it), then `exec`s `argv[1:]` under it.
const EXEC_UNDER_A_FILTER: &str = r#"
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
allow = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000))
class Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
prog = Prog(1, ctypes.addressof(allow))
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:
    sys.exit("no filter: errno %d" % ctypes.get_errno())
os.execv(sys.argv[1], sys.argv[1:])
"#;

/// A host that itself runs under a filter (a container's) passes it on to its worker, whose
/// `Seccomp_filters` then exceeds the host's own share though the worker installed nothing.
/// That filter is never taken for the worker's own allowlist: `worker_filter` stays false and
/// `require_worker_filter()` still refuses the Python worker, which installs none.
#[test]
fn a_filter_the_host_runs_under_is_never_taken_for_the_workers_own() {
    let Some(python) = python() else { return };
    let name = "a_filter_the_host_runs_under_is_never_taken_for_the_workers_own";
    if std::env::var_os(UNDER_A_FILTER).is_none() {
        let run = std::process::Command::new(&python.interpreter)
            .args(["-c", EXEC_UNDER_A_FILTER])
            .arg(std::env::current_exe().expect("this test binary"))
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(UNDER_A_FILTER, "1")
            .output()
            .expect("run under a filter");
        let out = String::from_utf8_lossy(&run.stdout);
        assert!(
            run.status.success() && out.contains("1 passed"),
            "{out}\n{}",
            String::from_utf8_lossy(&run.stderr)
        );
        return;
    }
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    assert!(
        status.lines().any(|line| line == "Seccomp_filters:\t1"),
        "this host runs under one filter: {status}"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let script = sdk_dir().join("example_worker.py");
        // Live: the worker carries one filter more than the host installs (its two), which a
        // count against the host's share alone takes for the worker's own.
        let host = python_host(&python, &script, TransportChoice::Pipe, None)
            .spawn()
            .await
            .expect("spawn");
        let report = host.worker_info().confinement.clone();
        host.shutdown().await;
        assert_eq!(report.inherited_filters, 1, "{report:?}");
        assert_eq!(report.seccomp_filters, 1 + 2, "{report:?}");
        assert!(!report.worker_filter, "{report:?}");

        refused_for_want_of_its_own_filter(&python).await;
    });
}

/// Spawns the example worker (which installs no filter of its own) under a policy that
/// requires one, and checks that it is refused.
async fn refused_for_want_of_its_own_filter(python: &Python) {
    let spawned = python_host_confined(
        python,
        &sdk_dir().join("example_worker.py"),
        TransportChoice::Pipe,
        None,
        Confinement::strict().require_worker_filter(),
    )
    .spawn()
    .await;
    match spawned {
        Err(SpawnError::Confinement(_)) => {}
        Err(other) => panic!("expected a confinement refusal, got {other}"),
        Ok(_) => panic!("a worker without its own filter was accepted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_requires_the_workers_own_filter_refuses_the_python_worker() {
    let Some(python) = python() else { return };
    refused_for_want_of_its_own_filter(&python).await;
}
