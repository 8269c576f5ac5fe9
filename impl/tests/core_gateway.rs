//! Integration test of the bootstrap credential check of `contract-impl core serve` as
//! a separate process, and of a revocation by another process ending a live
//! connection. The Turn path, the version check, the device status and a revocation
//! through the API are side-core scenarios in `scenarios/core_runtime/`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

const DEVICE: &str = "device-1";
const SECRET: &str = "rcd_integration-test-secret";

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
    std::fs::write(
        &config,
        r#"{"timers":{"heartbeat_interval_ms":3600000,"credential_recheck_ms":20}}"#,
    )
    .unwrap();
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

// Stays a Rust test: the harness's bootstrap step presents the launch credential or the API key (`credential: api_key`), never a wrong or missing one.
#[tokio::test(flavor = "multi_thread")]
async fn refuses_bad_credentials() {
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
    assert!(body["connection_url"].is_string(), "{body}");
    assert_eq!(body["heartbeat_interval_ms"], 3_600_000);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_public_api_needs_the_minted_project_api_key() {
    use std::os::unix::fs::PermissionsExt;
    // Started without CONTRACT_API_KEY: Core mints one into its data directory.
    let core = start_core();
    let key_file = core._dir.path().join("data").join("api-key");
    let meta = std::fs::metadata(&key_file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_string();
    let client = reqwest::Client::new();
    let url = format!("{}/v1/devices/{DEVICE}", core.base);
    for bearer in [None, Some("cpk-wrong"), Some(SECRET)] {
        let mut req = client.get(&url);
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{bearer:?}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "unauthorized");
    }
    // A key in the URL is no key.
    let resp = client
        .get(format!("{url}?api_key={key}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    let resp = client.get(&url).bearer_auth(&key).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    // The scheme name is case-insensitive (RFC 9110, 11.1); another scheme is no key.
    for (value, status) in [
        (format!("bearer {key}"), 200),
        (format!("BEARER  {key}"), 200),
        (format!("Basic {key}"), 401),
        (key.clone(), 401),
    ] {
        let resp = client
            .get(&url)
            .header("authorization", &value)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "{value:?}");
    }
    // The API key is not a daemon credential.
    let boot = format!("{}/api/v1/agent-daemon/bootstrap", core.base);
    let (status, _) = post(&client, boot, json!({"device_id": DEVICE}), Some(&key)).await;
    assert_eq!(status, 401);
}

/// `core credential revoke`, run by another process against the data directory of a
/// running Core, ends the live connection upgraded with that credential (Close 1008
/// `credential_revoked`), and the credential is refused from then on.
#[tokio::test(flavor = "multi_thread")]
async fn a_credential_revoked_by_the_cli_ends_its_live_connection() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    use tokio_tungstenite::tungstenite::{Message, http::HeaderValue};

    let core = start_core();
    let data_dir = core._dir.path().join("data");
    let client = reqwest::Client::new();
    let boot = format!("{}/api/v1/agent-daemon/bootstrap", core.base);
    let (status, body) = post(
        &client,
        boot.clone(),
        json!({"device_id": DEVICE}),
        Some(SECRET),
    )
    .await;
    assert_eq!(status, 200);
    let url = format!(
        "{}?device_id={DEVICE}&version=1.0.0",
        body["connection_url"].as_str().unwrap()
    );
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {SECRET}")).unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();

    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_contract-impl"))
            .args(["core", "credential"])
            .args(args)
            .arg("--data-dir")
            .arg(&data_dir)
            .output()
            .unwrap()
    };
    let listed = cli(&["list"]);
    assert!(listed.status.success(), "{listed:?}");
    let listed: Value =
        serde_json::from_str(String::from_utf8(listed.stdout).unwrap().trim()).unwrap();
    let id = listed["credential_id"].as_str().unwrap().to_string();
    let revoked = cli(&["revoke", "--credential-id", &id]);
    assert!(revoked.status.success(), "{revoked:?}");

    // A guard against a hang, not a timing assertion: the recheck interval is 20 ms.
    let close = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while let Some(message) = ws.next().await {
            match message {
                Ok(Message::Close(frame)) => return frame,
                Ok(_) => continue,
                Err(err) => panic!("the connection failed instead of closing: {err}"),
            }
        }
        None
    })
    .await
    .expect("the revoked connection stays open");
    let close = close.expect("a Close frame");
    assert_eq!(close.code, CloseCode::Policy);
    assert_eq!(close.reason.as_str(), "credential_revoked");
    let (status, body) = post(&client, boot, json!({"device_id": DEVICE}), Some(SECRET)).await;
    assert_eq!(
        (status, body),
        (401, json!({"error": "invalid_credential"}))
    );
}

