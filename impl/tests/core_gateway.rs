//! Integration test of the bootstrap credential check of `contract-impl core serve` as
//! a separate process. The Turn path, the version check and the device status are
//! side-core scenarios in `scenarios/core_runtime/`.

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
    // The API key is not a daemon credential.
    let boot = format!("{}/api/v1/agent-daemon/bootstrap", core.base);
    let (status, _) = post(&client, boot, json!({"device_id": DEVICE}), Some(&key)).await;
    assert_eq!(status, 401);
}
