//! An unconfined worker (`Confinement::none()`, started without a fork: cloned sharing the
//! host's memory, then `exec`ed) starts as a forked one would: holding only its stdio (and
//! the channel at fd 3 on the inherited socket) even when the host holds a descriptor that
//! is not close-on-exec, with only the environment it was given, in the directory it was
//! given, its program found in its own `PATH`; a missing program fails with `ENOENT`; and
//! how it ended (a code, a signal) comes back as the `ExitInfo` of the handshake failure.
//!
//! The worker program is `sleep` with an argument unique to the test, found among this
//! process's children by its command line and inspected from outside through `/proc` while
//! the host waits for a `Hello` that never comes.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::time::Duration;

use airlock_host::{Confinement, ExitInfo, Host, HostBuilder, LostReason, SpawnError};
use airlock_tests::e2e::wait_until;

/// A `sleep` argument no other process has: 1000 seconds and a fraction naming the test.
fn unique_sleep(test: u32) -> String {
    format!("1000.{}{test:03}", std::process::id())
}

/// The unconfined `sleep` worker, sleeping `argument` seconds.
fn sleeper(program: impl Into<PathBuf>, argument: &str) -> HostBuilder {
    Host::builder(program.into())
        .confinement(Confinement::none())
        .arg(argument)
}

/// The pid of this process's child whose command line is `sleep argument`.
fn child_sleeping(argument: &str) -> Option<u32> {
    let wanted = format!("\0{argument}\0");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let parent = status.lines().find_map(|l| l.strip_prefix("PPid:"))?.trim();
            (String::from_utf8_lossy(&cmdline).contains(&wanted)
                && parent == std::process::id().to_string())
            .then_some(pid)
        })
}

/// What a started worker holds, read from outside.
struct Seen {
    descriptors: Vec<u32>,
    environment: Vec<OsString>,
    cwd: PathBuf,
}

