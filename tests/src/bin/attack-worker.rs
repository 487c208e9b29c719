//! `attack-worker [--no-self-filter]`: an airlock worker whose one method, `attack`, tries one
//! escape from its sandbox per call and reports what happened: `Ok(evidence)` when the attempt
//! worked, a handler error with the OS error when it was refused. The confinement suite calls
//! it under `Confinement::none()` (every attempt must work: the attack is live) and under the
//! default (every attempt must fail).
//!
//! With `--no-self-filter` it does not install the worker library's own seccomp allowlist, so
//! only the layers the host applies to any program stand in the way.

#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use airlock_tests::attack::{Attack, NO_SELF_FILTER};
use airlock_worker::{HandlerError, Worker};

fn refused(what: &str, err: impl std::fmt::Display) -> HandlerError {
    HandlerError::new(format!("{what}: {err}"))
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn number(arg: &str) -> Result<i64, HandlerError> {
    arg.parse()
        .map_err(|_| HandlerError::new(format!("not a number: {arg}")))
}

fn attack(name: &str, arg: &str) -> Result<String, HandlerError> {
    match name {
        "read" => std::fs::read_to_string(arg).map_err(|e| refused("read", e)),
        "write" => std::fs::write(arg, b"written by the worker")
            .map(|()| "written".into())
            .map_err(|e| refused("write", e)),
        "tcp" => std::net::TcpStream::connect(arg)
            .map(|_| "connected".into())
            .map_err(|e| refused("tcp", e)),
        "unix" => std::os::unix::net::UnixStream::connect(arg)
            .map(|_| "connected".into())
            .map_err(|e| refused("unix", e)),
        "abstract" => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(arg.as_bytes())
                .map_err(|e| refused("abstract", e))?;
            std::os::unix::net::UnixStream::connect_addr(&addr)
                .map(|_| "connected".into())
                .map_err(|e| refused("abstract", e))
        }
        "kill" => {
            // SAFETY: signal 0 delivers nothing.
            let rc = unsafe { libc::kill(number(arg)? as i32, 0) };
            if rc == 0 {
                Ok("signalled".into())
            } else {
                Err(refused("kill", errno()))
            }
        }
        "ptrace" => {
            let pid = number(arg)? as i32;
            // SAFETY: PTRACE_SEIZE takes no memory; detached again at once.
            let rc = unsafe { libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) };
            if rc != 0 {
                return Err(refused("ptrace", errno()));
            }
            // SAFETY: as above.
            unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
            Ok("attached".into())
        }
        "vm_readv" => {
            let (pid, addr) = arg
                .split_once(':')
                .ok_or_else(|| HandlerError::new("pid:addr"))?;
            let mut buf = [0u8; 8];
            let local = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            let remote = libc::iovec {
                iov_base: number(addr)? as usize as *mut libc::c_void,
                iov_len: 8,
            };
            // SAFETY: reads into our own 8-byte buffer.
            let n =
                unsafe { libc::process_vm_readv(number(pid)? as i32, &local, 1, &remote, 1, 0) };
            if n == 8 {
                Ok(format!("{:02x?}", buf))
            } else {
                Err(refused("process_vm_readv", errno()))
            }
        }
        "proc_mem" => {
            let (pid, addr) = arg
                .split_once(':')
                .ok_or_else(|| HandlerError::new("pid:addr"))?;
            let file = std::fs::File::open(format!("/proc/{pid}/mem"))
                .map_err(|e| refused("open mem", e))?;
            let mut buf = [0u8; 8];
            file.read_exact_at(&mut buf, number(addr)? as u64)
                .map_err(|e| refused("read mem", e))?;
            Ok(format!("{:02x?}", buf))
        }
        "pidfd_getfd" => {
            let pid = number(arg)? as i32;
            // SAFETY: plain system calls on integers.
            let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            if pidfd < 0 {
                return Err(refused("pidfd_open", errno()));
            }
            // SAFETY: as above; fd 0 of the target.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, 0, 0) };
            if fd < 0 {
                Err(refused("pidfd_getfd", errno()))
            } else {
                Ok(format!("got fd {fd}"))
            }
        }
        "exec" => std::process::Command::new(arg)
            .output()
            .map(|o| format!("ran: {}", o.status))
            .map_err(|e| refused("exec", e)),
        "userfaultfd" => {
            // SAFETY: a plain system call; the descriptor is leaked, the process is a test's.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, 0) };
            if fd < 0 {
                Err(refused("userfaultfd", errno()))
            } else {
                Ok("userfaultfd".into())
            }
        }
        "pipe_lock_calls" => {
            // The calls that can hold a pipe's lock while they wait (`splice`, `tee`,
            // `vmsplice`, `sendfile`), each made once without waiting: available if the kernel ran it (it
            // found nothing to move, or moved a byte), refused if the filter answered first.
            let available = pipe_lock_calls::available();
            if available.is_empty() {
                Err(refused("splice, tee, vmsplice and sendfile", errno()))
            } else {
                Ok(available.join(" "))
            }
        }
        "unshare_user" => {
            // A new user namespace needs a single-threaded caller: a forked child tries.
            // SAFETY: the child makes one system call and exits with its result.
            match unsafe { libc::fork() } {
                0 => unsafe {
                    let rc = libc::unshare(libc::CLONE_NEWUSER);
                    libc::_exit(if rc == 0 {
                        0
                    } else {
                        *libc::__errno_location()
                    })
                },
                -1 => Err(refused("fork", errno())),
                pid => {
                    let mut status = 0;
                    // SAFETY: reaping our own child into a local.
                    unsafe { libc::waitpid(pid, &mut status, 0) };
                    match libc::WEXITSTATUS(status) {
                        0 => Ok("unshared".into()),
                        code => Err(refused("unshare", std::io::Error::from_raw_os_error(code))),
                    }
                }
            }
        }
        // Outlives the end of its channel: the runtime waits for a running blocking handler.
        "stall" => {
            std::thread::sleep(Duration::from_secs(number(arg)? as u64));
            Ok("stalled".into())
        }
        // Replaces the process with `sleep` from a second thread, keeping every descriptor
        // (the channel too, so the host sees nothing). A thread's `execve` takes over the
        // process with that thread's parent-death signal, which is never set: only what holds
        // the process from outside (its PID namespace) can still end it with the host.
        "exec_from_thread" => {
            for fd in 0..1024 {
                // SAFETY: clearing close-on-exec on descriptors this process holds.
                unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
            }
            let thread = std::thread::spawn(|| {
                let path = c"/bin/sleep";
                let args = [c"sleep".as_ptr(), c"1000".as_ptr(), std::ptr::null()];
                // SAFETY: a NUL-terminated argv of static C strings; execv returns only on error.
                unsafe { libc::execv(path.as_ptr(), args.as_ptr()) };
                errno()
            });
            match thread.join() {
                Ok(err) => Err(refused("execv from a thread", err)),
                Err(_) => Err(HandlerError::new("the thread panicked")),
            }
        }
        // Replaces `link` (a path under a read-write grant) with a symlink to `target`.
        "symlink" => {
            let (target, link) = arg
                .split_once('|')
                .ok_or_else(|| HandlerError::new("target|link"))?;
            // Moved aside rather than removed: it may hold a mount point, which cannot go.
            let _ = std::fs::rename(link, format!("{link}.old"));
            std::os::unix::fs::symlink(target, link)
                .map(|()| "replaced".into())
                .map_err(|e| refused("symlink", e))
        }
        "clear_pdeathsig" => {
            // SAFETY: a plain prctl on integers.
            let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, 0, 0, 0, 0) };
            if rc == 0 {
                Ok("cleared".into())
            } else {
                Err(refused("prctl", errno()))
            }
        }
        "crash" => {
            // A real fault, not `raise`: PID 1 of a namespace ignores signals it sends itself
            // without a handler, but not a fault's.
            // SAFETY: deliberately not safe: the read faults, which is the point.
            let byte = unsafe { std::ptr::read_volatile(std::ptr::null::<u8>()) };
            Ok(format!("survived ({byte})"))
        }
        "socket" => {
            let family = number(arg)? as i32;
            // SAFETY: a plain system call; the descriptor is closed at once.
            let fd = unsafe { libc::socket(family, libc::SOCK_STREAM, 0) };
            if fd < 0 {
                let dgram = unsafe { libc::socket(family, libc::SOCK_DGRAM, 0) };
                if dgram < 0 {
                    return Err(refused("socket", errno()));
                }
                unsafe { libc::close(dgram) };
            } else {
                unsafe { libc::close(fd) };
            }
            Ok("created".into())
        }
        "memfd_fill" => {
            let bytes = number(arg)?;
            // SAFETY: plain system calls on a descriptor we own.
            let fd = unsafe { libc::memfd_create(c"fill".as_ptr(), 0) };
            if fd < 0 {
                return Err(refused("memfd_create", errno()));
            }
            let rc = unsafe { libc::fallocate(fd, 0, 0, bytes) };
            if rc != 0 {
                Err(refused("fallocate", errno()))
            } else {
                Ok(format!("filled {bytes}"))
            }
        }
        "sysv_shm_fill" => sysv_shm_fill(number(arg)? as usize),
        "dgram_pair_sendto" => dgram_pair_sendto(arg),
        "dgram_socket_sendto" => dgram_socket_sendto(arg),
        "autobind_listen" => autobind_listen(arg),
        "pair_bind_abstract" => pair_bind_abstract(arg),
        "fork_many" => fork_many(number(arg)? as usize),
        "alloc" => {
            // Infallible on purpose: past the memory limit the process aborts, as a
            // runaway worker would.
            let block = vec![1u8; number(arg)? as usize];
            Ok(format!(
                "allocated {} (last byte {})",
                block.len(),
                block.last().copied().unwrap_or(0)
            ))
        }
        "steal_sibling" => {
            let (host, victim) = arg
                .split_once(':')
                .ok_or_else(|| HandlerError::new("host:victim"))?;
            steal_sibling(number(host)? as i32, number(victim)? as i32)
        }
        "pass_fd_to_host" => pass_fd_to_host(),
        // A kernel budget the worker shares with others (`inotify`, `fanotify`, `aio`,
        // `timers`, `mqueue`):
        // `take_budget` takes all it can and keeps it for the worker's life; `use_budget`
        // takes one and gives it back at once.
        "take_budget" => shared_budget::take(shared_budget::Budget::named(arg)?),
        "use_budget" if arg == "epoll" => shared_budget::use_epoll_watch(),
        "use_budget" => shared_budget::use_one(shared_budget::Budget::named(arg)?),
        // The epoll watches the kernel allows the worker's uid (per user, for the whole
        // machine): `take_epoll_watches N` has N children take them all and keep them.
        "take_epoll_watches" => shared_budget::take_epoll_watches(number(arg)? as usize),
        // Standard signals its processes send themselves, which pass the pending-signal
        // limit: `take_standard_signals N` has N children queue them and keep them.
        "take_standard_signals" => shared_budget::take_standard_signals(number(arg)? as usize),
        other => Err(HandlerError::new(format!("unknown attack {other}"))),
    }
}

