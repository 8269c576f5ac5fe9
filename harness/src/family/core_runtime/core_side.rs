//! Side `core` of the Core ↔ Runtime family: **Core is the target** and the harness plays
//! the Runtime (and the user, through `api:` steps, [`super::core_api`]).
//!
//! The Core under test is launched per `docs/launch-contract.md` ("Core under test"):
//! `CONTRACT_LISTEN=127.0.0.1:0`, an empty `CONTRACT_DATA_DIR`, `CONTRACT_DEVICE_ID`, a
//! fresh random `CONTRACT_DAEMON_CREDENTIAL` (`rcd_` + 32 hex digits) and
//! `CONTRACT_CORE_CONFIG` ([`default_core_config`] deep-merged with the scenario's
//! `config.core`). It is ready when it prints `{"ready":{"base_url":"…"}}` on stdout
//! (read line by line, bounded: [`READY_LINE_MAX_BYTES`], [`READY_LINES_MAX`], the
//! start-up deadline). The generic steps are the engine's ([`crate::drive`]); with Core
//! as the target, `runtime:` frames are sent and `core:` frames expected. This module
//! adds:
//!
//! | step | what the harness does |
//! |---|---|
//! | `native:` | skipped (the scripted Runtime sends the resulting frames itself) |
//! | `api:`, `api_result:` | calls to Core's public API ([`super::core_api`]) |
//! | `bootstrap` | POST the bootstrap request with the Bearer credential (body default `{device_id}`); status and body pattern checked (default `200` with `connection_url` and `heartbeat_interval_ms`); the `connection_url` is used by the next `connect` |
//! | `connect` | dial the WebSocket with the Bearer header and the query (defaults `device_id`, `version: WIRE_VERSION`, overridden key by key); `101` (default) must upgrade, another status must be answered with that status and body pattern. A new connection supersedes the current one, which stays open (unread) until the end of the run, so Core has to fence it itself |
//! | `handshake` | `bootstrap` + `connect` + one full heartbeat (the launch declarations: `config.runtime.agent_kinds` or kind `controlled` with every capability `true`; `runtime_version` [`RUNTIME_VERSION`]), then polls `GET /v1/devices/{device_id}` until Core reports the device connected with a known declaration (step deadline; not recorded). The first `runtime: {type: heartbeat}` after a `connect` waits the same way |
//! | `reconnect` | `bootstrap` + `connect` with defaults |
//! | `crash` | (engine) the connection is dropped, Core's process group is `SIGKILL`ed and Core is started again with the same data directory and environment ([`Launcher`]) |
//! | `expect_exit` | refused: it checks a Runtime process |
//!
//! Everything Core answers is checked for the daemon credential (the engine checks
//! frames, close reasons and Core's output). Superseded connections are not read.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use contract_impl::core_runtime::wire::limits::WIRE_VERSION;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::codec::CORE_ROLE;
use super::core_api::{API_POLL_INTERVAL, InFlightCall, answer_body};
use super::link::{Link, Seen};
use super::masks::mask_clocks;
use super::steps::{Bootstrap, CoreRuntimePeer, Native, family_step};
use super::{
    BOOTSTRAP_PATH, DEFAULT_HEARTBEAT_INTERVAL_MS, DEVICE_ID, WS_LIMITS, WS_PATH, deep_merge,
    default_launch_config,
};
use crate::drive::{
    Connection, DriveOptions, Event, NoOther, Peer, Process, Role, Run, Started, StepResult, fail,
    show, show_duration,
};
use crate::golden::EntryKind;
use crate::scenario::model::{ApiStep, ConnectStep, HttpResponseSpec, Scenario, Step};
use crate::target::{LaunchSpec, RunDir, Target};
use crate::transport::client::{Auth, HttpAnswer, HttpClient, WsDial, dial_ws};
use crate::transport::ws::WsConnection;

/// `runtime_version` of the heartbeat the harness sends as the Runtime.
pub const RUNTIME_VERSION: &str = "contract-harness";

/// Envelope ID of the heartbeat `handshake` sends.
pub const HANDSHAKE_HEARTBEAT_ID: &str = "hb-1";

/// Longest stdout line read while waiting for readiness (bytes).
pub const READY_LINE_MAX_BYTES: usize = crate::target::FORWARDED_LINE_MAX_BYTES;

