//! The daemon connection ("Ownership and connection").
//!
//! 1. `POST {core_url}/api/v1/agent-daemon/bootstrap` with `Authorization: Bearer
//!    <credential>` and `{"device_id": ...}` → `{connection_url, heartbeat_interval_ms}`.
//! 2. WebSocket to `connection_url` with the `device_id` and `version`
//!    ([`WIRE_VERSION`]) query parameters and the Bearer header. The credential is
//!    only ever a header: never in a URL, a log line or a trace ([`Credential`] has a
//!    redacting `Debug`).
//! 3. Heartbeat immediately, then every `heartbeat_interval_ms` (`hb-<n>`, counting
//!    from 1 per connection).
//!
//! Faults: HTTP 426 (`incompatible_version`), 401 and 403 on bootstrap or upgrade are
//! permanent — the daemon stops reconnecting for good, closes every Executor and idles
//! until killed. Every
//! other failure (refused connection, drop, close from Core, 5xx, other statuses, a
//! malformed bootstrap answer) is transient: reconnect after `reconnect_initial`,
//! doubling up to `reconnect_max` (reset once a connection stayed up for
//! `reconnect_healthy`, so a flapping Core gets growing delays), with a fresh
//! bootstrap and nothing replayed. A malformed frame from Core closes the WebSocket with
//! 1007 (1009 when over-size) and the [`WireError`](crate::wire::WireError) code as
//! reason, then reconnects.
//!
//! # Backpressure
//! Frames to Core go through the byte-bounded [`Outbound`] queue. When Core stops
//! reading:
//! 1. the queue fills and producers wait (Run event pumps, read results, receipts);
//! 2. the receive loop waits for [`RECEIVE_HEADROOM_BYTES`] of room after dispatching
//!    each frame, so it stops reading from Core: TCP backpressure reaches Core, and the
//!    daemon's memory stays bounded (the queue budget plus one frame being dispatched);
//!    heartbeats wait with it (they could not overtake the queued frames anyway);
//! 3. the writer bounds every WebSocket write by the **write stall** bound,
//!    [`OUTBOUND_STALL_RECEIPT_BUDGETS`] receipt-send budgets (20 s by default): "each
//!    receipt send has its own 5-second budget" ("Active-input receipts"), and a
//!    connection that cannot complete one frame within several of them cannot deliver
//!    any receipt. A stalled write ends the writer; every waiting producer fails, the
//!    receive loop ends the session (`connection_lost`) and the daemon reconnects, with
//!    nothing replayed ("Faults, retries and cleanup": reconnect).
//!
//! So nothing waits on the queue forever: either the writer makes progress (a frame at
//! least every stall bound) or the connection is failed.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use reqwest::Url;
use serde::Deserialize;
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message as WsMessage};

use super::dispatcher::{
    BINARY_REASON, CLOSE_INVALID_PAYLOAD, CLOSE_TOO_BIG, CloseWith, Runtime, ShutdownCause,
    ShutdownPhase,
};
use super::outbound::{OutItem, Outbound, OutboundReceiver};
use crate::core_runtime::wire::limits::{TRANSPORT_FRAME_MAX_BYTES, WIRE_VERSION};
use crate::core_runtime::wire::{Heartbeat, Message};
use crate::wire::bounded::{BoundedString, BoundedVec};

/// Bootstrap route, relative to the Core URL.
pub const BOOTSTRAP_PATH: &str = "/api/v1/agent-daemon/bootstrap";

/// Bound on one bootstrap request (connect + answer).
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on the bootstrap answer body, in bytes.
pub const BOOTSTRAP_RESPONSE_MAX_BYTES: usize = 64 * 1024;

/// Bound on the WebSocket connect + upgrade.
pub const WS_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Smallest heartbeat interval honoured (a smaller answer is raised to it).
pub const HEARTBEAT_INTERVAL_MIN: Duration = Duration::from_millis(10);

