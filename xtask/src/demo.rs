//! `cargo xtask demo`: the README's first command.
//!
//! Part one builds the bundled `airlock-worker` and the tests' `rogue-worker` and
//! `attack-worker`, then runs the
//! host demo (`host/examples/demo.rs`): typed calls to a real spawned worker, a panic as data,
//! a hung worker killed and replaced at its deadline, and hostile workers refused with their
//! violation codes. Then the confinement demo (`tests/examples/confinement_demo.rs`): a
//! hostile worker reads a secret, connects out, signals and traces its host and forges its
//! sibling's answer unconfined, and is refused each time under the default confinement.
//!
//! Part two shows the codec alone: a few honest replies decode, the classic hostile ones
//! become typed errors. It fails if any hostile input is accepted, or is refused for a reason
//! other than the one it demonstrates.

use airlock_codec::{from_slice, to_vec, DecodeError, Key, Limits, Value};
use serde::{Deserialize, Serialize};

use crate::run::{self, cargo, Error, Result};

/// A reply a host might expect from a worker.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct Reply {
    id: u64,
    name: String,
    tags: Vec<String>,
}

/// A recursive reply shape, to show typed decoding is depth-limited too.
#[derive(Serialize, Deserialize, Debug)]
enum Tree {
    Leaf,
    Node(Vec<Tree>),
}

/// Which decoder a case feeds.
enum Target {
    Reply,
    Tree,
    Value,
}

struct Case {
    what: &'static str,
    target: Target,
    input: Vec<u8>,
    expect: fn(&DecodeError) -> bool,
}

pub fn main(args: &[String]) -> Result {
    if let Some(arg) = args.first() {
        return Err(Error::usage(format!("demo: unknown argument `{arg}`")));
    }
    host_demo()?;
    println!();
    codec_demo()
}

