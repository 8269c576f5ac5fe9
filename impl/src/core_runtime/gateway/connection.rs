//! The machine-connection API and the daemon WebSocket ("Ownership and connection").
//!
//! * `POST /api/v1/agent-daemon/bootstrap`: Bearer daemon credential + `{"device_id"}`
//!   → `200 {"connection_url", "heartbeat_interval_ms"}`; otherwise `401
//!   {"error":"invalid_credential"}`.
//! * `GET /api/v1/agent-daemon/ws?device_id=…&version=…` + Bearer: `401` for a bad
//!   credential, `426 {"error":"incompatible_version"}` unless `version` equals
//!   [`WIRE_VERSION`] exactly; both before any upgrade or dispatch.
//!
//! A new connection of a device fences the old owner lease (the device's owner epoch
//! is incremented durably), removes the old connection's Run and interaction routes
//! (its Turns observe [`TurnMsg::ConnectionLost`]) and closes it; the new connection
//! inherits nothing. Capabilities are unknown until the first heartbeat; an invalid
//! heartbeat clears the snapshot and closes the transport with 1007 and the wire error
//! code. Any other malformed frame closes with 1007 (1009 when over-size) and the code.
//!
//! Every connection remembers the credential it was upgraded with. Revoking that
//! credential ends the connection (Close [`CLOSE_REVOKED`] `credential_revoked`, its
//! routes dropped like a fenced connection's): at once when the revocation goes through
//! Core's public API, within `timers.credential_recheck` when another process revoked it
//! in the database ([`recheck_revocations`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::ws::{CloseFrame, Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::{Core, DELIVERY_STALL_MAX, DEVICES_MAX, TurnMsg};
use crate::core_runtime::daemon::connection::{WS_MAX_WRITE_BUFFER_BYTES, WS_WRITE_BUFFER_BYTES};
use crate::core_runtime::wire::frame::decode_envelope;
use crate::core_runtime::wire::limits::{TRANSPORT_FRAME_MAX_BYTES, WIRE_VERSION};
use crate::core_runtime::wire::{AgentKindDeclaration, Direction, Frame, Message};
use crate::wire::WireError;

/// Bootstrap route.
pub const BOOTSTRAP_PATH: &str = "/api/v1/agent-daemon/bootstrap";
/// WebSocket route.
pub const WS_PATH: &str = "/api/v1/agent-daemon/ws";
/// How long Core waits for the peer's Close after sending its own before it drops the
/// TCP connection (RFC 6455 §7.1.1: the server closes the TCP connection; a peer that
/// never answers must not keep it open), e.g. after `credential_revoked` or `replaced`.
pub const CLOSE_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Close code for a malformed frame or invalid heartbeat (RFC 6455 "invalid payload").
pub const CLOSE_INVALID_PAYLOAD: u16 = 1007;
/// Close code for an over-size frame (RFC 6455 "message too big").
pub const CLOSE_TOO_BIG: u16 = 1009;
/// Close code used when a replacement connection fences this one.
pub const CLOSE_REPLACED: u16 = 1000;
/// Close reason used when a replacement connection fences this one.
pub const REPLACED_REASON: &str = "replaced";
/// Close code when the connection's daemon credential was revoked (RFC 6455 "policy
/// violation").
pub const CLOSE_REVOKED: u16 = 1008;
/// Close reason when the connection's daemon credential was revoked.
pub const REVOKED_REASON: &str = "credential_revoked";
/// Bound on frames queued for one connection's writer.
pub const OUTBOUND_QUEUE_MAX: usize = 256;
/// Bytes above [`TRANSPORT_FRAME_MAX_BYTES`] the WebSocket layer still reads whole, so
/// that a message just over the bound is refused by the frame decoder (1009
/// `frame_too_large`) after it was read, and Core's Close is not lost to a TCP reset
/// (closing a socket with unread data resets it). A message larger still is refused on
/// its header, with the same close code, on a best-effort basis.
pub const FRAME_READ_SLACK_BYTES: usize = 64 * 1024;
/// Bound on routes one connection holds.
pub const ROUTES_MAX: usize = 4096;
/// Bound on a bootstrap request body (bytes).
pub const BOOTSTRAP_BODY_MAX_BYTES: usize = 4096;

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// What the writer task sends.
#[derive(Debug)]
pub enum Outgoing {
    /// One encoded frame.
    Text(String),
    /// Close with code and reason, then stop.
    Close(u16, String),
}