/// Spawns `builder` (whose worker runs `sleep argument`), reads what the worker holds, then
/// kills it with `signal`; returns what was seen and how the spawn failed.
async fn inspect_then_kill(
    builder: HostBuilder,
    argument: &str,
    signal: rustix::process::Signal,
) -> (Seen, SpawnError) {
    let spawning = tokio::spawn(builder.spawn());
    let mut pid = None;
    wait_until("the sleeping worker", Duration::from_secs(10), || {
        pid = child_sleeping(argument);
        pid.is_some()
    })
    .await;
    let pid = pid.expect("found");
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let mut descriptors: Vec<u32> = std::fs::read_dir(proc_dir.join("fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    descriptors.sort_unstable();
    let mut environment: Vec<OsString> = std::fs::read(proc_dir.join("environ"))
        .unwrap()
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| OsString::from_vec(v.to_vec()))
        .collect();
    environment.sort();
    let cwd = std::fs::read_link(proc_dir.join("cwd")).unwrap();
    let target = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(target, signal).unwrap();
    let err = match spawning.await.unwrap() {
        Ok(host) => {
            host.shutdown().await;
            panic!("sleep said hello");
        }
        Err(err) => err,
    };
    let seen = Seen {
        descriptors,
        environment,
        cwd,
    };
    (seen, err)
}

fn exited(err: &SpawnError) -> Option<ExitInfo> {
    match err {
        SpawnError::Handshake(failure) => match failure.reason {
            LostReason::Exited(info) => Some(info),
            _ => None,
        },
        _ => None,
    }
}

/// A descriptor the host opened without close-on-exec, as code that is not airlock's may.
fn leaky_descriptor() -> std::os::fd::OwnedFd {
    // `open` without O_CLOEXEC: rustix adds nothing of its own.
    let fd = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let flags = rustix::io::fcntl_getfd(&fd).unwrap();
    assert!(
        !flags.contains(rustix::io::FdFlags::CLOEXEC),
        "the leaky descriptor must stay open across exec unless the spawn closes it"
    );
    fd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_holds_only_its_stdio_though_the_host_leaks_a_descriptor() {
    let leaked = leaky_descriptor();
    let argument = unique_sleep(1);
    let (seen, err) = inspect_then_kill(
        sleeper("/bin/sleep", &argument),
        &argument,
        rustix::process::Signal::KILL,
    )
    .await;
    drop(leaked);
    assert_eq!(seen.descriptors, [0, 1, 2]);
    assert_eq!(
        exited(&err),
        Some(ExitInfo {
            code: None,
            signal: Some(libc::SIGKILL)
        }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_on_the_inherited_socket_holds_only_stdio_and_the_channel() {
    let leaked = leaky_descriptor();
    let argument = unique_sleep(2);
    let (seen, err) = inspect_then_kill(
        sleeper("/bin/sleep", &argument)
            .transport(airlock_host::TransportChoice::SocketInherited)
            .protocol(
                airlock_protocol::HostConfig::default()
                    .handshake_timeout(Duration::from_secs(30))
                    .unwrap(),
            ),
        &argument,
        rustix::process::Signal::TERM,
    )
    .await;
    drop(leaked);
    assert_eq!(seen.descriptors, [0, 1, 2, 3]);
    assert_eq!(
        seen.environment,
        [OsString::from("AIRLOCK_SOCKET_FD=3")],
        "only the channel's variable"
    );
    assert_eq!(
        exited(&err),
        Some(ExitInfo {
            code: None,
            signal: Some(libc::SIGTERM)
        }),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_has_only_the_environment_and_directory_it_was_given() {
    let dir = std::env::temp_dir()
        .canonicalize()
        .unwrap()
        .join(format!("airlock-unconfined-cwd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(
        std::env::vars_os().next().is_some(),
        "the host has an environment of its own to leak"
    );
    let argument = unique_sleep(3);
    // By name: found in the worker's own PATH, which is not the host's.
    let (seen, _) = inspect_then_kill(
        sleeper("sleep", &argument)
            .env("PATH", "/nonexistent/airlock:/usr/bin:/bin")
            .env("AIRLOCK_GIVEN", "first")
            .env("AIRLOCK_GIVEN", "given")
            .current_dir(&dir),
        &argument,
        rustix::process::Signal::KILL,
    )
    .await;
    let _ = std::fs::remove_dir(&dir);
    assert_eq!(
        seen.environment,
        [
            OsString::from("AIRLOCK_GIVEN=given"),
            OsString::from("PATH=/nonexistent/airlock:/usr/bin:/bin"),
        ]
    );
    assert_eq!(seen.cwd, dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_whose_program_is_missing_fails_with_enoent() {
    for program in ["/nonexistent/airlock/worker", "airlock-no-such-program"] {
        let err = match sleeper(program, "1")
            .env("PATH", "/usr/bin:/bin")
            .spawn()
            .await
        {
            Ok(host) => {
                host.shutdown().await;
                panic!("{program} started");
            }
            Err(err) => err,
        };
        match &err {
            SpawnError::Exec { source, .. } => {
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT), "{program}")
            }
            other => panic!("{program}: expected Exec, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_that_cannot_enter_its_directory_fails_with_the_reason() {
    let err = match sleeper("/bin/sleep", "1")
        .current_dir("/nonexistent/airlock/dir")
        .spawn()
        .await
    {
        Ok(host) => {
            host.shutdown().await;
            panic!("started in a missing directory");
        }
        Err(err) => err,
    };
    assert!(
        matches!(&err, SpawnError::Exec { source, .. } if source.raw_os_error() == Some(libc::ENOENT)),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_worker_exit_code_is_reported() {
    let err = match Host::builder("/bin/sh")
        .confinement(Confinement::none())
        .arg("-c")
        .arg("exit 42")
        .spawn()
        .await
    {
        Ok(host) => {
            host.shutdown().await;
            panic!("sh said hello");
        }
        Err(err) => err,
    };
    assert_eq!(
        exited(&err),
        Some(ExitInfo {
            code: Some(42),
            signal: None
        }),
        "{err:?}"
    );
}