/// How long the daemon waits for the close handshake after sending or receiving Close.
pub const CLOSE_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// Bytes above [`TRANSPORT_FRAME_MAX_BYTES`] the WebSocket layer still reads whole, so
/// that a message just over the bound is refused by the frame decoder (1009
/// `frame_too_large`) after it was read, and the Close is not lost to a TCP reset
/// (closing a socket with unread data resets it). A message larger still is refused on
/// its header, with the same close code, on a best-effort basis.
pub const FRAME_READ_SLACK_BYTES: usize = 64 * 1024;

/// WebSocket write buffer target (tungstenite buffers up to this before writing).
pub const WS_WRITE_BUFFER_BYTES: usize = 64 * 1024;

/// Hard bound on the WebSocket write buffer (tungstenite's default is unbounded): one
/// maximal frame plus the write buffer.
pub const WS_MAX_WRITE_BUFFER_BYTES: usize = TRANSPORT_FRAME_MAX_BYTES + 2 * WS_WRITE_BUFFER_BYTES;

/// How many receipt-send budgets (`timers.receipt_send`, 5 s by default) one WebSocket
/// write may take before the connection counts as stalled and is dropped (see
/// "Backpressure" in the module documentation).
pub const OUTBOUND_STALL_RECEIPT_BUDGETS: u32 = 4;

/// Room the receive loop waits for in the outbound queue after dispatching a frame from
/// Core, before it reads the next one: more than the replies one frame queues without
/// waiting (a preparation status, a transfer receipt, a fence result).
pub const RECEIVE_HEADROOM_BYTES: usize = 64 * 1024;

/// Runtime build version reported in heartbeats (not the wire version).
pub const RUNTIME_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The daemon credential. Its `Debug` and `Display` never show the secret.
#[derive(Clone)]
pub struct Credential(String);

impl Credential {
    /// Wraps the secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Replaces every occurrence of the secret in `text` (for log lines that quote
    /// peer-provided text).
    pub fn redact(&self, text: &str) -> String {
        if self.0.is_empty() {
            text.to_string()
        } else {
            text.replace(&self.0, "[redacted]")
        }
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential([redacted])")
    }
}

/// Where and as whom the daemon connects.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Core base URL (`http://host:port`).
    pub core_url: String,
    /// Device ID.
    pub device_id: String,
    /// Daemon credential.
    pub credential: Credential,
}

/// Why a connection attempt or session ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// Needs operator correction: no reconnect (`incompatible_version`, 401, 403).
    #[error("permanent rejection ({code}): {detail}")]
    Permanent {
        /// Stable code: `incompatible_version`, `unauthorized`, `forbidden`.
        code: &'static str,
        /// Details (never the credential).
        detail: String,
    },
    /// Reconnect with backoff.
    #[error("transient connection failure ({code}): {detail}")]
    Transient {
        /// Stable code: `bootstrap_failed`, `connect_failed`, `connection_lost`,
        /// `protocol_violation`, `invalid_url`.
        code: &'static str,
        /// Details (never the credential).
        detail: String,
    },
}

impl ConnectError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ConnectError::Permanent { code, .. } | ConnectError::Transient { code, .. } => code,
        }
    }

    fn transient(code: &'static str, detail: impl Into<String>) -> Self {
        ConnectError::Transient {
            code,
            detail: detail.into(),
        }
    }
}

/// Classifies an HTTP status of bootstrap or upgrade: 426 → permanent
/// `incompatible_version`, 401/403 → permanent, anything else → transient.
pub fn classify_status(status: u16, detail: String) -> ConnectError {
    match status {
        426 => ConnectError::Permanent {
            code: "incompatible_version",
            detail,
        },
        401 => ConnectError::Permanent {
            code: "unauthorized",
            detail,
        },
        403 => ConnectError::Permanent {
            code: "forbidden",
            detail,
        },
        _ => ConnectError::transient("http_status", format!("HTTP {status}: {detail}")),
    }
}

/// The answer of the bootstrap route.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BootstrapResponse {
    /// WebSocket URL (`ws://…/api/v1/agent-daemon/ws`).
    pub connection_url: String,
    /// Heartbeat interval in milliseconds.
    pub heartbeat_interval_ms: u64,
}