/// On every connected Unix stream socket this worker holds whose peer is its parent, the host
/// of an unconfined worker (its channel, over the socket transports), sends one byte with the write end of a fresh pipe attached (`SCM_RIGHTS`): a
/// descriptor the host's `recv` would close on its own thread, where closing a pipe waits for
/// a lock the worker can hold. `Ok` names the sockets a descriptor went out on (the stray byte
/// then breaks the channel's framing); refused sends are the error, with their OS errors.
fn pass_fd_to_host() -> Result<String, HandlerError> {
    use rustix::net::{sendmsg, sockopt, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::os::fd::{AsFd, BorrowedFd};
    let (mut sent, mut refusals) = (Vec::new(), Vec::new());
    for raw in 3..256 {
        // SAFETY: the borrow only lives for the `getsockopt` and `sendmsg` calls below, which
        // neither close nor keep it; a number with nothing open fails them with `EBADF`.
        let fd = unsafe { BorrowedFd::borrow_raw(raw) };
        let stream = sockopt::socket_type(fd) == Ok(rustix::net::SocketType::STREAM);
        let unix = sockopt::socket_domain(fd) == Ok(rustix::net::AddressFamily::UNIX);
        if !stream || !unix || sockopt::socket_acceptconn(fd).unwrap_or(true) {
            continue;
        }
        let peer = sockopt::socket_peercred(fd).map(|cred| cred.pid);
        if peer.ok() != rustix::process::getppid() {
            continue;
        }
        let (_read, write) = rustix::pipe::pipe().map_err(|e| refused("pipe", e))?;
        let fds = [write.as_fd()];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
        let flags = SendFlags::DONTWAIT | SendFlags::NOSIGNAL;
        match sendmsg(fd, &[std::io::IoSlice::new(&[0])], &mut control, flags) {
            Ok(_) => sent.push(format!("sent fd {raw}")),
            Err(err) => refusals.push(format!("fd {raw}: {}", std::io::Error::from(err))),
        }
    }
    match (sent.is_empty(), refusals.is_empty()) {
        (false, _) => Ok(sent.join("; ")),
        (true, true) => Err(HandlerError::new("no Unix stream socket to the host")),
        (true, false) => Err(HandlerError::new(format!(
            "sendmsg refused: {}",
            refusals.join("; ")
        ))),
    }
}

/// Fills `total` bytes of System V shared memory in 16 MiB segments, each attached, written
/// and detached again: a detached segment keeps its memory but takes no address space, so
/// `RLIMIT_AS` does not bound the total. The segments are removed before it answers.
fn sysv_shm_fill(total: usize) -> Result<String, HandlerError> {
    const SEGMENT: usize = 16 << 20;
    let mut segments = Vec::new();
    let mut filled = 0;
    let outcome = loop {
        if filled >= total {
            break Ok(format!("filled {filled} in {} segments", segments.len()));
        }
        // SAFETY: plain system calls; the mapping is written only within its `SEGMENT`
        // bytes and detached before the next one is made.
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, SEGMENT, libc::IPC_CREAT | 0o600) };
        if id < 0 {
            break Err(refused("shmget", errno()));
        }
        segments.push(id);
        let at = unsafe { libc::shmat(id, std::ptr::null(), 0) };
        if at as isize == -1 {
            break Err(refused("shmat", errno()));
        }
        unsafe {
            std::ptr::write_bytes(at.cast::<u8>(), 1, SEGMENT);
            libc::shmdt(at);
        }
        filled += SEGMENT;
    };
    for id in segments {
        // SAFETY: removes a segment this process made.
        unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
    }
    outcome
}

