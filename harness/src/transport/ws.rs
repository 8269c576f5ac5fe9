//! One WebSocket connection the harness holds with the target.
//!
//! A [`WsConnection`] owns an upgraded (or, later, client-side) WebSocket. A reader task
//! polls the socket continuously (so pings are answered and close replies go out even
//! while the driver is busy or writing) and turns what the peer sends into [`WsEvent`]s
//! on a bounded queue ([`WS_EVENT_QUEUE_CAPACITY`]); the
//! driver reads them with [`WsConnection::recv`] and writes with the `send_*` methods.
//!
//! Every bound is explicit and given by the family ([`WsLimits`]): incoming messages and
//! frames are limited to [`WsLimits::max_message_bytes`], and the write buffer is bounded (tungstenite's default
//! is unbounded).
//!
//! This module never interprets message contents and never panics on peer input.

use std::time::Duration;

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};

use super::{TransportError, WS_EVENT_QUEUE_CAPACITY};

/// Byte stream a WebSocket can run over (an upgraded HTTP connection, a TCP stream, …).
pub trait WsIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> WsIo for T {}

/// The boxed byte stream under every [`WsConnection`].
pub type BoxedIo = Box<dyn WsIo>;

/// The size bounds of one WebSocket connection, given by the family whose wire it carries
/// (this module knows no family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WsLimits {
    /// Largest incoming message and frame (bytes); a larger one is
    /// [`WsEvent::Error`] `message_too_large`.
    pub max_message_bytes: usize,
    /// Largest message the harness itself will send (bytes); usually above the
    /// protocol's bound, so a scenario can send an oversized message on purpose.
    pub max_outgoing_bytes: usize,
}

/// Bounds for the transport's own unit tests (1 MiB in, 2 MiB out).
#[cfg(test)]
pub(crate) const TEST_LIMITS: WsLimits = WsLimits {
    max_message_bytes: 1024 * 1024,
    max_outgoing_bytes: 2 * 1024 * 1024,
};

impl WsLimits {
    /// The tungstenite configuration: incoming messages and frames at most
    /// [`WsLimits::max_message_bytes`]; write buffer flushed at 128 KiB and bounded to
    /// one outgoing and one incoming maximum beyond that, so a stalled peer turns into
    /// back-pressure and then an error rather than unbounded memory.
    pub fn config(&self) -> WebSocketConfig {
        WebSocketConfig::default()
            .read_buffer_size(128 * 1024)
            .write_buffer_size(128 * 1024)
            .max_write_buffer_size(128 * 1024 + self.max_outgoing_bytes + self.max_message_bytes)
            .max_message_size(Some(self.max_message_bytes))
            .max_frame_size(Some(self.max_message_bytes))
    }
}

/// Something the peer did on the connection, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WsEvent {
    /// A text message (valid UTF-8, at most [`WsLimits::max_message_bytes`]).
    Text(String),
    /// A binary message.
    Binary(Vec<u8>),
    /// A Close frame. `code` is `None` when the frame carried no status.
    Close {
        /// Close status code.
        code: Option<u16>,
        /// Close reason (empty when none).
        reason: String,
    },
    /// The connection ended without a Close frame (TCP closed or reset).
    Eof,
    /// The peer violated the WebSocket protocol or a bound; the connection is unusable.
    Error {
        /// Stable code: `message_too_large`, `invalid_utf8`, `websocket_protocol_error`,
        /// `io_error`, `websocket_error`.
        code: &'static str,
        /// Human-readable detail.
        detail: String,
    },
}

impl WsEvent {
    /// A short description for failure messages (text is truncated to 200 characters).
    pub fn describe(&self) -> String {
        match self {
            WsEvent::Text(text) => format!("text frame {}", truncate(text, 200)),
            WsEvent::Binary(bytes) => format!("binary message of {} bytes", bytes.len()),
            WsEvent::Close { code, reason } => match code {
                Some(code) => format!("close {code} {reason:?}"),
                None => "close without status".to_string(),
            },
            WsEvent::Eof => "connection dropped without a close frame".to_string(),
            WsEvent::Error { code, detail } => format!("WebSocket error {code}: {detail}"),
        }
    }
}

/// Truncates `text` to at most `max` characters, marking the cut with `…`.
pub fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// One live WebSocket connection. Dropping it drops the TCP connection abruptly (no
/// Close frame), exactly like [`WsConnection::abort`].
pub struct WsConnection {
    sink: SplitSink<WebSocketStream<BoxedIo>, Message>,
    events: mpsc::Receiver<WsEvent>,
    reader: JoinHandle<()>,
    max_outgoing_bytes: usize,
}

impl std::fmt::Debug for WsConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsConnection").finish_non_exhaustive()
    }
}

impl WsConnection {
    /// Takes over an established WebSocket (configured with `limits.config()`) and
    /// starts its reader task.
    pub fn new(stream: WebSocketStream<BoxedIo>, limits: WsLimits) -> Self {
        let (sink, stream) = stream.split();
        let (tx, events) = mpsc::channel(WS_EVENT_QUEUE_CAPACITY);
        let reader = tokio::spawn(read_loop(stream, tx));
        Self {
            sink,
            events,
            reader,
            max_outgoing_bytes: limits.max_outgoing_bytes,
        }
    }

