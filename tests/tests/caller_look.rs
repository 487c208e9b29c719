//! A caller that writes its frame with no other call in flight looks for its answer itself
//! (`host/src/connection/inlet.rs`): with the worker on the caller's CPU, most answers are
//! taken so, the rest by the reader. Every answer must reach its own caller whole, whoever
//! takes it, on any runtime and through the blocking API, and a worker's bytes that make a
//! response type panic must be a lie like any other, never a panic in the caller's call.
//! A lost wake-up of the reader would show as a call's `Timeout`.

use std::sync::atomic::{AtomicBool, Ordering};

use airlock_host::{Host, TransportChoice};
use airlock_tests::e2e::{fast_restarts, pin_to_one_cpu, rogue_bin, rogue_struck, soon, within};
use airlock_tests::support::current_thread_runtime;

airlock_host::method!(
    /// The rogue's honest `echo` on a `u64`.
    pub U64Echo, "echo", u64 => u64
);

airlock_host::method!(
    /// The rogue's honest `echo` on a byte string.
    pub BytesEcho, "echo", serde_bytes::ByteBuf => serde_bytes::ByteBuf
);

/// Whether a `Touchy` was given 666 to decode: the attack reached the response type.
static TOUCHED: AtomicBool = AtomicBool::new(false);

/// A response type whose `Deserialize` panics on one value, which the worker chooses.
#[derive(Debug, PartialEq, serde::Serialize)]
pub struct Touchy(u64);

impl<'de> serde::Deserialize<'de> for Touchy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = <u64 as serde::Deserialize>::deserialize(deserializer)?;
        if value == 666 {
            TOUCHED.store(true, Ordering::SeqCst);
            panic!("Touchy panics on 666");
        }
        Ok(Self(value))
    }
}

airlock_host::method!(
    /// The rogue's honest `echo`, answered as a `Touchy`.
    pub TouchyEcho, "echo", u64 => Touchy
);

async fn honest_rogue(transport: TransportChoice, restarts: u32) -> Host {
    Host::builder(rogue_bin())
        .arg("honest")
        .transport(transport)
        .restart_policy(fast_restarts(restarts))
        .spawn()
        .await
        .expect("the rogue completes its handshake")
}

/// Bytes that make the caller's response type panic, taken by the caller's own look (the
/// worker shares its CPU), are a lie: the caller hears `Decode`, nothing panics in its task,
/// the worker is replaced, and the next call is answered.
#[test]
fn a_response_type_that_panics_on_the_workers_bytes_is_a_lie_not_a_panic_in_the_caller() {
    pin_to_one_cpu();
    current_thread_runtime().block_on(async {
        let host = honest_rogue(TransportChoice::Pipe, 5).await;
        for round in 0..3u64 {
            // Calls made alone and answered during the write: looks pay.
            for i in 0..20u64 {
                let echoed = host.call_with_deadline::<U64Echo>(&i, soon(5000)).await;
                assert_eq!(echoed, Ok(i));
            }
            let caller = host.clone();
            let touchy = tokio::spawn(async move {
                caller
                    .call_with_deadline::<TouchyEcho>(&666, soon(5000))
                    .await
            })
            .await;
            assert!(
                TOUCHED.load(Ordering::SeqCst),
                "the worker's bytes never reached the response type: the attack is not live"
            );
            match touchy {
                Ok(Err(airlock_host::CallError::Decode(_))) => {}
                other => panic!("round {round}: the panicking response gave {other:?}"),
            }
            let after = host.call_with_deadline::<U64Echo>(&7, soon(5000)).await;
            assert_eq!(after, Ok(7), "round {round}: the next call");
        }
        assert_eq!(host.stats().restarts, 3);
        host.shutdown().await;
    });
}

/// Thousands of calls made one at a time with the worker on the caller's CPU, so that looks
/// take most answers and the reader the rest: each answer is the caller's own.
#[test]
fn calls_made_alone_on_one_cpu_are_each_answered_with_their_own_value() {
    pin_to_one_cpu();
    current_thread_runtime().block_on(async {
        let host = honest_rogue(TransportChoice::Pipe, 0).await;
        for i in 0..5000u64 {
            let echoed = host.call_with_deadline::<U64Echo>(&i, soon(10_000)).await;
            assert_eq!(echoed, Ok(i), "call {i}");
        }
        host.shutdown().await;
    });
}

