//! Every limit a call can run into is named in its error with its value and the setting that
//! changes it: the frame limit, the in-flight limit, and the host's frame limit as the worker
//! reports it for a reply too large to send.

use std::time::Duration;

use airlock_host::{CallError, ConfigError, ErrorKind, Host, HostConfig, InProcess};
use airlock_worker::builtin::{builtin_worker, Echo, EchoVec, Sleep};
use serde_bytes::ByteBuf;

fn small_frames() -> HostConfig {
    HostConfig::default().max_frame(64 * 1024).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_frame_limit_names_the_limit_and_its_setting() {
    let builder = Host::builder("in-process").protocol(small_frames());
    let host = InProcess::with_builder(builder, builtin_worker)
        .await
        .unwrap();
    let refused = host.call::<Echo>(&ByteBuf::from(vec![0u8; 100_000])).await;
    assert!(
        matches!(refused, Err(CallError::TooLarge { len, max: 65_536 }) if len > 100_000),
        "{refused:?}"
    );
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("frame limit of 65536 bytes"), "{message}");
    assert!(message.contains("HostConfig::max_frame"), "{message}");
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_the_in_flight_limit_names_the_limit_and_its_setting() {
    let builder =
        Host::builder("in-process").protocol(HostConfig::default().max_in_flight(1).unwrap());
    let host = InProcess::with_builder(builder, builtin_worker)
        .await
        .unwrap();
    let busy = {
        let host = host.clone();
        tokio::spawn(async move { host.call::<Sleep>(&500).await })
    };
    while host.host().in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refused = host.call::<Sleep>(&1).await;
    assert_eq!(refused, Err(CallError::Overloaded { max: 1 }));
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("limit of 1 calls in flight"), "{message}");
    assert!(message.contains("HostConfig::max_in_flight"), "{message}");
    assert_eq!(busy.await.unwrap(), Ok(500));
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_over_the_hosts_frame_limit_names_the_limit_and_its_setting() {
    let builder = Host::builder("in-process").protocol(small_frames());
    let host = InProcess::with_builder(builder, || {
        builtin_worker().method::<Grow, _, _>(|n| async move { Ok(vec![1u8; n as usize]) })
    })
    .await
    .unwrap();
    let refused = host.call::<Grow>(&100_000).await;
    match &refused {
        Err(CallError::Remote(error)) => {
            assert_eq!(error.kind(), ErrorKind::Limit);
            let message = error.message();
            assert!(message.contains("frame limit of 65536 bytes"), "{message}");
            assert!(message.contains("HostConfig::max_frame"), "{message}");
        }
        other => panic!("expected the worker's Limit, got {other:?}"),
    }
    // The worker serves on.
    assert_eq!(
        host.call::<EchoVec>(&vec![1, 2, 3]).await,
        Ok(vec![1, 2, 3])
    );
    host.shutdown().await;
}

airlock_host::method!(
    /// Answers that many bytes.
    Grow, "grow", u32 => Vec<u8>
);

#[test]
fn an_out_of_range_setting_is_named_with_its_value() {
    let err = HostConfig::default().max_frame(100).unwrap_err();
    assert_eq!(err, ConfigError::MaxFrameTooSmall(100));
    assert_eq!(
        err.to_string(),
        "HostConfig::max_frame(100) is below the minimum of 8192 bytes"
    );
    let err = HostConfig::default().max_in_flight(0).unwrap_err();
    assert!(
        err.to_string().starts_with("HostConfig::max_in_flight(0)"),
        "{err}"
    );
}
