//! `PROTOCOL.md` is the normative wire spec; this file holds it to the code, byte for byte.
//!
//! The vectors are read from `PROTOCOL.md` itself, so the spec and the test cannot drift apart:
//! - every ```` ```hex frame:<name> ```` block must be `encode_frame` of the frame named here,
//!   and must decode back to it; every name here must have a block, and vice versa;
//! - every ```` ```hex reject:<name> <Reason> ```` block must be refused by `decode_frame` with
//!   that codec reason, and is fatal (`MalformedFrame`) to both sessions;
//! - the tables between `<!-- golden:... -->` markers must match the codec;
//! - the frames the sessions build themselves (head and body kept apart, no copy of the body)
//!   must be byte-identical to `encode_frame` of the same `Frame`, and to the spec's vectors;
//! - the vectors with a real body (`call-echo`, `return-echo`, `call-value`) must be what the
//!   real encoders make of that request or response, and must decode back to it.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::time::{Duration, Instant};

use airlock_codec::{from_slice, to_vec, Key, Limits, Value};
use airlock_protocol::frame::{
    self, decode_frame, encode_frame, Call, Cancel, Fail, Frame, Hello, Progress, Refuse, Return,
    Shutdown,
};
use airlock_protocol::*;
use airlock_test_support::hex;
use bytes::Bytes;
use rand_core::{CryptoRng, RngCore};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use serde_bytes::ByteBuf;
use support::SeededRng;

const SPEC: &str = include_str!("../../PROTOCOL.md");

// ---------------------------------------------------------------------------------------------
// Reading the spec.

/// Fenced code blocks: `(info string, contents)`.
fn fenced_blocks(doc: &str) -> Vec<(&str, String)> {
    let mut blocks = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```") else {
            continue;
        };
        let mut body = String::new();
        for line in lines.by_ref() {
            if line.trim_end() == "```" {
                break;
            }
            body.push_str(line);
            body.push('\n');
        }
        blocks.push((info.trim(), body));
    }
    blocks
}

/// Hex bytes separated by whitespace; `#` starts a comment; `(empty)` is no bytes.
fn parse_hex(text: &str) -> Vec<u8> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .flat_map(str::split_whitespace)
        .filter(|token| *token != "(empty)")
        .map(|token| match hex::decode(token).as_deref() {
            Some(&[byte]) => byte,
            _ => panic!("hex token `{token}` is not one byte"),
        })
        .collect()
}

/// The blocks tagged `hex <kind>:<name> [words...]`, as `(name, words, bytes)`.
fn hex_blocks(kind: &str) -> Vec<(String, Vec<String>, Vec<u8>)> {
    let prefix = format!("{kind}:");
    let mut out = Vec::new();
    for (info, body) in fenced_blocks(SPEC) {
        let mut words = info.split_whitespace();
        if words.next() != Some("hex") {
            continue;
        }
        let Some(name) = words.next().and_then(|w| w.strip_prefix(&prefix)) else {
            continue;
        };
        out.push((
            name.to_string(),
            words.map(String::from).collect(),
            parse_hex(&body),
        ));
    }
    assert!(!out.is_empty(), "PROTOCOL.md has no `hex {kind}:` blocks");
    out
}

/// The body rows of the table between `<!-- golden:<marker> -->` and its closing marker, each
/// cell trimmed and stripped of its backticks.
fn golden_table(marker: &str) -> Vec<Vec<String>> {
    let open = format!("<!-- golden:{marker} -->");
    let close = format!("<!-- /golden:{marker} -->");
    let start = SPEC
        .find(&open)
        .unwrap_or_else(|| panic!("PROTOCOL.md lacks {open}"))
        + open.len();
    let end = start
        + SPEC[start..]
            .find(&close)
            .unwrap_or_else(|| panic!("PROTOCOL.md lacks {close}"));
    let rows: Vec<Vec<String>> = SPEC[start..end]
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().trim_matches('`').to_string())
                .collect()
        })
        .collect();
    assert!(!rows.is_empty(), "table {marker} is empty");
    rows
}

/// The spec's bytes for `frame:<name>`.
fn spec_frame(name: &str) -> Vec<u8> {
    hex_blocks("frame")
        .into_iter()
        .find(|(n, _, _)| n == name)
        .unwrap_or_else(|| panic!("PROTOCOL.md has no `hex frame:{name}` block"))
        .2
}

/// Checks that every key of `expected` is in `documented` and vice versa.
fn same_names<'a>(
    what: &str,
    documented: impl IntoIterator<Item = &'a str>,
    expected: impl IntoIterator<Item = &'a str>,
) {
    let documented: BTreeSet<&str> = documented.into_iter().collect();
    let expected: BTreeSet<&str> = expected.into_iter().collect();
    assert_eq!(
        documented, expected,
        "{what}: PROTOCOL.md and this test list different vectors"
    );
}

