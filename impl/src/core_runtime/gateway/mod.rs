//! Core's gateway: the machine-connection API, the daemon WebSocket, scheduling and
//! the public API (`contract-impl core serve`).
//!
//! * [`admission`]: capability table, opt-in table, Agent definition (I/O-free).
//! * [`config`]: Core's launch configuration (timers, engine profiles).
//! * [`connection`]: bootstrap, WebSocket upgrade (exact version or 426), fencing of
//!   the old owner lease, heartbeat snapshots, frame routing.
//! * [`turn`]: the five-step Turn execution, active input, cancel, interactions.
//! * [`files`]: Files reads: idle through the read-only preparation profile, or
//!   against the Session's running Run.
//! * [`files_export`]: idle Files exports (tar archives), same profile as reads.
//! * [`files_write`]: Files writes, durably reserved before admission.
//! * [`env_files`]: Environment file installation through `runtime_prepare` transfers.
//! * [`suspension`]: `environment_quiesce` / `environment_resume` (suspension fencing).
//! * [`api`]: the public HTTP JSON API under `/v1` (`docs/core-api.md`).
//! * [`credentials`]: listing and revoking a device's daemon credentials over the
//!   public API; a revocation ends the credential's live connections.
//! * [`http`]: the HTTP listener: connection bound, header and write-stall timeouts,
//!   the budget of answer bytes in flight.
//! * [`cli`]: `contract-impl core serve` and `core credential issue|revoke|list`.
//!
//! [`Core`] is the shared state; [`serve`] binds the listener and runs everything.

pub mod admission;
pub mod api;
pub mod cli;
pub mod config;
pub mod connection;
pub mod credentials;
pub mod env_files;
pub mod extract;
pub mod files;
pub mod files_export;
pub mod files_write;
pub mod http;
pub mod suspension;
pub mod turn;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, mpsc};

use crate::core_runtime::store::{CoreStore, StoreError};
pub use config::{CoreConfig, CoreConfigError};
pub use connection::DeviceConnection;
pub use http::{HTTP_WRITE_STALL_TIMEOUT, serve_http};

/// Bound on concurrently connected devices.
pub const DEVICES_MAX: usize = 1024;

/// How long Core's HTTP listener waits for the complete header block of a request,
/// counted from when it starts reading one, which on a fresh or an idle keep-alive
/// connection is when it was accepted or the previous answer was sent: a socket with
/// half-sent headers, or one that sends nothing, is closed after this (daemon policy).
/// An upgraded WebSocket is not bound by it (heartbeats show its liveness).
pub const HTTP_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on HTTP connections Core serves at once; further ones wait in the listen
/// backlog (daemon policy).
pub const HTTP_CONNECTIONS_MAX: usize = 1024;

/// Bound on Turns executing at once (Core's active-Turn concurrency limit).
pub const ACTIVE_TURNS_MAX: usize = 256;

/// Queued Turns one scheduler pass looks at.
pub const SCHEDULER_BATCH: u32 = 64;

/// Longest the scheduler sleeps without a wake-up (a safety net: every state change
/// that can make a Turn claimable wakes it explicitly).
pub const SCHEDULER_IDLE: Duration = Duration::from_secs(1);

/// Milliseconds since the Unix epoch (the store's clock).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The store shared by every task; calls run on the blocking pool.
#[derive(Clone)]
pub struct StoreHandle(Arc<Mutex<Box<dyn CoreStore>>>);

impl StoreHandle {
    /// Wraps a store.
    pub fn new(store: Box<dyn CoreStore>) -> Self {
        Self(Arc::new(Mutex::new(store)))
    }

    /// Runs `f` with the store on the blocking pool (each store call is one transaction).
    ///
    /// # Errors
    /// `f`'s error, or [`StoreError::Database`] if the store lock was poisoned or the
    /// blocking task failed.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut dyn CoreStore) -> Result<R, StoreError> + Send + 'static,
    {
        let inner = self.0.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = inner
                .lock()
                .map_err(|_| StoreError::Database("store lock poisoned".into()))?;
            f(guard.as_mut())
        })
        .await
        .map_err(|e| StoreError::Database(format!("store task failed: {e}")))?
    }
}

/// A message to a running Turn task.
#[derive(Debug)]
pub enum TurnMsg {
    /// A frame routed to this Turn (by preparation request ID, Run ID or interaction ID).
    Frame(Box<crate::core_runtime::wire::Frame>),
    /// The physical connection ended (closed, dropped or fenced by a replacement).
    ConnectionLost,
    /// The Turn's queue overflowed: frames were lost.
    Overflow,
    /// Durable state changed (cancel requested, input queued, interaction answered).
    Wake,
}

/// Bound on frames queued for one Turn task. A full queue stops the connection's reader
/// (backpressure: the Runtime's bounded outbound queue, then the program's output pipe,
/// slow down) for at most [`DELIVERY_STALL_MAX`]; only a Turn task that takes nothing for
/// that long overflows its subscription.
pub const TURN_QUEUE_MAX: usize = 1024;

/// Longest the connection's reader waits for a Turn task to take a frame from its full
/// queue before the subscription is closed as overflowed ("Faults, retries and cleanup":
/// an overflowing subscriber is closed explicitly): a bound on a stuck Turn task, never
/// reached by a merely slow one.
pub const DELIVERY_STALL_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Most output events a Turn task stores in one transaction (group commit).
pub const EVENT_BATCH_MAX: usize = 512;