/// The kind of a route key (the spec's identities, "Envelope and identity").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteKind {
    /// Preparation request ID (`Envelope.id` of prepare/start/release/status).
    Preparation,
    /// Run ID (`Envelope.id` of Run events, cancel, active input, function frames).
    Run,
    /// Interaction ID (`request_id` / `ask_id`).
    Interaction,
    /// Transfer ID (`runtime_prepare`).
    Transfer,
    /// Workspace operation ID (`workspace_read`, `workspace_write`).
    Operation,
}

#[derive(Default)]
struct ConnState {
    snapshot: Option<Vec<AgentKindDeclaration>>,
    routes: HashMap<(RouteKind, String), String>,
    turns: HashSet<String>,
    initialized: HashSet<String>,
    closed: bool,
}

/// One physical daemon connection (the current owner of its device, until fenced).
pub struct DeviceConnection {
    /// Authenticated device.
    pub device_id: String,
    /// Process-local connection number.
    pub conn_id: u64,
    /// Owner epoch granted to this connection.
    pub epoch: u64,
    /// The daemon credential (its ID, never the secret) the connection was upgraded with.
    pub credential_id: String,
    out: mpsc::Sender<Outgoing>,
    state: Mutex<ConnState>,
}

impl DeviceConnection {
    fn lock(&self) -> std::sync::MutexGuard<'_, ConnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The admission snapshot: `None` before the first heartbeat (capabilities unknown).
    pub fn snapshot(&self) -> Option<Vec<AgentKindDeclaration>> {
        self.lock().snapshot.clone()
    }

    /// The declaration of `agent_kind` in the snapshot, if declared.
    pub fn declaration(&self, agent_kind: &str) -> Option<AgentKindDeclaration> {
        self.lock()
            .snapshot
            .as_ref()?
            .iter()
            .find(|d| d.agent_kind.as_str() == agent_kind)
            .cloned()
    }

    /// Whether the connection was closed or fenced.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Queues a frame for the writer. `false` = the frame did not enter the queue
    /// (connection closed); the caller must treat delivery as not attempted.
    pub async fn send(&self, frame: &Frame) -> bool {
        if self.is_closed() {
            return false;
        }
        let text = match frame.encode() {
            Ok(text) => text,
            Err(err) => {
                tracing::error!(code = err.code(), "cannot encode a frame: {err}");
                return false;
            }
        };
        self.out.send(Outgoing::Text(text)).await.is_ok()
    }

    /// Registers a route to a Turn; `false` when the connection is closed or full.
    pub fn route(&self, kind: RouteKind, id: &str, turn_id: &str) -> bool {
        let mut s = self.lock();
        if s.closed || s.routes.len() >= ROUTES_MAX {
            return false;
        }
        s.routes.insert((kind, id.to_string()), turn_id.to_string());
        s.turns.insert(turn_id.to_string());
        true
    }

    /// Removes every route of a Turn.
    pub fn unroute_turn(&self, turn_id: &str) {
        let mut s = self.lock();
        s.routes.retain(|_, t| t != turn_id);
        s.turns.remove(turn_id);
    }

    /// Whether `environment_id` was initialized on this connection.
    pub fn initialized(&self, environment_id: &str) -> bool {
        self.lock().initialized.contains(environment_id)
    }

    /// Records an initialized Environment.
    pub fn mark_initialized(&self, environment_id: &str) {
        let mut s = self.lock();
        if s.initialized.len() < ROUTES_MAX {
            s.initialized.insert(environment_id.to_string());
        }
    }

    fn lookup(&self, kind: RouteKind, id: &str) -> Option<String> {
        self.lock().routes.get(&(kind, id.to_string())).cloned()
    }

