//! Invariant 11: a worker runs under the confinement the host asked for and cannot reach its
//! host, its siblings or anything the policy did not grant.
//!
//! Each test first shows its attack is live, run by a real worker under
//! `Confinement::none()`, then that the same attempt fails under the default
//! (`Confinement::strict()`). Tests that pass `NO_SELF_FILTER` show what the host's layers
//! alone refuse, as for a worker written in another language.

use std::time::Duration;

use airlock_host::{
    CallError, Confinement, ConfinementError, ConfinementMode, Host, LostReason, SpawnError,
};
use airlock_tests::attack::{a_call_whose_worker_is_signalled, Attack, NO_SELF_FILTER};
use airlock_tests::e2e::{attack_bin, parent_of, ScratchDir};
use airlock_worker::builtin::Echo;
use serde_bytes::ByteBuf;

/// Something in the host's memory for the worker to try to read.
static CANARY: u64 = 0x5ec2_e7ca_4a21_0001;

fn canary_address() -> usize {
    std::ptr::addr_of!(CANARY) as usize
}

fn host_pid() -> String {
    std::process::id().to_string()
}

async fn attempt(
    policy: Confinement,
    self_filter: bool,
    name: &str,
    arg: &str,
) -> Result<String, CallError> {
    let mut builder = Host::builder(attack_bin()).confinement(policy);
    if !self_filter {
        builder = builder.arg(NO_SELF_FILTER);
    }
    let host = builder.spawn().await.expect("the attack worker starts");
    let outcome = host
        .call_with_deadline::<Attack>(
            &(name.to_string(), arg.to_string()),
            std::time::Instant::now() + Duration::from_secs(20),
        )
        .await;
    host.shutdown().await;
    outcome
}

/// An attack worker under `policy` (with or without its own filter), up for several calls.
async fn attack_host(policy: Confinement, self_filter: bool) -> Host {
    let mut builder = Host::builder(attack_bin()).confinement(policy);
    if !self_filter {
        builder = builder.arg(NO_SELF_FILTER);
    }
    builder.spawn().await.expect("the attack worker starts")
}

/// One attack on `host`'s worker, given a minute.
async fn run(host: &Host, name: &str, arg: &str) -> Result<String, CallError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    host.call_with_deadline::<Attack>(&(name.to_string(), arg.to_string()), deadline)
        .await
}

