//! `thumbnail-host`: a host of your own. It spawns `thumbnail-worker` confined, calls it with a
//! struct holding a 4 MiB image, checks what comes back, shows a handler's error arriving as
//! data, then spreads a batch over a `Pool` of three workers. It depends on `airlock-host`
//! alone for everything airlock (and on tokio, for its own `main`).
//!
//! Usage: `thumbnail-host <path to thumbnail-worker>`

use std::time::Instant;

use airlock_example_api::{Histogram, Image, MakeThumbnail, ThumbnailRequest};
use airlock_host::{CallError, ErrorKind, Host, Pool};

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let worker = std::env::args()
        .nth(1)
        .ok_or("usage: thumbnail-host <path to thumbnail-worker>")?;

    // Confined by default (its own namespaces and read-only root, Landlock, seccomp, no
    // capabilities), verified from outside before the first call.
    let host = Host::builder(&worker).spawn().await?;
    let info = host.worker_info();
    println!(
        "worker {} {} serves {:?}",
        info.name, info.version, info.methods
    );

    let image = gradient("gradient", 2048, 2048);
    let started = Instant::now();
    let thumbnail = host
        .call::<MakeThumbnail>(&ThumbnailRequest {
            image: image.clone(),
            scale: 8,
        })
        .await?;
    // The worker chose these bytes: check what the types cannot before using them.
    thumbnail.check()?;
    println!(
        "thumbnail of {} ({} bytes): {}x{}, mean brightness {:.1}, in {:?}",
        image.name,
        image.pixels.len(),
        thumbnail.width,
        thumbnail.height,
        thumbnail.mean,
        started.elapsed()
    );

    // A handler's own error comes back as data: a closed kind, a bounded message, a code.
    let broken = Image {
        name: "broken".into(),
        width: 10,
        height: 10,
        pixels: vec![0; 3],
    };
    match host
        .call::<MakeThumbnail>(&ThumbnailRequest {
            image: broken,
            scale: 2,
        })
        .await
    {
        Err(CallError::Remote(err)) if err.kind() == ErrorKind::Handler => {
            println!(
                "refused by the worker: {} (code {:?})",
                err.message(),
                err.code()
            );
        }
        other => return Err(format!("expected the worker's refusal, got {other:?}").into()),
    }
    host.shutdown().await;

    // A pool of three: each call goes to the worker taking calls with the fewest in flight.
    let pool = Pool::builder(Host::builder(&worker))
        .size(3)
        .spawn()
        .await?;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..12u32 {
        let pool = pool.clone();
        calls.spawn(async move {
            let image = gradient(&format!("tile-{i}"), 256 + 32 * i, 256);
            pool.call::<Histogram>(&image).await
        });
    }
    let mut pixels = 0u64;
    while let Some(histogram) = calls.join_next().await {
        pixels += histogram??.iter().sum::<u64>();
    }
    let per_worker: Vec<u64> = pool.stats().workers.iter().map(|s| s.calls_ok).collect();
    println!("histograms of 12 tiles: {pixels} pixels, calls per worker {per_worker:?}");
    pool.shutdown().await;
    Ok(())
}

/// A `width` × `height` image whose brightness rises from left to right.
fn gradient(name: &str, width: u32, height: u32) -> Image {
    let row: Vec<u8> = (0..width).map(|x| (x * 255 / width.max(1)) as u8).collect();
    Image {
        name: name.into(),
        width,
        height,
        pixels: row.repeat(height as usize),
    }
}
