//! The bounded outbound queue of one connection.
//!
//! Every frame the Runtime sends goes through one queue drained by the connection's
//! writer task, so frames leave in the order they were queued. A sender that must know
//! the write completed ("Runtime transport `Send` returns nil: the WebSocket write
//! completed locally", "What each acknowledgement proves") uses
//! [`Outbound::send_confirmed_then`].
//!
//! # Bound
//! The queue is bounded in **bytes**: every queued item is charged its encoded length
//! plus [`OUTBOUND_ITEM_OVERHEAD_BYTES`] against a budget of [`OUTBOUND_QUEUE_BYTES`],
//! and the charge is released once the writer has written (or discarded) the item. The
//! per-item overhead also bounds the number of queued items
//! ([`OUTBOUND_QUEUE_ITEMS_MAX`]). A frame larger than the whole budget is charged the
//! whole budget: it waits for an empty queue and then travels alone.
//!
//! Two ways in:
//! * [`Outbound::send`], [`Outbound::send_confirmed_then`] and [`Outbound::reserve`]
//!   **wait** (in FIFO order) until the budget has room. They must never be awaited
//!   while the daemon's state lock is held: a full queue would then wedge every task
//!   that needs the lock (dispatch, heartbeats, cleanup).
//! * [`Outbound::send_now`], [`Reservation::send`] and [`Outbound::close`] **never
//!   wait**. They are for callers holding the state lock, whose frames must be queued
//!   in lock order (the statuses of one handle in revision order). When the budget has
//!   no room, `send_now` overdraws it: the overdraft is a debt that released bytes repay
//!   before any waiting sender gets room. Those frames are small and their producers
//!   are throttled (the receive loop waits for [`Outbound::room`] before dispatching
//!   each frame from Core), so the overdraft stays small.
//!
//! When the writer is gone (connection closed, write failed or stalled) every waiter
//! wakes up and every send returns `false`.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::core_runtime::wire::{Frame, Message};

/// Byte budget of a connection's outbound queue: 16 MiB, four maximal transport frames
/// (`TRANSPORT_FRAME_MAX_BYTES`) or about eleven maximal workspace read results. A full
/// queue applies backpressure to the producers; nothing is dropped.
pub const OUTBOUND_QUEUE_BYTES: usize = 16 * 1024 * 1024;

/// Fixed charge of every queued item on top of its encoded length: the queue node, the
/// item and its string header. Bounds the item count of a queue of tiny frames.
pub const OUTBOUND_ITEM_OVERHEAD_BYTES: usize = 256;

/// Most items the queue holds within its budget (without overdraft).
pub const OUTBOUND_QUEUE_ITEMS_MAX: usize = OUTBOUND_QUEUE_BYTES / OUTBOUND_ITEM_OVERHEAD_BYTES;

/// One item for the writer task.
#[derive(Debug)]
pub enum OutItem {
    /// A text frame; the optional sender is completed once the write finished.
    Text(String, Option<oneshot::Sender<()>>),
    /// Send a WebSocket Close frame with this code and reason, then stop writing.
    Close(u16, String),
}

/// An item as the writer receives it. Dropping it (after the write) releases its bytes.
#[derive(Debug)]
pub struct Queued {
    /// The item.
    pub item: OutItem,
    _charge: Charge,
}

/// The byte budget: a FIFO semaphore of byte permits plus the overdraft of
/// [`Outbound::send_now`].
///
/// Invariant: `available permits + outstanding charges − debt = capacity`, so the bytes
/// queued (the outstanding charges) never exceed `capacity + debt`.
#[derive(Debug)]
struct ByteBudget {
    capacity: usize,
    permits: Semaphore,
    debt: StdMutex<usize>,
}

impl ByteBudget {
    fn new(capacity: usize) -> Arc<Self> {
        // Permits are acquired in `u32` batches; a budget beyond that is never needed.
        let capacity = capacity.clamp(1, u32::MAX as usize);
        Arc::new(Self {
            capacity,
            permits: Semaphore::new(capacity),
            debt: StdMutex::new(0),
        })
    }

    /// The charge of `bytes`: at most the whole budget.
    fn clamp(&self, bytes: usize) -> u32 {
        // `capacity` fits in `u32` (see `new`).
        bytes.min(self.capacity) as u32
    }