/// The attack works unconfined, and fails under `strict` (with or without the worker's own
/// filter, as `self_filter` says).
async fn live_then_refused(strict: Confinement, self_filter: bool, name: &str, arg: &str) {
    let live = attempt(Confinement::none(), true, name, arg).await;
    assert!(
        live.is_ok(),
        "the attack {name}({arg}) must work unconfined, or this test proves nothing: {live:?}"
    );
    let refused = attempt(strict, self_filter, name, arg).await;
    assert!(
        matches!(refused, Err(CallError::Remote(_))),
        "{name}({arg}) must be refused under the default confinement, got {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0600_file_of_the_hosts_user_outside_the_grants_cannot_be_read() {
    let dir = ScratchDir::new("confinement-secret");
    let secret = dir.join("secret");
    std::fs::write(&secret, "the host's secret").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let path = secret.display().to_string();
    assert_eq!(
        attempt(Confinement::none(), true, "read", &path).await,
        Ok("the host's secret".to_string())
    );
    live_then_refused(Confinement::strict(), false, "read", &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etc_passwd_is_not_visible() {
    live_then_refused(Confinement::strict(), false, "read", "/etc/passwd").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_outside_a_read_write_path_fails_and_inside_works() {
    let dir = ScratchDir::new("confinement-rw");
    let open = dir.join("open");
    let closed = dir.join("closed");
    for d in [&open, &closed] {
        std::fs::create_dir(d).unwrap();
        // A root host's worker runs under a uid of its own: the granted directory must be
        // writable by it.
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    }
    let target = closed.join("file").display().to_string();
    live_then_refused(
        Confinement::strict().read_write(&open),
        false,
        "write",
        &target,
    )
    .await;
    let inside = open.join("file");
    assert_eq!(
        attempt(
            Confinement::strict().read_write(&open),
            true,
            "write",
            &inside.display().to_string()
        )
        .await,
        Ok("written".to_string())
    );
    assert_eq!(
        std::fs::read_to_string(&inside).unwrap(),
        "written by the worker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_connect_to_a_listener_on_loopback_fails() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    live_then_refused(Confinement::strict(), false, "tcp", &addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_and_abstract_socket_connects_fail() {
    let dir = ScratchDir::new("confinement-unix");
    let path = dir.join("listener.sock");
    let _unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
    live_then_refused(
        Confinement::strict(),
        false,
        "unix",
        &path.display().to_string(),
    )
    .await;

    use std::os::linux::net::SocketAddrExt;
    let name = format!("airlock-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _abstract = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    live_then_refused(Confinement::strict(), false, "abstract", &name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_cannot_be_signalled_traced_or_read() {
    let pid = host_pid();
    let at = format!("{pid}:{}", canary_address());
    live_then_refused(Confinement::strict(), false, "kill", &pid).await;
    live_then_refused(Confinement::strict(), false, "ptrace", &pid).await;
    live_then_refused(Confinement::strict(), false, "vm_readv", &at).await;
    live_then_refused(Confinement::strict(), false, "proc_mem", &at).await;
    live_then_refused(
        Confinement::strict(),
        false,
        "read",
        &format!("/proc/{pid}/environ"),
    )
    .await;
    live_then_refused(Confinement::strict(), false, "pidfd_getfd", &pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dangerous_calls_are_refused_by_the_hosts_own_filter() {
    live_then_refused(Confinement::strict(), false, "userfaultfd", "").await;
    // Without the worker's own filter (which refuses the fork first): the host's denylist
    // refuses `unshare` in the forked child.
    live_then_refused(Confinement::strict(), false, "unshare_user", "").await;
    // The calls that hold a pipe's lock while they wait: a worker making one could put the
    // host's next read or write of its channel to sleep in the kernel. Each works unconfined.
    assert_eq!(
        attempt(Confinement::none(), true, "pipe_lock_calls", "").await,
        Ok("splice tee vmsplice sendfile".to_string())
    );
    live_then_refused(Confinement::strict(), false, "pipe_lock_calls", "").await;
}

/// A worker cannot take a kernel budget it would share with its host's user or with the
/// whole machine: inotify instances and fanotify groups (counted per user; for a worker's user
/// namespace, against the user that made it: root, for a root host), AIO events (one budget
/// for the machine), POSIX timers and queued signals, and POSIX message queues' bytes (counted
/// per user up the chain of user namespaces). Live unconfined: while the hoarder lives its
/// sibling (unconfined too, so that only the budget stands in its way) is refused one, and
/// gets one again once the hoarder is gone. Under the host's layers alone the hoarder takes
/// nothing (the filter answers `ENOSYS`, the message-queue rlimit is 0) or at most its own
/// bound, and the sibling keeps getting one.
/// Held by the tests that use up, or measure, budgets the kernel keeps for the host's user
/// (root's queued signals above all), which would see each other's workers otherwise.
static HOST_USERS_BUDGETS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_take_a_kernel_budget_it_shares_with_its_host() {
    let _alone = HOST_USERS_BUDGETS.lock().await;
    /// What stops a confined hoarder: the filter, or an rlimit of that size.
    enum Bound {
        Filter,
        Limit(u64),
    }
    let budgets = [
        ("inotify", Bound::Filter),
        ("fanotify", Bound::Filter),
        ("aio", Bound::Filter),
        (
            "timers",
            Bound::Limit(airlock_host::confinement::DEFAULT_MAX_PENDING_SIGNALS),
        ),
        ("mqueue", Bound::Limit(0)),
    ];
    let sibling = attack_host(Confinement::none(), true).await;
    let took_one = Ok("took one".to_string());
    for (budget, bound) in budgets {
        assert_eq!(
            run(&sibling, "use_budget", budget).await,
            took_one,
            "{budget}"
        );
        let hoarder = attack_host(Confinement::none(), true).await;
        let took = run(&hoarder, "take_budget", budget).await;
        let denied = run(&sibling, "use_budget", budget).await;
        assert!(
            took.is_ok() && matches!(denied, Err(CallError::Remote(_))),
            "{budget}: an unconfined hoarder must take what its sibling needs, or this test \
             proves nothing: took {took:?}, the sibling then got {denied:?}"
        );
        hoarder.shutdown().await;
        // Given back as the hoarder's descriptors and timers go: at its exit.
        let mut given_back = false;
        for _ in 0..100 {
            given_back = run(&sibling, "use_budget", budget).await == took_one;
            if given_back {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(given_back, "{budget}: given back when the hoarder is gone");
        let hoarder = attack_host(Confinement::strict(), false).await;
        let took = run(&hoarder, "take_budget", budget).await;
        let taken = |message: &str| -> Option<u64> {
            message
                .strip_prefix("took ")?
                .split(';')
                .next()?
                .parse()
                .ok()
        };
        match (&bound, &took) {
            (Bound::Filter, Err(CallError::Remote(err)))
                if err.message().contains("os error 38") => {}
            (Bound::Limit(0), Err(CallError::Remote(_))) => {}
            (Bound::Limit(n), Ok(message)) if taken(message).is_some_and(|k| k <= *n) => {}
            _ => panic!("{budget}: confined, the hoarder must be bounded: {took:?}"),
        }
        assert_eq!(
            run(&sibling, "use_budget", budget).await,
            took_one,
            "{budget}"
        );
        hoarder.shutdown().await;
    }
    sibling.shutdown().await;
}

/// What the kernel counts per user up the chain of user namespaces (queued signals, message
/// queues, inotify instances) is charged to each namespace's owner as well: a root host's
/// worker's namespace is owned by its worker uid, never by root, so the worker charges
/// nothing to root, whose budgets every root process of the machine shares. Shown with the
/// standard signals a process sends itself, which pass the pending-signal limit: live
/// unconfined, root's count (`SigQ`) grows by what the worker queued; confined, it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_worker_queues_is_never_charged_to_root() {
    let _alone = HOST_USERS_BUDGETS.lock().await;
    if !rustix::process::geteuid().is_root() {
        println!(
            "SKIPPED what_a_worker_queues_is_never_charged_to_root: an unprivileged host owns \
             its workers' namespaces, and they share its uid"
        );
        return;
    }
    let root_queued = || -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("SigQ:")).unwrap();
        line[5..].trim().split('/').next().unwrap().parse().unwrap()
    };
    let queued = |said: &str| -> u64 { said.rsplit(' ').next().unwrap().parse().unwrap() };
    const CHILDREN: &str = "20";
    let live = attack_host(Confinement::none(), true).await;
    let before = root_queued();
    let said = run(&live, "take_standard_signals", CHILDREN).await.unwrap();
    let grew = root_queued().saturating_sub(before);
    assert!(
        queued(&said) >= 500 && grew >= queued(&said) * 9 / 10,
        "unconfined, root must be charged what its worker queued, or this test proves \
         nothing: {said}; root's count grew by {grew}"
    );
    live.shutdown().await;
    let confined = attack_host(Confinement::strict(), false).await;
    let before = root_queued();
    let said = run(&confined, "take_standard_signals", CHILDREN)
        .await
        .unwrap();
    let grew = root_queued().saturating_sub(before);
    assert!(
        queued(&said) >= 500 && grew < 100,
        "confined, nothing of the worker's may be charged to root: {said}; root's count grew \
         by {grew}"
    );
    confined.shutdown().await;
}

/// A root host gives each `Host`'s workers a uid of their own, so a worker that uses up the
/// epoll watches the kernel allows its uid (`fs.epoll.max_user_watches`, per user for the
/// whole machine, which no rlimit or filter can bound) takes none of its sibling's, its
/// host's or a new worker's. Live: a process of the hoarder's uid is refused a watch, as any
/// sibling sharing that uid would be (an unprivileged host's workers share its own uid, and
/// the host with them: SECURITY.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_uses_up_its_uids_epoll_watches_leaves_its_siblings_theirs() {
    if !rustix::process::geteuid().is_root() {
        println!(
            "SKIPPED a_worker_that_uses_up_its_uids_epoll_watches_leaves_its_siblings_theirs: \
             an unprivileged host's workers run as its own uid (a residual, SECURITY.md)"
        );
        return;
    }
    let max_watches: u64 = std::fs::read_to_string("/proc/sys/fs/epoll/max_user_watches")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Each of the hoarder's processes takes 240,000 watches.
    let processes = max_watches / 240_000 + 2;
    if processes > 100 {
        println!(
            "SKIPPED a_worker_that_uses_up_its_uids_epoll_watches_leaves_its_siblings_theirs: \
             {max_watches} watches a user would take {processes} processes"
        );
        return;
    }
    // A watch costs the worker's cgroup about 200 bytes of kernel memory.
    let memory = max_watches * 256 + (512 << 20);
    let hoarder = attack_host(
        Confinement::strict()
            .memory_limit(memory)
            .max_processes(processes + 16),
        false,
    )
    .await;
    let sibling = attack_host(Confinement::strict(), false).await;
    let uid = hoarder.worker_info().confinement.uid;
    let sibling_uid = sibling.worker_info().confinement.uid;
    assert!(
        airlock_host::WORKER_UIDS.contains(&uid)
            && airlock_host::WORKER_UIDS.contains(&sibling_uid)
            && uid != sibling_uid,
        "each worker a uid of its own: {uid} and {sibling_uid}"
    );
    let took = run(&hoarder, "take_epoll_watches", &processes.to_string()).await;
    assert!(
        matches!(&took, Ok(held) if held.contains("No space left on device")),
        "the hoarder must use up its uid's watches: {took:?}"
    );
    // Live: any process of the hoarder's uid is refused a watch.
    let setpriv = which("setpriv").expect("setpriv (util-linux)");
    let same_uid = std::process::Command::new(setpriv)
        .arg(format!("--reuid={uid}"))
        .args(["--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_airlock-test-peer"))
        .arg("epoll_watch")
        .current_dir("/")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&same_uid.stdout);
    assert!(
        said.contains("No space left on device"),
        "a process of the hoarder's uid must be refused, or this test proves nothing: {said}"
    );
    // Refused: the sibling, the host and a new worker each have watches of their own.
    let took_one = Ok("took one".to_string());
    assert_eq!(run(&sibling, "use_budget", "epoll").await, took_one);
    tokio::net::UnixStream::pair().expect("the host registers a new descriptor");
    let fresh = attack_host(Confinement::strict(), false).await;
    assert_eq!(run(&fresh, "use_budget", "epoll").await, took_one);
    for host in [hoarder, sibling, fresh] {
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execve_is_refused_by_the_workers_own_filter() {
    live_then_refused(Confinement::strict(), true, "exec", "/bin/true").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_forks_meet_the_process_limit() {
    let live = attempt(Confinement::none(), true, "fork_many", "64").await;
    assert_eq!(live, Ok("forked 64".to_string()));
    let limited = attempt(
        Confinement::strict().max_processes(16),
        false,
        "fork_many",
        "64",
    )
    .await;
    match limited {
        Err(CallError::Remote(err)) => assert!(
            err.message().contains("of 64"),
            "some forks must fail: {err:?}"
        ),
        other => panic!("64 forks under a limit of 16 must not all succeed: {other:?}"),
    }
}

/// The path a `/proc/<pid>/cgroup` line gives, if it is the line of the v1 hierarchy of
/// `controller`.
fn v1_path<'l>(line: &'l str, controller: &str) -> Option<&'l str> {
    let mut parts = line.splitn(3, ':');
    let _id = parts.next()?;
    let controllers = parts.next()?;
    let path = parts.next()?;
    controllers
        .split(',')
        .any(|c| c == controller)
        .then_some(path)
}

/// The directory of `pid`'s `pids` cgroup as this process sees it: a v1 `pids` hierarchy, or
/// the v2 one where it has the controller.
fn pids_cgroup_dir(pid: u32) -> std::path::PathBuf {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for mount in mountinfo.lines() {
        let Some((left, right)) = mount.split_once(" - ") else {
            continue;
        };
        let Some(point) = left.split_whitespace().nth(4) else {
            continue;
        };
        let mut right = right.split_whitespace();
        let (fstype, options) = (right.next(), right.nth(1).unwrap_or(""));
        let path = match fstype {
            Some("cgroup") if options.split(',').any(|o| o == "pids") => {
                cgroups.lines().find_map(|l| v1_path(l, "pids"))
            }
            Some("cgroup2") => cgroups.lines().find_map(|l| l.strip_prefix("0::")),
            _ => None,
        };
        if let Some(path) = path {
            let dir = std::path::Path::new(point).join(path.trim_start_matches('/'));
            if dir.join("pids.max").exists() {
                return dir;
            }
        }
    }
    panic!("no pids cgroup for {pid}: {cgroups}");
}

/// Where the host can give its worker a cgroup (here: as root), the process limit is also the
/// cgroup's `pids.max`, which counts every task of the worker, its init included, whatever uid
/// it runs as; the rlimit counts only those of the worker's uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_pids_cgroup_carries_the_process_limit() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: an unprivileged host here has no cgroup to give");
        return;
    }
    let host = Host::builder(attack_bin())
        .confinement(Confinement::strict().max_processes(16))
        .spawn()
        .await
        .unwrap();
    assert!(host.worker_info().confinement.cgroup);
    let worker = host.worker_pid().unwrap();
    let init = parent_of(worker);
    let dir = pids_cgroup_dir(worker);
    assert_eq!(
        pids_cgroup_dir(init),
        dir,
        "the worker's init is in the worker's cgroup"
    );
    assert!(
        dir.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("airlock-")),
        "the worker is in a cgroup of its own, not its host's: {dir:?}"
    );
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    assert_eq!(read("pids.max").trim(), "16");
    let tasks: u64 = read("pids.current").trim().parse().unwrap();
    assert!(tasks >= 2, "the worker and its init are counted: {tasks}");
    host.shutdown().await;
}

/// A process limit of 1 leaves no room for the worker beside its init: the spawn is refused
/// by the setting's name instead of failing in the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_limit_below_two_is_refused_by_name() {
    let refused = Host::builder(attack_bin())
        .confinement(Confinement::strict().max_processes(1))
        .spawn()
        .await;
    assert!(
        matches!(
            refused,
            Err(SpawnError::Confinement(ConfinementError::InvalidLimit {
                setting: "max_processes",
                value: 1,
                ..
            }))
        ),
        "{refused:?}"
    );
    // Two is room for init and the worker's first thread: the worker starts and says hello
    // (what it can do after that depends on how many threads its runtime wants).
    let host = Host::builder(attack_bin())
        .confinement(Confinement::strict().max_processes(2))
        .spawn()
        .await;
    assert!(host.is_ok(), "{:?}", host.as_ref().err());
    if let Ok(host) = host {
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_kills_only_the_worker_and_the_replacement_answers() {
    let bomb_size = (512u64 << 20).to_string();
    let live = attempt(Confinement::none(), true, "alloc", &bomb_size).await;
    assert!(live.is_ok(), "unconfined, the allocation works: {live:?}");
    let host = Host::builder(attack_bin())
        .confinement(Confinement::strict().memory_limit(128 << 20))
        .spawn()
        .await
        .unwrap();
    let bomb = host
        .call::<Attack>(&("alloc".to_string(), bomb_size.clone()))
        .await;
    assert!(
        matches!(bomb, Err(CallError::WorkerLost(LostReason::Exited(_)))),
        "the bomb must kill the worker: {bomb:?}"
    );
    let echo = host
        .call::<Echo>(&ByteBuf::from(b"still here".to_vec()))
        .await;
    assert_eq!(echo.map(|b| b.into_vec()), Ok(b"still here".to_vec()));
    assert_eq!(host.stats().restarts, 1);
    host.shutdown().await;
}

async fn sibling_forgery(policy: Confinement) -> (usize, Result<String, CallError>) {
    airlock_tests::attack::sibling_forgery(Host::builder(attack_bin()).confinement(policy))
        .await
        .expect("a pool of two attack workers starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_forge_its_siblings_answer() {
    let (forged, stolen) = sibling_forgery(Confinement::none()).await;
    assert!(
        forged > 0 && stolen.is_ok(),
        "unconfined, the forged answer must reach the caller, or this test proves nothing: \
         {forged} forged, thief {stolen:?}"
    );
    let (forged, stolen) = sibling_forgery(Confinement::strict()).await;
    assert_eq!(
        forged, 0,
        "a forged answer reached a caller under the default"
    );
    assert!(matches!(stolen, Err(CallError::Remote(_))), "{stolen:?}");
}

/// Invariant 11: a host that says nothing of confinement runs its worker confined, and has
/// verified that from outside before the first call; the worker then cannot read a file the
/// policy did not grant, which the same worker reads when its host asks for `none()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariant_11_a_worker_is_confined_by_default_and_verified_from_outside() {
    let dir = ScratchDir::new("invariant-11");
    let secret = dir.join("secret");
    std::fs::write(&secret, "the host's secret").unwrap();
    let request = ("read".to_string(), secret.display().to_string());
    let deadline = || std::time::Instant::now() + Duration::from_secs(20);

    let unconfined = Host::builder(attack_bin())
        .confinement(Confinement::none())
        .spawn()
        .await
        .unwrap();
    assert_eq!(
        unconfined.worker_info().confinement.mode,
        ConfinementMode::None
    );
    let live = unconfined
        .call_with_deadline::<Attack>(&request, deadline())
        .await;
    assert_eq!(
        live,
        Ok("the host's secret".to_string()),
        "the read is live"
    );
    unconfined.shutdown().await;

    // No `.confinement(..)`: the default.
    let host = Host::builder(attack_bin()).spawn().await.unwrap();
    let report = host.worker_info().confinement.clone();
    assert_eq!(report.mode, ConfinementMode::Strict);
    assert!(
        report.namespaces && report.no_new_privs && report.no_capabilities && report.worker_filter,
        "{report:?}"
    );
    // What the report says was read from the process the host holds, before this first call:
    // the kernel agrees that it is not root and lives in a PID namespace of its own.
    assert_eq!(Some(report.pid), host.worker_pid());
    let status = std::fs::read_to_string(format!("/proc/{}/status", report.pid)).unwrap();
    let real_uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .unwrap();
    assert_ne!(real_uid, "0", "{status}");
    assert_ne!(
        std::fs::read_link(format!("/proc/{}/ns/pid", report.pid)).unwrap(),
        std::fs::read_link("/proc/self/ns/pid").unwrap()
    );
    let refused = host
        .call_with_deadline::<Attack>(&request, deadline())
        .await;
    assert!(
        matches!(refused, Err(CallError::Remote(_))),
        "the read must be refused under the default confinement: {refused:?}"
    );
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_reports_what_it_verified() {
    let host = Host::builder(attack_bin()).spawn().await.unwrap();
    let report = &host.worker_info().confinement;
    assert_eq!(report.mode, ConfinementMode::Strict);
    assert!(report.namespaces && report.no_new_privs && report.no_capabilities);
    assert!(
        report.worker_filter,
        "the worker's own allowlist: {report:?}"
    );
    assert_eq!(Some(report.pid), host.worker_pid());
    assert_ne!(report.uid, 0);
    assert_eq!(
        report.cgroup,
        rustix::process::geteuid().is_root(),
        "a root host gives each worker a cgroup here: {report:?}"
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", report.pid)).unwrap();
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parent_death_signal_cannot_be_cleared() {
    live_then_refused(Confinement::strict(), false, "clear_pdeathsig", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vsock_and_netlink_sockets_cannot_be_created() {
    // AF_VSOCK shares its port space with the host and the hypervisor; AF_NETLINK talks to
    // the kernel. Only Unix and IP sockets (in the worker's empty network) are left.
    for family in [libc::AF_VSOCK, libc::AF_NETLINK] {
        live_then_refused(Confinement::strict(), false, "socket", &family.to_string()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_memory_counts_against_the_workers_cgroup() {
    let fill = (256u64 << 20).to_string();
    let live = attempt(Confinement::none(), true, "memfd_fill", &fill).await;
    assert!(live.is_ok(), "unconfined, a memfd takes 256 MiB: {live:?}");
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped the confined half: an unprivileged host here has no cgroup to give");
        return;
    }
    let host = Host::builder(attack_bin())
        .confinement(Confinement::strict().memory_limit(64 << 20))
        .spawn()
        .await
        .unwrap();
    assert!(
        host.worker_info().confinement.cgroup,
        "a root host gives each worker a cgroup"
    );
    let filled = host.call::<Attack>(&("memfd_fill".to_string(), fill)).await;
    assert!(
        filled.is_err(),
        "256 MiB of shared memory must not fit a 64 MiB cgroup: {filled:?}"
    );
    host.shutdown().await;
}

/// System V shared memory keeps its pages after it is detached, so no address-space limit
/// bounds it: a worker whose memory a cgroup counts may use it (and is killed past its
/// limit); one without a cgroup (an unprivileged host without delegation) is refused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_v_shared_memory_is_counted_by_the_cgroup_or_refused() {
    let fill = (256u64 << 20).to_string();
    let live = attempt(Confinement::none(), false, "sysv_shm_fill", &fill).await;
    assert!(
        live.is_ok(),
        "unconfined, System V segments take 256 MiB: {live:?}"
    );
    let host = Host::builder(attack_bin())
        .arg(NO_SELF_FILTER)
        .confinement(Confinement::strict().memory_limit(64 << 20))
        .spawn()
        .await
        .unwrap();
    let counted = host.worker_info().confinement.cgroup;
    let filled = host
        .call::<Attack>(&("sysv_shm_fill".to_string(), fill))
        .await;
    if counted {
        assert!(
            matches!(filled, Err(CallError::WorkerLost(_))),
            "256 MiB of System V shared memory must not fit a 64 MiB cgroup: {filled:?}"
        );
    } else {
        assert!(
            matches!(&filled, Err(CallError::Remote(e)) if e.message().contains("shmget")),
            "without a cgroup to count it, System V shared memory must be refused: {filled:?}"
        );
    }
    host.shutdown().await;
}

/// A number from `/proc/<pid>/status` (`RssAnon:` in kB).
fn status_field(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in the status of {pid}: {status}"))
}

/// The keeper and init are forks of the host that never `exec`. Holding their copy of its
/// memory, each worker would keep a snapshot of everything the host held when it was spawned
/// resident (the host's later writes copy the pages; the old ones stay), and init, inside the
/// worker's namespaces, would hold the host's heap. They drop it once their set-up is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_and_init_keep_no_copy_of_the_hosts_memory() {
    const BALLAST_KIB: u64 = 256 << 10;
    // What a process that only waits holds: its stack and the host binary's written data.
    const LEFT_KIB: u64 = 32 << 10;
    let ballast = vec![0x5au8; (BALLAST_KIB as usize) << 10];
    // The probe reads real figures: this process holds the ballast.
    let ours = status_field(std::process::id(), "RssAnon:");
    assert!(ours >= BALLAST_KIB, "this host holds {ours} kB");
    let host = Host::builder(attack_bin()).spawn().await.unwrap();
    let init = parent_of(host.worker_pid().unwrap());
    let keeper = parent_of(init);
    assert_eq!(
        parent_of(keeper),
        std::process::id(),
        "worker → init → keeper → host"
    );
    // They drop it as the worker starts; the host may see the worker ready a moment earlier.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held = (
            status_field(keeper, "RssAnon:"),
            status_field(init, "RssAnon:"),
        );
        if held.0 < LEFT_KIB && held.1 < LEFT_KIB {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the keeper and init hold {held:?} kB of a host of {ours} kB"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::hint::black_box(&ballast);
    let echoed = host.call::<Echo>(&ByteBuf::from(b"after".to_vec())).await;
    assert_eq!(echoed.unwrap().as_slice(), b"after");
    host.shutdown().await;
}

/// Init, inside the worker's namespaces, is never given the host's memory at all, not even
/// for the moment of its set-up: the keeper leaves it out of every child it makes, but for
/// the plan those children run. (So no child's fork copies it either, whatever the host's
/// size.) A process's peak resident memory (`VmHWM`) counts what its fork gave it: the
/// keeper, a fork of the host, shows the host's ballast was there to be copied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_is_never_given_a_copy_of_the_hosts_memory() {
    const BALLAST_KIB: u64 = 256 << 10;
    const SET_UP_KIB: u64 = 32 << 10;
    let ballast = vec![0x5au8; (BALLAST_KIB as usize) << 10];
    let host = Host::builder(attack_bin()).spawn().await.unwrap();
    let init = parent_of(host.worker_pid().unwrap());
    let keeper = parent_of(init);
    assert!(
        status_field(keeper, "VmHWM:") >= BALLAST_KIB,
        "the keeper, a fork of this host, was given its {BALLAST_KIB} kB of ballast"
    );
    let peak = status_field(init, "VmHWM:");
    assert!(
        peak < SET_UP_KIB,
        "init held {peak} kB at its peak, in a host holding {BALLAST_KIB} kB"
    );
    std::hint::black_box(&ballast);
    let echoed = host.call::<Echo>(&ByteBuf::from(b"after".to_vec())).await;
    assert_eq!(echoed.unwrap().as_slice(), b"after");
    host.shutdown().await;
}

/// Whether `needle` is in the private memory of process `pid` that `only` (an address) lies
/// in, or in any of its private memory, read through `/proc/<pid>/mem`.
fn private_memory_holds(pid: u32, needle: &[u8], only: Option<usize>) -> bool {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    maps.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            return false;
        };
        let Some((start, end)) = range.split_once('-') else {
            return false;
        };
        let parse = |hex| usize::from_str_radix(hex, 16).unwrap();
        let (start, end) = (parse(start), parse(end));
        if !perms.starts_with('r') || !perms.ends_with('p') || line.ends_with("[vvar]") {
            return false;
        }
        if only.is_some_and(|at| !(start..end).contains(&at)) {
            return false;
        }
        let mut bytes = vec![0u8; end - start];
        let Ok(read) = mem.read_at(&mut bytes, start as u64) else {
            return false;
        };
        bytes[..read].windows(needle.len()).any(|w| w == needle)
    })
}

/// Init reads the spawn's plan (the worker's environment among it) on pages of the host's
/// memory the keeper kept for it; once the worker runs, init unmaps those too, and holds
/// nothing of the host's but its code and data for the worker's whole life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_keeps_no_page_of_the_spawns_plan_once_the_worker_runs() {
    if !rustix::process::geteuid().is_root() {
        // Init is not dumpable: only `CAP_SYS_PTRACE` reads its memory.
        eprintln!("skipped: reading init's memory takes root");
        return;
    }
    let marker = format!(
        "airlock-plan-marker-{:016x}",
        rand_core::RngCore::next_u64(&mut rand_core::UnwrapErr(rand_core::OsRng))
    );
    // The probe reads real memory: this process holds the marker.
    assert!(private_memory_holds(
        std::process::id(),
        marker.as_bytes(),
        Some(marker.as_ptr() as usize)
    ));
    let host = Host::builder(attack_bin())
        .env("AIRLOCK_PLAN_MARKER", &marker)
        .spawn()
        .await
        .unwrap();
    let init = parent_of(host.worker_pid().unwrap());
    // Init unmaps them as the worker starts; the host may see the worker ready a moment
    // earlier.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while private_memory_holds(init, marker.as_bytes(), None) {
        assert!(
            std::time::Instant::now() < deadline,
            "init still holds the worker's environment"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let echoed = host.call::<Echo>(&ByteBuf::from(b"after".to_vec())).await;
    assert_eq!(echoed.unwrap().as_slice(), b"after");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_worker_cannot_make_its_keeper_dump_the_hosts_memory() {
    let host = Host::builder(attack_bin()).spawn().await.unwrap();
    let worker = host.worker_pid().unwrap();
    // worker → init → keeper.
    let keeper = parent_of(parent_of(worker));
    // The keeper is a fork of this host: a core of it would hold the host's memory.
    let limits = std::fs::read_to_string(format!("/proc/{keeper}/limits")).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    assert_eq!(
        core.split_whitespace().collect::<Vec<_>>()[4..6],
        ["0", "0"],
        "{core}"
    );
    let crashed = host
        .call::<Attack>(&("crash".to_string(), String::new()))
        .await;
    match crashed {
        Err(CallError::WorkerLost(LostReason::Exited(exit))) => {
            assert_eq!(
                exit.signal,
                Some(libc::SIGSEGV),
                "the keeper mirrors the signal"
            )
        }
        other => panic!("the crash must be reported as the worker's exit: {other:?}"),
    }
    host.shutdown().await;
}

/// The keeper mirrors a worker's end after it dropped the host's memory: it raises the same
/// signal on itself (through libc, on its own stack), and the host reports that signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keeper_ends_by_the_signal_that_ended_its_worker() {
    for signal in [
        rustix::process::Signal::ABORT,
        rustix::process::Signal::TERM,
        rustix::process::Signal::USR1,
    ] {
        let host = Host::builder(attack_bin()).spawn().await.unwrap();
        match a_call_whose_worker_is_signalled(&host, signal).await {
            Err(CallError::WorkerLost(LostReason::Exited(exit))) => {
                assert_eq!(exit.signal, Some(signal.as_raw()), "{exit}")
            }
            other => panic!("expected the worker's exit by {signal:?}, got {other:?}"),
        }
        host.shutdown().await;
    }
}

/// The host's layers confine any program, not only one built on `airlock-worker`: here a
/// Python script (Debian's `/usr/bin/python3`, found in the worker's `/usr`) probes its
/// sandbox and writes what it found to the one directory it is granted, then exits without a
/// handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_in_another_language_is_confined_by_the_hosts_layers() {
    let python = std::path::Path::new("/usr/bin/python3");
    if !python.exists() {
        eprintln!("skipped: no /usr/bin/python3 on this machine");
        return;
    }
    let dir = ScratchDir::new("confinement-python");
    airlock_tests::e2e::share_with_worker(&dir);
    let secret = dir
        .join("..")
        .join(format!("secret-{}", std::process::id()));
    std::fs::write(&secret, "the host's secret").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = dir.join("probe.py");
    let out = dir.join("found");
    std::fs::write(
        &script,
        format!(
            r#"
import os, socket
def attempt(f):
    try:
        f()
        return "open"
    except Exception as e:
        return "refused"
results = {{
    "passwd": attempt(lambda: open("/etc/passwd").read()),
    "secret": attempt(lambda: open({secret:?}).read()),
    "tcp": attempt(lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1)),
    "kill_host": attempt(lambda: os.kill({host}, 0)),
    "uid": str(os.getuid()),
    "pid": str(os.getpid()),
}}
status = open("/proc/self/status").read()
for key in ("NoNewPrivs", "Seccomp_filters", "CapEff"):
    results[key] = [l.split(":")[1].strip() for l in status.splitlines() if l.startswith(key + ":")][0]
open({out:?}, "w").write(repr(sorted(results.items())))
"#,
            secret = secret.display().to_string(),
            out = out.display().to_string(),
            host = std::process::id(),
        ),
    )
    .unwrap();
    let probe = |policy: Confinement| {
        let script = script.clone();
        async move {
            let _ = std::fs::remove_file(out_path(&script));
            let spawned = Host::builder("/usr/bin/python3")
                .arg(&script)
                .confinement(policy)
                .spawn()
                .await;
            assert!(spawned.is_err(), "the probe never says hello");
            std::fs::read_to_string(out_path(&script)).expect("the probe wrote its findings")
        }
    };
    fn out_path(script: &std::path::Path) -> std::path::PathBuf {
        script.with_file_name("found")
    }
    let open = probe(Confinement::none()).await;
    for key in ["passwd", "secret", "tcp", "kill_host"] {
        assert!(
            open.contains(&format!("('{key}', 'open')")),
            "unconfined, {key}: {open}"
        );
    }
    let confined = probe(Confinement::strict().read_write(&*dir)).await;
    for key in ["passwd", "secret", "tcp", "kill_host"] {
        assert!(
            confined.contains(&format!("('{key}', 'refused')")),
            "confined, {key} must be refused: {confined}"
        );
    }
    assert!(confined.contains("('NoNewPrivs', '1')"), "{confined}");
    assert!(
        confined.contains("('CapEff', '0000000000000000')"),
        "{confined}"
    );
    // Its own PID namespace, whose init (pid 1) is the host's code.
    assert!(
        confined.contains("('pid', '2')"),
        "its own PID namespace: {confined}"
    );
    // The host's two filters, and none of the worker library's (it is not built on it).
    assert!(confined.contains("('Seccomp_filters', '2')"), "{confined}");
    if rustix::process::geteuid().is_root() {
        assert!(confined.contains("('uid', '65534')"), "{confined}");
    }
    let _ = std::fs::remove_file(&secret);
}

/// The same attacks with the host unprivileged (uid 65534, no capabilities): the worker's user
/// namespace is then one the host may create itself, and every layer must hold the same. Run
/// as root (CI), this test re-runs the attack tests of this binary as `nobody` through
/// `setpriv`; run unprivileged, those tests run directly and this one has nothing to add.
#[test]
fn the_attacks_are_refused_for_an_unprivileged_host_too() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: already unprivileged; the other tests are the check");
        return;
    }
    let Ok(setpriv) = which("setpriv") else {
        panic!("setpriv (util-linux) is needed to run the host unprivileged");
    };
    let tests = [
        "a_0600_file_of_the_hosts_user_outside_the_grants_cannot_be_read",
        "etc_passwd_is_not_visible",
        "tcp_connect_to_a_listener_on_loopback_fails",
        "unix_and_abstract_socket_connects_fail",
        // Not `dangerous_calls_...`: unprivileged, `userfaultfd` is off in this kernel
        // (vm.unprivileged_userfaultfd = 0) even unconfined, so its attack is not live.
        "execve_is_refused_by_the_workers_own_filter",
        "a_worker_cannot_take_a_kernel_budget_it_shares_with_its_host",
        "the_parent_death_signal_cannot_be_cleared",
        "vsock_and_netlink_sockets_cannot_be_created",
        "system_v_shared_memory_is_counted_by_the_cgroup_or_refused",
        "a_worker_cannot_forge_its_siblings_answer",
        "the_host_reports_what_it_verified",
        "invariant_11_a_worker_is_confined_by_default_and_verified_from_outside",
        "the_sandboxs_init_is_as_unreadable_as_the_host",
        "the_keeper_and_init_keep_no_copy_of_the_hosts_memory",
        "init_is_never_given_a_copy_of_the_hosts_memory",
        "a_worker_in_another_language_is_confined_by_the_hosts_layers",
    ];
    // One at a time (every re-run is): a thief that cannot tell its sibling's pipes apart
    // takes any of the host's, which must then be its sibling's only.
    rerun_through_setpriv(
        &setpriv,
        &["--reuid", "65534", "--regid", "65534", "--clear-groups"],
        &tests,
    );
}

/// Re-runs `tests` of this binary, one at a time, through `setpriv` with `options`, from `/`
/// (out of any directory only root may enter), and asserts that every one passed.
fn rerun_through_setpriv(setpriv: &std::path::Path, options: &[&str], tests: &[&str]) {
    let output = std::process::Command::new(setpriv)
        .args(options)
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "--test-threads=1"])
        .args(tests)
        .current_dir("/")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(&format!("{} passed", tests.len())),
        "setpriv {options:?}:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A root host without `CAP_SYS_ADMIN` or `CAP_SYS_PTRACE` (a service whose bounding set