/// A Unix socket address: the pathname `name`, or with `abstract_name` the abstract one.
fn unix_address(name: &[u8], abstract_name: bool) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: all-zero bytes are a valid `sockaddr_un`.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let start = usize::from(abstract_name);
    for (slot, byte) in address.sun_path[start..].iter_mut().zip(name) {
        *slot = *byte as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + start + name.len();
    (address, len as libc::socklen_t)
}

/// A Unix socket pair of `kind` (`SOCK_STREAM`, `SOCK_DGRAM`); its descriptors are left open
/// for the worker's life, as an attacker's would be.
fn unix_pair(kind: i32) -> Result<[i32; 2], HandlerError> {
    let mut ends = [0i32; 2];
    // SAFETY: a plain system call writing two descriptors into our own array.
    if unsafe { libc::socketpair(libc::AF_UNIX, kind, 0, ends.as_mut_ptr()) } != 0 {
        return Err(refused("socketpair", errno()));
    }
    Ok(ends)
}

/// Sends a datagram from one end of a datagram socket pair to the Unix datagram socket at
/// `path`: an explicit address overrides the end's peer.
fn dgram_pair_sendto(path: &str) -> Result<String, HandlerError> {
    let ends = unix_pair(libc::SOCK_DGRAM)?;
    send_datagram(ends[0], path)
}

