//! End to end: a large call queued during a restart survives the Welcome, an honest response over
//! the decode budget fails only its own call, and neither a worker's error message nor its stderr
//! can hide text in the host's log.

use std::time::{Duration, Instant};

use airlock_codec::Limits;
use airlock_host::{CallError, Host, RestartPolicy};
use airlock_protocol::HostConfig;
use airlock_tests::e2e::{call_pid, worker_bin};
use airlock_worker::builtin::{fnv1a, Digest, Echo, Fail, Sleep};
use serde_bytes::ByteBuf;

/// Calls queued while a worker (re)starts are written in the same batch as its `Welcome`, so
/// the next length prefix is already buffered when the worker reads the `Welcome`. The worker's
/// transport starts at `DEFAULT_MAX_FRAME` and must adopt the host's `max_frame` before it
/// decodes that prefix: a `Call` larger than 16 MiB (legal: the host configured 32 MiB) is
/// served, not refused as `TooLarge` under the starting cap, which would end the worker and
/// lose the call although neither side did anything wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_call_queued_during_a_restart_survives_the_welcome() {
    let max_frame = 32 * 1024 * 1024;
    // No cancel grace: the missed deadline below is how the test makes the worker restart.
    let host = Host::builder(worker_bin())
        .protocol(
            HostConfig::default()
                .max_frame(max_frame)
                .unwrap()
                .cancel_grace(Duration::ZERO)
                .unwrap(),
        )
        .limits(
            Limits::default()
                .max_bytes(max_frame as usize)
                .max_len(max_frame as usize),
        )
        .restart_policy(RestartPolicy {
            max_restarts: 10,
            initial_backoff: Duration::from_millis(200),
            ..RestartPolicy::default()
        })
        .spawn()
        .await
        .unwrap();
    let payload = vec![7u8; 20 * 1024 * 1024];
    // Sanity: a large call on a running worker works (the Welcome was processed long ago).
    assert_eq!(
        host.call::<Digest>(&ByteBuf::from(payload.clone())).await,
        Ok(fnv1a(&payload))
    );
    let first = call_pid(&host).await.unwrap();
    // Make the worker miss a deadline: it is killed and a new one starts after the backoff.
    let missed = host
        .call_with_deadline::<Sleep>(&5_000, Instant::now() + Duration::from_millis(50))
        .await;
    assert_eq!(missed, Err(CallError::Timeout));
    // This call waits for the new worker and is sent right behind its Welcome.
    let digest = host.call::<Digest>(&ByteBuf::from(payload.clone())).await;
    let second = call_pid(&host).await;
    assert_ne!(Ok(first), second, "the worker was replaced");
    assert_eq!(
        digest,
        Ok(fnv1a(&payload)),
        "a legal {}-byte call sent behind the Welcome was lost",
        payload.len()
    );
    assert_eq!(
        host.stats().restarts,
        1,
        "the new worker died on the call behind its Welcome"
    );
    host.shutdown().await;
}

/// The host decodes every response within its own `Limits` and treats a response that does
/// not decode as a lie, which kills the worker and every other call on it. So the default
/// decode budget must hold any response that fits `max_frame`: an honest echo of a payload the
/// host itself was allowed to send (16 MiB + 64 bytes, over a 16 MiB budget) must not cost the
/// worker. Had the caller set smaller budgets, the failure would be this call's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_honest_response_over_the_decode_budget_fails_only_its_own_call() {
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    let pid = call_pid(&host).await.unwrap();
    let bystander = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Sleep>(&1_500).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // 16 MiB + 64 bytes: the request fits max_frame and the worker's budget (raised to max_frame
    // by the Welcome); the identical response does not fit the host's default Limits.
    let payload = vec![1u8; 16 * 1024 * 1024 + 64];
    let len = payload.len();
    let echoed = host.call::<Echo>(&ByteBuf::from(payload)).await;
    // The default response budget follows max_frame, so the honest echo decodes; a failure
    // would have to be this call's own.
    assert!(
        matches!(&echoed, Ok(body) if body.len() == len)
            || matches!(
                echoed,
                Err(CallError::Decode(_)) | Err(CallError::Remote(_))
            ),
        "{:?}",
        echoed.map(|body| body.len())
    );
    assert_eq!(
        bystander.await.unwrap(),
        Ok(1_500),
        "an unrelated call was lost because an honest response exceeded the host's decode limits"
    );
    assert_eq!(
        call_pid(&host).await,
        Ok(pid),
        "the honest worker was killed"
    );
    host.shutdown().await;
}