/// dropped one) cannot hand its workers' user namespaces to their uid, and must still confine
/// them in namespaces of their own (root then owns them: SECURITY.md). Run as root, this test
/// re-runs some of this binary's tests under `setpriv --bounding-set` without each.
#[test]
fn a_root_host_without_cap_sys_admin_or_sys_ptrace_still_confines_its_workers() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: not root; the unprivileged host's own run is the check");
        return;
    }
    let Ok(setpriv) = which("setpriv") else {
        panic!("setpriv (util-linux) is needed to drop a capability from the host");
    };
    let tests = [
        "the_host_reports_what_it_verified",
        "invariant_11_a_worker_is_confined_by_default_and_verified_from_outside",
        "a_worker_cannot_take_a_kernel_budget_it_shares_with_its_host",
        "init_is_never_given_a_copy_of_the_hosts_memory",
    ];
    // Its re-runs use up root's budgets as the tests in this process do.
    let _alone = HOST_USERS_BUDGETS.blocking_lock();
    for dropped in ["-sys_admin", "-sys_ptrace"] {
        rerun_through_setpriv(
            &setpriv,
            &["--bounding-set", dropped, "--inh-caps", dropped],
            &tests,
        );
    }
}

/// Set in the re-run of [`best_effort_starts_a_confined_worker_where_namespaces_are_unavailable`]
/// inside a user namespace that may create no more.
const NO_NAMESPACES_ENV: &str = "AIRLOCK_TEST_NO_NAMESPACES";