/// Shared Core state.
pub struct Core {
    /// Durable records.
    pub store: StoreHandle,
    /// Launch configuration.
    pub config: CoreConfig,
    /// The current connection of each device.
    pub devices: Mutex<HashMap<String, Arc<DeviceConnection>>>,
    /// Running Turn tasks by Turn ID.
    pub turns: Mutex<HashMap<String, mpsc::Sender<TurnMsg>>>,
    /// Sessions held by a Files operation's scheduling reservation: the scheduler
    /// claims none of their Turns until it ends.
    pub files_reserved: Mutex<HashSet<String>>,
    /// Write reservations whose `workspace_write` task runs in this process; a reserved
    /// write not in this set is `unknown` ([`files_write`]).
    pub writes_in_flight: Mutex<HashSet<String>>,
    /// Wakes the scheduler.
    pub wake: Notify,
    /// Base URL (`http://127.0.0.1:<port>`), known once bound.
    pub base_url: String,
    /// SHA-256 of the Project API key every public `/v1` request presents as
    /// `Authorization: Bearer <key>` ([`api::require_api_key`]).
    pub api_key_digest: [u8; 32],
    /// The budget of answer bytes held for readers ([`http::ResponseBudget`]).
    pub response_budget: http::ResponseBudget,
}

impl Core {
    /// Sends `msg` to a Turn task if it runs; `false` otherwise (or when its queue is
    /// full: only for [`TurnMsg::Wake`], which a busy Turn task does not need, since it
    /// re-reads durable state after every message).
    pub fn notify_turn(&self, turn_id: &str, msg: TurnMsg) -> bool {
        let sender = self.turns.lock().ok().and_then(|t| t.get(turn_id).cloned());
        match sender {
            Some(tx) => tx.try_send(msg).is_ok(),
            None => false,
        }
    }

    /// Sends `msg` to a Turn task if it runs, waiting for queue space on a spawned
    /// task when the queue is full: for messages that must not be lost
    /// ([`TurnMsg::ConnectionLost`]: without it a Turn whose routes were dropped would
    /// wait forever).
    pub fn notify_turn_reliably(&self, turn_id: &str, msg: TurnMsg) {
        let sender = self.turns.lock().ok().and_then(|t| t.get(turn_id).cloned());
        if let Some(tx) = sender
            && let Err(mpsc::error::TrySendError::Full(msg)) = tx.try_send(msg)
        {
            tokio::spawn(async move {
                let _ = tx.send(msg).await;
            });
        }
    }
}

/// Binds `listen`, recovers the store, starts the scheduler and serves until the
/// process ends. `ready` is called with the base URL once listening.
///
/// # Errors
/// Bind or recovery failures, as text.
pub async fn serve(
    listen: &str,
    store: Box<dyn CoreStore>,
    config: CoreConfig,
    api_key: &str,
    ready: impl FnOnce(&str),
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let store = StoreHandle::new(store);
    let report = store
        .call(|s| s.recover(now_ms()))
        .await
        .map_err(|e| format!("recovery failed: {e}"))?;
    if report != Default::default() {
        tracing::warn!(
            delivery_unknown = report.delivery_unknown.len(),
            stream_incomplete = report.stream_incomplete.len(),
            inputs_unknown = report.inputs_unknown,
            "restart recovery: unsettled work recorded as unknown, nothing replayed"
        );
    }
    let response_budget = http::ResponseBudget::new(
        config
            .response_bytes_in_flight
            .unwrap_or(http::RESPONSE_BYTES_IN_FLIGHT_MAX),
    );
    let core = Arc::new(Core {
        store,
        config,
        devices: Mutex::new(HashMap::new()),
        turns: Mutex::new(HashMap::new()),
        files_reserved: Mutex::new(HashSet::new()),
        writes_in_flight: Mutex::new(HashSet::new()),
        wake: Notify::new(),
        base_url: format!("http://{addr}"),
        api_key_digest: api::key_digest(api_key),
        response_budget,
    });
    tokio::spawn(turn::scheduler(core.clone()));
    tokio::spawn(connection::recheck_revocations(core.clone()));
    let app = connection::routes()
        .merge(
            api::routes().route_layer(axum::middleware::from_fn_with_state(
                core.clone(),
                api::require_api_key,
            )),
        )
        .fallback(api::no_route)
        .method_not_allowed_fallback(api::wrong_method)
        .with_state(core.clone());
    ready(&core.base_url);
    let write_stall = core.config.timers.http_write_stall;
    serve_http(listener, app, HTTP_HEADER_READ_TIMEOUT, write_stall).await;
    Ok(())
}

#[cfg(test)]
mod http_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves a one-route app with a `header_timeout` of 100 ms; its address.
    async fn server() -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        tokio::spawn(serve_http(
            listener,
            app,
            Duration::from_millis(100),
            HTTP_WRITE_STALL_TIMEOUT,
        ));
        addr
    }

    /// Reads until the server closes the connection (bounded: a hang fails the test).
    async fn read_to_close(stream: &mut tokio::net::TcpStream) -> String {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
            .await
            .expect("the server kept the connection open")
            .ok();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn half_sent_headers_and_silent_sockets_are_closed() {
        let addr = server().await;
        let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let answered = read_to_close(&mut half).await;
        assert!(!answered.contains(" 200 "), "{answered}");
        read_to_close(&mut silent).await;
        // A whole request is still answered, and the idle keep-alive connection after
        // it is closed the same way.
        let mut whole = tokio::net::TcpStream::connect(addr).await.unwrap();
        whole
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let answered = read_to_close(&mut whole).await;
        assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    }
}
