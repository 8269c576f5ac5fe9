//! Shared helpers of the Core integration tests: a `contract-impl core serve` child
//! process (restartable on the same data directory), a scripted Runtime over
//! tokio-tungstenite, and a public-API client.
//!
//! Nothing here sleeps to wait for an event that can be awaited: frames are awaited
//! with a bounded timeout, and public-API state is polled only by [`Api::wait`], a
//! bounded loop that awaits a condition.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The device the Core under test provisions.
pub const DEVICE: &str = "device-1";
/// Its daemon credential.
pub const SECRET: &str = "rcd_integration-test-secret";
/// Bound on awaiting one frame or one condition.
pub const STEP: Duration = Duration::from_secs(10);
/// Pause between two polls of the public API inside [`Api::wait`].
pub const POLL: Duration = Duration::from_millis(10);
/// Heartbeat interval announced in tests (long: the scripted Runtime heartbeats by hand).
pub const QUIET_TIMERS: &str = r#""heartbeat_interval_ms":3600000"#;

/// A running `contract-impl core serve`.
pub struct Core {
    child: Option<Child>,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Holds the data directory and the configuration file.
    pub dir: tempfile::TempDir,
    config: PathBuf,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Core {
    /// Starts Core with `timers` (a JSON object body, e.g. `"cancel_confirm_ms":300`)
    /// merged after a long heartbeat interval.
    pub fn start(timers: &str) -> Core {
        Self::start_with(timers, "")
    }

    /// Starts Core with `timers` as [`Core::start`] and `limits` (a JSON object body,
    /// e.g. `"response_bytes_in_flight":4194304`; empty: none).
    pub fn start_with(timers: &str, limits: &str) -> Core {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("core.json");
        let sep = if timers.is_empty() { "" } else { "," };
        std::fs::write(
            &config,
            format!(r#"{{"timers":{{{QUIET_TIMERS}{sep}{timers}}},"limits":{{{limits}}}}}"#),
        )
        .unwrap();
        let mut core = Core {
            child: None,
            base: String::new(),
            dir,
            config,
        };
        core.spawn();
        core
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn spawn(&mut self) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_contract-impl"))
            .args(["core", "serve"])
            .env("CONTRACT_LISTEN", "127.0.0.1:0")
            .env("CONTRACT_DATA_DIR", self.data_dir())
            .env("CONTRACT_DEVICE_ID", DEVICE)
            .env("CONTRACT_DAEMON_CREDENTIAL", SECRET)
            .env("CONTRACT_API_KEY", API_KEY)
            .env("CONTRACT_CORE_CONFIG", &self.config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        self.base = ready["ready"]["base_url"].as_str().unwrap().to_string();
        self.child = Some(child);
    }

    /// Core's process ID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("Core runs").id()
    }

    /// SIGKILLs Core (no chance to clean up) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts Core again on the same data directory and configuration.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// The device's durable owner epoch, read from the database (WAL: a concurrent
    /// reader sees committed transactions only).
    pub fn owner_epoch(&self, device: &str) -> i64 {
        let conn = rusqlite::Connection::open_with_flags(
            self.data_dir().join("core.sqlite3"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .unwrap();
        conn.query_row(
            "SELECT owner_epoch FROM devices WHERE device_id = ?1",
            [device],
            |r| r.get(0),
        )
        .unwrap()
    }

    /// The public-API client of this Core.
    pub fn api(&self) -> Api {
        Api::new(&self.base)
    }
}

/// The Project API key the test Cores are started with (`CONTRACT_API_KEY`).
pub const API_KEY: &str = "cpk-test-key";

/// A client that presents [`API_KEY`] on every request.
pub fn api_client() -> reqwest::Client {
    client_with_key(API_KEY)
}

/// A client that presents `key` on every request.
pub fn client_with_key(key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// Public-API client.
pub struct Api {
    client: reqwest::Client,
    v1: String,
}

/// A Session created for a test.
pub struct Session {
    pub session_id: String,
    pub environment_id: String,
}

impl Api {
    /// The public-API client of the Core at `base` (`http://127.0.0.1:<port>`).
    pub fn new(base: &str) -> Api {
        Api {
            client: api_client(),
            v1: format!("{base}/v1"),
        }
    }

    /// The public-API client of the Core at `base`, presenting `key`.
    pub fn with_key(base: &str, key: &str) -> Api {
        Api {
            client: client_with_key(key),
            v1: format!("{base}/v1"),
        }
    }

    /// `POST /v1{path}` → (status, body).
    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .client
            .post(format!("{}{path}", self.v1))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// `GET /v1{path}` → body (asserting 200).
    pub async fn get(&self, path: &str) -> Value {
        let resp = self
            .client
            .get(format!("{}{path}", self.v1))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "GET {path}");
        resp.json().await.unwrap()
    }

    /// Creates an Agent of `agent_kind`, an Environment of `env_type` and a Session.
    pub async fn session(&self, agent_kind: &str, env_type: &str) -> Session {
        let (status, agent) = self
            .post(
                "/agents",
                json!({"agent_kind": agent_kind, "model": "model-a", "system_prompt": "Be brief."}),
            )
            .await;
        assert_eq!(status, 201, "{agent}");
        let (status, env) = self.post("/environments", json!({"type": env_type})).await;
        assert_eq!(status, 201, "{env}");
        let (status, session) = self
            .post(
                "/sessions",
                json!({"agent_id": agent["agent_id"], "environment_id": env["environment_id"]}),
            )
            .await;
        assert_eq!(status, 201, "{session}");
        Session {
            session_id: session["session_id"].as_str().unwrap().into(),
            environment_id: env["environment_id"].as_str().unwrap().into(),
        }
    }

    /// Starts a Turn with one text message; returns the Turn ID.
    pub async fn turn(&self, session: &Session, text: &str) -> String {
        let (status, turn) = self
            .post(
                &format!("/sessions/{}/turns", session.session_id),
                json!({"input": text_input(text)}),
            )
            .await;
        assert_eq!(status, 201, "{turn}");
        turn["turn_id"].as_str().unwrap().into()
    }

    /// Queues an active input; returns its input ID.
    pub async fn input(&self, turn_id: &str, text: &str) -> String {
        let (status, body) = self
            .post(
                &format!("/turns/{turn_id}/inputs"),
                json!({"input": text_input(text)}),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        body["input_id"].as_str().unwrap().into()
    }

    /// Polls `GET /v1{path}` until `done` holds (bounded by [`STEP`]).
    pub async fn wait(&self, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            let v = self.get(path).await;
            if done(&v) {
                return v;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "condition on {path} not reached: {v}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for the Turn to reach `state`; returns it.
    pub async fn wait_state(&self, turn_id: &str, state: &str) -> Value {
        self.wait(&format!("/turns/{turn_id}"), |t| t["state"] == state)
            .await
    }

    /// The Turn's event types, in order.
    pub async fn event_kinds(&self, turn_id: &str) -> Vec<String> {
        let events = self.get(&format!("/turns/{turn_id}/events")).await;
        events["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_string())
            .collect()
    }
}

/// One user message of text.
pub fn text_input(text: &str) -> Value {
    json!([{"role": "user", "content": [{"type": "text", "text": text}]}])
}

/// Every capability field `true`.
pub fn caps() -> Value {
    let fields = contract_impl::core_runtime::wire::AgentKindCapabilities::FIELDS;
    Value::Object(
        fields
            .iter()
            .map(|f| (f.to_string(), Value::Bool(true)))
            .collect(),
    )
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The Run of a Turn the scripted Runtime started.
#[derive(Debug, Clone)]
pub struct Started {
    /// Preparation request ID.
    pub prep_id: Value,
    /// Run ID.
    pub run_id: Value,
    /// The `execution_prepare` frame.
    pub prepare: Value,
}

/// A scripted Runtime on one daemon connection.
pub struct Runtime {
    ws: Ws,
    handles: u64,
}

impl Runtime {
    /// Bootstraps and opens the daemon WebSocket (no heartbeat yet).
    pub async fn connect(base: &str) -> Runtime {
        let resp = reqwest::Client::new()
            .post(format!("{base}/api/v1/agent-daemon/bootstrap"))
            .bearer_auth(SECRET)
            .json(&json!({"device_id": DEVICE}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let body: Value = resp.json().await.unwrap();
        let url = format!(
            "{}?device_id={DEVICE}&version=1.0.0",
            body["connection_url"].as_str().unwrap()
        );
        let mut request = url.into_client_request().unwrap();
        request
            .headers_mut()
            .insert("authorization", format!("Bearer {SECRET}").parse().unwrap());
        let (ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        Runtime { ws, handles: 0 }
    }

    /// Connects and declares `kinds` available with every capability.
    pub async fn connect_with(base: &str, kinds: &[&str]) -> Runtime {
        let mut rt = Runtime::connect(base).await;
        rt.heartbeat(kinds).await;
        rt
    }

    /// Sends a heartbeat declaring `kinds` available with every capability.
    pub async fn heartbeat(&mut self, kinds: &[&str]) {
        let kinds: Vec<Value> = kinds
            .iter()
            .map(|k| json!({"agent_kind": k, "available": true, "capabilities": caps()}))
            .collect();
        self.send(
            json!({"type": "heartbeat", "id": "hb", "payload": {"runtime_version": "test",
            "supported_agent_kinds": kinds}}),
        )
        .await;
    }

    /// Sends one frame.
    pub async fn send(&mut self, frame: Value) {
        self.ws
            .send(Message::text(frame.to_string()))
            .await
            .unwrap();
    }

    /// Awaits the next data frame from Core.
    pub async fn recv(&mut self) -> Value {
        loop {
            let msg = tokio::time::timeout(STEP, self.ws.next())
                .await
                .expect("no frame from Core in time")
                .expect("connection ended")
                .expect("connection error");
            match msg {
                Message::Text(text) => return serde_json::from_str(&text).unwrap(),
                Message::Close(frame) => panic!("closed by Core: {frame:?}"),
                _ => {}
            }
        }
    }

    /// Awaits the next frame and asserts its type.
    pub async fn expect(&mut self, kind: &str) -> Value {
        let frame = self.recv().await;
        assert_eq!(frame["type"], kind, "{frame}");
        frame
    }

    /// Awaits the close frame: (code, reason).
    pub async fn expect_close(&mut self) -> (u16, String) {
        loop {
            match tokio::time::timeout(STEP, self.ws.next()).await.unwrap() {
                Some(Ok(Message::Close(Some(frame)))) => {
                    return (u16::from(frame.code), frame.reason.to_string());
                }
                Some(Ok(Message::Close(None))) | None => return (1005, String::new()),
                Some(Ok(Message::Text(text))) => panic!("frame before close: {text}"),
                Some(Ok(_)) => {}
                Some(Err(e)) => panic!("connection error before close: {e}"),
            }
        }
    }

    /// Answers `runtime_prepare initialize` when the Environment is local.
    pub async fn initialize(&mut self, environment_id: &str) {
        let init = self.expect("runtime_prepare").await;
        assert_eq!(
            init["payload"],
            json!({"phase": "initialize", "environment_id": environment_id})
        );
        self.send(json!({"type": "runtime_prepare_result", "id": init["id"],
            "payload": {"phase": "initialized", "environment_id": environment_id}}))
            .await;
    }

    /// Awaits `execution_prepare` and answers `ready`; awaits `execution_start`.
    /// Returns the Run, without sending `started`.
    pub async fn prepare_and_start(&mut self) -> Started {
        let prepare = self.expect("execution_prepare").await;
        let pid = prepare["id"].clone();
        self.handles += 1;
        let handle = format!("h{}", self.handles);
        self.send(json!({"type": "preparation_status", "id": pid, "payload": {"status": "ready",
            "admission_handle": handle, "revision": 1, "executor_id": "exe1", "expires_in_ms": 300000}}))
            .await;
        let start = self.expect("execution_start").await;
        assert_eq!(start["id"], pid);
        assert_eq!(start["payload"]["admission_handle"], handle);
        Started {
            prep_id: pid,
            run_id: start["payload"]["run_id"].clone(),
            prepare,
        }
    }

    /// Sends `started` for `run`.
    pub async fn started(&mut self, run: &Started) {
        let handle = run_handle(self.handles);
        self.send(
            json!({"type": "preparation_status", "id": run.prep_id, "payload": {"status": "started",
            "admission_handle": handle, "revision": 2, "run_id": run.run_id}}),
        )
        .await;
    }

    /// [`Runtime::prepare_and_start`] then [`Runtime::started`].
    pub async fn run(&mut self) -> Started {
        let run = self.prepare_and_start().await;
        self.started(&run).await;
        run
    }

    /// Sends a Run event of `kind` with `payload`.
    pub async fn event(&mut self, run: &Started, kind: &str, payload: Value) {
        self.send(json!({"type": kind, "id": run.run_id, "payload": payload}))
            .await;
    }
}

fn run_handle(n: u64) -> String {
    format!("h{n}")
}