/// Builds the bootstrap URL from the Core base URL.
///
/// # Errors
/// [`ConnectError::Transient`] `invalid_url` when the base URL does not parse.
pub fn bootstrap_url(core_url: &str) -> Result<Url, ConnectError> {
    let base =
        Url::parse(core_url).map_err(|e| ConnectError::transient("invalid_url", e.to_string()))?;
    let mut url = base.clone();
    let path = format!("{}{}", base.path().trim_end_matches('/'), BOOTSTRAP_PATH);
    url.set_path(&path);
    url.set_query(None);
    Ok(url)
}

/// Builds the WebSocket URL: `connection_url` plus the `device_id` and `version` query
/// parameters (and nothing else: the credential travels only as a header).
///
/// # Errors
/// [`ConnectError::Transient`] `invalid_url` when `connection_url` is not a `ws`/`wss`
/// URL.
pub fn ws_url(connection_url: &str, device_id: &str) -> Result<Url, ConnectError> {
    let mut url = Url::parse(connection_url)
        .map_err(|e| ConnectError::transient("invalid_url", e.to_string()))?;
    if !matches!(url.scheme(), "ws" | "wss") {
        return Err(ConnectError::transient(
            "invalid_url",
            format!("connection URL scheme `{}` is not ws or wss", url.scheme()),
        ));
    }
    url.query_pairs_mut()
        .append_pair("device_id", device_id)
        .append_pair("version", WIRE_VERSION);
    Ok(url)
}

/// The explicit WebSocket bounds: message and frame size at the transport frame bound
/// plus [`FRAME_READ_SLACK_BYTES`] (the decoder refuses anything over the bound),
/// a bounded write buffer.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(TRANSPORT_FRAME_MAX_BYTES + FRAME_READ_SLACK_BYTES))
        .max_frame_size(Some(TRANSPORT_FRAME_MAX_BYTES + FRAME_READ_SLACK_BYTES))
        .write_buffer_size(WS_WRITE_BUFFER_BYTES)
        .max_write_buffer_size(WS_MAX_WRITE_BUFFER_BYTES)
}

/// Step 2 of "Ownership and connection": the bootstrap request.
///
/// # Errors
/// As [`classify_status`] for non-2xx answers; transient for I/O and decoding failures.
pub async fn bootstrap(
    client: &reqwest::Client,
    options: &ConnectOptions,
) -> Result<BootstrapResponse, ConnectError> {
    let url = bootstrap_url(&options.core_url)?;
    let body = serde_json::json!({ "device_id": options.device_id });
    let mut response = client
        .post(url)
        .header(http::header::AUTHORIZATION, options.credential.bearer())
        .json(&body)
        .send()
        .await
        .map_err(|e| {
            ConnectError::transient(
                "bootstrap_failed",
                options.credential.redact(&e.to_string()),
            )
        })?;
    let status = response.status().as_u16();
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| {
        ConnectError::transient(
            "bootstrap_failed",
            options.credential.redact(&e.to_string()),
        )
    })? {
        if bytes.len() + chunk.len() > BOOTSTRAP_RESPONSE_MAX_BYTES {
            return Err(ConnectError::transient(
                "bootstrap_failed",
                "bootstrap answer over its bound",
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    if !(200..300).contains(&status) {
        let text = options.credential.redact(&String::from_utf8_lossy(&bytes));
        return Err(classify_status(status, text));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ConnectError::transient(
            "bootstrap_failed",
            format!("malformed bootstrap answer: {e}"),
        )
    })
}

/// Builds the HTTP client (no proxy, no redirects: the Bearer header goes only to the
/// configured Core).
///
/// # Errors
/// The client builder's error.
pub fn http_client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(BOOTSTRAP_TIMEOUT)
        .connect_timeout(BOOTSTRAP_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
}

/// How a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// `device_shutdown` completed: exit 0.
    Shutdown,
    /// The connection failed or was lost; `healthy` tells whether it had stayed up for
    /// `timers.reconnect_healthy` (resets the backoff).
    Failed {
        /// The failure.
        error: ConnectError,
        /// Whether the WebSocket had been established and stayed up long enough.
        healthy: bool,
    },
}

/// Runs connections until shutdown completes; returns only then (exit 0). A permanent
/// rejection closes every Executor (their programs stopped) and then idles forever (the
/// process keeps running until killed, logging once).
pub async fn run(rt: Arc<Runtime>, options: ConnectOptions) {
    let client = match http_client() {
        Ok(client) => client,
        Err(err) => {
            tracing::error!("cannot build the HTTP client: {err}");
            return std::future::pending().await;
        }
    };
    let timers = rt.config.timers;
    let mut backoff = timers.reconnect_initial;
    let mut shutdown = rt.shutdown_phase();
    loop {
        if *shutdown.borrow() != ShutdownPhase::Running {
            // No reconnect after shutdown began: wait for cleanup, then exit.
            let _ = shutdown.wait_for(|p| *p == ShutdownPhase::Done).await;
            return;
        }
        match session(&rt, &client, &options).await {
            SessionEnd::Shutdown => return,
            SessionEnd::Failed {
                error: error @ ConnectError::Permanent { .. },
                ..
            } => {
                tracing::error!(
                    code = error.code(),
                    "{error}; not reconnecting (operator correction needed): closing every Executor"
                );
                // Nothing a Run produces can reach Core any more: its programs are
                // stopped rather than left running with their output going nowhere.
                rt.begin_shutdown(ShutdownCause::ProcessShutdown).await;
                return std::future::pending().await;
            }
            SessionEnd::Failed { error, healthy } => {
                if healthy {
                    backoff = timers.reconnect_initial;
                }
                tracing::warn!(
                    code = error.code(),
                    delay_ms = backoff.as_millis() as u64,
                    "{error}; reconnecting"
                );
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shutdown.wait_for(|p| *p != ShutdownPhase::Running) => {}
                }
                if rt.config.profile.reconnect_growth {
                    backoff = (backoff * 2).min(timers.reconnect_max);
                }
            }
        }
    }
}