/// Where the kernel offers no namespaces, `strict()` refuses to start a worker and
/// `strict().best_effort()` starts it with the other layers, which still refuse what
/// namespaces would have (the host's secret, a network socket), and reports what is missing.
/// The test re-runs itself inside a user namespace that may create no more
/// (`max_user_namespaces` 0 there), as on a kernel without them.
#[test]
fn best_effort_starts_a_confined_worker_where_namespaces_are_unavailable() {
    let name = "best_effort_starts_a_confined_worker_where_namespaces_are_unavailable";
    if !in_a_rerun_without_user_namespaces(name, false) {
        return;
    }
    two_thread_runtime().block_on(async {
        let refused = Host::builder(attack_bin()).spawn().await;
        assert!(
            matches!(
                &refused,
                Err(airlock_host::SpawnError::Confinement(
                    airlock_host::ConfinementError::Unsupported {
                        feature: airlock_host::Feature::Namespaces,
                        ..
                    }
                ))
            ),
            "strict() must refuse to start without namespaces: {:?}",
            refused.as_ref().map(|_| ())
        );

        // A root host's worker, dropped to 65534 with no mount namespace of its own, could
        // not enter the host's socket directory: refused at once, saying why.
        let named = Host::builder(attack_bin())
            .transport(airlock_host::TransportChoice::SocketNamed)
            .confinement(Confinement::strict().best_effort())
            .spawn()
            .await;
        assert!(
            matches!(
                &named,
                Err(airlock_host::SpawnError::Confinement(
                    airlock_host::ConfinementError::NamedSocketNeedsNamespaces
                ))
            ),
            "{:?}",
            named.as_ref().map(|_| ())
        );

        let dir = ScratchDir::new("no-namespaces");
        let secret = dir.join("secret");
        std::fs::write(&secret, "the host's secret").unwrap();
        let host = Host::builder(attack_bin())
            .confinement(Confinement::strict().best_effort())
            .spawn()
            .await
            .expect("best_effort starts the worker without namespaces");
        let report = host.worker_info().confinement.clone();
        assert!(
            !report.namespaces && report.missing == [airlock_host::Feature::Namespaces],
            "{report:?}"
        );
        assert!(
            report.seccomp_filters > 0 && report.landlock_abi.is_some(),
            "{report:?}"
        );
        // A worker reported under a cgroup is in one of its own, in every hierarchy (the host
        // checks it from outside, as with namespaces).
        let worker = host.worker_pid().unwrap();
        if report.cgroup {
            let cgroups = std::fs::read_to_string(format!("/proc/{worker}/cgroup")).unwrap();
            let own = |path: Option<&str>| {
                path.and_then(|p| p.rsplit('/').next())
                    .is_some_and(|name| name.starts_with("airlock-"))
            };
            let v1 = |controller| cgroups.lines().find_map(|l| v1_path(l, controller));
            let v2 = cgroups.lines().find_map(|line| line.strip_prefix("0::"));
            assert!(
                (own(v1("memory")) && own(v1("pids"))) || own(v2),
                "the worker is in its own cgroup in every hierarchy: {cgroups}"
            );
        }
        let echoed = host
            .call::<Echo>(&ByteBuf::from(b"still serving".to_vec()))
            .await;
        assert_eq!(echoed.map(ByteBuf::into_vec), Ok(b"still serving".to_vec()));
        host.shutdown().await;

        // The host's own layers (no filter of the worker's) still refuse what namespaces
        // would have: the host's secret (Landlock; DAC would let 65534 read it), an IP socket.
        // A Unix socket pair is allowed (the worker above started), but only a stream pair,
        // and nothing of the worker's may bind a name: without a network namespace a datagram
        // end reaches any datagram socket it can name, and an abstract name is the machine's.
        airlock_tests::e2e::share_with_worker(&dir);
        let victim_path = dir.join("victim.sock");
        let victim = std::os::unix::net::UnixDatagram::bind(&victim_path).unwrap();
        victim.set_nonblocking(true).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&victim_path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let abstract_name = format!("airlock-test-{}", std::process::id());
        for (attack, arg, refused_at) in [
            ("read", secret.display().to_string(), "read"),
            ("socket", libc::AF_INET.to_string(), "socket"),
            (
                "dgram_pair_sendto",
                victim_path.display().to_string(),
                "socketpair",
            ),
            ("pair_bind_abstract", abstract_name, "bind"),
        ] {
            let live = attempt(Confinement::none(), false, attack, &arg).await;
            assert!(
                live.is_ok(),
                "{attack}({arg}) must work unconfined: {live:?}"
            );
            let refused = attempt(Confinement::strict().best_effort(), false, attack, &arg).await;
            assert!(
                matches!(&refused, Err(CallError::Remote(e)) if e.message().starts_with(refused_at)),
                "{attack}({arg}) must be refused at {refused_at} without namespaces: {refused:?}"
            );
        }
        // What the unconfined worker sent arrived; nothing more did.
        let mut received = [0u8; 64];
        let n = victim
            .recv(&mut received)
            .expect("the unconfined datagram arrived");
        assert_eq!(&received[..n], b"forged by the worker");
        assert!(
            victim.recv(&mut received).is_err(),
            "a confined worker's datagram arrived"
        );
    });
}

