//! A device's daemon credentials on the public API (Core's own routes; the spec's
//! "Ownership and connection" leaves issuing and revoking to the machine-connection
//! API's owner, so the shapes here are Core's choice, `docs/core-api.md`).
//!
//! * `GET /v1/devices/{device_id}/credentials` → `200 {"credentials": [{"credential_id",
//!   "prefix", "created_at_ms", "revoked_at_ms"}]}` (never a secret or hash); `404
//!   not_found` for an unknown device.
//! * `POST /v1/devices/{device_id}/credentials/{credential_id}/revoke` → `200
//!   {"credential_id", "revoked_at_ms", "connections_ended"}`; `404 not_found` when the
//!   device has no such credential; `409 already_revoked` for a revoked one. Every live
//!   connection upgraded with the credential is closed at once
//!   ([`super::connection::end_revoked`]); bootstrap and upgrade refuse it from then on.
//!
//! This module must never return or log a secret: only IDs and the listed prefix.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::api::{ApiError, ApiResult};
use super::connection::end_revoked;
use super::extract::ApiPath;
use super::{Core, now_ms};

/// The credential routes (mounted behind the Project API key check).
pub fn routes() -> Router<Arc<Core>> {
    Router::new()
        .route("/v1/devices/{id}/credentials", get(list))
        .route(
            "/v1/devices/{id}/credentials/{credential_id}/revoke",
            post(revoke),
        )
}

fn unknown_credential(device_id: &str, credential_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        format!("device {device_id} has no credential {credential_id}"),
    )
}

async fn list(State(core): State<Arc<Core>>, ApiPath(device_id): ApiPath<String>) -> ApiResult {
    let device = device_id.clone();
    core.store.call(move |s| s.owner_epoch(&device)).await?;
    let all = core.store.call(|s| s.list_credentials()).await?;
    let credentials: Vec<_> = all
        .into_iter()
        .filter(|c| c.device_id == device_id)
        .map(|c| {
            json!({
                "credential_id": c.credential_id,
                "prefix": c.prefix,
                "created_at_ms": c.created_at_ms,
                "revoked_at_ms": c.revoked_at_ms,
            })
        })
        .collect();
    Ok(Json(json!({ "credentials": credentials })).into_response())
}

async fn revoke(
    State(core): State<Arc<Core>>,
    ApiPath((device_id, credential_id)): ApiPath<(String, String)>,
) -> ApiResult {
    let all = core.store.call(|s| s.list_credentials()).await?;
    let Some(found) = all
        .into_iter()
        .find(|c| c.device_id == device_id && c.credential_id == credential_id)
    else {
        return Err(unknown_credential(&device_id, &credential_id));
    };
    if found.revoked_at_ms.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_revoked",
            "the credential is already revoked",
        ));
    }
    let now = now_ms();
    let id = credential_id.clone();
    if !core
        .store
        .call(move |s| s.revoke_credential(&id, now))
        .await?
    {
        // Revoked by another process between the read and the write.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_revoked",
            "the credential is already revoked",
        ));
    }
    let ended = end_revoked(&core, &HashSet::from([credential_id.clone()]));
    Ok(Json(json!({
        "credential_id": credential_id,
        "revoked_at_ms": now,
        "connections_ended": ended,
    }))
    .into_response())
}
