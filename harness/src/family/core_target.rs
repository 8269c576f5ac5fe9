//! Side `core` of the Core ↔ Runtime family: **Core is the target** and the harness plays
//! the Runtime (and the user, through `api:` steps).
//!
//! The Core under test is launched per `docs/launch-contract.md` ("Core under test"):
//! `CONTRACT_LISTEN=127.0.0.1:0`, an empty `CONTRACT_DATA_DIR`, `CONTRACT_DEVICE_ID`, a
//! fresh random `CONTRACT_DAEMON_CREDENTIAL` (`rcd_` + 32 hex digits) and
//! `CONTRACT_CORE_CONFIG` ([`default_core_config`] deep-merged with the scenario's
//! `config.core`). It is ready when it prints `{"ready":{"base_url":"…"}}` on stdout
//! (read line by line, bounded: [`READY_LINE_MAX_BYTES`], [`READY_LINES_MAX`], the
//! start-up deadline). Step mapping (the mirror of side `runtime`):
//!
//! | step | what the harness does |
//! |---|---|
//! | `runtime:` | substitute placeholders (minting unbound ones: admission handles, Executor IDs, …), schema-check as Runtime → Core, send as one text frame |
//! | `core:` | the next thing Core does must be a text frame: strict parse, schema-check as Core → Runtime, record, match (Core-generated session, Run and preparation IDs bind to placeholders) |
//! | `native:` | skipped (the scripted Runtime sends the resulting frames itself) |
//! | `api:` | the call (placeholders substituted in path, query values and body) to `<base_url><path>?<query>` (query percent-encoded, [`encode_query`]); status checked, body matched (binds); recorded as `api response`; `poll: true` repeats a GET until it matches, within the step deadline; `await: false` starts the call in its own task and goes on (at most [`API_IN_FLIGHT_MAX`] in flight, each bounded by [`API_ASYNC_CALL_TIMEOUT`]) |
//! | `api_result:` | waits (step deadline) for the answer of the asynchronous call with that `id`, then checks and records it like `api:` |
//! | `bootstrap` | POST the bootstrap request with the Bearer credential (body default `{device_id}`); status and body pattern checked (default `200` with `connection_url` and `heartbeat_interval_ms`); the `connection_url` is used by the next `connect` |
//! | `connect` | dial the WebSocket with the Bearer header and the query (defaults `device_id`, `version: WIRE_VERSION`, overridden key by key); `101` (default) must upgrade, another status must be answered with that status and body pattern. A new connection supersedes the current one, which stays open (unread) until the end of the run, so Core has to fence it itself |
//! | `handshake` | `bootstrap` + `connect` + one full heartbeat (the launch declarations: `config.runtime.agent_kinds` or kind `controlled` with every capability `true`; `runtime_version` [`RUNTIME_VERSION`]), then polls `GET /v1/devices/{device_id}` until Core reports the device connected with a known declaration (step deadline; not recorded). The first `runtime: {type: heartbeat}` after a `connect` waits the same way |
//! | `reconnect` | `bootstrap` + `connect` with defaults |
//! | `silence: d` | Core emits nothing on the connection for `d` |
//! | `any_order` | frames are received until each `core:` expectation matched exactly one |
//! | `disconnect` | the connection is dropped (no Close frame) |
//! | `half_close` | Close (default 1000) is sent; the next event must be Core's Close reply |
//! | `send_bytes` | one raw text/binary message as the Runtime, no schema check |
//! | `expect_close` | the next event must be Core's Close (code/reason checked when given) or, when neither is given, a dropped connection |
//! | `crash` | the connection is dropped, Core's process group is `SIGKILL`ed and Core is started again with the same data directory and environment; the step ends when it is ready |
//! | `expect_exit` | refused: it checks a Runtime process |
//!
//! Everything Core answers or sends is checked for the daemon credential, and Core's
//! stderr and stdout are scanned for it; any sighting fails the run. After the last step
//! of a passing run the harness closes the connection (1000 `scenario complete`) and
//! fails on any non-heartbeat frame Core sends before its Close reply. This module never renders or
//! compares goldens and never prints.

use std::collections::BTreeMap;
use std::time::Duration;

use contract_impl::core_runtime::wire::Direction;
use contract_impl::core_runtime::wire::limits::WIRE_VERSION;
use contract_impl::wire::parse_strict;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::core_runtime::{
    AFTER_LAST_STEP, DEFAULT_CLOSE_CODE, DEFAULT_HEARTBEAT_INTERVAL_MS, DEVICE_ID, DriveFailure,
    DriveOptions, DriveOutcome, END_CLOSE_REASON, deep_merge, default_launch_config, leak_message,
    trailing_frame,
};
use crate::bind::Bindings;
use crate::golden::{EntryKind, GoldenEntry, Recording};
use crate::matcher::{match_frame, schema_check};
use crate::scenario::model::{
    API_IN_FLIGHT_MAX, ApiCall, ApiStep, BootstrapStep, ConnectStep, HttpResponseSpec, Party,
    RawMessage, Scenario, Step,
};
use crate::target::{LaunchSpec, RunDir, Target, redact_secret};
use crate::transport::TransportError;
use crate::transport::client::{HttpAnswer, HttpClient, WsDial, dial_ws};
use crate::transport::http::{BOOTSTRAP_PATH, WS_PATH};
use crate::transport::ws::{WsConnection, WsEvent, truncate};

/// `runtime_version` of the heartbeat the harness sends as the Runtime.
pub const RUNTIME_VERSION: &str = "contract-harness";

/// Envelope ID of the heartbeat `handshake` sends.
pub const HANDSHAKE_HEARTBEAT_ID: &str = "hb-1";

/// Longest stdout line read while waiting for readiness (bytes).
pub const READY_LINE_MAX_BYTES: usize = crate::target::FORWARDED_LINE_MAX_BYTES;

/// Most stdout lines read while waiting for readiness.
pub const READY_LINES_MAX: usize = 64;