    /// Closes the connection: drops its routes and snapshot; returns the Turns that
    /// were routed on it.
    fn shut(&self) -> Vec<String> {
        let mut s = self.lock();
        s.closed = true;
        s.snapshot = None;
        s.routes.clear();
        s.turns.drain().collect()
    }
}

/// The machine-connection routes.
pub fn routes() -> Router<Arc<Core>> {
    Router::new()
        .route(BOOTSTRAP_PATH, post(bootstrap))
        .route(WS_PATH, get(upgrade))
}

fn error(status: StatusCode, code: &str) -> Response {
    (status, Json(json!({ "error": code }))).into_response()
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    crate::wire::bearer::bearer_credential_str(value).map(str::to_string)
}

/// The ID of the device's non-revoked credential presented as the Bearer header.
async fn authenticate(core: &Core, headers: &HeaderMap, device_id: &str) -> Option<String> {
    let secret = bearer(headers)?;
    let device = device_id.to_string();
    core.store
        .call(move |s| s.verify_credential(&device, &secret))
        .await
        .ok()
        .flatten()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BootstrapRequest {
    device_id: String,
}

async fn bootstrap(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    // Read with a deadline and a bound, before any credential is known: an anonymous
    // client cannot hold a connection longer than the header timeout would let it.
    let read = tokio::time::timeout(
        super::HTTP_HEADER_READ_TIMEOUT,
        axum::body::to_bytes(body, BOOTSTRAP_BODY_MAX_BYTES),
    )
    .await;
    let body = match read {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => return error(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
        Err(_) => return error(StatusCode::REQUEST_TIMEOUT, "request_timeout"),
    };
    let request: BootstrapRequest = match crate::wire::decode_strict(&body) {
        Ok(r) => r,
        Err(_) => return error(StatusCode::BAD_REQUEST, "invalid_request"),
    };
    if authenticate(&core, &headers, &request.device_id)
        .await
        .is_none()
    {
        return error(StatusCode::UNAUTHORIZED, "invalid_credential");
    }
    let ws_base = core.base_url.replacen("http://", "ws://", 1);
    Json(json!({
        "connection_url": format!("{ws_base}{WS_PATH}"),
        "heartbeat_interval_ms": core.config.timers.heartbeat_interval.as_millis() as u64,
    }))
    .into_response()
}

#[derive(Deserialize)]
struct WsQuery {
    device_id: Option<String>,
    version: Option<String>,
}

async fn upgrade(
    State(core): State<Arc<Core>>,
    headers: HeaderMap,
    query: Result<Query<WsQuery>, axum::extract::rejection::QueryRejection>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let Ok(Query(query)) = query else {
        return error(StatusCode::BAD_REQUEST, "invalid_request");
    };
    let Some(device_id) = query.device_id else {
        return error(StatusCode::BAD_REQUEST, "missing_device_id");
    };
    let Some(credential_id) = authenticate(&core, &headers, &device_id).await else {
        return error(StatusCode::UNAUTHORIZED, "invalid_credential");
    };
    if query.version.as_deref() != Some(WIRE_VERSION) {
        return error(StatusCode::UPGRADE_REQUIRED, "incompatible_version");
    }
    let ws = match ws {
        Ok(ws) => ws,
        // Not a WebSocket upgrade request (no `Upgrade`, wrong method or version).
        Err(rejection) => return error(rejection.status(), "not_a_websocket_upgrade"),
    };
    let device = device_id.clone();
    let epoch = match core.store.call(move |s| s.bump_owner_epoch(&device)).await {
        Ok(epoch) => epoch,
        Err(err) => {
            tracing::error!(code = err.code(), "cannot fence the owner lease: {err}");
            return error(StatusCode::SERVICE_UNAVAILABLE, "storage_error");
        }
    };
    ws.max_message_size(TRANSPORT_FRAME_MAX_BYTES + FRAME_READ_SLACK_BYTES)
        .max_frame_size(TRANSPORT_FRAME_MAX_BYTES + FRAME_READ_SLACK_BYTES)
        .write_buffer_size(WS_WRITE_BUFFER_BYTES)
        .max_write_buffer_size(WS_MAX_WRITE_BUFFER_BYTES)
        .on_upgrade(move |socket| run_connection(core, device_id, credential_id, epoch, socket))
}

/// Installs `conn` as its device's owner, fencing the previous one.
fn install(core: &Core, conn: Arc<DeviceConnection>) -> Result<(), &'static str> {
    let old = {
        let mut devices = core.devices.lock().unwrap_or_else(|e| e.into_inner());
        if !devices.contains_key(&conn.device_id) && devices.len() >= DEVICES_MAX {
            return Err("too_many_devices");
        }
        devices.insert(conn.device_id.clone(), conn.clone())
    };
    if let Some(old) = old {
        tracing::info!(device_id = %conn.device_id, old_epoch = old.epoch, new_epoch = conn.epoch, "replacement connection fences the old owner lease");
        drop_connection(core, &old);
        let _ = old
            .out
            .try_send(Outgoing::Close(CLOSE_REPLACED, REPLACED_REASON.into()));
    }
    Ok(())
}

/// Drops a connection's routes and tells its Turns the connection is gone.
fn drop_connection(core: &Core, conn: &DeviceConnection) {
    for turn in conn.shut() {
        core.notify_turn_reliably(&turn, TurnMsg::ConnectionLost);
    }
    let mut devices = core.devices.lock().unwrap_or_else(|e| e.into_inner());
    if devices
        .get(&conn.device_id)
        .is_some_and(|c| c.conn_id == conn.conn_id)
    {
        devices.remove(&conn.device_id);
    }
}

/// Ends every live connection upgraded with one of `revoked` (credential IDs): its
/// routes are dropped (its Turns observe the connection loss) and it is closed with
/// [`CLOSE_REVOKED`]. Returns how many connections ended.
pub fn end_revoked(core: &Core, revoked: &HashSet<String>) -> usize {
    let live: Vec<Arc<DeviceConnection>> = core
        .devices
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .filter(|c| revoked.contains(&c.credential_id))
        .cloned()
        .collect();
    for conn in &live {
        tracing::info!(device_id = %conn.device_id, credential_id = %conn.credential_id, "the credential was revoked: ending its connection");
        drop_connection(core, conn);
        let _ = conn
            .out
            .try_send(Outgoing::Close(CLOSE_REVOKED, REVOKED_REASON.into()));
    }
    live.len()
}

/// Re-reads, every `timers.credential_recheck`, which credentials of live connections
/// were revoked (by any process sharing the database) and ends those connections. Runs
/// for Core's lifetime.
pub async fn recheck_revocations(core: Arc<Core>) {
    let mut tick = tokio::time::interval(core.config.timers.credential_recheck);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let live: HashSet<String> = core
            .devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|c| c.credential_id.clone())
            .collect();
        if live.is_empty() {
            continue;
        }
        match core.store.call(|s| s.list_credentials()).await {
            Ok(all) => {
                let revoked: HashSet<String> = all
                    .into_iter()
                    .filter(|c| c.revoked_at_ms.is_some() && live.contains(&c.credential_id))
                    .map(|c| c.credential_id)
                    .collect();
                if !revoked.is_empty() {
                    end_revoked(&core, &revoked);
                }
            }
            Err(err) => {
                tracing::warn!(
                    code = err.code(),
                    "cannot re-read credential revocations: {err}"
                )
            }
        }
    }
}

