//! End-to-end test of `contract-impl core serve` as a separate process, driven by a
//! minimal scripted Runtime (tokio-tungstenite) and the public API.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const DEVICE: &str = "device-1";
const SECRET: &str = "rcd_integration-test-secret";
const STEP: Duration = Duration::from_secs(10);

struct Core {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Core {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_core() -> Core {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("core.json");
    std::fs::write(&config, r#"{"timers":{"heartbeat_interval_ms":3600000}}"#).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_contract-impl"))
        .args(["core", "serve"])
        .env("CONTRACT_LISTEN", "127.0.0.1:0")
        .env("CONTRACT_DATA_DIR", dir.path().join("data"))
        .env("CONTRACT_DEVICE_ID", DEVICE)
        .env("CONTRACT_DAEMON_CREDENTIAL", SECRET)
        .env("CONTRACT_CORE_CONFIG", &config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap();
    let base = ready["ready"]["base_url"].as_str().unwrap().to_string();
    Core {
        child,
        base,
        _dir: dir,
    }
}

async fn post(
    client: &reqwest::Client,
    url: String,
    body: Value,
    bearer: Option<&str>,
) -> (u16, Value) {
    let mut req = client.post(url).json(&body);
    if let Some(b) = bearer {
        req = req.bearer_auth(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn recv(ws: &mut Ws) -> Value {
    loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Message::Text(text) = msg {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

async fn send(ws: &mut Ws, frame: Value) {
    ws.send(Message::text(frame.to_string())).await.unwrap();
}

fn caps() -> Value {
    let fields = contract_impl::core_runtime::wire::AgentKindCapabilities::FIELDS;
    Value::Object(
        fields
            .iter()
            .map(|f| (f.to_string(), Value::Bool(true)))
            .collect(),
    )
}

async fn connect(base: &str, connection_url: &str) -> Ws {
    let _ = base;
    let url = format!("{connection_url}?device_id={DEVICE}&version=1.0.0");
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {SECRET}").parse().unwrap());
    let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    ws
}

#[tokio::test(flavor = "multi_thread")]
async fn refuses_bad_credentials_and_versions() {
    let core = start_core();
    let client = reqwest::Client::new();
    let boot = format!("{}/api/v1/agent-daemon/bootstrap", core.base);
    for bad in ["rcd_wrong", "proj_key", "core_key"] {
        let (status, body) = post(
            &client,
            boot.clone(),
            json!({"device_id": DEVICE}),
            Some(bad),
        )
        .await;
        assert_eq!(
            (status, body),
            (401, json!({"error": "invalid_credential"}))
        );
    }
    let (status, _) = post(&client, boot.clone(), json!({"device_id": DEVICE}), None).await;
    assert_eq!(status, 401);
    let (status, body) = post(&client, boot, json!({"device_id": DEVICE}), Some(SECRET)).await;
    assert_eq!(status, 200);
    let ws_url = body["connection_url"].as_str().unwrap().to_string();
    assert_eq!(body["heartbeat_interval_ms"], 3_600_000);
    // 426 before any dispatch on a version mismatch (patch part included).
    let mut request = format!("{ws_url}?device_id={DEVICE}&version=1.0.1")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {SECRET}").parse().unwrap());
    match tokio_tungstenite::connect_async(request).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 426);
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap()).unwrap();
            assert_eq!(body, json!({"error": "incompatible_version"}));
        }
        other => panic!("expected 426, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn turn_completes_through_the_public_api() {
    let core = start_core();
    let client = reqwest::Client::new();
    let (_, body) = post(
        &client,
        format!("{}/api/v1/agent-daemon/bootstrap", core.base),
        json!({"device_id": DEVICE}),
        Some(SECRET),
    )
    .await;
    let mut ws = connect(&core.base, body["connection_url"].as_str().unwrap()).await;
    send(&mut ws, json!({"type": "heartbeat", "id": "hb-1", "payload": {"runtime_version": "test",
        "supported_agent_kinds": [{"agent_kind": "controlled", "available": true, "capabilities": caps()}]}})).await;

    let v1 = format!("{}/v1", core.base);
    let (status, agent) = post(
        &client,
        format!("{v1}/agents"),
        json!({"agent_kind": "controlled", "model": "model-a", "system_prompt": "Be brief."}),
        None,
    )
    .await;
    assert_eq!(status, 201, "{agent}");
    let (status, err) = post(
        &client,
        format!("{v1}/agents"),
        json!({"agent_kind": "controlled", "model": "m", "system_prompt": "p", "extra": 1}),
        None,
    )
    .await;
    assert_eq!(
        (status, err["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, env) = post(
        &client,
        format!("{v1}/environments"),
        json!({"type": "self_hosted"}),
        None,
    )
    .await;
    assert_eq!(status, 201);
    let env_id = env["environment_id"].as_str().unwrap().to_string();
    let (status, session) = post(
        &client,
        format!("{v1}/sessions"),
        json!({"agent_id": agent["agent_id"], "environment_id": env_id}),
        None,
    )
    .await;
    assert_eq!(status, 201, "{session}");
    let input = json!([{"role": "user", "content": [{"type": "text", "text": "hello"}]}]);
    let (status, turn) = post(
        &client,
        format!(
            "{v1}/sessions/{}/turns",
            session["session_id"].as_str().unwrap()
        ),
        json!({"input": input}),
        None,
    )
    .await;
    assert_eq!(status, 201, "{turn}");
    let turn_id = turn["turn_id"].as_str().unwrap().to_string();

    let init = recv(&mut ws).await;
    assert_eq!(init["type"], "runtime_prepare");
    assert_eq!(
        init["payload"],
        json!({"phase": "initialize", "environment_id": env_id})
    );
    send(&mut ws, json!({"type": "runtime_prepare_result", "id": init["id"], "payload": {"phase": "initialized", "environment_id": env_id}})).await;
    let prep = recv(&mut ws).await;
    assert_eq!(prep["type"], "execution_prepare");
    assert_eq!(
        prep["payload"]["configuration"]["agent_options"],
        json!({"model": "model-a", "system_prompt": "Be brief."})
    );
    assert_eq!(
        prep["payload"]["configuration"]["local_environment"]["environment_id"],
        json!(env_id)
    );
    let pid = prep["id"].clone();
    send(&mut ws, json!({"type": "preparation_status", "id": pid, "payload": {"status": "preparing", "admission_handle": "h1", "revision": 1}})).await;
    send(&mut ws, json!({"type": "preparation_status", "id": pid, "payload": {"status": "ready", "admission_handle": "h1", "revision": 2, "executor_id": "exe1", "expires_in_ms": 300000}})).await;
    let start = recv(&mut ws).await;
    assert_eq!(start["type"], "execution_start");
    assert_eq!(start["payload"]["input"], input);
    let run = start["payload"]["run_id"].clone();
    send(&mut ws, json!({"type": "preparation_status", "id": pid, "payload": {"status": "starting", "admission_handle": "h1", "revision": 3, "run_id": run}})).await;
    send(&mut ws, json!({"type": "preparation_status", "id": pid, "payload": {"status": "started", "admission_handle": "h1", "revision": 4, "run_id": run}})).await;
    send(
        &mut ws,
        json!({"type": "delta", "id": run, "payload": {"text": "Hi"}}),
    )
    .await;
    send(
        &mut ws,
        json!({"type": "usage", "id": run, "payload": {"input_tokens": 3}}),
    )
    .await;
    send(&mut ws, json!({"type": "done", "id": run, "payload": {"outcome": "completed", "native_session_id": "ns-1"}})).await;

    let deadline = tokio::time::Instant::now() + STEP;
    let turn = loop {
        let t: Value = client
            .get(format!("{v1}/turns/{turn_id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if t["state"] == "completed" || tokio::time::Instant::now() > deadline {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(turn["state"], "completed", "{turn}");
    assert_eq!(turn["outcome"]["native_session_id"], "ns-1");
    assert_eq!(turn["outcome"]["usage"], json!({"input_tokens": 3}));
    let events: Value = client
        .get(format!("{v1}/turns/{turn_id}/events?after_sequence=1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["usage", "done"]);
    let s: Value = client
        .get(format!(
            "{v1}/sessions/{}",
            session["session_id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(s["native_session_id"], "ns-1");

    // An invalid heartbeat (omitted capability) closes the transport with 1007.
    let mut partial = caps();
    partial.as_object_mut().unwrap().remove("streaming");
    send(&mut ws, json!({"type": "heartbeat", "id": "hb-2", "payload": {"runtime_version": "test",
        "supported_agent_kinds": [{"agent_kind": "controlled", "available": true, "capabilities": partial}]}})).await;
    loop {
        match tokio::time::timeout(STEP, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(Some(frame)))) => {
                assert_eq!(u16::from(frame.code), 1007);
                assert_eq!(frame.reason.as_str(), "missing_field");
                break;
            }
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}

async fn device_status(client: &reqwest::Client, base: &str, device: &str) -> (u16, Value) {
    let resp = client
        .get(format!("{base}/v1/devices/{device}"))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Polls the device status until `pred` holds (bounded by [`STEP`]).
async fn await_status(
    client: &reqwest::Client,
    base: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let (status, body) = device_status(client, base, DEVICE).await;
        assert_eq!(status, 200, "{body}");
        if pred(&body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "last status: {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn device_status_follows_connection_and_heartbeat() {
    let core = start_core();
    let client = reqwest::Client::new();
    let (status, err) = device_status(&client, &core.base, "no-such-device").await;
    assert_eq!((status, err["error"].as_str()), (404, Some("not_found")));
    let (status, body) = device_status(&client, &core.base, DEVICE).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["connected"], false);
    assert_eq!(body["declaration_known"], false);

    let (_, boot) = post(
        &client,
        format!("{}/api/v1/agent-daemon/bootstrap", core.base),
        json!({"device_id": DEVICE}),
        Some(SECRET),
    )
    .await;
    let mut ws = connect(&core.base, boot["connection_url"].as_str().unwrap()).await;
    let body = await_status(&client, &core.base, |b| b["connected"] == true).await;
    assert_eq!(body["declaration_known"], false, "{body}");
    assert_eq!(body["agent_kinds"], json!([]));
    let epoch = body["owner_epoch"].as_u64().unwrap();
    assert!(epoch >= 1, "{body}");

    send(&mut ws, json!({"type": "heartbeat", "id": "hb-1", "payload": {"runtime_version": "test",
        "supported_agent_kinds": [{"agent_kind": "controlled", "available": true, "capabilities": caps()}]}})).await;
    let body = await_status(&client, &core.base, |b| b["declaration_known"] == true).await;
    assert_eq!(body["device_id"], DEVICE);
    assert_eq!(body["connected"], true);
    assert_eq!(body["owner_epoch"].as_u64(), Some(epoch));
    assert_eq!(body["agent_kinds"], json!(["controlled"]));

    ws.close(None).await.unwrap();
    let body = await_status(&client, &core.base, |b| b["connected"] == false).await;
    assert_eq!(body["declaration_known"], false, "{body}");
    assert_eq!(body["owner_epoch"].as_u64(), Some(epoch));
}
