// The adversarial suite, compiled once per transport by `adversarial.rs` (which defines
// `TRANSPORT` in the including module and installs the counting allocator `CountingAlloc`).

use std::fmt::Debug;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_codec::{is_unsafe_in_text, DecodeError, Limits};
use airlock_host::{
    CallError, ExitInfo, HandshakeError, Host, HostBuilder, LostReason, Pool, RestartPolicy,
    SpawnError,
};
use airlock_protocol::frame::{encode_frame, Call, Frame, Welcome};
use airlock_protocol::{
    decode_frame, CallId, ErrorKind, HostConfig, RefuseReason, ViolationCode,
    DEFAULT_MAX_FRAME, DEFAULT_MAX_PROGRESS_PER_CALL, MAX_ERROR_MESSAGE, PROTOCOL_VERSION,
};
use airlock_tests::e2e::{
    fast_restarts, process_alive, process_present, rogue_bin, rogue_host_in, session_of, soon, wait_until, Misbehave,
    ScratchDir,
};
use airlock_test_support::alloc::{self, CountingAlloc};
use airlock_test_support::{hex, varint, ChildMode};
use airlock_tests::support::{ENDED_BY_THE_DEADLINE, STRIKES_AT_A_CALL, SURVIVABLE};
use airlock_worker::builtin::{Echo, Pid, Sleep};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// The largest single allocation the host may make while it handles an attack whose frames are
/// at most a few hundred KiB: its read buffer grows in 64 KiB chunks, never more than one step
/// ahead of the bytes that really arrived, and the codec allocates O(frame length). The bombs
/// below claim 2^60, 2^40 and 2^32 bytes.
const ALLOC_BOUND: usize = 1 << 20;

// ----- methods the rogue answers (it echoes every body, so each is the identity) -----

/// A recursive type: one level of nesting per byte on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Tree(Vec<Tree>);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Shape {
    Dot,
    Circle(u32),
    Square(u32),
}

airlock_host::method!(Text, "text", String => String);
airlock_host::method!(Trees, "tree", Tree => Tree);
airlock_host::method!(Shapes, "shape", Shape => Shape);

// ----- the scene: one rogue host, its files, and what it left behind -----

/// One test's rogue: a private directory for the `ROGUE_*` files.
struct Scene {
    name: &'static str,
    dir: ScratchDir,
}

impl Scene {
    fn new(name: &'static str) -> Self {
        let dir = ScratchDir::new(&format!("adversarial-{name}"));
        Self { name, dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// A host for `rogue-worker SCENARIO`: the first worker strikes, replacements are honest.
    fn builder(&self, scenario: &str) -> HostBuilder {
        rogue_host_in(&self.dir)
            .transport(TRANSPORT)
            .arg(scenario)
            .env("ROGUE_ONCE", self.path("once"))
            .env("ROGUE_LOG", self.path("log"))
            .env("ROGUE_MARK", self.path("mark"))
            .env("ROGUE_PIDS", self.path("pids"))
            .env("ROGUE_PREDICTED", self.path("predicted"))
            .env("ROGUE_RELEASE", self.path("release"))
            .restart_policy(fast_restarts(5))
            .call_timeout(Duration::from_secs(5))
            // No cancel grace: a strike that makes a call miss its deadline takes the worker
            // down at the deadline itself, as these scenarios assert. The grace (a worker that
            // honours the `Cancel` keeps its other calls) has its own suite, `cancel_grace.rs`.
            .protocol(no_grace())
    }

    /// An unconfined host for `scenario`, for what the default confinement makes moot (a
    /// grandchild that leaves the worker's session dies with the worker's PID namespace).
    async fn spawn_unconfined(&self, scenario: &str) -> Host {
        self.builder(scenario)
            .confinement(airlock_host::Confinement::none())
            .spawn()
            .await
            .expect("the rogue completes its handshake")
    }

    async fn spawn(&self, scenario: &str) -> Host {
        match self.builder(scenario).spawn().await {
            Ok(host) => host,
            Err(err) => panic!(
                "the rogue completes its handshake: {err:?}; pids {:?}; writes {:02x?}",
                self.pids(),
                self.log().writes
            ),
        }
    }

    /// Every rogue process started for this scene, in order.
    fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.path("pids"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    }

    /// The worker that struck (the first one started).
    fn striker(&self) -> u32 {
        self.pids()[0]
    }

    fn mark(&self) -> Option<String> {
        std::fs::read_to_string(self.path("mark")).ok()
    }

    /// Lets a rogue waiting on `ROGUE_RELEASE` go on to its last act.
    fn release(&self) {
        std::fs::write(self.path("release"), b"go").unwrap();
    }

    fn log(&self) -> RogueLog {
        RogueLog::read(&self.path("log"))
    }

    /// The attacker is dead and reaped, and an honest replacement answers correctly.
    async fn assert_replaced(&self, host: &Host) {
        let striker = self.striker();
        await_reaped(striker).await;
        let payload = unique(&format!("after {}", self.name));
        assert_eq!(
            host.call::<Echo>(&payload)
                .await
                .expect("the fresh worker answers"),
            payload
        );
        let fresh = host.call::<Pid>(&()).await.unwrap();
        assert_ne!(fresh, striker, "the attacker was reused");
        assert_eq!(
            self.pids(),
            vec![striker, fresh],
            "one honest replacement; stats: {:#?}",
            host.stats()
        );
        assert!(process_alive(fresh));
        assert_eq!(host.stats().restarts, 1);
        host.shutdown().await;
        await_reaped(fresh).await;
    }
}

/// What the rogue wrote and read, from its `ROGUE_LOG`.
struct RogueLog {
    /// Each `write` the rogue made, in order.
    writes: Vec<Vec<u8>>,
    /// Each frame payload it received, in order.
    received: Vec<Vec<u8>>,
}

/// A reply frame, owned: `(id, method, body)`.
type Reply = (CallId, String, Vec<u8>);

impl RogueLog {
    fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut log = RogueLog {
            writes: Vec::new(),
            received: Vec::new(),
        };
        // The host may kill the rogue in the middle of a line (even of a two-byte write that
        // spans a page of the file).
        let (finished, cut) = text.rsplit_once('\n').unwrap_or(("", &text));
        for line in finished.lines() {
            let (dir, digits) = line.split_at(2);
            let bytes = hex::decode(digits).expect("the rogue logs frames in hex");
            match dir {
                "> " => log.writes.push(bytes),
                "< " => log.received.push(bytes),
                _ => panic!("bad log line {line:?}"),
            }
        }
        // A cut write was never made (the rogue logs it before it writes), but a cut receipt
        // is a frame the rogue did get: it counts, with what of it was logged, so that a
        // check of how many frames came cannot pass for want of one.
        if cut.starts_with('<') {
            let digits = cut.get(2..).unwrap_or_default();
            let whole = &digits[..digits.len() / 2 * 2];
            log.received
                .push(hex::decode(whole).expect("the rogue logs frames in hex"));
        }
        log
    }

    /// Every byte written, in order.
    fn stream(&self) -> Vec<u8> {
        self.writes.concat()
    }

    /// The complete frames (payloads) in what was written; an incomplete tail is left out.
    fn sent_frames(&self) -> Vec<Vec<u8>> {
        let stream = self.stream();
        let mut frames = Vec::new();
        let mut rest = &stream[..];
        while rest.len() >= 4 {
            let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
            if rest.len() - 4 < len {
                break;
            }
            frames.push(rest[4..4 + len].to_vec());
            rest = &rest[4 + len..];
        }
        frames
    }

    /// The frames sent after the `Hello`.
    fn sent_after_hello(&self) -> Vec<Vec<u8>> {
        let frames = self.sent_frames();
        assert!(
            matches!(decode_frame(&frames[0]), Ok(Frame::Hello(_))),
            "the rogue's first frame is its Hello"
        );
        frames[1..].to_vec()
    }

    /// The `Call`s received: `(id, method, body)`.
    fn calls(&self) -> Vec<Reply> {
        self.received
            .iter()
            .filter_map(|payload| match decode_frame(payload) {
                Ok(Frame::Call(Call { id, method, body })) => {
                    Some((id, method.to_string(), body.to_vec()))
                }
                _ => None,
            })
            .collect()
    }

    /// The only `Call` received.
    fn only_call(&self) -> Reply {
        let calls = self.calls();
        assert_eq!(calls.len(), 1, "the rogue received exactly one call");
        calls.into_iter().next().unwrap()
    }
}

fn as_return(payload: &[u8]) -> Option<Reply> {
    match decode_frame(payload) {
        Ok(Frame::Return(r)) => Some((r.id, r.method.to_string(), r.body.to_vec())),
        _ => None,
    }
}

fn as_progress(payload: &[u8]) -> Option<Reply> {
    match decode_frame(payload) {
        Ok(Frame::Progress(p)) => Some((p.id, p.method.to_string(), p.body.to_vec())),
        _ => None,
    }
}

/// `(id, kind, message)` of a `Fail` frame.
fn as_fail(payload: &[u8]) -> Option<(CallId, u8, String)> {
    match decode_frame(payload) {
        Ok(Frame::Fail(f)) => Some((f.id, f.kind, f.message.to_string())),
        _ => None,
    }
}

// ----- common expectations -----

/// The body an honest worker returns for `payload`: its encoding.
fn encoded(payload: &ByteBuf) -> Vec<u8> {
    airlock_codec::to_vec(payload).unwrap()
}

fn unique(tag: &str) -> ByteBuf {
    ByteBuf::from(format!("{tag} {:?}", Instant::now()).into_bytes())
}

/// Waits (bounded) until `pid` is gone from `/proc` entirely: killed *and* reaped. A confined
/// rogue's identity is found by the name it took (see `process_present`).
async fn await_reaped(pid: u32) {
    wait_until(
        &format!("worker {pid} to be reaped"),
        Duration::from_secs(3),
        || !process_present(pid),
    )
    .await;
}

/// The call failed for the worker's violation `code`, and by the time it did, the worker was
/// already SIGKILLed and reaped (invariant 6: the host answers a lost worker's calls only after
/// reaping it).
#[track_caller]
fn assert_violation<T: Debug>(outcome: Result<T, CallError>, code: ViolationCode, worker: u32) {
    match outcome {
        Err(CallError::WorkerLost(LostReason::Violation(v))) if v.code == code => {}
        other => panic!("expected WorkerLost(Violation({code:?})), got {other:?}"),
    }
    assert_gone(worker);
}

/// `worker` is already reaped: no wait. Used right after a call failed for its loss.
#[track_caller]
fn assert_gone(worker: u32) {
    assert!(
        !process_present(worker),
        "worker {worker} was not reaped before its calls were failed"
    );
}

/// Waits until the host has recorded `code` once (the worker is then already killed and reaped).
async fn await_violation(host: &Host, code: ViolationCode) {
    wait_until(
        &format!("violation {code:?}"),
        Duration::from_secs(3),
        || host.stats().violations.get(&code) == Some(&1),
    )
    .await;
}

/// Runs `f` and returns its output with the largest single allocation made meanwhile on this
/// thread (the whole host, on a current-thread runtime).
async fn peak_during<F: Future>(f: F) -> (F::Output, usize) {
    alloc::reset_largest();
    let out = f.await;
    let peak = alloc::largest();
    assert!(
        CountingAlloc::is_installed(),
        "the counting allocator is not installed"
    );
    (out, peak)
}

#[track_caller]
fn assert_within(peak: usize, bound: usize) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    eprintln!("{test}: largest host allocation {peak} bytes (bound {bound})");
    assert!(
        peak <= bound,
        "the host made a {peak}-byte allocation; the bound is {bound}"
    );
}

