//! Socket security, end to end with real processes: only the worker the host started becomes
//! its peer (invariant 9).
//!
//! The hostile parties are `airlock-test-peer` processes (see `src/bin/`): a squatter that
//! connects first and stalls, a process that stole the token, clients with a wrong or replayed
//! token, a client running as another user, and an earlier run that died and left its name.

use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use airlock_protocol::transport::{FrameReceiver, FrameSender, Transport};
use airlock_protocol::{decode_frame, Frame};
use airlock_tests::support::{pass_socket_fd, pattern, raw_frame};
use airlock_transport_socket::{
    encode_token, inherited_pair, AcceptError, Accepted, NamedConfig, NamedListener,
    PeerExpectation, PrivateDir, Refusal, SocketTransport, StreamConfig, AIRLOCK_TOKEN,
    DEFAULT_CANDIDATE_TIMEOUT,
};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

const PEER: &str = env!("CARGO_BIN_EXE_airlock-test-peer");
const STEP: Duration = Duration::from_secs(10);

/// A spawned `airlock-test-peer`, reading its report lines.
struct Peer {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Peer {
    /// Runs `airlock-test-peer ROLE` with exactly the environment `env`.
    fn spawn(role: &str, env: &[(&str, OsString)]) -> Self {
        let mut cmd = Command::new(PEER);
        cmd.arg(role).env_clear().envs(env.iter().cloned());
        Self::start(cmd)
    }

