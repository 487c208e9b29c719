//! The README's first command (`cargo xtask demo`) runs this: spawn the bundled worker, make
//! typed calls, watch a hung worker be killed and replaced, a panic come back as data, and
//! hostile workers be refused with their violation codes.
//!
//! Usage: `demo <path to airlock-worker> <path to rogue-worker>` (xtask passes both).

use std::time::{Duration, Instant};

use airlock_host::{CallError, Host, LostReason, RestartPolicy};
use airlock_worker::builtin::{Digest, Echo, Panic, Pid, Sleep, Sum};
use serde_bytes::ByteBuf;

type Error = Box<dyn std::error::Error>;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let (Some(worker), Some(rogue)) = (args.next(), args.next()) else {
        return Err("usage: demo <airlock-worker> <rogue-worker>".into());
    };
    let started = Instant::now();

    section("1. Spawn the bundled worker and make typed calls");
    let host = Host::builder(&worker)
        .restart_policy(RestartPolicy {
            initial_backoff: Duration::from_millis(10),
            ..RestartPolicy::default()
        })
        .spawn()
        .await?;
    let info = host.worker_info();
    println!(
        "   worker {} {} serves {:?}",
        info.name, info.version, info.methods
    );
    let c = &info.confinement;
    println!(
        "   confined ({:?}): pid {} uid {} own namespaces {}, Landlock ABI {:?}, seccomp filters {} \
         (its own allowlist {}), no_new_privs {}, no capabilities {}",
        c.mode, c.pid, c.uid, c.namespaces, c.landlock_abi, c.seccomp_filters, c.worker_filter,
        c.no_new_privs, c.no_capabilities
    );
    println!(
        "   sum([1, 2, 3, 4])        = {}",
        host.call::<Sum>(&vec![1, 2, 3, 4]).await?
    );
    let payload = ByteBuf::from(b"airlock".to_vec());
    let echoed = host.call::<Echo>(&payload).await?;
    println!(
        "   echo(\"airlock\")          = {:?}",
        String::from_utf8_lossy(&echoed)
    );
    println!(
        "   digest(1 MiB of 0xa5)    = {:#018x}",
        host.call::<Digest>(&ByteBuf::from(vec![0xa5; 1 << 20]))
            .await?
    );
    match host.call::<Sum>(&vec![i64::MAX, 1]).await {
        Err(CallError::Remote(err)) => {
            println!("   sum([i64::MAX, 1])       -> handler error as data: {err}")
        }
        other => return Err(format!("unexpected: {other:?}").into()),
    }

    section("2. A panic in a handler comes back as data; the worker keeps serving");
    let pid = worker_pid(&host).await?;
    match host.call::<Panic>(&"something broke".into()).await {
        Err(CallError::Remote(err)) => println!("   panic(...)               -> {err}"),
        other => return Err(format!("unexpected: {other:?}").into()),
    }
    println!(
        "   same worker still serving: pid {} == {}",
        worker_pid(&host).await?,
        pid
    );

    section("3. A call past its deadline: Timeout at once, the handler cancelled, the worker kept");
    let deadline = Instant::now() + Duration::from_millis(300);
    let t = Instant::now();
    let result = host.call_with_deadline::<Sleep>(&60_000, deadline).await;
    println!(
        "   sleep(60 s) with a 300 ms deadline -> {result:?} after {:?}",
        t.elapsed()
    );
    if result != Err(CallError::Timeout) {
        return Err(format!("expected Timeout, got {result:?}").into());
    }
    // The handler honoured the Cancel within the cancel grace: nothing beside it was lost.
    tokio::time::sleep(airlock_host::DEFAULT_CANCEL_GRACE + Duration::from_millis(200)).await;
    let same = worker_pid(&host).await?;
    if same != pid || host.stats().restarts != 0 {
        return Err(format!("worker {pid} was replaced by {same} for a cancelled handler").into());
    }
    println!(
        "   the handler was cancelled; the same worker {same} answers: sum([2, 2]) = {}",
        host.call::<Sum>(&vec![2, 2]).await?
    );
    host.shutdown().await;

    section("3b. A worker still running the handler when the cancel grace ends is killed");
    let hung = Host::builder(&rogue)
        .arg("hang")
        .protocol(
            airlock_host::HostConfig::default()
                .cancel_grace(Duration::from_millis(200))
                .map_err(|e| e.to_string())?,
        )
        .spawn()
        .await?;
    let t = Instant::now();
    let one = vec![1];
    let victim =
        hung.call_with_deadline::<Sleep>(&60_000, Instant::now() + Duration::from_millis(300));
    let neighbour = hung.call_with_deadline::<Sum>(&one, Instant::now() + Duration::from_secs(5));
    let (victim, neighbour) = tokio::join!(victim, neighbour);
    println!(
        "   the hung worker's call -> {victim:?}; its neighbour -> {neighbour:?} after {:?}",
        t.elapsed()
    );
    if victim != Err(CallError::Timeout)
        || neighbour != Err(CallError::WorkerLost(LostReason::OtherCallTimedOut))
    {
        return Err("the hung worker was not put down at the end of its grace".into());
    }
    hung.shutdown().await;

    section("4. Hostile workers are refused, each with its violation code");
    for (scenario, what) in [
        (
            "swapped_name",
            "answers an `echo` call under another method's name",
        ),
        ("random_id", "sends a Return for an id no call was given"),
        (
            "predictable_id",
            "stages a forged answer for the id a counter would give next",
        ),
        ("return_len_bomb", "answers with a body claiming 2^60 bytes"),
        (
            "fail_escape_sequences",
            "fails with terminal escape sequences in its message",
        ),
        ("frame_over_cap", "sends a 4 GiB length prefix"),
    ] {
        // The rogue attacks the channel, which holds whatever the OS allows; the confinement
        // demo (next) shows what the OS layers refuse.
        let host = Host::builder(&rogue)
            .confinement(airlock_host::Confinement::none())
            .arg(scenario)
            .restart_policy(RestartPolicy {
                max_restarts: 0,
                ..RestartPolicy::default()
            })
            .spawn()
            .await?;
        let mut outcome = host.call::<Echo>(&payload).await;
        if scenario == "predictable_id" {
            // The first call is answered honestly; the forgery is staged for the next one.
            // Wait until it has landed (the host counts it), so the next call meets its result.
            let staged = Instant::now();
            while host.stats().violations.is_empty() && staged.elapsed() < Duration::from_secs(5) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            outcome = host.call::<Echo>(&payload).await;
        }
        let verdict = match &outcome {
            Err(CallError::WorkerLost(LostReason::Violation(v))) => {
                format!("refused: violation #{} {:?}", v.code.number(), v.code)
            }
            Err(CallError::WorkerLost(LostReason::RestartBudgetExhausted)) => {
                let stats = host.stats();
                let codes: Vec<_> = stats
                    .violations
                    .keys()
                    .map(|c| format!("#{} {c:?}", c.number()))
                    .collect();
                format!("refused: worker killed for {codes:?}; no forged answer delivered")
            }
            Err(CallError::Decode(err)) => {
                format!("refused: response did not decode ({err}); worker killed")
            }
            other => return Err(format!("{scenario}: unexpected outcome {other:?}").into()),
        };
        println!("   {scenario:<22} {what}\n   {:<22} -> {verdict}", "");
        host.shutdown().await;
    }

    println!("\nAll done in {:?}.", started.elapsed());
    Ok(())
}

fn section(title: &str) {
    println!("\n== {title}");
}

/// The serving worker's pid as this host sees it (a confined worker is pid 1 inside its own
/// PID namespace): the `Pid` call proves it answers.
async fn worker_pid(host: &Host) -> Result<u32, Box<dyn std::error::Error>> {
    host.call::<Pid>(&()).await?;
    host.worker_pid().ok_or_else(|| "no worker pid".into())
}