async fn run_connection(
    core: Arc<Core>,
    device_id: String,
    credential_id: String,
    epoch: u64,
    socket: WebSocket,
) {
    let (mut sink, mut stream) = socket.split();
    let (out, mut rx) = mpsc::channel::<Outgoing>(OUTBOUND_QUEUE_MAX);
    let conn = Arc::new(DeviceConnection {
        device_id,
        conn_id: NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed),
        epoch,
        credential_id,
        out,
        state: Mutex::new(ConnState::default()),
    });
    if let Err(code) = install(&core, conn.clone()) {
        let _ = sink
            .send(WsMessage::Close(Some(CloseFrame {
                code: 1013,
                reason: code.into(),
            })))
            .await;
        return;
    }
    // Dropped when the writer stops (after Core's Close, or a dead socket): the reader
    // then waits at most CLOSE_HANDSHAKE_TIMEOUT for the peer's Close and lets the TCP
    // connection go, so a peer that never answers cannot keep it open.
    let (writer_done, mut writer_stopped) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        let _writer_done = writer_done;
        while let Some(item) = rx.recv().await {
            match item {
                Outgoing::Text(text) => {
                    if sink.send(WsMessage::Text(text.into())).await.is_err() {
                        return;
                    }
                }
                Outgoing::Close(code, reason) => {
                    let _ = sink
                        .send(WsMessage::Close(Some(CloseFrame {
                            code,
                            reason: reason.into(),
                        })))
                        .await;
                    return;
                }
            }
        }
    });
    tracing::info!(device_id = %conn.device_id, epoch, "daemon connected");
    // A revocation that landed between the credential check and the install found no
    // connection to end: checked once more now that this one is visible to it.
    let id = conn.credential_id.clone();
    let revoked = core
        .store
        .call(|s| s.list_credentials())
        .await
        .is_ok_and(|all| {
            all.iter()
                .any(|c| c.credential_id == id && c.revoked_at_ms.is_some())
        });
    if revoked {
        end_revoked(&core, &HashSet::from([id]));
    }
    loop {
        let message = tokio::select! {
            message = stream.next() => message,
            _ = &mut writer_stopped => {
                let _ = tokio::time::timeout(CLOSE_HANDSHAKE_TIMEOUT, async {
                    while let Some(Ok(message)) = stream.next().await {
                        if matches!(message, WsMessage::Close(_)) {
                            break;
                        }
                    }
                })
                .await;
                break;
            }
        };
        let Some(message) = message else { break };
        let violation = match message {
            Err(err) => match read_violation(err) {
                Ok(violation) => Some(violation),
                Err(err) => {
                    tracing::warn!(device_id = %conn.device_id, "connection error: {err}");
                    break;
                }
            },
            Ok(WsMessage::Text(text)) => dispatch(&core, &conn, text.as_bytes()).await,
            Ok(WsMessage::Binary(_)) => Some((CLOSE_INVALID_PAYLOAD, "binary_message".to_string())),
            Ok(WsMessage::Close(_)) => break,
            Ok(_) => None,
        };
        if conn.is_closed() {
            break;
        }
        if let Some((code, reason)) = violation {
            tracing::warn!(device_id = %conn.device_id, close_code = code, %reason, "closing the daemon connection");
            drop_connection(&core, &conn);
            let _ = conn.out.send(Outgoing::Close(code, reason)).await;
            break;
        }
    }
    drop_connection(&core, &conn);
    let _ = conn.out.try_send(Outgoing::Close(1000, String::new()));
    let _ = writer.await;
    core.wake.notify_one();
    tracing::info!(device_id = %conn.device_id, epoch, "daemon connection ended");
}