/// Pause between two calls of a polling `api:` step (bounded by the step deadline).
pub const API_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Bound on one asynchronous `api:` call (`await: false`), from its start to Core's
/// answer (its `api_result:` step waits at most the step deadline on top of the steps
/// run meanwhile). Above Core's own Files bound (30 s).
pub const API_ASYNC_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Percent-encodes query parameters as `name=value&…` (RFC 3986: every byte but the
/// unreserved `A-Z a-z 0-9 - . _ ~` becomes `%XX`), in the given order.
pub fn encode_query(params: &[(String, String)]) -> String {
    fn encode(text: &str, out: &mut String) {
        for byte in text.bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
                out.push(char::from(byte));
            } else {
                out.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    let mut out = String::new();
    for (i, (name, value)) in params.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        encode(name, &mut out);
        out.push('=');
        encode(value, &mut out);
    }
    out
}

/// An asynchronous `api:` call in flight; its task is aborted when it is dropped (a run
/// that ends early leaves nothing running).
struct InFlightCall {
    api: ApiStep,
    handle: tokio::task::JoinHandle<Result<HttpAnswer, TransportError>>,
}

impl Drop for InFlightCall {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Most superseded connections kept open at once (see `connect`).
pub const SUPERSEDED_CONNECTIONS_MAX: usize = 4;

/// Bound on waiting for a `SIGKILL`ed Core to be reaped.
const KILL_REAP_BOUND: Duration = Duration::from_secs(5);

/// Keys whose values Core generates (IDs, clocks, its own address); goldens replace them
/// by stable aliases unless a placeholder bound them.
pub const CORE_GENERATED_KEYS: &[&str] = &[
    "id",
    "agent_id",
    "session_id",
    "turn_id",
    "run_id",
    "input_id",
    "delivery_id",
    "interaction_id",
    "traceparent",
    "tracestate",
];

/// Keys whose values are clock readings of Core (ms since the epoch): recorded as
/// [`CLOCK_MASK`], since two readings may or may not coincide from run to run (aliasing
/// them by value would make goldens flaky).
pub const CLOCK_KEYS: &[&str] = &["created_at_ms", "updated_at_ms", "recorded_at_ms"];

/// What a clock reading is recorded as.
pub const CLOCK_MASK: &str = "<clock>";

/// What the address part of a `connection_url` is recorded as: Core listens on a port
/// the OS picks (a new one after each `crash`), and only the rest of the URL is Core's
/// choice.
pub const ADDRESS_MASK: &str = "<core-address>";

/// `url` with its `host:port` replaced by [`ADDRESS_MASK`] (`ws://<core-address>/…`).
pub fn mask_address(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let path = rest.find('/').map_or("", |i| &rest[i..]);
            format!("{scheme}://{ADDRESS_MASK}{path}")
        }
        None => url.to_string(),
    }
}

/// `value` with every number under a [`CLOCK_KEYS`] key replaced by [`CLOCK_MASK`] and
/// the address in every `connection_url` string masked ([`mask_address`]).
pub fn mask_clocks(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let masked = match v {
                        Value::Number(_) if CLOCK_KEYS.contains(&k.as_str()) => {
                            Value::String(CLOCK_MASK.into())
                        }
                        Value::String(url) if k == "connection_url" => {
                            Value::String(mask_address(url))
                        }
                        _ => mask_clocks(v),
                    };
                    (k.clone(), masked)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(mask_clocks).collect()),
        other => other.clone(),
    }
}

/// The default Core launch configuration. The announced heartbeat interval is what the
/// scenario's first `handshake: {heartbeat_interval_ms}` names (that step says what Core
/// announces), else one hour (as the scripted Core announces), so no periodic heartbeat
/// is due during a scenario. The scenario's `config.core` is merged over it.
pub fn default_core_config(scenario: &Scenario) -> Value {
    let interval = scenario
        .steps
        .iter()
        .find_map(|step| match step {
            Step::Handshake {
                heartbeat_interval_ms: Some(ms),
            } => Some(*ms),
            _ => None,
        })
        .unwrap_or(DEFAULT_HEARTBEAT_INTERVAL_MS);
    json!({ "timers": { "heartbeat_interval_ms": interval } })
}

/// The heartbeat the harness sends as the Runtime: the scenario's launch declarations
/// (`config.runtime.agent_kinds`, default: kind `controlled`, available, every capability
/// `true`) and [`RUNTIME_VERSION`].
pub fn default_heartbeat(scenario: &Scenario) -> Value {
    let mut launch = default_launch_config();
    if let Some(overlay) = &scenario.config.runtime {
        deep_merge(&mut launch, overlay);
    }
    json!({
        "type": "heartbeat",
        "id": HANDSHAKE_HEARTBEAT_ID,
        "payload": {
            "runtime_version": RUNTIME_VERSION,
            "supported_agent_kinds": launch.get("agent_kinds").cloned().unwrap_or(Value::Array(vec![])),
        }
    })
}

/// A fresh daemon credential: `rcd_` and 32 random hex digits.
pub fn fresh_credential() -> String {
    format!("rcd_{}", uuid::Uuid::new_v4().simple())
}

/// Reads the target's stdout lines ([`Target::take_stdout_lines`]) until the readiness
/// line `{"ready":{"base_url":"…"}}`, reading at most [`READY_LINES_MAX`] lines of at
/// most [`READY_LINE_MAX_BYTES`] each. Other lines are skipped. Returns the base URL.
/// (Stdout stays tailed and scanned for the credential by the [`Target`] throughout.)
///
/// # Errors
/// A description when stdout ends, a line is too long or no readiness line came within
/// the bound.
pub async fn read_ready_line(mut lines: mpsc::Receiver<Vec<u8>>) -> Result<String, String> {
    for _ in 0..READY_LINES_MAX {
        let Some(line) = lines.recv().await else {
            return Err("stdout ended before the readiness line".into());
        };
        if line.len() > READY_LINE_MAX_BYTES {
            return Err(format!(
                "a stdout line exceeds {READY_LINE_MAX_BYTES} bytes before readiness"
            ));
        }
        if let Some(url) = ready_base_url(&line) {
            return Ok(url);
        }
    }
    Err(format!(
        "no readiness line {{\"ready\":{{\"base_url\":…}}}} among the first {READY_LINES_MAX} stdout lines"
    ))
}

/// The base URL of a readiness line, if `line` is one (`http://` URLs only).
pub fn ready_base_url(line: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(line).ok()?;
    let url = value.get("ready")?.get("base_url")?.as_str()?;
    url.starts_with("http://")
        .then(|| url.trim_end_matches('/').to_string())
}

