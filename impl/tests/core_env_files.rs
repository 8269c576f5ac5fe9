//! Integration tests of the Environment file-installation API of
//! `contract-impl core serve` (`POST /v1/environments/{id}/files`, spec "Preparation
//! and execution order": `runtime_prepare` transfers), against a scripted Runtime. Failed
//! and lost transfers are side-core scenarios (`core_env_transfer_outcomes`,
//! `runtime_prepare_transfer`).

mod common;

use base64::Engine as _;
use common::{Core, Runtime};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Chunk size of `runtime_prepare` transfers (64 KiB).
const CHUNK: usize = 64 * 1024;
/// The public decoded inline limit (5 MiB).
const INLINE_MAX: usize = 5 * 1024 * 1024;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn post(base: &str, env: &str, body: Value) -> (u16, Value) {
    let resp = common::api_client()
        .post(format!("{base}/v1/environments/{env}/files"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn spawn_install(
    base: &str,
    env: &str,
    path: &str,
    kind: &str,
    content: &[u8],
) -> tokio::task::JoinHandle<(u16, Value)> {
    let (base, env) = (base.to_string(), env.to_string());
    let body = json!({"path": path, "kind": kind, "content_base64": b64(content)});
    tokio::spawn(async move { post(&base, &env, body).await })
}

/// Awaits `begin` (asserting its header) and answers `ready`; returns the transfer ID.
async fn begin(rt: &mut Runtime, env: &str, path: &str, kind: &str, content: &[u8]) -> Value {
    let begin = rt.expect("runtime_prepare").await;
    assert_eq!(
        begin["payload"],
        json!({"phase": "begin", "environment_id": env, "kind": kind, "path": path,
               "size": content.len(), "sha256": sha256_hex(content)})
    );
    rt.send(json!({"type": "runtime_prepare_result", "id": begin["id"],
        "payload": {"phase": "ready"}}))
        .await;
    begin["id"].clone()
}

/// Acknowledges every chunk of `content`, asserting order, offsets and bytes.
async fn chunks(rt: &mut Runtime, id: &Value, content: &[u8]) {
    let mut offset = 0;
    for part in content.chunks(CHUNK) {
        let chunk = rt.expect("runtime_prepare").await;
        assert_eq!(chunk["id"], *id);
        assert_eq!(
            chunk["payload"],
            json!({"phase": "chunk", "offset": offset, "data": b64(part)})
        );
        offset += part.len();
        rt.send(json!({"type": "runtime_prepare_result", "id": id,
            "payload": {"phase": "received", "offset": offset - part.len(), "received": offset}}))
            .await;
    }
}

// Stays a Rust test: public-API validation with a body over 5 MiB and a transfer of several 64 KiB chunks, which an `api:` step and a side-core scenario cannot spell out.
#[tokio::test(flavor = "multi_thread")]
async fn installs_in_acknowledged_chunks_one_transfer_per_connection() {
    let core = Core::start("");
    let session = core.api().session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();

    // Public checks before any Runtime work (no device is even connected).
    for bad in ["", "/abs", "a/../b", "a//b"] {
        let (status, body) = post(
            &core.base,
            &env,
            json!({"path": bad, "kind": "file", "content_base64": "eA=="}),
        )
        .await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("invalid_path"))
        );
    }
    let (status, body) = post(
        &core.base,
        &env,
        json!({"path": "a", "kind": "file", "content_base64": b64(&vec![0u8; INLINE_MAX + 1])}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("content_too_large"))
    );
    let (status, body) = post(
        &core.base,
        &env,
        json!({"path": "a", "kind": "dir", "content_base64": "eA=="}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, body) = post(
        &core.base,
        "00000000-0000-4000-8000-0000000000ff",
        json!({"path": "a", "kind": "file", "content_base64": "eA=="}),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (404, Some("not_found")));
    let (status, body) = post(
        &core.base,
        &env,
        json!({"path": "a", "kind": "file", "content_base64": "eA=="}),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (503, Some("no_device")));

    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let content: Vec<u8> = (0..2 * CHUNK + 5).map(|i| (i % 251) as u8).collect();
    let call = spawn_install(&core.base, &env, "tools/blob.bin", "file", &content);
    rt.initialize(&env).await;
    let id = begin(&mut rt, &env, "tools/blob.bin", "file", &content).await;
    // A second installation on the same connection is refused at once.
    let (status, body) = post(
        &core.base,
        &env,
        json!({"path": "other", "kind": "file", "content_base64": "eA=="}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("transfer_in_progress"))
    );
    chunks(&mut rt, &id, &content).await;
    let commit = rt.expect("runtime_prepare").await;
    assert_eq!(
        (&commit["id"], &commit["payload"]),
        (&id, &json!({"phase": "commit"}))
    );
    assert!(!call.is_finished(), "answered before completed");
    rt.send(
        json!({"type": "runtime_prepare_result", "id": id, "payload": {"phase": "completed",
        "path": "tools/blob.bin", "size": content.len(), "sha256": sha256_hex(&content)}}),
    )
    .await;
    let (status, body) = call.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"path": "tools/blob.bin", "size": content.len(), "sha256": sha256_hex(&content)})
    );

    // The slot is free again; the Environment stays initialized; an archive may
    // target the workspace root. A `failed` answer is 422 with the Runtime's code.
    let tar = b"not really a tar";
    let call = spawn_install(&core.base, &env, "", "archive", tar);
    let id = begin(&mut rt, &env, "", "archive", tar).await;
    chunks(&mut rt, &id, tar).await;
    rt.expect("runtime_prepare").await;
    rt.send(json!({"type": "runtime_prepare_result", "id": id,
        "payload": {"phase": "failed", "code": "install_failed"}}))
        .await;
    let (status, body) = call.await.unwrap();
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"], "transfer_failed");
    assert_eq!(body["runtime_error_code"], "install_failed");
}
