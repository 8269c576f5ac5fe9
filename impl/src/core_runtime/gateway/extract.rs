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

/// The whole request body; over the route's body bound it is `413 request_too_large`
/// (not parsed), past [`HTTP_BODY_READ_TIMEOUT`] `408 request_timeout`, any other failure
/// to read it `400 invalid_request`.
pub struct ApiBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let read =
            tokio::time::timeout(HTTP_BODY_READ_TIMEOUT, Bytes::from_request(request, state))
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
                })?;
        read.map(Self).map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request_too_large",
                    "the request body is over this route's bound",
                )
            } else {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::decodes_to_utf8;

    #[test]
    fn a_query_that_decodes_to_bytes_not_utf8_is_refused() {
        assert!(decodes_to_utf8("path=src%2Fmain.rs&x=%C3%A9"));
        assert!(decodes_to_utf8("path=100%25&odd=%zz%4"));
        assert!(!decodes_to_utf8("path=%FF"));
        assert!(!decodes_to_utf8("a=b&path=%C3"));
        assert!(!decodes_to_utf8("%FE=x"));
    }
}