/// Drives `scenario` with Core as the target. Never panics on target behaviour; Core is
/// always stopped before this returns.
pub async fn drive(scenario: &Scenario, opts: &DriveOptions) -> DriveOutcome {
    let mut outcome = DriveOutcome {
        failure: None,
        recording: Recording::new(),
        bindings: Bindings::new(),
        stderr_tail: String::new(),
        stdout_tail: String::new(),
        exit: None,
    };
    let fail = |what: &str, message: String| DriveFailure {
        scenario: scenario.id(),
        step: None,
        what: what.to_string(),
        message,
    };
    let launched = match Launcher::prepare(scenario, opts) {
        Ok(launcher) => launcher,
        Err(message) => {
            outcome.failure = Some(fail("launch", message));
            return outcome;
        }
    };
    let http = match HttpClient::new() {
        Ok(h) => h,
        Err(e) => {
            outcome.failure = Some(fail("launch", e.to_string()));
            return outcome;
        }
    };
    let (target, base_url) = match launched.launch(opts.startup_timeout).await {
        Ok(started) => started,
        Err(message) => {
            outcome.failure = Some(fail("launch", message));
            return outcome;
        }
    };
    let mut session = CoreSession {
        launcher: launched,
        target,
        base_url,
        earlier_stderr: String::new(),
        earlier_leak: None,
        http,
        ws: None,
        superseded: Vec::new(),
        connection_url: None,
        undeclared: None,
        heartbeat: default_heartbeat(scenario),
        bindings: Bindings::new(),
        recording: Recording::new(),
        step_timeout: opts.step_timeout,
        startup_timeout: opts.startup_timeout,
        step: 0,
        in_flight: BTreeMap::new(),
    };
    let mut failure = None;
    for (i, step) in scenario.steps.iter().enumerate() {
        session.step = i + 1;
        if let Err(message) = session.run_step(step).await {
            failure = Some(DriveFailure {
                scenario: scenario.id(),
                step: Some(i + 1),
                what: step.describe(),
                message,
            });
            break;
        }
    }
    if failure.is_none()
        && let Err(message) = session.finish().await
    {
        failure = Some(fail(AFTER_LAST_STEP, message));
    }
    let CoreSession {
        bindings,
        recording,
        ws,
        superseded,
        mut target,
        earlier_stderr,
        earlier_leak,
        launcher,
        ..
    } = session;
    drop(ws);
    drop(superseded);
    let exit = target.shutdown().await;
    let leaked = earlier_leak.or(target.leak_channel());
    if failure.is_none()
        && let Some(channel) = leaked
    {
        failure = Some(fail(
            "end of run",
            leak_message(&format!("Core's {channel}")),
        ));
    }
    let credential = launcher.credential.as_str();
    outcome.failure = failure.map(|mut f| {
        f.message = redact_secret(&f.message, credential);
        f
    });
    outcome.recording = recording;
    outcome.bindings = bindings;
    outcome.stderr_tail = redact_secret(
        &format!("{earlier_stderr}{}", target.stderr_tail()),
        credential,
    );
    outcome.stdout_tail = redact_secret(&target.stdout_tail(), credential);
    outcome.exit = exit.map(|s| s.to_string());
    drop(launcher);
    outcome
}

/// Everything needed to (re)start the Core under test: the run directory (data
/// directory and configuration file live there) and the launch specification.
struct Launcher {
    run_dir: RunDir,
    spec: LaunchSpec,
    credential: String,
}

impl Launcher {
    fn prepare(scenario: &Scenario, opts: &DriveOptions) -> Result<Self, String> {
        let run_dir = RunDir::new().map_err(|e| e.to_string())?;
        let data_dir = run_dir.path().join("data");
        std::fs::create_dir(&data_dir)
            .map_err(|e| format!("cannot create {}: {e}", data_dir.display()))?;
        let mut config = default_core_config(scenario);
        if let Some(overlay) = &scenario.config.core {
            deep_merge(&mut config, overlay);
        }
        let text = serde_json::to_string_pretty(&config).map_err(|e| e.to_string())?;
        let config_path = run_dir.write_config(&text).map_err(|e| e.to_string())?;
        let credential = fresh_credential();
        let env = vec![
            ("CONTRACT_LISTEN".to_string(), "127.0.0.1:0".to_string()),
            (
                "CONTRACT_DATA_DIR".to_string(),
                data_dir.display().to_string(),
            ),
            ("CONTRACT_DEVICE_ID".to_string(), DEVICE_ID.to_string()),
            ("CONTRACT_DAEMON_CREDENTIAL".to_string(), credential.clone()),
            (
                "CONTRACT_CORE_CONFIG".to_string(),
                config_path.display().to_string(),
            ),
        ];
        let spec = LaunchSpec {
            command: opts.target_cmd.clone(),
            env,
            cwd: run_dir.cwd(),
            secret: credential.clone(),
            capture_stdout: true,
        };
        Ok(Self {
            run_dir,
            spec,
            credential,
        })
    }

    /// Starts Core and waits for its readiness line; returns the process and its base
    /// URL (the process keeps tailing and scanning the rest of its stdout).
    async fn launch(&self, deadline: Duration) -> Result<(Target, String), String> {
        let _ = &self.run_dir;
        let mut target = Target::spawn(&self.spec).map_err(|e| e.to_string())?;
        let Some(lines) = target.take_stdout_lines() else {
            target.shutdown().await;
            return Err("the target's stdout was not captured".into());
        };
        match target.await_ready(read_ready_line(lines), deadline).await {
            Ok(base_url) => Ok((target, base_url)),
            Err(e) => {
                target.shutdown().await;
                Err(e.to_string())
            }
        }
    }
}

/// The live state of one run (side `core`).
struct CoreSession {
    launcher: Launcher,
    target: Target,
    base_url: String,
    /// Stderr tails of Core processes killed by `crash` steps.
    earlier_stderr: String,
    /// The output channel on which a killed Core process had leaked the credential.
    earlier_leak: Option<&'static str>,
    http: HttpClient,
    ws: Option<WsConnection>,
    /// Earlier connections a later `connect` superseded, kept open (see [`Self::connect`]).
    superseded: Vec<WsConnection>,
    /// The `connection_url` of the last successful bootstrap.
    connection_url: Option<String>,
    /// The device of the current connection while no heartbeat was sent on it: the
    /// next `runtime: {type: heartbeat}` step waits for Core to apply it
    /// ([`Self::await_declaration`]).
    undeclared: Option<String>,
    heartbeat: Value,
    bindings: Bindings,
    recording: Recording,
    step_timeout: Duration,
    startup_timeout: Duration,
    /// 1-based index of the running step.
    step: usize,
    /// Asynchronous `api:` calls started and not yet awaited, by ID (at most
    /// [`API_IN_FLIGHT_MAX`]).
    in_flight: BTreeMap<String, InFlightCall>,
}

type StepResult<T = ()> = Result<T, String>;

fn show(value: &Value) -> String {
    truncate(&value.to_string(), 300)
}

fn show_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// An HTTP answer's body as JSON: `null` when empty, the text as a string when it is not
/// JSON. HTTP answers are not wire frames: `null` values are allowed in them.
fn answer_body(answer: &HttpAnswer) -> Value {
    if answer.body.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(&answer.body)
        .unwrap_or_else(|_| Value::String(truncate(&String::from_utf8_lossy(&answer.body), 2000)))
}