/// A worker that connects its channel itself (a named socket) may make a Unix stream socket
/// where it has no network namespace, and nothing else: a datagram socket could send to any
/// Unix datagram socket it can name. Nor may it take a name to listen on by the back door of
/// autobind. Run by an unprivileged host (a root host's worker, dropped
/// to 65534, cannot reach the host's socket directory without a mount namespace of its own),
/// re-run in a user namespace that may create no more.
#[test]
fn a_worker_on_a_named_socket_without_namespaces_makes_no_datagram_socket() {
    let name = "a_worker_on_a_named_socket_without_namespaces_makes_no_datagram_socket";
    if !in_a_rerun_without_user_namespaces(name, true) {
        return;
    }
    two_thread_runtime().block_on(async {
        let dir = ScratchDir::new("named-no-namespaces");
        let victim_path = dir.join("victim.sock");
        let victim = std::os::unix::net::UnixDatagram::bind(&victim_path).unwrap();
        victim.set_nonblocking(true).unwrap();
        let arg = victim_path.display().to_string();
        let on_a_named_socket = |policy: Confinement| {
            Host::builder(attack_bin())
                .arg(NO_SELF_FILTER)
                .transport(airlock_host::TransportChoice::SocketNamed)
                .confinement(policy)
        };
        // A stream socket that asks for its peer's credentials is given an abstract name as
        // it connects (anywhere), on which it could then listen for the machine's processes.
        let nowhere = dir.join("nowhere.sock").display().to_string();
        for (attack, arg, refused_at) in [
            ("dgram_socket_sendto", &arg, "socket"),
            ("autobind_listen", &nowhere, "setsockopt"),
        ] {
            let mut outcomes = Vec::new();
            for policy in [Confinement::none(), Confinement::strict().best_effort()] {
                let host = on_a_named_socket(policy).spawn().await.unwrap();
                let report = host.worker_info().confinement.clone();
                let outcome = host
                    .call::<Attack>(&(attack.to_string(), arg.clone()))
                    .await;
                host.shutdown().await;
                outcomes.push((report, outcome));
            }
            let (unconfined, confined) = (&outcomes[0], &outcomes[1]);
            assert!(unconfined.1.is_ok(), "unconfined, {attack} works: {unconfined:?}");
            assert!(
                confined.0.missing == [airlock_host::Feature::Namespaces]
                    && matches!(&confined.1, Err(CallError::Remote(e)) if e.message().starts_with(refused_at)),
                "without namespaces, {attack} must be refused at {refused_at}: {confined:?}"
            );
        }
        let mut received = [0u8; 64];
        let n = victim.recv(&mut received).expect("the unconfined datagram arrived");
        assert_eq!(&received[..n], b"forged by the worker");
        assert!(victim.recv(&mut received).is_err(), "a confined worker's datagram arrived");
    });
}

