//! The bounded outbound queue of one connection.
//!
//! Every frame the Runtime sends goes through one bounded queue drained by the
//! connection's writer task, so frames leave in the order they were queued. A sender
//! that must know the write completed ("Runtime transport `Send` returns nil: the
//! WebSocket write completed locally", "What each acknowledgement proves") uses
//! [`Outbound::send_confirmed`].

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::core_runtime::wire::{Frame, Message};

/// Capacity of a connection's outbound queue, in frames. A full queue applies
/// backpressure to the producers; nothing is dropped.
pub const OUTBOUND_QUEUE: usize = 1024;

/// One item for the writer task.
#[derive(Debug)]
pub enum OutItem {
    /// A text frame; the optional sender is completed once the write finished.
    Text(String, Option<oneshot::Sender<()>>),
    /// Send a WebSocket Close frame with this code and reason, then stop writing.
    Close(u16, String),
}

/// A cloneable handle on one connection's outbound queue.
#[derive(Debug, Clone)]
pub struct Outbound(mpsc::Sender<OutItem>);

impl Outbound {
    /// A new queue: the handle and the writer's receiving end.
    pub fn channel() -> (Self, mpsc::Receiver<OutItem>) {
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        (Self(tx), rx)
    }

    fn encode(frame: &Frame) -> Option<String> {
        match frame.encode() {
            Ok(text) => Some(text),
            Err(err) => {
                tracing::error!(
                    code = err.code(),
                    "refusing to send an unencodable frame: {err}"
                );
                None
            }
        }
    }

    /// Queues `message` with `Envelope.id` = `id`. Returns `false` when the connection
    /// is gone (the frame dies with it).
    pub async fn send(&self, id: impl Into<String>, message: Message) -> bool {
        let frame = Frame::new(id, message);
        match Self::encode(&frame) {
            Some(text) => self.0.send(OutItem::Text(text, None)).await.is_ok(),
            None => false,
        }
    }

    /// Queues `message` and waits until the writer completed the WebSocket write,
    /// within `budget` (queueing included). Returns `false` on timeout or loss.
    pub async fn send_confirmed(
        &self,
        id: impl Into<String>,
        message: Message,
        budget: Duration,
    ) -> bool {
        let frame = Frame::new(id, message);
        let Some(text) = Self::encode(&frame) else {
            return false;
        };
        let (done_tx, done_rx) = oneshot::channel();
        let attempt = async {
            self.0.send(OutItem::Text(text, Some(done_tx))).await.ok()?;
            done_rx.await.ok()
        };
        matches!(tokio::time::timeout(budget, attempt).await, Ok(Some(())))
    }

    /// Queues a WebSocket Close frame.
    pub async fn close(&self, code: u16, reason: impl Into<String>) {
        let _ = self.0.send(OutItem::Close(code, reason.into())).await;
    }

    /// Whether the writer is gone.
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}
