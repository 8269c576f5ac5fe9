//! Integration tests of the Files export API of `contract-impl core serve`
//! (`GET /v1/sessions/{id}/files/export`): the refusals before any Runtime work. Exports
//! themselves are side-core scenarios (`core_export_verified_close`, `workspace_export*`).

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
async fn export_refusals_before_any_runtime_work() {
    let core = Core::start("");
    let api = core.api();
    let local = api.session("controlled", "self_hosted").await;
    let sid = &local.session_id;
    for path in ["", "../etc", "/abs", "a//b", "./a"] {
        let (status, body) = get(
            &core.base,
            &format!("/sessions/{sid}/files/export?path={path}"),
        )
        .await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_path")),
            "{path}"
        );
    }
    let (status, body) = get(
        &core.base,
        &format!("/sessions/{sid}/files/export?path=out"),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (503, Some("no_device")));
    let none = api.session("controlled", "none").await;
    let (status, body) = get(
        &core.base,
        &format!("/sessions/{}/files/export?path=out", none.session_id),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("no_workspace"))
    );
    let (status, _) = get(&core.base, "/sessions/nope/files/export?path=out").await;
    assert_eq!(status, 404);
}