fn heartbeat(rt: &Runtime) -> Option<Message> {
    Some(Message::Heartbeat(Heartbeat {
        runtime_version: BoundedString::new(RUNTIME_VERSION).ok()?,
        supported_agent_kinds: BoundedVec::new(rt.config.agent_kinds.clone()).ok()?,
    }))
}

/// One physical connection: bootstrap, upgrade, heartbeat, receive loop.
async fn session(
    rt: &Arc<Runtime>,
    client: &reqwest::Client,
    options: &ConnectOptions,
) -> SessionEnd {
    let failed = |error| SessionEnd::Failed {
        error,
        healthy: false,
    };
    let boot = match bootstrap(client, options).await {
        Ok(boot) => boot,
        Err(error) => return failed(error),
    };
    let url = match ws_url(&boot.connection_url, &options.device_id) {
        Ok(url) => url,
        Err(error) => return failed(error),
    };
    let mut request = match url.as_str().into_client_request() {
        Ok(request) => request,
        Err(e) => return failed(ConnectError::transient("invalid_url", e.to_string())),
    };
    match http::HeaderValue::from_str(&options.credential.bearer()) {
        Ok(value) => {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, value);
        }
        Err(_) => {
            return failed(ConnectError::Permanent {
                code: "unauthorized",
                detail: "the credential is not a valid header value".into(),
            });
        }
    }
    let connect = tokio_tungstenite::connect_async_with_config(request, Some(ws_config()), true);
    let ws = match tokio::time::timeout(WS_CONNECT_TIMEOUT, connect).await {
        Err(_) => {
            return failed(ConnectError::transient(
                "connect_failed",
                "WebSocket upgrade timed out",
            ));
        }
        Ok(Err(tungstenite::Error::Http(response))) => {
            let body = response
                .body()
                .as_deref()
                .map(|b| options.credential.redact(&String::from_utf8_lossy(b)))
                .unwrap_or_default();
            return failed(classify_status(response.status().as_u16(), body));
        }
        Ok(Err(e)) => {
            return failed(ConnectError::transient(
                "connect_failed",
                options.credential.redact(&e.to_string()),
            ));
        }
        Ok(Ok((ws, _response))) => ws,
    };
    tracing::info!(url = %url, "connected");
    let up = tokio::time::Instant::now();
    let (sink, stream) = ws.split();
    let (out, rx) = Outbound::channel();
    let generation = rt.connection_opened(out.clone()).await;
    let (stop_writer, stop_rx) = oneshot::channel();
    let stall = timers_write_stall(rt);
    let writer = tokio::spawn(writer(sink, rx, stop_rx, stall));
    let interval = Duration::from_millis(boot.heartbeat_interval_ms).max(HEARTBEAT_INTERVAL_MIN);
    let end = receive_loop(rt, generation, &out, stream, interval).await;
    rt.connection_closed(generation).await;
    drop(out);
    // Run tasks of this connection may still hold queue handles: their frames die with
    // the connection. Tell the writer to flush what is queued now and stop, then let it
    // finish the close handshake it may have started.
    let _ = stop_writer.send(());
    let _ = tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, writer).await;
    match end {
        Ok(()) => SessionEnd::Shutdown,
        Err(error) => SessionEnd::Failed {
            error,
            healthy: up.elapsed() >= rt.config.timers.reconnect_healthy,
        },
    }
}

