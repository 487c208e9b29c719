//! `thumbnail-worker`: a worker of your own. It serves the methods declared in
//! `airlock-example-api` over whatever channel its host set up, and depends on
//! `airlock-worker` alone for everything airlock.
//!
//! Run it through a host (`thumbnail-host`, `thumbnail-blocking`), never by hand: the host
//! spawns it confined, hands it its channel and verifies it before the first call.

use airlock_example_api::{
    Histogram, Image, MakeThumbnail, MakeThumbnails, Thumbnail, ThumbnailRequest,
};
use airlock_worker::{HandlerError, Worker};

fn main() -> Result<(), airlock_worker::ServeError> {
    Worker::new()
        .identity("thumbnailer", env!("CARGO_PKG_VERSION"))
        // CPU-bound work: blocking handlers run on the worker's own thread pool, so one
        // large image does not hold up the calls beside it.
        .blocking_method::<MakeThumbnail, _>(thumbnail)
        .blocking_method::<Histogram, _>(|image| histogram(&image))
        // A batch, with a progress update after each image. Each image is a short piece of
        // work between two `.await`s, so the serving loop takes other calls in between.
        .streaming_method::<MakeThumbnails, _, _>(|batch, mut progress| async move {
            let mut done = Vec::with_capacity(batch.len());
            for request in batch {
                done.push(thumbnail(request)?);
                let count = u32::try_from(done.len()).unwrap_or(u32::MAX);
                progress
                    .send(&count)
                    .await
                    .map_err(|e| HandlerError::new(e.to_string()))?;
            }
            Ok(done)
        })
        .serve_blocking()
}

/// Refused with code 1: the request does not describe an image.
fn bad_image(message: String) -> HandlerError {
    HandlerError::new(message).with_code(1)
}

/// The image's pixels, checked against its dimensions.
fn pixels(image: &Image) -> Result<&[u8], HandlerError> {
    let expected = u64::from(image.width) * u64::from(image.height);
    if image.pixels.len() as u64 != expected {
        return Err(bad_image(format!(
            "{}: {} pixels for {}x{}",
            image.name,
            image.pixels.len(),
            image.width,
            image.height
        )));
    }
    Ok(&image.pixels)
}

fn thumbnail(request: ThumbnailRequest) -> Result<Thumbnail, HandlerError> {
    let ThumbnailRequest { image, scale } = request;
    let pixels = pixels(&image)?;
    if scale == 0 || scale > image.width || scale > image.height {
        return Err(bad_image(format!(
            "{}: cannot shrink {}x{} by {scale}",
            image.name, image.width, image.height
        )));
    }
    let (width, height) = (image.width / scale, image.height / scale);
    let row = image.width as usize;
    let block = scale as usize;
    let mut out = Vec::with_capacity(width as usize * height as usize);
    for y in 0..height as usize {
        for x in 0..width as usize {
            let sum: u64 = (0..block)
                .flat_map(|dy| {
                    let start = (y * block + dy) * row + x * block;
                    pixels[start..start + block].iter().map(|&p| u64::from(p))
                })
                .sum();
            out.push((sum / (block * block) as u64) as u8);
        }
    }
    let total: u64 = pixels.iter().map(|&p| u64::from(p)).sum();
    let mean = total as f64 / pixels.len().max(1) as f64;
    Ok(Thumbnail {
        width,
        height,
        pixels: out,
        mean,
    })
}

fn histogram(image: &Image) -> Result<[u64; 16], HandlerError> {
    let mut bands = [0u64; 16];
    for &p in pixels(image)? {
        bands[usize::from(p / 16)] += 1;
    }
    Ok(bands)
}