/// Most stdout lines read while waiting for readiness.
pub const READY_LINES_MAX: usize = 64;

/// Most superseded connections kept open at once (see `connect`).
pub const SUPERSEDED_CONNECTIONS_MAX: usize = 4;

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

/// Everything needed to (re)start the Core under test: the run directory (data
/// directory and configuration file live there) and the launch specification.
pub struct Launcher {
    run_dir: RunDir,
    spec: LaunchSpec,
    /// The device's daemon credential (`CONTRACT_DAEMON_CREDENTIAL`).
    pub(super) credential: String,
    /// The Project API key Core is launched with (`CONTRACT_API_KEY`); every `api:` call
    /// presents it.
    pub(super) api_key: String,
}

impl Launcher {
    /// Prepares the run directory, the configuration and a fresh credential.
    ///
    /// # Errors
    /// A directory or file could not be created.
    pub fn prepare(scenario: &Scenario, opts: &DriveOptions) -> Result<Self, String> {
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
        let api_key = format!("cpk-{}", uuid::Uuid::new_v4().simple());
        let env = vec![
            ("CONTRACT_API_KEY".to_string(), api_key.clone()),
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
            stdin_pipe: false,
        };
        Ok(Self {
            run_dir,
            spec,
            credential,
            api_key,
        })
    }

    /// Starts Core and waits for its readiness line; returns the process and its base
    /// URL (the process keeps tailing and scanning the rest of its stdout).
    ///
    /// # Errors
    /// The start failed or Core was not ready within `deadline`.
    pub async fn launch(&self, deadline: Duration) -> Result<(Target, String), String> {
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

/// Prepares and launches the Core under test; the peer plays the Runtime against it.
///
/// # Errors
/// The launch failed (the text names why).
pub async fn start(
    scenario: &Scenario,
    opts: &DriveOptions,
) -> Result<Started<ScriptedRuntimePeer>, String> {
    let launcher = Launcher::prepare(scenario, opts)?;
    let http = HttpClient::new().map_err(|e| e.to_string())?;
    let (target, base_url) = launcher.launch(opts.startup_timeout).await?;
    let secret = launcher.credential.clone();
    let heartbeat = default_heartbeat(scenario);
    let declared = super::declared_capabilities(&json!({
        "agent_kinds": heartbeat.pointer("/payload/supported_agent_kinds").cloned().unwrap_or(Value::Null)
    }));
    Ok(Started {
        peer: ScriptedRuntimePeer {
            launcher,
            base_url,
            http,
            ws: Link::default(),
            superseded: Vec::new(),
            connection_url: None,
            undeclared: None,
            heartbeat,
            in_flight: BTreeMap::new(),
        },
        process: Box::new(target),
        secret,
        ready: true,
        normalize: mask_clocks,
        prebound: vec![(super::DECLARED_CAPABILITIES.to_string(), declared)],
    })
}

/// The scripted Runtime (and user) the harness plays against a target Core.
pub struct ScriptedRuntimePeer {
    pub(super) launcher: Launcher,
    pub(super) base_url: String,
    pub(super) http: HttpClient,
    ws: Link,
    /// Earlier connections a later `connect` superseded, kept open (see `connect`).
    superseded: Vec<WsConnection>,
    /// The `connection_url` of the last successful bootstrap.
    connection_url: Option<String>,
    /// The device of the current connection while no heartbeat was sent on it: the
    /// next `runtime: {type: heartbeat}` step waits for Core to apply it.
    undeclared: Option<String>,
    heartbeat: Value,
    /// Asynchronous `api:` calls started and not yet awaited, by ID.
    pub(super) in_flight: BTreeMap<String, InFlightCall>,
}

#[async_trait]
impl Peer for ScriptedRuntimePeer {
    type Other = NoOther;

    const ROLE: &'static Role = &CORE_ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<NoOther>>> {
        // Without a connection Core has nowhere to emit: the wait runs out.
        Ok(match tokio::time::timeout(timeout, self.ws.next()).await {
            Err(_) => None,
            Ok(Seen::Ended) => Some(Event::Eof),
            Ok(Seen::Event(event)) => Some(event),
        })
    }

    fn leak_in_other(&self, other: &NoOther, _secret: &str) -> Option<String> {
        match *other {}
    }

    fn connection(&mut self) -> &mut dyn Connection {
        &mut self.ws
    }

    fn trailing_other(&mut self, other: NoOther) -> StepResult {
        match other {}
    }

    /// The first heartbeat on a fresh connection: wait until Core applied it.
    async fn frame_sent(&mut self, run: &mut Run, frame: &Value) -> StepResult {
        if frame.get("type").and_then(Value::as_str) == Some("heartbeat")
            && let Some(device) = self.undeclared.take()
        {
            self.await_declaration(run, &device).await?;
        }
        Ok(())
    }

    async fn family_step(&mut self, run: &mut Run, step: &Step) -> StepResult {
        family_step(self, run, step).await
    }

    fn crashed(&mut self) {
        self.ws.abort();
        self.superseded.clear();
        self.connection_url = None;
    }

    async fn relaunch(&mut self, startup_timeout: Duration) -> Result<Box<dyn Process>, String> {
        let (target, base_url) = self.launcher.launch(startup_timeout).await?;
        self.base_url = base_url;
        Ok(Box::new(target))
    }

    fn release(&mut self) {
        self.ws.abort();
        self.superseded.clear();
        self.in_flight.clear();
    }
}

impl ScriptedRuntimePeer {
    /// Checks an answer against `expect` (status, then body pattern; binds on success
    /// only).
    pub(super) fn check_answer(
        run: &mut Run,
        what: &str,
        expect: &HttpResponseSpec,
        answer: &HttpAnswer,
        body: &Value,
    ) -> StepResult {
        if answer.status != expect.status {
            return Err(fail::mismatch(format!(
                "{what}: expected status {}, got {} with body {}",
                expect.status,
                answer.status,
                show(body)
            )));
        }
        if let Some(pattern) = &expect.body {
            let mut trial = run.bindings.clone();
            crate::matcher::match_frame(pattern, body, &mut trial).map_err(|m| {
                fail::mismatch(format!(
                    "{what}: body does not match: {m}\n  body: {}",
                    show(body)
                ))
            })?;
            run.bindings = trial;
        }
        Ok(())
    }