/// A failed read the Runtime caused with what it sent, as the close it gets (the same as
/// the Runtime's for the same input): a message over [`TRANSPORT_FRAME_MAX_BYTES`] (and
/// [`FRAME_READ_SLACK_BYTES`]) closes
/// with 1009 `frame_too_large`, a text message that is not UTF-8 with 1007
/// `malformed_json`. `Err` is any other failure (the connection is gone).
fn read_violation(err: axum::Error) -> Result<(u16, String), String> {
    let inner = err.into_inner();
    match inner.downcast_ref::<axum_tungstenite::Error>() {
        Some(axum_tungstenite::Error::Capacity(_)) => Ok((
            CLOSE_TOO_BIG,
            WireError::FrameTooLarge {
                size: TRANSPORT_FRAME_MAX_BYTES + 1,
                limit: TRANSPORT_FRAME_MAX_BYTES,
            }
            .code()
            .to_string(),
        )),
        Some(axum_tungstenite::Error::Utf8(_)) => Ok((
            CLOSE_INVALID_PAYLOAD,
            WireError::Malformed("not UTF-8".into()).code().to_string(),
        )),
        _ => Err(inner.to_string()),
    }
}

/// Decodes and routes one Runtime frame; `Some((code, reason))` closes the transport.
async fn dispatch(
    core: &Arc<Core>,
    conn: &Arc<DeviceConnection>,
    bytes: &[u8],
) -> Option<(u16, String)> {
    let frame = match Frame::decode(bytes, Direction::RuntimeToCore) {
        Ok(frame) => frame,
        Err(err) => {
            // An invalid heartbeat clears the admission snapshot (it proves no native
            // outcome); every malformed frame closes the transport.
            if decode_envelope(bytes).is_ok_and(|e| e.kind == "heartbeat") {
                conn.lock().snapshot = None;
            }
            let code = if matches!(err, WireError::FrameTooLarge { .. }) {
                CLOSE_TOO_BIG
            } else {
                CLOSE_INVALID_PAYLOAD
            };
            return Some((code, err.code().to_string()));
        }
    };
    let route = |kind: RouteKind, id: &str| conn.lookup(kind, id);
    let target = match &frame.message {
        Message::Heartbeat(hb) => {
            // The connection snapshot follows the latest valid heartbeat; admitted
            // Turns keep the declaration they were admitted under.
            conn.lock().snapshot = Some(hb.supported_agent_kinds.to_vec());
            core.wake.notify_one();
            return None;
        }
        Message::PreparationStatus(_) => route(RouteKind::Preparation, &frame.id),
        Message::RuntimePrepareResult(_)
        | Message::EnvironmentQuiesced(_)
        | Message::EnvironmentResumed(_) => route(RouteKind::Transfer, &frame.id),
        Message::WorkspaceReadResult(_)
        | Message::WorkspaceWriteResult(_)
        | Message::WorkspaceExportResult(_) => route(RouteKind::Operation, &frame.id),
        Message::PermissionCancel(_) => route(RouteKind::Interaction, &frame.id),
        Message::InteractionDecisionAck(_) => {
            route(RouteKind::Interaction, &frame.id).or_else(|| route(RouteKind::Run, &frame.id))
        }
        Message::Delta(_)
        | Message::Thinking(_)
        | Message::OutputMessage(_)
        | Message::ToolCall(_)
        | Message::Usage(_)
        | Message::Error(_)
        | Message::Done(_)
        | Message::PermissionRequest(_)
        | Message::PromptForUserChoice(_)
        | Message::FunctionCall(_)
        | Message::PromptSteerAck(_) => route(RouteKind::Run, &frame.id),
        other => {
            tracing::debug!(
                kind = other.message_type().as_str(),
                "frame of an operation Core did not start; ignored"
            );
            None
        }
    };
    match target {
        Some(turn_id) => {
            let sender = core
                .turns
                .lock()
                .ok()
                .and_then(|t| t.get(&turn_id).cloned());
            if let Some(tx) = sender {
                deliver(conn, &turn_id, tx, frame).await;
            }
        }
        None => {
            tracing::debug!(id = %frame.id, kind = frame.message.message_type().as_str(), "no route for frame; ignored")
        }
    }
    None
}