/// Sends a datagram from a Unix datagram socket of its own to the one at `path`.
fn dgram_socket_sendto(path: &str) -> Result<String, HandlerError> {
    // SAFETY: a plain system call; the descriptor is left open for the worker's life.
    let socket = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0) };
    if socket < 0 {
        return Err(refused("socket", errno()));
    }
    send_datagram(socket, path)
}

/// Sends "forged by the worker" from `socket` to the Unix datagram socket at `path`.
fn send_datagram(socket: i32, path: &str) -> Result<String, HandlerError> {
    let (address, len) = unix_address(path.as_bytes(), false);
    let message = b"forged by the worker";
    // SAFETY: sends our own message to our own address from a descriptor we own.
    let sent = unsafe {
        libc::sendto(
            socket,
            message.as_ptr().cast(),
            message.len(),
            0,
            (&raw const address).cast(),
            len,
        )
    };
    if sent < 0 {
        return Err(refused("sendto", errno()));
    }
    Ok(format!("sent {sent}"))
}

/// Takes an abstract name without `bind` and listens on it: a Unix stream socket that asks
/// for its peer's credentials is given a name by the kernel as it connects (here to `path`,
/// which need not exist), and may then `listen`. Answers the name.
fn autobind_listen(path: &str) -> Result<String, HandlerError> {
    // SAFETY: plain system calls on a descriptor we own (left open for the worker's life),
    // with our own option value and addresses.
    unsafe {
        let socket = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        if socket < 0 {
            return Err(refused("socket", errno()));
        }
        let on: libc::c_int = 1;
        let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let option = (&raw const on).cast();
        if libc::setsockopt(socket, libc::SOL_SOCKET, libc::SO_PASSCRED, option, size) != 0 {
            return Err(refused("setsockopt", errno()));
        }
        let (address, len) = unix_address(path.as_bytes(), false);
        libc::connect(socket, (&raw const address).cast(), len);
        if libc::listen(socket, 8) != 0 {
            return Err(refused("listen", errno()));
        }
        let mut name: libc::sockaddr_un = std::mem::zeroed();
        let mut name_len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        libc::getsockname(socket, (&raw mut name).cast(), &mut name_len);
        let taken = name.sun_path[1..]
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8 as char)
            .collect::<String>();
        Ok(format!("listening on @{taken}"))
    }
}