// ---------------------------------------------------------------------------------------------
// The frames the vectors stand for.

/// The id used by every vector in the spec: bytes `00 01 02 … 0f`.
const SPEC_ID: CallId = CallId::from_bytes([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]);

/// The token used by `frame:hello-token`: bytes `a0 … bf`.
const SPEC_TOKEN: [u8; TOKEN_LEN] = {
    let mut token = [0u8; TOKEN_LEN];
    let mut i = 0;
    while i < TOKEN_LEN {
        token[i] = 0xa0 + i as u8;
        i += 1;
    }
    token
};

airlock_protocol::method!(
    /// The bundled worker's `echo`, declared as that worker declares it.
    Echo, "echo", ByteBuf => ByteBuf
);

/// The request and response of the spec's `call-echo` and `return-echo` vectors.
fn echo_payload() -> <Echo as Method>::Request {
    ByteBuf::from(b"hi".to_vec())
}

/// The request of the spec's `call-value` vector.
fn value_request() -> Value {
    Value::Str("hi".into())
}

/// `value`'s typed encoding, as the host encodes a request and the worker a response.
fn encoded<T: Serialize>(value: &T) -> Vec<u8> {
    to_vec(value).expect("the value encodes")
}

fn expected_frames() -> Vec<(&'static str, Frame<'static>)> {
    let id = SPEC_ID;
    // Leaked so the frames can borrow them for the whole test binary's life.
    let echo_body: &'static [u8] = encoded(&echo_payload()).leak();
    let value_body: &'static [u8] = value_request().to_vec().leak();
    vec![
        (
            "hello",
            Frame::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                worker_name: "demo",
                worker_version: "1.0",
                methods: vec!["echo", "sum"],
                token: None,
            }),
        ),
        (
            "hello-token",
            Frame::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                worker_name: "demo",
                worker_version: "1.0",
                methods: vec![],
                token: Some(&SPEC_TOKEN),
            }),
        ),
        (
            "welcome",
            Frame::Welcome(Welcome {
                max_frame: DEFAULT_MAX_FRAME,
                max_in_flight: DEFAULT_MAX_IN_FLIGHT,
                max_progress_per_call: DEFAULT_MAX_PROGRESS_PER_CALL,
            }),
        ),
        (
            "refuse",
            Frame::Refuse(Refuse {
                reason: RefuseReason::VersionMismatch,
                host_protocol: PROTOCOL_VERSION,
            }),
        ),
        (
            "call",
            Frame::Call(Call {
                id,
                method: "echo",
                body: b"hi",
            }),
        ),
        (
            "call-echo",
            Frame::Call(Call {
                id,
                method: Echo::NAME,
                body: echo_body,
            }),
        ),
        (
            "return-echo",
            Frame::Return(Return {
                id,
                method: Echo::NAME,
                body: echo_body,
            }),
        ),
        (
            "call-value",
            Frame::Call(Call {
                id,
                method: "echo",
                body: value_body,
            }),
        ),
        ("cancel", Frame::Cancel(Cancel { id })),
        (
            "progress",
            Frame::Progress(Progress {
                id,
                method: "echo",
                body: b"2",
            }),
        ),
        (
            "return",
            Frame::Return(Return {
                id,
                method: "echo",
                body: b"hi",
            }),
        ),
        (
            "fail",
            Frame::Fail(Fail {
                id,
                method: "echo",
                kind: ErrorKind::Panic.to_wire(),
                message: "boom",
                code: Some(300),
            }),
        ),
        (
            "fail-nocode",
            Frame::Fail(Fail {
                id,
                method: "echo",
                kind: ErrorKind::Handler.to_wire(),
                message: "",
                code: None,
            }),
        ),
        ("shutdown", Frame::Shutdown(Shutdown)),
    ]
}

#[test]
fn every_frame_vector_in_the_spec_is_encode_frame_of_its_frame() {
    let documented = hex_blocks("frame");
    let expected = expected_frames();
    same_names(
        "frame vectors",
        documented.iter().map(|(n, _, _)| n.as_str()),
        expected.iter().map(|(n, _)| *n),
    );
    let mut kinds = BTreeSet::new();
    for (name, frame) in &expected {
        let bytes = spec_frame(name);
        let (prefix, payload) = bytes.split_at(LENGTH_PREFIX);
        assert_eq!(
            u32::from_le_bytes(prefix.try_into().unwrap()) as usize,
            payload.len(),
            "frame:{name}: length prefix does not match the payload"
        );
        assert_eq!(
            encode_frame(frame),
            bytes,
            "frame:{name}: encode_frame differs from PROTOCOL.md"
        );
        assert_eq!(
            &decode_frame(payload).unwrap(),
            frame,
            "frame:{name}: decode_frame differs"
        );
        kinds.insert(format!("{:?}", frame.kind()));
    }
    assert_eq!(kinds.len(), 9, "every frame kind has a vector: {kinds:?}");
}