impl CoreSession {
    async fn run_step(&mut self, step: &Step) -> StepResult {
        match step {
            Step::Frame {
                party: Party::Core,
                frame,
            } => {
                let value = self.expect_frame(&show(frame)).await?;
                match_frame(frame, &value, &mut self.bindings).map_err(|m| {
                    format!(
                        "emitted frame does not match: {m}\n  emitted: {}",
                        show(&value)
                    )
                })
            }
            Step::Frame {
                party: Party::Runtime,
                frame,
            } => {
                self.send_frame(frame).await?;
                // The first heartbeat on a fresh connection: wait until Core applied it.
                if frame.get("type").and_then(Value::as_str) == Some("heartbeat")
                    && let Some(device) = self.undeclared.take()
                {
                    self.await_declaration(&device).await?;
                }
                Ok(())
            }
            Step::Frame { party, .. } => Err(format!("`{party}` cannot send frames")),
            Step::Native { .. } => Ok(()),
            Step::Bootstrap(spec) => self.bootstrap(spec, None).await,
            Step::Connect(spec) => self.connect(spec).await,
            Step::Handshake {
                heartbeat_interval_ms,
            } => {
                self.bootstrap(&BootstrapStep::default(), *heartbeat_interval_ms)
                    .await?;
                self.connect(&ConnectStep::default()).await?;
                let heartbeat = self.heartbeat.clone();
                self.send_frame(&heartbeat).await?;
                self.undeclared = None;
                self.await_declaration(DEVICE_ID).await
            }
            Step::Reconnect => {
                self.bootstrap(&BootstrapStep::default(), None).await?;
                self.connect(&ConnectStep::default()).await
            }
            Step::Silence(d) => self.silence(*d).await,
            Step::AnyOrder(steps) => self.any_order(steps).await,
            Step::Disconnect => match self.ws.take() {
                Some(conn) => {
                    conn.abort();
                    Ok(())
                }
                None => Err("there is no WebSocket connection to drop".into()),
            },
            Step::HalfClose { code, reason } => {
                self.half_close(
                    code.unwrap_or(DEFAULT_CLOSE_CODE),
                    reason.as_deref().unwrap_or(""),
                )
                .await
            }
            Step::SendBytes(raw) => {
                let timeout = self.step_timeout;
                let conn = self.connection()?;
                let sent = match raw {
                    RawMessage::Text(text) => conn.send_text(text.clone(), timeout).await,
                    RawMessage::Binary(bytes) => conn.send_binary(bytes.clone(), timeout).await,
                };
                sent.map_err(|e| format!("sending raw bytes failed: {e}"))
            }
            Step::ExpectClose { code, reason } => self.expect_close(*code, reason.as_deref()).await,
            Step::Api(api) => self.api(api).await,
            Step::ApiResult(r) => self.api_result(&r.id).await,
            Step::Crash => self.crash().await,
            Step::ExpectExit { .. } => Err(
                "expect_exit checks the exit of a target Runtime process; with Core as the \
                 target it has no meaning (give the scenario `sides: [runtime]`)"
                    .into(),
            ),
        }
    }

    fn connection(&mut self) -> StepResult<&mut WsConnection> {
        self.ws.as_mut().ok_or_else(|| {
            "there is no WebSocket connection (no `connect`/`handshake` step before, or it ended)"
                .to_string()
        })
    }

    /// Records an emission, clock readings masked ([`mask_clocks`]).
    fn record(&mut self, label: &str, kind: EntryKind, body: Value) {
        self.recording.push(GoldenEntry {
            step: self.step,
            label: label.to_string(),
            kind,
            body: mask_clocks(&body),
        });
    }

    fn check_secret(&self, text: &str, place: &str) -> StepResult {
        if text.contains(self.launcher.credential.as_str()) {
            return Err(leak_message(place));
        }
        Ok(())
    }

    /// The next event on the connection within `timeout` (`None`: nothing came).
    async fn next_event(&mut self, timeout: Duration) -> StepResult<Option<WsEvent>> {
        let Some(conn) = self.ws.as_mut() else {
            return Ok(None);
        };
        let event = match tokio::time::timeout(timeout, conn.recv()).await {
            Err(_) => return Ok(None),
            Ok(None) => {
                self.ws = None;
                Some(WsEvent::Eof)
            }
            Ok(Some(event)) => Some(event),
        };
        match &event {
            Some(WsEvent::Text(text)) => self.check_secret(text, "a text frame")?,
            Some(WsEvent::Binary(bytes)) => {
                self.check_secret(&String::from_utf8_lossy(bytes), "a binary message")?;
            }
            Some(WsEvent::Close { reason, .. }) => self.check_secret(reason, "a close reason")?,
            _ => {}
        }
        Ok(event)
    }

    /// After the last step of a passing scenario (the mirror of side `runtime`): sends
    /// Close (1000, [`END_CLOSE_REASON`]) on the current connection and reads what Core
    /// sends until its Close reply or the connection's end, within the step deadline.
    /// Every data frame in between is schema- and credential-checked and fails the
    /// scenario unless it is a heartbeat. Superseded connections are not read.
    async fn finish(&mut self) -> StepResult {
        if self.ws.is_none() {
            return Ok(());
        }
        let timeout = self.step_timeout;
        let deadline = Instant::now() + timeout;
        let _ = self
            .connection()?
            .send_close(DEFAULT_CLOSE_CODE, END_CLOSE_REASON, timeout)
            .await;
        while self.ws.is_some() {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_event(left).await? {
                None => {
                    return Err(format!(
                        "Core answered the harness's Close ({DEFAULT_CLOSE_CODE} \
                         {END_CLOSE_REASON:?}) neither with its Close nor by closing the \
                         connection within {}",
                        show_duration(timeout)
                    ));
                }
                Some(WsEvent::Text(text)) => trailing_frame(&text, Direction::CoreToRuntime)?,
                Some(WsEvent::Close { .. } | WsEvent::Eof) => self.ws = None,
                Some(other) => {
                    return Err(format!(
                        "unexpected {} after the last step",
                        other.describe()
                    ));
                }
            }
        }
        Ok(())
    }

    fn nothing(&self, expected: &str) -> String {
        let state = if self.ws.is_some() {
            ""
        } else {
            " (no WebSocket connection is open)"
        };
        format!(
            "expected {expected}, got nothing within {}{state}",
            show_duration(self.step_timeout)
        )
    }

    /// Receives the next text frame from Core, schema-checks it as Core → Runtime and
    /// records it.
    async fn expect_frame(&mut self, expected: &str) -> StepResult<Value> {
        let text = match self.next_event(self.step_timeout).await? {
            Some(WsEvent::Text(text)) => text,
            Some(other) => return Err(format!("expected {expected}, got {}", other.describe())),
            None => return Err(self.nothing(expected)),
        };
        let value = parse_strict(text.as_bytes()).map_err(|e| {
            format!(
                "expected {expected}, got an invalid frame ({}: {e}): {}",
                e.code(),
                truncate(&text, 300)
            )
        })?;
        schema_check(&value, Direction::CoreToRuntime).map_err(|e| {
            format!(
                "emitted frame violates the wire schema ({}: {e}): {}",
                e.code(),
                show(&value)
            )
        })?;
        self.record("core frame", EntryKind::Frame, value.clone());
        Ok(value)
    }

