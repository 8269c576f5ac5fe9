//! Integration tests of Files reads during an active execution (`contract-impl core
//! serve`): the read names the Session's running Run on its connection, with no
//! preparation or release, against a scripted Runtime.

mod common;

use common::{Core, Runtime};
use serde_json::{Value, json};

async fn get(base: &str, path: &str) -> (u16, Value) {
    let resp = reqwest::get(format!("{base}/v1{path}")).await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Starts a Files GET of `path` on a task.
fn spawn_get(base: &str, path: String) -> tokio::task::JoinHandle<(u16, Value)> {
    let base = base.to_string();
    tokio::spawn(async move { get(&base, &path).await })
}

/// Expects the Run-targeted `workspace_read` and answers it with `result`.
async fn serve_run_read(rt: &mut Runtime, run_id: &str, env: &str, op: &str, result: Value) {
    let read = rt.expect("workspace_read").await;
    assert_eq!(read["payload"]["target"], json!({"run_id": run_id}));
    assert_eq!(read["payload"]["environment_id"], env);
    assert_eq!(read["payload"]["operation"], op);
    rt.send(json!({"type": "workspace_read_result", "id": read["id"], "payload": result}))
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reads_during_a_run_target_the_run_and_leave_it_running() {
    let core = Core::start("");
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();
    let sid = session.session_id.clone();
    let turn = api.turn(&session, "hello").await;
    rt.initialize(&env).await;
    let run = rt.run().await;
    api.wait_state(&turn, "running").await;

    // A content read: one workspace_read against the Run, answered as it comes.
    let reading = spawn_get(
        &core.base,
        format!("/sessions/{sid}/files/content?path=notes.txt"),
    );
    serve_run_read(
        &mut rt,
        run.run_id.as_str().unwrap(),
        &env,
        "bytes",
        json!({"status": "ok", "data": "aGVsbG8=", "truncated": false}),
    )
    .await;
    let (status, body) = reading.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"path": "notes.txt", "data": "aGVsbG8=", "truncated": false})
    );

    // A directory listing.
    let listing = spawn_get(&core.base, format!("/sessions/{sid}/files?path=src"));
    serve_run_read(
        &mut rt,
        run.run_id.as_str().unwrap(),
        &env,
        "directory",
        json!({"status": "ok", "entries": [{"name": "main.rs", "kind": "file", "size": 12}],
               "truncated": false}),
    )
    .await;
    let (status, body) = listing.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"path": "src", "entries": [{"name": "main.rs", "kind": "file", "size": 12}],
               "truncated": false})
    );

    // A refusal maps as for idle reads.
    let reading = spawn_get(
        &core.base,
        format!("/sessions/{sid}/files/content?path=nope"),
    );
    serve_run_read(
        &mut rt,
        run.run_id.as_str().unwrap(),
        &env,
        "bytes",
        json!({"status": "refused", "error_code": "not_found"}),
    )
    .await;
    let (status, body) = reading.await.unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );

    // `unavailable`: 503 without data.
    let reading = spawn_get(
        &core.base,
        format!("/sessions/{sid}/files/content?path=notes.txt"),
    );
    serve_run_read(
        &mut rt,
        run.run_id.as_str().unwrap(),
        &env,
        "bytes",
        json!({"status": "unavailable", "error_code": "busy"}),
    )
    .await;
    let (status, body) = reading.await.unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    assert!(body.get("data").is_none());

    // The Run was not disturbed: its output keeps flowing and it completes.
    rt.event(&run, "delta", json!({"text": "ok"})).await;
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&turn, "completed").await;
    assert!(api.event_kinds(&turn).await.iter().any(|k| k == "delta"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_read_answers_503_when_the_connection_is_lost() {
    let core = Core::start("");
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();
    let sid = session.session_id.clone();
    let turn = api.turn(&session, "hello").await;
    rt.initialize(&env).await;
    let run = rt.run().await;
    api.wait_state(&turn, "running").await;

    let reading = spawn_get(
        &core.base,
        format!("/sessions/{sid}/files/content?path=notes.txt"),
    );
    let read = rt.expect("workspace_read").await;
    assert_eq!(read["payload"]["target"], json!({"run_id": run.run_id}));
    rt.drop_transport();
    let (status, body) = reading.await.unwrap();
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    assert!(body.get("data").is_none());
}
