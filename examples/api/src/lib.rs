//! The methods a thumbnail worker serves, shared by the worker (`thumbnail-worker`) and the
//! hosts that call it (`thumbnail-host`, `thumbnail-blocking`).
//!
//! Shared methods belong in a crate of their own that both sides depend on: each method's name
//! and both of its types are then one declaration, and changing either is a build error on
//! both sides, never a mismatch found at run time. Such a crate needs only `airlock-protocol`
//! (for [`method!`](airlock_protocol::method), without a runtime or any I/O) and serde; the
//! worker and the host each depend on their own side's crate alone.
//!
//! Request and response types are plain data: the host decodes the response from bytes a
//! possibly hostile worker chose, and its `Deserialize` is the only code those bytes reach.
//! Whatever a type's constructor would check is checked again after the call (see
//! [`Thumbnail::check`]).

#![forbid(unsafe_code)]
#![deny(missing_docs)]

use serde::{Deserialize, Serialize};

/// A grayscale image: one byte per pixel, row by row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// What to call it in logs.
    pub name: String,
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// `width * height` bytes. Bulk data as a byte type (`serde_bytes`): encoded and decoded
    /// with one copy, where a plain `Vec<u8>` takes a step per byte.
    #[serde(with = "serde_bytes")]
    pub pixels: Vec<u8>,
}

/// What [`MakeThumbnail`] is asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThumbnailRequest {
    /// The image to shrink.
    pub image: Image,
    /// The factor, at least 1: each `scale` × `scale` block becomes one pixel.
    pub scale: u32,
}

/// What [`MakeThumbnail`] answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Thumbnail {
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// `width * height` bytes. A plain `Vec<u8>` works at any size the budgets allow (it is
    /// budgeted as bytes, like a byte string); it is only slower than a `serde_bytes` field.
    pub pixels: Vec<u8>,
    /// The mean brightness of the whole image, 0 to 255.
    pub mean: f64,
}

impl Thumbnail {
    /// Checks what the types cannot: the pixel count matches the dimensions and the mean is in
    /// range. A host runs this on every answer, since the worker chose its bytes.
    pub fn check(&self) -> Result<(), String> {
        let expected = u64::from(self.width) * u64::from(self.height);
        if self.pixels.len() as u64 != expected {
            return Err(format!(
                "{} pixels for {}x{}",
                self.pixels.len(),
                self.width,
                self.height
            ));
        }
        if !(0.0..=255.0).contains(&self.mean) {
            return Err(format!("mean brightness {} out of range", self.mean));
        }
        Ok(())
    }
}

airlock_protocol::method!(
    /// Shrinks an image by an integer factor, each block of pixels becoming their average.
    /// Fails (a handler error, code 1) when the pixels do not match the dimensions or the
    /// factor is 0 or larger than the image.
    pub MakeThumbnail, "thumbnail", ThumbnailRequest => Thumbnail
);

airlock_protocol::method!(
    /// Counts the pixels of an image in 16 brightness bands (0-15, 16-31, ...).
    pub Histogram, "histogram", Image => [u64; 16]
);

airlock_protocol::method!(
    /// Shrinks a batch of images, one after another, sending the number of images done so far
    /// as a progress update after each (a streaming method: `Host::call_streaming`).
    pub MakeThumbnails, "thumbnails", Vec<ThumbnailRequest> => Vec<Thumbnail>, progress u32
);
