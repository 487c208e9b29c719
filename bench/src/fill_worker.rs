//! The bench's own worker, `airlock-bench worker`: one method, `fill`, that answers a length
//! with that many bytes. Its answers can be as large as the host allows while the host sends
//! almost nothing, so the host's peak-RSS row measures what the host buffers of a worker's
//! frames, not its own requests.

use std::time::Duration;

use airlock_host::{CallError, ErrorKind, Host, Pool};
use serde_bytes::ByteBuf;
use tokio::runtime::Runtime;

use crate::links::Error;

airlock_worker::method!(
    /// Answers `len` bytes.
    pub Fill, "fill", u64 => ByteBuf);

/// Serves `fill` on the transport the host set up (the role `airlock-bench worker`).
pub fn serve() -> Result<(), Error> {
    airlock_worker::Worker::new()
        .identity("airlock-bench-fill", env!("CARGO_PKG_VERSION"))
        .method::<Fill, _, _>(|len| async move {
            let len = usize::try_from(len)
                .map_err(|_| airlock_worker::HandlerError::new("length beyond usize"))?;
            Ok(ByteBuf::from(vec![0xa5u8; len]))
        })
        .serve_blocking()?;
    Ok(())
}

/// A `Pool` of `size` default-confined `fill` workers (this binary, re-executed).
pub fn spawn_pool(rt: &Runtime, size: usize) -> Result<Pool, Error> {
    let program = std::env::current_exe()?;
    let host = Host::builder(program)
        .arg("worker")
        // A 16 MiB answer on a loaded 2-vCPU machine takes well under a second; the default
        // 30 s would only delay a report of a stuck worker.
        .call_timeout(Duration::from_secs(10));
    Ok(rt.block_on(Pool::builder(host).size(size).spawn())?)
}

/// The payload length of a body-carrying frame (PROTOCOL.md, "body"): kind, id, method name
/// and body, each of the last two behind its varint length.
fn body_frame_len(method: &str, body: usize) -> usize {
    1 + 16 + varint_len(method.len()) + method.len() + varint_len(body) + body
}

fn varint_len(value: usize) -> usize {
    let bits = usize::BITS - (value | 1).leading_zeros();
    bits.div_ceil(7) as usize
}

/// The longest `fill` answer whose `Return` frame fits `max_frame`: a `ByteBuf` of `len` bytes
/// encodes as its varint length and the bytes.
pub fn longest_answer(max_frame: u32) -> usize {
    let frame =
        |len: usize| body_frame_len(<Fill as airlock_host::Method>::NAME, varint_len(len) + len);
    let mut len = max_frame as usize;
    while frame(len) > max_frame as usize {
        len -= 1;
    }
    len
}

/// Checks that answers of `len` bytes make frames exactly at the cap: `len` arrives whole, and
/// one byte more is refused by the worker as over `max_frame` (a `Fail` of kind `Limit`).
pub fn check_at_cap(rt: &Runtime, host: &Host, len: usize) -> Result<(), Error> {
    rt.block_on(async {
        let answer = host.call::<Fill>(&(len as u64)).await?;
        if answer.len() != len {
            return Err(format!("fill answered {} bytes, not {len}", answer.len()).into());
        }
        match host.call::<Fill>(&(len as u64 + 1)).await {
            Err(CallError::Remote(remote)) if remote.kind() == ErrorKind::Limit => Ok(()),
            Ok(_) => Err(format!(
                "an answer of {} bytes fit: {len} is not at the cap",
                len + 1
            )
            .into()),
            Err(err) => Err(err.into()),
        }
    })
}

/// Every worker of `pool` answers `rounds` calls of `len` bytes on each of `in_flight` slots at
/// once, while the host reads them; each answer is dropped as it arrives.
pub fn answer_at_cap(
    rt: &Runtime,
    pool: &Pool,
    len: usize,
    in_flight: usize,
    rounds: u32,
) -> Result<(), Error> {
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for host in pool.hosts() {
            for _ in 0..in_flight {
                let host = host.clone();
                tasks.spawn(async move {
                    for _ in 0..rounds {
                        let answer = host.call::<Fill>(&(len as u64)).await?;
                        if answer.len() != len {
                            return Err(Error::from("a fill answer came back short"));
                        }
                    }
                    Ok(())
                });
            }
        }
        while let Some(done) = tasks.join_next().await {
            done??;
        }
        Ok(())
    })
}