/// Binds one end of a (stream) socket pair to the abstract name `name`, which then is taken
/// for every process of the network namespace.
fn pair_bind_abstract(name: &str) -> Result<String, HandlerError> {
    let ends = unix_pair(libc::SOCK_STREAM)?;
    let (address, len) = unix_address(name.as_bytes(), true);
    // SAFETY: binds a descriptor we own to our own address.
    if unsafe { libc::bind(ends[0], (&raw const address).cast(), len) } != 0 {
        return Err(refused("bind", errno()));
    }
    Ok("bound".into())
}

/// Forks `n` children at once, each sleeping a second; answers how many started.
fn fork_many(n: usize) -> Result<String, HandlerError> {
    let mut started = 0;
    let mut last_error = None;
    let mut children = Vec::new();
    for _ in 0..n {
        // SAFETY: the child only sleeps and exits with async-signal-safe calls.
        match unsafe { libc::fork() } {
            0 => unsafe {
                libc::sleep(1);
                libc::_exit(0)
            },
            -1 => last_error = Some(errno()),
            pid => {
                started += 1;
                children.push(pid);
            }
        }
    }
    for pid in children {
        // SAFETY: reaping our own children.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
    match last_error {
        None => Ok(format!("forked {started}")),
        Some(err) => Err(refused(&format!("forked {started} of {n}"), err)),
    }
}

/// Through `/proc/<host>/fd`, reads calls off the pipes the host writes to a sibling worker
/// and answers each `echo` with a forged `Return` into the pipe the host reads the sibling's
/// answers from. Runs for up to 10 s or until one forgery was written.
fn steal_sibling(host: i32, victim: i32) -> Result<String, HandlerError> {
    use airlock_protocol::frame::{encode_frame, Frame, Return};
    use airlock_protocol::{decode_frame, FrameDecoder};
    // Every pipe of our own (the channel is not on fds 0 and 1 any more) is left alone.
    let own: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default();
    // The victim's own pipes: only those of the host's pipes are the victim's channel.
    // (A non-dumpable sibling of another user's host hides them: then any pipe of the host's
    // that is not ours will do.)
    let victims: Option<Vec<String>> = std::fs::read_dir(format!("/proc/{victim}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| p.display().to_string())
                .collect()
        })
        .ok();
    let fd_dir = format!("/proc/{host}/fd");
    let entries = std::fs::read_dir(&fd_dir).map_err(|e| refused("list host fds", e))?;
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    for entry in entries.flatten() {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.display().to_string();
        let theirs = victims.as_ref().is_none_or(|v| v.contains(&target));
        if !target.starts_with("pipe:") || own.contains(&target) || !theirs {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let flags =
            std::fs::read_to_string(format!("/proc/{host}/fdinfo/{name}")).unwrap_or_default();
        let write_end = flags
            .lines()
            .any(|l| l.starts_with("flags:") && l.trim().ends_with('1'));
        let path = entry.path();
        if write_end {
            // The host writes calls here: open the same pipe for reading.
            use std::os::unix::fs::OpenOptionsExt;
            if let Ok(f) = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
            {
                readers.push(f);
            }
        } else if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&path) {
            writers.push(f);
        }
    }
    if readers.is_empty() || writers.is_empty() {
        return Err(HandlerError::new(format!(
            "no sibling pipes ({} readers, {} writers)",
            readers.len(),
            writers.len()
        )));
    }
    // Freeze the sibling so that every call written to it is ours to read: the race for
    // the pipe is then won every time.
    // SAFETY: a plain signal to a process by pid.
    unsafe { libc::kill(victim, libc::SIGSTOP) };
    let _resume = Resume(vec![victim]);
    let mut decoders: Vec<FrameDecoder> =
        readers.iter().map(|_| FrameDecoder::new(1 << 20)).collect();
    let until = Instant::now() + Duration::from_secs(10);
    let forged =
        airlock_codec::to_vec(&serde_bytes::ByteBuf::from(b"forged".to_vec())).unwrap_or_default();
    while Instant::now() < until {
        for (reader, decoder) in readers.iter_mut().zip(decoders.iter_mut()) {
            let mut chunk = [0u8; 4096];
            if let Ok(n) = reader.read(&mut chunk) {
                decoder.extend(&chunk[..n]);
            }
            while let Ok(Some(raw)) = decoder.next_frame() {
                if let Ok(Frame::Call(call)) = decode_frame(&raw) {
                    if call.method == "echo" {
                        let reply = encode_frame(&Frame::Return(Return {
                            id: call.id,
                            method: call.method,
                            body: &forged,
                        }));
                        for writer in &mut writers {
                            let _ = writer.write_all(&reply);
                        }
                        return Ok("forged".into());
                    }
                }
            }
        }
        std::thread::yield_now();
    }
    Err(HandlerError::new("no sibling call seen"))
}

/// Lets the frozen siblings run again when the attack ends, whatever its outcome.
struct Resume(Vec<i32>);

impl Drop for Resume {
    fn drop(&mut self) {
        for pid in &self.0 {
            // SAFETY: a plain signal to a process by pid.
            unsafe { libc::kill(*pid, libc::SIGCONT) };
        }
    }
}

fn main() -> std::process::ExitCode {
    if std::env::args().any(|a| a == NO_SELF_FILTER) {
        std::env::remove_var(airlock_worker::confine::CONFINE_ENV);
    }
    let worker = Worker::new()
        .identity("attack-worker", "0")
        .blocking_method::<Attack, _>(|(name, arg): (String, String)| attack(&name, &arg))
        .blocking_method::<airlock_worker::builtin::Echo, _>(Ok);
    match worker.serve_blocking() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("attack-worker: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Probes of the calls that hold a pipe's lock while they wait, none of which waits here.
#[allow(unsafe_code)]
mod pipe_lock_calls {
    /// Which of `splice`, `tee`, `vmsplice` and `sendfile` the kernel ran.
    pub(super) fn available() -> Vec<&'static str> {
        let mut sockets = [0 as libc::c_int; 2];
        let mut pipe = [0 as libc::c_int; 2];
        let mut other = [0 as libc::c_int; 2];
        // SAFETY: plain system calls on local arrays; the descriptors are this test process's.
        let made = unsafe {
            libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sockets.as_mut_ptr()) == 0
                && libc::pipe2(pipe.as_mut_ptr(), libc::O_NONBLOCK) == 0
                && libc::pipe2(other.as_mut_ptr(), libc::O_NONBLOCK) == 0
        };
        if !made {
            return Vec::new();
        }
        let ran = |rc: isize| {
            rc >= 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN)
        };
        let flags = libc::SPLICE_F_NONBLOCK;
        let byte = [7u8];
        let iov = libc::iovec {
            iov_base: byte.as_ptr() as *mut libc::c_void,
            iov_len: 1,
        };
        let null = std::ptr::null_mut();
        let mut available = Vec::new();
        // SAFETY: each call reads or writes at most one byte of `byte` or moves data between
        // the descriptors made above; none of them waits (`SPLICE_F_NONBLOCK`, and the socket
        // is non-blocking for `sendfile`).
        unsafe {
            if ran(libc::splice(sockets[0], null, pipe[1], null, 1, flags)) {
                available.push("splice");
            }
            if ran(libc::tee(pipe[0], other[1], 1, flags)) {
                available.push("tee");
            }
            if ran(libc::vmsplice(pipe[1], &iov, 1, flags)) {
                available.push("vmsplice");
            }
            let nonblocking = libc::fcntl(sockets[0], libc::F_GETFL) | libc::O_NONBLOCK;
            libc::fcntl(sockets[0], libc::F_SETFL, nonblocking);
            if ran(libc::sendfile(
                other[1],
                sockets[0],
                std::ptr::null_mut(),
                1,
            )) {
                available.push("sendfile");
            }
        }
        available
    }
}

