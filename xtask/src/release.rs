//! `cargo xtask release`: the release tarball of the `airlock-worker` and `airlock` binaries.
//!
//! 1. Builds both binaries with the `dist` profile (root `Cargo.toml`): the `release` profile,
//!    so the shipped code is the code `cargo xtask bench` measures, with its symbols stripped,
//!    and `panic = "unwind"` stated rather than inherited. The worker reports a handler's
//!    panic to its host as data (a `Fail` of kind `Panic`) and serves on; that needs the
//!    panic to unwind to the worker's catch. Under `abort` the first panicking handler would
//!    end the process, and every call in flight on it would fail with `WorkerLost` instead of
//!    one call failing with `Panic`.
//! 2. Stages `airlock-<version>-<target>/` with the binaries, `LICENSE-MIT`, `LICENSE-APACHE`,
//!    `README.md` and a `SHA256SUMS` of them (`sha256sum`'s format).
//! 3. Packs it as `target/release/airlock-<version>-<target>.tar.gz`.
//! 4. Verifies: unpacks the tarball into a fresh directory, checks every file against
//!    `SHA256SUMS` there (`sha256sum -c`), and runs the unpacked `airlock --version`.
//! 5. Prints what it made: the tarball, its own SHA-256, and each file's size.
//!
//! `<version>` is the workspace's; `<target>` is the host's target triple (`rustc -vV`).
//! Needs GNU `tar` and coreutils' `sha256sum`, as on any Linux this project supports.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::run::{self, cargo, Error, Result};

/// What the tarball holds, besides `SHA256SUMS`: the binaries, then the files from the root.
const BINARIES: &[&str] = &["airlock", "airlock-worker"];
const DOCUMENTS: &[&str] = &["LICENSE-MIT", "LICENSE-APACHE", "README.md"];
/// The cargo profile the binaries are built with.
const PROFILE: &str = "dist";

pub fn main(args: &[String]) -> Result {
    if let Some(arg) = args.first() {
        return Err(Error::usage(format!("release: unknown argument `{arg}`")));
    }
    run::run(&mut cargo([
        "build",
        "--locked",
        "--profile",
        PROFILE,
        "-p",
        "airlock-worker",
        "--bin",
        "airlock-worker",
        "-p",
        "airlock-cli",
        "--bin",
        "airlock",
    ]))?;
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| run::root().join("target"));
    let name = format!("airlock-{}-{}", env!("CARGO_PKG_VERSION"), host_triple()?);
    let work = target_dir.join(PROFILE).join("package");
    let stage = work.join(&name);
    fresh_dir(&stage)?;
    for binary in BINARIES {
        copy(&target_dir.join(PROFILE).join(binary), &stage.join(binary))?;
    }
    for document in DOCUMENTS {
        copy(&run::root().join(document), &stage.join(document))?;
    }
    let sums = run::stdout(
        Command::new("sha256sum")
            .args(BINARIES.iter().chain(DOCUMENTS))
            .current_dir(&stage),
    )?;
    write(&stage.join("SHA256SUMS"), &sums)?;

    let release_dir = target_dir.join("release");
    std::fs::create_dir_all(&release_dir)
        .map_err(|e| Error::new(format!("cannot create {}: {e}", release_dir.display())))?;
    let tarball = release_dir.join(format!("{name}.tar.gz"));
    run::run(
        Command::new("tar")
            .args([
                "--create",
                "--gzip",
                "--sort=name",
                "--owner=0",
                "--group=0",
            ])
            .arg("--numeric-owner")
            .arg("--file")
            .arg(&tarball)
            .arg("--directory")
            .arg(&work)
            .arg(&name),
    )?;

    verify(&tarball, &work.join("verify"), &name)?;
    let tarball_sum = run::stdout(Command::new("sha256sum").arg(&tarball))?;
    println!("\nrelease: made {}", tarball.display());
    println!(
        "  sha256 {}",
        tarball_sum.split_whitespace().next().unwrap_or("?")
    );
    for file in BINARIES.iter().chain(DOCUMENTS).chain(&["SHA256SUMS"]) {
        let len = std::fs::metadata(stage.join(file)).map_or(0, |m| m.len());
        println!("  {name}/{file:<16} {len:>10} bytes");
    }
    println!("  checksums verified in a fresh unpacking (sha256sum -c SHA256SUMS)");
    Ok(())
}

/// Unpacks `tarball` into an empty `dir`, checks every file against its `SHA256SUMS`, and runs
/// the unpacked `airlock --version`.
fn verify(tarball: &Path, dir: &Path, name: &str) -> Result {
    fresh_dir(dir)?;
    run::run(
        Command::new("tar")
            .args(["--extract", "--gzip", "--file"])
            .arg(tarball)
            .arg("--directory")
            .arg(dir),
    )?;
    let unpacked = dir.join(name);
    run::run(
        Command::new("sha256sum")
            .args(["--check", "--strict", "SHA256SUMS"])
            .current_dir(&unpacked),
    )?;
    let version = run::stdout(Command::new(unpacked.join("airlock")).arg("--version"))?;
    let expected = format!("airlock {}", env!("CARGO_PKG_VERSION"));
    if version.trim() != expected {
        return Err(Error::new(format!(
            "the unpacked airlock says `{}`, expected `{expected}`",
            version.trim()
        )));
    }
    Ok(())
}

/// The host's target triple, from `rustc -vV`.
fn host_triple() -> Result<String> {
    let about = run::stdout(Command::new("rustc").arg("-vV"))?;
    about
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| Error::new("`rustc -vV` names no host triple"))
}

/// Makes `dir` exist and be empty.
fn fresh_dir(dir: &Path) -> Result {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| Error::new(format!("cannot clear {}: {e}", dir.display())))?;
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::new(format!("cannot create {}: {e}", dir.display())))
}

fn copy(from: &Path, to: &Path) -> Result {
    std::fs::copy(from, to).map(drop).map_err(|e| {
        Error::new(format!(
            "cannot copy {} to {}: {e}",
            from.display(),
            to.display()
        ))
    })
}

fn write(path: &Path, text: &str) -> Result {
    std::fs::write(path, text)
        .map_err(|e| Error::new(format!("cannot write {}: {e}", path.display())))
}
