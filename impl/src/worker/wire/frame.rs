//! Framing ("Transport and bounds"): four unsigned big-endian bytes giving the payload
//! length, 1..=[`FRAME_MAX_BYTES`], then the payload. [`FrameDecoder`] is the pure
//! incremental decoder (bytes in any chunking, whole payloads out); after an error it
//! stays failed: "Never attempt to resume a new frame after a partial payload".

use super::limits::{FRAME_MAX_BYTES, FRAME_MIN_BYTES, LENGTH_PREFIX_BYTES};

/// A framing error, with a stable [`code`](Self::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length prefix is 0.
    #[error("a frame of length 0 (the payload is 1..{FRAME_MAX_BYTES} bytes)")]
    Empty,
    /// The length prefix is over the bound.
    #[error("a frame of {0} bytes exceeds {FRAME_MAX_BYTES}")]
    TooLarge(usize),
    /// The stream ended inside a frame (`have` of `need` bytes of it read).
    #[error("the stream ended inside a frame ({have} of {need} bytes)")]
    Truncated {
        /// Bytes of the frame (prefix included) that arrived.
        have: usize,
        /// Bytes the frame needed.
        need: usize,
    },
}

impl FrameError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::Empty => "frame_empty",
            FrameError::TooLarge(_) => "frame_too_large",
            FrameError::Truncated { .. } => "frame_truncated",
        }
    }
}

/// Prefixes `payload` with its length.
///
/// # Errors
/// [`FrameError::Empty`] or [`FrameError::TooLarge`].
pub fn encode_frame(payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    if payload.len() < FRAME_MIN_BYTES {
        return Err(FrameError::Empty);
    }
    if payload.len() > FRAME_MAX_BYTES {
        return Err(FrameError::TooLarge(payload.len()));
    }
    let mut out = Vec::with_capacity(LENGTH_PREFIX_BYTES + payload.len());
    // The bound is far below u32::MAX.
    out.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(payload);
    Ok(out)
}

/// Incremental frame decoder.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `bytes`; returns every payload completed by them.
    ///
    /// # Errors
    /// The first framing error; every later call returns it again.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            if self.buf.len() < LENGTH_PREFIX_BYTES {
                return Ok(out);
            }
            let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
            prefix.copy_from_slice(&self.buf[..LENGTH_PREFIX_BYTES]);
            let len = u32::from_be_bytes(prefix) as usize;
            if len == 0 {
                return Err(self.fail(FrameError::Empty));
            }
            if len > FRAME_MAX_BYTES {
                return Err(self.fail(FrameError::TooLarge(len)));
            }
            if self.buf.len() < LENGTH_PREFIX_BYTES + len {
                return Ok(out);
            }
            let rest = self.buf.split_off(LENGTH_PREFIX_BYTES + len);
            let frame = std::mem::replace(&mut self.buf, rest);
            out.push(frame[LENGTH_PREFIX_BYTES..].to_vec());
        }
    }

    /// The stream ended: an error when a frame was cut short.
    ///
    /// # Errors
    /// [`FrameError::Truncated`] (or the earlier error).
    pub fn finish(&mut self) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        let need = if self.buf.len() >= LENGTH_PREFIX_BYTES {
            let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
            prefix.copy_from_slice(&self.buf[..LENGTH_PREFIX_BYTES]);
            LENGTH_PREFIX_BYTES + u32::from_be_bytes(prefix) as usize
        } else {
            LENGTH_PREFIX_BYTES
        };
        let have = self.buf.len();
        Err(self.fail(FrameError::Truncated { have, need }))
    }

    fn fail(&mut self, e: FrameError) -> FrameError {
        self.failed = Some(e.clone());
        self.buf.clear();
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_split_at_every_byte_comes_out_whole() {
        let payload = br#"{"version":1}"#;
        let framed = encode_frame(payload).unwrap();
        for cut in 0..=framed.len() {
            let mut d = FrameDecoder::new();
            let mut got = d.push(&framed[..cut]).unwrap();
            got.extend(d.push(&framed[cut..]).unwrap());
            assert_eq!(got, vec![payload.to_vec()], "cut at {cut}");
            d.finish().unwrap();
        }
        // Byte by byte, two frames back to back.
        let mut d = FrameDecoder::new();
        let mut got = Vec::new();
        for b in framed.iter().chain(&framed) {
            got.extend(d.push(&[*b]).unwrap());
        }
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn lengths_at_and_past_the_bounds() {
        assert_eq!(encode_frame(b""), Err(FrameError::Empty));
        assert!(encode_frame(&vec![b'x'; FRAME_MAX_BYTES]).is_ok());
        assert_eq!(
            encode_frame(&vec![b'x'; FRAME_MAX_BYTES + 1]),
            Err(FrameError::TooLarge(FRAME_MAX_BYTES + 1))
        );
        let mut d = FrameDecoder::new();
        assert_eq!(d.push(&[0, 0, 0, 0]), Err(FrameError::Empty));
        // Failed for good: no resumption after a bad frame.
        assert_eq!(d.push(&[0, 0, 0, 1, b'x']), Err(FrameError::Empty));
        let mut d = FrameDecoder::new();
        let over = u32::try_from(FRAME_MAX_BYTES + 1).unwrap().to_be_bytes();
        assert_eq!(
            d.push(&over),
            Err(FrameError::TooLarge(FRAME_MAX_BYTES + 1))
        );
    }

    #[test]
    fn a_frame_cut_short_at_eof_is_truncated() {
        let mut d = FrameDecoder::new();
        d.push(&[0, 0, 0, 5, b'a']).unwrap();
        assert_eq!(d.finish(), Err(FrameError::Truncated { have: 5, need: 9 }));
        let mut d = FrameDecoder::new();
        d.push(&[0, 0]).unwrap();
        assert_eq!(d.finish().unwrap_err().code(), "frame_truncated");
    }
}
