//! Integration tests of the Files export API of `contract-impl core serve`
//! (`GET /v1/sessions/{id}/files/export`), against a scripted Runtime.

mod common;

use base64::Engine as _;
use common::{Core, Runtime};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

async fn get(base: &str, path: &str) -> (u16, Value) {
    let resp = reqwest::get(format!("{base}/v1{path}")).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Serves one export on `rt` through the read-only profile, answering `result`, up to
/// (not including) the release confirmation; returns the preparation request ID and
/// the admission handle.
async fn serve_export(rt: &mut Runtime, env: &str, path: &str, result: Value) -> (Value, Value) {
    let prep = rt.expect("execution_prepare").await;
    assert_eq!(
        prep["payload"]["configuration"],
        json!({"local_environment": {"environment_id": env, "environment_type": "self_hosted"},
               "workspace_read_only": true})
    );
    let handle = json!("xh1");
    rt.send(json!({"type": "preparation_status", "id": prep["id"], "payload": {"status": "ready",
        "admission_handle": handle, "revision": 1, "executor_id": "exe-x", "expires_in_ms": 300000}}))
        .await;
    let export = rt.expect("workspace_export").await;
    assert_eq!(
        export["payload"],
        json!({"target": {"admission_handle": handle}, "environment_id": env, "path": path})
    );
    rt.send(json!({"type": "workspace_export_result", "id": export["id"], "payload": result}))
        .await;
    let release = rt.expect("execution_release").await;
    assert_eq!(release["id"], prep["id"]);
    assert_eq!(release["payload"]["admission_handle"], handle);
    (prep["id"].clone(), handle)
}

async fn released(rt: &mut Runtime, prep: &Value, handle: &Value) {
    rt.send(
        json!({"type": "preparation_status", "id": prep, "payload": {"status": "released",
        "admission_handle": handle, "revision": 2}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn export_returns_the_verified_archive_only_after_the_confirmed_close() {
    let core = Core::start("");
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();
    let sid = session.session_id.clone();
    let b64 = base64::engine::general_purpose::STANDARD;

    // ok: the archive and its digest, only after `released`.
    let archive = vec![7u8; 1536];
    let digest = hex::encode(Sha256::digest(&archive));
    let base = core.base.clone();
    let s = sid.clone();
    let call =
        tokio::spawn(
            async move { get(&base, &format!("/sessions/{s}/files/export?path=out")).await },
        );
    rt.initialize(&env).await;
    let (prep, handle) = serve_export(
        &mut rt,
        &env,
        "out",
        json!({"status": "ok", "data": b64.encode(&archive), "sha256": digest}),
    )
    .await;
    tokio::time::sleep(common::POLL).await;
    assert!(!call.is_finished());
    released(&mut rt, &prep, &handle).await;
    let (status, body) = call.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"path": "out", "archive_base64": b64.encode(&archive), "sha256": digest})
    );

    // result_too_large → 413 export_too_large (no second initialize).
    let base = core.base.clone();
    let s = sid.clone();
    let call =
        tokio::spawn(
            async move { get(&base, &format!("/sessions/{s}/files/export?path=many")).await },
        );
    let (prep, handle) = serve_export(
        &mut rt,
        &env,
        "many",
        json!({"status": "refused", "error_code": "result_too_large"}),
    )
    .await;
    released(&mut rt, &prep, &handle).await;
    let (status, body) = call.await.unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("export_too_large"))
    );

    // A digest that does not match the bytes → unavailable, no data.
    let base = core.base.clone();
    let s = sid.clone();
    let call =
        tokio::spawn(
            async move { get(&base, &format!("/sessions/{s}/files/export?path=out")).await },
        );
    let (prep, handle) = serve_export(
        &mut rt,
        &env,
        "out",
        json!({"status": "ok", "data": b64.encode(&archive), "sha256": "0".repeat(64)}),
    )
    .await;
    released(&mut rt, &prep, &handle).await;
    let (status, body) = call.await.unwrap();
    assert_eq!((status, body["error"].as_str()), (503, Some("unavailable")));
    assert!(body.get("archive_base64").is_none());

    // An ok export whose close fails (cleanup_unconfirmed) → unavailable, no data.
    let base = core.base.clone();
    let s = sid.clone();
    let call =
        tokio::spawn(
            async move { get(&base, &format!("/sessions/{s}/files/export?path=out")).await },
        );
    let (prep, handle) = serve_export(
        &mut rt,
        &env,
        "out",
        json!({"status": "ok", "data": b64.encode(&archive), "sha256": digest}),
    )
    .await;
    rt.send(
        json!({"type": "preparation_status", "id": prep, "payload": {"status": "failed",
        "admission_handle": handle, "revision": 2, "error_code": "cleanup_unconfirmed"}}),
    )
    .await;
    let (status, body) = call.await.unwrap();
    assert_eq!((status, body["error"].as_str()), (503, Some("unavailable")));
    assert!(body.get("archive_base64").is_none());
}

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
