//! A response over the host's own budgets is refused with an error that names the budget, its
//! value and the setting, and logged at WARN, with the budget, the method and the worker's
//! label, before the worker is killed: an honest worker cannot know the host's budgets, and
//! its operator learns from that line why it went.

use std::time::Duration;

use airlock_codec::{DecodeError, Limits};
use airlock_host::{CallError, Host, LostReason};
use airlock_tests::capture::events;
use airlock_tests::e2e::{call_pid, fast_restarts, process_present, worker_bin};
use airlock_worker::builtin::{EchoVec, Sleep};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_hosts_budget_is_logged_at_warn_before_its_worker_is_killed() {
    let events = events();
    let label = "budgeted-thumbnailer";
    let host = Host::builder(worker_bin())
        .label(label)
        .limits(Limits::default().max_len(1024 * 1024))
        .spawn()
        .await
        .unwrap();
    let pid = call_pid(&host).await.unwrap();
    let bystander = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Sleep>(&2_000).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The request fits the worker's budgets; the identical response does not fit the host's.
    let refused = host.call::<EchoVec>(&vec![9u8; 2 * 1024 * 1024]).await;
    let expected = DecodeError::LengthLimit {
        len: 2 * 1024 * 1024,
        max: 1024 * 1024,
    };
    assert_eq!(refused, Err(CallError::Decode(expected)));
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("1048576 (Limits::max_len)"), "{message}");
    assert!(message.contains("HostBuilder::limits"), "{message}");
    // The worker is killed, and the call beside it lost with it.
    assert_eq!(
        bystander.await.unwrap(),
        Err(CallError::WorkerLost(LostReason::UndecodableResponse))
    );
    assert_ne!(
        call_pid(&host).await,
        Ok(pid),
        "the worker was not replaced"
    );
    host.shutdown().await;

    let logged = events.matching(|e| e.field("worker") == label);
    let warned = logged
        .iter()
        .position(|e| {
            e.level == tracing::Level::WARN
                && e.target == "airlock::host"
                && e.field("method") == "echo_vec"
                && e.field("budget") == "max_len"
                && e.field("max") == "1048576"
        })
        .unwrap_or_else(|| panic!("no WARN naming the budget and the method: {logged:#?}"));
    let lost = logged
        .iter()
        .position(|e| e.field("message") == "worker lost")
        .unwrap_or_else(|| panic!("the loss was not logged: {logged:#?}"));
    assert!(
        warned < lost,
        "the refusal was logged after the loss: {logged:#?}"
    );
    let warning = logged[warned].field("message");
    assert!(warning.contains("Limits::max_len"), "{warning}");
    assert!(warning.contains("HostBuilder::limits"), "{warning}");
}

/// A caller whose response is refused learns of it only once the worker that sent it is dead
/// and reaped, as a caller that sees `WorkerLost` or `Timeout` does: nothing of the liar still
/// runs when its lie is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_refused_a_response_hears_of_it_once_the_worker_is_reaped() {
    let host = Host::builder(worker_bin())
        .limits(Limits::default().max_len(64 * 1024))
        .restart_policy(fast_restarts(10))
        .spawn()
        .await
        .unwrap();
    for _ in 0..5 {
        let pid = call_pid(&host).await.unwrap();
        let refused = host.call::<EchoVec>(&vec![9u8; 128 * 1024]).await;
        assert!(
            matches!(
                refused,
                Err(CallError::Decode(DecodeError::LengthLimit { .. }))
            ),
            "{refused:?}"
        );
        assert!(
            !process_present(pid),
            "the caller heard of the refused response while worker {pid} was still there"
        );
    }
    host.shutdown().await;
}
