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

/// Longest deadline a call may ask for, milliseconds: a call asking for a longer one is
/// refused before its handler runs ([`check_deadline`]).
pub const MAX_DEADLINE_MS: u64 = 600_000;

/// Most events in one StreamEvents page.
pub const MAX_PAGE_EVENTS: u32 = 512;

/// Most encoded event bytes in one StreamEvents page by default (`serve --page-bytes`
/// sets another bound; a page always holds at least one event).
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

/// The deadline a call asks for in its `grpc-timeout` header: `None` without one.
///
/// # Errors
/// `invalid_deadline` (`INVALID_ARGUMENT`) for a header that is not `<1-8 digits><H|M|S|m|u|n>`.
pub fn requested_timeout(
    metadata: &tonic::metadata::MetadataMap,
) -> Result<Option<std::time::Duration>, tonic::Status> {
    let Some(value) = metadata.get("grpc-timeout") else {
        return Ok(None);
    };
    let bad = || {
        tonic::Status::invalid_argument(
            "invalid_deadline: grpc-timeout must be 1-8 digits and a unit",
        )
    };
    let text = value.to_str().map_err(|_| bad())?;
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    Ok(Some(match unit {
        "H" => std::time::Duration::from_secs(n.saturating_mul(3600)),
        "M" => std::time::Duration::from_secs(n.saturating_mul(60)),
        "S" => std::time::Duration::from_secs(n),
        "m" => std::time::Duration::from_millis(n),
        "u" => std::time::Duration::from_micros(n),
        "n" => std::time::Duration::from_nanos(n),
        _ => return Err(bad()),
    }))
}

/// The deadline limit ("Every unary/stream request has [...] deadline limits"): a call
/// asking for a deadline longer than [`MAX_DEADLINE_MS`] (`max_deadline_ms`, "the
/// longest deadline a call may ask for") is refused `INVALID_ARGUMENT`
/// (`deadline_too_long`), unary and streaming alike; exactly the limit is served.
///
/// # Errors
/// `deadline_too_long`, or `invalid_deadline` for an unreadable header.
pub fn check_deadline(metadata: &tonic::metadata::MetadataMap) -> Result<(), tonic::Status> {
    match requested_timeout(metadata)? {
        Some(t) if t > std::time::Duration::from_millis(MAX_DEADLINE_MS) => {
            Err(tonic::Status::invalid_argument(format!(
                "deadline_too_long: the call asks for a deadline of {} ms, over the limit of {MAX_DEADLINE_MS} ms",
                t.as_millis()
            )))
        }
        _ => Ok(()),
    }
}

/// The rewrite of tonic's two decoder refusals, shared with the plugin family.
pub use crate::grpc::size_status;

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(timeout: &str) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert("grpc-timeout", timeout.parse().unwrap());
        m
    }

    #[test]
    fn a_deadline_over_the_limit_is_refused_and_the_limit_served() {
        assert!(check_deadline(&tonic::metadata::MetadataMap::new()).is_ok());
        assert!(check_deadline(&metadata("600000m")).is_ok());
        assert!(check_deadline(&metadata("10M")).is_ok());
        let over = check_deadline(&metadata("600001m")).unwrap_err();
        assert_eq!(over.code(), tonic::Code::InvalidArgument);
        assert!(
            over.message().starts_with("deadline_too_long: "),
            "{over:?}"
        );
        assert!(check_deadline(&metadata("1H")).is_err());
        let bad = check_deadline(&metadata("123456789m")).unwrap_err();
        assert!(bad.message().starts_with("invalid_deadline: "), "{bad:?}");
    }
}
