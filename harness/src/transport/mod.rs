//! Transports over which the harness plays a peer.
//!
//! * [`http`]: a scripted HTTP server (`127.0.0.1:0`; the scripted Core of core_runtime) that turns every incoming
//!   request into an [`http::IncomingRequest`] event the family driver answers in order,
//!   including the WebSocket upgrade.
//! * [`client`]: the harness as a client of a target Core: HTTP requests and the
//!   WebSocket dial (side `core`).
//! * [`framed`]: 4-byte big-endian length-prefixed payloads over a Unix stream socket
//!   ([`framed::FrameDecoder`], [`framed::FramedConnection`]), the maximum given by the family.
//! * [`grpc`] / [`grpc_server`]: gRPC over a Unix socket with dynamic messages, as the
//!   client of a target daemon or as the daemon of a target client.
//! * [`relay`]: the link to `contract-harness peer relay`, the program the harness hands a
//!   target that launches its peer itself (stdio, dialled and accepted sockets).
//! * [`ws`]: one upgraded WebSocket connection ([`ws::WsConnection`]): a bounded event queue
//!   of what the peer sent, plus send / raw send / close / abrupt drop.
//!
//! This module owns sockets, tasks and every size and queue bound on them. It must never
//! interpret frames (no schema checks, no matching, no placeholders: that is the family
//! driver's job), never decide a response on its own (the driver scripts every answer),
//! and never panic on what a peer sends: a target may send anything.

pub mod client;
pub mod control;
pub mod framed;
pub mod grpc;
pub mod grpc_server;
pub mod http;
pub mod relay;
pub mod ws;

use std::time::Duration;

/// Largest HTTP request body the scripted server reads (bytes). A bootstrap body is a few
/// dozen bytes; anything over this is reported to the driver as
/// [`http::RequestBody::TooLarge`] instead of being buffered.
pub const HTTP_BODY_MAX_BYTES: usize = 64 * 1024;

/// Capacity of the scripted server's request queue (requests waiting for the driver). When
/// it is full the server stops answering new requests until the driver consumes one.
pub const HTTP_QUEUE_CAPACITY: usize = 16;

/// Most TCP connections the scripted server serves at once; further connections wait in the
/// listen backlog.
pub const HTTP_CONNECTIONS_MAX: usize = 16;

/// Capacity of one WebSocket connection's event queue (messages the driver has not read
/// yet). When full, the connection stops reading from the socket (TCP back-pressure).
pub const WS_EVENT_QUEUE_CAPACITY: usize = 32;

/// Failure of a transport operation. Every variant has a stable [`code`](Self::code).
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A listening socket (the scripted server's, a relay's) could not be bound.
    #[error("cannot bind a listening socket: {0}")]
    Bind(#[source] std::io::Error),
    /// The scripted server's task has stopped (no more requests can arrive).
    #[error("the scripted server has stopped")]
    Stopped,
    /// The driver tried to upgrade a request that is not a WebSocket upgrade request.
    #[error("the request is not a WebSocket upgrade request: {0}")]
    NotUpgradable(String),
    /// The HTTP upgrade was answered with 101 but the connection did not complete it.
    #[error("the WebSocket upgrade did not complete: {0}")]
    UpgradeFailed(String),
    /// The driver asked for a status code HTTP cannot carry.
    #[error("invalid HTTP status {0}")]
    InvalidStatus(u16),
    /// A message the harness was asked to send exceeds its connection's outgoing bound.
    #[error("outgoing message of {size} bytes exceeds the {limit}-byte bound")]
    OutgoingTooLarge {
        /// Size of the message (bytes).
        size: usize,
        /// The bound (bytes).
        limit: usize,
    },
    /// Writing to the WebSocket failed (the peer is gone or the socket broke).
    #[error("WebSocket send failed: {0}")]
    Send(String),
    /// An HTTP request or WebSocket dial of the client failed (bad URL, connection
    /// refused, broken handshake).
    #[error("client request failed: {0}")]
    Client(String),
    /// A response body exceeded the client's bound.
    #[error("response body exceeds the {limit}-byte bound")]
    ResponseTooLarge {
        /// The bound (bytes).
        limit: usize,
    },
    /// A transport operation did not finish in time.
    #[error("timed out after {}ms", .0.as_millis())]
    Timeout(Duration),
}

impl TransportError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            TransportError::Bind(_) => "bind_failed",
            TransportError::Stopped => "server_stopped",
            TransportError::NotUpgradable(_) => "not_upgradable",
            TransportError::UpgradeFailed(_) => "upgrade_failed",
            TransportError::InvalidStatus(_) => "invalid_status",
            TransportError::OutgoingTooLarge { .. } => "outgoing_too_large",
            TransportError::Send(_) => "send_failed",
            TransportError::Client(_) => "client_failed",
            TransportError::ResponseTooLarge { .. } => "response_too_large",
            TransportError::Timeout(_) => "timeout",
        }
    }
}
