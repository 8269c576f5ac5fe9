//! Integration tests of the Files write API of `contract-impl core serve`
//! (`PUT /v1/sessions/{id}/files/content`, "Workspace operations": `workspace_write`,
//! durable write reservations), against a scripted Runtime. Rejections, connection loss
//! and the reservation across a restart are side-core scenarios (`workspace_write_*`,
//! `core_write_reservation_*`).

mod common;

use base64::Engine as _;
use common::{Core, Runtime, Session};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Chunk size of `workspace_write` (64 KiB).
const CHUNK: usize = 64 * 1024;
/// The public decoded inline limit (5 MiB).
const INLINE_MAX: usize = 5 * 1024 * 1024;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `PUT /v1/sessions/{sid}/files/content?path=…` with a raw body → (status, body);
/// status 0 when the connection ended without an answer.
async fn put_raw(base: &str, sid: &str, path: &str, body: String) -> (u16, Value) {
    let Ok(resp) = common::api_client()
        .put(format!(
            "{base}/v1/sessions/{sid}/files/content?path={path}"
        ))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
    else {
        return (0, Value::Null);
    };
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Writes `content` in the background; the handle yields (status, body).
fn spawn_put(
    base: &str,
    sid: &str,
    path: &str,
    content: &[u8],
) -> tokio::task::JoinHandle<(u16, Value)> {
    let (base, sid, path) = (base.to_string(), sid.to_string(), path.to_string());
    let body = json!({"content_base64": b64(content), "sha256": sha256_hex(content)}).to_string();
    tokio::spawn(async move { put_raw(&base, &sid, &path, body).await })
}

/// Serves the read-only preparation and `begin` → `ready`; returns (preparation ID,
/// handle, write operation ID).
async fn begin(rt: &mut Runtime, env: &str, path: &str, content: &[u8]) -> (Value, Value, Value) {
    let prep = rt.expect("execution_prepare").await;
    assert_eq!(
        prep["payload"]["configuration"],
        json!({"local_environment": {"environment_id": env, "environment_type": "self_hosted"},
               "workspace_read_only": true})
    );
    let handle = json!("wh1");
    rt.send(json!({"type": "preparation_status", "id": prep["id"], "payload": {"status": "ready",
        "admission_handle": handle, "revision": 1, "executor_id": "exe-w", "expires_in_ms": 300000}}))
        .await;
    let begin = rt.expect("workspace_write").await;
    assert_eq!(
        begin["payload"],
        json!({"phase": "begin", "target": {"admission_handle": handle}, "environment_id": env,
               "path": path, "size": content.len(), "sha256": sha256_hex(content)})
    );
    rt.send(json!({"type": "workspace_write_result", "id": begin["id"],
        "payload": {"phase": "ready"}}))
        .await;
    (prep["id"].clone(), handle, begin["id"].clone())
}

/// Acknowledges every chunk of `content` (asserting order, offsets and bytes).
async fn receive_chunks(rt: &mut Runtime, op: &Value, content: &[u8]) {
    let mut offset = 0usize;
    for expected in content.chunks(CHUNK) {
        let chunk = rt.expect("workspace_write").await;
        assert_eq!(chunk["id"], *op);
        assert_eq!(chunk["payload"]["phase"], "chunk");
        assert_eq!(chunk["payload"]["offset"], offset);
        assert_eq!(chunk["payload"]["data"], b64(expected));
        offset += expected.len();
        rt.send(json!({"type": "workspace_write_result", "id": op,
            "payload": {"phase": "received", "offset": chunk["payload"]["offset"], "received": offset}}))
            .await;
    }
}

/// Awaits `execution_release` of `handle` and confirms it.
async fn release(rt: &mut Runtime, prep: &Value, handle: &Value) {
    let release = rt.expect("execution_release").await;
    assert_eq!(release["id"], *prep);
    assert_eq!(release["payload"]["admission_handle"], *handle);
    rt.send(
        json!({"type": "preparation_status", "id": prep, "payload": {"status": "released",
        "admission_handle": handle, "revision": 2}}),
    )
    .await;
}

async fn turn_status(api: &common::Api, session: &Session) -> (u16, Value) {
    api.post(
        &format!("/sessions/{}/turns", session.session_id),
        json!({"input": common::text_input("hello")}),
    )
    .await
}

// Stays a Rust test: a body of several 64 KiB chunks, whose bytes a side-core scenario would have to spell out (`$generated` matching is for side-runtime scenarios only).
#[tokio::test(flavor = "multi_thread")]
async fn a_committed_write_settles_the_reservation_and_unblocks_the_session() {
    let core = Core::start("");
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();
    let content: Vec<u8> = (0..(2 * CHUNK + 1000)).map(|i| (i % 251) as u8).collect();

    let writing = spawn_put(&core.base, &session.session_id, "src/data.bin", &content);
    rt.initialize(&env).await;
    let (prep, handle, op) = begin(&mut rt, &env, "src/data.bin", &content).await;
    // While the transfer runs, the reservation blocks Turns and reports in_progress.
    let (status, body) = turn_status(&api, &session).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("write_reserved"))
    );
    let write_id = op.as_str().unwrap();
    let w = api
        .get(&format!(
            "/sessions/{}/files/writes/{write_id}",
            session.session_id
        ))
        .await;
    assert_eq!(w["state"], "in_progress", "{w}");
    receive_chunks(&mut rt, &op, &content).await;
    let commit = rt.expect("workspace_write").await;
    assert_eq!(commit["payload"], json!({"phase": "commit"}));
    rt.send(
        json!({"type": "workspace_write_result", "id": op, "payload": {"phase": "committed",
        "path": "src/data.bin", "size": content.len(), "sha256": sha256_hex(&content)}}),
    )
    .await;
    release(&mut rt, &prep, &handle).await;
    let (status, body) = writing.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"write_id": write_id, "path": "src/data.bin", "size": content.len(),
               "sha256": sha256_hex(&content), "state": "committed"})
    );
    let w = api
        .get(&format!(
            "/sessions/{}/files/writes/{write_id}",
            session.session_id
        ))
        .await;
    assert_eq!(w["state"], "committed", "{w}");
    // Settled: a Turn of the Session is accepted and runs.
    let (status, body) = turn_status(&api, &session).await;
    assert_eq!(status, 201, "{body}");
    rt.run().await;
}

