//! `thumbnail-batch`: a batch job on a `Pool`, with a progress bar fed by streaming calls.
//!
//! It spreads twelve batches of eight images over a `Pool` of three confined
//! `thumbnail-worker`s. Each batch is one streaming call (`MakeThumbnails`): the worker sends
//! the number of images it has done after each one, and every update moves the bar. It
//! depends on `airlock-host` alone for everything airlock (indicatif draws the bar; it stays
//! hidden when stderr is not a terminal).
//!
//! Usage: `thumbnail-batch <path to thumbnail-worker>`

use airlock_example_api::{Image, MakeThumbnails, ThumbnailRequest};
use airlock_host::{Host, Pool};
use indicatif::ProgressBar;

type Error = Box<dyn std::error::Error + Send + Sync>;

const BATCHES: u64 = 12;
const PER_BATCH: u64 = 8;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let worker = std::env::args()
        .nth(1)
        .ok_or("usage: thumbnail-batch <path to thumbnail-worker>")?;
    let pool = Pool::builder(Host::builder(&worker))
        .size(3)
        .spawn()
        .await?;
    let bar = ProgressBar::new(BATCHES * PER_BATCH);

    let mut batches = tokio::task::JoinSet::new();
    for batch in 0..BATCHES {
        let (pool, bar) = (pool.clone(), bar.clone());
        batches.spawn(async move {
            let requests: Vec<ThumbnailRequest> = (0..PER_BATCH)
                .map(|i| ThumbnailRequest {
                    image: image(&format!("batch {batch} image {i}"), 256, 256, batch + i),
                    scale: 4,
                })
                .collect();
            let mut call = pool.call_streaming::<MakeThumbnails>(&requests)?;
            let mut reported = 0;
            while let Some(done) = call.next().await {
                bar.inc(u64::from(done - reported));
                reported = done;
            }
            let thumbnails = call.result().await?;
            // The worker chose these bytes: check each before using it.
            for thumbnail in &thumbnails {
                thumbnail.check()?;
            }
            Ok::<usize, Error>(thumbnails.len())
        });
    }
    let mut made = 0;
    while let Some(batch) = batches.join_next().await {
        made += batch??;
    }
    bar.finish();
    let stats = pool.stats();
    println!(
        "{made} thumbnails in {BATCHES} streamed batches over {} workers ({} calls ok, {} failed)",
        stats.workers.len(),
        stats.total.calls_ok,
        stats.total.calls_failed.total()
    );
    pool.shutdown().await;
    Ok(())
}

/// A `width` × `height` test image: a diagonal gradient shifted by `seed`.
fn image(name: &str, width: u32, height: u32, seed: u64) -> Image {
    let pixels = (0..height)
        .flat_map(|y| (0..width).map(move |x| ((u64::from(x + y) + seed) % 256) as u8))
        .collect();
    Image {
        name: name.into(),
        width,
        height,
        pixels,
    }
}
