//! The `airlock` tool run as a process against the real bundled `airlock-worker` (and, where a
//! worker must misbehave, the `rogue-worker` of `airlock-tests`), its output parsed: every
//! subcommand's success, and one failing case for each exit status its `--help` documents.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use airlock_codec::is_unsafe_in_text;
use airlock_host::Value;
use airlock_tests::e2e::{rogue_bin, rogue_host, worker_bin};

/// The `airlock` binary under test.
fn airlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_airlock"));
    command.stdin(Stdio::null());
    command
}

fn run(command: &mut Command) -> Output {
    command.output().expect("airlock runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

/// The tool's own error line (`airlock: ...`), among the host's log lines on stderr.
fn error_line(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    stderr
        .lines()
        .find(|line| line.starts_with("airlock: "))
        .unwrap_or_else(|| panic!("no `airlock:` line on stderr:\n{stderr}"))
        .to_owned()
}

fn exit_code(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

/// `key: value` lines of `probe`'s report.
fn fields(report: &str) -> Vec<(String, String)> {
    report
        .lines()
        .map(|line| {
            let (key, value) = line.split_once(": ").expect("a `key: value` line");
            (key.to_owned(), value.to_owned())
        })
        .collect()
}

fn field<'a>(fields: &'a [(String, String)], key: &str) -> &'a str {
    fields
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no `{key}` in {fields:?}"))
}

fn call(worker: &Path, method: &str, json: &str) -> Command {
    let mut command = airlock();
    command.arg("call").arg(worker).arg(method).arg(json);
    command
}

#[test]
fn probe_prints_the_workers_identity_methods_and_verified_confinement() {
    let output = run(airlock().arg("probe").arg(worker_bin()));
    assert_eq!(exit_code(&output), 0, "{output:?}");
    let report = fields(&stdout(&output));
    assert_eq!(field(&report, "name"), "airlock-worker");
    assert_eq!(field(&report, "version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(
        field(&report, "protocol"),
        airlock_host::PROTOCOL_VERSION.to_string()
    );
    let methods: Vec<&str> = field(&report, "methods").split(' ').collect();
    for method in ["echo", "echo_value", "sum", "panic"] {
        assert!(methods.contains(&method), "{methods:?}");
    }
    assert_eq!(field(&report, "confinement"), "strict");
    for layer in [
        "namespaces",
        "worker_filter",
        "no_new_privs",
        "no_capabilities",
        "rlimits",
    ] {
        assert_eq!(field(&report, layer), "yes", "{layer}");
    }
    assert!(field(&report, "seccomp_filters").parse::<u32>().unwrap() >= 1);
    assert_eq!(field(&report, "missing"), "none");
}

#[test]
fn probe_hands_its_arguments_to_the_worker() {
    // The rogue worker's first argument is its scenario: honest, it completes its handshake;
    // told to announce another protocol version, it is refused.
    let honest = run(airlock().arg("probe").arg(rogue_bin()).arg("honest"));
    assert_eq!(exit_code(&honest), 0, "{honest:?}");
    assert_eq!(
        field(&fields(&stdout(&honest)), "name"),
        "rogue-worker",
        "{honest:?}"
    );

    let refused = run(airlock().arg("probe").arg(rogue_bin()).arg("wrong_version"));
    assert_eq!(exit_code(&refused), 3, "{refused:?}");
    let line = error_line(&refused);
    assert!(line.contains("handshake"), "{line}");
    assert!(stdout(&refused).is_empty());
}

#[test]
fn call_prints_the_answer_as_one_line_of_json() {
    let request = r#"{"list": [1, -2, 9223372036854775808, 0.5, "s", null, true], "empty": {}}"#;
    let output = run(&mut call(&worker_bin(), "echo_value", request));
    assert_eq!(exit_code(&output), 0, "{output:?}");
    let printed = stdout(&output);
    assert_eq!(printed.lines().count(), 1, "{printed}");
    let answer: serde_json::Value = serde_json::from_str(&printed).unwrap();
    let sent: serde_json::Value = serde_json::from_str(request).unwrap();
    assert_eq!(answer, sent);
}

/// A worker's answer may hold characters a terminal acts on (a C1 CSI starts a control sequence
/// that can clear the screen or forge a line) or that reorder or hide what the user reads:
/// `call` prints them as JSON escapes, and the JSON still says the same string.
#[test]
fn an_answers_control_and_bidi_characters_print_as_escapes() {
    // The attack is live: through the library, the rogue's answer holds them raw.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let raw = runtime.block_on(async {
        let host = rogue_host()
            .arg("c1_value_answer")
            .spawn()
            .await
            .expect("the rogue completes its handshake");
        let answer = host
            .call_value("echo_value", &Value::Str("hi".into()))
            .await;
        host.shutdown().await;
        answer
    });
    let Ok(Value::Str(raw)) = raw else {
        panic!("the rogue answers a string: {raw:?}");
    };
    assert!(["\u{9b}", "\u{202e}", "\u{7f}"]
        .iter()
        .all(|c| raw.contains(c)));

    let output = run(call(&rogue_bin(), "echo_value", r#""hi""#).args(["--", "c1_value_answer"]));
    assert_eq!(exit_code(&output), 0, "{output:?}");
    let printed = stdout(&output);
    let printed = printed.strip_suffix('\n').expect("one line");
    assert!(
        !printed.chars().any(is_unsafe_in_text),
        "printed raw: {printed:?}"
    );
    assert!(printed.contains(r"\u009b2J") && printed.contains(r"\u202ekcatta\u007f"));
    let answer: serde_json::Value = serde_json::from_str(printed).unwrap();
    assert_eq!(answer, serde_json::Value::String(raw));
}

#[test]
fn a_method_the_worker_does_not_serve_exits_1_naming_the_error_kind() {
    let output = run(&mut call(&worker_bin(), "no_such_method", "null"));
    assert_eq!(exit_code(&output), 1, "{output:?}");
    let line = error_line(&output);
    assert!(line.contains("UnknownMethod"), "{line}");
    assert!(stdout(&output).is_empty());
}

#[test]
fn a_json_request_to_a_typed_method_exits_1_as_a_bad_request() {
    let output = run(&mut call(&worker_bin(), "sum", "[1, 2]"));
    assert_eq!(exit_code(&output), 1, "{output:?}");
    assert!(error_line(&output).contains("BadRequest"), "{output:?}");
}

#[test]
fn a_bad_command_line_exits_2_before_anything_is_started() {
    // The program does not exist: had anything been started, the status would be 3.
    let missing = Path::new("/nonexistent/airlock-worker");
    let not_json = run(&mut call(missing, "echo_value", "[1,"));
    assert_eq!(exit_code(&not_json), 2, "{not_json:?}");
    assert!(error_line(&not_json).contains("not JSON"), "{not_json:?}");

    let bad_name = run(&mut call(missing, "two words", "1"));
    assert_eq!(exit_code(&bad_name), 2, "{bad_name:?}");
    assert!(error_line(&bad_name).contains("not a method name"));

    let no_request = run(airlock().arg("call").arg(missing).arg("echo_value"));
    assert_eq!(exit_code(&no_request), 2, "{no_request:?}");

    let zero_timeout = run(call(missing, "echo_value", "1").args(["--timeout", "0"]));
    assert_eq!(exit_code(&zero_timeout), 2, "{zero_timeout:?}");

    let no_command = run(&mut airlock());
    assert_eq!(exit_code(&no_command), 2, "{no_command:?}");
}

#[test]
fn a_worker_that_cannot_start_exits_3() {
    let output = run(&mut call(
        Path::new("/nonexistent/airlock-worker"),
        "echo_value",
        "1",
    ));
    assert_eq!(exit_code(&output), 3, "{output:?}");
    assert!(
        error_line(&output).starts_with("airlock: could not start the worker"),
        "{output:?}"
    );
}

#[test]
fn a_worker_that_breaks_the_protocol_exits_4_naming_the_violation() {
    // The rogue answers the call under another method's name.
    let output = run(call(&rogue_bin(), "echo", "1").args(["--", "swapped_name"]));
    assert_eq!(exit_code(&output), 4, "{output:?}");
    let line = error_line(&output);
    assert!(line.contains("MethodMismatch (#10)"), "{line}");
    assert!(stdout(&output).is_empty());
}

#[test]
fn a_call_past_its_deadline_exits_5() {
    // The rogue never answers.
    let started = Instant::now();
    let output = run(call(&rogue_bin(), "echo", "1").args(["--timeout", "0.3", "--", "hang"]));
    let took = started.elapsed();
    assert_eq!(exit_code(&output), 5, "{output:?}");
    assert!(error_line(&output).contains("timed out"), "{output:?}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn output_that_cannot_be_written_exits_6() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let output = run(call(&worker_bin(), "echo_value", "1").stdout(full));
    assert_eq!(exit_code(&output), 6, "{output:?}");
    assert!(
        error_line(&output).contains("could not write the answer"),
        "{output:?}"
    );
}

/// A figure line of `bench`: (airlock's median, the raw pipe's median, the ratio printed).
fn figure(report: &str, label: &str) -> (f64, f64, f64) {
    let line = report
        .lines()
        .find(|line| line.starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` line in\n{report}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |word: &str| -> f64 {
        let at = words.iter().position(|w| *w == word).expect(word);
        words[at + 1].parse().expect("a number")
    };
    (after("airlock"), after("pipe"), after("ratio"))
}

#[test]
fn bench_prints_round_trip_and_throughput_beside_a_raw_pipe() {
    let output = run(airlock()
        .args(["bench", "--reps", "3", "--calls", "200", "--window", "16"])
        .arg(worker_bin()));
    assert_eq!(exit_code(&output), 0, "{output:?}");
    let report = stdout(&output);
    assert!(report.contains("3 repetitions interleaved"), "{report}");
    for label in [
        "round trip, µs per call:",
        "throughput, k calls/s, 16 in flight:",
    ] {
        let (airlock, raw, ratio) = figure(&report, label);
        assert!(airlock > 0.0 && raw > 0.0, "{report}");
        let expected = airlock / raw;
        assert!(
            (ratio - expected).abs() <= 0.01 + expected * 0.01,
            "{label} ratio {ratio} vs {expected}"
        );
    }
}

#[test]
fn every_command_has_help_that_lists_every_exit_status() {
    let codes: Vec<String> = (0..=6).map(|code| format!("\n  {code}  ")).collect();
    for command in [&[][..], &["probe"], &["call"], &["bench"]] {
        let output = run(airlock().args(command).arg("--help"));
        assert_eq!(exit_code(&output), 0, "{command:?}");
        let help = stdout(&output);
        assert!(help.contains("Exit status:"), "{command:?}:\n{help}");
        for code in &codes {
            assert!(help.contains(code.as_str()), "{command:?} lacks {code:?}");
        }
    }
}