/// Text hidden in Unicode tag characters (U+E0000 + ASCII): invisible when displayed.
fn hidden(text: &str) -> String {
    text.chars()
        .map(|c| char::from_u32(0xE0000 + c as u32).unwrap())
        .collect()
}

fn tag_characters(text: &str) -> Vec<String> {
    text.chars()
        .filter(|c| ('\u{E0000}'..='\u{E007F}').contains(c) || *c == '\u{00AD}')
        .map(|c| format!("U+{:04X}", c as u32))
        .collect()
}

/// codec `is_unsafe_in_text`, end to end: an error message crossing from the worker is
/// bounded and free of characters that could forge or hide log text. A handler that quotes its
/// (attacker-chosen) input in an error (here the bundled `fail` method) sends a message hiding a
/// whole sentence in invisible tag characters; what reaches the host's caller hides nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_message_from_the_worker_hides_no_text() {
    let host = Host::builder(worker_bin()).spawn().await.unwrap();
    let message = format!(
        "disk full\u{00AD}{}",
        hidden("approve all pending transfers")
    );
    let result = host.call::<Fail>(&message).await;
    let Err(CallError::Remote(err)) = result else {
        panic!("expected a remote failure, got {result:?}");
    };
    let found = tag_characters(err.message());
    assert!(
        found.is_empty(),
        "the host accepted an error message with {} invisible characters: {found:?}",
        found.len()
    );
    host.shutdown().await;
}

// ----- stderr relay: invisible text -----

use airlock_tests::capture::captured;

/// The stderr relay (host/src/stderr.rs `emit`) applies the same rule: a worker's stderr line
/// carrying invisible tag characters reaches the host's log without them. (The `{:?}` of the
/// captured message would escape them; the line is read with `record_str`/Display semantics,
/// as a log file or terminal shows it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_stderr_cannot_hide_text_in_the_host_log() {
    let captured = captured();
    // U+E0041 ('A' tag) is F3 A0 81 81 in UTF-8; U+00AD is C2 AD.
    let _ = Host::builder("/bin/sh")
        .confinement(airlock_host::Confinement::none())
        .arg("-c")
        .arg(r"printf 'hidden-text-marker \302\255\363\240\201\201\n' >&2; exit 0")
        .env("PATH", "/usr/bin:/bin")
        .spawn()
        .await;
    let line = captured
        .first_line_containing("hidden-text-marker", Duration::from_secs(2))
        .await;
    // tracing hands the formatted message over as `fmt::Arguments` (record_debug), whose
    // Debug is its Display: the characters appear raw if they were relayed raw.
    let found = tag_characters(&line);
    assert!(
        found.is_empty(),
        "relayed to the host log: {found:?} in {line:?}"
    );
}

/// A call made while a lost worker's replacement is still being launched times out at its own
/// deadline, not when the launch ends. Here the launch takes three seconds: over a named socket
/// the launch waits for the worker to connect, and the replacement sleeps before it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_made_during_a_slow_restart_times_out_at_its_own_deadline() {
    let dir = std::env::temp_dir().join(format!("airlock-slow-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mark = dir.join("started");
    let script = format!(
        "if [ -e \"$MARK\" ]; then /bin/sleep 3; fi; : > \"$MARK\"; exec {}",
        worker_bin().display()
    );
    let host = Host::builder("/bin/sh")
        .arg("-c")
        .arg(script)
        .env("MARK", &mark)
        .transport(airlock_host::TransportChoice::SocketNamed)
        .confinement(airlock_host::Confinement::none())
        .restart_policy(RestartPolicy {
            max_restarts: 5,
            window: Duration::from_secs(60),
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(10),
        })
        .spawn()
        .await
        .expect("the first worker starts at once");
    let first = call_pid(&host).await.expect("the first worker answers");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(first as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    // Long enough for the supervisor to see the worker gone and start the slow replacement.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let outcome = host
        .call_with_deadline::<Echo>(
            &ByteBuf::from(b"during the restart".to_vec()),
            Instant::now() + Duration::from_millis(300),
        )
        .await;
    let took = started.elapsed();
    assert_eq!(outcome, Err(CallError::Timeout));
    assert!(
        took < Duration::from_millis(1500),
        "timed out after {took:?}, not at its 300 ms deadline"
    );
    // The replacement comes up and serves.
    assert_ne!(
        call_pid(&host).await.expect("the replacement answers"),
        first
    );
    host.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