    async fn send_frame(&mut self, template: &Value) -> StepResult {
        let frame = self
            .bindings
            .substitute(template, true)
            .map_err(|e| format!("cannot build the frame to send: {e}"))?;
        schema_check(&frame, Direction::RuntimeToCore).map_err(|e| {
            format!(
                "the scenario's runtime frame is invalid ({}: {e}); use send_bytes to send malformed input on purpose",
                e.code()
            )
        })?;
        let text = contract_impl::wire::encode_strict(&frame)
            .map_err(|e| format!("cannot encode the frame to send: {e}"))?;
        let timeout = self.step_timeout;
        self.connection()?
            .send_text(text, timeout)
            .await
            .map_err(|e| format!("sending the frame failed: {e}"))
    }

    /// Checks an answer against `expect` (status, then body pattern; binds on success
    /// only).
    fn check_answer(
        &mut self,
        what: &str,
        expect: &HttpResponseSpec,
        answer: &HttpAnswer,
        body: &Value,
    ) -> StepResult {
        if answer.status != expect.status {
            return Err(format!(
                "{what}: expected status {}, got {} with body {}",
                expect.status,
                answer.status,
                show(body)
            ));
        }
        if let Some(pattern) = &expect.body {
            let mut trial = self.bindings.clone();
            match_frame(pattern, body, &mut trial)
                .map_err(|m| format!("{what}: body does not match: {m}\n  body: {}", show(body)))?;
            self.bindings = trial;
        }
        Ok(())
    }

    async fn bootstrap(&mut self, spec: &BootstrapStep, heartbeat_ms: Option<u64>) -> StepResult {
        let request = spec
            .request
            .clone()
            .unwrap_or_else(|| json!({"device_id": DEVICE_ID}));
        let request = self
            .bindings
            .substitute(&request, true)
            .map_err(|e| format!("cannot build the bootstrap request: {e}"))?;
        let url = format!("{}{BOOTSTRAP_PATH}", self.base_url);
        let answer = self
            .http
            .request(
                "POST",
                &url,
                Some(&self.launcher.credential),
                Some(request.to_string().into_bytes()),
                self.step_timeout,
            )
            .await
            .map_err(|e| format!("the bootstrap request failed: {e}"))?;
        self.check_secret(
            &String::from_utf8_lossy(&answer.body),
            "the bootstrap answer",
        )?;
        let body = answer_body(&answer);
        self.record(
            "bootstrap response",
            EntryKind::HttpResponse,
            json!({"status": answer.status, "body": body}),
        );
        let interval = heartbeat_ms.map_or(json!("$_"), Value::from);
        let expect = spec.response.clone().unwrap_or(HttpResponseSpec {
            status: 200,
            body: Some(json!({"connection_url": "$_", "heartbeat_interval_ms": interval})),
        });
        self.check_answer("bootstrap", &expect, &answer, &body)?;
        if (200..300).contains(&answer.status)
            && let Some(url) = body.get("connection_url").and_then(Value::as_str)
        {
            self.connection_url = Some(url.to_string());
        }
        Ok(())
    }

    async fn connect(&mut self, spec: &ConnectStep) -> StepResult {
        let mut query = json!({"device_id": DEVICE_ID, "version": WIRE_VERSION});
        if let Some(overlay) = &spec.query {
            let overlay = self
                .bindings
                .substitute(overlay, true)
                .map_err(|e| format!("cannot build the connect query: {e}"))?;
            deep_merge(&mut query, &overlay);
        }
        let base = self.connection_url.clone().unwrap_or_else(|| {
            format!("{}{WS_PATH}", self.base_url.replacen("http://", "ws://", 1))
        });
        let mut url = reqwest::Url::parse(&base)
            .map_err(|e| format!("Core's connection URL {base:?} is not a URL: {e}"))?;
        if let Value::Object(pairs) = &query {
            let mut q = url.query_pairs_mut();
            for (key, value) in pairs {
                let text = match value {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                q.append_pair(key, &text);
            }
        }
        let expect = spec.response.clone().unwrap_or(HttpResponseSpec {
            status: 101,
            body: None,
        });
        let dial = dial_ws(url.as_str(), &self.launcher.credential, self.step_timeout)
            .await
            .map_err(|e| format!("the WebSocket dial failed: {e}"))?;
        match dial {
            WsDial::Upgraded(conn) => {
                self.undeclared = query
                    .get("device_id")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                self.record(
                    "connect response",
                    EntryKind::HttpResponse,
                    json!({"status": 101}),
                );
                // A new connection replaces the old one as the one the steps use. The old
                // one stays open (unread) until the end of the run, so Core must fence it
                // itself rather than see it drop; the oldest is dropped beyond the bound.
                if let Some(old) = self.ws.replace(conn) {
                    if self.superseded.len() >= SUPERSEDED_CONNECTIONS_MAX {
                        self.superseded.remove(0);
                    }
                    self.superseded.push(old);
                }
                if expect.status != 101 {
                    return Err(format!(
                        "connect: expected status {}, Core upgraded the connection (101)",
                        expect.status
                    ));
                }
                Ok(())
            }
            WsDial::Refused(answer) => {
                self.check_secret(&String::from_utf8_lossy(&answer.body), "the connect answer")?;
                let body = answer_body(&answer);
                self.record(
                    "connect response",
                    EntryKind::HttpResponse,
                    json!({"status": answer.status, "body": body}),
                );
                self.check_answer("connect", &expect, &answer, &body)
            }
        }
    }

    /// Polls Core's device status (`GET /v1/devices/{device}`, "Core under test" in
    /// `docs/launch-contract.md`) until the device is connected with a known
    /// declaration, within the step deadline. Core announces no event for having
    /// applied a heartbeat, so this is a bounded poll; the polls are not recorded.
    async fn await_declaration(&mut self, device: &str) -> StepResult {
        let url = format!("{}/v1/devices/{device}", self.base_url);
        let deadline = Instant::now() + self.step_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .http
                .request("GET", &url, None, None, left)
                .await
                .map_err(|e| format!("device status of {device:?}: the request failed: {e}"))?;
            let body = answer_body(&answer);
            let ready = answer.status == 200
                && body.get("connected") == Some(&Value::Bool(true))
                && body.get("declaration_known") == Some(&Value::Bool(true));
            if ready {
                return Ok(());
            }
            if Instant::now() + API_POLL_INTERVAL >= deadline {
                return Err(format!(
                    "Core did not report device {device:?} connected with a known declaration \
                     (GET /v1/devices/{device}) within {} after the heartbeat; last answer: \
                     status {} body {}",
                    show_duration(self.step_timeout),
                    answer.status,
                    show(&body)
                ));
            }
            tokio::time::sleep(API_POLL_INTERVAL).await;
        }
    }

