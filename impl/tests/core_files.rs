//! Integration tests of the Files API of `contract-impl core serve` (idle reads via the
//! read-only preparation profile), against a scripted Runtime.

mod common;

use common::{Core, Runtime};
use serde_json::{Value, json};

async fn get(base: &str, path: &str) -> (u16, Value) {
    let resp = reqwest::get(format!("{base}/v1{path}")).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Serves one read on `rt` up to (not including) the release confirmation; returns
/// the preparation request ID and the admission handle.
async fn serve_read(rt: &mut Runtime, env: &str, result: Value, expect_op: &str) -> (Value, Value) {
    let prep = rt.expect("execution_prepare").await;
    assert_eq!(
        prep["payload"]["configuration"],
        json!({"local_environment": {"environment_id": env, "environment_type": "self_hosted"},
               "workspace_read_only": true})
    );
    let handle = json!("rh1");
    rt.send(json!({"type": "preparation_status", "id": prep["id"], "payload": {"status": "ready",
        "admission_handle": handle, "revision": 1, "executor_id": "exe-r", "expires_in_ms": 300000}}))
        .await;
    let read = rt.expect("workspace_read").await;
    assert_eq!(
        read["payload"]["target"],
        json!({"admission_handle": handle})
    );
    assert_eq!(read["payload"]["environment_id"], env);
    assert_eq!(read["payload"]["operation"], expect_op);
    rt.send(json!({"type": "workspace_read_result", "id": read["id"], "payload": result}))
        .await;
    let release = rt.expect("execution_release").await;
    assert_eq!(release["id"], prep["id"]);
    assert_eq!(release["payload"]["admission_handle"], handle);
    (prep["id"].clone(), handle)
}

#[tokio::test(flavor = "multi_thread")]
async fn directory_and_file_reads_return_data_only_after_the_confirmed_close() {
    let core = Core::start("");
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();

    let base = core.base.clone();
    let sid = session.session_id.clone();
    let listing =
        tokio::spawn(async move { get(&base, &format!("/sessions/{sid}/files?path=src")).await });
    rt.initialize(&env).await;
    let (prep, handle) = serve_read(
        &mut rt,
        &env,
        json!({"status": "ok", "entries": [{"name": "main.rs", "kind": "file", "size": 12},
            {"name": "lib", "kind": "directory"}], "truncated": false}),
        "directory",
    )
    .await;
    // While the close is unconfirmed the Session is reserved: a new Turn stays queued
    // and the read has not answered.
    let turn = api.turn(&session, "hello").await;
    assert!(!listing.is_finished());
    rt.send(
        json!({"type": "preparation_status", "id": prep, "payload": {"status": "released",
        "admission_handle": handle, "revision": 2}}),
    )
    .await;
    let (status, body) = listing.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"path": "src", "entries": [{"name": "main.rs", "kind": "file", "size": 12},
            {"name": "lib", "kind": "directory"}], "truncated": false})
    );
    // The reservation is gone: the queued Turn is prepared now (no second initialize).
    let run = rt.run().await;
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&turn, "completed").await;

    // A file read whose close is not confirmed returns no data.
    let base = core.base.clone();
    let sid = session.session_id.clone();
    let reading = tokio::spawn(async move {
        get(
            &base,
            &format!("/sessions/{sid}/files/content?path=src/main.rs"),
        )
        .await
    });
    let (prep, handle) = serve_read(
        &mut rt,
        &env,
        json!({"status": "ok", "data": "aGVsbG8=", "truncated": false}),
        "bytes",
    )
    .await;
    rt.send(
        json!({"type": "preparation_status", "id": prep, "payload": {"status": "failed",
        "admission_handle": handle, "revision": 2, "error_code": "cleanup_unconfirmed"}}),
    )
    .await;
    let (status, body) = reading.await.unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    assert!(body.get("data").is_none());

    // A confirmed one returns the bytes.
    let base = core.base.clone();
    let sid = session.session_id.clone();
    let reading = tokio::spawn(async move {
        get(
            &base,
            &format!("/sessions/{sid}/files/content?path=src/main.rs"),
        )
        .await
    });
    let (prep, handle) = serve_read(
        &mut rt,
        &env,
        json!({"status": "ok", "data": "aGVsbG8=", "truncated": false}),
        "bytes",
    )
    .await;
    rt.send(
        json!({"type": "preparation_status", "id": prep, "payload": {"status": "released",
        "admission_handle": handle, "revision": 2}}),
    )
    .await;
    let (status, body) = reading.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"path": "src/main.rs", "data": "aGVsbG8=", "truncated": false})
    );

    // A safe refusal: not found, no data.
    let base = core.base.clone();
    let sid = session.session_id.clone();
    let reading = tokio::spawn(async move {
        get(&base, &format!("/sessions/{sid}/files/content?path=nope")).await
    });
    let (prep, handle) = serve_read(
        &mut rt,
        &env,
        json!({"status": "refused", "error_code": "not_found"}),
        "bytes",
    )
    .await;
    rt.send(
        json!({"type": "preparation_status", "id": prep, "payload": {"status": "released",
        "admission_handle": handle, "revision": 2}}),
    )
    .await;
    let (status, body) = reading.await.unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
}

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
    // A device whose declaration lacks workspace_read_preparation refuses the read.
    let mut rt = Runtime::connect(&core.base).await;
    let mut caps = common::caps();
    caps["workspace_read_preparation"] = json!(false);
    rt.send(json!({"type": "heartbeat", "id": "hb", "payload": {"runtime_version": "test",
        "supported_agent_kinds": [{"agent_kind": "controlled", "available": true, "capabilities": caps}]}}))
        .await;
    // The heartbeat has no reply to await: poll the read until the snapshot applies.
    let deadline = tokio::time::Instant::now() + common::STEP;
    loop {
        let (status, body) =
            get(&core.base, &format!("/sessions/{}/files", local.session_id)).await;
        if body["error"] == "unsupported_capability" {
            assert_eq!(status, 409);
            assert!(
                body["message"]
                    .as_str()
                    .unwrap()
                    .contains("workspace_read_preparation")
            );
            break;
        }
        assert_eq!(body["error"], "no_device", "{body}");
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(common::POLL).await;
    }
    let (status, _) = get(&core.base, "/sessions/nope/files").await;
    assert_eq!(status, 404);
}
