//! Core's HTTP listener: at most [`super::HTTP_CONNECTIONS_MAX`] connections, a header
//! read timeout, a write-stall timeout, and a budget on the answer bytes held for slow
//! readers.
//!
//! A reader that stops reading must cost Core neither a task nor memory forever:
//! [`StallGuard`] drops a connection whose peer accepts no byte of a pending write for
//! the write-stall timeout, and [`ResponseBudget`] bounds the bytes of large answers
//! (event pages) held at once across all connections, so a thousand stalled readers wait
//! for budget instead of each holding a page. This module owns connection-level policy;
//! it never looks into requests or answers.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long an answer (or a daemon WebSocket frame) may wait for its reader to accept
/// any byte before Core drops the connection (daemon policy; `timers.http_write_stall_ms`).
pub const HTTP_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on the bytes of budgeted answers (event pages) held at once, all connections
/// together (daemon policy): 64 MiB. Lowered by tests of the bound through
/// `limits.response_bytes_in_flight` ([`super::config::CoreConfig`]).
pub const RESPONSE_BYTES_IN_FLIGHT_MAX: usize = 64 * 1024 * 1024;

/// An I/O stream whose writes fail with `TimedOut` once the peer has accepted no byte of
/// a pending write for the stall timeout (the timer restarts whenever a write makes
/// progress). Reads pass through unchanged.
pub struct StallGuard<S> {
    inner: S,
    stall: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> StallGuard<S> {
    /// Wraps `inner` with the stall timeout `stall`.
    pub fn new(inner: S, stall: Duration) -> Self {
        Self {
            inner,
            stall,
            timer: None,
        }
    }

    /// `Pending` from the inner write: arm (or poll) the stall timer.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let stall = self.stall;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the reader accepted nothing within the write-stall timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallGuard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Pending => this.stalled(cx),
            ready => {
                this.timer = None;
                ready
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => this.stalled(cx),
            ready => {
                this.timer = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_flush(cx) {
            Poll::Pending => this.stalled(cx),
            ready => {
                this.timer = None;
                ready
            }
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Largest piece of a budgeted answer handed to the connection at a time: with the
/// connection's write buffer bounded by [`HTTP_BUFFER_MAX`], an unread answer's bytes
/// stay in its budgeted body, which holds their share of the budget.
pub const RESPONSE_CHUNK_BYTES: usize = 64 * 1024;

/// Bound on each HTTP connection's read and write buffers (hyper's `max_buf_size`):
/// what a stalled reader can pin outside the budget.
pub const HTTP_BUFFER_MAX: usize = 64 * 1024;

/// The shared budget of answer bytes in flight ([`RESPONSE_BYTES_IN_FLIGHT_MAX`] unless
/// the configuration lowers it).
#[derive(Clone)]
pub struct ResponseBudget {
    permits: Arc<Semaphore>,
    /// The whole budget, in bytes.
    max: usize,
}

impl Default for ResponseBudget {
    fn default() -> Self {
        Self::new(RESPONSE_BYTES_IN_FLIGHT_MAX)
    }
}

/// A share of the budget taken before an answer is built.
pub struct Reservation(Option<OwnedSemaphorePermit>);

impl ResponseBudget {
    /// A budget of `max` bytes (at least one, at most [`RESPONSE_BYTES_IN_FLIGHT_MAX`]).
    pub fn new(max: usize) -> Self {
        let max = max.clamp(1, RESPONSE_BYTES_IN_FLIGHT_MAX);
        Self {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// The whole budget, in bytes.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Reserves `bytes` (at most the whole budget), waiting while the budget is spent:
    /// a burst of readers waits here instead of each building its answer.
    pub async fn reserve(&self, bytes: usize) -> Reservation {
        let want = u32::try_from(bytes.clamp(1, self.max)).unwrap_or(u32::MAX);
        Reservation(self.permits.clone().acquire_many_owned(want).await.ok())
    }

    /// Grows `reservation` to `total` bytes (at most the whole budget), waiting while
    /// the budget is spent: an answer that came out larger than reserved (a page whose
    /// first event is a large one).
    pub async fn top_up(&self, reservation: &mut Reservation, total: usize) {
        let total = total.min(self.max);
        let held = reservation
            .0
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits);
        if total <= held {
            return;
        }
        let more = u32::try_from(total - held).unwrap_or(u32::MAX);
        if let Ok(extra) = self.permits.clone().acquire_many_owned(more).await {
            match reservation.0.as_mut() {
                Some(permit) => permit.merge(extra),
                None => reservation.0 = Some(extra),
            }
        }
    }

    /// The bytes in free budget (for tests and logs).
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

impl Reservation {
    /// The answer body of `bytes`: the reservation shrinks to its size and is held
    /// until the last chunk was handed to the connection (or the connection is gone).
    pub fn body(mut self, bytes: Vec<u8>) -> Body {
        if let Some(permit) = self.0.as_mut() {
            let keep = bytes.len().max(1);
            if permit.num_permits() > keep {
                drop(permit.split(permit.num_permits() - keep));
            }
        }
        Body::new(Budgeted {
            data: Bytes::from(bytes),
            _permit: self.0,
        })
    }
}

/// One answer's bytes not yet handed to the connection, and their share of the budget.
struct Budgeted {
    data: Bytes,
    _permit: Option<OwnedSemaphorePermit>,
}

impl HttpBody for Budgeted {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.data.is_empty() {
            return Poll::Ready(None);
        }
        let n = this.data.len().min(RESPONSE_CHUNK_BYTES);
        Poll::Ready(Some(Ok(http_body::Frame::data(this.data.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.len() as u64)
    }
}

/// Serves `app` on `listener` forever: HTTP/1.1 with upgrades (the daemon WebSocket),
/// at most [`super::HTTP_CONNECTIONS_MAX`] connections at once, each closed when a request's
/// headers do not arrive within `header_timeout` ([`super::HTTP_HEADER_READ_TIMEOUT`])
/// or whose reader accepts no byte of a pending write for `write_stall`
/// ([`HTTP_WRITE_STALL_TIMEOUT`]; the upgraded daemon WebSocket included).
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    header_timeout: Duration,
    write_stall: Duration,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(super::HTTP_CONNECTIONS_MAX));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        continue;
                    }
                };
                let app = app.clone();
                connections.spawn(async move {
                    let _permit = permit;
                    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let mut app = app.clone();
                        async move {
                            type Req = hyper::Request<axum::body::Body>;
                            std::future::poll_fn(|cx| {
                                <axum::Router as tower_service::Service<Req>>::poll_ready(
                                    &mut app, cx,
                                )
                            })
                            .await?;
                            <axum::Router as tower_service::Service<Req>>::call(
                                &mut app,
                                req.map(axum::body::Body::new),
                            )
                            .await
                        }
                    });
                    let mut builder = hyper::server::conn::http1::Builder::new();
                    builder
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(header_timeout)
                        .max_buf_size(HTTP_BUFFER_MAX);
                    let _ = builder
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(StallGuard::new(stream, write_stall)),
                            service,
                        )
                        .with_upgrades()
                        .await;
                });
            }
            // Reap finished connections so the set stays bounded.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_reader_never_takes_fails_after_the_stall_timeout() {
        let (client, _server) = tokio::io::duplex(16);
        let mut guarded = StallGuard::new(client, Duration::from_millis(300));
        // Fills the 16-byte pipe, then waits on a reader that never reads.
        let err = guarded.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_but_moving_reader_is_not_cut() {
        let (client, mut server) = tokio::io::duplex(16);
        let mut guarded = StallGuard::new(client, Duration::from_millis(300));
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 8];
            loop {
                // Slower than the pipe fills, faster than the stall timeout.
                tokio::time::sleep(Duration::from_millis(200)).await;
                match tokio::io::AsyncReadExt::read(&mut server, &mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        });
        guarded.write_all(&[7u8; 64]).await.unwrap();
        guarded.shutdown().await.unwrap();
        drop(guarded);
        assert_eq!(reader.await.unwrap(), vec![7u8; 64]);
    }

