//! `thumbnail-blocking`: the same host without an async runtime of its own. It uses
//! `airlock_host::blocking`, whose `Host` and `Pool` bring the runtime they need on a thread of
//! their own: `main` is a plain function and the calls block their thread.
//!
//! Usage: `thumbnail-blocking <path to thumbnail-worker>`

use airlock_example_api::{Histogram, Image, MakeThumbnail, ThumbnailRequest};
use airlock_host::{blocking, Host, Pool};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let worker = std::env::args()
        .nth(1)
        .ok_or("usage: thumbnail-blocking <path to thumbnail-worker>")?;

    let host = blocking::Host::spawn(Host::builder(&worker))?;
    let image = gradient("gradient", 1024, 768);
    let thumbnail = host.call::<MakeThumbnail>(&ThumbnailRequest { image, scale: 4 })?;
    thumbnail.check()?;
    println!(
        "thumbnail: {}x{}, mean brightness {:.1}",
        thumbnail.width, thumbnail.height, thumbnail.mean
    );
    host.shutdown();

    // A pool of three, called from eight threads at once.
    let pool = blocking::Pool::spawn(Pool::builder(Host::builder(&worker)).size(3))?;
    let counted: Result<Vec<u64>, _> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..8u32)
            .map(|i| {
                let pool = pool.clone();
                scope.spawn(move || {
                    let image = gradient(&format!("tile-{i}"), 128, 64 + i);
                    pool.call::<Histogram>(&image)
                        .map(|bands| bands.iter().sum())
                })
            })
            .collect();
        calls
            .into_iter()
            .map(|call| {
                call.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    let pixels: u64 = counted?.iter().sum();
    println!("histograms of 8 tiles from 8 threads: {pixels} pixels");
    // Dropping the last handle shuts the pool's workers down and stops its runtime thread.
    drop(pool);
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