// =====================================================================================
// codec
// =====================================================================================

#[tokio::test(flavor = "current_thread")]
async fn return_len_bomb() {
    let scene = Scene::new("return_len_bomb");
    let host = scene.spawn("return_len_bomb").await;
    let payload = unique("victim");
    let (outcome, peak) = peak_during(host.call::<Echo>(&payload)).await;

    // Live: a Return bound to the victim call, whose body's length prefix claims 2^60 bytes.
    let (id, method, _) = scene.log().only_call();
    let sent = scene.log().sent_after_hello();
    let (rid, rmethod, body) = as_return(&sent[0]).expect("a Return");
    assert_eq!((rid, rmethod.as_str()), (id, method.as_str()));
    let (claimed, _) = varint::read_unchecked(&body).expect("a length prefix");
    assert_eq!(claimed, 1 << 60);
    assert!(claimed > Limits::default().len_budget() as u64);
    assert!(claimed > body.len() as u64);
    // A decoder that reserves what a prefix claims would ask for 2^60 bytes (and abort the
    // process on `Vec::with_capacity`).
    assert!(Vec::<u8>::new()
        .try_reserve_exact(claimed as usize)
        .is_err());

    // The host's default response budget is the frame cap.
    let budget = airlock_protocol::DEFAULT_MAX_FRAME as usize;
    assert_eq!(
        outcome,
        Err(CallError::Decode(DecodeError::LengthLimit {
            len: claimed,
            max: budget
        }))
    );
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn header_len_bomb() {
    let scene = Scene::new("header_len_bomb");
    let host = scene.spawn("header_len_bomb").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: a frame aimed at the victim (its id after the Return tag) whose method-name length
    // prefix claims 2^40 bytes inside a frame of a few dozen.
    let (id, _, _) = scene.log().only_call();
    let frame = &scene.log().sent_after_hello()[0];
    assert_eq!(frame[0], 6, "a Return tag");
    assert_eq!(&frame[1..17], &id.to_bytes(), "aimed at the victim call");
    let (claimed, _) = varint::read_unchecked(&frame[17..]).expect("a length prefix");
    assert_eq!(claimed, 1 << 40);
    assert!(claimed > frame.len() as u64);
    assert!(Vec::<u8>::new()
        .try_reserve_exact(claimed as usize)
        .is_err());

    assert_violation(outcome, ViolationCode::MalformedFrame, scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

/// Names the file that holds the rogue's body, for `deep_nesting`'s child.
const CHILD_BODY: &str = "AIRLOCK_DEEP_NESTING_BODY";

/// `deep_nesting`'s child part: decodes the body its parent saved with plain postcard, which
/// is expected to overflow the stack and abort the process.
fn plain_postcard_decodes_the_saved_body() {
    let path = std::env::var_os(CHILD_BODY).expect("the parent names the body's file");
    let body = std::fs::read(path).unwrap();
    let decoded = postcard::from_bytes::<Tree>(&body);
    // Reached only if plain postcard bounded its recursion; the parent then reports the
    // attack as not live.
    println!("plain postcard returned: {:?}", decoded.map(|_| ()));
}

#[tokio::test(flavor = "current_thread")]
async fn deep_nesting() {
    let child = ChildMode::of(module_path!(), "deep_nesting");
    if child.in_child() {
        plain_postcard_decodes_the_saved_body();
        return;
    }
    let scene = Scene::new("deep_nesting");
    let host = scene.spawn("deep_nesting").await;
    let (outcome, peak) = peak_during(host.call::<Trees>(&Tree(vec![]))).await;

    // Live: the body nests 100,000 levels, and plain postcard recurses once per level: run it
    // in a child process (a stack overflow aborts the whole process) and watch it die.
    let (id, _, _) = scene.log().only_call();
    let (rid, _, body) = as_return(&scene.log().sent_after_hello()[0]).expect("a Return");
    assert_eq!(rid, id);
    assert_eq!(body.len(), 100_001);
    let body_file = scene.path("body");
    std::fs::write(&body_file, &body).unwrap();
    let output = child
        .command()
        .env(CHILD_BODY, &body_file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(child.ran(&output.stdout), "the child never ran: {output:?}");
    {
        use std::os::unix::process::ExitStatusExt;
        assert!(
            output.status.signal().is_some() && stderr.contains("overflowed its stack"),
            "the attack is not live: plain postcard survived ({:?}): {stderr}",
            output.status
        );
    }
    // airlock's decoder refuses the identical bytes at its depth budget, without recursing.
    assert_eq!(
        airlock_codec::from_slice::<Tree>(&body, &Limits::default()),
        Err(DecodeError::DepthLimit { max: 64 })
    );

    assert_eq!(
        outcome,
        Err(CallError::Decode(DecodeError::DepthLimit { max: 64 }))
    );
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn invalid_utf8() {
    let scene = Scene::new("invalid_utf8");
    let host = scene.spawn("invalid_utf8").await;
    let (outcome, peak) = peak_during(host.call::<Text>(&"ab".into())).await;

    // Live: a Return bound to the victim whose string is not UTF-8; a lenient decoder would
    // hand the caller an altered string instead of an error.
    let (id, method, _) = scene.log().only_call();
    let (rid, rmethod, body) = as_return(&scene.log().sent_after_hello()[0]).unwrap();
    assert_eq!((rid, rmethod), (id, method));
    assert!(std::str::from_utf8(&body[1..]).is_err());
    assert_eq!(String::from_utf8_lossy(&body[1..]), "a\u{fffd}b");

    assert_eq!(outcome, Err(CallError::Decode(DecodeError::InvalidUtf8)));
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn bad_enum_tag() {
    let scene = Scene::new("bad_enum_tag");
    let host = scene.spawn("bad_enum_tag").await;
    let (outcome, peak) = peak_during(host.call::<Shapes>(&Shape::Circle(1))).await;

    // Live: bound to the victim, and its variant index is far past the 3 `Shape` declares.
    let (id, method, _) = scene.log().only_call();
    let (rid, rmethod, body) = as_return(&scene.log().sent_after_hello()[0]).unwrap();
    assert_eq!((rid, rmethod), (id, method));
    assert_eq!(varint::read_unchecked(&body).map(|(tag, _)| tag), Some(200));

    assert_eq!(
        outcome,
        Err(CallError::Decode(DecodeError::BadEnumTag {
            tag: 200,
            variants: 3
        }))
    );
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn trailing_bytes() {
    let scene = Scene::new("trailing_bytes");
    let host = scene.spawn("trailing_bytes").await;
    let payload = unique("victim");
    let (outcome, peak) = peak_during(host.call::<Echo>(&payload)).await;

    // Live: plain postcard accepts the body, silently dropping the smuggled tail.
    let (id, _, _) = scene.log().only_call();
    let (rid, _, body) = as_return(&scene.log().sent_after_hello()[0]).unwrap();
    assert_eq!(rid, id);
    assert!(body.ends_with(b"smuggled"));
    assert_eq!(postcard::from_bytes::<ByteBuf>(&body).unwrap(), payload);

    assert_eq!(
        outcome,
        Err(CallError::Decode(DecodeError::TrailingBytes { count: 8 }))
    );
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn wrong_type_body() {
    let scene = Scene::new("wrong_type_body");
    let host = scene.spawn("wrong_type_body").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: bound to the victim, and a perfectly valid `sum` response (an i64).
    let (id, method, _) = scene.log().only_call();
    let (rid, rmethod, body) = as_return(&scene.log().sent_after_hello()[0]).unwrap();
    assert_eq!((rid, rmethod), (id, method));
    assert_eq!(
        airlock_codec::from_slice::<i64>(&body, &Limits::default()),
        Ok(-7)
    );

    // As an echo response the i64's zigzag byte (13) reads as a byte-string length with
    // nothing behind it.
    assert_eq!(
        outcome,
        Err(CallError::Decode(DecodeError::UnexpectedEnd {
            needed: 13,
            remaining: 0
        }))
    );
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

// =====================================================================================
// framing
// =====================================================================================

#[tokio::test(flavor = "current_thread")]
async fn frame_over_cap() {
    let scene = Scene::new("frame_over_cap");
    let host = scene.spawn("frame_over_cap").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: after its Hello the rogue wrote a bare length prefix of 4 GiB - 1.
    let log = scene.log();
    let prefix = log.writes.last().unwrap();
    let claimed = u32::from_le_bytes(prefix.clone().try_into().unwrap());
    assert_eq!(claimed, u32::MAX);
    assert!(claimed > DEFAULT_MAX_FRAME);

    assert_violation(outcome, ViolationCode::FrameTooLarge, scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn stall_prefix() {
    let scene = Scene::new("stall_prefix");
    let host = scene.spawn("stall_prefix").await;
    let started = Instant::now();
    let (outcome, peak) =
        peak_during(host.call_with_deadline::<Echo>(&unique("victim"), soon(400))).await;

    // Live: a prefix promising 16 MiB (within the cap, so the host must wait for it), then
    // 10 bytes, then silence. A receiver that reserved what the prefix promised would have
    // allocated 16 MiB for 10 bytes.
    let log = scene.log();
    let n = log.writes.len();
    let promised = u32::from_le_bytes(log.writes[n - 2].clone().try_into().unwrap());
    assert_eq!(promised, 16 << 20);
    assert!(promised <= DEFAULT_MAX_FRAME);
    assert_eq!(log.writes[n - 1].len(), 10);

    assert_eq!(outcome, Err(CallError::Timeout));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_gone(scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn dribble() {
    let scene = Scene::new("dribble");
    let host = scene.spawn("dribble").await;
    let payload = unique("victim");
    let started = Instant::now();
    let (outcome, peak) = peak_during(host.call_with_deadline::<Echo>(&payload, soon(1000))).await;

    // Live: the frame being dribbled is the honest answer, which the host would accept whole;
    // only some of its bytes, one per write, arrived before the deadline.
    let intended = hex::decode(&scene.mark().expect("the rogue recorded its frame"))
        .expect("the rogue records its frame in hex");
    let (id, _, _) = scene.log().only_call();
    let (rid, _, body) = as_return(&intended[4..]).unwrap();
    assert_eq!((rid, body), (id, encoded(&payload)));
    let log = scene.log();
    let dribbled: Vec<u8> = log.writes[1..].concat();
    assert!(log.writes[1..].iter().all(|w| w.len() == 1));
    assert!(!dribbled.is_empty() && dribbled.len() < intended.len());
    assert!(intended.starts_with(&dribbled));

    assert_eq!(outcome, Err(CallError::Timeout));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

/// Runs `call` and then waits until the host has counted `code` against the worker (the
/// strike comes after an honest answer): the call's outcome and the peak allocation meanwhile.
async fn answered_then_struck<T>(
    host: &Host,
    code: ViolationCode,
    call: impl Future<Output = T>,
) -> (T, usize) {
    peak_during(async {
        let outcome = call.await;
        await_violation(host, code).await;
        outcome
    })
    .await
}

#[tokio::test(flavor = "current_thread")]
async fn garbage_between_frames() {
    let scene = Scene::new("garbage_between_frames");
    let host = scene.spawn("garbage_between_frames").await;
    let striker = scene.striker();
    // The honest answer arrives first and is delivered; the garbage behind it is fatal.
    let (outcome, peak) = answered_then_struck(&host, ViolationCode::MalformedFrame, host.call::<Pid>(&())).await;
    assert_eq!(outcome, Ok(striker));

    // Live: a correctly framed payload (3 bytes, under the cap) that is no frame at all.
    let log = scene.log();
    let garbage = log.writes.last().unwrap();
    assert_eq!(garbage, &[3, 0, 0, 0, 0xde, 0xad, 0xbe]);
    assert!(decode_frame(&garbage[4..]).is_err());

    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn eof_mid_frame() {
    let scene = Scene::new("eof_mid_frame");
    let host = scene.spawn("eof_mid_frame").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: the last write is the first half of a frame whose prefix promised more.
    let log = scene.log();
    let half = log.writes.last().unwrap();
    let promised = u32::from_le_bytes(half[..4].try_into().unwrap()) as usize;
    assert!(half.len() - 4 < promised);

    assert_violation(outcome, ViolationCode::TruncatedFrame, scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

// =====================================================================================
// correlation
// =====================================================================================

#[tokio::test(flavor = "current_thread")]
async fn random_id() {
    let scene = Scene::new("random_id");
    let host = scene.spawn("random_id").await;
    let payload = unique("victim");
    let (outcome, peak) = peak_during(host.call::<Echo>(&payload)).await;

    // Live: a well-formed answer (the victim's method, its exact body) under an id the host
    // never issued.
    let (id, method, _) = scene.log().only_call();
    let (rid, rmethod, body) = as_return(&scene.log().sent_after_hello()[0]).unwrap();
    assert_ne!(rid, id);
    assert_eq!(rid, CallId::from_bytes(*b"not-a-real-id-!!"));
    assert_eq!((rmethod, body), (method, encoded(&payload)));

    assert_violation(outcome, ViolationCode::UnknownCallId, scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

/// The id a counter scheme gives the call after `id`.
fn counter_next(id: CallId) -> CallId {
    CallId::from_bytes((u128::from_be_bytes(id.to_bytes()) + 1).to_be_bytes())
}

#[tokio::test(flavor = "current_thread")]
async fn predictable_id() {
    let scene = Scene::new("predictable_id");
    let host = scene.spawn("predictable_id").await;
    let striker = scene.striker();
    let first = unique("first");
    assert_eq!(host.call::<Echo>(&first).await.unwrap(), first);

    // The forgery is staged between dispatches. Wait until it has landed: the rogue reached
    // the point of writing it (its mark, written just before) and the host received it (its
    // record of the violation, which only that frame could cause).
    let ((), peak) = peak_during(wait_until(
        "the staged frame to land",
        Duration::from_secs(3),
        || {
            scene.mark().as_deref() == Some("staged")
                && host.stats().violations.get(&ViolationCode::UnknownCallId) == Some(&1)
        },
    ))
    .await;
    assert_within(peak, ALLOC_BOUND);

    // Live: the forged Return names exactly the id a counter scheme would give the next call,
    // and carries a valid answer to an echo call.
    let log = scene.log();
    let (id1, _, _) = log.only_call();
    let sent = log.sent_after_hello();
    assert_eq!(sent.len(), 2, "the honest answer, then the forgery");
    assert_eq!(as_return(&sent[0]).unwrap().0, id1);
    let (forged_id, forged_method, forged_body) = as_return(&sent[1]).unwrap();
    let predicted: [u8; 16] = std::fs::read(scene.path("predicted"))
        .unwrap()
        .try_into()
        .unwrap();
    assert_eq!(CallId::from_bytes(predicted), counter_next(id1));
    assert_eq!(forged_id, counter_next(id1));
    assert_eq!(forged_method, "echo");
    assert_eq!(
        airlock_codec::from_slice::<ByteBuf>(&forged_body, &Limits::default()).unwrap(),
        ByteBuf::from(b"forged".to_vec())
    );

    // The next call gets its true answer, from a fresh worker.
    await_reaped(striker).await;
    let second = unique("second");
    assert_eq!(host.call::<Echo>(&second).await.unwrap(), second);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn swapped_name() {
    let scene = Scene::new("swapped_name");
    let host = scene.spawn("swapped_name").await;
    let payload = unique("victim");
    let (outcome, peak) = peak_during(host.call::<Echo>(&payload)).await;

    // Live: the victim's id and exact answer, under another served method's name.
    let (id, method, _) = scene.log().only_call();
    let (rid, rmethod, body) = as_return(&scene.log().sent_after_hello()[0]).unwrap();
    assert_eq!((rid, body), (id, encoded(&payload)));
    assert_eq!((method.as_str(), rmethod.as_str()), ("echo", "text"));

    assert_violation(outcome, ViolationCode::MethodMismatch, scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

/// Invariant (end to end): an honest answer, a lie and another honest answer in
/// one write. The answer before the lie is delivered; the liar's caller hears `Decode` only
/// once the worker is reaped; the answer written after the lie never reaches its caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lie_between_answers() {
    let scene = Scene::new("lie_between_answers");
    let host = scene.spawn("lie_between_answers").await;
    let striker = scene.striker();
    let call = |payload: ByteBuf| {
        let host = host.clone();
        tokio::spawn(async move {
            let outcome = host.call::<Echo>(&payload).await;
            (payload, outcome, process_present(striker))
        })
    };
    let tasks = [
        call(unique("honest one")),
        call(unique("the liar")),
        call(unique("honest two")),
    ];
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    // Live: the three Returns went out in one write, in this order: honest, lie, honest.
    let log = scene.log();
    let last_write = log.writes.last().expect("the rogue wrote").clone();
    let sent = log.sent_after_hello();
    assert_eq!(sent.len(), 3, "{sent:?}");
    let written: usize = sent.iter().map(|f| f.len() + 4).sum();
    assert_eq!(last_write.len(), written, "not written together");
    let returns: Vec<_> = sent.iter().map(|f| as_return(f).unwrap()).collect();
    assert!(returns[1].2.is_empty(), "the lie is not second");
    let body_of = |payload: &ByteBuf| airlock_codec::to_vec(payload).unwrap();
    let before = outcomes
        .iter()
        .find(|(p, _, _)| body_of(p) == returns[0].2)
        .expect("the first answer");
    let after = outcomes
        .iter()
        .find(|(p, _, _)| body_of(p) == returns[2].2)
        .expect("the answer after the lie (an honest echo)");
    let liar = outcomes
        .iter()
        .find(|(p, _, _)| p.windows(4).any(|w| w == b"liar"))
        .unwrap();
    assert_eq!(before.1.as_ref().ok(), Some(&before.0));
    assert!(matches!(liar.1, Err(CallError::Decode(_))), "{:?}", liar.1);
    assert!(!liar.2, "Decode heard while the liar was still there");
    assert!(
        matches!(after.1, Err(CallError::WorkerLost(_))),
        "the answer written after the lie: {:?}",
        after.1
    );
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn double_return() {
    let scene = Scene::new("double_return");
    let host = scene.spawn("double_return").await;
    let payload = unique("victim");
    let (outcome, peak) = answered_then_struck(&host, ViolationCode::FinishedCallId, host.call::<Echo>(&payload)).await;
    // The first terminal frame answered the call, once; the second killed the worker.
    assert_eq!(outcome.unwrap(), payload);

    // Live: two identical Returns for the one call.
    let (id, _, _) = scene.log().only_call();
    let sent = scene.log().sent_after_hello();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0], sent[1]);
    assert_eq!(as_return(&sent[1]).unwrap().0, id);

    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn progress_after_return() {
    let scene = Scene::new("progress_after_return");
    let host = scene.spawn("progress_after_return").await;
    let payload = unique("victim");
    let (outcome, peak) = answered_then_struck(&host, ViolationCode::FinishedCallId, host.call::<Echo>(&payload)).await;
    assert_eq!(outcome.unwrap(), payload);

    // Live: a Progress for the call after its Return.
    let (id, _, _) = scene.log().only_call();
    let sent = scene.log().sent_after_hello();
    assert_eq!(as_return(&sent[0]).unwrap().0, id);
    assert_eq!(as_progress(&sent[1]).unwrap().0, id);

    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn replay_return() {
    let scene = Scene::new("replay_return");
    let host = scene.spawn("replay_return").await;
    let first = unique("first");
    assert_eq!(host.call::<Echo>(&first).await.unwrap(), first);
    let second = unique("second");
    let (outcome, peak) = peak_during(host.call::<Echo>(&second)).await;

    // Live: the second call's only answer is the first call's Return, byte for byte: a valid
    // frame and a valid echo body, for the wrong call.
    let calls = scene.log().calls();
    assert_eq!(calls.len(), 2);
    assert_ne!(calls[0].0, calls[1].0);
    let sent = scene.log().sent_after_hello();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0], sent[1]);
    assert_eq!(as_return(&sent[1]).unwrap().0, calls[0].0);

    assert_violation(outcome, ViolationCode::FinishedCallId, scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn echo_call() {
    let scene = Scene::new("echo_call");
    let host = scene.spawn("echo_call").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: the host's own Call frame came back, byte for byte.
    let log = scene.log();
    let call = log
        .received
        .iter()
        .find(|p| matches!(decode_frame(p), Ok(Frame::Call(_))))
        .unwrap();
    assert_eq!(&log.sent_after_hello()[0], call);

    assert_violation(outcome, ViolationCode::ForbiddenKind, scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn progress_flood() {
    let scene = Scene::new("progress_flood");
    let host = scene.spawn("progress_flood").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: more Progress frames for the call than the host's quota.
    let (id, _, _) = scene.log().only_call();
    let progress = scene
        .log()
        .sent_after_hello()
        .iter()
        .filter(|p| as_progress(p).is_some_and(|(pid, _, _)| pid == id))
        .count();
    assert!(
        progress > DEFAULT_MAX_PROGRESS_PER_CALL as usize,
        "{progress}"
    );

    assert_violation(outcome, ViolationCode::ProgressOverQuota, scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

/// True over the named socket, whose listener reads a connection's first frame itself: a
/// connection whose first frame is not a `Hello` with the token is refused like a stranger's
/// (no refusal can prove the worker made it: a dead process's pid may have passed to the
/// worker), so a worker that speaks first out of turn is not told apart, and its spawn ends at
/// the handshake deadline instead of with a violation.
fn over_named_socket() -> bool {
    matches!(TRANSPORT, airlock_host::TransportChoice::SocketNamed)
}

/// A handshake deadline short enough that a spawn waiting it out keeps the test quick.
fn short_handshake() -> HostConfig {
    no_grace()
        .handshake_timeout(Duration::from_millis(500))
        .unwrap()
}

fn no_grace() -> HostConfig {
    HostConfig::default().cancel_grace(Duration::ZERO).unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn frame_before_hello() {
    let scene = Scene::new("frame_before_hello");
    let (spawned, peak) = peak_during(
        scene
            .builder("frame_before_hello")
            .protocol(short_handshake())
            .spawn(),
    )
    .await;
    match (over_named_socket(), spawned) {
        (false, Err(SpawnError::Handshake(HandshakeError { reason: LostReason::Violation(v), .. }))) => {
            assert_eq!(v.code, ViolationCode::FrameBeforeHandshake)
        }
        (true, Err(SpawnError::Handshake(HandshakeError { reason: LostReason::HandshakeTimeout, .. }))) => {}
        (_, other) => panic!("expected the handshake to fail, got {other:?}"),
    }
    // Live: the rogue's first write was a Return, not a Hello.
    let log = scene.log();
    assert!(as_return(&log.sent_frames()[0]).is_some());
    await_reaped(scene.striker()).await;
    assert_within(peak, ALLOC_BOUND);

    // The next worker started from the same configuration is honest and serves.
    let host = scene.spawn("frame_before_hello").await;
    let payload = unique("after");
    assert_eq!(host.call::<Echo>(&payload).await.unwrap(), payload);
    assert_eq!(scene.pids().len(), 2);
    host.shutdown().await;
}

/// The first worker is honest; its replacement (after a call times out) plays `scenario` at
/// its handshake; the one after that is honest again and serves the call that waited meanwhile.
/// Returns the host and the pids of the three workers: honest, hostile, honest.
async fn a_replacement_strikes_at_its_handshake(scene: &Scene, scenario: &str) -> (Host, Vec<u32>) {
    let host = scene
        .builder(scenario)
        .protocol(short_handshake())
        .env("ROGUE_SPARE", scene.path("spare"))
        .spawn()
        .await
        .unwrap();
    let first = host.call::<Pid>(&()).await.unwrap();
    assert_eq!(
        host.call_with_deadline::<Sleep>(&10_000, soon(200)).await,
        Err(CallError::Timeout)
    );
    let payload = unique("waited");
    assert_eq!(host.call::<Echo>(&payload).await.unwrap(), payload);

    let pids = scene.pids();
    assert_eq!(pids.len(), 3, "honest, hostile, honest: {pids:?}");
    assert_eq!(pids[0], first);
    (host, pids)
}

#[tokio::test(flavor = "current_thread")]
async fn frame_before_hello_from_a_replacement() {
    // The first worker is honest; its replacement sends a frame before its Hello; the one
    // after that is honest again and serves the call that waited meanwhile.
    let scene = Scene::new("frame_before_hello_from_a_replacement");
    let (host, pids) = a_replacement_strikes_at_its_handshake(&scene, "frame_before_hello").await;
    assert!(as_return(&scene.log().sent_frames()[0]).is_some(), "live");
    await_reaped(pids[1]).await;
    let stats = host.stats();
    let counted = stats.violations.get(&ViolationCode::FrameBeforeHandshake);
    assert_eq!(counted, (!over_named_socket()).then_some(&1));
    assert_eq!(stats.restarts, 2);
    assert_eq!(host.call::<Pid>(&()).await, Ok(pids[2]));
    host.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn no_hello() {
    let scene = Scene::new("no_hello");
    let started = Instant::now();
    let config = HostConfig::default()
        .handshake_timeout(Duration::from_millis(300))
        .unwrap();
    let (spawned, peak) = peak_during(scene.builder("no_hello").protocol(config).spawn()).await;
    match spawned {
        Err(SpawnError::Handshake(HandshakeError { reason: LostReason::HandshakeTimeout, .. })) => {}
        other => panic!("expected a handshake timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
    // Live: the rogue started and wrote nothing at all, and had to be killed.
    assert_eq!(scene.pids().len(), 1);
    assert!(scene.log().writes.is_empty());
    assert_gone(scene.striker());
    assert_within(peak, ALLOC_BOUND);
}

#[tokio::test(flavor = "current_thread")]
async fn wrong_version() {
    let scene = Scene::new("wrong_version");
    let (spawned, peak) = peak_during(scene.builder("wrong_version").spawn()).await;
    match spawned {
        Err(SpawnError::Handshake(HandshakeError { reason: LostReason::Refused(RefuseReason::VersionMismatch), .. })) => {}
        other => panic!("expected a version refusal, got {other:?}"),
    }
    // Live: its Hello claimed another protocol version.
    match decode_frame(&scene.log().sent_frames()[0]) {
        Ok(Frame::Hello(hello)) => assert_eq!(hello.protocol, PROTOCOL_VERSION + 41),
        other => panic!("expected a Hello, got {other:?}"),
    }
    await_reaped(scene.striker()).await;
    assert_within(peak, ALLOC_BOUND);

    let host = scene.spawn("wrong_version").await;
    let payload = unique("after");
    assert_eq!(host.call::<Echo>(&payload).await.unwrap(), payload);
    host.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn wrong_version_worker_is_told_why() {
    // PROTOCOL.md §6: on a version mismatch the host "sends Refuse{VersionMismatch, 1} and
    // closes", so a worker of another version learns why it was turned away.
    let scene = Scene::new("wrong_version_worker_is_told_why");
    assert!(scene.builder("wrong_version").spawn().await.is_err());
    let refuses: Vec<_> = scene
        .log()
        .received
        .iter()
        .filter_map(|p| match decode_frame(p) {
            Ok(Frame::Refuse(refuse)) => Some(refuse),
            _ => None,
        })
        .collect();
    assert_eq!(
        refuses.len(),
        1,
        "the worker never received the host's Refuse"
    );
    assert_eq!(refuses[0].reason, RefuseReason::VersionMismatch);
    assert_eq!(refuses[0].host_protocol, PROTOCOL_VERSION);
}

#[tokio::test(flavor = "current_thread")]
async fn wrong_version_from_a_replacement() {
    let scene = Scene::new("wrong_version_from_a_replacement");
    let (host, pids) = a_replacement_strikes_at_its_handshake(&scene, "wrong_version").await;
    match decode_frame(&scene.log().sent_frames()[0]) {
        Ok(Frame::Hello(hello)) => assert_eq!(hello.protocol, PROTOCOL_VERSION + 41),
        other => panic!("expected a Hello, got {other:?}"),
    }
    await_reaped(pids[1]).await;
    assert_eq!(host.stats().restarts, 2);
    assert_eq!(host.call::<Pid>(&()).await, Ok(pids[2]));
    host.shutdown().await;
}

// =====================================================================================
// errors
// =====================================================================================

#[tokio::test(flavor = "current_thread")]
async fn fail_huge_message() {
    let scene = Scene::new("fail_huge_message");
    let host = scene.spawn("fail_huge_message").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: a Fail for the victim whose message is 1 MiB, 256 times the cap.
    let (id, _, _) = scene.log().only_call();
    let frame = &scene.log().sent_after_hello()[0];
    let (fid, kind, message) = as_fail(frame).unwrap();
    assert_eq!((fid, kind), (id, 0));
    assert_eq!(message.len(), 1 << 20);
    assert!(message.len() > MAX_ERROR_MESSAGE);

    assert_violation(
        outcome,
        ViolationCode::InvalidErrorDescriptor,
        scene.striker(),
    );
    // The frame itself is within max_frame, so reading it is allowed; nothing beyond a small
    // multiple of what arrived is allocated.
    assert_within(peak, 4 * frame.len());
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn fail_escape_sequences() {
    let scene = Scene::new("fail_escape_sequences");
    let host = scene.spawn("fail_escape_sequences").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: a short message (within the length cap) that would clear the screen and forge a
    // red log line on a terminal.
    let (id, _, _) = scene.log().only_call();
    let (fid, _, message) = as_fail(&scene.log().sent_after_hello()[0]).unwrap();
    assert_eq!(fid, id);
    assert!(message.len() <= MAX_ERROR_MESSAGE);
    assert!(message.contains("\u{1b}[2J") && message.contains("\r\n"));
    assert!(message.chars().any(is_unsafe_in_text));

    assert_violation(
        outcome,
        ViolationCode::InvalidErrorDescriptor,
        scene.striker(),
    );
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn fail_forbidden_kind() {
    let scene = Scene::new("fail_forbidden_kind");
    let host = scene.spawn("fail_forbidden_kind").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: a Fail for the victim with a kind outside the closed set, claiming a host-side
    // outcome ("timed out").
    let (id, _, _) = scene.log().only_call();
    let (fid, kind, message) = as_fail(&scene.log().sent_after_hello()[0]).unwrap();
    assert_eq!((fid, kind, message.as_str()), (id, 99, "timed out"));
    assert_eq!(ErrorKind::from_wire(kind), None);

    assert_violation(
        outcome,
        ViolationCode::InvalidErrorDescriptor,
        scene.striker(),
    );
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

// =====================================================================================
// process
// =====================================================================================

#[tokio::test(flavor = "current_thread")]
async fn exit_mid_call() {
    let scene = Scene::new("exit_mid_call");
    let host = scene.spawn("exit_mid_call").await;
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: it took the call and exited without a word.
    let log = scene.log();
    log.only_call();
    assert!(log.sent_after_hello().is_empty());

    match outcome {
        Err(CallError::WorkerLost(LostReason::Exited(ExitInfo { code: Some(3), .. }))) => {}
        other => panic!("expected WorkerLost(Exited(code 3)), got {other:?}"),
    }
    assert_gone(scene.striker());
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn hang() {
    let scene = Scene::new("hang");
    let host = scene.spawn("hang").await;
    let started = Instant::now();
    let call = {
        let host = host.clone();
        tokio::spawn(async move {
            host.call_with_deadline::<Echo>(&unique("victim"), soon(400))
                .await
        })
    };
    // Live: the worker has the call and is alive, answering nothing.
    wait_until(
        "the call to reach the worker",
        Duration::from_secs(1),
        || scene.log().calls().len() == 1,
    )
    .await;
    assert!(process_alive(scene.striker()));
    assert!(scene.log().sent_after_hello().is_empty());

    let (outcome, peak) = peak_during(call).await;
    assert_eq!(outcome.unwrap(), Err(CallError::Timeout));
    assert_within(peak, ALLOC_BOUND);
    assert!(started.elapsed() < Duration::from_secs(2));
    // `Timeout` is delivered only once the worker that missed the deadline is reaped.
    assert_gone(scene.striker());
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn ignore_cancel() {
    let scene = Scene::new("ignore_cancel");
    let host = scene.spawn("ignore_cancel").await;
    let started = Instant::now();
    let victim = ByteBuf::from(b"cancelled".to_vec());
    let deadline = soon(800);
    let mut call = Box::pin(host.call_with_deadline::<Echo>(&victim, deadline));
    // Poll the victim first, so it is the call the rogue strikes at.
    assert!(tokio::time::timeout(Duration::from_millis(50), &mut call)
        .await
        .is_err());
    // A second call on the same worker, with a long deadline: it shares the worker's fate.
    let bystander = {
        let host = host.clone();
        tokio::spawn(async move {
            host.call::<Echo>(&ByteBuf::from(b"bystander".to_vec()))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(call); // the caller gives up: the host sends Cancel

    // Live: the Cancel reached the worker, which noted it and carries on ignoring it.
    wait_until(
        "the rogue to see the Cancel",
        Duration::from_secs(2),
        || scene.mark().is_some(),
    )
    .await;
    let victim_id = scene
        .log()
        .calls()
        .into_iter()
        .find(|(_, _, body)| *body == encoded(&victim))
        .unwrap()
        .0;
    assert_eq!(
        scene.mark().unwrap(),
        format!("cancel {}", hex::encode(&victim_id.to_bytes()))
    );
    assert!(process_alive(scene.striker()));

    // At the cancelled call's deadline the worker is killed: it cannot be trusted to stop.
    assert_eq!(
        bystander.await.unwrap(),
        Err(CallError::WorkerLost(LostReason::OtherCallTimedOut))
    );
    assert_gone(scene.striker());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(750) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(host.stats().calls_failed.cancelled, 1);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn close_write_side() {
    let scene = Scene::new("close_write_side");
    let host = scene.spawn("close_write_side").await;
    let started = Instant::now();
    let (outcome, peak) = peak_during(host.call::<Echo>(&unique("victim"))).await;

    // Live: the worker got as far as closing its end of the channel, and did not exit: the
    // host had to SIGKILL it (a worker that exited on its own would report its exit code).
    assert_eq!(scene.mark().as_deref(), Some("closing"));
    match outcome {
        Err(CallError::WorkerLost(LostReason::Exited(ExitInfo {
            code: None,
            signal: Some(9),
        }))) => {}
        other => panic!("expected WorkerLost(Exited(SIGKILL)), got {other:?}"),
    }
    assert_gone(scene.striker());
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_within(peak, ALLOC_BOUND);
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn fork_grandchild() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // Live: a naive parent (no process group, no kill of the group) runs the same rogue: the
    // rogue exits, its grandchild lives on holding the pipe, and the parent never sees EOF.
    let naive_scene = Scene::new("fork_grandchild_naive");
    let mut naive = tokio::process::Command::new(rogue_bin())
        .arg("fork_grandchild")
        .env_clear()
        .env("ROGUE_MARK", naive_scene.path("mark"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut to_rogue = naive.stdin.take().unwrap();
    let mut from_rogue = naive.stdout.take().unwrap();
    let mut prefix = [0u8; 4];
    from_rogue.read_exact(&mut prefix).await.unwrap();
    let mut hello = vec![0u8; u32::from_le_bytes(prefix) as usize];
    from_rogue.read_exact(&mut hello).await.unwrap();
    let welcome = Welcome {
        max_frame: DEFAULT_MAX_FRAME,
        max_in_flight: 16,
        max_progress_per_call: 16,
    };
    to_rogue
        .write_all(&encode_frame(&Frame::Welcome(welcome)))
        .await
        .unwrap();
    let call = Call {
        id: CallId::from_bytes([9; 16]),
        method: "echo",
        body: b"\x02hi",
    };
    to_rogue
        .write_all(&encode_frame(&Frame::Call(call)))
        .await
        .unwrap();
    let status = naive.wait().await.unwrap();
    assert_eq!(status.code(), Some(0), "the rogue itself exited");
    let grandchild: u32 = naive_scene.mark().unwrap().parse().unwrap();
    assert!(
        process_alive(grandchild),
        "the grandchild outlived the rogue"
    );
    let mut byte = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), from_rogue.read(&mut byte))
            .await
            .is_err(),
        "no EOF: the grandchild holds the channel open"
    );
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_raw(grandchild as i32).unwrap(),
        rustix::process::Signal::KILL,
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(2), from_rogue.read(&mut byte))
            .await
            .unwrap()
            .unwrap(),
        0,
        "EOF once the grandchild is gone"
    );

    // airlock: the worker leads its own process group, and the group is killed when the worker
    // is reaped, grandchild included; the call fails at once instead of waiting for an EOF.
    let scene = Scene::new("fork_grandchild");
    let host = scene.spawn("fork_grandchild").await;
    let started = Instant::now();
    let outcome = host.call::<Echo>(&unique("victim")).await;
    match outcome {
        Err(CallError::WorkerLost(LostReason::Exited(ExitInfo { code: Some(0), .. }))) => {}
        other => panic!("expected WorkerLost(Exited(code 0)), got {other:?}"),
    }
    assert_gone(scene.striker());
    assert!(started.elapsed() < Duration::from_secs(2));
    let grandchild: u32 = scene.mark().unwrap().parse().unwrap();
    wait_until("the grandchild to die", Duration::from_secs(2), || {
        !process_alive(grandchild)
    })
    .await;
    scene.assert_replaced(&host).await;
}

#[tokio::test(flavor = "current_thread")]
async fn setsid_grandchild_cannot_keep_the_hosts_stderr_relay() {
    // Unconfined, a grandchild that leaves the worker's process group (its own session)
    // survives the group kill (confined, it dies with the worker's PID namespace:
    // `worker_processes::a_descendant_that_leaves_the_process_group_dies_with_the_worker`).
    // What the host must still not do is keep reading its stderr: then every such grandchild
    // would hold a host descriptor and task for as long as it lives, and go on writing into
    // the host's log under the dead worker's name.
    let relayed = Arc::new(Mutex::new(Vec::new()));
    let _capture = tracing::subscriber::set_default(StderrCapture(Arc::clone(&relayed)));
    let scene = Scene::new("setsid_grandchild");
    let host = scene.spawn_unconfined("setsid_grandchild").await;
    let call = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Echo>(&unique("victim")).await })
    };
    // Live: catch the grandchild while it runs, in a session of its own (out of reach of the
    // worker's group kill), holding the worker's stderr pipe as its fd 2.
    let give_up = std::time::Instant::now() + Duration::from_secs(5);
    let (grandchild, pipe, session) = loop {
        let caught = scene
            .mark()
            .and_then(|m| m.trim().parse::<u32>().ok())
            .and_then(|gc| {
                let pipe = std::fs::read_link(format!("/proc/{gc}/fd/2")).ok()?;
                Some((gc, pipe, session_of(gc)?))
            });
        if let Some(caught) = caught {
            break caught;
        }
        if std::time::Instant::now() >= give_up {
            let mark = scene.mark();
            let proc_entry = mark
                .as_deref()
                .and_then(|m| m.trim().parse::<u32>().ok())
                .map(|gc| std::fs::read_to_string(format!("/proc/{gc}/stat")));
            let stderr = relayed.lock().unwrap().clone();
            let outcome = if call.is_finished() {
                format!("{:?}", call.await)
            } else {
                "still pending".to_string()
            };
            panic!(
                "never caught the grandchild running: mark {mark:?}, its /proc stat \
                 {proc_entry:?}, workers started {:?}, the call {outcome}, the rogue's \
                 stderr {stderr:?}",
                scene.pids()
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let escaped = Escaped(grandchild);
    assert!(pipe.to_string_lossy().starts_with("pipe:"), "{pipe:?}");
    assert_eq!(session, grandchild, "the grandchild leads its own session");
    // And its writes really reach the host's relay (and this test's capture of it), so that
    // counting its late lines below can fail.
    let from_grandchild = |lines: &[String]| {
        lines
            .iter()
            .filter(|l| l.contains("escaped grandchild"))
            .count()
    };
    wait_until(
        "a relayed line from the grandchild",
        Duration::from_secs(5),
        || from_grandchild(&relayed.lock().unwrap()) > 0,
    )
    .await;
    // Caught alive, out of the group's reach and heard: now the worker may exit.
    scene.release();
    let outcome = call.await.unwrap();
    match outcome {
        Err(CallError::WorkerLost(LostReason::Exited(ExitInfo { code: Some(0), .. }))) => {}
        other => panic!("expected WorkerLost(Exited(code 0)), got {other:?}"),
    }
    // The call's outcome is delivered once the worker is reaped. Lines written while it was
    // alive are its process group's own and may be relayed; nothing after this point may be.
    let relayed_before_reap = relayed.lock().unwrap().len();
    assert_gone(scene.striker());

    // Well after the worker was reaped: does the host still hold that pipe, and relay it?
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held: Vec<_> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == pipe))
        .map(|fd| fd.file_name())
        .collect();
    let late_lines = from_grandchild(&relayed.lock().unwrap()[relayed_before_reap..]);
    // With the read end closed, its next write failed (EPIPE): it is gone too.
    let died_of_broken_pipe = !process_alive(grandchild);
    drop(escaped);
    scene.assert_replaced(&host).await;
    assert!(died_of_broken_pipe, "the escaped grandchild still runs");
    assert!(
        held.is_empty() && late_lines == 0,
        "the host still reads the stderr of a dead worker's escaped grandchild: \
         descriptors {held:?} on {pipe:?}, {late_lines} of its lines relayed"
    );
}

/// Kills an escaped grandchild when the test ends, pass or fail.
struct Escaped(u32);

impl Drop for Escaped {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0 as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Captures the host's relayed worker-stderr lines.
struct StderrCapture(Arc<Mutex<Vec<String>>>);

struct MessageText(String);

impl tracing::field::Visit for MessageText {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for StderrCapture {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target() == "airlock::worker_stderr"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut text = MessageText(String::new());
        event.record(&mut text);
        self.0.lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test(flavor = "current_thread")]
async fn stderr_flood() {
    const FLOOD: u64 = 20_000;
    let relayed = Arc::new(Mutex::new(Vec::new()));
    // Current-thread runtime: the relay task logs on this thread, under this subscriber.
    let _capture = tracing::subscriber::set_default(StderrCapture(Arc::clone(&relayed)));
    let scene = Scene::new("stderr_flood");
    let host = scene.spawn("stderr_flood").await;
    let started = Instant::now();
    let payload = unique("victim");
    let (outcome, peak) = peak_during(host.call::<Echo>(&payload)).await;
    assert_eq!(
        outcome.unwrap(),
        payload,
        "the flood did not stall the call"
    );

    // Live: all 20,000 lines arrived (relayed or dropped), and they carried escape sequences.
    let count = || relayed.lock().unwrap().len() as u64;
    wait_until(
        "the relay to drain the flood",
        Duration::from_secs(5),
        || count() + host.stats().stderr_lines_dropped >= FLOOD,
    )
    .await;
    let elapsed = started.elapsed();
    let lines = relayed.lock().unwrap().clone();
    assert!(lines
        .iter()
        .any(|l| l.contains("flood") && l.contains("[31m")));

    // Relayed lines are rate-limited and no control character (ESC, CR) reaches the log.
    let windows = elapsed.as_secs() + 1;
    assert!(
        (lines.len() as u64) <= 200 * windows,
        "{} lines relayed in {elapsed:?}",
        lines.len()
    );
    assert!(host.stats().stderr_lines_dropped >= FLOOD - 200 * windows);
    assert!(lines.iter().all(|l| !l.chars().any(char::is_control)));
    assert_within(peak, ALLOC_BOUND);

    // Stderr is not the channel: no violation, the same worker serves on.
    assert_eq!(host.call::<Pid>(&()).await, Ok(scene.striker()));
    assert!(host.stats().violations.is_empty());
    assert_eq!(host.stats().restarts, 0);
    host.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
async fn never_read() {
    const CALLS: usize = 4;
    const SIZE: usize = 2 << 20;
    let scene = Scene::new("never_read");
    let host = scene
        .builder("never_read")
        .send_timeout(Duration::from_millis(300))
        .call_timeout(Duration::from_secs(30))
        .spawn()
        .await
        .unwrap();
    // Live: what the host must send exceeds any pipe buffer the kernel allows, so its writes
    // must block on a reader that never comes.
    let pipe_max: usize = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(CALLS * SIZE > pipe_max);

    let started = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let host = host.clone();
            tokio::spawn(
                async move { host.call::<Echo>(&ByteBuf::from(vec![i as u8; SIZE])).await },
            )
        })
        .collect();
    for call in calls {
        assert_eq!(
            call.await.unwrap(),
            Err(CallError::WorkerLost(LostReason::TransportFailed))
        );
    }
    assert_gone(scene.striker());
    // The send deadline, not the 30 s call deadline, ended them.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // The worker read nothing but the Welcome.
    let log = scene.log();
    assert_eq!(log.received.len(), 1);
    assert!(matches!(
        decode_frame(&log.received[0]),
        Ok(Frame::Welcome(_))
    ));
    scene.assert_replaced(&host).await;
}

// =====================================================================================
// pools
// =====================================================================================

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_worker_leaves_calls_on_the_other_pool_worker_unaffected() {
    // Why each hostile worker ended, and each restart, printed if the count is off. The label
    // tells this transport's pool from the others running beside it.
    let events = airlock_tests::capture::events();
    let label = format!("pool-{TRANSPORT:?}");
    let scene = Scene::new("pool");
    let pool = Pool::builder(
        rogue_host_in(&scene.dir)
            .label(&label)
            .transport(TRANSPORT)
            .arg("chaos")
            .env("ROGUE_PIDS", scene.path("pids"))
            .restart_policy(RestartPolicy {
                max_restarts: 100,
                ..fast_restarts(5)
            })
            .call_timeout(Duration::from_secs(5)),
    )
    .size(2)
    .spawn()
    .await
    .unwrap();
    let hostile = pool.hosts()[0].clone();
    let steady = pool.hosts()[1].clone();
    let steady_pid = steady.call::<Pid>(&()).await.unwrap();

    // Steady traffic on the second worker for as long as the first misbehaves.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic: Vec<_> = (0..4)
        .map(|t| {
            let (steady, stop) = (steady.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut done = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let payload = ByteBuf::from(format!("task {t} call {done}").into_bytes());
                    assert_eq!(steady.call::<Echo>(&payload).await, Ok(payload));
                    done += 1;
                }
                done
            })
        })
        .collect();

    // Every attack the rogue can make mid-session, one after the other on the same slot.
    let mut pid = hostile.call::<Pid>(&()).await.unwrap();
    // What each strike did, and the restarts counted when it ended: printed if the count is off.
    let mut outcomes = Vec::new();
    for &scenario in STRIKES_AT_A_CALL {
        if scenario == SURVIVABLE {
            // Answered after its flood, however long a loaded machine takes to drain it: the
            // same worker serves on. (A short deadline here would kill it for being slow.)
            let answered = hostile
                .call_with_deadline::<Misbehave>(&scenario.to_string(), soon(20_000))
                .await;
            assert!(answered.is_ok(), "{scenario}: {answered:?}");
            continue;
        }
        // Only the strikes that never answer need a short deadline: it is what ends them. One
        // answered at once gets a deadline a loaded machine can meet, because answered after
        // its deadline (inside the cancel grace) a lie that only decoding would catch is
        // discarded unread as the late answer of a timed-out call, and the worker is kept.
        let deadline = if ENDED_BY_THE_DEADLINE.contains(&scenario) {
            soon(300)
        } else {
            soon(10_000)
        };
        let outcome = hostile
            .call_with_deadline::<Misbehave>(&scenario.to_string(), deadline)
            .await;
        outcomes.push((scenario, format!("{outcome:?}"), hostile.stats().restarts));
        // Wait for the hostile worker to be replaced.
        let started = Instant::now();
        loop {
            match hostile.call::<Pid>(&()).await {
                Ok(fresh) if fresh != pid => {
                    await_reaped(pid).await;
                    pid = fresh;
                    break;
                }
                other => {
                    if let Err(err) = other {
                        outcomes.push((scenario, format!("while replaced: {err:?}"), hostile.stats().restarts));
                    }
                    assert!(started.elapsed() < Duration::from_secs(3), "{scenario}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for task in traffic {
        total += task.await.unwrap();
    }
    assert!(total > 50, "only {total} calls ran beside the attacks");

    // The steady worker never noticed. (And it is there to be seen: the checks that each
    // replaced worker was reaped can tell a confined worker that lives.)
    assert_eq!(steady.call::<Pid>(&()).await, Ok(steady_pid));
    assert!(process_present(steady_pid), "{steady_pid}");
    let calm = steady.stats();
    assert_eq!(calm.restarts, 0);
    assert!(calm.violations.is_empty());
    assert_eq!(calm.calls_ok, calm.calls_started);
    let stormy = hostile.stats();
    assert_eq!(
        stormy.restarts,
        STRIKES_AT_A_CALL.len() as u64 - 1,
        "one restart per fatal strike: {outcomes:#?}\nstats: {stormy:#?}\n\
         workers started, steady and hostile (each writes its pid as it starts): {}\n\
         the hostile worker's ends and restarts: {:#?}",
        scene.pids().len(),
        events
            .matching(|e| e.field("worker") == format!("{label}-0")
                && matches!(e.target.as_str(), "airlock::host" | "airlock::restart" | "airlock::spawn"))
            .iter()
            .map(|e| format!("{}: {:?}", e.target, e.fields))
            .collect::<Vec<_>>()
    );
    for code in [ViolationCode::UnknownCallId, ViolationCode::FrameTooLarge] {
        assert!(stormy.violations.contains_key(&code), "{code:?}");
    }
    pool.shutdown().await;
}