type WsStream = futures_util::stream::SplitStream<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
>;

/// The write stall bound of a connection: [`OUTBOUND_STALL_RECEIPT_BUDGETS`] receipt-send
/// budgets.
fn timers_write_stall(rt: &Runtime) -> Duration {
    rt.config
        .timers
        .receipt_send
        .saturating_mul(OUTBOUND_STALL_RECEIPT_BUDGETS)
}

/// Drains the outbound queue into the WebSocket until the queue closes, a Close item
/// was written, or `stop` fires (then only the items already queued are written).
///
/// Every write is bounded by `stall`: a write that does not complete in time (Core
/// stopped reading) or fails ends the writer, which closes the queue — every waiting
/// producer fails and the receive loop ends the session. An item's queue bytes are
/// released once it was written.
async fn writer<S>(
    mut sink: S,
    mut rx: OutboundReceiver,
    stop: oneshot::Receiver<()>,
    stall: Duration,
) where
    S: futures_util::Sink<WsMessage, Error = tungstenite::Error> + Unpin,
{
    let mut stop = std::pin::pin!(stop);
    let mut stopping = false;
    loop {
        let mut queued = if stopping {
            match rx.try_recv() {
                Some(item) => item,
                None => break,
            }
        } else {
            tokio::select! {
                biased;
                item = rx.recv() => match item {
                    Some(item) => item,
                    None => break,
                },
                _ = &mut stop => {
                    stopping = true;
                    continue;
                }
            }
        };
        match &mut queued.item {
            OutItem::Text(text, done) => {
                let message = WsMessage::text(std::mem::take(text));
                match tokio::time::timeout(stall, sink.send(message)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!("WebSocket write failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!(
                            stall_ms = stall.as_millis() as u64,
                            "Core took no frame within the write stall bound; dropping the connection"
                        );
                        return;
                    }
                }
                if let Some(done) = done.take() {
                    let _ = done.send(());
                }
            }
            OutItem::Close(code, reason) => {
                let frame = CloseFrame {
                    code: CloseCode::from(*code),
                    reason: std::mem::take(reason).into(),
                };
                let _ = tokio::time::timeout(stall, async {
                    let _ = sink.send(WsMessage::Close(Some(frame))).await;
                    let _ = sink.flush().await;
                })
                .await;
                return;
            }
        }
        // `queued` (and its queue bytes) is released here, after the write.
    }
    let _ = tokio::time::timeout(stall, sink.close()).await;
}