/// Queues `frame` for the Turn task behind `tx`, waiting while its queue is full (the
/// connection is not read meanwhile: backpressure to the Runtime) for at most
/// [`DELIVERY_STALL_MAX`]; `false` when the Turn task took nothing for that long. Then
/// the frame is dropped, every route of the Turn is removed (later frames find no
/// route) and [`TurnMsg::Overflow`] is delivered once space frees, so the Turn closes
/// its subscription explicitly.
async fn deliver(
    conn: &DeviceConnection,
    turn_id: &str,
    tx: mpsc::Sender<TurnMsg>,
    frame: Frame,
) -> bool {
    deliver_within(conn, turn_id, tx, frame, DELIVERY_STALL_MAX).await
}

async fn deliver_within(
    conn: &DeviceConnection,
    turn_id: &str,
    tx: mpsc::Sender<TurnMsg>,
    frame: Frame,
    stall_max: std::time::Duration,
) -> bool {
    // Sent, or the Turn task is gone (nothing to deliver to).
    if tokio::time::timeout(stall_max, tx.send(TurnMsg::Frame(Box::new(frame))))
        .await
        .is_ok()
    {
        return true;
    }
    // Subscriber overflow: close this Turn's subscription explicitly.
    conn.unroute_turn(turn_id);
    tokio::spawn(async move {
        let _ = tx.send(TurnMsg::Overflow).await;
    });
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core_runtime::gateway::TURN_QUEUE_MAX;

    /// A connection of `device-1` whose writer queue is never read.
    fn test_connection() -> (DeviceConnection, mpsc::Receiver<Outgoing>) {
        let (out, out_rx) = mpsc::channel(1);
        let conn = DeviceConnection {
            device_id: "device-1".into(),
            conn_id: 1,
            epoch: 1,
            credential_id: "cred-1".into(),
            out,
            state: Mutex::default(),
        };
        (conn, out_rx)
    }

    fn frame(run: &str) -> Frame {
        let text = json!({"type": "delta", "id": run, "payload": {"text": "x"}}).to_string();
        Frame::decode(text.as_bytes(), Direction::RuntimeToCore).expect("valid delta")
    }

    /// A Turn task that takes nothing (its receiver is held, not polled) fills its
    /// bounded queue; the next frame waits out the stall bound (shortened here) and is
    /// not queued, the Turn's routes are dropped (so further frames are not routed) and
    /// `Overflow` follows the queued frames: the explicit observation error, not an
    /// invented frame.
    #[tokio::test]
    async fn a_stuck_turn_task_unroutes_the_turn_and_delivers_overflow() {
        let (conn, _out_rx) = test_connection();
        assert!(conn.route(RouteKind::Run, "run-1", "turn-1"));
        let (tx, mut rx) = mpsc::channel(TURN_QUEUE_MAX);
        let stall = std::time::Duration::from_millis(20);
        for _ in 0..TURN_QUEUE_MAX {
            assert!(deliver_within(&conn, "turn-1", tx.clone(), frame("run-1"), stall).await);
        }
        assert_eq!(
            conn.lookup(RouteKind::Run, "run-1").as_deref(),
            Some("turn-1")
        );
        // The consumer is stuck: the queue is full and stays full.
        assert!(!deliver_within(&conn, "turn-1", tx.clone(), frame("run-1"), stall).await);
        assert_eq!(conn.lookup(RouteKind::Run, "run-1"), None, "still routed");
        drop(tx);
        for i in 0..TURN_QUEUE_MAX {
            let msg = rx.recv().await;
            assert!(
                matches!(msg, Some(TurnMsg::Frame(_))),
                "message {i}: {msg:?}"
            );
        }
        let msg = rx.recv().await;
        assert!(matches!(msg, Some(TurnMsg::Overflow)), "{msg:?}");
        // Nothing else: the overflowed frame was not queued, no frame was invented.
        assert!(rx.recv().await.is_none());
    }

    /// A slow Turn task is waited for, never overflowed: the reader stops (backpressure)
    /// until the task takes a frame, and every frame arrives, in order.
    #[tokio::test]
    async fn a_slow_turn_task_gets_every_frame_through_backpressure() {
        let (conn, _out_rx) = test_connection();
        assert!(conn.route(RouteKind::Run, "run-1", "turn-1"));
        let (tx, mut rx) = mpsc::channel(4);
        let total = 64;
        let consumer = tokio::spawn(async move {
            let mut seen = 0;
            while let Some(msg) = rx.recv().await {
                assert!(matches!(msg, TurnMsg::Frame(_)), "{msg:?}");
                seen += 1;
                tokio::task::yield_now().await;
            }
            seen
        });
        for _ in 0..total {
            assert!(deliver(&conn, "turn-1", tx.clone(), frame("run-1")).await);
        }
        drop(tx);
        assert_eq!(consumer.await.unwrap(), total);
        assert_eq!(
            conn.lookup(RouteKind::Run, "run-1").as_deref(),
            Some("turn-1")
        );
    }
}