    /// The URL of `call`: placeholders substituted in the path segments and the query
    /// values, the query percent-encoded ([`encode_query`]).
    fn api_url(&mut self, call: &ApiCall) -> StepResult<String> {
        let text = |value: Value| match value {
            Value::String(s) => s,
            other => other.to_string(),
        };
        let mut segments = Vec::new();
        for segment in call.path.split('/') {
            let value = self
                .bindings
                .substitute(&Value::String(segment.to_string()), false)
                .map_err(|e| format!("cannot build the path: {e}"))?;
            segments.push(text(value));
        }
        let mut url = format!("{}{}", self.base_url, segments.join("/"));
        if let Some(query) = &call.query {
            let mut params = Vec::new();
            for (name, template) in query {
                let value = self
                    .bindings
                    .substitute(&Value::String(template.clone()), false)
                    .map_err(|e| format!("cannot build the query parameter `{name}`: {e}"))?;
                params.push((name.clone(), text(value)));
            }
            url.push('?');
            url.push_str(&encode_query(&params));
        }
        Ok(url)
    }

    /// Checks and records the final answer of an `api:` call (synchronous or awaited
    /// by `api_result:`).
    fn settle_api(&mut self, api: &ApiStep, answer: &HttpAnswer, polled: bool) -> StepResult {
        let what = format!("api {} {}", api.call.method, api.call.path);
        self.check_secret(&String::from_utf8_lossy(&answer.body), "an API answer")?;
        let answer_value = answer_body(answer);
        let checked = self.check_answer(&what, &api.expect, answer, &answer_value);
        let mut record = json!({
            "method": api.call.method,
            "path": api.call.path,
            "status": answer.status,
            "body": answer_value,
        });
        if let Some(query) = &api.call.query {
            record["query"] = json!(query);
        }
        self.record("api response", EntryKind::HttpResponse, record);
        checked.map_err(|m| {
            if polled {
                format!("{m}\n  (polled until the step deadline)")
            } else {
                m
            }
        })
    }