// Stays a Rust test: it runs the operator command `core write settle` on the data directory, a process no scenario step can run.
#[tokio::test(flavor = "multi_thread")]
async fn an_unsettled_reservation_blocks_across_a_sigkill_until_an_operator_settles_it() {
    let mut core = Core::start("");
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();
    let content = b"payload".to_vec();

    let writing = spawn_put(&core.base, &session.session_id, "k.txt", &content);
    rt.initialize(&env).await;
    let (_prep, _handle, op) = begin(&mut rt, &env, "k.txt", &content).await;
    rt.expect("workspace_write").await;
    // SIGKILL Core with the chunk unacknowledged, and restart it.
    core.kill();
    assert_eq!(writing.await.unwrap().0, 0, "no answer from a killed Core");
    core.restart();
    let api = core.api();
    let write_id = op.as_str().unwrap();
    let w = api
        .get(&format!(
            "/sessions/{}/files/writes/{write_id}",
            session.session_id
        ))
        .await;
    assert_eq!(
        (w["state"].as_str(), w["path"].as_str(), w["size"].as_u64()),
        (Some("unknown"), Some("k.txt"), Some(content.len() as u64)),
        "{w}"
    );
    let (status, body) = turn_status(&api, &session).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("write_reserved")),
        "{body}"
    );

    // Nothing is replayed to a reconnecting Runtime: its first frame is the Turn's,
    // which only exists after the operator's explicit settlement.
    let data_dir = core.dir.path().join("data");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_contract-impl"))
        .args(["core", "write", "settle", "--data-dir"])
        .arg(&data_dir)
        .args(["--write-id", write_id, "--state", "rejected"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_contract-impl"))
        .args(["core", "write", "settle", "--data-dir"])
        .arg(&data_dir)
        .args(["--write-id", write_id, "--state", "committed"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    let w = api
        .get(&format!(
            "/sessions/{}/files/writes/{write_id}",
            session.session_id
        ))
        .await;
    assert_eq!(w["state"], "rejected", "{w}");
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let (status, body) = turn_status(&api, &session).await;
    assert_eq!(status, 201, "{body}");
    rt.initialize(&env).await;
    rt.run().await;
}

// Stays a Rust test: public-API request validation, with bodies over 5 MiB and non-JSON bodies that an `api:` step cannot send.
#[tokio::test(flavor = "multi_thread")]
async fn public_checks_refuse_before_any_runtime_frame() {
    let core = Core::start("");
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "self_hosted").await;
    let sid = session.session_id.clone();

    // One byte over the decoded inline limit: 413 before anything else.
    let over = vec![0u8; INLINE_MAX + 1];
    let (status, body) = put_raw(
        &core.base,
        &sid,
        "big.bin",
        json!({"content_base64": b64(&over)}).to_string(),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("write_too_large")),
        "{body}"
    );
    // A body over the encoded bound is refused before it is parsed. Core may answer and
    // close while the client is still sending: on a loaded machine the client then sees
    // the reset instead of the answer (status 0), so the refusal is read on a retry.
    let mut refused = (0, Value::Null);
    for _ in 0..5 {
        refused = put_raw(&core.base, &sid, "big.bin", "x".repeat(8 * 1024 * 1024)).await;
        if refused.0 != 0 {
            break;
        }
    }
    let (status, body) = refused;
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("request_too_large")),
        "{body}"
    );
    let ok = json!({"content_base64": b64(b"hi")}).to_string();
    for path in ["", "../escape", "/abs", "a//b", "dir/", "a/./b"] {
        let (status, body) = put_raw(&core.base, &sid, path, ok.clone()).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_path")),
            "{path}: {body}"
        );
    }
    let (status, body) = put_raw(
        &core.base,
        &sid,
        "a.txt",
        json!({"content_base64": b64(b"hi"), "sha256": sha256_hex(b"ho")}).to_string(),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("digest_mismatch")),
        "{body}"
    );
    for bad in [
        json!({"content_base64": "***"}),
        json!({"content_base64": b64(b"hi"), "extra": 1}),
        json!({"content_base64": b64(b"hi"), "sha256": "ABC"}),
    ] {
        let (status, body) = put_raw(&core.base, &sid, "a.txt", bad.to_string()).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_request")),
            "{body}"
        );
    }
    let none = api.session("controlled", "none").await;
    let (status, body) = put_raw(&core.base, &none.session_id, "a.txt", ok.clone()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("no_workspace")),
        "{body}"
    );
    let (status, _) = put_raw(&core.base, "nope", "a.txt", ok.clone()).await;
    assert_eq!(status, 404);
    // Reserved, then no device can be admitted: nothing was sent, so the reservation
    // is settled `abandoned` and does not block the Session.
    let orphan = api.session("undeclared", "self_hosted").await;
    let (status, body) = put_raw(&core.base, &orphan.session_id, "a.txt", ok).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (503, Some("no_device")),
        "{body}"
    );
    let (status, body) = turn_status(&api, &orphan).await;
    assert_eq!(status, 201, "{body}");

    // No reservation was left and no frame was sent: the next frame the Runtime sees
    // belongs to a Turn of the same Session.
    let (status, body) = turn_status(&api, &session).await;
    assert_eq!(status, 201, "{body}");
    rt.initialize(&session.environment_id).await;
    rt.run().await;
}