    fn debt(&self) -> std::sync::MutexGuard<'_, usize> {
        self.debt
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits for room for `bytes`; `None` once the writer is gone.
    async fn acquire(self: &Arc<Self>, bytes: usize) -> Option<Charge> {
        let n = self.clamp(bytes);
        self.permits.acquire_many(n).await.ok()?.forget();
        Some(Charge {
            budget: self.clone(),
            bytes: n,
        })
    }

    /// Charges `bytes` without waiting, overdrawing the budget when it has no room.
    fn charge_now(self: &Arc<Self>, bytes: usize) -> Charge {
        let n = self.clamp(bytes);
        self.overdraw(n);
        Charge {
            budget: self.clone(),
            bytes: n,
        }
    }

    fn overdraw(&self, n: u32) {
        match self.permits.try_acquire_many(n) {
            Ok(permit) => permit.forget(),
            Err(_) => *self.debt() += n as usize,
        }
    }

    /// Returns `n` bytes: the debt first, the rest to the waiters.
    fn release(&self, n: u32) {
        let back = {
            let mut debt = self.debt();
            let repay = (*debt).min(n as usize);
            *debt -= repay;
            n as usize - repay
        };
        if back > 0 {
            self.permits.add_permits(back);
        }
    }
}

/// Bytes charged against the budget; released on drop.
#[derive(Debug)]
struct Charge {
    budget: Arc<ByteBudget>,
    bytes: u32,
}

