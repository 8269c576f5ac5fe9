//! Request extractors of the public API whose refusals are the API's own typed errors.
//!
//! axum's `Path`, `Query` and `Bytes` extractors answer a bad path segment, a bad query
//! string or an over-long body with a `text/plain` body of their own; the public API
//! promises `{"error", "message"}` JSON for every refusal (docs/core-api.md, "Public
//! API"), so every `/v1` handler takes these wrappers instead. This module owns only the
//! mapping of extractor refusals; it must never decide anything about the request itself.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::api::ApiError;

/// Path parameters; a segment that does not decode (e.g. percent-encoded bytes that
/// are not UTF-8) is `400 invalid_request`.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(value)| Self(value))
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    format!("path: {}", e.body_text()),
                )
            })
    }
}

/// The query string, decoded strictly (unknown parameters and malformed values are
/// `400 invalid_request`).
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // The form decoder replaces bytes that are not UTF-8 with U+FFFD: refuse them
        // instead, so `path=%FF` never names a file called "\u{FFFD}".
        if let Some(query) = parts.uri.query()
            && !decodes_to_utf8(query)
        {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "query: a percent-encoded value is not UTF-8",
            ));
        }
        Query::<T>::try_from_uri(&parts.uri)
            .map(|Query(value)| Self(value))
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    format!("query: {}", e.body_text()),
                )
            })
    }
}

/// How long a request body may take to arrive in full (daemon policy): past it the
/// request is `408 request_timeout` and the connection is not reused.
pub const HTTP_BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether every `&`-separated part of a query string, percent-decoded, is UTF-8 (a `%`
/// not followed by two hex digits is kept as is, as the form decoder does).
fn decodes_to_utf8(query: &str) -> bool {
    query.split('&').all(|part| {
        let bytes = part.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let hex = |b: u8| char::from(b).to_digit(16);
            match (
                bytes[i],
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) {
                (b'%', Some(hi), Some(lo)) => {
                    out.push(u8::try_from(hi * 16 + lo).unwrap_or(0));
                    i += 3;
                }
                (b, ..) => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        std::str::from_utf8(&out).is_ok()
    })
}

/// How much of a body past its route's bound Core still reads, and discards, before it
/// answers `413` (bytes, daemon policy). A socket closed with unread data resets the
/// connection, and a client still sending then loses the answer; reading the rest first
/// delivers it. A body declared (`Content-Length`) or found longer than the bound plus
/// this is answered at once.
pub const REFUSED_BODY_DRAIN_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The body bound of a route (bytes), set as a request extension beside the route's
/// `DefaultBodyLimit`; [`ApiBody`] reads at most this much (default
/// [`super::api::BODY_MAX_BYTES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyBound(pub usize);

/// The whole request body; over the route's body bound ([`BodyBound`]) it is
/// `413 request_too_large` (not parsed; the rest of the body read and discarded up to
/// [`REFUSED_BODY_DRAIN_MAX_BYTES`]), past [`HTTP_BODY_READ_TIMEOUT`] `408
/// request_timeout`, any other failure to read it `400 invalid_request`.
pub struct ApiBody(pub Bytes);

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        "the request body is over this route's bound",
    )
}

/// Reads `body` whole when it is at most `bound` bytes; past it, reads on and discards
/// up to [`REFUSED_BODY_DRAIN_MAX_BYTES`] more, then refuses it.
async fn read_bounded(body: axum::body::Body, bound: usize) -> Result<Bytes, ApiError> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut kept: Vec<u8> = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.to_string())
        })?;
        seen = seen.saturating_add(chunk.len());
        if seen <= bound {
            kept.extend_from_slice(&chunk);
        } else if seen > bound.saturating_add(REFUSED_BODY_DRAIN_MAX_BYTES) {
            break;
        } else {
            kept = Vec::new();
        }
    }
    if seen > bound {
        return Err(too_large());
    }
    Ok(Bytes::from(kept))
}

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let bound = request
            .extensions()
            .get::<BodyBound>()
            .map_or(super::api::BODY_MAX_BYTES, |b| b.0);
        let declared = request
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > (bound.saturating_add(REFUSED_BODY_DRAIN_MAX_BYTES)) as u64)
        {
            return Err(too_large());
        }
        tokio::time::timeout(
            HTTP_BODY_READ_TIMEOUT,
            read_bounded(request.into_body(), bound),
        )
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} s",
                    HTTP_BODY_READ_TIMEOUT.as_secs()
                ),
            )
        })?
        .map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::{decodes_to_utf8, read_bounded};
    use axum::http::StatusCode;

    fn chunked(sizes: &[usize]) -> axum::body::Body {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            sizes.iter().map(|&n| Ok(vec![b'x'; n])).collect();
        axum::body::Body::from_stream(futures_util::stream::iter(chunks))
    }

    #[tokio::test]
    async fn a_body_at_its_bound_is_read_and_one_past_it_is_read_to_its_end_and_refused() {
        let at = read_bounded(chunked(&[6, 4]), 10)
            .await
            .map_err(|e| e.status);
        assert_eq!(at.map(|b| b.len()), Ok(10));
        let past = read_bounded(chunked(&[6, 5]), 10)
            .await
            .map_err(|e| e.status);
        assert_eq!(past.map(|b| b.len()), Err(StatusCode::PAYLOAD_TOO_LARGE));
        // The rest of a refused body is drained, not answered over: a long tail is read.
        let tail = read_bounded(chunked(&[11, 1 << 20, 1 << 20]), 10)
            .await
            .map_err(|e| e.status);
        assert_eq!(tail.map(|b| b.len()), Err(StatusCode::PAYLOAD_TOO_LARGE));
    }

    #[test]
    fn a_query_that_decodes_to_bytes_not_utf8_is_refused() {
        assert!(decodes_to_utf8("path=src%2Fmain.rs&x=%C3%A9"));
        assert!(decodes_to_utf8("path=100%25&odd=%zz%4"));
        assert!(!decodes_to_utf8("path=%FF"));
        assert!(!decodes_to_utf8("a=b&path=%C3"));
        assert!(!decodes_to_utf8("%FE=x"));
    }
}