/// Callers on a multi-thread runtime, whose looks race the reader and one another.
#[test]
fn callers_racing_the_reader_on_a_multi_thread_runtime_are_each_answered() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let host = honest_rogue(TransportChoice::Pipe, 0).await;
        let tasks: Vec<_> = (0..3u64)
            .map(|task| {
                let host = host.clone();
                tokio::spawn(async move {
                    for i in 0..1500u64 {
                        let value = task * 1_000_000 + i;
                        let echoed = host.call_with_deadline::<U64Echo>(&value, soon(10_000));
                        assert_eq!(echoed.await, Ok(value), "task {task} call {i}");
                        if i % 7 == task {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(host.stats().restarts, 0);
        host.shutdown().await;
    });
}

/// Callers of the blocking API on threads of their own look while the host's runtime thread
/// runs the reader.
#[test]
fn blocking_callers_on_several_threads_are_each_answered() {
    let host = airlock_host::blocking::Host::spawn(
        Host::builder(rogue_bin())
            .arg("honest")
            .restart_policy(fast_restarts(0)),
    )
    .expect("the rogue completes its handshake");
    std::thread::scope(|scope| {
        for thread in 0..3u64 {
            let host = &host;
            scope.spawn(move || {
                for i in 0..1500u64 {
                    let value = thread * 1_000_000 + i;
                    let echoed = host.call_with_deadline::<U64Echo>(&value, soon(10_000));
                    assert_eq!(echoed, Ok(value), "thread {thread} call {i}");
                }
            });
        }
    });
    assert_eq!(host.stats().restarts, 0);
}

/// Answers of every size, over every transport, with the worker on the caller's CPU: a look
/// takes whole frames only, and leaves the rest of one larger than a read to the reader.
#[test]
fn answers_of_every_size_over_every_transport_arrive_whole() {
    pin_to_one_cpu();
    current_thread_runtime().block_on(async {
        for transport in [
            TransportChoice::Pipe,
            TransportChoice::SocketInherited,
            TransportChoice::SocketNamed,
        ] {
            let host = honest_rogue(transport, 0).await;
            let sizes = [
                0usize,
                16,
                4000,
                65_000,
                65_600,
                70_000,
                200_000,
                1 << 20,
                100,
            ];
            for round in 0..10usize {
                for (k, size) in sizes.iter().enumerate() {
                    let body: Vec<u8> = (0..*size).map(|i| (i + round + k) as u8).collect();
                    let echoed = host
                        .call_with_deadline::<BytesEcho>(&body.clone().into(), soon(10_000))
                        .await
                        .unwrap_or_else(|e| panic!("{transport:?} round {round} size {size}: {e}"));
                    assert!(echoed.as_slice() == body, "{transport:?} size {size}");
                }
            }
            assert_eq!(host.stats().restarts, 0, "{transport:?}");
            host.shutdown().await;
        }
    });
}

/// What the next call after a rogue's attempt to hold its output pipe's lock hears, and what
/// the rogue marked (`armed` just before a splice that holds the lock, or why it could not
/// make one). Under the default confinement (`confined`) on a current-thread runtime, the
/// host's thread pinned to one CPU, so that the caller looks; unconfined on a multi-thread
/// one, where SECURITY.md says to run unconfined workers (there the reader itself may meet
/// the held lock, and only the supervisor on another thread ends the wait). Run on a thread
/// of its own and given up after 20 s: a host stuck in the kernel never returns.
fn next_call_after_a_pipe_lock_hold(
    confined: bool,
) -> Option<(Result<u64, airlock_host::CallError>, String)> {
    within(std::time::Duration::from_secs(20), move || {
        let runtime = if confined {
            pin_to_one_cpu();
            current_thread_runtime()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
        };
        let dir = airlock_tests::e2e::ScratchDir::new("pipe-lock");
        let mark = dir.join("mark");
        runtime.block_on(async {
            let builder = if confined {
                airlock_tests::e2e::rogue_host_in(&dir)
            } else {
                Host::builder(rogue_bin()).confinement(airlock_host::Confinement::none())
            };
            let (host, marked) =
                rogue_struck(builder, "hold_output_pipe_lock", &mark, "unix_stream_read").await;
            let next = host.call_with_deadline::<U64Echo>(&2, soon(1500)).await;
            host.shutdown().await;
            (next, marked)
        })
    })
}

/// A worker that holds its output pipe's lock in the kernel (a `splice` from an empty socket
/// into the pipe) would put a caller's look to sleep on the lock and, on a current-thread
/// runtime, the supervisor with it, for good. Unconfined the hold is live (the worker's answer
/// cannot be written, and the next call meets its deadline); under the default confinement
/// the filter refuses the splice, and the next call, which a look may take, is answered.
#[test]
fn a_worker_cannot_hold_its_output_pipes_lock_against_a_callers_look() {
    let live = next_call_after_a_pipe_lock_hold(false)
        .expect("an unconfined host hung behind the pipe's lock");
    assert_eq!(live.1, "armed", "the attack is not live: {}", live.1);
    assert_eq!(live.0, Err(airlock_host::CallError::Timeout));
    let refused = next_call_after_a_pipe_lock_hold(true)
        .expect("a confined host hung behind the pipe's lock");
    assert!(
        refused.1.starts_with("no hold: splice"),
        "the rogue made its splice: {}",
        refused.1
    );
    assert_eq!(refused.0, Ok(2));
}