/// Without a PID namespace, a descendant that leaves the worker's session escapes the kill of
/// its process group, but not its cgroup, which a process cannot leave: where the host made
/// one, every process still in it is killed as the worker is reaped, also one whose first
/// thread exited while another runs on (on v1 its `/proc/<pid>/cgroup` names no cgroup of
/// the worker's). Shown live first, under `none()` (where no cgroup holds the descendant),
/// then refused under `strict().best_effort()`; re-run in a user namespace that may create no
/// more.
#[test]
fn without_namespaces_a_descendant_that_leaves_the_session_dies_with_its_cgroup() {
    let name = "without_namespaces_a_descendant_that_leaves_the_session_dies_with_its_cgroup";
    if !in_a_rerun_without_user_namespaces(name, false) {
        return;
    }
    two_thread_runtime().block_on(async {
        use airlock_tests::e2e::{
            kill_named, process_alive, rogue_host_in, the_escaped_descendant,
        };
        // The rogue starts a descendant that leaves its session (`setsid`) and takes a name
        // above any pid (`air-<hex>`, found by `process_alive` in any live thread), then exits
        // at the call. The variable makes the rogue act as it does when confined.
        let escape = |policy: Confinement, leader_exits: bool| async move {
            let dir = ScratchDir::new("escape-the-session");
            let mut builder = rogue_host_in(&dir)
                .confinement(policy.read_write(&*dir))
                .arg("fork_grandchild")
                .env("ROGUE_MARK", dir.join("mark"))
                .env("AIRLOCK_CONFINE_SELF", "1");
            if leader_exits {
                builder = builder.env("ROGUE_LEADER_EXITS", "1");
            }
            let host = builder.spawn().await.unwrap();
            let cgroup = host.worker_info().confinement.cgroup;
            let name = the_escaped_descendant(&host, &dir).await;
            // The host reaps the lost worker before it answers the call; give the descendant
            // time to die all the same.
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while process_alive(name) && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let survived = process_alive(name);
            kill_named(name);
            host.shutdown().await;
            (cgroup, survived)
        };
        for leader_exits in [false, true] {
            let (_, survived) = escape(Confinement::none(), leader_exits).await;
            assert!(
                survived,
                "under none(), the descendant (leader exits: {leader_exits}) must outlive its \
                 worker, or this proves nothing"
            );
            let (cgroup, survived) =
                escape(Confinement::strict().best_effort(), leader_exits).await;
            if !cgroup {
                // On stdout, where the re-run's caller refuses it: a root host makes a cgroup.
                println!(
                    "skipped: this host made no cgroup, and only a cgroup holds the descendant"
                );
                return;
            }
            assert!(
                !survived,
                "a descendant of the worker (leader exits: {leader_exits}) outlived its cgroup"
            );
        }
    });
}

