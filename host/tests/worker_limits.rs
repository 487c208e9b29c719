//! `Worker::limits`: the worker's own budgets for decoding requests. A request over them is
//! that call's `BadRequest`, naming the budget; the worker serves on.

use airlock_host::{CallError, ErrorKind, InProcess, Limits};
use airlock_worker::builtin::{builtin_worker, Sum};

#[tokio::test]
async fn a_request_over_the_workers_own_item_budget_is_refused_and_the_worker_serves_on() {
    let host = InProcess::new(|| builtin_worker().limits(Limits::default().max_items(10)))
        .await
        .expect("in-process worker");
    let refused = host.call::<Sum>(&vec![1; 20]).await;
    match &refused {
        Err(CallError::Remote(error)) => {
            assert_eq!(error.kind(), ErrorKind::BadRequest, "{refused:?}");
            let message = error.message();
            assert!(message.contains("more than 10 elements"), "{message}");
            assert!(message.contains("(Limits::max_items)"), "{message}");
            assert!(message.contains("Worker::limits"), "{message}");
        }
        other => panic!("expected BadRequest, got {other:?}"),
    }
    assert_eq!(host.call::<Sum>(&vec![1; 5]).await, Ok(5));

    // The default worker takes the same request: the refusal was the budget set above.
    let default = InProcess::new(builtin_worker)
        .await
        .expect("in-process worker");
    assert_eq!(default.call::<Sum>(&vec![1; 20]).await, Ok(20));
    host.shutdown().await;
    default.shutdown().await;
}
