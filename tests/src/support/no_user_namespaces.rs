//! Running a command where no user namespace can be created, as on a kernel without them.

#![allow(unsafe_code)] // `pre_exec` is unsafe by definition

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

/// Runs `program` with `args` in a user namespace of its own in which `max_user_namespaces`
/// is 0, so it can create no further one. Root only (only a namespace's root may lower that
/// limit); its ids 0–99999 are mapped to themselves, so a root host there can still drop a
/// worker to 65534. It runs in `/`, with `envs` added to the environment.
pub fn run_without_user_namespaces(
    program: &std::path::Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> Output {
    let pipe = || {
        let (read, write) =
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).expect("pipe");
        (std::fs::File::from(read), std::fs::File::from(write))
    };
    let (mut ready_read, ready_write) = pipe();
    let (go_read, mut go_write) = pipe();
    let (ready_fd, go_fd) = (ready_write.as_raw_fd(), go_read.as_raw_fd());
    let mut command = Command::new("/bin/sh");
    command
        .args([
            "-c",
            "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"",
        ])
        .arg(program)
        .args(args)
        .envs(envs.iter().copied())
        .current_dir("/")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: the closure runs in the forked child before `exec` and makes only
    // async-signal-safe system calls on descriptors that stay open until the command is
    // dropped (`unshare`, `getpid`, `write`, `read`); it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Its pid, for the parent to write its id maps; then wait until they are there.
            let pid = libc::getpid().to_ne_bytes();
            if libc::write(ready_fd, pid.as_ptr().cast(), pid.len()) != pid.len() as isize {
                return Err(std::io::Error::last_os_error());
            }
            let mut go = 0u8;
            if libc::read(go_fd, (&raw mut go).cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // `spawn` returns only once the child has `exec`'d, after its maps were written.
    assert!(
        rustix::process::geteuid().is_root(),
        "only root can do this"
    );
    let mapper = std::thread::spawn(move || -> std::io::Result<()> {
        let mut pid = [0u8; 4];
        ready_read.read_exact(&mut pid)?;
        let proc = format!("/proc/{}", i32::from_ne_bytes(pid));
        std::fs::write(format!("{proc}/uid_map"), "0 0 100000\n")?;
        std::fs::write(format!("{proc}/gid_map"), "0 0 100000\n")?;
        go_write.write_all(&[1])
    });
    let child = command
        .spawn()
        .expect("the command starts in a user namespace");
    drop(command);
    drop((ready_write, go_read));
    mapper
        .join()
        .expect("the mapper thread")
        .expect("the id maps are written");
    child.wait_with_output().expect("the command runs")
}
