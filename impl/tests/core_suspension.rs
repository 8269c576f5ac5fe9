//! Integration tests of the suspension API of `contract-impl core serve`
//! (`POST /v1/environments/{id}/quiesce|resume`): the refusals before any Runtime
//! work. Forwarding and connection loss are side-core scenarios (`quiesce_resume`,
//! `quiesce_rejections`, `core_quiesce_connection_lost`).

mod common;

use common::Core;
use serde_json::{Value, json};

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let resp = common::api_client()
        .post(format!("{base}/v1{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

// Stays a Rust test: public-API request validation only (no Core <-> Runtime frame), for which the protocol catalog has no requirement a scenario could cite.
#[tokio::test(flavor = "multi_thread")]
async fn suspension_refusals_before_any_runtime_frame() {
    let core = Core::start("");
    let api = core.api();
    let session = api.session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();

    // No device connected.
    let (status, body) = post(
        &core.base,
        &format!("/environments/{env}/quiesce"),
        json!({}),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (503, Some("no_device")));

    // Bad requests before any frame.
    let (status, body) = post(
        &core.base,
        &format!("/environments/{env}/resume"),
        json!({}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, body) = post(
        &core.base,
        &format!("/environments/{env}/resume"),
        json!({"suspension_id": ""}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, _) = post(&core.base, "/environments/nope/quiesce", json!({})).await;
    assert_eq!(status, 404);
    let none = api.session("controlled", "none").await;
    let (status, body) = post(
        &core.base,
        &format!("/environments/{}/quiesce", none.environment_id),
        json!({}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("no_workspace"))
    );
}
