//! Framing ("Transport and bounds"): four unsigned big-endian bytes giving the payload
//! length, 1..=[`FRAME_MAX_BYTES`], then the payload; the shared
//! [`crate::wire::framing`] codec at this protocol's bound. After a framing error the
//! caller invalidates the connection: "Never attempt to resume a new frame after a
//! partial payload".

pub use crate::wire::framing::{FrameDecoder, FrameError};

use super::limits::FRAME_MAX_BYTES;

/// Prefixes `payload` with its length.
///
/// # Errors
/// [`FrameError::ZeroLength`] or [`FrameError::TooLong`] (over [`FRAME_MAX_BYTES`]).
pub fn encode_frame(payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    crate::wire::framing::encode_frame(payload, FRAME_MAX_BYTES)
}

/// A decoder at this protocol's bound.
pub fn decoder() -> FrameDecoder {
    FrameDecoder::new(FRAME_MAX_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(d: &mut FrameDecoder) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut out = Vec::new();
        while let Some(p) = d.next_frame()? {
            out.push(p);
        }
        Ok(out)
    }

    #[test]
    fn a_payload_split_at_every_byte_comes_out_whole() {
        let payload = br#"{"version":1}"#;
        let framed = encode_frame(payload).unwrap();
        for cut in 0..=framed.len() {
            let mut d = decoder();
            d.push(&framed[..cut]);
            let mut got = drain(&mut d).unwrap();
            d.push(&framed[cut..]);
            got.extend(drain(&mut d).unwrap());
            assert_eq!(got, vec![payload.to_vec()], "cut at {cut}");
            d.finish().unwrap();
        }
    }

    #[test]
    fn lengths_at_and_past_the_bound() {
        assert_eq!(encode_frame(b""), Err(FrameError::ZeroLength));
        assert!(encode_frame(&vec![b'x'; FRAME_MAX_BYTES]).is_ok());
        assert!(encode_frame(&vec![b'x'; FRAME_MAX_BYTES + 1]).is_err());
        let mut d = decoder();
        d.push(&u32::try_from(FRAME_MAX_BYTES + 1).unwrap().to_be_bytes());
        assert_eq!(drain(&mut d).unwrap_err().code(), "frame_too_long");
        let mut d = decoder();
        d.push(&[0, 0, 0, 5, b'a']);
        assert_eq!(d.finish().unwrap_err().code(), "truncated_body");
    }
}
