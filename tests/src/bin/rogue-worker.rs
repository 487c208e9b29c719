//! `rogue-worker SCENARIO`: a worker that speaks the airlock protocol correctly until its
//! scenario tells it to misbehave. It is built from the protocol crate's own frame types where
//! it can and writes raw bytes where it must (a forged length prefix, a frame cut in half).
//!
//! Honest behaviour: every method is the identity on its own type, so the honest answer to a
//! `Call` is a `Return` carrying the request body unchanged; `pid` answers the process id and
//! `sleep` sleeps for the requested milliseconds first. The scenario strikes at the first call
//! (or where its name says otherwise), except `chaos`, where it strikes at a call of the
//! `misbehave` method, whose request names the scenario.
//!
//! Environment (the host passes it explicitly; its environment is otherwise empty):
//! - `ROGUE_ONCE=path`: misbehave only if `path` does not exist yet (creating it), so the
//!   replacement worker a supervisor starts behaves.
//! - `ROGUE_SPARE=path`: behave if `path` does not exist yet (creating it), before `ROGUE_ONCE`
//!   is consulted: the first worker is honest, the first replacement strikes. Lets a test aim a
//!   scenario at the supervisor's restart path.
//! - `ROGUE_MARK=path`: evidence the scenario writes, always *before* the act it evidences
//!   (after a hostile write the host may SIGKILL the rogue at any moment): "staged" before the
//!   forged frame of `predictable_id`; the grandchild's pid (`fork_grandchild`,
//!   `setsid_grandchild`, which marks `no grandchild: ERROR` if it could not start one); the
//!   hex of the frame about to be dribbled (`dribble`); `cancel <hex id>` once a `Cancel` it
//!   ignores has arrived (`ignore_cancel`); "closing" before it drops fd 1 (`close_write_side`);
//!   "sent" once all of `fat_updates`' updates and answers are written (after the act: the
//!   host only reads them, it has no reason to kill the rogue).
//! - `ROGUE_LOG=path`: written only by a worker that strikes. One line per event: `> HEX` for
//!   bytes written to the host, exactly as one `write` (a whole frame, a bare prefix, a single
//!   dribbled byte), and `< HEX` for each frame payload received (no length prefix).
//! - `ROGUE_PIDS=path`: every worker appends its pid and a newline as it starts, striking or not.
//! - `ROGUE_PREDICTED=path` (`predictable_id`): the 16 bytes of the id it forges.
//! - `ROGUE_LEADER_EXITS` (`fork_grandchild`, confined): the descendant's first thread exits
//!   alone while a second thread, under the descendant's name, runs on.
//! - `ROGUE_RELEASE=path` (`setsid_grandchild`): the rogue holds its last act until `path`
//!   exists (at most 10 s), so the test can catch the evidence while it still lives.
//!
//! `stall_read_in_kernel` also marks: "armed" once its trap page is registered and it waits
//! for the host's next bytes (or `no stall: ERROR` if the kernel refused the trap).
//!
//! Synchronous std I/O on purpose: the point is exact control over bytes and timing.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use airlock_protocol::frame::{encode_frame, Call, Fail, Frame, Hello, Progress, Return};
use airlock_protocol::{decode_frame, CallId, FrameDecoder, PROTOCOL_VERSION, TOKEN_LEN};
use airlock_test_support::{hex, varint};
use airlock_tests::e2e::session_of;
use airlock_transport_socket::{
    token_from_env, worker_inherited_blocking, AIRLOCK_SOCKET_FD, AIRLOCK_SOCKET_NAME,
};
use std::os::unix::net::UnixStream;

/// True if the host confined this process (it says so in the environment it sets up: the
/// request that a worker install its own filter, which the rogue ignores).
fn confined() -> bool {
    std::env::var_os("AIRLOCK_CONFINE_SELF").is_some()
}

/// Who this rogue is, in terms its host can check: its pid, or, when confined in a PID
/// namespace of its own (where its pid names nothing out there), a random number
/// above any pid, which it also takes as its command name (`air-<hex>`, seen by the host in
/// `/proc/<pid>/comm`; see `airlock_tests::e2e::process_alive`). Not the namespace's inode: the
/// kernel hands a freed one to the next namespace at once.
fn identity() -> u32 {
    static IDENTITY: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *IDENTITY.get_or_init(|| {
        let pid = std::process::id();
        if !confined() {
            return pid;
        }
        let id = loop {
            let mut bytes = [0u8; 4];
            if random_fill(&mut bytes).is_err() {
                break pid;
            }
            let id = u32::from_le_bytes(bytes);
            if id >= airlock_tests::e2e::PID_MAX_LIMIT {
                break id;
            }
        };
        take_name(id);
        id
    })
}

/// Random bytes from the OS.
fn random_fill(bytes: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open("/dev/urandom")?.read_exact(bytes)
}

/// Sets this thread's command name to `air-<id in hex>`.
fn take_name(id: u32) {
    if let Ok(name) = std::ffi::CString::new(format!("air-{id:08x}")) {
        let _ = rustix::thread::set_name(&name);
    }
}

