//! Length-prefixed framing: a little-endian `u32` length, then that many bytes of frame.

use bytes::{Buf, Bytes, BytesMut};

use crate::FrameError;

/// Length of the prefix in front of every frame.
pub const LENGTH_PREFIX: usize = 4;

/// Frames at least this long are read into a buffer of their own: 64 KiB. Such a frame's
/// buffer then holds that frame and nothing else (no earlier or later frame shares it), so a
/// view kept into it, such as a lent [`Blob`](crate::Blob), keeps at most that one frame's
/// buffer alive, and that buffer is at most about twice the frame.
pub const OWN_BUFFER_FROM: usize = 64 * 1024;

/// Large frames under this length leave a free buffer too large for them aside instead of
/// freeing it: 1 MiB. The frame's own buffer, beside the one kept, is then at most about twice
/// this.
const KEEP_ASIDE_BELOW: usize = 1024 * 1024;

/// The buffer a [`FrameDecoder`] keeps for its next large frame.
#[derive(Debug)]
enum Spare {
    /// Nothing kept (at the start, and once the stream has failed).
    None,
    /// The last large frame handed out: its buffer is free once nothing else refers to it.
    LastFrame(Bytes),
    /// A free buffer too large for the frames read since it was freed (all under
    /// [`KEEP_ASIDE_BELOW`]), kept for the next frame it fits.
    KeptAside(BytesMut),
}

/// Splits a byte stream into frames, incrementally.
///
/// Feed it chunks of any size, one byte at a time included, with [`FrameDecoder::extend`]; take
/// complete frames with [`FrameDecoder::next_frame`], which answers `Ok(None)` while it needs
/// more. A length over `max_frame` is refused from the four prefix bytes alone, before any
/// buffer is reserved for the frame, and the buffers grow only as bytes arrive (into
/// [`read_buffer`](Self::read_buffer), by as much as the transport reserves ahead).
/// Frames are handed out as [`Bytes`] sharing the read buffer, so their bodies are not copied.
/// A frame of at least [`OWN_BUFFER_FROM`] bytes gets a buffer of its own; when nothing refers
/// to the last one any more and it is at most twice the next such frame, that frame reuses it.
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
    /// Prefixes and small frames, and whatever arrived behind the frame being read.
    buf: BytesMut,
    /// The large frame being read (state [`DecodeState::Large`]); empty otherwise.
    large: BytesMut,
    /// The one buffer kept for the next large frame.
    spare: Spare,
    state: DecodeState,
    max_frame: u32,
}

/// Where the decoder is within the current frame.
#[derive(Clone, Copy, Debug)]
enum DecodeState {
    /// Waiting for the 4-byte length prefix.
    Head,
    /// The prefix said `len` bytes follow, fewer than [`OWN_BUFFER_FROM`]; waiting for all of
    /// them in `buf`.
    Data(usize),
    /// The prefix said `len` bytes follow, at least [`OWN_BUFFER_FROM`]; waiting for all of
    /// them in `large`.
    Large(usize),
    /// A refused prefix: the stream cannot be resynchronised, so nothing more is decoded.
    Failed(FrameError),
}