/// Kernel budgets kept per user or for the whole machine, which a worker shares with every
/// process that draws on the same one.
mod shared_budget {
    use super::{errno, refused, HandlerError};

    /// A budget taken one object at a time.
    #[derive(Clone, Copy)]
    pub enum Budget {
        /// inotify instances: `fs.inotify.max_user_instances` per user (for a user namespace,
        /// its creator's).
        Inotify,
        /// fanotify groups: `fs.fanotify.max_user_groups`, counted as inotify's are.
        Fanotify,
        /// AIO events: `fs.aio-max-nr`, one budget for the whole machine.
        Aio,
        /// POSIX timers, each holding a queued signal: `RLIMIT_SIGPENDING`, counted per user
        /// up the chain of user namespaces (for a worker's, against its creator's too).
        Timers,
        /// POSIX message queues' bytes: `RLIMIT_MSGQUEUE`, counted as signals are. Each is
        /// unlinked as soon as it is opened, so it goes with the last descriptor to it (one the
        /// process may not open stays with its IPC namespace).
        Mqueue,
    }

    impl Budget {
        pub fn named(name: &str) -> Result<Self, HandlerError> {
            match name {
                "inotify" => Ok(Self::Inotify),
                "fanotify" => Ok(Self::Fanotify),
                "aio" => Ok(Self::Aio),
                "timers" => Ok(Self::Timers),
                "mqueue" => Ok(Self::Mqueue),
                other => Err(HandlerError::new(format!("no budget named {other}"))),
            }
        }