/// A revoked peer that never answers Core's Close does not keep its TCP connection:
/// Core waits the close handshake out (`CLOSE_HANDSHAKE_TIMEOUT`) and drops it. The
/// peer here speaks raw TCP after the upgrade, so nothing answers the Close for it.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_peer_that_never_answers_close_loses_its_tcp_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let core = start_core();
    let data_dir = core._dir.path().join("data");
    let client = reqwest::Client::new();
    let boot = format!("{}/api/v1/agent-daemon/bootstrap", core.base);
    let (status, _) = post(&client, boot, json!({"device_id": DEVICE}), Some(SECRET)).await;
    assert_eq!(status, 200);
    let addr = core.base.trim_start_matches("http://").to_string();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let upgrade = format!(
        "GET /api/v1/agent-daemon/ws?device_id={DEVICE}&version=1.0.0 HTTP/1.1\r\n\
         Host: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {SECRET}\r\n\r\n"
    );
    tcp.write_all(upgrade.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            tcp.read(&mut byte).await.unwrap(),
            1,
            "Core ended the upgrade"
        );
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );

    let listed = Command::new(env!("CARGO_BIN_EXE_contract-impl"))
        .args(["core", "credential", "list", "--data-dir"])
        .arg(&data_dir)
        .output()
        .unwrap();
    let listed: Value =
        serde_json::from_str(String::from_utf8(listed.stdout).unwrap().trim()).unwrap();
    let revoked = Command::new(env!("CARGO_BIN_EXE_contract-impl"))
        .args(["core", "credential", "revoke", "--data-dir"])
        .arg(&data_dir)
        .args(["--credential-id", listed["credential_id"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(revoked.status.success(), "{revoked:?}");

    // Read raw bytes (Core's Close frame among them) and never answer: the read must
    // reach end-of-stream. The timeout guards against a hang; it is not a measurement.
    let mut received = Vec::new();
    let eof = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        eof.is_ok(),
        "Core kept the silent peer's TCP connection open"
    );
    // The Close frame (opcode 0x8) with 1008 came before the end.
    let close = received
        .windows(4)
        .any(|w| w[0] == 0x88 && w[2..4] == 1008u16.to_be_bytes());
    assert!(close, "no Close 1008 before the end: {received:02x?}");
}

/// A body refused over its route's bound is answered `Connection: close`: a client
/// that pools connections sends its next request on a new one, and it succeeds.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_over_bound_body_does_not_poison_a_pooled_connection() {
    let core = start_core();
    let key = std::fs::read_to_string(core._dir.path().join("data").join("api-key"))
        .unwrap()
        .trim()
        .to_string();
    let client = reqwest::Client::new();
    for _ in 0..5 {
        // 5 MiB of body on a route bounded at one transport frame (4 MiB).
        let resp = client
            .post(format!("{}/v1/agents", core.base))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(vec![b' '; 5 * 1024 * 1024])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 413);
        assert_eq!(
            resp.headers().get("connection").map(|v| v.as_bytes()),
            Some(&b"close"[..])
        );
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "request_too_large");
        let resp = client
            .get(format!("{}/v1/devices/{DEVICE}", core.base))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    }
}
