//! Integration tests of the Files API of `contract-impl core serve` (idle reads via the
//! read-only preparation profile): the refusals before any Runtime work. The reads
//! themselves are side-core scenarios (`core_read_only_reservation_holds_turn`,
//! `workspace_read_*`, `core_refuses_workspace_read_preparation`).

mod common;

use common::Core;
use serde_json::Value;

async fn get(base: &str, path: &str) -> (u16, Value) {
    let resp = common::api_client()
        .get(format!("{base}/v1{path}"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

// Stays a Rust test: public-API request validation only (no Core <-> Runtime frame), for which the protocol catalog has no requirement a scenario could cite.
#[tokio::test(flavor = "multi_thread")]
async fn files_refusals_before_any_runtime_work() {
    let core = Core::start("");
    let api = core.api();
    let none = api.session("controlled", "none").await;
    let (status, body) = get(&core.base, &format!("/sessions/{}/files", none.session_id)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("no_workspace"))
    );
    let local = api.session("controlled", "self_hosted").await;
    let (status, body) = get(&core.base, &format!("/sessions/{}/files", local.session_id)).await;
    assert_eq!((status, body["error"].as_str()), (503, Some("no_device")));
    let (status, body) = get(
        &core.base,
        &format!("/sessions/{}/files/content", local.session_id),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_path"))
    );
    let busy = api.session("controlled", "self_hosted").await;
    // A Session with a non-terminal Turn is busy.
    api.turn(&busy, "hello").await;
    let (status, body) = get(&core.base, &format!("/sessions/{}/files", busy.session_id)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("session_busy"))
    );
    let (status, _) = get(&core.base, "/sessions/nope/files").await;
    assert_eq!(status, 404);
}