impl Charge {
    /// Adjusts the charge to `bytes` without waiting (excess released, shortfall
    /// overdrawn).
    fn resize(&mut self, bytes: usize) {
        let n = self.budget.clamp(bytes);
        if n < self.bytes {
            self.budget.release(self.bytes - n);
        } else if n > self.bytes {
            self.budget.overdraw(n - self.bytes);
        }
        self.bytes = n;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// The writer's end of the queue. Dropping it (the writer ended) closes the budget:
/// every waiting sender wakes up and fails.
#[derive(Debug)]
pub struct OutboundReceiver {
    rx: mpsc::UnboundedReceiver<Queued>,
    budget: Arc<ByteBudget>,
}

impl OutboundReceiver {
    /// The next item; `None` when every [`Outbound`] handle is gone.
    pub async fn recv(&mut self) -> Option<Queued> {
        self.rx.recv().await
    }

    /// The next item if one is queued now.
    pub fn try_recv(&mut self) -> Option<Queued> {
        self.rx.try_recv().ok()
    }
}

impl Drop for OutboundReceiver {
    fn drop(&mut self) {
        self.budget.permits.close();
    }
}

/// Room for one frame, taken by [`Outbound::reserve`]: queueing it never waits.
#[derive(Debug)]
pub struct Reservation {
    tx: mpsc::UnboundedSender<Queued>,
    charge: Charge,
}

impl Reservation {
    /// Queues `message` now (no waiting: callable under the state lock). The charge is
    /// adjusted to the encoded size: unused room is released, a shortfall overdraws.
    /// Returns `false` when the connection is gone or the frame does not encode.
    pub fn send(mut self, id: impl Into<String>, message: Message) -> bool {
        let Some(text) = encode(&Frame::new(id, message)) else {
            return false;
        };
        self.charge.resize(item_bytes(&text));
        self.tx
            .send(Queued {
                item: OutItem::Text(text, None),
                _charge: self.charge,
            })
            .is_ok()
    }
}

/// A cloneable handle on one connection's outbound queue.
#[derive(Debug, Clone)]
pub struct Outbound {
    tx: mpsc::UnboundedSender<Queued>,
    budget: Arc<ByteBudget>,
}

/// What an item of `text` is charged.
fn item_bytes(text: &str) -> usize {
    text.len().saturating_add(OUTBOUND_ITEM_OVERHEAD_BYTES)
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

impl Outbound {
    /// A new queue with the [`OUTBOUND_QUEUE_BYTES`] budget: the handle and the writer's
    /// receiving end.
    pub fn channel() -> (Self, OutboundReceiver) {
        Self::with_budget(OUTBOUND_QUEUE_BYTES)
    }

    /// A new queue with a budget of `bytes` (at least 1).
    pub fn with_budget(bytes: usize) -> (Self, OutboundReceiver) {
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = ByteBudget::new(bytes);
        (
            Self {
                tx,
                budget: budget.clone(),
            },
            OutboundReceiver { rx, budget },
        )
    }

    fn push(&self, item: OutItem, charge: Charge) -> bool {
        self.tx
            .send(Queued {
                item,
                _charge: charge,
            })
            .is_ok()
    }

    /// Queues `message` with `Envelope.id` = `id`, waiting for room. Returns `false`
    /// when the connection is gone (the frame dies with it). Never await this while
    /// holding the state lock (use [`Self::send_now`]).
    pub async fn send(&self, id: impl Into<String>, message: Message) -> bool {
        let Some(text) = encode(&Frame::new(id, message)) else {
            return false;
        };
        match self.budget.acquire(item_bytes(&text)).await {
            Some(charge) => self.push(OutItem::Text(text, None), charge),
            None => false,
        }
    }

    /// Queues `message` now, without waiting (overdrawing the budget when it is full):
    /// for small frames of callers holding the state lock. Returns `false` when the
    /// connection is gone.
    pub fn send_now(&self, id: impl Into<String>, message: Message) -> bool {
        let Some(text) = encode(&Frame::new(id, message)) else {
            return false;
        };
        let charge = self.budget.charge_now(item_bytes(&text));
        self.push(OutItem::Text(text, None), charge)
    }

    /// Waits for room for a frame of up to `bytes` encoded bytes; queueing it through
    /// the [`Reservation`] then never waits. `None` once the connection is gone.
    pub async fn reserve(&self, bytes: usize) -> Option<Reservation> {
        let charge = self
            .budget
            .acquire(bytes.saturating_add(OUTBOUND_ITEM_OVERHEAD_BYTES))
            .await?;
        Some(Reservation {
            tx: self.tx.clone(),
            charge,
        })
    }

    /// Waits until the queue has room for `bytes` more (without taking it), so a
    /// producer can throttle itself. Returns `false` once the connection is gone.
    pub async fn room(&self, bytes: usize) -> bool {
        // Acquired and dropped at once: the permits return to the budget.
        self.budget
            .permits
            .acquire_many(self.budget.clamp(bytes))
            .await
            .is_ok()
    }

    /// Queues `message` and waits until the writer completed the WebSocket write,
    /// within `budget` (queueing included). Returns `false` on timeout or loss.
    /// `queued` is called as soon as the frame is in the writer's queue (before the
    /// write completes): state the peer may act on once it read the frame (a settled
    /// input slot) is released before the peer can read it.
    pub async fn send_confirmed_then(
        &self,
        id: impl Into<String>,
        message: Message,
        budget: Duration,
        queued: impl FnOnce(),
    ) -> bool {
        let Some(text) = encode(&Frame::new(id, message)) else {
            return false;
        };
        let (done_tx, done_rx) = oneshot::channel();
        let mut queued = Some(queued);
        let attempt = async {
            let charge = self.budget.acquire(item_bytes(&text)).await?;
            if let Some(queued) = queued.take() {
                queued();
            }
            if !self.push(OutItem::Text(text, Some(done_tx)), charge) {
                return None;
            }
            done_rx.await.ok()
        };
        matches!(tokio::time::timeout(budget, attempt).await, Ok(Some(())))
    }

    /// Queues a WebSocket Close frame now (never waits).
    pub fn close(&self, code: u16, reason: impl Into<String>) {
        let reason = reason.into();
        let charge = self.budget.charge_now(item_bytes(&reason));
        self.push(OutItem::Close(code, reason), charge);
    }

    /// Whether the writer is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves once the writer is gone.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Bytes currently charged against the budget by queued items and reservations
    /// (the overdraft included). Test introspection only.
    #[cfg(test)]
    pub fn queued_bytes(&self) -> usize {
        let debt = *self.budget.debt();
        (self.budget.capacity + debt).saturating_sub(self.budget.permits.available_permits())
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;
    use crate::core_runtime::wire::DeviceShutdown;

    fn small() -> Message {
        Message::DeviceShutdown(DeviceShutdown {})
    }

    /// Encoded size of `small()` with `id`, as charged.
    fn charged(id: &str) -> usize {
        item_bytes(&Frame::new(id, small()).encode().unwrap())
    }

    fn text(item: &Queued) -> &str {
        match &item.item {
            OutItem::Text(text, _) => text,
            OutItem::Close(..) => panic!("a Close item"),
        }
    }

    #[tokio::test]
    async fn the_queue_is_bounded_in_bytes_and_waiters_resume_as_items_are_written() {
        let one = charged("a");
        let (out, mut rx) = Outbound::with_budget(2 * one);
        assert!(out.send("a", small()).await);
        assert!(out.send("b", small()).await);
        assert_eq!(out.queued_bytes(), 2 * one);
        // The third frame has no room: it waits, and so does a room check.
        let mut third = std::pin::pin!(out.send("c", small()));
        assert!(third.as_mut().now_or_never().is_none());
        assert!(out.room(1).now_or_never().is_none());
        // Writing (dropping) the first item makes room for the waiter.
        let first = rx.recv().await.unwrap();
        assert!(text(&first).contains("\"id\":\"a\""));
        drop(first);
        assert!(third.await);
        let ids: Vec<String> = [rx.try_recv().unwrap(), rx.try_recv().unwrap()]
            .iter()
            .map(|q| text(q).to_string())
            .collect();
        assert!(ids[0].contains("\"id\":\"b\"") && ids[1].contains("\"id\":\"c\""));
        assert_eq!(out.queued_bytes(), 0);
    }

    #[tokio::test]
    async fn send_now_never_waits_and_its_overdraft_is_repaid_before_waiters() {
        let one = charged("a");
        let (out, mut rx) = Outbound::with_budget(one);
        assert!(out.send("a", small()).await);
        // Full: `send_now` still queues, in order, as an overdraft.
        assert!(out.send_now("b", small()));
        assert!(out.send_now("c", small()));
        assert_eq!(out.queued_bytes(), 3 * one);
        let mut waiter = std::pin::pin!(out.send("d", small()));
        assert!(waiter.as_mut().now_or_never().is_none());
        // Writing "a" and "b" repays the debt only; "c" still fills the budget.
        drop(rx.recv().await.unwrap());
        drop(rx.recv().await.unwrap());
        assert!(waiter.as_mut().now_or_never().is_none());
        drop(rx.recv().await.unwrap());
        assert!(waiter.await);
        assert_eq!(out.queued_bytes(), one);
    }

    #[tokio::test]
    async fn a_frame_over_the_budget_takes_the_whole_budget() {
        let (out, mut rx) = Outbound::with_budget(8);
        assert!(out.send("big", small()).await);
        assert_eq!(out.queued_bytes(), 8);
        let mut next = std::pin::pin!(out.send("next", small()));
        assert!(next.as_mut().now_or_never().is_none());
        drop(rx.recv().await.unwrap());
        assert!(next.await);
    }

    #[tokio::test]
    async fn a_reservation_is_resized_to_the_frame_it_queues() {
        let (out, mut rx) = Outbound::with_budget(OUTBOUND_QUEUE_BYTES);
        let reservation = out.reserve(1024 * 1024).await.unwrap();
        assert_eq!(
            out.queued_bytes(),
            1024 * 1024 + OUTBOUND_ITEM_OVERHEAD_BYTES
        );
        assert!(reservation.send("r", small()));
        assert_eq!(out.queued_bytes(), charged("r"));
        drop(rx.recv().await.unwrap());
        assert_eq!(out.queued_bytes(), 0);
        // A reservation dropped unused releases its room.
        drop(out.reserve(100).await.unwrap());
        assert_eq!(out.queued_bytes(), 0);
    }

    #[tokio::test]
    async fn waiters_fail_once_the_writer_is_gone() {
        let one = charged("a");
        let (out, rx) = Outbound::with_budget(one);
        assert!(out.send("a", small()).await);
        let mut waiter = std::pin::pin!(out.send("b", small()));
        assert!(waiter.as_mut().now_or_never().is_none());
        let mut confirmed =
            std::pin::pin!(out.send_confirmed_then("c", small(), Duration::from_secs(3600), || {}));
        assert!(confirmed.as_mut().now_or_never().is_none());
        drop(rx);
        assert!(!waiter.await);
        assert!(!confirmed.await);
        assert!(out.is_closed());
        out.closed().await;
        assert!(!out.room(1).await);
        assert!(out.reserve(1).await.is_none());
        assert!(!out.send_now("d", small()));
    }
}
