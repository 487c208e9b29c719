//! The examples run, so they cannot rot: `thumbnail-host` (async), `thumbnail-blocking` (no
//! runtime of its own) and `thumbnail-batch` (a `Pool` fed by streaming calls) each spawn
//! `thumbnail-worker` under the default confinement, call it, and exit successfully with the
//! answers they print; `json-call` makes a dynamic call of the bundled worker. And each side depends on its own airlock
//! crate alone, besides the crate of methods both share.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use airlock_tests::e2e::{
    example_batch_bin, example_blocking_bin, example_host_bin, example_json_call_bin,
    example_worker_bin, worker_bin,
};

/// Runs `program worker`, killing it if it has not finished within a minute.
fn run_example(program: &Path, worker: &Path) -> Output {
    let mut child = Command::new(program)
        .arg(worker)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn assert_ran(output: &Output, expected: &[&str]) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    for line in expected {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
}

#[test]
fn the_async_example_host_calls_its_own_worker() {
    let output = run_example(&example_host_bin(), &example_worker_bin());
    assert_ran(
        &output,
        &[
            "worker thumbnailer 0.1.0 serves [\"histogram\", \"thumbnail\", \"thumbnails\"]",
            "thumbnail of gradient (4194304 bytes): 256x256, mean brightness 126.9",
            "refused by the worker: broken: 3 pixels for 10x10 (code Some(1))",
            "histograms of 12 tiles: 1327104 pixels",
        ],
    );
}

#[test]
fn the_blocking_example_host_calls_its_own_worker_without_a_runtime() {
    let output = run_example(&example_blocking_bin(), &example_worker_bin());
    assert_ran(
        &output,
        &[
            "thumbnail: 256x192, mean brightness 126.9",
            "histograms of 8 tiles from 8 threads: 69120 pixels",
        ],
    );
}

#[test]
fn the_batch_example_streams_its_progress_over_a_pool() {
    let output = run_example(&example_batch_bin(), &example_worker_bin());
    assert_ran(
        &output,
        &["96 thumbnails in 12 streamed batches over 3 workers (12 calls ok, 0 failed)"],
    );
}

#[test]
fn the_json_example_makes_a_dynamic_call() {
    let output = Command::new(example_json_call_bin())
        .arg(worker_bin())
        .arg("echo_value")
        .arg(r#"{"name": "cat", "size": [640, 480], "ratio": 1.5, "tags": null}"#)
        .output()
        .unwrap();
    assert_ran(
        &output,
        &[r#"{"name":"cat","ratio":1.5,"size":[640,480],"tags":null}"#],
    );
}

/// The airlock crates a manifest's `[dependencies]` name.
fn airlock_dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let mut in_dependencies = false;
    let mut found = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
        } else if in_dependencies && line.starts_with("airlock-") {
            found.extend(line.split([' ', '=', '.']).next().map(str::to_owned));
        }
    }
    found
}

#[test]
fn each_example_side_depends_on_its_own_airlock_crate_alone() {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    assert_eq!(
        airlock_dependencies(&examples.join("worker/Cargo.toml")),
        ["airlock-example-api", "airlock-worker"]
    );
    assert_eq!(
        airlock_dependencies(&examples.join("host/Cargo.toml")),
        ["airlock-example-api", "airlock-host"]
    );
    // The shared methods need only the sans-IO protocol crate.
    assert_eq!(
        airlock_dependencies(&examples.join("api/Cargo.toml")),
        ["airlock-protocol"]
    );
}
