//! The framed transport: payloads behind a 4-byte big-endian length over a Unix stream
//! socket (for any family whose frames are length-prefixed; the relay's own link).
//!
//! [`FrameDecoder`] is the pure codec: bytes in, whole payloads out, every malformed
//! length a typed [`FrameError`]. [`FramedConnection`] runs it on a socket: a reader task
//! forwards each payload to a bounded queue (when it is full the task stops reading:
//! back-pressure on the peer, never loss), and the writer sends whole frames or, for
//! malformed input on purpose, raw bytes. The maximum payload length is the family's
//! (this module knows no family). A zero length is an error: every payload a framed
//! protocol carries is at least one byte.

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::TransportError;

pub use contract_impl::wire::framing::{
    FrameDecoder, FrameError, LENGTH_PREFIX_BYTES, encode_frame,
};

/// `payload` behind its 4-byte big-endian length, **without** the bound checks of
/// `contract_impl::wire::framing::encode_frame`: for a peer that sends malformed frames
/// on purpose (an empty one, one past the maximum). The harness's own, so that a mutation
/// of the implementation never changes what the checker sends. A payload longer than
/// `u32::MAX` gets the prefix `u32::MAX`.
pub fn encode_frame_unbounded(payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut out =
        Vec::with_capacity(contract_impl::wire::framing::LENGTH_PREFIX_BYTES + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Capacity of a framed connection's event queue (payloads not read yet).
pub const FRAMED_EVENT_QUEUE_CAPACITY: usize = 32;

/// Bytes read from the socket at a time.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Something the peer did on a framed connection, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FramedEvent {
    /// One whole payload.
    Frame(Vec<u8>),
    /// The peer closed its write side between frames.
    Eof,
    /// The stream is unusable: a malformed frame, or a read error (`io_error`).
    Error {
        /// [`FrameError::code`] or `io_error`.
        code: &'static str,
        /// Detail for people.
        detail: String,
    },
}

/// One framed connection over a Unix stream socket. Dropping it closes the socket.
#[derive(Debug)]
pub struct FramedConnection {
    writer: Option<OwnedWriteHalf>,
    events: mpsc::Receiver<FramedEvent>,
    reader: JoinHandle<()>,
    max: usize,
}

impl FramedConnection {
    /// Takes over a connected stream; payloads are 1..=`max` bytes both ways.
    pub fn new(stream: UnixStream, max: usize) -> Self {
        let (read, write) = stream.into_split();
        let (tx, events) = mpsc::channel(FRAMED_EVENT_QUEUE_CAPACITY);
        let reader = tokio::spawn(read_loop(read, tx, max));
        Self {
            writer: Some(write),
            events,
            reader,
            max,
        }
    }

    /// Connects to the Unix socket at `path`.
    ///
    /// # Errors
    /// [`TransportError::Client`] when the connection is refused or the path is bad.
    pub async fn connect(path: &Path, max: usize) -> Result<Self, TransportError> {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| TransportError::Client(format!("{}: {e}", path.display())))?;
        Ok(Self::new(stream, max))
    }

    /// The next event; `None` once every event was consumed after the end. Cancel-safe.
    pub async fn recv(&mut self) -> Option<FramedEvent> {
        self.events.recv().await
    }

    /// Sends one frame (`payload` behind its length) within `timeout`.
    ///
    /// # Errors
    /// [`TransportError::OutgoingTooLarge`] beyond the maximum (use
    /// [`FramedConnection::send_raw`] for that on purpose), [`TransportError::Send`],
    /// [`TransportError::Timeout`].
    pub async fn send(&mut self, payload: &[u8], timeout: Duration) -> Result<(), TransportError> {
        let frame = encode_frame(payload, self.max).map_err(|e| match e {
            FrameError::TooLong { .. } => TransportError::OutgoingTooLarge {
                size: payload.len(),
                limit: self.max,
            },
            other => TransportError::Send(other.to_string()),
        })?;
        self.send_raw(&frame, timeout).await
    }

    /// Writes `bytes` as they are (a malformed length, a frame cut short) within
    /// `timeout`.
    ///
    /// # Errors
    /// [`TransportError::Send`] (also after [`FramedConnection::close_write`]),
    /// [`TransportError::Timeout`].
    pub async fn send_raw(
        &mut self,
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<(), TransportError> {
        let writer = self
            .writer
            .as_mut()
            .ok_or_else(|| TransportError::Send("the write side is closed".into()))?;
        match tokio::time::timeout(timeout, writer.write_all(bytes)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(TransportError::Send(e.to_string())),
            Err(_) => Err(TransportError::Timeout(timeout)),
        }
    }

    /// Closes the write side (the peer reads the end of the stream); reading goes on.
    pub async fn close_write(&mut self) {
        if let Some(mut writer) = self.writer.take() {
            let _ = writer.shutdown().await;
        }
    }
}

impl Drop for FramedConnection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

async fn read_loop(
    mut read: tokio::net::unix::OwnedReadHalf,
    tx: mpsc::Sender<FramedEvent>,
    max: usize,
) {
    let mut decoder = FrameDecoder::new(max);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
        loop {
            match decoder.next_frame() {
                Ok(Some(payload)) => {
                    // A full queue stops the reading: back-pressure on the peer.
                    if tx.send(FramedEvent::Frame(payload)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = tx
                        .send(FramedEvent::Error {
                            code: e.code(),
                            detail: e.to_string(),
                        })
                        .await;
                    return;
                }
            }
        }
        let event = match read.read(&mut chunk).await {
            Ok(0) => match decoder.finish() {
                Ok(()) => FramedEvent::Eof,
                Err(e) => FramedEvent::Error {
                    code: e.code(),
                    detail: e.to_string(),
                },
            },
            Ok(n) => {
                decoder.push(&chunk[..n]);
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => FramedEvent::Eof,
            Err(e) => FramedEvent::Error {
                code: "io_error",
                detail: e.to_string(),
            },
        };
        let _ = tx.send(event).await;
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(decoder: &mut FrameDecoder) -> Result<Vec<Vec<u8>>, FrameError> {
        let mut out = Vec::new();
        while let Some(frame) = decoder.next_frame()? {
            out.push(frame);
        }
        Ok(out)
    }

    #[test]
    fn a_body_split_at_every_byte_boundary_decodes_the_same() {
        let mut stream = encode_frame(b"{\"a\":1}", 64).unwrap();
        stream.extend(encode_frame(b"x", 64).unwrap());
        stream.extend(encode_frame(&[7u8; 64], 64).unwrap());
        let want = vec![b"{\"a\":1}".to_vec(), b"x".to_vec(), vec![7u8; 64]];
        for cut in 0..=stream.len() {
            let mut decoder = FrameDecoder::new(64);
            decoder.push(&stream[..cut]);
            let mut got = frames(&mut decoder).unwrap();
            decoder.push(&stream[cut..]);
            got.extend(frames(&mut decoder).unwrap());
            assert_eq!(got, want, "split at {cut}");
            decoder.finish().unwrap();
        }
        // One byte at a time.
        let mut decoder = FrameDecoder::new(64);
        let mut got = Vec::new();
        for byte in &stream {
            decoder.push(std::slice::from_ref(byte));
            got.extend(frames(&mut decoder).unwrap());
        }
        assert_eq!(got, want);
    }

    #[test]
    fn lengths_at_and_past_the_maximum() {
        let mut decoder = FrameDecoder::new(8);
        decoder.push(&encode_frame(&[1u8; 8], 8).unwrap());
        assert_eq!(frames(&mut decoder).unwrap(), vec![vec![1u8; 8]]);
        let mut decoder = FrameDecoder::new(8);
        decoder.push(&9u32.to_be_bytes());
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::TooLong { len: 9, max: 8 })
        );
        assert_eq!(
            encode_frame(&[0u8; 9], 8),
            Err(FrameError::TooLong { len: 9, max: 8 })
        );
        let mut decoder = FrameDecoder::new(8);
        decoder.push(&u32::MAX.to_be_bytes());
        assert_eq!(decoder.next_frame().unwrap_err().code(), "frame_too_long");
    }

    #[test]
    fn a_zero_length_is_an_error() {
        let mut decoder = FrameDecoder::new(8);
        decoder.push(&[0, 0, 0, 0, 1]);
        assert_eq!(decoder.next_frame(), Err(FrameError::ZeroLength));
        assert_eq!(encode_frame(b"", 8), Err(FrameError::ZeroLength));
    }

    #[test]
    fn truncation_at_eof_is_typed() {
        let mut decoder = FrameDecoder::new(8);
        decoder.finish().unwrap();
        decoder.push(&[0, 0]);
        assert_eq!(
            decoder.finish(),
            Err(FrameError::TruncatedHeader { got: 2 })
        );
        decoder.push(&[0, 5, 1, 2]);
        assert_eq!(decoder.next_frame(), Ok(None));
        assert_eq!(
            decoder.finish(),
            Err(FrameError::TruncatedBody {
                expected: 5,
                got: 2
            })
        );
        assert_eq!(decoder.finish().unwrap_err().code(), "truncated_body");
    }

    #[tokio::test]
    async fn frames_cross_a_socket_both_ways_and_end_typed() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut ours = FramedConnection::new(a, 16);
        let mut theirs = FramedConnection::new(b, 16);
        let t = Duration::from_secs(5);
        ours.send(b"hello", t).await.unwrap();
        assert_eq!(
            theirs.recv().await,
            Some(FramedEvent::Frame(b"hello".to_vec()))
        );
        theirs.send(b"back", t).await.unwrap();
        assert_eq!(
            ours.recv().await,
            Some(FramedEvent::Frame(b"back".to_vec()))
        );
        assert!(matches!(
            ours.send(&[0u8; 17], t).await,
            Err(TransportError::OutgoingTooLarge {
                size: 17,
                limit: 16
            })
        ));
        // A frame cut short, then the end of the stream.
        ours.send_raw(&[0, 0, 0, 9, b'x'], t).await.unwrap();
        ours.close_write().await;
        match theirs.recv().await {
            Some(FramedEvent::Error { code, .. }) => assert_eq!(code, "truncated_body"),
            other => panic!("{other:?}"),
        }
        assert_eq!(theirs.recv().await, None);
        // A clean end between frames.
        theirs.close_write().await;
        assert_eq!(ours.recv().await, Some(FramedEvent::Eof));
    }

    #[tokio::test]
    async fn an_over_long_length_on_the_socket_is_reported_before_its_body() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut ours = FramedConnection::new(a, 16);
        let mut theirs = FramedConnection::new(b, 16);
        let t = Duration::from_secs(5);
        ours.send_raw(&1_000_000u32.to_be_bytes(), t).await.unwrap();
        match theirs.recv().await {
            Some(FramedEvent::Error { code, detail }) => {
                assert_eq!(code, "frame_too_long");
                assert!(detail.contains("1000000"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
    }
}
