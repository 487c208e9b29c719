//! The method the `attack-worker` serves: one escape attempt per call, named by the request,
//! answered `Ok(evidence)` if the attempt worked and a remote error naming the errno if not.

airlock_host::method!(
    /// `attack(name, argument)`: see `src/bin/attack-worker.rs` for the names.
    pub Attack, "attack", (String, String) => String
);

/// Argument passed to the attack worker to skip its own seccomp allowlist, so a test sees
/// what the host's layers alone refuse (as for a worker written in another language).
pub const NO_SELF_FILTER: &str = "--no-self-filter";

/// The attack on a sibling, on a `Pool` of two workers built from `worker` (an attack worker):
/// the first (the thief) reads calls meant for the second off the host's pipes through
/// `/proc/<host>/fd` and answers them with a forged `Return`, while this process keeps calling
/// the second. Returns how many forged answers reached a caller, and the thief's own outcome.
pub async fn sibling_forgery(
    worker: airlock_host::HostBuilder,
) -> Result<(usize, Result<String, airlock_host::CallError>), airlock_host::SpawnError> {
    use std::time::Duration;
    let pool = airlock_host::Pool::builder(worker).size(2).spawn().await?;
    let thief = pool.hosts()[0].clone();
    let victim = pool.hosts()[1].clone();
    // Its pid as the host sees it: what a thief on this machine can find in /proc.
    let target = format!(
        "{}:{}",
        std::process::id(),
        victim.worker_pid().unwrap_or(0)
    );
    let steal = tokio::spawn(async move {
        thief
            .call::<Attack>(&("steal_sibling".to_string(), target))
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut forged = 0;
    let hello = serde_bytes::ByteBuf::from(b"hello".to_vec());
    for _ in 0..300 {
        if let Ok(answer) = victim.call::<airlock_worker::builtin::Echo>(&hello).await {
            forged += usize::from(answer.as_slice() == b"forged");
        }
        if steal.is_finished() && forged > 0 {
            break;
        }
    }
    let stolen = match steal.await {
        Ok(outcome) => outcome,
        Err(_) => Err(airlock_host::CallError::Cancelled),
    };
    pool.shutdown().await;
    Ok((forged, stolen))
}

/// Sends `signal` to the worker of `host` (an attack worker) while a call of it is running,
/// and returns that call's outcome: how the host reports a worker that died mid-call.
pub async fn a_call_whose_worker_is_signalled(
    host: &airlock_host::Host,
    signal: rustix::process::Signal,
) -> Result<String, airlock_host::CallError> {
    use std::time::Duration;
    let worker = host.worker_pid().expect("a process worker");
    let call = {
        let host = host.clone();
        tokio::spawn(async move {
            host.call::<Attack>(&("stall".to_string(), "60".to_string()))
                .await
        })
    };
    while host.in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pid = rustix::process::Pid::from_raw(worker as i32).expect("a worker pid");
    rustix::process::kill_process(pid, signal).expect("the worker can be signalled");
    call.await.expect("the call's task ends")
}