    fn start(cmd: Command) -> Self {
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn airlock-test-peer");
        drop(cmd); // closes our copies of anything passed to the child
        let stdout = child.stdout.take().expect("stdout");
        Self {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Waits for the next report line and checks it.
    async fn expect(&mut self, want: &str) {
        let line = tokio::time::timeout(STEP, self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("peer said nothing within {STEP:?}; wanted {want:?}"))
            .expect("read peer stdout");
        assert_eq!(line.as_deref(), Some(want), "peer report");
    }

    /// Waits for a `hello` peer to report that the host closed its connection (whether or not
    /// its `Hello` got out first).
    async fn expect_closed(&mut self) {
        let mut line = self.next_line().await;
        if line.as_deref() == Some("sent") {
            line = self.next_line().await;
        }
        assert_eq!(line.as_deref(), Some("closed"), "peer report");
    }

    async fn next_line(&mut self) -> Option<String> {
        tokio::time::timeout(STEP, self.lines.next_line())
            .await
            .expect("peer line")
            .expect("read peer stdout")
    }

    async fn exit(mut self) -> ExitStatus {
        tokio::time::timeout(STEP, self.child.wait())
            .await
            .expect("peer exit")
            .expect("wait")
    }
}

fn deadline() -> Instant {
    Instant::now() + STEP
}

/// The worker's channel works both ways: a frame sent is echoed back.
async fn assert_echoes(transport: SocketTransport) {
    let (mut send, mut recv) = transport.split();
    let body = pattern(4096);
    send.send(&[raw_frame(body.clone())]).await.expect("send");
    let back = tokio::time::timeout(STEP, recv.recv())
        .await
        .expect("echo in time")
        .expect("recv")
        .expect("frame");
    assert_eq!(back, body);
}

/// The `Hello` the listener handed over is the worker's, with the listener's token.
fn assert_hello_has_token(accepted: &Accepted, token: &[u8; 32]) {
    match decode_frame(&accepted.hello).expect("hello decodes") {
        Frame::Hello(hello) => assert_eq!(hello.token, Some(&token[..])),
        other => panic!("expected Hello, got {other:?}"),
    }
}

fn assert_name_removed(name: &Path, dir: &Path) {
    assert!(
        !name.exists(),
        "socket {} outlived the accept",
        name.display()
    );
    assert!(
        !dir.exists(),
        "directory {} outlived the accept",
        dir.display()
    );
}

#[tokio::test]
async fn silent_squatter_connecting_first_does_not_delay_the_worker() {
    let listener = NamedListener::bind(NamedConfig::default()).expect("bind");
    let (name, dir, token, env) = (
        listener.name().to_owned(),
        listener.dir().to_owned(),
        *listener.token(),
        listener.env(),
    );
    // Same user, knows the name, connects first, never speaks.
    let mut squatter = Peer::spawn("squat", &env[..1]);
    squatter.expect("connected").await;
    let mut worker = Peer::spawn("worker", &env);

    let started = Instant::now();
    let accepted = listener
        .accept_worker(PeerExpectation::current_user(), deadline())
        .await
        .expect("the worker gets in");
    let took = started.elapsed();
    assert!(
        took < DEFAULT_CANDIDATE_TIMEOUT,
        "the squatter held up the worker for {took:?}"
    );
    assert_eq!(accepted.peer_pid, Some(worker.pid()));
    assert_eq!(accepted.refused, 1);
    assert_eq!(accepted.refusals, [Refusal::Superseded]);
    assert_hello_has_token(&accepted, &token);
    squatter.expect("closed").await;
    assert_name_removed(&name, &dir);

    worker.expect("ready").await;
    assert_echoes(accepted.transport).await;
    worker.expect("done").await;
    assert!(worker.exit().await.success());
}

#[tokio::test]
async fn process_holding_the_stolen_token_is_refused_by_pid() {
    let listener = NamedListener::bind(NamedConfig::default()).expect("bind");
    let env = listener.env();
    // Same user, and it has the real token (a same-user process can read another's
    // environment): only the pid tells it from the worker the host spawned.
    let mut thief = Peer::spawn("hello", &env);
    thief.expect("sent").await;
    let mut worker = Peer::spawn("worker", &env);

    let accepted = listener
        .accept_worker(PeerExpectation::process(worker.pid()), deadline())
        .await
        .expect("the worker gets in");
    assert_eq!(accepted.peer_pid, Some(worker.pid()));
    assert_eq!(
        accepted.refusals,
        [Refusal::WrongPid {
            expected: worker.pid(),
            got: Some(thief.pid())
        }]
    );
    thief.expect("closed").await;
    worker.expect("ready").await;
    assert_echoes(accepted.transport).await;
    worker.expect("done").await;
}

#[tokio::test]
async fn wrong_and_replayed_tokens_are_refused() {
    // A token from an earlier listener: it was real once.
    let earlier = NamedListener::bind(NamedConfig::default()).expect("bind");
    let old_token = *earlier.token();
    drop(earlier);

    let listener = NamedListener::bind(NamedConfig::default()).expect("bind");
    let env = listener.env();
    let name = env[0].clone();
    let token = *listener.token();
    assert_ne!(token, old_token);
    let accept = tokio::spawn(listener.accept_worker(PeerExpectation::current_user(), deadline()));

    let mut wrong = token;
    wrong[0] ^= 0x80;
    for bad in [wrong, old_token] {
        let mut peer = Peer::spawn(
            "hello",
            &[name.clone(), (AIRLOCK_TOKEN, encode_token(&bad).into())],
        );
        peer.expect("sent").await;
        peer.expect("closed").await; // refused and closed before the worker even starts
    }
    let mut no_token = Peer::spawn("hello", std::slice::from_ref(&name));
    no_token.expect("sent").await;
    no_token.expect("closed").await;

    let mut worker = Peer::spawn("worker", &env);
    let accepted = accept.await.expect("join").expect("the worker gets in");
    assert_eq!(accepted.peer_pid, Some(worker.pid()));
    assert_eq!(
        accepted.refusals,
        [
            Refusal::WrongToken,
            Refusal::WrongToken,
            Refusal::MissingToken
        ]
    );
    assert_hello_has_token(&accepted, &token);

    // After the accept the name is gone: even the right token is too late now.
    let mut late = Peer::spawn("connect", &env);
    late.expect("error NotFound").await;

    worker.expect("ready").await;
    assert_echoes(accepted.transport).await;
}

#[tokio::test]
async fn a_dead_processs_connection_is_not_taken_for_the_pid_it_had() {
    // A process connects with the real token and exits; the kernel goes on naming its pid as
    // the connection's peer. Once that number passes to the worker (a pid-reuse race a
    // same-uid process can win), the credentials and the token together would pass the ghost off as the
    // worker. Here the pid is expected directly: the same checks the race would face.
    let listener = NamedListener::bind(NamedConfig::default()).expect("bind");
    let env = listener.env();
    let mut ghost = Peer::spawn("hello_and_exit", &env);
    ghost.expect("sent").await;
    let pid = ghost.pid();
    // Exited and reaped: its pid is free for the kernel to hand out again.
    assert!(ghost.exit().await.success());

    let result = listener
        .accept_worker(
            PeerExpectation::process(pid),
            Instant::now() + Duration::from_millis(500),
        )
        .await;
    // Live: the refusal is the check after the credentials, so the kernel's credentials named
    // the dead process's pid and uid exactly as expected; its Hello carried the real token.
    match result {
        Err(AcceptError::Deadline { refusals, .. }) => {
            assert_eq!(refusals, [Refusal::ConnectorExited { pid }])
        }
        other => panic!("expected the ghost's connection refused, got {other:?}"),
    }
}

#[tokio::test]
async fn a_silent_connection_from_the_worker_does_not_end_the_wait() {
    // A refusal, even of a connection from the expected pid, is not a verdict: the worker may
    // connect again and say its Hello in time.
    let listener =
        NamedListener::bind(NamedConfig::default().candidate_timeout(Duration::from_millis(100)))
            .expect("bind");
    let env = listener.env();
    let mut worker = Peer::spawn("squat_then_work", &env);
    let accepted = listener
        .accept_worker(PeerExpectation::process(worker.pid()), deadline())
        .await
        .expect("the worker gets in on its second connection");
    assert_eq!(accepted.refusals, [Refusal::HelloTimeout]);
    worker.expect("closed").await;
    worker.expect("ready").await;
    assert_echoes(accepted.transport).await;
}

/// Runs `airlock-test-peer` as uid/gid 65534 through `setpriv`, or says why it cannot.
fn as_nobody(role: &str, env: &[(&str, OsString)]) -> Result<Command, String> {
    let mut cmd = Command::new(airlock_tests::support::setpriv()?);
    cmd.args(airlock_tests::support::AS_NOBODY)
        .args([PEER, role])
        .env_clear()
        .envs(env.iter().cloned());
    Ok(cmd)
}

#[tokio::test]
async fn another_user_is_refused_by_directory_and_by_uid() {
    // Can uid 65534 run the peer at all here? (Usage error, exit 64, means it ran.)
    let probe = match as_nobody("", &[]) {
        Ok(mut cmd) => cmd.stdout(Stdio::null()).stderr(Stdio::null()).status(),
        Err(reason) => {
            println!("SKIPPED another_user_is_refused_by_directory_and_by_uid: {reason}");
            return;
        }
    };
    if probe.as_ref().ok().and_then(|s| s.code()) != Some(64) {
        println!("SKIPPED another_user_is_refused_by_directory_and_by_uid: uid 65534 cannot execute {PEER} ({probe:?})");
        return;
    }

    let listener = NamedListener::bind(NamedConfig::default()).expect("bind");
    let env = listener.env();
    let token = *listener.token();

    // Layer 1: the 0700 directory. The other user cannot even reach the socket.
    let mut outsider = Peer::start(as_nobody("connect", &env).expect("setpriv"));
    outsider.expect("error PermissionDenied").await;
    assert!(!outsider.exit().await.success());

    // Layer 2, shown on its own: open the directory and socket up (test only), and give the
    // other user the right token. The credential check still refuses it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(listener.dir(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(listener.name(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let accept = tokio::spawn(listener.accept_worker(PeerExpectation::current_user(), deadline()));
    let mut outsider = Peer::start(as_nobody("hello", &env).expect("setpriv"));
    outsider.expect_closed().await;

    let mut worker = Peer::spawn("worker", &env);
    let accepted = accept.await.expect("join").expect("the worker gets in");
    let me = rustix::process::geteuid().as_raw();
    assert_eq!(
        accepted.refusals,
        [Refusal::WrongUid {
            expected: me,
            got: 65534
        }]
    );
    assert_eq!(accepted.peer_uid, me);
    assert_hello_has_token(&accepted, &token);
    worker.expect("ready").await;
    assert_echoes(accepted.transport).await;
}

#[tokio::test]
async fn name_left_by_a_dead_run_is_never_reused() {
    let parent = PrivateDir::create_random_in(&std::env::temp_dir()).expect("scratch");
    // An earlier run: it binds, and dies without cleaning up.
    let mut earlier = Peer::start({
        let mut cmd = Command::new(PEER);
        cmd.arg("listen").arg(parent.path()).env_clear();
        cmd
    });
    let stale_name = PathBuf::from(earlier.next_line().await.expect("name"));
    earlier.child.kill().await.expect("kill");
    let stale_dir = stale_name.parent().expect("dir").to_owned();
    assert!(stale_name.exists(), "the dead run left its socket behind");

    let listener =
        NamedListener::bind(NamedConfig::default().parent_dir(parent.path())).expect("bind");
    assert_ne!(listener.dir(), stale_dir);
    assert_ne!(listener.name(), stale_name);
    // The leftover is neither reused nor touched, and nobody answers on it.
    assert!(stale_name.exists());
    let stale = std::os::unix::net::UnixStream::connect(&stale_name);
    assert_eq!(
        stale.expect_err("a dead name answers").kind(),
        std::io::ErrorKind::ConnectionRefused
    );

    let env = listener.env();
    let token = *listener.token();
    let mut worker = Peer::spawn("worker", &env);
    let accepted = listener
        .accept_worker(PeerExpectation::process(worker.pid()), deadline())
        .await
        .expect("the worker gets in");
    assert_eq!(accepted.refused, 0);
    assert_hello_has_token(&accepted, &token);
    worker.expect("ready").await;
    assert_echoes(accepted.transport).await;

    std::fs::remove_file(&stale_name).unwrap();
    std::fs::remove_dir(&stale_dir).unwrap();
}

#[test]
fn planted_symlink_or_entry_is_never_followed_or_reused() {
    let parent = PrivateDir::create_random_in(&std::env::temp_dir()).expect("scratch");
    let victim = parent.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    let planted = [
        ("to-dir", Some(victim.clone())),
        ("dangling", Some(parent.path().join("would-be-created"))),
        ("plain-dir", None),
    ];
    for (name, target) in &planted {
        let path = parent.path().join(name);
        match target {
            Some(target) => std::os::unix::fs::symlink(target, &path).unwrap(),
            None => std::fs::create_dir(&path).unwrap(),
        }
        let err = PrivateDir::create_in(parent.path(), name.as_ref()).expect_err(name);
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists, "{name}");
    }
    assert!(!parent.path().join("would-be-created").exists());
    assert_eq!(
        std::fs::read_dir(&victim).unwrap().count(),
        0,
        "victim touched"
    );
    for (name, target) in planted {
        let path = parent.path().join(name);
        if target.is_some() {
            std::fs::remove_file(path).unwrap();
        } else {
            std::fs::remove_dir(path).unwrap();
        }
    }
    std::fs::remove_dir(victim).unwrap();
}

#[tokio::test]
async fn inherited_worker_speaks_through_fd_3() {
    let (transport, child_end) = inherited_pair(StreamConfig::default()).expect("pair");
    let mut cmd = Command::new(PEER);
    cmd.arg("worker").env_clear();
    pass_socket_fd(&mut cmd, child_end);
    let mut worker = Peer::start(cmd);

    let (mut send, mut recv) = transport.split();
    let hello = tokio::time::timeout(STEP, recv.recv())
        .await
        .expect("hello in time")
        .expect("recv")
        .expect("frame");
    assert!(matches!(
        decode_frame(&hello),
        Ok(Frame::Hello(h)) if h.token.is_none()
    ));
    worker.expect("ready").await;
    let body = pattern(100_000);
    send.send(&[raw_frame(body.clone())]).await.expect("send");
    assert_eq!(recv.recv().await.expect("recv").expect("frame"), body);
    drop(send); // end of stream: the worker finishes
    worker.expect("done").await;
    assert!(worker.exit().await.success());
    assert_eq!(recv.recv().await.expect("clean end"), None);
}

#[tokio::test]
async fn worker_refuses_a_descriptor_that_is_not_its_socket() {
    // Nothing passed at fd 3: the number then belongs to the worker's own runtime (its epoll
    // descriptor), which is refused, not stolen.
    let mut cmd = Command::new(PEER);
    cmd.arg("worker").env_clear();
    let nothing = Peer::start(cmd);
    assert_eq!(nothing.exit().await.code(), Some(2));

    // A pipe at fd 3: refused, not adopted.
    let (pipe_read, _pipe_write) = rustix::pipe::pipe().expect("pipe");
    let mut cmd = Command::new(PEER);
    cmd.arg("worker").env_clear();
    pass_socket_fd(&mut cmd, pipe_read);
    let pipe = Peer::start(cmd);
    assert_eq!(pipe.exit().await.code(), Some(2));

    // A standard stream named explicitly.
    let stdio = Peer::spawn("worker", &[("AIRLOCK_SOCKET_FD", "1".into())]);
    assert_eq!(stdio.exit().await.code(), Some(2));
}

/// How many of this process's descriptors are open on `path`.
fn open_fds_on(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target == path)
        .count()
}

/// Whether this kernel has `SO_PASSRIGHTS` (Linux 6.16+), by which the host's sockets refuse
/// passed descriptors at the sender; says so when it does not, for the tests that need it.
fn kernel_refuses_passed_descriptors() -> bool {
    let release = rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    let has_it = version >= (6, 16);
    if !has_it {
        eprintln!("skipped: Linux {release} has no SO_PASSRIGHTS (6.16+)");
    }
    has_it
}

/// Sends `frame` on `socket` with `fd` attached (`SCM_RIGHTS`).
fn send_passing(socket: impl AsFd, frame: &[u8], fd: BorrowedFd<'_>) -> rustix::io::Result<usize> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
    sendmsg(
        socket,
        &[IoSlice::new(frame)],
        &mut control,
        SendFlags::empty(),
    )
}

/// Sends `frame` on `socket` with a descriptor for `path` attached, then closes the sender's
/// own copy: afterwards the only way that descriptor exists in this process is if a receiver
/// accepted it. The send's result is returned.
fn send_with_passed_fd(socket: impl AsFd, frame: &[u8], path: &Path) -> rustix::io::Result<usize> {
    let file = OwnedFd::from(std::fs::File::open(path).expect("open"));
    send_passing(socket, frame, file.as_fd())
}

/// Whether the pipe whose read end is `read` has no write end left anywhere (a read of an
/// empty pipe then sees end of stream instead of `EAGAIN`).
fn writers_gone(read: &OwnedFd) -> bool {
    match rustix::io::read(read, &mut [0u8; 1]) {
        Ok(0) => true,
        Err(rustix::io::Errno::AGAIN) => false,
        other => panic!("the test pipe holds no data: {other:?}"),
    }
}

#[tokio::test]
async fn descriptors_passed_as_ancillary_data_are_never_accepted() {
    if !kernel_refuses_passed_descriptors() {
        return;
    }
    let scratch = PrivateDir::create_random_in(&std::env::temp_dir()).expect("scratch");
    let secret = scratch.path().join("passed-file");
    std::fs::File::create(&secret)
        .and_then(|mut f| f.write_all(b"x"))
        .unwrap();
    let frame = raw_frame(pattern(64)).to_vec();

    // The tripwire is live: a receiver that does ask for control messages gets the descriptor,
    // and the scan sees it.
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    assert_eq!(send_with_passed_fd(&a, &frame, &secret), Ok(frame.len()));
    assert_eq!(
        open_fds_on(&secret),
        0,
        "in flight, not yet in this process"
    );
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut buf = [0u8; 256];
    recvmsg(
        &b,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::empty(),
    )
    .expect("recvmsg");
    let received: Vec<OwnedFd> = control
        .drain()
        .filter_map(|msg| match msg {
            RecvAncillaryMessage::ScmRights(fds) => Some(fds.collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(received.len(), 1);
    assert_eq!(
        open_fds_on(&secret),
        1,
        "the scan sees an accepted descriptor"
    );
    drop(received);

    // The transport: the worker's send carrying a descriptor is refused whole, and the frames
    // it sends without one arrive.
    let (transport, worker_end) = inherited_pair(StreamConfig::default()).expect("pair");
    assert_eq!(
        send_with_passed_fd(&worker_end, &frame, &secret),
        Err(rustix::io::Errno::PERM)
    );
    assert_eq!(
        rustix::net::send(&worker_end, &frame, SendFlags::empty()),
        Ok(frame.len())
    );
    let (_send, mut recv) = transport.split();
    let got = recv.recv().await.expect("recv").expect("frame");
    assert_eq!(got, pattern(64));
    assert_eq!(
        open_fds_on(&secret),
        0,
        "the transport accepted a passed descriptor"
    );
    drop(worker_end);
    assert_eq!(recv.recv().await.expect("clean end"), None);
    std::fs::remove_file(&secret).unwrap();
}

/// A descriptor a peer attaches to its bytes, where the receiver allows it, is closed by the
/// receiver's own `recv` even without a control buffer: on the host's thread, where closing a
/// pipe waits for a lock its sender may hold (SECURITY.md). The host's ends refuse the send
/// instead, over an inherited pair and over a named listener's connections (set on the
/// listener, so it holds from `connect`, before the host accepts).
#[tokio::test]
async fn a_worker_cannot_make_the_host_close_a_descriptor_it_passes() {
    if !kernel_refuses_passed_descriptors() {
        return;
    }
    let frame = raw_frame(pattern(64)).to_vec();

    // Live: the receiver's plain `recv` is what closes the passed pipe end.
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let (pipe_read, pipe_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::NONBLOCK).expect("pipe");
    assert_eq!(
        send_passing(&a, &frame, pipe_write.as_fd()),
        Ok(frame.len())
    );
    drop(pipe_write);
    assert!(!writers_gone(&pipe_read), "the end in flight is still open");
    let mut buf = [0u8; 256];
    assert_eq!(
        rustix::net::recv(&b, &mut buf, RecvFlags::empty()).map(|(n, _)| n),
        Ok(frame.len())
    );
    assert!(writers_gone(&pipe_read), "the receiver's recv closed it");

    // An inherited pair's host end: refused at the send, so nothing is left for the host to
    // close.
    let (_transport, worker_end) = inherited_pair(StreamConfig::default()).expect("pair");
    let (pipe_read, pipe_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::NONBLOCK).expect("pipe");
    assert_eq!(
        send_passing(&worker_end, &frame, pipe_write.as_fd()),
        Err(rustix::io::Errno::PERM)
    );
    drop(pipe_write);
    assert!(writers_gone(&pipe_read), "nothing of it was queued");

    // A named listener: a connection not yet accepted is refused too.
    let listener = NamedListener::bind(NamedConfig::default()).expect("bind");
    let early = std::os::unix::net::UnixStream::connect(listener.name()).expect("connect");
    let (pipe_read, pipe_write) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::NONBLOCK).expect("pipe");
    assert_eq!(
        send_passing(&early, &frame, pipe_write.as_fd()),
        Err(rustix::io::Errno::PERM)
    );
    drop(pipe_write);
    assert!(writers_gone(&pipe_read), "nothing of it was queued");
}

/// A connection takes its listener's `SO_PASSRIGHTS` as it connects, so a listener that set it
/// after `listen` left a window in which a process that can reach the private directory (the
/// host's uid, or root) kept the right to pass descriptors. Races `NamedListener::bind` with a
/// thread that connects to every listener it finds and tries to pass one: a listener that
/// refused from `listen` on refuses every connection. (With the setting made after `listen`,
/// one bind in about sixteen let a descriptor through in a review's 3,000 tries.)
#[tokio::test]
async fn a_connection_racing_the_listeners_bind_cannot_pass_descriptors() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    if !kernel_refuses_passed_descriptors() {
        return;
    }
    let parent = PrivateDir::create_random_in(&std::env::temp_dir()).expect("parent");
    let parent_path = parent.path().to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let (connected, passed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let racer = {
        let (stop, connected, passed) = (stop.clone(), connected.clone(), passed.clone());
        std::thread::spawn(move || {
            let (_read, write) = rustix::pipe::pipe().expect("pipe");
            let frame = raw_frame(pattern(8)).to_vec();
            while !stop.load(Ordering::Relaxed) {
                let Ok(entries) = std::fs::read_dir(&parent_path) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let name = entry.path().join("sock");
                    for _ in 0..50 {
                        let Ok(socket) = std::os::unix::net::UnixStream::connect(&name) else {
                            continue;
                        };
                        connected.fetch_add(1, Ordering::Relaxed);
                        if send_passing(&socket, &frame, write.as_fd()).is_ok() {
                            passed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        })
    };
    let config = NamedConfig::default().parent_dir(parent.path());
    let mut binds = 0;
    while binds < 400 || connected.load(Ordering::Relaxed) == 0 {
        let listener = NamedListener::bind(config.clone()).expect("bind");
        tokio::task::yield_now().await;
        drop(listener);
        binds += 1;
        assert!(binds < 20_000, "the racer never connected");
    }
    stop.store(true, Ordering::Relaxed);
    racer.join().expect("racer");
    assert_eq!(
        passed.load(Ordering::Relaxed),
        0,
        "of {} connections racing {binds} binds",
        connected.load(Ordering::Relaxed)
    );
}

/// End to end: a real worker spawned over each socket transport tries to pass a descriptor on
/// every Unix stream socket it holds. The host's end refuses each send (`EPERM`), nothing
/// reaches the host, and the worker's next call is answered.
#[tokio::test(flavor = "current_thread")]
async fn a_spawned_worker_cannot_pass_its_host_a_descriptor() {
    use airlock_host::{CallError, Confinement, Host, TransportChoice};
    use airlock_tests::attack::Attack;
    use airlock_tests::e2e::attack_bin;
    if !kernel_refuses_passed_descriptors() {
        return;
    }
    for transport in [
        TransportChoice::SocketInherited,
        TransportChoice::SocketNamed,
    ] {
        let host = Host::builder(attack_bin())
            .confinement(Confinement::none())
            .transport(transport)
            .spawn()
            .await
            .expect("the attack worker starts");
        let deadline = || Instant::now() + STEP;
        let attempt = ("pass_fd_to_host".to_string(), String::new());
        let outcome = host
            .call_with_deadline::<Attack>(&attempt, deadline())
            .await;
        let Err(CallError::Remote(refusal)) = &outcome else {
            panic!("{transport:?}: a descriptor went out, or the call failed: {outcome:?}");
        };
        let text = refusal.to_string();
        assert!(
            text.contains("sendmsg refused: fd"),
            "{transport:?}: {text}"
        );
        assert_eq!(
            text.matches("fd ").count(),
            text.matches("Operation not permitted").count(),
            "{transport:?}: every send refused with EPERM: {text}"
        );
        let read = ("read".to_string(), "/proc/self/status".to_string());
        let again = host.call_with_deadline::<Attack>(&read, deadline()).await;
        assert!(
            again.is_ok(),
            "{transport:?}: the worker is still usable: {again:?}"
        );
        host.shutdown().await;
    }
}

#[tokio::test]
async fn listener_removes_its_name_on_deadline_and_on_drop() {
    let listener = NamedListener::bind(NamedConfig::default()).expect("bind");
    let (name, dir) = (listener.name().to_owned(), listener.dir().to_owned());
    assert!(name.exists() && dir.exists());
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&name)
        .expect("the socket file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the socket file is its owner's alone");
    let started = Instant::now();
    let result = listener
        .accept_worker(
            PeerExpectation::current_user(),
            Instant::now() + Duration::from_millis(200),
        )
        .await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(
            result,
            Err(airlock_transport_socket::AcceptError::Deadline { refused: 0, .. })
        ),
        "{result:?}"
    );
    assert_name_removed(&name, &dir);

    let listener = NamedListener::bind(NamedConfig::default()).expect("bind");
    let (name, dir) = (listener.name().to_owned(), listener.dir().to_owned());
    drop(listener);
    assert_name_removed(&name, &dir);
}