/// True in the re-run of test `name` without user namespaces. Otherwise (root only: only a
/// namespace's root may lower `max_user_namespaces`) runs test `name` of this binary again in
/// a user namespace that may create no more, as uid 65534 when `as_nobody`, asserts that it
/// passed there, and returns false.
fn in_a_rerun_without_user_namespaces(name: &str, as_nobody: bool) -> bool {
    if std::env::var_os(NO_NAMESPACES_ENV).is_some() {
        return true;
    }
    if !rustix::process::geteuid().is_root() {
        // An unprivileged host mapped to root in the namespace would take itself for root.
        eprintln!("skipped: only root can take user namespaces away and keep its own ids");
        return false;
    }
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let mut command = vec![exe, "--exact", name, "--nocapture"];
    let setpriv;
    if as_nobody {
        let Ok(found) = which("setpriv") else {
            panic!("setpriv (util-linux) is needed to run the host unprivileged");
        };
        setpriv = found;
        let nobody = airlock_tests::support::AS_NOBODY;
        command = [&[setpriv.to_str().unwrap()], &nobody[..], &command[..]].concat();
    }
    let output = airlock_tests::support::run_without_user_namespaces(
        std::path::Path::new(command[0]),
        &command[1..],
        &[(NO_NAMESPACES_ENV, "1")],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    // A re-run that passed without making its check says so on stdout.
    assert!(
        output.status.success() && stdout.contains("1 passed") && !stdout.contains("skipped:"),
        "without user namespaces ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    false
}

fn two_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn which(program: &str) -> std::io::Result<std::path::PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|dir| std::path::Path::new(dir).join(program))
        .find(|p| p.exists())
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
}