struct Rogue {
    decoder: FrameDecoder,
    input: Box<dyn Read>,
    output: Box<dyn Write>,
    /// The socket, when the host chose a socket transport (`None`: stdin/stdout pipes).
    socket: Option<UnixStream>,
    /// The token a named socket's `Hello` must quote.
    token: Option<[u8; TOKEN_LEN]>,
    log: Option<std::fs::File>,
}

/// The channel the host set up, found the way the real worker finds it: a named socket if
/// `AIRLOCK_SOCKET_NAME` is set, an inherited one if `AIRLOCK_SOCKET_FD` is, else stdin/stdout.
fn open_channel() -> std::io::Result<Channel> {
    let socket = if let Some(name) = std::env::var_os(AIRLOCK_SOCKET_NAME) {
        UnixStream::connect(name)?
    } else if std::env::var_os(AIRLOCK_SOCKET_FD).is_some() {
        worker_inherited_blocking()?
    } else {
        return Ok(Channel {
            input: Box::new(std::io::stdin()),
            output: Box::new(std::io::stdout()),
            socket: None,
        });
    };
    Ok(Channel {
        input: Box::new(socket.try_clone()?),
        output: Box::new(socket.try_clone()?),
        socket: Some(socket),
    })
}

struct Channel {
    input: Box<dyn Read>,
    output: Box<dyn Write>,
    socket: Option<UnixStream>,
}

/// One call as received.
struct Received {
    id: CallId,
    method: String,
    body: Vec<u8>,
    raw: Vec<u8>,
}

impl Rogue {
    fn send_raw(&mut self, bytes: &[u8]) {
        if let Some(log) = &mut self.log {
            let _ = writeln!(log, "> {}", hex::encode(bytes));
        }
        // A host that killed us is not an error worth reporting.
        let _ = self.output.write_all(bytes);
        let _ = self.output.flush();
    }

    fn send(&mut self, frame: &Frame<'_>) {
        let bytes = encode_frame(frame);
        self.send_raw(&bytes);
    }