        /// Takes `size` of the budget (one instance, group or `size` AIO events), kept
        /// until `give_back`: its handle, or the OS error that refused it.
        fn take(self, size: i64) -> Result<u64, std::io::Error> {
            // SAFETY: plain system calls; `io_setup` writes the new context into `ctx`.
            let taken = unsafe {
                match self {
                    Self::Inotify => libc::inotify_init1(libc::IN_CLOEXEC) as i64,
                    Self::Fanotify => libc::fanotify_init(
                        libc::FAN_CLASS_NOTIF | libc::FAN_REPORT_FID | libc::FAN_CLOEXEC,
                        libc::O_RDONLY as libc::c_uint,
                    ) as i64,
                    Self::Aio => {
                        let mut ctx: libc::c_ulong = 0;
                        match libc::syscall(libc::SYS_io_setup, size, &mut ctx) {
                            0 => ctx as i64,
                            _ => -1,
                        }
                    }
                    Self::Timers => {
                        let mut event: libc::sigevent = std::mem::zeroed();
                        event.sigev_notify = libc::SIGEV_NONE;
                        let mut timer: libc::timer_t = std::ptr::null_mut();
                        match libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) {
                            0 => timer as i64,
                            _ => -1,
                        }
                    }
                    Self::Mqueue => {
                        static MADE: std::sync::atomic::AtomicU64 =
                            std::sync::atomic::AtomicU64::new(0);
                        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let name = std::ffi::CString::new(format!(
                            "/airlock-attack-{}-{made}",
                            std::process::id()
                        ))
                        .expect("no NUL");
                        let queue = libc::mq_open(
                            name.as_ptr(),
                            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC,
                            0o600 as libc::mode_t,
                            std::ptr::null::<libc::mq_attr>(),
                        );
                        if queue >= 0 {
                            libc::mq_unlink(name.as_ptr());
                        }
                        queue as i64
                    }
                }
            };
            if taken < 0 {
                Err(errno())
            } else {
                Ok(taken as u64)
            }
        }