    async fn api(&mut self, api: &ApiStep) -> StepResult {
        let url = self.api_url(&api.call)?;
        let body = match &api.call.body {
            Some(template) => Some(
                self.bindings
                    .substitute(template, true)
                    .map_err(|e| format!("cannot build the request body: {e}"))?
                    .to_string()
                    .into_bytes(),
            ),
            None => None,
        };
        let what = format!("api {} {}", api.call.method, api.call.path);
        if !api.wait {
            return self.start_api(api, url, body);
        }
        let deadline = Instant::now() + self.step_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .http
                .request(&api.call.method, &url, None, body.clone(), left)
                .await
                .map_err(|e| format!("{what}: the request failed: {e}"))?;
            let retry = api.poll
                && Instant::now() + API_POLL_INTERVAL < deadline
                && self.peek_mismatch(api, &answer);
            if !retry {
                return self.settle_api(api, &answer, api.poll);
            }
            tokio::time::sleep(API_POLL_INTERVAL).await;
        }
    }

    /// Whether `answer` fails `api.expect` (without binding anything).
    fn peek_mismatch(&self, api: &ApiStep, answer: &HttpAnswer) -> bool {
        if answer.status != api.expect.status {
            return true;
        }
        let Some(pattern) = &api.expect.body else {
            return false;
        };
        let mut trial = self.bindings.clone();
        match_frame(pattern, &answer_body(answer), &mut trial).is_err()
    }

    /// Starts the asynchronous call of an `api: {await: false}` step: the request runs
    /// in its own task (bounded by [`API_ASYNC_CALL_TIMEOUT`]) while the next steps run.
    fn start_api(&mut self, api: &ApiStep, url: String, body: Option<Vec<u8>>) -> StepResult {
        let Some(id) = api.id.clone() else {
            return Err("an `api` step with `await: false` needs an `id`".into());
        };
        if self.in_flight.contains_key(&id) {
            return Err(format!("api call `{id}` is already in flight"));
        }
        if self.in_flight.len() >= API_IN_FLIGHT_MAX {
            return Err(format!(
                "at most {API_IN_FLIGHT_MAX} asynchronous api calls may be in flight at once"
            ));
        }
        let http = self.http.clone();
        let method = api.call.method.clone();
        let handle = tokio::spawn(async move {
            http.request(&method, &url, None, body, API_ASYNC_CALL_TIMEOUT)
                .await
        });
        self.in_flight.insert(
            id,
            InFlightCall {
                api: api.clone(),
                handle,
            },
        );
        Ok(())
    }

    /// `api_result:` — awaits the answer of the asynchronous call `id` within the step
    /// deadline, then checks and records it like a synchronous `api:` step.
    async fn api_result(&mut self, id: &str) -> StepResult {
        let Some(mut call) = self.in_flight.remove(id) else {
            return Err(format!(
                "no asynchronous api call `{id}` is in flight (never started, or already awaited)"
            ));
        };
        let what = format!("api {} {}", call.api.call.method, call.api.call.path);
        let joined = tokio::time::timeout(self.step_timeout, &mut call.handle)
            .await
            .map_err(|_| {
                format!(
                    "{what} (`{id}`): no answer within {}",
                    show_duration(self.step_timeout)
                )
            })?;
        let answer = joined
            .map_err(|e| format!("{what} (`{id}`): the request task failed: {e}"))?
            .map_err(|e| format!("{what} (`{id}`): the request failed: {e}"))?;
        self.settle_api(&call.api, &answer, false)
    }

    async fn crash(&mut self) -> StepResult {
        if let Some(conn) = self.ws.take() {
            conn.abort();
        }
        self.superseded.clear();
        self.connection_url = None;
        let status = tokio::time::timeout(KILL_REAP_BOUND, self.target.kill_now())
            .await
            .map_err(|_| "the killed Core was not reaped within 5s".to_string())?
            .map_err(|e| e.to_string())?;
        self.earlier_leak = self.earlier_leak.or(self.target.leak_channel());
        let tail = self.target.stderr_tail();
        if !tail.is_empty() {
            self.earlier_stderr.push_str(&format!(
                "{tail}\n--- crash step {}: {status} ---\n",
                self.step
            ));
        }
        let (target, base_url) = self
            .launcher
            .launch(self.startup_timeout)
            .await
            .map_err(|e| format!("restarting Core after the crash failed: {e}"))?;
        self.target = target;
        self.base_url = base_url;
        Ok(())
    }

    async fn silence(&mut self, duration: Duration) -> StepResult {
        if self.ws.is_none() {
            // No connection: Core has nowhere to emit; the window still passes.
            tokio::time::sleep(duration).await;
            return Ok(());
        }
        match self.next_event(duration).await? {
            None => Ok(()),
            Some(event) => {
                if let WsEvent::Text(text) = &event
                    && let Ok(value) = parse_strict(text.as_bytes())
                {
                    self.record("core frame", EntryKind::Frame, value);
                }
                Err(format!(
                    "expected silence for {}, got {}",
                    show_duration(duration),
                    event.describe()
                ))
            }
        }
    }

    async fn any_order(&mut self, steps: &[Step]) -> StepResult {
        let mut remaining: Vec<&Value> = Vec::new();
        for step in steps {
            match step {
                Step::Frame {
                    party: Party::Core,
                    frame,
                } => remaining.push(frame),
                other => {
                    return Err(format!(
                        "any_order may only hold frames the target emits; found {}",
                        other.describe()
                    ));
                }
            }
        }
        while !remaining.is_empty() {
            let expected = format!(
                "one of {} frames: {}",
                remaining.len(),
                remaining
                    .iter()
                    .map(|v| show(v))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            let value = self.expect_frame(&expected).await?;
            let mut reasons = Vec::new();
            let mut matched = None;
            for (i, pattern) in remaining.iter().enumerate() {
                let mut trial = self.bindings.clone();
                match match_frame(pattern, &value, &mut trial) {
                    Ok(()) => {
                        self.bindings = trial;
                        matched = Some(i);
                        break;
                    }
                    Err(m) => reasons.push(format!("  vs {}: {m}", show(pattern))),
                }
            }
            match matched {
                Some(i) => {
                    remaining.remove(i);
                }
                None => {
                    return Err(format!(
                        "emitted frame matches none of the remaining expectations: {}\n{}",
                        show(&value),
                        reasons.join("\n")
                    ));
                }
            }
        }
        Ok(())
    }

    fn record_close(&mut self, code: Option<u16>, reason: &str) {
        self.record(
            "close",
            EntryKind::Close,
            json!({"event": "close", "code": code, "reason": reason}),
        );
    }

    async fn half_close(&mut self, code: u16, reason: &str) -> StepResult {
        let timeout = self.step_timeout;
        self.connection()?
            .send_close(code, reason, timeout)
            .await
            .map_err(|e| format!("sending Close failed: {e}"))?;
        match self.next_event(self.step_timeout).await? {
            Some(WsEvent::Close { code, reason }) => {
                self.record_close(code, &reason);
                if let Some(conn) = self.ws.take() {
                    conn.finish(self.step_timeout).await;
                }
                Ok(())
            }
            Some(other) => Err(format!(
                "expected Core's Close reply, got {}",
                other.describe()
            )),
            None => Err(self.nothing("Core's Close reply")),
        }
    }

    async fn expect_close(&mut self, code: Option<u16>, reason: Option<&str>) -> StepResult {
        let expected = match (code, reason) {
            (None, None) => "a Close frame or a dropped connection".to_string(),
            _ => format!(
                "a Close frame{}{}",
                code.map(|c| format!(" with code {c}")).unwrap_or_default(),
                reason
                    .map(|r| format!(" with reason {r:?}"))
                    .unwrap_or_default()
            ),
        };
        match self.next_event(self.step_timeout).await? {
            Some(WsEvent::Close {
                code: got_code,
                reason: got_reason,
            }) => {
                self.record_close(got_code, &got_reason);
                if let Some(conn) = self.ws.take() {
                    conn.finish(self.step_timeout).await;
                }
                if code.is_some() && code != got_code {
                    return Err(format!(
                        "expected {expected}, got close {got_code:?} {got_reason:?}"
                    ));
                }
                if reason.is_some_and(|r| r != got_reason) {
                    return Err(format!(
                        "expected {expected}, got close {got_code:?} {got_reason:?}"
                    ));
                }
                Ok(())
            }
            Some(WsEvent::Eof) if code.is_none() && reason.is_none() => {
                self.record("close", EntryKind::Close, json!({"event": "dropped"}));
                self.ws = None;
                Ok(())
            }
            Some(other) => Err(format!("expected {expected}, got {}", other.describe())),
            None => Err(self.nothing(&expected)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_are_masked_at_any_depth() {
        let v = json!({"created_at_ms": 5, "events": [{"recorded_at_ms": 7, "sequence": 1}], "updated_at_ms": "x"});
        assert_eq!(
            mask_clocks(&v),
            json!({"created_at_ms": CLOCK_MASK, "events": [{"recorded_at_ms": CLOCK_MASK, "sequence": 1}], "updated_at_ms": "x"})
        );
    }

    #[test]
    fn addresses_are_masked() {
        assert_eq!(
            mask_address("ws://127.0.0.1:4711/api/v1/agent-daemon/ws"),
            "ws://<core-address>/api/v1/agent-daemon/ws"
        );
        assert_eq!(mask_address("ws://h:1"), "ws://<core-address>");
        assert_eq!(mask_address("nonsense"), "nonsense");
        assert_eq!(
            mask_clocks(&json!({"body": {"connection_url": "ws://a:1/x"}})),
            json!({"body": {"connection_url": "ws://<core-address>/x"}})
        );
    }

    #[test]
    fn ready_lines_are_recognized() {
        assert_eq!(
            ready_base_url(br#"{"ready":{"base_url":"http://127.0.0.1:4000/"}}"#),
            Some("http://127.0.0.1:4000".into())
        );
        assert_eq!(ready_base_url(b"listening"), None);
        assert_eq!(ready_base_url(br#"{"ready":{"base_url":"ftp://x"}}"#), None);
        assert_eq!(ready_base_url(br#"{"ready":{}}"#), None);
    }

    #[test]
    fn credentials_are_fresh_and_shaped() {
        let a = fresh_credential();
        let b = fresh_credential();
        assert_ne!(a, b);
        assert!(a.starts_with("rcd_") && a.len() == 36, "{a}");
        assert!(a[4..].chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn heartbeat_follows_the_launch_declarations() {
        let scenario = Scenario {
            pending: Default::default(),
            family: "core_runtime".into(),
            name: "x".into(),
            summary: String::new(),
            covers: vec![],
            sides: None,
            config: Default::default(),
            steps: vec![],
            path: "x.yaml".into(),
        };
        let hb = default_heartbeat(&scenario);
        schema_check(&hb, Direction::RuntimeToCore).unwrap();
        assert_eq!(hb["payload"]["runtime_version"], RUNTIME_VERSION);
        assert_eq!(
            hb["payload"]["supported_agent_kinds"][0]["agent_kind"],
            "controlled"
        );
        let mut custom = scenario.clone();
        custom.config.runtime = Some(json!({"agent_kinds": []}));
        assert_eq!(
            default_heartbeat(&custom)["payload"]["supported_agent_kinds"],
            json!([])
        );
    }

    #[test]
    fn queries_are_percent_encoded() {
        let params = [
            ("path".to_string(), "src/a b/ü~x.py".to_string()),
            ("q".to_string(), "a&b=c?#%".to_string()),
        ];
        assert_eq!(
            encode_query(&params),
            "path=src%2Fa%20b%2F%C3%BC~x.py&q=a%26b%3Dc%3F%23%25"
        );
        assert_eq!(encode_query(&[("path".into(), String::new())]), "path=");
    }

    // A fake Core for the driver tests: the same test binary, started by the driver as
    // the target with `CRH_FAKE_CORE` set. It serves HTTP with the harness's own scripted
    // server: `GET /v1/wait` is held until a `POST /v1/release` has arrived, then answered
    // `200 {"path", "query"}`; the release itself gets `204`. Anything else: `404`.
    async fn fake_core_main() {
        let mut server = crate::transport::http::ScriptedCore::start().await.unwrap();
        // libtest has printed `test … ` without a line end: start a fresh line.
        println!("\n{}", json!({"ready": {"base_url": server.base_url()}}));
        let mut held = Vec::new();
        // The held call may arrive after the release (its task races the next step).
        let mut released = false;
        while let Some(request) = server.next_request().await {
            match (request.method.as_str(), request.path.as_str()) {
                ("GET", "/v1/wait") => held.push(request),
                ("POST", "/v1/release") => {
                    released = true;
                    request.respond(204, None).unwrap();
                }
                _ => request
                    .respond(404, Some(&json!({"error": "not_found"})))
                    .unwrap(),
            }
            if released {
                for waiting in held.drain(..) {
                    let body = json!({"path": waiting.path, "query": waiting.query});
                    waiting.respond(200, Some(&body)).unwrap();
                }
            }
        }
    }

    /// The fake Core's entry point (a no-op in a normal test run).
    #[test]
    fn fake_core() {
        if std::env::var_os("CRH_FAKE_CORE").is_none() {
            return;
        }
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(fake_core_main());
    }

    async fn drive_fake_core(steps: Vec<Step>) -> DriveOutcome {
        let exe = std::env::current_exe().unwrap();
        let cmd = format!(
            "env CRH_FAKE_CORE=1 {} --exact family::core_target::tests::fake_core --nocapture --test-threads 1",
            shell_words::quote(&exe.display().to_string())
        );
        let opts = DriveOptions {
            target_cmd: cmd,
            step_timeout: Duration::from_millis(1500),
            startup_timeout: Duration::from_secs(20),
        };
        let scenario = Scenario {
            pending: Default::default(),
            family: "core_runtime".into(),
            name: "driver_test".into(),
            summary: String::new(),
            covers: vec![],
            sides: Some(vec![crate::scenario::model::Side::Core]),
            config: Default::default(),
            steps,
            path: "driver_test.yaml".into(),
        };
        drive(&scenario, &opts).await
    }

    fn call(method: &str, path: &str, query: Option<(&str, &str)>) -> ApiCall {
        ApiCall {
            method: method.into(),
            path: path.into(),
            query: query.map(|(k, v)| [(k.to_string(), v.to_string())].into()),
            body: None,
        }
    }

    fn wait_step(id: Option<&str>, expect_body: Option<Value>) -> Step {
        Step::Api(ApiStep {
            call: call("GET", "/v1/wait", Some(("path", "a"))),
            expect: HttpResponseSpec {
                status: 200,
                body: expect_body,
            },
            poll: false,
            id: id.map(Into::into),
            wait: id.is_none(),
        })
    }

    fn release_step() -> Step {
        Step::Api(ApiStep {
            call: call("POST", "/v1/release", None),
            expect: HttpResponseSpec {
                status: 204,
                body: None,
            },
            poll: false,
            id: None,
            wait: true,
        })
    }

    fn failure_text(outcome: &DriveOutcome) -> String {
        outcome
            .failure
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn asynchronous_api_calls_run_while_later_steps_do() {
        // A first synchronous call, then one Core holds until a later step.
        let bind = Step::Api(ApiStep {
            call: call("GET", "/v1/unknown", None),
            expect: HttpResponseSpec {
                status: 404,
                body: Some(json!({"error": "$_"})),
            },
            poll: false,
            id: None,
            wait: true,
        });
        let outcome = drive_fake_core(vec![
            bind,
            Step::Api(ApiStep {
                call: call("GET", "/v1/wait", Some(("path", "src/a b.py"))),
                expect: HttpResponseSpec {
                    status: 200,
                    body: Some(json!({"path": "/v1/wait", "query": "$q"})),
                },
                poll: false,
                id: Some("files1".into()),
                wait: false,
            }),
            // The held call is answered only once this one arrives: a step that waited
            // for the first call's answer would never get here.
            release_step(),
            Step::ApiResult(crate::scenario::model::ApiResultStep {
                id: "files1".into(),
            }),
        ])
        .await;
        assert!(
            outcome.failure.is_none(),
            "{}\n{}",
            failure_text(&outcome),
            outcome.stderr_tail
        );
        assert_eq!(
            outcome.bindings.get("q"),
            Some(&json!("path=src%2Fa%20b.py"))
        );
        let steps: Vec<(usize, &str)> = outcome
            .recording
            .entries
            .iter()
            .map(|e| (e.step, e.label.as_str()))
            .collect();
        // The asynchronous answer is recorded at its `api_result` step.
        assert_eq!(
            steps,
            [
                (1, "api response"),
                (3, "api response"),
                (4, "api response")
            ]
        );
        assert_eq!(
            outcome.recording.entries[2].body["query"],
            json!({"path": "src/a b.py"})
        );
    }

    #[tokio::test]
    async fn an_unanswered_asynchronous_call_fails_its_result_step() {
        let outcome = drive_fake_core(vec![
            wait_step(Some("files1"), None),
            Step::ApiResult(crate::scenario::model::ApiResultStep {
                id: "files1".into(),
            }),
        ])
        .await;
        let failure = outcome.failure.expect("the result step must time out");
        assert_eq!(failure.step, Some(2));
        assert!(
            failure.message.contains("no answer within 1500ms"),
            "{}",
            failure.message
        );
        // A synchronous call that Core holds fails its own step.
        let outcome = drive_fake_core(vec![wait_step(None, None)]).await;
        let failure = outcome.failure.expect("the held call must time out");
        assert_eq!(failure.step, Some(1));
        // An unknown ID (the loader refuses it; the driver still reports it).
        let outcome = drive_fake_core(vec![Step::ApiResult(
            crate::scenario::model::ApiResultStep { id: "nope".into() },
        )])
        .await;
        assert!(
            failure_text(&outcome).contains("no asynchronous api call `nope`"),
            "{}",
            failure_text(&outcome)
        );
    }

    #[tokio::test]
    async fn readiness_skips_other_lines_and_bounds_them() {
        let run = RunDir::new().unwrap();
        let spec = |cmd: &str| LaunchSpec {
            command: cmd.into(),
            env: vec![],
            cwd: run.cwd(),
            secret: String::new(),
            capture_stdout: true,
        };
        let mut t = Target::spawn(&spec(
            "sh -c 'echo starting; echo {\\\"ready\\\":{\\\"base_url\\\":\\\"http://127.0.0.1:9\\\"}}; echo after; sleep 30'",
        ))
        .unwrap();
        let out = t.take_stdout_lines().unwrap();
        let url = t
            .await_ready(read_ready_line(out), Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(url, "http://127.0.0.1:9");
        t.shutdown().await;
        let mut t = Target::spawn(&spec("sh -c 'echo nope; exit 0'")).unwrap();
        let out = t.take_stdout_lines().unwrap();
        let err = read_ready_line(out).await.unwrap_err();
        assert!(err.contains("stdout ended"), "{err}");
        t.shutdown().await;
    }
}