    /// The next frame payload from the host; `None` at end of stream.
    fn next_frame(&mut self) -> Option<Vec<u8>> {
        loop {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => {
                    if let Some(log) = &mut self.log {
                        let _ = writeln!(log, "< {}", hex::encode(&frame));
                    }
                    return Some(frame.to_vec());
                }
                Ok(None) => {}
                Err(_) => return None,
            }
            let mut chunk = [0u8; 65536];
            match self.input.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.decoder.extend(&chunk[..n]),
            }
        }
    }

    /// The next `Call` (skipping `Cancel`s); `None` at end of stream or `Shutdown`.
    fn next_call(&mut self) -> Option<Received> {
        loop {
            let raw = self.next_frame()?;
            match decode_frame(&raw) {
                Ok(Frame::Call(Call { id, method, body })) => {
                    return Some(Received {
                        id,
                        method: method.to_string(),
                        body: body.to_vec(),
                        raw: raw.clone(),
                    })
                }
                Ok(Frame::Shutdown(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    fn hello(&mut self, protocol: u32) {
        let hello = Hello {
            protocol,
            worker_name: "rogue-worker",
            worker_version: "1.0.0",
            methods: vec!["echo", "text", "tree", "shape", "pid", "sleep", "misbehave"],
            token: self.token.as_ref().map(|t| t.as_slice()),
        };
        let bytes = encode_frame(&Frame::Hello(hello));
        self.send_raw(&bytes);
    }

    /// Stops sending while keeping the process and its input alive: a socket is shut down for
    /// writing; over pipes, fd 1 is pointed at `/dev/null`.
    fn close_write_side(&mut self) {
        match &self.socket {
            Some(socket) => {
                let _ = socket.shutdown(std::net::Shutdown::Write);
            }
            None => {
                if let Ok(null) = std::fs::File::open("/dev/null") {
                    use std::os::fd::AsFd;
                    let _ = rustix::stdio::dup2_stdout(null.as_fd());
                }
            }
        }
    }

    /// Reads the `Welcome` (or anything) that answers the `Hello`.
    fn await_welcome(&mut self) -> bool {
        self.next_frame().is_some()
    }

    /// The honest answer to `call`.
    fn answer(&mut self, call: &Received) {
        let body = match call.method.as_str() {
            "pid" => airlock_codec::to_vec(&identity()).unwrap_or_default(),
            "sleep" => {
                let millis: u64 =
                    airlock_codec::from_slice(&call.body, &Default::default()).unwrap_or(0);
                std::thread::sleep(Duration::from_millis(millis));
                call.body.clone()
            }
            "misbehave" => airlock_codec::to_vec(&()).unwrap_or_default(),
            _ => call.body.clone(),
        };
        self.send(&Frame::Return(Return {
            id: call.id,
            method: &call.method,
            body: &body,
        }));
    }

    fn serve_honestly(&mut self) {
        while let Some(call) = self.next_call() {
            self.answer(&call);
        }
    }
}

/// A payload framed with a length prefix, with no check that it is a valid frame.
fn raw_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// A `Return` frame for `id`/`method` whose body is exactly `body`.
fn return_frame(id: CallId, method: &str, body: &[u8]) -> Vec<u8> {
    encode_frame(&Frame::Return(Return { id, method, body }))
}

/// Writes the evidence whole: to a side file first, then renamed into place, so a test polling
/// the mark never reads half of it.
fn mark_with(evidence: &[u8]) {
    if let Some(path) = std::env::var_os("ROGUE_MARK") {
        let path = std::path::PathBuf::from(path);
        let partial = path.with_extension("partial");
        if std::fs::write(&partial, evidence).is_ok() {
            let _ = std::fs::rename(&partial, &path);
        }
    }
}

/// Holds until the test creates `ROGUE_RELEASE` (or 10 s pass): the test has seen the evidence
/// `mark_with` wrote and the rogue may now do what would destroy it.
fn wait_for_release() {
    let Some(path) = std::env::var_os("ROGUE_RELEASE") else {
        return;
    };
    let path = std::path::PathBuf::from(path);
    for _ in 0..2000 {
        if path.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// The updates `tiny_updates` sends.
const TINY_UPDATES: usize = 1000;

/// The strings in each `wide_updates` update.
const WIDE_UPDATE_ITEMS: usize = 100_000;

/// The byte-string length of each `fat_updates` update: under a 64 KiB `max_frame`.
const FAT_UPDATE_LEN: usize = 60 * 1024;

/// The id a counter-based scheme would give the call after `id`.
fn next_counter_id(id: CallId) -> CallId {
    CallId::from_bytes(
        u128::from_be_bytes(id.to_bytes())
            .wrapping_add(1)
            .to_be_bytes(),
    )
}

/// Strikes with `scenario` at `call`. Scenarios that end the process (exit, or sleep for ever)
/// never return; the rest return once they have struck, and the caller goes on serving.
fn misbehave(rogue: &mut Rogue, scenario: &str, call: &Received) {
    let (id, method) = (call.id, call.method.as_str());
    match scenario {
        // ----- codec -----
        "return_len_bomb" => {
            // The body of a byte-string response claims 2^60 bytes.
            let body = varint::encode(1 << 60);
            rogue.send_raw(&return_frame(id, method, &body));
        }
        "header_len_bomb" => {
            // The method name's length prefix claims 2^40 bytes inside a small frame.
            let mut payload = vec![6u8];
            payload.extend_from_slice(&id.to_bytes());
            payload.extend(varint::encode(1 << 40));
            payload.extend_from_slice(b"echo");
            rogue.send_raw(&raw_frame(&payload));
        }
        "deep_nesting" => {
            // `Tree(Vec<Tree>)` nested 100,000 deep: one element per level.
            let mut body = vec![1u8; 100_000];
            body.push(0);
            rogue.send_raw(&return_frame(id, method, &body));
        }
        "invalid_utf8" => rogue.send_raw(&return_frame(id, method, &[3, b'a', 0xff, b'b'])),
        "bad_enum_tag" => rogue.send_raw(&return_frame(id, method, &[200, 1])),
        "trailing_bytes" => {
            let mut body = call.body.clone();
            body.extend_from_slice(b"smuggled");
            rogue.send_raw(&return_frame(id, method, &body));
        }
        "wrong_type_body" => {
            // A valid `sum` response (an i64), sent as the answer to `echo`.
            let body = airlock_codec::to_vec(&-7i64).unwrap_or_default();
            rogue.send_raw(&return_frame(id, method, &body));
        }
        // ----- framing -----
        "frame_over_cap" => rogue.send_raw(&u32::MAX.to_le_bytes()),
        "stall_prefix" => {
            // A prefix within the host's default cap (16 MiB + 4 KiB) that is never honoured.
            rogue.send_raw(&(16u32 << 20).to_le_bytes());
            rogue.send_raw(&[6; 10]);
            sleep_forever();
        }
        "dribble" => {
            // A valid, honest answer, one byte per 200 ms: only the deadline stops it.
            let bytes = return_frame(id, method, &call.body);
            mark_with(hex::encode(&bytes).as_bytes());
            for b in bytes {
                rogue.send_raw(&[b]);
                std::thread::sleep(Duration::from_millis(200));
            }
            sleep_forever();
        }
        "fast_dribble" => {
            // A valid, honest answer, one byte per 5 ms: inside any spin window.
            for b in return_frame(id, method, &call.body) {
                rogue.send_raw(&[b]);
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        "garbage_between_frames" => {
            rogue.answer(call);
            rogue.send_raw(&[3, 0, 0, 0, 0xde, 0xad, 0xbe]);
        }
        "eof_mid_frame" => {
            let bytes = return_frame(id, method, &call.body);
            rogue.send_raw(&bytes[..bytes.len() / 2]);
            std::process::exit(0);
        }
        // ----- correlation -----
        "random_id" => {
            let forged = CallId::from_bytes(*b"not-a-real-id-!!");
            rogue.send_raw(&return_frame(forged, method, &call.body));
        }
        "swapped_name" => {
            let other = if method == "echo" { "text" } else { "echo" };
            rogue.send_raw(&return_frame(id, other, &call.body));
        }
        "lie_between_answers" => {
            // Waits for two more calls, then writes an honest answer, a lie
            // (an empty body: not a byte string) for the call whose body names the liar, and
            // another honest answer, all in one write.
            let mut calls = vec![Received {
                id: call.id,
                method: call.method.clone(),
                body: call.body.clone(),
                raw: call.raw.clone(),
            }];
            while calls.len() < 3 {
                match rogue.next_call() {
                    Some(next) => calls.push(next),
                    None => return,
                }
            }
            let is_liar = |c: &Received| c.body.windows(4).any(|w| w == b"liar");
            let (liars, honest): (Vec<_>, Vec<_>) = calls.into_iter().partition(is_liar);
            let (Some(liar), [first, second]) = (liars.first(), honest.as_slice()) else {
                return;
            };
            let mut bytes = return_frame(first.id, &first.method, &first.body);
            bytes.extend_from_slice(&return_frame(liar.id, &liar.method, &[]));
            bytes.extend_from_slice(&return_frame(second.id, &second.method, &second.body));
            rogue.send_raw(&bytes);
        }
        "double_return" => {
            rogue.answer(call);
            rogue.answer(call);
        }
        "progress_after_return" => {
            rogue.answer(call);
            rogue.send(&Frame::Progress(Progress {
                id,
                method,
                body: b"late",
            }));
        }
        "replay_return" => {
            // Answer this call, then answer the next one with this one's frame.
            rogue.answer(call);
            let first = return_frame(id, method, &call.body);
            if rogue.next_call().is_some() {
                rogue.send_raw(&first);
            }
        }
        "predictable_id" => {
            // Answer honestly, then stage a forged answer for the id a counter scheme would
            // give the next call, before that call exists.
            rogue.answer(call);
            let predicted = next_counter_id(id);
            if let Some(dir) = std::env::var_os("ROGUE_PREDICTED") {
                let _ = std::fs::write(dir, predicted.to_bytes());
            }
            // Mark first: once the frame is out the host may SIGKILL us at any moment, so
            // nothing after the write is sure to run. The host's own record of the violation
            // is the proof that the frame landed.
            mark_with(b"staged");
            rogue.send_raw(&return_frame(predicted, method, b"\x06forged"));
        }
        "echo_call" => {
            rogue.send_raw(&raw_frame(&call.raw));
        }
        "progress_flood" => {
            for _ in 0..100_000 {
                rogue.send(&Frame::Progress(Progress {
                    id,
                    method,
                    body: b"p",
                }));
            }
        }
        "fat_updates" => {
            // Takes three more calls, then sends each of the four 16 updates of a 60 KiB byte
            // string (as many as a streaming caller's buffer holds, so the host's reader never
            // waits), then its honest answer; marks "sent" once every write is done.
            let mut rest = Vec::new();
            while rest.len() < 3 {
                match rogue.next_call() {
                    Some(next) => rest.push(next),
                    None => return,
                }
            }
            let mut body = varint::encode(FAT_UPDATE_LEN as u64);
            body.resize(body.len() + FAT_UPDATE_LEN, 0xab);
            for call in std::iter::once(call).chain(&rest) {
                for _ in 0..16 {
                    rogue.send(&Frame::Progress(Progress {
                        id: call.id,
                        method: &call.method,
                        body: &body,
                    }));
                }
                rogue.answer(call);
            }
            mark_with(b"sent");
        }
        "tiny_updates" | "tiny_updates_then_exit" => {
            // `TINY_UPDATES` updates of one byte each (a `None`, or a `u32` 0), written in one
            // go; marks "sent" once all are written, then answers honestly, or (`_then_exit`,
            // if the mark was not there before) exits unanswered, to be restarted.
            let exit = scenario == "tiny_updates_then_exit"
                && std::env::var_os("ROGUE_MARK")
                    .is_some_and(|mark| !std::path::Path::new(&mark).exists());
            let one = encode_frame(&Frame::Progress(Progress {
                id,
                method,
                body: &[0],
            }));
            let _ = rogue.output.write_all(&one.repeat(TINY_UPDATES));
            let _ = rogue.output.flush();
            mark_with(b"sent");
            if exit {
                std::process::exit(3);
            }
            rogue.answer(call);
        }
        "wide_updates" => {
            // 16 updates, each a list of `WIDE_UPDATE_ITEMS` empty strings (one byte each on
            // the wire, a whole `String` each decoded), then the honest answer; marks
            // "sent N" after each write.
            let mut body = varint::encode(WIDE_UPDATE_ITEMS as u64);
            body.resize(body.len() + WIDE_UPDATE_ITEMS, 0);
            for sent in 1..=16 {
                rogue.send(&Frame::Progress(Progress {
                    id,
                    method,
                    body: &body,
                }));
                mark_with(format!("sent {sent}").as_bytes());
            }
            rogue.answer(call);
        }
        "c1_value_answer" => {
            // A `Value` answer whose string holds a C1 control sequence (CSI as U+009B, which
            // JSON does not escape), a right-to-left override and DEL.
            let forged = airlock_codec::Value::Str(
                "\u{9b}2J\u{9b}31mFORGED: worker verified\u{9b}0m \u{202e}kcatta\u{7f}".into(),
            );
            rogue.send(&Frame::Return(Return {
                id,
                method,
                body: &forged.to_vec(),
            }));
        }
        "paced_progress" => {
            // 100 updates 8 ms apart (inside a 10 ms spin window), then the honest answer.
            for _ in 0..100 {
                rogue.send(&Frame::Progress(Progress {
                    id,
                    method,
                    body: b"p",
                }));
                std::thread::sleep(Duration::from_millis(8));
            }
            rogue.answer(call);
        }
        // ----- errors -----
        "fail_huge_message" => {
            let message = "x".repeat(1 << 20);
            rogue.send(&Frame::Fail(Fail {
                id,
                method,
                kind: 0,
                message: &message,
                code: None,
            }));
        }
        "fail_escape_sequences" => {
            let message = "\u{1b}[2J\u{1b}[1;31mFAKE HOST LOG: all workers healthy\u{1b}[0m\r\n";
            rogue.send(&Frame::Fail(Fail {
                id,
                method,
                kind: 0,
                message,
                code: None,
            }));
        }
        "fail_forbidden_kind" => {
            // A kind outside the closed set (a host-side outcome would need one).
            rogue.send(&Frame::Fail(Fail {
                id,
                method,
                kind: 99,
                message: "timed out",
                code: None,
            }));
        }
        // ----- process -----
        "exit_mid_call" => std::process::exit(3),
        "hang" => sleep_forever(),
        "return_then_exit" => {
            // An honest answer, then gone: the host reads the answer, then end of stream.
            rogue.answer(call);
            std::process::exit(0);
        }
        "ignore_cancel" => {
            // Keep reading, note the `Cancel` for this call, and never answer anything.
            while let Some(raw) = rogue.next_frame() {
                if let Ok(Frame::Cancel(cancel)) = decode_frame(&raw) {
                    if cancel.id == id {
                        mark_with(format!("cancel {}", hex::encode(&id.to_bytes())).as_bytes());
                    }
                }
            }
            sleep_forever();
        }
        "close_write_side" => {
            // Close only our sending side: the host's read side sees end of stream while this
            // process lives on, still holding its input.
            mark_with(b"closing");
            rogue.close_write_side();
            sleep_forever();
        }
        "fork_grandchild" => {
            // A grandchild inherits the channel and outlives us. (A socket channel is
            // close-on-exec; a hostile worker simply makes an inheritable copy first.)
            let _inheritable = rogue.socket.as_ref().and_then(|s| rustix::io::dup(s).ok());
            // Confined, the grandchild's pid names nothing for the host: it is this binary
            // again, taking a name the host can find (see `identity`).
            let confined = confined();
            let name = identity()
                .wrapping_add(1)
                .max(airlock_tests::e2e::PID_MAX_LIMIT);
            let child = if confined {
                std::env::current_exe().and_then(|exe| {
                    std::process::Command::new(exe)
                        .arg(NAMED_SLEEPER)
                        .arg(name.to_string())
                        .spawn()
                })
            } else {
                std::process::Command::new("sleep").arg("1000").spawn()
            };
            if let Ok(child) = child {
                let id = if confined { name } else { child.id() };
                mark_with(id.to_string().as_bytes());
                if confined {
                    // Leave only once the grandchild says it runs (at most 2 s).
                    if let Some(mark) = std::env::var_os("ROGUE_MARK") {
                        let mut up = mark;
                        up.push(".up");
                        let until = std::time::Instant::now() + Duration::from_secs(2);
                        while !std::path::Path::new(&up).exists()
                            && std::time::Instant::now() < until
                        {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
            }
            std::process::exit(0);
        }
        "setsid_grandchild" => {
            // A grandchild in a session (and process group) of its own, so a kill of our
            // group misses it; it keeps our stderr and writes to it. It is this binary again
            // (see `ESCAPED_GRANDCHILD`), so the scenario needs no other program and no PATH.
            let child = std::env::current_exe().and_then(|exe| {
                std::process::Command::new(exe)
                    .arg(ESCAPED_GRANDCHILD)
                    .spawn()
            });
            match child {
                Ok(child) => {
                    // Exit only once it has left our session, or the group kill would catch it.
                    // (Its session id becomes its own pid; ours may read as 0 inside a PID
                    // namespace, so compare with that, not with ours.)
                    for _ in 0..400 {
                        if session_of(child.id()) == Some(child.id()) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    mark_with(child.id().to_string().as_bytes());
                    // Our exit makes the host close the stderr pipe, and the grandchild's next
                    // write then fails and it exits: the test must see it alive first.
                    wait_for_release();
                }
                // Evidence of why there is no grandchild, for the test to print.
                Err(e) => mark_with(format!("no grandchild: {e}").as_bytes()),
            }
            std::process::exit(0);
        }
        "stderr_flood" => {
            for i in 0..20_000 {
                eprintln!("flood {i} \u{1b}[31m{}", "y".repeat(200));
            }
            rogue.answer(call);
        }
        "never_read" => sleep_forever(),
        "hold_output_pipe_lock" => {
            // Answers this call, then tries to hold its output pipe's lock inside the kernel
            // without `userfaultfd`: a `splice` from an empty, blocking Unix stream socket into
            // the pipe sleeps waiting for the socket with the pipe's lock held, so any `read(2)`
            // of the pipe's other end, non-blocking or not, sleeps with it. Marks `armed` just
            // before that splice, or why it cannot make one; serves honestly after.
            rogue.answer(call);
            std::thread::spawn(pipe_lock::hold_output);
        }
        "hold_stderr_lock" => {
            // Answers this call, then fills part of its stderr and at once tries to hold its
            // pipe in the kernel (a `splice` from an empty socket into it): a relay that
            // reads the pipe in chunks meets the held lock on its next read, and sleeps there
            // until this process dies. Marks `armed` just before that splice, or why it cannot
            // make one.
            rogue.answer(call);
            std::thread::spawn(pipe_lock::hold_stderr);
        }
        "stall_read_in_kernel" => {
            // The host's next bytes are read into a page whose fault nobody serves: the
            // `read(2)` sleeps inside the kernel holding the pipe's lock, and every `write(2)`
            // the host makes to that pipe sleeps on the lock too, non-blocking or not, until
            // this process dies.
            match kernel_stall::trap_page() {
                Ok(page) => {
                    mark_with(b"armed");
                    kernel_stall::read_into_trap(&page);
                }
                Err(e) => mark_with(format!("no stall: {e}").as_bytes()),
            }
            sleep_forever();
        }
        _ => {
            eprintln!("rogue-worker: unknown scenario {scenario:?}");
            std::process::exit(2);
        }
    }
}

/// A read that sleeps inside the kernel for as long as this process lives, through a
/// `userfaultfd` page whose missing-page fault is never served (the host must run the rogue
/// unconfined: the default confinement denies `userfaultfd`).
#[allow(unsafe_code)]
mod kernel_stall {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    const PAGE: usize = 4096;
    const UFFD_API: u64 = 0xaa;
    /// `_IOWR(0xaa, 0x3f, struct uffdio_api)` (24 bytes).
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    /// `_IOWR(0xaa, 0x00, struct uffdio_register)` (32 bytes).
    const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
    /// `_IO(0xaa, 0x00)` on `/dev/userfaultfd`.
    const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xaa00;
    const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;

    /// A registered, never-populated anonymous page and the `userfaultfd` that owns it (kept
    /// open: closing it would let the fault resolve).
    pub(super) struct Trap {
        address: *mut libc::c_void,
        _uffd: OwnedFd,
    }

    fn os_error(what: &str) -> std::io::Error {
        let err = std::io::Error::last_os_error();
        std::io::Error::new(err.kind(), format!("{what}: {err}"))
    }

    pub(super) fn trap_page() -> std::io::Result<Trap> {
        // SAFETY: plain system calls on descriptors and memory this function owns; every
        // pointer handed to the kernel points at a live, correctly sized local.
        unsafe {
            let mut fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) as libc::c_int;
            if fd < 0 {
                // Unprivileged `userfaultfd(2)` may be off; the device is governed by its mode.
                let dev = std::fs::File::open("/dev/userfaultfd")?;
                fd = libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW, libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(os_error("USERFAULTFD_IOC_NEW"));
                }
            }
            let uffd = OwnedFd::from_raw_fd(fd);
            let mut api = [UFFD_API, 0, 0];
            if libc::ioctl(uffd.as_raw_fd(), UFFDIO_API, api.as_mut_ptr()) < 0 {
                return Err(os_error("UFFDIO_API"));
            }
            let address = libc::mmap(
                std::ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if address == libc::MAP_FAILED {
                return Err(os_error("mmap"));
            }
            let mut register = [address as u64, PAGE as u64, UFFDIO_REGISTER_MODE_MISSING, 0];
            if libc::ioctl(uffd.as_raw_fd(), UFFDIO_REGISTER, register.as_mut_ptr()) < 0 {
                return Err(os_error("UFFDIO_REGISTER"));
            }
            Ok(Trap {
                address,
                _uffd: uffd,
            })
        }
    }

    /// Waits until the host has written something to stdin, then reads it into the trap.
    pub(super) fn read_into_trap(trap: &Trap) {
        let stdin = std::io::stdin();
        let mut fds = [rustix::event::PollFd::new(
            &stdin,
            rustix::event::PollFlags::IN,
        )];
        let _ = rustix::event::poll(&mut fds, None);
        // SAFETY: the page is mapped for `PAGE` bytes and owned by `trap`, which outlives the
        // call; the call never returns (its fault is never served).
        unsafe {
            libc::read(0, trap.address, PAGE);
        }
    }
}

/// The argument that makes this binary the escaped grandchild of `setsid_grandchild`.
const ESCAPED_GRANDCHILD: &str = "--escaped-grandchild";

/// The escaped grandchild: leaves the worker's session (and so its process group), then writes
/// to the stderr it inherited until a write fails (the host closed its read end).
fn escaped_grandchild() -> ExitCode {
    if let Err(e) = rustix::process::setsid() {
        eprintln!("escaped grandchild: setsid failed: {e}");
        return ExitCode::FAILURE;
    }
    let mut stderr = std::io::stderr();
    while stderr.write_all(b"escaped grandchild writing\n").is_ok() {
        std::thread::sleep(Duration::from_millis(50));
    }
    ExitCode::SUCCESS
}

/// The argument that makes this binary the impostor of `impostor_first`.
const IMPOSTOR: &str = "--impostor";

/// `rogue-worker --named-sleeper ID`: leaves its session, takes the name `identity` would give
/// `ID`, then sleeps. With [`LEADER_EXITS`] set, a second thread, which has the name too,
/// sleeps, and the first thread exits alone (on cgroup v1, `/proc/<pid>/cgroup` then names the root
/// of every hierarchy, while the process runs on in its cgroup).
const NAMED_SLEEPER: &str = "--named-sleeper";

/// The variable that makes a named sleeper's first thread exit alone.
const LEADER_EXITS: &str = "ROGUE_LEADER_EXITS";

/// Ending the calling thread alone, as no safe API does for a process's first thread (a
/// return from `main` ends the process).
#[allow(unsafe_code)]
mod first_thread {
    pub(super) fn exit_alone() -> ! {
        // SAFETY: the raw `exit` system call ends only the calling thread; nothing of this
        // thread is used after it (no destructor runs, and no other thread borrows from it).
        unsafe {
            libc::syscall(libc::SYS_exit, 0);
        }
        unreachable!("SYS_exit returned")
    }
}

/// The impostor: another process holding the worker's socket name and token (inherited from
/// the worker's environment), which connects and says a valid `Hello` quoting that token. It
/// marks `impostor refused TOKENHEX` if the host closed the connection without a word, or
/// `impostor answered TOKENHEX` if anything came back.
fn impostor() -> ExitCode {
    let (Some(name), Some(token)) = (std::env::var_os(AIRLOCK_SOCKET_NAME), token_from_env())
    else {
        mark_with(b"impostor has no name or token");
        return ExitCode::FAILURE;
    };
    let mut socket = match UnixStream::connect(name) {
        Ok(socket) => socket,
        Err(e) => {
            mark_with(format!("impostor could not connect: {e}").as_bytes());
            return ExitCode::FAILURE;
        }
    };
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        worker_name: "rogue-worker",
        worker_version: "1.0.0",
        methods: vec!["echo", "pid"],
        token: Some(&token),
    };
    let _ = socket.write_all(&encode_frame(&Frame::Hello(hello)));
    let _ = socket.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reply = [0u8; 1];
    let verdict = match socket.read(&mut reply) {
        Ok(1) => "answered",
        _ => "refused",
    };
    mark_with(format!("impostor {verdict} {}", hex::encode(&token)).as_bytes());
    ExitCode::SUCCESS
}

/// `impostor_first` (named socket): the worker lets an impostor try its luck before it
/// connects itself, and waits until the impostor has its verdict.
fn send_an_impostor_first() {
    if let Ok(exe) = std::env::current_exe() {
        let _ = std::process::Command::new(exe).arg(IMPOSTOR).status();
    }
}

fn main() -> ExitCode {
    // The files a scene's workers leave for its test are shared by all of them, and the
    // workers of different hosts run under different uids: every file is everyone's to write.
    rustix::process::umask(rustix::fs::Mode::empty());
    let scenario = std::env::args().nth(1).unwrap_or_else(|| "honest".into());
    if scenario == ESCAPED_GRANDCHILD {
        return escaped_grandchild();
    }
    if scenario == IMPOSTOR {
        return impostor();
    }
    if scenario == NAMED_SLEEPER {
        // Out of the worker's session and process group too: only its PID namespace holds it.
        let _ = rustix::process::setsid();
        if let Some(id) = std::env::args().nth(2).and_then(|id| id.parse().ok()) {
            take_name(id);
        }
        // Evidence that it runs under its name, out of the session: `<ROGUE_MARK>.up`.
        let up = std::env::var_os("ROGUE_MARK").map(|mark| {
            let mut up = mark;
            up.push(".up");
            up
        });
        if std::env::var_os(LEADER_EXITS).is_some() {
            // A second thread (which takes the first's name as it is made) runs on; the
            // first exits alone.
            std::thread::spawn(|| std::thread::sleep(Duration::from_secs(1000)));
            if let Some(up) = up {
                let _ = std::fs::write(up, b"up");
            }
            first_thread::exit_alone();
        }
        if let Some(up) = up {
            let _ = std::fs::write(up, b"up");
        }
        std::thread::sleep(Duration::from_secs(1000));
        return ExitCode::SUCCESS;
    }
    // Take the name first, before anything else runs.
    let _ = identity();
    if let Some(path) = std::env::var_os("ROGUE_PIDS") {
        if let Ok(mut pids) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = pids.write_all(format!("{}\n", identity()).as_bytes());
        }
    }
    let first_time = |var: &str| {
        std::env::var_os(var).map(|path| {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .is_ok()
        })
    };
    let spared = first_time("ROGUE_SPARE").unwrap_or(false);
    let strike = !spared && first_time("ROGUE_ONCE").unwrap_or(true);
    let scenario = if strike { scenario } else { "honest".into() };
    let log = std::env::var_os("ROGUE_LOG")
        .filter(|_| strike)
        .and_then(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .ok()
        });
    if scenario == "impostor_first" {
        send_an_impostor_first();
    }
    let channel = match open_channel() {
        Ok(channel) => channel,
        Err(e) => {
            eprintln!("rogue-worker: no channel to the host: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut rogue = Rogue {
        decoder: FrameDecoder::new(64 * 1024 * 1024),
        input: channel.input,
        output: channel.output,
        socket: channel.socket,
        token: token_from_env(),
        log,
    };
    match scenario.as_str() {
        "frame_before_hello" => {
            rogue.send_raw(&return_frame(CallId::from_bytes([7; 16]), "echo", b""));
            sleep_forever();
        }
        "wrong_version" => {
            rogue.hello(PROTOCOL_VERSION + 41);
            let _ = rogue.await_welcome();
            sleep_forever();
        }
        "no_hello" => sleep_forever(),
        _ => {}
    }
    rogue.hello(PROTOCOL_VERSION);
    if !rogue.await_welcome() {
        return ExitCode::FAILURE;
    }
    match scenario.as_str() {
        "honest" | "impostor_first" => rogue.serve_honestly(),
        "chaos" => {
            while let Some(call) = rogue.next_call() {
                if call.method == "misbehave" {
                    let chosen: String = airlock_codec::from_slice(&call.body, &Default::default())
                        .unwrap_or_default();
                    misbehave(&mut rogue, &chosen, &call);
                } else {
                    rogue.answer(&call);
                }
            }
        }
        "never_read" => sleep_forever(),
        "drip_read" => {
            // Reads the host's frames a little at a time, forever: the host's writes always
            // progress, never finish in time.
            let mut chunk = [0u8; 4096];
            loop {
                if matches!(rogue.input.read(&mut chunk), Ok(0) | Err(_)) {
                    sleep_forever();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        other => {
            let Some(call) = rogue.next_call() else {
                return ExitCode::SUCCESS;
            };
            misbehave(&mut rogue, other, &call);
            // A scenario that returns has struck and lives on: it serves honestly after.
            rogue.serve_honestly();
        }
    }
    ExitCode::SUCCESS
}

/// A `splice` that never ends, into fd 1 (the channel's output pipe) or fd 2 (stderr),
/// holding its lock where it is a pipe.
#[allow(unsafe_code)]
mod pipe_lock {
    use std::io::Write as _;

    use super::mark_with;

    /// Holds fd 1 once the host has read the answer already written to it (the pipe is
    /// empty), so that the answer to the call before the hold always arrives: the test's
    /// attack is on the calls after it.
    pub(super) fn hold_output() {
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < give_up {
            let mut waiting: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int, into a local sized for it.
            let rc = unsafe { libc::ioctl(1, libc::FIONREAD, &mut waiting) };
            if rc != 0 || waiting == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        hold(1);
    }

    /// Writes more than one read of the host's relay takes (8 KiB), so that the relay reads
    /// again without waiting to be woken, then holds fd 2.
    pub(super) fn hold_stderr() {
        let line = format!("{}\n", "s".repeat(99));
        let _ = std::io::stderr().write_all(line.repeat(320).as_bytes());
        hold(2);
    }

    fn hold(fd: libc::c_int) {
        let mut pair = [0 as libc::c_int; 2];
        let null = std::ptr::null_mut();
        // SAFETY: plain system calls on a local array and descriptors this function owns.
        unsafe {
            if libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) != 0 {
                let err = std::io::Error::last_os_error();
                return mark_with(format!("no hold: socketpair: {err}").as_bytes());
            }
            // A first splice that does not wait says whether the filter allows them at all.
            if libc::splice(pair[0], null, fd, null, 1, libc::SPLICE_F_NONBLOCK) < 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EAGAIN) {
                    return mark_with(format!("no hold: splice: {err}").as_bytes());
                }
            }
            mark_with(b"armed");
            // Nobody ever writes to the other end: this sleeps until the process dies.
            libc::splice(pair[0], null, fd, null, 1, 0);
        }
    }
}