        fn give_back(self, handle: u64) {
            // SAFETY: the handle `take` returned, released once.
            unsafe {
                match self {
                    Self::Inotify | Self::Fanotify => libc::close(handle as i32),
                    Self::Aio => libc::syscall(libc::SYS_io_destroy, handle) as i32,
                    Self::Timers => libc::timer_delete(handle as libc::timer_t),
                    Self::Mqueue => libc::mq_close(handle as libc::mqd_t),
                };
            }
        }
    }

    /// Takes all of `budget` it can (at most 100,000 objects; AIO events in halving sizes,
    /// from the whole machine's budget down to one), and keeps it for the worker's life.
    pub fn take(budget: Budget) -> Result<String, HandlerError> {
        let mut taken = 0u64;
        let mut size = match budget {
            Budget::Aio => std::fs::read_to_string("/proc/sys/fs/aio-max-nr")
                .ok()
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(65536),
            Budget::Inotify | Budget::Fanotify | Budget::Timers | Budget::Mqueue => 1,
        };
        let mut last = None;
        while size > 0 && taken < 100_000 {
            match budget.take(size) {
                Ok(_kept) => taken += size as u64,
                // Made and charged, then refused to this process (Landlock): the kernel creates
                // a queue before it checks the open, and the queue stays with the worker's IPC
                // namespace.
                Err(err)
                    if matches!(budget, Budget::Mqueue)
                        && err.raw_os_error() == Some(libc::EACCES) =>
                {
                    taken += 1;
                    last = Some(err);
                }
                Err(err) => {
                    last = Some(err);
                    match budget {
                        Budget::Aio => size /= 2,
                        _ => break,
                    }
                }
            }
        }
        match (taken, last) {
            (0, Some(err)) => Err(refused("take", err)),
            (taken, last) => Ok(format!(
                "took {taken}; then {}",
                last.map_or("nothing refused".to_string(), |e| e.to_string())
            )),
        }
    }

    /// Takes one of `budget` and gives it back.
    pub fn use_one(budget: Budget) -> Result<String, HandlerError> {
        let handle = budget.take(1).map_err(|e| refused("take one", e))?;
        budget.give_back(handle);
        Ok("took one".into())
    }

    /// `children` processes each block every signal and send themselves each standard signal
    /// that can wait (`kill`: the kernel lets such a signal past `RLIMIT_SIGPENDING`, but
    /// still counts it against every user up the chain of user namespaces), then wait for
    /// the worker's life. Answers how many they queued.
    pub fn take_standard_signals(children: usize) -> Result<String, HandlerError> {
        let reports = in_children(children, |report| {
            // SAFETY: async-signal-safe system calls on this process's own signal state.
            unsafe {
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::sigprocmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
                let queued = (1..32)
                    .filter(|s| *s != libc::SIGKILL && *s != libc::SIGSTOP)
                    .filter(|s| libc::kill(libc::getpid(), *s) == 0)
                    .count() as u64;
                report([queued, 0]);
            }
        })?;
        let queued: u64 = reports.iter().map(|[queued, _]| queued).sum();
        Ok(format!("{} children queued {queued}", reports.len()))
    }

    /// Forks `children` processes, each running `child` with a way to send one report of two
    /// words, then waiting for the worker's life; gives the reports, one per child that sent
    /// one before the first that did not.
    fn in_children(
        children: usize,
        child: impl Fn(&dyn Fn([u64; 2])),
    ) -> Result<Vec<[u64; 2]>, HandlerError> {
        let mut pipe = [0 as libc::c_int; 2];
        // SAFETY: plain system calls; each child makes only async-signal-safe ones (`child`
        // too) and never returns.
        unsafe {
            if libc::pipe(pipe.as_mut_ptr()) != 0 {
                return Err(refused("pipe", errno()));
            }
            let mut forked = 0;
            for _ in 0..children {
                match libc::fork() {
                    0 => {
                        child(&|words: [u64; 2]| {
                            libc::write(pipe[1], words.as_ptr().cast(), 16);
                        });
                        loop {
                            libc::pause();
                        }
                    }
                    -1 => break,
                    _ => forked += 1,
                }
            }
            libc::close(pipe[1]);
            let mut reports = Vec::with_capacity(forked);
            for _ in 0..forked {
                let mut words = [0u64; 2];
                if libc::read(pipe[0], words.as_mut_ptr().cast(), 16) != 16 {
                    break;
                }
                reports.push(words);
            }
            libc::close(pipe[0]);
            Ok(reports)
        }
    }

    /// Adds one descriptor to an epoll instance, then closes both.
    pub fn use_epoll_watch() -> Result<String, HandlerError> {
        // SAFETY: plain system calls on descriptors this function owns and closes.
        unsafe {
            let epoll = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            let eventfd = libc::eventfd(0, libc::EFD_CLOEXEC);
            if epoll < 0 || eventfd < 0 {
                return Err(refused("epoll_create1 or eventfd", errno()));
            }
            let mut event = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: 0,
            };
            let added = libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, eventfd, &mut event);
            let err = errno();
            libc::close(epoll);
            libc::close(eventfd);
            if added != 0 {
                return Err(refused("epoll_ctl", err));
            }
        }
        Ok("took one".into())
    }

    /// `children` processes, each adding 600 descriptors of one eventfd to each of 400
    /// epoll instances of its own (240,000 watches), keep their watches and take back any
    /// watch freed, a millisecond apart, for the worker's life. Answers once every child has
    /// reported: how many watches they hold, and what refused the next one.
    pub fn take_epoll_watches(children: usize) -> Result<String, HandlerError> {
        const TARGETS: usize = 600;
        const EPOLLS: usize = 400;
        let reports = in_children(children, |report| {
            // SAFETY: plain system calls on descriptors this child owns.
            unsafe {
                let (mut held, mut refusal) = (0u64, 0u64);
                let eventfd = libc::eventfd(0, 0);
                let mut targets = [eventfd; TARGETS];
                for target in targets.iter_mut().skip(1) {
                    *target = libc::dup(eventfd);
                }
                for _ in 0..EPOLLS {
                    let epoll = libc::epoll_create1(0);
                    if epoll < 0 {
                        break;
                    }
                    for &target in targets.iter().filter(|t| **t >= 0) {
                        let mut event = libc::epoll_event {
                            events: libc::EPOLLIN as u32,
                            u64: 0,
                        };
                        while libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, target, &mut event) != 0 {
                            if refusal == 0 {
                                refusal = *libc::__errno_location() as u64;
                                report([held, refusal]);
                            }
                            libc::usleep(1000);
                        }
                        held += 1;
                    }
                }
                if refusal == 0 {
                    report([held, 0]);
                }
            }
        })?;
        let held: u64 = reports.iter().map(|[held, _]| held).sum();
        let refusal = reports
            .iter()
            .map(|[_, refusal]| *refusal)
            .max()
            .unwrap_or(0);
        Ok(format!(
            "{} children hold {held} epoll watches; then {}",
            reports.len(),
            if refusal == 0 {
                "nothing refused".to_string()
            } else {
                std::io::Error::from_raw_os_error(refusal as i32).to_string()
            }
        ))
    }
}