/// Reads frames until the connection ends. `Ok(())` = shutdown completed.
async fn receive_loop(
    rt: &Arc<Runtime>,
    generation: u64,
    out: &Outbound,
    mut stream: WsStream,
    interval: Duration,
) -> Result<(), ConnectError> {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beats: u64 = 0;
    let mut shutdown = rt.shutdown_phase();
    let writer_gone = || {
        ConnectError::transient(
            "connection_lost",
            "the WebSocket writer stopped (write failed or stalled)",
        )
    };
    loop {
        if out.is_closed() {
            return Err(writer_gone());
        }
        tokio::select! {
            _ = out.closed() => return Err(writer_gone()),
            _ = ticker.tick() => {
                beats += 1;
                match heartbeat(rt) {
                    Some(message) => {
                        let id = format!("{}{beats}", rt.config.profile.heartbeat_id_prefix);
                        out.send(id, message).await;
                    }
                    None => tracing::error!("heartbeat does not fit its wire bounds"),
                }
            }
            _ = shutdown.wait_for(|p| *p == ShutdownPhase::Done) => {
                let (code, reason) = rt.shutdown_cause().close();
                out.close(code, rt.config.profile.close_reason(reason));
                drain_until_closed(&mut stream).await;
                return Ok(());
            }
            message = stream.next() => {
                let violation = match message {
                    None => return Err(ConnectError::transient("connection_lost", "connection dropped")),
                    Some(Err(tungstenite::Error::Capacity(e))) => Some((CLOSE_TOO_BIG, "frame_too_large".to_string(), e.to_string())),
                    Some(Err(tungstenite::Error::Utf8(e))) => Some((CLOSE_INVALID_PAYLOAD, "malformed_json".to_string(), e)),
                    Some(Err(e)) => return Err(ConnectError::transient("connection_lost", e.to_string())),
                    Some(Ok(WsMessage::Text(text))) => match rt.dispatch(generation, text.as_bytes()).await {
                        Ok(()) => None,
                        Err(CloseWith { code, reason }) => Some((code, reason.clone(), format!("malformed frame from Core ({reason})"))),
                    },
                    Some(Ok(WsMessage::Binary(_))) => Some((CLOSE_INVALID_PAYLOAD, BINARY_REASON.to_string(), "binary message".to_string())),
                    Some(Ok(WsMessage::Close(_))) => {
                        // Keep polling so tungstenite flushes its close reply.
                        drain_until_closed(&mut stream).await;
                        return Err(ConnectError::transient("connection_lost", "Core closed the connection"));
                    }
                    Some(Ok(_)) => None,
                };
                if let Some((code, reason, detail)) = violation {
                    tracing::warn!(close_code = code, %reason, "{detail}; closing");
                    out.close(code, rt.config.profile.close_reason(&reason));
                    drain_until_closed(&mut stream).await;
                    return Err(ConnectError::transient("protocol_violation", detail));
                }
                // Backpressure: read the next frame from Core only once the queue has
                // room for its replies (or the writer is gone).
                if !out.room(RECEIVE_HEADROOM_BYTES).await {
                    return Err(writer_gone());
                }
            }
        }
    }
}

