//! A worker that cannot start says which program, why, and what to check: a missing or
//! non-executable program is named; a program that exits before its `Hello` brings its last
//! stderr lines (bounded and cleaned) into the error; one that writes to its stdout, which is
//! the channel, is asked whether it is an airlock worker; a silent one times out naming the
//! deadline and the setting that changes it. Each under the default confinement and without.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock_host::{
    Confinement, ConfinementError, ConfinementStep, HandshakeError, Host, HostBuilder, HostConfig,
    LostReason, SpawnError, ViolationCode, STDERR_TAIL_LINES,
};

/// A scratch directory of shell scripts, removed on drop.
struct Scripts(PathBuf);

impl Scripts {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("airlock-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// Writes `body` as a `/bin/sh` script named `name`, executable when `executable`.
    fn script(&self, name: &str, body: &str, executable: bool) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        let mode = if executable { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }
}

impl Drop for Scripts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The two confinements every diagnostic is checked under: the default, with the shell's
/// own directories opened so a script can run, and none.
fn confinements() -> [(&'static str, Confinement); 2] {
    [
        (
            "strict",
            Confinement::strict().read_only("/bin").read_only("/usr"),
        ),
        ("none", Confinement::none()),
    ]
}

fn builder(program: &Path, confinement: Confinement) -> HostBuilder {
    Host::builder(program).confinement(confinement)
}

async fn spawn_error(builder: HostBuilder) -> SpawnError {
    match builder.spawn().await {
        Ok(host) => {
            host.shutdown().await;
            panic!("the worker started");
        }
        Err(err) => err,
    }
}

async fn handshake_error(builder: HostBuilder) -> HandshakeError {
    match spawn_error(builder).await {
        SpawnError::Handshake(failure) => failure,
        other => panic!("expected a handshake failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_is_named_in_the_error() {
    let missing = Path::new("/nonexistent/airlock/my-worker");
    for (mode, confinement) in confinements() {
        let err = spawn_error(builder(missing, confinement)).await;
        let message = err.to_string();
        match &err {
            SpawnError::Exec { program, source } => {
                assert_eq!(program, missing, "{mode}");
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound, "{mode}");
            }
            other => panic!("{mode}: expected Exec, got {other:?}"),
        }
        assert!(
            message.contains("/nonexistent/airlock/my-worker"),
            "{mode}: {message}"
        );
        assert!(message.contains("check the path"), "{mode}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_is_not_executable_is_named_with_what_to_check() {
    let scripts = Scripts::new("not-executable");
    let program = scripts.script("plain-file", "exit 0", false);
    for (mode, confinement) in confinements() {
        let err = spawn_error(builder(&program, confinement)).await;
        let message = err.to_string();
        assert!(
            matches!(&err, SpawnError::Exec { program: named, source }
                if named == &program && source.kind() == std::io::ErrorKind::PermissionDenied),
            "{mode}: {err:?}"
        );
        assert!(
            message.contains(&program.display().to_string()),
            "{mode}: {message}"
        );
        assert!(message.contains("is it executable?"), "{mode}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_exits_before_its_hello_brings_its_last_stderr_lines() {
    let scripts = Scripts::new("exits-early");
    // Thirty lines, the last of them the reason, one with a terminal escape and a bidi
    // override that must not reach the error as live text.
    let program = scripts.script(
        "exits-early",
        "i=1\nwhile [ $i -le 28 ]; do echo \"loading part $i\" >&2; i=$((i+1)); done\n\
         printf 'colour \\033[31mred\\342\\200\\256gnp.exe\\n' >&2\n\
         echo 'config file missing: /etc/my-worker.toml' >&2\nexit 3",
        true,
    );
    for (mode, confinement) in confinements() {
        let failure = handshake_error(builder(&program, confinement)).await;
        assert_eq!(
            failure.reason,
            LostReason::Exited(airlock_host::ExitInfo {
                code: Some(3),
                signal: None
            }),
            "{mode}"
        );
        assert_eq!(failure.program, program, "{mode}");
        assert_eq!(
            failure.stderr.len(),
            STDERR_TAIL_LINES,
            "{mode}: {failure:?}"
        );
        assert_eq!(
            failure.stderr.last().map(String::as_str),
            Some("config file missing: /etc/my-worker.toml"),
            "{mode}"
        );
        assert_eq!(
            failure.stderr[0], "loading part 21",
            "{mode}: the tail is the last lines"
        );
        let escaped = &failure.stderr[STDERR_TAIL_LINES - 2];
        assert!(
            !escaped.contains('\u{1b}') && !escaped.contains('\u{202e}'),
            "{mode}: {escaped:?}"
        );
        assert!(escaped.contains("red"), "{mode}: {escaped:?}");
        let message = failure.to_string();
        assert!(
            message.contains(&program.display().to_string()),
            "{mode}: {message}"
        );
        assert!(
            message.contains("config file missing: /etc/my-worker.toml"),
            "{mode}: {message}"
        );
        assert!(
            message.contains("is this an airlock worker?"),
            "{mode}: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_prints_to_stdout_is_asked_whether_it_is_an_airlock_worker() {
    let scripts = Scripts::new("prints");
    let program = scripts.script(
        "prints",
        "echo 'starting my worker' >&2\necho 'hello world'\nsleep 5",
        true,
    );
    for (mode, confinement) in confinements() {
        let started = Instant::now();
        let failure = handshake_error(builder(&program, confinement)).await;
        // Refused from the first four bytes ("hell" is a length over the handshake's cap),
        // not after the handshake deadline.
        assert!(started.elapsed() < Duration::from_secs(3), "{mode}");
        assert!(
            matches!(&failure.reason, LostReason::Violation(v) if v.code == ViolationCode::FrameTooLarge),
            "{mode}: {failure:?}"
        );
        assert!(failure.channel_is_stdout, "{mode}");
        let message = failure.to_string();
        assert!(
            message.contains("is this an airlock worker? it wrote to stdout"),
            "{mode}: {message}"
        );
        assert!(
            message.contains(&program.display().to_string()),
            "{mode}: {message}"
        );
        assert!(message.contains("starting my worker"), "{mode}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_program_times_out_naming_the_deadline_and_its_setting() {
    let deadline = Duration::from_millis(400);
    for (mode, confinement) in confinements() {
        let started = Instant::now();
        let failure = handshake_error(
            builder(Path::new("/bin/cat"), confinement)
                .protocol(HostConfig::default().handshake_timeout(deadline).unwrap()),
        )
        .await;
        let took = started.elapsed();
        assert!(
            took >= deadline && took < Duration::from_secs(3),
            "{mode}: {took:?}"
        );
        assert_eq!(failure.reason, LostReason::HandshakeTimeout, "{mode}");
        assert_eq!(failure.handshake_timeout, deadline, "{mode}");
        let message = failure.to_string();
        assert!(message.contains("/bin/cat"), "{mode}: {message}");
        assert!(message.contains("400ms"), "{mode}: {message}");
        assert!(
            message.contains("HostConfig::handshake_timeout"),
            "{mode}: {message}"
        );
    }
}

/// A step that fails inside the sandbox's init (here `setrlimit`: a new user namespace may not
/// raise the descriptor limit above the host's hard limit) is named at once, as the failed
/// step. The keeper must not wait for the worker's status that init, failing, never wrote:
/// the spawn holds that pipe open until the keeper ends, and waits for the keeper once told
/// of the failure (else the answer is the spawner's `NoAnswer`, after its deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_fails_in_the_sandboxs_init_is_named_at_once() {
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .expect("the descriptor limit is finite");
    let policy = Confinement::strict().max_open_files(hard + 1);
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        spawn_error(Host::builder(airlock_tests::e2e::worker_bin()).confinement(policy)),
    )
    .await
    .expect("the spawn answered");
    match &err {
        SpawnError::Confinement(ConfinementError::Step { step, source }) => {
            assert_eq!(*step, ConfinementStep::ResourceLimits, "{err}");
            assert_eq!(source.raw_os_error(), Some(libc::EPERM), "{err}");
        }
        other => panic!(
            "expected the failed step, got {other:?} after {:?}",
            started.elapsed()
        ),
    }
}