    /// Polls Core's device status (`GET /v1/devices/{device}`, "Core under test" in
    /// `docs/launch-contract.md`) until the device is connected with a known
    /// declaration, within the step deadline. Core announces no event for having
    /// applied a heartbeat, so this is a bounded poll; the polls are not recorded.
    async fn await_declaration(&mut self, run: &mut Run, device: &str) -> StepResult {
        let url = format!("{}/v1/devices/{device}", self.base_url);
        let deadline = Instant::now() + run.step_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .http
                .request(
                    "GET",
                    &url,
                    Some(Auth::bearer(&self.launcher.api_key)),
                    None,
                    left,
                )
                .await
                .map_err(|e| {
                    fail::transport(format!(
                        "device status of {device:?}: the request failed: {e}"
                    ))
                })?;
            let body = answer_body(&answer);
            let ready = answer.status == 200
                && body.get("connected") == Some(&Value::Bool(true))
                && body.get("declaration_known") == Some(&Value::Bool(true));
            if ready {
                return Ok(());
            }
            if Instant::now() + API_POLL_INTERVAL >= deadline {
                return Err(fail::timeout(format!(
                    "Core did not report device {device:?} connected with a known declaration \
                     (GET /v1/devices/{device}) within {} after the heartbeat; last answer: \
                     status {} body {}",
                    show_duration(run.step_timeout),
                    answer.status,
                    show(&body)
                )));
            }
            tokio::time::sleep(API_POLL_INTERVAL).await;
        }
    }
}

