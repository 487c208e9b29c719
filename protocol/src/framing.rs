//! Length-prefixed framing: a little-endian `u32` length, then that many bytes of frame.

use bytes::{Buf, Bytes, BytesMut};

use crate::FrameError;

/// Length of the prefix in front of every frame.
pub const LENGTH_PREFIX: usize = 4;

/// Splits a byte stream into frames, incrementally.
///
/// Feed it chunks of any size, one byte at a time included, with [`FrameDecoder::extend`]; take
/// complete frames with [`FrameDecoder::next_frame`], which answers `Ok(None)` while it needs
/// more. A length over `max_frame` is refused from the four prefix bytes alone, before any
/// buffer is reserved for the frame, and the buffer only ever holds bytes that really arrived.
/// Frames are handed out as [`Bytes`] sharing the read buffer, so their bodies are not copied.
///
/// ```
/// use airlock_protocol::FrameDecoder;
/// let mut decoder = FrameDecoder::new(1024);
/// for byte in [3, 0, 0, 0, b'a', b'b', b'c'] {
///     decoder.extend(&[byte]);
/// }
/// assert_eq!(decoder.next_frame().unwrap().unwrap(), &b"abc"[..]);
/// assert_eq!(decoder.next_frame().unwrap(), None);
/// ```
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    state: DecodeState,
    max_frame: u32,
}

/// Where the decoder is within the current frame.
#[derive(Clone, Copy, Debug)]
enum DecodeState {
    /// Waiting for the 4-byte length prefix.
    Head,
    /// The prefix said `len` bytes follow; waiting for all of them.
    Data(usize),
    /// A refused prefix: the stream cannot be resynchronised, so nothing more is decoded.
    Failed(FrameError),
}

impl FrameDecoder {
    /// A decoder refusing frames longer than `max_frame` bytes.
    pub fn new(max_frame: u32) -> Self {
        Self {
            buf: BytesMut::new(),
            state: DecodeState::Head,
            max_frame,
        }
    }

    /// Changes the cap for frames not yet started, keeping everything buffered (a session
    /// raises it once the handshake has set the connection's limit).
    pub fn set_max_frame(&mut self, max_frame: u32) {
        self.max_frame = max_frame;
    }

    /// The cap in force.
    pub fn max_frame(&self) -> u32 {
        self.max_frame
    }

    /// Appends bytes received from the peer. Once a frame was refused, input is ignored.
    pub fn extend(&mut self, data: &[u8]) {
        if !matches!(self.state, DecodeState::Failed(_)) {
            self.buf.extend_from_slice(data);
        }
    }

    /// The buffer a transport may read into directly (appending only), to save a copy.
    pub fn read_buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Bytes the decoder needs before it can return the next frame: the rest of the prefix, or
    /// the rest of the frame. A transport may size its next read with this.
    pub fn wanted(&self) -> usize {
        match self.state {
            DecodeState::Head => LENGTH_PREFIX.saturating_sub(self.buf.len()),
            DecodeState::Data(len) => len.saturating_sub(self.buf.len()),
            DecodeState::Failed(_) => 0,
        }
    }

    /// The next complete frame (without its prefix), `Ok(None)` if more bytes are needed.
    ///
    /// Errors are final: a zero length ([`FrameError::Empty`]) or one over the cap
    /// ([`FrameError::TooLarge`]) leaves the stream unreadable, and every later call repeats it.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        loop {
            match self.state {
                DecodeState::Failed(err) => return Err(err),
                DecodeState::Head => {
                    let Some(prefix) = self.buf.first_chunk::<LENGTH_PREFIX>() else {
                        return Ok(None);
                    };
                    let len = u32::from_le_bytes(*prefix);
                    let refused = if len == 0 {
                        Some(FrameError::Empty)
                    } else if len > self.max_frame {
                        Some(FrameError::TooLarge {
                            len,
                            max: self.max_frame,
                        })
                    } else {
                        None
                    };
                    if let Some(err) = refused {
                        self.state = DecodeState::Failed(err);
                        self.buf = BytesMut::new(); // drop whatever the peer queued behind it
                        return Err(err);
                    }
                    self.buf.advance(LENGTH_PREFIX);
                    self.state = DecodeState::Data(len as usize);
                }
                DecodeState::Data(len) => {
                    if self.buf.len() < len {
                        return Ok(None);
                    }
                    self.state = DecodeState::Head;
                    return Ok(Some(self.buf.split_to(len).freeze()));
                }
            }
        }
    }

    /// Call at end of stream: an error if it ended inside a frame.
    pub fn finish(&self) -> Result<(), FrameError> {
        match self.state {
            DecodeState::Failed(err) => Err(err),
            DecodeState::Head if self.buf.is_empty() => Ok(()),
            DecodeState::Head => Err(FrameError::Truncated {
                expected: LENGTH_PREFIX as u32,
                received: self.buf.len() as u32,
            }),
            DecodeState::Data(len) => Err(FrameError::Truncated {
                expected: len as u32,
                received: self.buf.len() as u32,
            }),
        }
    }
}
