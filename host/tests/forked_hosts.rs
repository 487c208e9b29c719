//! A host used in a forked child: spawning there does not hang, and the `close_range` fallback
//! closes every descriptor the worker would otherwise inherit.
//!
//! `fork`/`waitpid` have no safe wrapper here: this file allows `unsafe` for them alone.
#![allow(unsafe_code)]

use std::time::Duration;

use airlock_host::Host;
use airlock_test_support::child::{wait_for_forked, ChildMode};

/// Every spawn is a job sent to one process-wide spawner thread (host/src/spawner.rs). After a
/// `fork()` (a pre-fork server, a daemonising application) the child inherits the handle to
/// that thread but not the thread: a job queued to it would never be answered, and
/// `Host::spawn` (and every restart of every host) would wait forever. The spawner notices the
/// fork and starts a thread of its own in the child, so every wait stays bounded (invariant 7).
#[test]
fn spawning_in_a_forked_child_does_not_hang() {
    // The first spawn in this process starts the spawner thread (the program never says
    // hello, so the spawn fails; only the thread matters).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let first = runtime.block_on(Host::builder("/bin/true").spawn());
    assert!(first.is_err(), "/bin/true never says hello");
    drop(runtime);

    // SAFETY: the child only builds a fresh runtime, runs one spawn under a timeout and exits
    // with `_exit`; glibc's malloc is fork-safe, and nothing else is touched.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                match tokio::time::timeout(
                    Duration::from_secs(3),
                    Host::builder("/bin/true").spawn(),
                )
                .await
                {
                    Ok(_) => 0,  // the spawn ran (and failed the handshake, as expected)
                    Err(_) => 1, // the spawn never returned
                }
            })
        })
        .unwrap_or(2);
        // SAFETY: ends the forked child without running the parent's atexit handlers.
        unsafe { libc::_exit(code) };
    }
    let code = wait_for_forked(pid, Duration::from_secs(8), "the forked child");
    assert_eq!(
        code,
        Some(0),
        "Host::spawn in a forked child hung (1), panicked (2) or was killed (None)"
    );
}

/// Where `close_range(CLOSE_RANGE_CLOEXEC)` is missing (Linux < 5.11, or a seccomp profile
/// that refuses it, as older container runtimes do), the spawner's child marks descriptors
/// close-on-exec one by one (host/src/sys.rs `close_on_exec_from_3`). It must reach every open
/// descriptor, not only those under the current *soft* `RLIMIT_NOFILE`: a descriptor numbered
/// above it (opened before the soft limit was lowered) would stay open across `exec`, and the
/// untrusted worker would inherit it. The check runs in the test's child process (this test
/// binary re-run for this test alone), so the seccomp filter and the spawner thread it needs
/// are its own.
#[test]
fn the_close_range_fallback_closes_every_inherited_descriptor() {
    let child = ChildMode::of(
        module_path!(),
        "the_close_range_fallback_closes_every_inherited_descriptor",
    );
    if child.in_child() {
        check_the_fallback_under_a_filter_that_refuses_close_range();
        return;
    }
    let output = child.command().output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(CHECK_RAN),
        "the child's check did not run: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// What the child prints once the worker has listed its descriptors, before it checks them.
const CHECK_RAN: &str = "close-range-fallback-check-ran";

/// The child's part of the test above: a descriptor above a lowered soft limit, a seccomp
/// filter that refuses `close_range`, then a spawn whose worker lists what it inherited.
fn check_the_fallback_under_a_filter_that_refuses_close_range() {
    const SECRET_FD: i32 = 900;
    // A host descriptor numbered 900 (think: a database connection), then a lower soft limit.
    let secret = std::fs::File::open("/dev/null").unwrap();
    // SAFETY: plain system calls on integers and a valid rlimit.
    unsafe {
        use std::os::fd::AsRawFd;
        assert_eq!(libc::dup2(secret.as_raw_fd(), SECRET_FD), SECRET_FD);
        let limit = libc::rlimit {
            rlim_cur: 256,
            rlim_max: libc::RLIM_INFINITY,
        };
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let limit = libc::rlimit {
            rlim_max: old.rlim_max,
            ..limit
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
    // close_range → ENOSYS for this thread and every thread it starts (the spawner included).
    let filter = [
        // A = seccomp_data.nr
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_close_range as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr().cast_mut(),
    };
    // SAFETY: prctl with a valid filter program that outlives the call.
    unsafe {
        assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
        assert_eq!(
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &program as *const libc::sock_fprog
            ),
            0
        );
        // The filter is live: close_range is refused.
        assert_eq!(
            libc::syscall(libc::SYS_close_range, 5000u32, 5000u32, 0u32),
            -1
        );
    }
    let out = std::env::temp_dir().join(format!("airlock-forked-host-fds-{}", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let script = format!("ls /proc/$$/fd > {}; exit 0", out.display());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let result = runtime.block_on(
        Host::builder("/bin/sh")
            .confinement(airlock_host::Confinement::none())
            .arg("-c")
            .arg(script)
            .env("PATH", "/usr/bin:/bin")
            .spawn(),
    );
    assert!(result.is_err(), "the script never says hello");
    let listed = std::fs::read_to_string(&out).expect("the worker listed its descriptors");
    let _ = std::fs::remove_file(&out);
    println!("{CHECK_RAN}");
    let fds: Vec<&str> = listed.split_whitespace().collect();
    assert!(
        !fds.contains(&SECRET_FD.to_string().as_str()),
        "the worker inherited host descriptor {SECRET_FD}: its descriptors are {fds:?}"
    );
    drop(secret);
}
