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

/// The whole request body; over the route's body bound it is `413 request_too_large`
/// (not parsed), any other failure to read it `400 invalid_request`.
pub struct ApiBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        Bytes::from_request(request, state)
            .await
            .map(Self)
            .map_err(|e| {
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