    #[tokio::test]
    async fn a_body_holds_its_share_of_the_budget_until_dropped() {
        let budget = ResponseBudget::default();
        let reservation = budget.reserve(5 * 1024 * 1024).await;
        assert_eq!(
            budget.available(),
            RESPONSE_BYTES_IN_FLIGHT_MAX - 5 * 1024 * 1024
        );
        let body = reservation.body(vec![b'x'; 100_000]);
        assert_eq!(budget.available(), RESPONSE_BYTES_IN_FLIGHT_MAX - 100_000);
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        assert_eq!(bytes.len(), 100_000);
        assert_eq!(budget.available(), RESPONSE_BYTES_IN_FLIGHT_MAX);
    }

    #[tokio::test]
    async fn a_lowered_budget_bounds_every_reservation_and_makes_the_next_wait() {
        use futures_util::FutureExt as _;
        let budget = ResponseBudget::new(1000);
        assert_eq!(budget.max(), 1000);
        // Larger than the whole budget: takes all of it, no more.
        let mut first = budget.reserve(5000).await;
        assert_eq!(budget.available(), 0);
        budget.top_up(&mut first, 9000).await;
        assert_eq!(budget.available(), 0);
        // The next answer waits for budget instead of being built.
        assert!(budget.reserve(1).now_or_never().is_none());
        let body = first.body(vec![b'x'; 600]);
        assert_eq!(budget.available(), 400);
        drop(body);
        assert_eq!(budget.available(), 1000);
        assert!(budget.reserve(1000).now_or_never().is_some());
        // Out of range: at least one byte, at most the daemon's bound.
        assert_eq!(ResponseBudget::new(0).max(), 1);
        assert_eq!(
            ResponseBudget::new(usize::MAX).max(),
            RESPONSE_BYTES_IN_FLIGHT_MAX
        );
    }
}