#[async_trait]
impl CoreRuntimePeer for ScriptedRuntimePeer {
    async fn bootstrap(&mut self, run: &mut Run, call: Bootstrap<'_>) -> StepResult {
        let Bootstrap {
            spec,
            heartbeat_ms,
            within: _,
        } = call;
        let request = spec
            .request
            .clone()
            .unwrap_or_else(|| json!({"device_id": DEVICE_ID}));
        let request = run
            .bindings
            .substitute(&request, true)
            .map_err(|e| fail::scenario(format!("cannot build the bootstrap request: {e}")))?;
        let url = format!("{}{BOOTSTRAP_PATH}", self.base_url);
        let bearer = match spec.credential.as_deref() {
            None | Some("daemon") => self.launcher.credential.clone(),
            Some("api_key") => self.launcher.api_key.clone(),
            Some(other) => {
                return Err(fail::scenario(format!(
                    "bootstrap.credential is `daemon` or `api_key`, not `{other}`"
                )));
            }
        };
        let answer = self
            .http
            .request(
                "POST",
                &url,
                Some(Auth::with_scheme(spec.scheme.as_deref(), &bearer)),
                Some(request.to_string().into_bytes()),
                run.step_timeout,
            )
            .await
            .map_err(|e| fail::transport(format!("the bootstrap request failed: {e}")))?;
        run.check_secret(
            &String::from_utf8_lossy(&answer.body),
            "the bootstrap answer",
        )?;
        let body = answer_body(&answer);
        run.record(
            "bootstrap response",
            EntryKind::HttpResponse,
            json!({"status": answer.status, "body": body}),
        );
        let interval = heartbeat_ms.map_or(json!("$_"), Value::from);
        let expect = spec.response.clone().unwrap_or(HttpResponseSpec {
            status: 200,
            body: Some(json!({"connection_url": "$_", "heartbeat_interval_ms": interval})),
        });
        Self::check_answer(run, "bootstrap", &expect, &answer, &body)?;
        if (200..300).contains(&answer.status)
            && let Some(url) = body.get("connection_url").and_then(Value::as_str)
        {
            self.connection_url = Some(url.to_string());
        }
        Ok(())
    }

    async fn connect(&mut self, run: &mut Run, spec: &ConnectStep) -> StepResult {
        let mut query = json!({"device_id": DEVICE_ID, "version": WIRE_VERSION});
        if let Some(overlay) = &spec.query {
            let overlay = run
                .bindings
                .substitute(overlay, true)
                .map_err(|e| fail::scenario(format!("cannot build the connect query: {e}")))?;
            deep_merge(&mut query, &overlay);
        }
        let base = self.connection_url.clone().unwrap_or_else(|| {
            format!("{}{WS_PATH}", self.base_url.replacen("http://", "ws://", 1))
        });
        let mut url = reqwest::Url::parse(&base).map_err(|e| {
            fail::mismatch(format!("Core's connection URL {base:?} is not a URL: {e}"))
        })?;
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
        let dial = dial_ws(
            url.as_str(),
            Auth::with_scheme(spec.scheme.as_deref(), &self.launcher.credential),
            run.step_timeout,
            WS_LIMITS,
        )
        .await
        .map_err(|e| fail::transport(format!("the WebSocket dial failed: {e}")))?;
        match dial {
            WsDial::Upgraded(conn) => {
                self.undeclared = query
                    .get("device_id")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                run.record(
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
                    return Err(fail::mismatch(format!(
                        "connect: expected status {}, Core upgraded the connection (101)",
                        expect.status
                    )));
                }
                Ok(())
            }
            WsDial::Refused(answer) => {
                run.check_secret(&String::from_utf8_lossy(&answer.body), "the connect answer")?;
                let body = answer_body(&answer);
                run.record(
                    "connect response",
                    EntryKind::HttpResponse,
                    json!({"status": answer.status, "body": body}),
                );
                Self::check_answer(run, "connect", &expect, &answer, &body)
            }
        }
    }

    async fn first_heartbeat(&mut self, run: &mut Run) -> StepResult {
        let heartbeat = self.heartbeat.clone();
        run.send_frame(self, &heartbeat).await?;
        self.undeclared = None;
        self.await_declaration(run, DEVICE_ID).await
    }

    async fn native(&mut self, _run: &mut Run, _call: Native<'_>) -> StepResult {
        Ok(())
    }

    async fn api(&mut self, run: &mut Run, api: &ApiStep) -> StepResult {
        self.call_api(run, api).await
    }

    async fn api_result(&mut self, run: &mut Run, id: &str) -> StepResult {
        self.await_api(run, id).await
    }
}

#[cfg(test)]
#[path = "core_side_tests.rs"]
mod tests;