/// Polls the stream (so pending close replies are flushed) until it ends, bounded.
async fn drain_until_closed(stream: &mut WsStream) {
    let _ = tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t-credential-value";

    #[test]
    fn urls_never_carry_the_credential() {
        let url = ws_url("ws://127.0.0.1:4000/api/v1/agent-daemon/ws", "device 1").unwrap();
        assert_eq!(
            url.as_str(),
            "ws://127.0.0.1:4000/api/v1/agent-daemon/ws?device_id=device+1&version=1.0.0"
        );
        assert!(!url.as_str().contains(SECRET));
        let boot = bootstrap_url("http://127.0.0.1:4000").unwrap();
        assert_eq!(
            boot.as_str(),
            "http://127.0.0.1:4000/api/v1/agent-daemon/bootstrap"
        );
        assert!(!boot.as_str().contains(SECRET));
        assert!(ws_url("http://x/ws", "d").is_err());
    }

    #[test]
    fn credential_is_redacted() {
        let c = Credential::new(SECRET);
        assert!(!format!("{c:?}").contains(SECRET));
        let options = ConnectOptions {
            core_url: "http://x".into(),
            device_id: "d".into(),
            credential: c.clone(),
        };
        assert!(!format!("{options:?}").contains(SECRET));
        assert_eq!(
            c.redact(&format!("bad token {SECRET}")),
            "bad token [redacted]"
        );
    }

    #[test]
    fn statuses_are_classified() {
        assert_eq!(
            classify_status(426, String::new()).code(),
            "incompatible_version"
        );
        assert!(matches!(
            classify_status(401, String::new()),
            ConnectError::Permanent { .. }
        ));
        assert!(matches!(
            classify_status(403, String::new()),
            ConnectError::Permanent { .. }
        ));
        assert!(matches!(
            classify_status(503, String::new()),
            ConnectError::Transient { .. }
        ));
        assert!(matches!(
            classify_status(404, String::new()),
            ConnectError::Transient { .. }
        ));
    }

    use std::pin::Pin;
    use std::task::{Context, Poll};

    use crate::core_runtime::wire::DeviceShutdown;

    fn small() -> Message {
        Message::DeviceShutdown(DeviceShutdown {})
    }

    /// A WebSocket whose peer never reads: every write stays pending.
    struct Stuck;

    impl futures_util::Sink<WsMessage> for Stuck {
        type Error = tungstenite::Error;
        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Pending
        }
        fn start_send(self: Pin<&mut Self>, _: WsMessage) -> Result<(), Self::Error> {
            Ok(())
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Pending
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Pending
        }
    }

    /// Regression (unbounded waits): when Core stops reading, a write that cannot
    /// complete within the stall bound ends the writer, and every producer waiting for
    /// queue room fails instead of waiting forever.
    #[tokio::test]
    async fn a_stalled_write_ends_the_writer_and_fails_waiting_producers() {
        let (out, rx) = Outbound::with_budget(1);
        let (_stop, stop_rx) = oneshot::channel();
        let writer = tokio::spawn(writer(Stuck, rx, stop_rx, Duration::from_millis(20)));
        // The one-byte budget is full with the first frame; the next one waits.
        assert!(out.send("a", small()).await);
        let waiting = tokio::spawn({
            let out = out.clone();
            async move { out.send("b", small()).await }
        });
        writer.await.unwrap();
        assert!(!waiting.await.unwrap());
        assert!(out.is_closed());
        assert!(!out.room(1).await);
    }

    /// The writer releases an item's queue bytes once it wrote it, so producers
    /// proceed one frame at a time through a one-frame budget, in order.
    #[tokio::test]
    async fn the_writer_releases_queue_bytes_after_each_write() {
        let (out, rx) = Outbound::with_budget(1);
        let (_stop, stop_rx) = oneshot::channel();
        let (sink_tx, mut sink_rx) = tokio::sync::mpsc::unbounded_channel::<WsMessage>();
        let sink = futures_util::sink::unfold(sink_tx, |tx, message| async move {
            tx.send(message).expect("the test reads");
            Ok::<_, tungstenite::Error>(tx)
        });
        let writer = tokio::spawn(writer(
            Box::pin(sink),
            rx,
            stop_rx,
            Duration::from_secs(3600),
        ));
        for id in ["a", "b", "c"] {
            assert!(out.send(id, small()).await);
        }
        assert!(
            out.send_confirmed_then("d", small(), Duration::from_secs(3600), || {})
                .await
        );
        drop(out);
        writer.await.unwrap();
        let mut ids = Vec::new();
        while let Ok(WsMessage::Text(text)) = sink_rx.try_recv() {
            let frame: serde_json::Value = serde_json::from_str(text.as_str()).unwrap();
            ids.push(frame["id"].as_str().unwrap().to_string());
        }
        assert_eq!(ids, ["a", "b", "c", "d"]);
    }

    #[test]
    fn the_write_stall_bound_is_a_multiple_of_the_receipt_budget() {
        let config = crate::core_runtime::daemon::RuntimeConfig::default();
        assert_eq!(
            config.timers.receipt_send * OUTBOUND_STALL_RECEIPT_BUDGETS,
            Duration::from_secs(20)
        );
    }

    #[test]
    fn websocket_bounds_are_explicit() {
        let config = ws_config();
        let read_max = TRANSPORT_FRAME_MAX_BYTES + FRAME_READ_SLACK_BYTES;
        assert_eq!(config.max_message_size, Some(read_max));
        assert_eq!(config.max_frame_size, Some(read_max));
        assert_eq!(config.max_write_buffer_size, WS_MAX_WRITE_BUFFER_BYTES);
    }
}
