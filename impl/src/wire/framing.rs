//! The 4-byte big-endian length framing every framed family uses (the worker protocol,
//! the harness's relay link): [`encode_frame`] and the incremental [`FrameDecoder`]
//! (bytes in any chunking, whole payloads out, memory bounded by one maximal frame plus
//! one read chunk; a length over the maximum is refused before its body is buffered).
//! The maximum is the caller's. A zero length is an error: every framed payload is at
//! least one byte. No I/O.

/// Bytes of the length prefix.
pub const LENGTH_PREFIX_BYTES: usize = 4;

/// A malformed frame (or the end of the stream inside one). Every variant has a stable
/// [`code`](Self::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is 0.
    #[error("a frame of length 0 (every payload is at least one byte)")]
    ZeroLength,
    /// The length prefix exceeds the family's maximum.
    #[error("a frame of {len} bytes exceeds the {max}-byte maximum")]
    TooLong {
        /// The announced length.
        len: u64,
        /// The maximum.
        max: usize,
    },
    /// The stream ended inside a length prefix.
    #[error("the stream ended after {got} of the {LENGTH_PREFIX_BYTES} length bytes")]
    TruncatedHeader {
        /// Length bytes received.
        got: usize,
    },
    /// The stream ended inside a payload.
    #[error("the stream ended after {got} of {expected} payload bytes")]
    TruncatedBody {
        /// The announced length.
        expected: usize,
        /// Payload bytes received.
        got: usize,
    },
}

impl FrameError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::ZeroLength => "zero_length",
            FrameError::TooLong { .. } => "frame_too_long",
            FrameError::TruncatedHeader { .. } => "truncated_header",
            FrameError::TruncatedBody { .. } => "truncated_body",
        }
    }
}

/// `payload` behind its 4-byte big-endian length.
///
/// # Errors
/// [`FrameError::ZeroLength`] for an empty payload, [`FrameError::TooLong`] beyond `max`.
pub fn encode_frame(payload: &[u8], max: usize) -> Result<Vec<u8>, FrameError> {
    if payload.is_empty() {
        return Err(FrameError::ZeroLength);
    }
    if payload.len() > max {
        return Err(FrameError::TooLong {
            len: payload.len() as u64,
            max,
        });
    }
    let len = u32::try_from(payload.len()).map_err(|_| FrameError::TooLong {
        len: payload.len() as u64,
        max,
    })?;
    let mut out = Vec::with_capacity(LENGTH_PREFIX_BYTES + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Splits a byte stream into payloads. Memory is bounded by one maximal frame plus one
/// read chunk: a length over the maximum is refused before its body is buffered.
#[derive(Debug)]
pub struct FrameDecoder {
    max: usize,
    buf: Vec<u8>,
    /// Bytes at the front of `buf` already handed out (compacted lazily, so many small
    /// frames in one read cost linear time).
    start: usize,
}

impl FrameDecoder {
    /// A decoder for payloads of 1..=`max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            buf: Vec::new(),
            start: 0,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    fn pending(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    /// The next whole payload, if one is buffered.
    ///
    /// # Errors
    /// A zero or over-long length (the stream is unusable after it).
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        let Some(header) = self.pending().first_chunk::<LENGTH_PREFIX_BYTES>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*header) as usize;
        if len == 0 {
            return Err(FrameError::ZeroLength);
        }
        if len > self.max {
            return Err(FrameError::TooLong {
                len: len as u64,
                max: self.max,
            });
        }
        let pending = self.pending();
        if pending.len() < LENGTH_PREFIX_BYTES + len {
            return Ok(None);
        }
        let payload = pending[LENGTH_PREFIX_BYTES..LENGTH_PREFIX_BYTES + len].to_vec();
        self.start += LENGTH_PREFIX_BYTES + len;
        Ok(Some(payload))
    }

    /// The stream ended: fine between frames, an error inside one.
    ///
    /// # Errors
    /// [`FrameError::TruncatedHeader`], [`FrameError::TruncatedBody`].
    pub fn finish(&self) -> Result<(), FrameError> {
        let pending = self.pending();
        match pending.len() {
            0 => Ok(()),
            got if got < LENGTH_PREFIX_BYTES => Err(FrameError::TruncatedHeader { got }),
            got => {
                let mut header = [0u8; LENGTH_PREFIX_BYTES];
                header.copy_from_slice(&pending[..LENGTH_PREFIX_BYTES]);
                Err(FrameError::TruncatedBody {
                    expected: u32::from_be_bytes(header) as usize,
                    got: got - LENGTH_PREFIX_BYTES,
                })
            }
        }
    }
}