#[test]
fn every_reject_vector_in_the_spec_is_refused_and_fatal_to_both_sessions() {
    for (name, words, bytes) in hex_blocks("reject") {
        let [reason] = words.as_slice() else {
            panic!("reject:{name} must name exactly one codec reason");
        };
        let (prefix, payload) = bytes.split_at(LENGTH_PREFIX);
        assert_eq!(
            u32::from_le_bytes(prefix.try_into().unwrap()) as usize,
            payload.len(),
            "reject:{name}: length prefix does not match the payload"
        );
        let err = decode_frame(payload).expect_err(&format!("reject:{name} decoded"));
        assert!(
            format!("{:?}", err.0).starts_with(reason.as_str()),
            "reject:{name}: refused with {:?}, PROTOCOL.md says {reason}",
            err.0
        );

        let (mut host, mut worker) = handshaken();
        host.handle_bytes(&bytes);
        assert_eq!(
            host_violation(&mut host),
            Some(ViolationCode::MalformedFrame),
            "reject:{name} at the host"
        );
        worker.handle_bytes(&bytes);
        let closed = std::iter::from_fn(|| worker.poll_event()).last();
        assert!(
            matches!(
                closed,
                Some(WorkerEvent::Closed(CloseReason::Violation(Violation {
                    code: ViolationCode::MalformedFrame,
                    ..
                })))
            ),
            "reject:{name} at the worker: {closed:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The protocol's numbers.

#[test]
fn violation_table_in_the_spec_lists_every_code_with_its_number() {
    use ViolationCode::*;
    let codes = [
        FrameTooLarge,
        EmptyFrame,
        MalformedFrame,
        TruncatedFrame,
        FrameBeforeHandshake,
        DuplicateHandshake,
        ForbiddenKind,
        UnknownCallId,
        FinishedCallId,
        MethodMismatch,
        InvalidName,
        ProgressOverQuota,
        InvalidErrorDescriptor,
        InvalidHello,
        DuplicateCallId,
        TooManyCalls,
        InvalidWelcome,
    ];
    let rows = golden_table("violations");
    let documented: Vec<(u16, &str)> = rows
        .iter()
        .map(|r| (r[0].parse().unwrap(), r[1].as_str()))
        .collect();
    let actual: Vec<(u16, String)> = codes
        .iter()
        .map(|c| (c.number(), format!("{c:?}")))
        .collect();
    let actual: Vec<(u16, &str)> = actual.iter().map(|(n, c)| (*n, c.as_str())).collect();
    assert_eq!(
        documented, actual,
        "PROTOCOL.md §10 differs from ViolationCode"
    );
}

#[test]
fn error_kind_table_in_the_spec_is_the_wire_mapping() {
    let rows = golden_table("error-kinds");
    for row in &rows {
        let value: u8 = row[0].parse().unwrap();
        let kind = ErrorKind::from_wire(value).unwrap_or_else(|| panic!("no kind {value}"));
        assert_eq!(format!("{kind:?}"), row[1], "ErrorKind {value}");
        assert_eq!(kind.to_wire(), value);
    }
    let next = u8::try_from(rows.len()).unwrap();
    assert!(
        (next..=u8::MAX).all(|v| ErrorKind::from_wire(v).is_none()),
        "ErrorKind has wire values PROTOCOL.md does not list"
    );
}

#[test]
fn refuse_reason_table_in_the_spec_is_the_wire_mapping() {
    let reasons = [
        RefuseReason::VersionMismatch,
        RefuseReason::BadToken,
        RefuseReason::InvalidHello,
    ];
    let rows = golden_table("refuse-reasons");
    assert_eq!(rows.len(), reasons.len(), "RefuseReason values");
    for (row, reason) in rows.iter().zip(reasons) {
        assert_eq!(format!("{reason:?}"), row[1]);
        let value: u8 = row[0].parse().unwrap();
        let bytes = encode_frame(&Frame::Refuse(Refuse {
            reason,
            host_protocol: PROTOCOL_VERSION,
        }));
        assert_eq!(bytes[LENGTH_PREFIX + 1], value, "{reason:?}'s wire value");
    }
}

#[test]
fn constants_table_in_the_spec_matches_the_crate() {
    let actual: BTreeMap<&str, u64> = BTreeMap::from([
        ("PROTOCOL_VERSION", u64::from(PROTOCOL_VERSION)),
        ("LENGTH_PREFIX", LENGTH_PREFIX as u64),
        ("DEFAULT_MAX_FRAME", u64::from(DEFAULT_MAX_FRAME)),
        ("MIN_MAX_FRAME", u64::from(MIN_MAX_FRAME)),
        ("HANDSHAKE_MAX_FRAME", u64::from(HANDSHAKE_MAX_FRAME)),
        ("DEFAULT_MAX_IN_FLIGHT", u64::from(DEFAULT_MAX_IN_FLIGHT)),
        ("MAX_IN_FLIGHT", u64::from(MAX_IN_FLIGHT)),
        (
            "DEFAULT_MAX_PROGRESS_PER_CALL",
            u64::from(DEFAULT_MAX_PROGRESS_PER_CALL),
        ),
        ("MAX_METHOD_NAME", MAX_METHOD_NAME as u64),
        ("MAX_HELLO_METHODS", frame::MAX_HELLO_METHODS as u64),
        ("TOKEN_LEN", TOKEN_LEN as u64),
        ("MAX_ERROR_MESSAGE", MAX_ERROR_MESSAGE as u64),
        ("FINISHED_ID_MEMORY", FINISHED_ID_MEMORY as u64),
        (
            "DEFAULT_HANDSHAKE_TIMEOUT",
            DEFAULT_HANDSHAKE_TIMEOUT.as_secs(),
        ),
        ("DEFAULT_SEND_TIMEOUT", DEFAULT_SEND_TIMEOUT.as_secs()),
        ("DEFAULT_CANCEL_GRACE", DEFAULT_CANCEL_GRACE.as_secs()),
    ]);
    let rows = golden_table("constants");
    same_names(
        "constants",
        rows.iter().map(|r| r[0].as_str()),
        actual.keys().copied(),
    );
    for row in &rows {
        assert_eq!(
            row[1].parse::<u64>().unwrap(),
            actual[row[0].as_str()],
            "{} in PROTOCOL.md",
            row[0]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The codec tables.

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Meters(u32);

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Marker;

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Point {
    x: i32,
    y: i32,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Shape {
    Dot,
    Circle(u32),
    Line(Point, Point),
    Rect { w: u16, h: u16 },
}

/// Whether some bytes decode to a particular value.
type DecodesTo = Box<dyn Fn(&[u8]) -> bool>;

/// A table row's meaning: its encoding, and a check that those bytes decode back to it.
struct TypedCase {
    encoded: Vec<u8>,
    decodes: DecodesTo,
}

fn typed<T>(value: T) -> TypedCase
where
    T: Serialize + DeserializeOwned + PartialEq + Debug + 'static,
{
    TypedCase {
        encoded: to_vec(&value).unwrap(),
        decodes: Box::new(move |bytes| {
            from_slice::<T>(bytes, &Limits::default()).as_ref() == Ok(&value)
        }),
    }
}

fn typed_cases() -> BTreeMap<&'static str, TypedCase> {
    BTreeMap::from([
        ("false", typed(false)),
        ("true", typed(true)),
        ("0u8", typed(0u8)),
        ("255u8", typed(255u8)),
        ("-1i8", typed(-1i8)),
        ("127u32", typed(127u32)),
        ("128u32", typed(128u32)),
        ("300u32", typed(300u32)),
        ("u16::MAX", typed(u16::MAX)),
        ("u32::MAX", typed(u32::MAX)),
        ("u64::MAX", typed(u64::MAX)),
        ("0i32", typed(0i32)),
        ("-1i32", typed(-1i32)),
        ("1i32", typed(1i32)),
        ("-64i64", typed(-64i64)),
        ("64i64", typed(64i64)),
        ("i64::MIN", typed(i64::MIN)),
        ("-2i16", typed(-2i16)),
        ("i16::MIN", typed(i16::MIN)),
        ("i16::MAX", typed(i16::MAX)),
        ("0u128", typed(0u128)),
        ("1u128 << 64", typed(1u128 << 64)),
        ("u128::MAX", typed(u128::MAX)),
        ("-1i128", typed(-1i128)),
        ("i128::MIN", typed(i128::MIN)),
        ("i128::MAX", typed(i128::MAX)),
        ("1.0f32", typed(1.0f32)),
        ("-2.5f64", typed(-2.5f64)),
        ("'é'", typed('é')),
        ("String::from(\"hi\")", typed(String::from("hi"))),
        ("String::new()", typed(String::new())),
        (
            "ByteBuf::from([1, 2, 3])",
            typed(ByteBuf::from(vec![1, 2, 3])),
        ),
        (
            "Blob::from(vec![1, 2, 3])",
            typed(airlock_protocol::Blob::from(vec![1, 2, 3])),
        ),
        ("None::<u8>", typed(None::<u8>)),
        ("Some(5u8)", typed(Some(5u8))),
        ("()", typed(())),
        ("vec![1u16, 2, 3]", typed(vec![1u16, 2, 3])),
        ("(1u8, 2u16, \"a\")", typed((1u8, 2u16, String::from("a")))),
        ("[1u8, 2, 3]", typed([1u8, 2, 3])),
        ("[300u16, 1]", typed([300u16, 1])),
        ("[[1u8; 2]; 2]", typed([[1u8; 2]; 2])),
        ("Point { x: 1, y: -1 }", typed(Point { x: 1, y: -1 })),
        ("Meters(300)", typed(Meters(300))),
        ("Marker", typed(Marker)),
        ("Shape::Dot", typed(Shape::Dot)),
        ("Shape::Circle(7)", typed(Shape::Circle(7))),
        (
            "Shape::Line(Point { x: 0, y: 1 }, Point { x: 2, y: 3 })",
            typed(Shape::Line(Point { x: 0, y: 1 }, Point { x: 2, y: 3 })),
        ),
        (
            "Shape::Rect { w: 2, h: 300 }",
            typed(Shape::Rect { w: 2, h: 300 }),
        ),
        (
            "BTreeMap::from([(1u8, true), (2u8, false)])",
            typed(BTreeMap::from([(1u8, true), (2u8, false)])),
        ),
    ])
}

#[test]
fn typed_table_in_the_spec_matches_the_codec() {
    let rows = golden_table("typed");
    let cases = typed_cases();
    same_names(
        "typed table",
        rows.iter().map(|r| r[0].as_str()),
        cases.keys().copied(),
    );
    for row in &rows {
        let case = &cases[row[0].as_str()];
        let bytes = parse_hex(&row[1]);
        assert_eq!(case.encoded, bytes, "typed `{}`", row[0]);
        assert!((case.decodes)(&bytes), "typed `{}` does not decode", row[0]);
    }
}

fn value_cases() -> BTreeMap<&'static str, Value> {
    BTreeMap::from([
        ("Null", Value::Null),
        ("Bool(false)", Value::Bool(false)),
        ("Bool(true)", Value::Bool(true)),
        ("I64(0)", Value::I64(0)),
        ("I64(-1)", Value::I64(-1)),
        ("I64(1)", Value::I64(1)),
        ("I64(i64::MIN)", Value::I64(i64::MIN)),
        ("U64(300)", Value::U64(300)),
        ("F64(1.0)", Value::F64(1.0)),
        ("Str(\"hi\")", Value::Str("hi".into())),
        ("Bytes([de, ad])", Value::Bytes(vec![0xde, 0xad])),
        ("List([])", Value::List(vec![])),
        (
            "List([Null, U64(1)])",
            Value::List(vec![Value::Null, Value::U64(1)]),
        ),
        ("Map({})", Value::Map(BTreeMap::new())),
        (
            "Map({I64(-1): Null, U64(2): Null, Str(\"a\"): Bool(true)})",
            Value::Map(BTreeMap::from([
                (Key::I64(-1), Value::Null),
                (Key::U64(2), Value::Null),
                (Key::Str("a".into()), Value::Bool(true)),
            ])),
        ),
    ])
}

#[test]
fn value_table_in_the_spec_matches_the_codec() {
    let rows = golden_table("value");
    let cases = value_cases();
    same_names(
        "value table",
        rows.iter().map(|r| r[0].as_str()),
        cases.keys().copied(),
    );
    for row in &rows {
        let value = &cases[row[0].as_str()];
        let bytes = parse_hex(&row[1]);
        assert_eq!(value.to_vec(), bytes, "value `{}`", row[0]);
        assert_eq!(
            &Value::from_slice(&bytes, &Limits::default()).unwrap(),
            value,
            "value `{}` does not decode",
            row[0]
        );
    }
}

#[test]
fn value_reject_table_in_the_spec_is_refused_as_stated() {
    for row in golden_table("value-reject") {
        let err = Value::from_slice(&parse_hex(&row[0]), &Limits::default())
            .expect_err(&format!("`{}` decoded", row[0]));
        assert!(
            format!("{err:?}").starts_with(&row[1]),
            "`{}` refused with {err:?}, PROTOCOL.md says {}",
            row[0],
            row[1]
        );
    }
}

#[test]
fn varint_reject_table_in_the_spec_is_refused_as_stated() {
    for row in golden_table("varint-reject") {
        let bytes = parse_hex(&row[1]);
        let limits = Limits::default();
        let err = match row[0].as_str() {
            "u16" => from_slice::<u16>(&bytes, &limits).map(drop),
            "u32" => from_slice::<u32>(&bytes, &limits).map(drop),
            "u64" => from_slice::<u64>(&bytes, &limits).map(drop),
            "u128" => from_slice::<u128>(&bytes, &limits).map(drop),
            other => panic!("varint-reject: no type `{other}` in this test"),
        }
        .expect_err(&format!("{} `{}` decoded", row[0], row[1]));
        assert!(
            format!("{err:?}").starts_with(&row[2]),
            "{} `{}` refused with {err:?}, PROTOCOL.md says {}",
            row[0],
            row[1],
            row[2]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The sessions' own frames.

/// An RNG whose every fill writes `00 01 02 …`, so the host's first id is the spec's id.
/// (Ids must come from a CSPRNG; this stands in for one only to reproduce the vectors.)
struct SpecIdRng;

impl RngCore for SpecIdRng {
    fn next_u32(&mut self) -> u32 {
        0
    }
    fn next_u64(&mut self) -> u64 {
        0
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for (i, b) in dst.iter_mut().enumerate() {
            *b = i as u8;
        }
    }
}
impl CryptoRng for SpecIdRng {}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// A host and a worker past the handshake (frames moved one transmit at a time).
fn handshaken_with(config: &WorkerConfig) -> (HostSession, WorkerSession) {
    let mut host = HostSession::new(HostConfig::default(), Instant::now());
    let mut worker = WorkerSession::new(config);
    let hello = worker.poll_transmit().unwrap();
    host.handle_bytes(&hello.to_vec());
    assert!(matches!(host.poll_event(), Some(Event::Ready(_))));
    let welcome = host.poll_transmit().unwrap();
    worker.handle_bytes(&welcome.to_vec());
    assert!(matches!(
        worker.poll_event(),
        Some(WorkerEvent::Welcomed(_))
    ));
    (host, worker)
}

fn handshaken() -> (HostSession, WorkerSession) {
    handshaken_with(&WorkerConfig::new("demo", "1.0"))
}

fn host_violation(host: &mut HostSession) -> Option<ViolationCode> {
    std::iter::from_fn(|| host.poll_event()).find_map(|e| match e {
        Event::Closed(CloseReason::Violation(v)) => Some(v.code),
        _ => None,
    })
}

/// Moves one host transmit to the worker and returns the call it delivered.
fn deliver_call(host: &mut HostSession, worker: &mut WorkerSession) -> (CallId, Bytes) {
    let transmit = host.poll_transmit().expect("a Call transmit");
    worker.handle_bytes(&transmit.to_vec());
    match worker.poll_event() {
        Some(WorkerEvent::Call { id, body, .. }) => (id, body),
        other => panic!("expected a Call, got {other:?}"),
    }
}

#[test]
fn handshake_frames_built_by_the_sessions_are_the_spec_vectors() {
    let mut config = WorkerConfig::new("demo", "1.0");
    config.methods = vec!["echo".into(), "sum".into()];
    let mut worker = WorkerSession::new(&config);
    assert_eq!(
        worker.poll_transmit().unwrap().to_vec(),
        spec_frame("hello")
    );

    config.methods.clear();
    config.token = Some(SPEC_TOKEN);
    let mut worker = WorkerSession::new(&config);
    let hello = worker.poll_transmit().unwrap().to_vec();
    assert_eq!(hello, spec_frame("hello-token"));

    let mut host = HostSession::new(HostConfig::default(), Instant::now());
    host.handle_bytes(&hello);
    assert_eq!(
        host.poll_transmit().unwrap().to_vec(),
        spec_frame("welcome")
    );

    let mut host = HostSession::new(HostConfig::default(), Instant::now());
    host.handle_bytes(&encode_frame(&Frame::Hello(Hello {
        protocol: PROTOCOL_VERSION + 1,
        worker_name: "demo",
        worker_version: "1.0",
        methods: vec![],
        token: None,
    })));
    assert_eq!(host.poll_transmit().unwrap().to_vec(), spec_frame("refuse"));
}

#[test]
fn call_frames_built_by_the_sessions_are_the_spec_vectors() {
    let (mut host, mut worker) = handshaken();
    let id = host
        .begin_call(
            "echo",
            Bytes::from_static(b"hi"),
            deadline(),
            &mut SpecIdRng,
        )
        .unwrap();
    assert_eq!(id, SPEC_ID);
    let call = host.poll_transmit().unwrap();
    assert_eq!(call.to_vec(), spec_frame("call"));
    worker.handle_bytes(&call.to_vec());
    let _ = worker.poll_event();

    worker.reply_progress(id, Bytes::from_static(b"2")).unwrap();
    assert_eq!(
        worker.poll_transmit().unwrap().to_vec(),
        spec_frame("progress")
    );
    worker.reply_return(id, Bytes::from_static(b"hi")).unwrap();
    assert_eq!(
        worker.poll_transmit().unwrap().to_vec(),
        spec_frame("return")
    );

    let (mut host, mut worker) = handshaken();
    let id = host
        .begin_call("echo", Bytes::new(), deadline(), &mut SpecIdRng)
        .unwrap();
    deliver_call(&mut host, &mut worker);
    assert!(host.cancel(id));
    assert_eq!(host.poll_transmit().unwrap().to_vec(), spec_frame("cancel"));
    let error = RemoteError::new(ErrorKind::Panic, "boom").with_code(300);
    worker.reply_fail(id, &error).unwrap();
    assert_eq!(worker.poll_transmit().unwrap().to_vec(), spec_frame("fail"));

    host.shutdown();
    assert_eq!(
        host.poll_transmit().unwrap().to_vec(),
        spec_frame("shutdown")
    );
}

#[test]
fn real_body_vectors_are_what_the_real_encoders_send_and_decode_back() {
    // Host → worker: the request encoded as `Host::call::<Echo>` encodes it, framed by the
    // host session.
    let (mut host, mut worker) = handshaken();
    let request = Bytes::from(encoded(&echo_payload()));
    assert_eq!(
        &request[..],
        [0x02, b'h', b'i'],
        "a ByteBuf carries its own length"
    );
    let id = host
        .begin_call(Echo::NAME, request, deadline(), &mut SpecIdRng)
        .unwrap();
    let call = host.poll_transmit().unwrap().to_vec();
    assert_eq!(call, spec_frame("call-echo"));

    // The worker receives exactly the request's encoding, and it decodes to the request.
    worker.handle_bytes(&call);
    let Some(WorkerEvent::Call { body, .. }) = worker.poll_event() else {
        panic!("the worker did not receive the call");
    };
    let received: <Echo as Method>::Request = from_slice(&body, &Limits::default()).unwrap();
    assert_eq!(received, echo_payload());

    // Worker → host: the response encoded as the worker encodes a handler's answer.
    worker
        .reply_return(id, Bytes::from(encoded(&received)))
        .unwrap();
    let ret = worker.poll_transmit().unwrap().to_vec();
    assert_eq!(ret, spec_frame("return-echo"));
    host.handle_bytes(&ret);
    let Some(Event::Completed {
        outcome: Outcome::Returned(body),
        ..
    }) = host.poll_event()
    else {
        panic!("the host did not complete the call");
    };
    let response: <Echo as Method>::Response = from_slice(&body, &Limits::default()).unwrap();
    assert_eq!(response, echo_payload());

    // A dynamic `Value` body: its own tagged encoding, behind the field's length only.
    let (mut host, mut worker) = handshaken();
    host.begin_call(
        "echo",
        Bytes::from(value_request().to_vec()),
        deadline(),
        &mut SpecIdRng,
    )
    .unwrap();
    let call = host.poll_transmit().unwrap().to_vec();
    assert_eq!(call, spec_frame("call-value"));
    worker.handle_bytes(&call);
    let Some(WorkerEvent::Call { body, .. }) = worker.poll_event() else {
        panic!("the worker did not receive the call");
    };
    assert_eq!(
        Value::from_slice(&body, &Limits::default()).unwrap(),
        value_request()
    );
}

/// Body lengths on both sides of every varint-length boundary the head encoder must get right.
const BODY_LENS: [usize; 10] = [0, 1, 2, 127, 128, 300, 16_383, 16_384, 70_000, 2_097_152];

#[test]
fn head_and_body_split_is_byte_identical_to_encode_frame() {
    let mut rng = SeededRng(0x601d);
    let long_name: &'static str = "m".repeat(MAX_METHOD_NAME).leak();
    for method in ["e", "echo", long_name] {
        for len in BODY_LENS {
            let body = Bytes::from((0..len).map(|i| (i * 7 + 3) as u8).collect::<Vec<u8>>());
            let (mut host, mut worker) = handshaken();

            // Host → worker: Call, head built by the session, body shared.
            let id = host
                .begin_call(method, body.clone(), deadline(), &mut rng)
                .unwrap();
            let call = host.poll_transmit().unwrap();
            assert_eq!(
                call.to_vec(),
                encode_frame(&Frame::Call(Call {
                    id,
                    method,
                    body: &body
                })),
                "Call, method {method:?}, body {len} bytes"
            );
            assert_eq!(call.body.as_ptr(), body.as_ptr(), "Call body was copied");
            assert_eq!(call.len(), LENGTH_PREFIX + body_payload_len(method, len));
            worker.handle_bytes(&call.to_vec());
            let Some(WorkerEvent::Call {
                id: got,
                body: received,
                ..
            }) = worker.poll_event()
            else {
                panic!("the worker did not receive the call");
            };
            assert_eq!((got, &received), (id, &body));

            // Worker → host: Progress and Return, likewise.
            worker.reply_progress(id, body.clone()).unwrap();
            let progress = worker.poll_transmit().unwrap();
            assert_eq!(
                progress.to_vec(),
                encode_frame(&Frame::Progress(Progress {
                    id,
                    method,
                    body: &body
                })),
                "Progress, method {method:?}, body {len} bytes"
            );
            assert_eq!(
                progress.body.as_ptr(),
                body.as_ptr(),
                "Progress body was copied"
            );
            worker.reply_return(id, body.clone()).unwrap();
            let ret = worker.poll_transmit().unwrap();
            assert_eq!(
                ret.to_vec(),
                encode_frame(&Frame::Return(Return {
                    id,
                    method,
                    body: &body
                })),
                "Return, method {method:?}, body {len} bytes"
            );
            assert_eq!(ret.body.as_ptr(), body.as_ptr(), "Return body was copied");

            // And the host accepts both as what they are.
            host.handle_bytes(&progress.to_vec());
            host.handle_bytes(&ret.to_vec());
            assert_eq!(
                host.poll_event(),
                Some(Event::Progress {
                    id,
                    body: body.clone()
                })
            );
            assert_eq!(
                host.poll_event(),
                Some(Event::Completed {
                    id,
                    outcome: Outcome::Returned(body)
                })
            );
        }
    }
}

/// A body whose large `Blob` stays in its own buffer (`airlock_protocol::body`) is written as
/// the frame's head, the body's short lead, then the blob: the same bytes as the body encoded
/// whole, for a blob alone and for one that ends a struct, across varint-length boundaries.
#[test]
fn a_body_with_a_blob_left_in_its_buffer_is_byte_identical_to_encode_frame() {
    let mut rng = SeededRng(0xb10b);
    for len in [airlock_protocol::body::SPLICED_FROM, 70_000, 2_097_152] {
        let blob = Blob::from((0..len).map(|i| (i * 5 + 1) as u8).collect::<Vec<u8>>());
        let bodies = [
            airlock_protocol::reuse::encode_body(&blob).unwrap(),
            airlock_protocol::reuse::encode_body(&(7u32, "name", blob.clone())).unwrap(),
        ];
        for body in bodies {
            assert_eq!(body.tail().as_ptr(), blob.as_ptr(), "the blob was copied");
            let whole = body.to_vec();
            let (mut host, mut worker) = handshaken();
            let id = host
                .begin_call("echo", body.clone(), deadline(), &mut rng)
                .unwrap();
            let call = host.poll_transmit().unwrap();
            assert_eq!(call.body.as_ptr(), blob.as_ptr(), "Call body was copied");
            assert_eq!(
                call.to_vec(),
                encode_frame(&Frame::Call(Call {
                    id,
                    method: "echo",
                    body: &whole
                })),
                "Call, blob of {len} bytes"
            );
            worker.handle_bytes(&call.to_vec());
            let Some(WorkerEvent::Call { body: got, .. }) = worker.poll_event() else {
                panic!("the worker did not receive the call");
            };
            assert_eq!(got, whole);
            worker.reply_return(id, body).unwrap();
            let ret = worker.poll_transmit().unwrap();
            assert_eq!(ret.body.as_ptr(), blob.as_ptr(), "Return body was copied");
            assert_eq!(
                ret.to_vec(),
                encode_frame(&Frame::Return(Return {
                    id,
                    method: "echo",
                    body: &whole
                })),
                "Return, blob of {len} bytes"
            );
        }
    }
}

#[test]
fn whole_frames_built_by_the_sessions_are_byte_identical_to_encode_frame() {
    let mut rng = SeededRng(0xfa11);
    let (mut host, mut worker) = handshaken();
    let mut ids = Vec::new();
    for _ in 0..3 {
        host.begin_call("sum", Bytes::new(), deadline(), &mut rng)
            .unwrap();
        ids.push(deliver_call(&mut host, &mut worker).0);
    }
    let message = "é".repeat(MAX_ERROR_MESSAGE / 2);
    let errors = [
        RemoteError::new(ErrorKind::Internal, &message).with_code(u32::MAX),
        RemoteError::new(ErrorKind::Cancelled, "stopped\n"),
        RemoteError::new(ErrorKind::Limit, ""),
    ];
    for (&id, error) in ids.iter().zip(&errors) {
        assert!(host.cancel(id));
        assert_eq!(
            host.poll_transmit().unwrap().to_vec(),
            encode_frame(&Frame::Cancel(Cancel { id }))
        );
        worker.reply_fail(id, error).unwrap();
        assert_eq!(
            worker.poll_transmit().unwrap().to_vec(),
            encode_frame(&Frame::Fail(Fail {
                id,
                method: "sum",
                kind: error.kind().to_wire(),
                message: error.message(),
                code: error.code(),
            }))
        );
    }
}

/// What a body-carrying frame's length prefix says, computed independently of the crate.
fn body_payload_len(method: &str, body: usize) -> usize {
    let varint_len = |v: usize| (usize::BITS - (v | 1).leading_zeros()).div_ceil(7) as usize;
    1 + 16 + varint_len(method.len()) + method.len() + varint_len(body) + body
}