impl FrameDecoder {
    /// A decoder refusing frames longer than `max_frame` bytes.
    pub fn new(max_frame: u32) -> Self {
        Self {
            buf: BytesMut::new(),
            large: BytesMut::new(),
            spare: Spare::None,
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
        match self.state {
            DecodeState::Failed(_) => {}
            DecodeState::Large(len) => {
                let (own, behind) =
                    data.split_at(len.saturating_sub(self.large.len()).min(data.len()));
                self.large.extend_from_slice(own);
                self.buf.extend_from_slice(behind);
            }
            DecodeState::Head | DecodeState::Data(_) => self.buf.extend_from_slice(data),
        }
    }

    /// The buffer a transport may read into directly (appending only), to save a copy. While a
    /// large frame is read, that is the frame's own buffer: read at most [`wanted`](Self::wanted)
    /// bytes into it.
    pub fn read_buffer(&mut self) -> &mut BytesMut {
        match self.state {
            // Once bytes behind the frame have arrived (in `buf`), later ones go after them.
            DecodeState::Large(_) if self.buf.is_empty() => &mut self.large,
            _ => &mut self.buf,
        }
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.large.len()
    }

    /// Bytes the decoder needs before it can return the next frame: the rest of the prefix, or
    /// the rest of the frame. A transport may size its next read with this.
    pub fn wanted(&self) -> usize {
        match self.state {
            DecodeState::Head => LENGTH_PREFIX.saturating_sub(self.buf.len()),
            DecodeState::Data(len) => len.saturating_sub(self.buf.len()),
            DecodeState::Large(len) => len.saturating_sub(self.large.len()),
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
                        // Drop whatever the peer queued behind it, and the buffers kept for
                        // frames that will not come.
                        self.buf = BytesMut::new();
                        self.spare = Spare::None;
                        return Err(err);
                    }
                    self.buf.advance(LENGTH_PREFIX);
                    let len = len as usize;
                    if len < OWN_BUFFER_FROM {
                        self.state = DecodeState::Data(len);
                    } else {
                        self.start_large(len);
                    }
                }
                DecodeState::Data(len) => {
                    if self.buf.len() < len {
                        return Ok(None);
                    }
                    self.state = DecodeState::Head;
                    return Ok(Some(self.buf.split_to(len).freeze()));
                }
                DecodeState::Large(len) => {
                    if self.large.len() < len {
                        return Ok(None);
                    }
                    self.state = DecodeState::Head;
                    if self.large.len() > len {
                        // A transport read past the frame: what follows it moves out, so the
                        // frame's buffer holds only the frame.
                        let behind = self.large.split_off(len);
                        let mut rest = BytesMut::with_capacity(behind.len() + self.buf.len());
                        rest.extend_from_slice(&behind);
                        rest.extend_from_slice(&self.buf);
                        self.buf = rest;
                    }
                    let frame = std::mem::take(&mut self.large).freeze();
                    // One spare at most: while one is kept aside, this frame's buffer goes when
                    // its last reference does.
                    if !matches!(self.spare, Spare::KeptAside(_)) {
                        self.spare = Spare::LastFrame(frame.clone());
                    }
                    return Ok(Some(frame));
                }
            }
        }
    }

    /// Enters [`DecodeState::Large`]: the spare if it is free and at most twice this frame,
    /// else a new buffer grown as bytes arrive; what already arrived of the frame (at most one
    /// read's worth) is moved into it. A free spare too large for this frame is kept aside
    /// while the frame is small (under [`KEEP_ASIDE_BELOW`]), so traffic that alternates large
    /// and small frames does not free and regrow it each time; beside a larger frame it is
    /// freed. So the decoder holds at most one free buffer beside the frame in progress, and
    /// while it keeps one aside that frame is under 1 MiB.
    fn start_large(&mut self, len: usize) {
        let free = match std::mem::replace(&mut self.spare, Spare::None) {
            Spare::LastFrame(frame) => frame.try_into_mut().ok(),
            Spare::KeptAside(buffer) => Some(buffer),
            Spare::None => None,
        };
        let mut large = match free {
            Some(buffer) if buffer.capacity() <= len.saturating_mul(2) => buffer,
            Some(buffer) if len < KEEP_ASIDE_BELOW => {
                self.spare = Spare::KeptAside(buffer);
                BytesMut::new()
            }
            _ => BytesMut::new(),
        };
        large.clear();
        let arrived = self.buf.len().min(len);
        large.extend_from_slice(&self.buf[..arrived]);
        self.buf.advance(arrived);
        self.large = large;
        self.state = DecodeState::Large(len);
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
            DecodeState::Large(len) => Err(FrameError::Truncated {
                expected: len as u32,
                received: self.large.len() as u32,
            }),
        }
    }
}