/// A worker cannot redirect what its replacement is granted: it swaps a read-only grant that
/// lies under its read-write grant for a symlink to a host secret, then crashes. Resolved
/// afresh, the grant would now hand the replacement the secret (shown with a new host); the
/// host pinned what the grant named at its first spawn, and refuses the swapped path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cannot_redirect_its_replacements_grants() {
    // dir (read-write) holds sub/inner (read-only); the secret is elsewhere, as `inner` too.
    let dir = ScratchDir::new("confinement-pin");
    airlock_tests::e2e::share_with_worker(&dir);
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    airlock_tests::e2e::share_with_worker(&sub);
    let inner = sub.join("inner");
    std::fs::write(&inner, "innocent").unwrap();
    let secret_dir = ScratchDir::new("confinement-pin-secret");
    airlock_tests::e2e::share_with_worker(&secret_dir);
    let secret = secret_dir.join("inner");
    std::fs::write(&secret, "the host's secret").unwrap();
    let policy = || Confinement::strict().read_write(&*dir).read_only(&inner);
    let read_secret = ("read".to_string(), secret.display().to_string());
    // A worker in another language has no allowlist of its own to stop the symlink.
    let worker = || {
        Host::builder(attack_bin())
            .arg(NO_SELF_FILTER)
            .confinement(policy())
    };

    let host = worker()
        .restart_policy(airlock_host::RestartPolicy {
            max_restarts: 3,
            initial_backoff: Duration::from_millis(1),
            ..Default::default()
        })
        .spawn()
        .await
        .unwrap();
    assert!(
        host.call::<Attack>(&read_secret).await.is_err(),
        "not granted yet"
    );
    let swap = format!("{}|{}", secret_dir.display(), sub.display());
    assert_eq!(
        host.call::<Attack>(&("symlink".to_string(), swap)).await,
        Ok("replaced".to_string())
    );
    let _ = host
        .call::<Attack>(&("crash".to_string(), String::new()))
        .await;

    // Live: a policy resolved afresh now grants the secret.
    let fresh = worker().spawn().await.unwrap();
    assert_eq!(
        fresh.call::<Attack>(&read_secret).await,
        Ok("the host's secret".to_string()),
        "resolved afresh, the swapped grant must hand over the secret, or this proves nothing"
    );
    fresh.shutdown().await;

    // The pinned host refuses to start a replacement on the swapped path.
    let after = host.call::<Attack>(&read_secret).await;
    assert!(
        !matches!(after, Ok(ref s) if s.contains("secret")),
        "the replacement was handed the secret: {after:?}"
    );
    host.shutdown().await;
}

/// The sandbox's init is a fork of the host, with a copy of its memory: it must be as
/// unreadable as the host. Live: unconfined, the worker reads the host's memory map; confined,
/// init's (PID 1 in the worker's namespace) is refused, also for an unprivileged host, whose
/// init keeps the worker's uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandboxs_init_is_as_unreadable_as_the_host() {
    let live = attempt(
        Confinement::none(),
        false,
        "read",
        &format!("/proc/{}/maps", std::process::id()),
    )
    .await;
    assert!(
        live.is_ok(),
        "unconfined, the host's map is readable: {live:?}"
    );
    for file in ["maps", "environ", "mem"] {
        let refused = attempt(
            Confinement::strict(),
            false,
            "read",
            &format!("/proc/1/{file}"),
        )
        .await;
        assert!(
            matches!(refused, Err(CallError::Remote(_))),
            "init's {file} must not be readable: {refused:?}"
        );
    }
}