    /// The next event, waiting as long as it takes (wrap it in a timeout). `None` once the
    /// connection has ended and every event was consumed. Cancel-safe.
    pub async fn recv(&mut self) -> Option<WsEvent> {
        self.events.recv().await
    }

    /// Sends one text message and flushes it, within `timeout`.
    ///
    /// # Errors
    /// [`TransportError::OutgoingTooLarge`], [`TransportError::Send`],
    /// [`TransportError::Timeout`].
    pub async fn send_text(
        &mut self,
        text: String,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        self.send(Message::text(text), timeout).await
    }

    /// Sends one binary message and flushes it, within `timeout`.
    ///
    /// # Errors
    /// As [`WsConnection::send_text`].
    pub async fn send_binary(
        &mut self,
        bytes: Vec<u8>,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        self.send(Message::binary(bytes), timeout).await
    }

    /// Sends one text message whose payload is `bytes` as they are (not necessarily
    /// UTF-8: a raw frame, for testing the peer's UTF-8 check) and flushes it.
    ///
    /// # Errors
    /// As [`WsConnection::send_text`].
    pub async fn send_text_bytes(
        &mut self,
        bytes: Vec<u8>,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        let frame = tungstenite::protocol::frame::Frame::message(
            bytes,
            tungstenite::protocol::frame::coding::OpCode::Data(
                tungstenite::protocol::frame::coding::Data::Text,
            ),
            true,
        );
        self.send(Message::Frame(frame), timeout).await
    }

    /// Sends a Close frame with `code` and `reason` (the closing handshake's first half).
    /// The peer's reply arrives later as [`WsEvent::Close`].
    ///
    /// # Errors
    /// [`TransportError::Send`] (also when `reason` exceeds the 123 bytes a Close frame
    /// can carry), [`TransportError::Timeout`].
    pub async fn send_close(
        &mut self,
        code: u16,
        reason: &str,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        if reason.len() > 123 {
            return Err(TransportError::Send(format!(
                "close reason of {} bytes exceeds the 123 bytes a Close frame carries",
                reason.len()
            )));
        }
        let frame = CloseFrame {
            code: CloseCode::from(code),
            reason: reason.into(),
        };
        self.send(Message::Close(Some(frame)), timeout).await
    }

    /// Ends the connection after a completed or begun closing handshake: keeps polling
    /// (discarding events) so that a pending Close reply is flushed, until the peer
    /// closes or `timeout` elapses, then drops the TCP connection.
    pub async fn finish(mut self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, async {
            while self.events.recv().await.is_some() {}
        })
        .await;
    }

    /// Drops the connection abruptly: no Close frame, the TCP connection is closed.
    pub fn abort(self) {
        drop(self);
    }

    async fn send(&mut self, message: Message, timeout: Duration) -> Result<(), TransportError> {
        let size = message.len();
        if size > self.max_outgoing_bytes {
            return Err(TransportError::OutgoingTooLarge {
                size,
                limit: self.max_outgoing_bytes,
            });
        }
        match tokio::time::timeout(timeout, self.sink.send(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(TransportError::Send(e.to_string())),
            Err(_) => Err(TransportError::Timeout(timeout)),
        }
    }
}

impl Drop for WsConnection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Polls the socket until it ends, forwarding events; stops reading while the queue is
/// full (back-pressure) and when the driver is gone.
async fn read_loop(mut stream: SplitStream<WebSocketStream<BoxedIo>>, tx: mpsc::Sender<WsEvent>) {
    let mut closed = false;
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(Message::Text(text)) => WsEvent::Text(text.as_str().to_string()),
            Ok(Message::Binary(bytes)) => WsEvent::Binary(bytes.to_vec()),
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => continue,
            Ok(Message::Close(frame)) => {
                closed = true;
                match frame {
                    Some(frame) => WsEvent::Close {
                        code: Some(u16::from(frame.code)),
                        reason: frame.reason.as_str().to_string(),
                    },
                    None => WsEvent::Close {
                        code: None,
                        reason: String::new(),
                    },
                }
            }
            Err(error) => {
                if let Some(event) = classify_error(error, closed) {
                    let _ = tx.send(event).await;
                }
                return;
            }
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
    if !closed {
        let _ = tx.send(WsEvent::Eof).await;
    }
}

/// Maps a read error to the event the driver sees (`None`: a normal end after a close).
fn classify_error(error: tungstenite::Error, closed: bool) -> Option<WsEvent> {
    use tungstenite::Error as E;
    use tungstenite::error::ProtocolError as P;
    match error {
        E::ConnectionClosed | E::AlreadyClosed => (!closed).then_some(WsEvent::Eof),
        E::Protocol(P::ResetWithoutClosingHandshake) => (!closed).then_some(WsEvent::Eof),
        E::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionAborted
            ) =>
        {
            (!closed).then_some(WsEvent::Eof)
        }
        E::Io(e) => Some(WsEvent::Error {
            code: "io_error",
            detail: e.to_string(),
        }),
        E::Capacity(e) => Some(WsEvent::Error {
            code: "message_too_large",
            detail: e.to_string(),
        }),
        E::Utf8(detail) => Some(WsEvent::Error {
            code: "invalid_utf8",
            detail,
        }),
        E::Protocol(e) => Some(WsEvent::Error {
            code: "websocket_protocol_error",
            detail: e.to_string(),
        }),
        other => Some(WsEvent::Error {
            code: "websocket_error",
            detail: other.to_string(),
        }),
    }
}
