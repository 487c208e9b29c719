//! `call_loop <airlock-worker> [calls]`: sequential small `echo` calls to the real worker, for
//! profiling the per-call path (`perf record`, `strace -c`). Prints the mean time per call.

use std::time::Instant;

use airlock_host::Host;
use airlock_worker::builtin::Echo;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let worker = args
        .next()
        .ok_or("usage: call_loop <airlock-worker> [calls]")?;
    let calls: u32 = args
        .next()
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(20_000);
    let host = Host::builder(worker).spawn().await?;
    let payload = serde_bytes::ByteBuf::from(vec![7u8; 28]);
    let start = Instant::now();
    for _ in 0..calls {
        host.call::<Echo>(&payload).await?;
    }
    println!(
        "{:.2} µs per call",
        start.elapsed().as_secs_f64() * 1e6 / f64::from(calls)
    );
    host.shutdown().await;
    Ok(())
}
