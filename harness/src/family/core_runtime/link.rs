//! The WebSocket link both sides of this family hold: the one connection the steps use,
//! mapped onto the engine's events and results. (Side `core` also keeps superseded
//! connections; side `runtime` drops them.)

use std::time::Duration;

use async_trait::async_trait;

use crate::drive::{Connection, Event, Outgoing, StepResult, fail};
use crate::transport::ws::{WsConnection, WsEvent};

/// The current WebSocket connection, if any.
#[derive(Default)]
pub struct Link {
    ws: Option<WsConnection>,
}

/// What [`Link::next`] saw.
pub enum Seen<O> {
    /// An event (a connection's end is reported once, as [`Event::Eof`]; the link is then
    /// closed).
    Event(Event<O>),
    /// The connection's events ran out without an end event (after a Close or a
    /// transport error); the link is now closed.
    Ended,
}

/// A WebSocket event as the engine's event.
fn engine_event<O>(event: WsEvent) -> Event<O> {
    match event {
        WsEvent::Text(text) => Event::Text(text),
        WsEvent::Binary(bytes) => Event::Binary(bytes),
        WsEvent::Close { code, reason } => Event::Close { code, reason },
        WsEvent::Eof => Event::Eof,
        WsEvent::Error { code, detail } => Event::Error { code, detail },
    }
}

impl Link {
    /// Makes `conn` the connection the steps use; the previous one, if any.
    pub fn replace(&mut self, conn: WsConnection) -> Option<WsConnection> {
        self.ws.replace(conn)
    }

    /// The next event; pending forever while no connection is open (cancel-safe).
    pub async fn next<O>(&mut self) -> Seen<O> {
        let Some(conn) = self.ws.as_mut() else {
            return std::future::pending().await;
        };
        match conn.recv().await {
            Some(WsEvent::Eof) => {
                self.ws = None;
                Seen::Event(Event::Eof)
            }
            Some(event) => Seen::Event(engine_event(event)),
            None => {
                self.ws = None;
                Seen::Ended
            }
        }
    }

    fn open(&mut self) -> StepResult<&mut WsConnection> {
        self.ws.as_mut().ok_or_else(|| {
            fail::not_connected(
                "there is no WebSocket connection (no `connect`/`handshake` step before, or it ended)",
            )
        })
    }
}

#[async_trait]
impl Connection for Link {
    fn is_open(&self) -> bool {
        self.ws.is_some()
    }

    fn abort(&mut self) -> bool {
        self.ws.take().map(WsConnection::abort).is_some()
    }

    async fn send(&mut self, message: Outgoing, timeout: Duration) -> StepResult {
        let conn = self.open()?;
        let sent = match message {
            Outgoing::Text(text) => conn.send_text(text, timeout).await,
            Outgoing::Binary(bytes) => conn.send_binary(bytes, timeout).await,
            Outgoing::TextBytes(bytes) => conn.send_text_bytes(bytes, timeout).await,
        };
        sent.map_err(|e| fail::transport(e.to_string()))
    }

    async fn send_close(&mut self, code: u16, reason: &str, timeout: Duration) -> StepResult {
        self.open()?
            .send_close(code, reason, timeout)
            .await
            .map_err(|e| fail::transport(e.to_string()))
    }

    /// Flushes the Close reply and drops the connection (at most `timeout`).
    async fn end(&mut self, timeout: Duration) {
        if let Some(conn) = self.ws.take() {
            conn.finish(timeout).await;
        }
    }
}
