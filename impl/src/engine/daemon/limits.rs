//! The daemon's bounds ("Bounds and backpressure": "Every unary/stream request has
//! encoded-byte, collection-count, and deadline limits. Server queues are bounded."). The
//! spec fixes no numbers; these are ours, advertised in `Initialize` and `Health`.

use crate::engine::proto::common::v1::MessageLimits;

/// Largest encoded request message, bytes (enforced by the gRPC decoder, unary and
/// streaming alike).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Largest encoded response or stream message, bytes.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Most elements of any repeated field in one request.
pub const MAX_COLLECTION_COUNT: u32 = 256;

/// Longest deadline a call may ask for, milliseconds.
pub const MAX_DEADLINE_MS: u64 = 600_000;

/// Most events in one StreamEvents page.
pub const MAX_PAGE_EVENTS: u32 = 512;

/// Most encoded event bytes in one StreamEvents page.
pub const MAX_PAGE_BYTES: u64 = 1024 * 1024;

/// Events retained per run for replay.
pub const RETAINED_EVENTS_PER_RUN: u64 = 100_000;

/// Idle time after which the daemon pings a connection (HTTP/2 keepalive).
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a ping may go unanswered before the connection is closed: a peer that stopped
/// reading its socket is disconnected after at most interval + timeout.
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long connections may take to finish after SIGTERM before the daemon exits anyway.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The limits as `Initialize` reports them.
pub fn message_limits() -> MessageLimits {
    MessageLimits {
        max_request_bytes: MAX_REQUEST_BYTES as u64,
        max_response_bytes: MAX_RESPONSE_BYTES as u64,
        max_collection_count: MAX_COLLECTION_COUNT,
        max_deadline_ms: MAX_DEADLINE_MS,
        max_page_events: MAX_PAGE_EVENTS,
        max_page_bytes: MAX_PAGE_BYTES,
    }
}

/// The message tonic's decoder gives a request over [`MAX_REQUEST_BYTES`].
const OVERSIZE_TEXT: &str = "message length too large";

/// Rewrites two refusals tonic's decoder makes before any handler runs (so the rewrite is
/// on the response): a request over the size limit, `OUT_OF_RANGE` → `RESOURCE_EXHAUSTED`
/// (the code gRPC gives a message over the receiver's limit), and a payload that does not
/// decode, `INTERNAL` → `INVALID_ARGUMENT`. Nothing else is touched.
pub fn size_status<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    let oversize = headers.get("grpc-status").is_some_and(|v| v == "11")
        && headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|m| {
                m.contains(OVERSIZE_TEXT) || m.contains("message%20length%20too%20large")
            });
    if oversize {
        headers.insert("grpc-status", http::HeaderValue::from_static("8"));
    }
    // A payload that is not the method's message is the caller's error, not ours.
    let malformed = headers.get("grpc-status").is_some_and(|v| v == "13")
        && headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|m| {
                m.contains("failed to decode Protobuf message")
                    || m.contains("failed%20to%20decode%20Protobuf%20message")
            });
    if malformed {
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    }
    response
}