/// Builds the worker binaries (bundled, rogue and attack) and runs the demos against them.
fn host_demo() -> Result {
    run::run(&mut cargo([
        "build",
        "--locked",
        "-p",
        "airlock-worker",
        "--bin",
        "airlock-worker",
        "-p",
        "airlock-tests",
        "--bin",
        "rogue-worker",
        "--bin",
        "attack-worker",
    ]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| run::root().join("target"));
    let bin_dir = target.join("debug");
    let worker = bin_dir.join("airlock-worker");
    let rogue = bin_dir.join("rogue-worker");
    let mut demo = cargo([
        "run",
        "--quiet",
        "--locked",
        "-p",
        "airlock-host",
        "--example",
        "demo",
        "--",
    ]);
    demo.arg(worker).arg(rogue);
    run::run(&mut demo)?;
    println!();
    let mut confinement = cargo([
        "run",
        "--quiet",
        "--locked",
        "-p",
        "airlock-tests",
        "--example",
        "confinement_demo",
        "--",
    ]);
    confinement.arg(bin_dir.join("attack-worker"));
    run::run(&mut confinement)
}

fn codec_demo() -> Result {
    let limits = Limits::default();
    println!("airlock codec demo: honest replies decode, hostile ones become typed errors.");
    println!(
        "limits: max_bytes {} B, max_depth {}, max_items {}, max_len {} B\n",
        limits.bytes_budget(),
        limits.depth_budget(),
        limits.items_budget(),
        limits.len_budget()
    );

    println!("honest replies");
    let reply = Reply {
        id: 7,
        name: "seven".into(),
        tags: vec!["odd".into(), "prime".into()],
    };
    let bytes = to_vec(&reply).map_err(|e| Error::new(format!("demo: encode failed: {e}")))?;
    let reply_back = from_slice::<Reply>(&bytes, &limits);
    println!("  typed  {reply:?}");
    println!("         = {}", hex(&bytes));
    println!("         -> {reply_back:?}");
    let value = Value::Map(
        [
            (Key::from("ok"), Value::Bool(true)),
            (
                Key::from("n"),
                Value::List(vec![Value::I64(-1), Value::F64(0.5)]),
            ),
        ]
        .into_iter()
        .collect(),
    );
    let bytes = value.to_vec();
    let back = Value::from_slice(&bytes, &limits);
    println!("  value  {value:?}");
    println!("         = {}", hex(&bytes));
    println!("         -> {back:?}\n");
    if reply_back.as_ref() != Ok(&reply) || back.as_ref() != Ok(&value) {
        return Err(Error::new("demo: an honest reply did not round-trip"));
    }

    println!("hostile replies");
    let mut surprises = Vec::new();
    let cases = cases();
    for case in &cases {
        let outcome = match case.target {
            Target::Reply => from_slice::<Reply>(&case.input, &limits).map(|r| format!("{r:?}")),
            Target::Tree => from_slice::<Tree>(&case.input, &limits).map(|_| "a Tree".into()),
            Target::Value => Value::from_slice(&case.input, &limits).map(|v| format!("{v:?}")),
        };
        let target = match case.target {
            Target::Reply => "Reply",
            Target::Tree => "Tree",
            Target::Value => "Value",
        };
        println!("  {} (as {target})", case.what);
        println!("         = {}", hex(&case.input));
        match outcome {
            Err(error) => {
                println!("         -> refused: {error}  [{error:?}]");
                if !(case.expect)(&error) {
                    surprises.push(format!(
                        "{}: refused for another reason: {error:?}",
                        case.what
                    ));
                }
            }
            Ok(decoded) => {
                println!("         -> ACCEPTED: {decoded}");
                surprises.push(format!("{}: accepted", case.what));
            }
        }
    }
    if surprises.is_empty() {
        println!(
            "\nall {} hostile replies were refused with a typed error, each for the reason shown.",
            cases.len()
        );
        Ok(())
    } else {
        Err(Error::new(format!("demo: {}", surprises.join("; "))))
    }
}

fn cases() -> Vec<Case> {
    const BOMB: [u8; 5] = [0xff, 0xff, 0xff, 0xff, 0x0f]; // varint 4,294,967,295
    let seven = [7, 5, b's', b'e', b'v', b'e', b'n'];
    vec![
        Case {
            what: "length-prefix bomb: 12 bytes claim 4,294,967,295 tags",
            target: Target::Reply,
            input: [&seven[..], &BOMB].concat(),
            expect: |e| {
                matches!(
                    e,
                    DecodeError::ItemLimit { .. } | DecodeError::UnexpectedEnd { .. }
                )
            },
        },
        Case {
            what: "length-prefix bomb: a 4 GiB name in 9 bytes",
            target: Target::Reply,
            input: [&[7][..], &BOMB, b"abc"].concat(),
            expect: |e| {
                matches!(
                    e,
                    DecodeError::LengthLimit { .. } | DecodeError::UnexpectedEnd { .. }
                )
            },
        },
        Case {
            what: "deep nesting: 100,000 lists inside each other",
            target: Target::Value,
            input: [&[0x08, 0x01].repeat(100_000)[..], &[0x00]].concat(),
            expect: |e| matches!(e, DecodeError::DepthLimit { .. }),
        },
        Case {
            what: "deep nesting: 100,000 typed tree nodes",
            target: Target::Tree,
            input: [1, 1].repeat(100_000),
            expect: |e| matches!(e, DecodeError::DepthLimit { .. }),
        },
        Case {
            what: "invalid UTF-8 in a string",
            target: Target::Reply,
            input: vec![7, 2, 0xc3, 0x28, 0],
            expect: |e| matches!(e, DecodeError::InvalidUtf8),
        },
        Case {
            what: "trailing bytes after a complete reply",
            target: Target::Reply,
            input: [&seven[..], &[0, 0xde, 0xad]].concat(),
            expect: |e| matches!(e, DecodeError::TrailingBytes { count: 2 }),
        },
        Case {
            what: "overlong varint: 7 written in two bytes",
            target: Target::Reply,
            input: [&[0x87, 0x00][..], &seven[1..], &[0]].concat(),
            expect: |e| matches!(e, DecodeError::OverlongVarint),
        },
        Case {
            what: "overflowing varint: an id wider than 64 bits",
            target: Target::Reply,
            input: [&[0xff; 9][..], &[0x7f], &seven[1..], &[0]].concat(),
            expect: |e| matches!(e, DecodeError::VarintOverflow),
        },
        Case {
            what: "a Python pickle that would call os.system",
            target: Target::Value,
            input: b"cos\nsystem\n(S'echo pwned'\ntR.".to_vec(),
            expect: |e| matches!(e, DecodeError::BadValueTag(b'c')),
        },
        Case {
            what: "a reply over max_bytes (17 MiB)",
            target: Target::Value,
            input: vec![0; 17 * 1024 * 1024],
            expect: |e| matches!(e, DecodeError::InputTooLong { .. }),
        },
    ]
}

/// Hex of at most the first 24 bytes, with the total length when cut.
fn hex(bytes: &[u8]) -> String {
    const SHOWN: usize = 24;
    let mut out: Vec<String> = bytes
        .iter()
        .take(SHOWN)
        .map(|b| format!("{b:02x}"))
        .collect();
    if bytes.len() > SHOWN {
        out.push(format!("... ({} bytes)", bytes.len()));
    }
    out.join(" ")
}
