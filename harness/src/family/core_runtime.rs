//! The Core ↔ Runtime family driver.
//!
//! **Side `runtime`** (implemented): the Runtime under test is launched per
//! `docs/launch-contract.md` and the harness plays **Core** (the scripted Core of
//! [`crate::transport::http`]) and drives the Runtime's controlled adapter over the control
//! channel ([`super::control`]). Step mapping:
//!
//! | step | what the harness does |
//! |---|---|
//! | `core:` | substitute placeholders (minting unbound ones), schema-check as Core → Runtime, send as one text frame |
//! | `runtime:` | the next thing the target does must be a text frame: strict parse, schema-check as Runtime → Core, record, match |
//! | `native:` | control request `{op, ...args}` (placeholders substituted, unbound minted); `expect` matched against the result |
//! | `bootstrap` | the next request must be the bootstrap POST with the Bearer credential; body matched (default `{device_id}`); answer per `response` (default 200 with `connection_url` and `heartbeat_interval_ms: 3600000`) |
//! | `connect` | the next request must be the WebSocket upgrade with the Bearer credential; query matched (default `{device_id, version: WIRE_VERSION}`); upgrade (default) or answer the scripted status |
//! | `handshake` | `bootstrap` + `connect` + one `runtime: {type: heartbeat}` |
//! | `reconnect` | `bootstrap` + `connect` with defaults |
//! | `silence: d` | nothing (frame, close, HTTP request) may arrive for `d` |
//! | `any_order` | frames are received until each expectation matched exactly one (first match wins) |
//! | `disconnect` | the connection is dropped (no Close frame) |
//! | `half_close` | Close (default 1000) is sent; the next event must be the target's Close reply |
//! | `send_bytes` | one raw text/binary message, no schema check |
//! | `expect_close` | the next event must be a Close (code/reason checked when given) or, when neither is given, a dropped connection |
//! | `api:` | skipped (Core is not the target) |
//! | `expect_exit` | the target process must exit within the step deadline (a dropped WebSocket is expected; a frame, Close or HTTP request first fails); exit code and stderr substring checked when given; records `{exit_code}` (or `{signal}`) as `target exit` |
//!
//! When `expect_exit` is the **first** step, an exit before readiness is not a launch
//! failure: the run proceeds to the step, which checks the exit. A target that became
//! ready instead fails that step.
//!
//! Every HTTP request and WebSocket message the target sends is checked for the daemon
//! credential (URL also percent-encoded, every header but an exact
//! `Authorization: Bearer <credential>`, body, frame, close reason) and the target's
//! stderr and stdout are scanned for it; any sighting fails the run with
//! `credential leaked in <channel>`, the credential redacted from every message.
//! After the last step of a passing run, [`END_CLOSE_REASON`]: the harness closes the
//! connection and fails on any non-heartbeat frame the target emits before its Close
//! reply. Every step has a deadline (`step_timeout`).
//!
//! **Side `core`**: [`drive`] hands the run to [`super::core_target`], where the harness
//! plays the Runtime, performs `api:` steps against the target Core and sends the
//! `runtime:` frames.
//!
//! This module never renders or compares goldens (it returns the [`Recording`] and the
//! [`Bindings`]) and never prints.

use std::fmt;
use std::time::Duration;

use contract_impl::core_runtime::wire::Direction;
use contract_impl::core_runtime::wire::limits::WIRE_VERSION;
use contract_impl::wire::parse_strict;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::control::{ControlChannel, ControlListener};
use crate::bind::Bindings;
use crate::golden::{EntryKind, GoldenEntry, Recording};
use crate::matcher::{match_frame, schema_check};
use crate::scenario::model::{
    BootstrapStep, ConnectStep, ExitCodeSpec, HttpResponseSpec, Party, RawMessage, Scenario, Side,
    Step,
};
use crate::target::{LaunchSpec, RunDir, Startup, Target, contains_secret, redact_secret};
use crate::transport::TransportError;
use crate::transport::http::{BOOTSTRAP_PATH, IncomingRequest, RequestBody, ScriptedCore, WS_PATH};
use crate::transport::ws::{WsConnection, WsEvent, truncate};

/// What a failure found while reading the target's trailing output names.
pub const AFTER_LAST_STEP: &str = "after the last step";

/// The family's name (scenario directory and `--family` value).
pub const FAMILY: &str = "core_runtime";

/// The device ID every launched Runtime presents (`CONTRACT_DEVICE_ID`). Fixed, so that
/// goldens are stable; each run has its own scripted Core, so runs never collide.
pub const DEVICE_ID: &str = "contract-device-1";

/// Default Environment ID of the launch configuration.
pub const ENVIRONMENT_ID: &str = "00000000-0000-4000-8000-000000000001";

/// Heartbeat interval the scripted Core announces by default (ms): long enough that no
/// periodic heartbeat interleaves with a scenario unless the scenario asks for one.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 3_600_000;

/// Close code `half_close` sends by default (normal closure).
pub const DEFAULT_CLOSE_CODE: u16 = 1000;

/// Reason of the Close (code [`DEFAULT_CLOSE_CODE`]) the harness sends after the last
/// step of a passing scenario, before it reads the target's trailing output.
pub const END_CLOSE_REASON: &str = "scenario complete";

/// The one frame type a target may emit after the last step without failing the
/// scenario: heartbeats are periodic by design (still schema- and credential-checked,
/// never recorded).
pub const TRAILING_ALLOWED_TYPE: &str = "heartbeat";

/// The failure text of the credential checks: `credential leaked in <channel>` (the
/// credential itself is never printed).
pub fn leak_message(channel: &str) -> String {
    format!(
        "credential leaked in {channel}; the daemon credential may only appear as \
         `Authorization: Bearer <credential>` (never in a URL, another header, a frame or \
         the target's output)"
    )
}

/// Default wait of the controlled adapter for a request (`timeout_ms`, control-channel.md).
const ADAPTER_DEFAULT_TIMEOUT: Duration = Duration::from_millis(5000);

/// Extra time the harness grants a control request beyond the adapter's own timeout, so
/// the adapter's `timeout` answer arrives before the harness gives up.
const CONTROL_GRACE: Duration = Duration::from_secs(1);

/// Keys whose values the target generates, per side: [`GENERATED_KEYS`] for a Runtime,
/// [`super::core_target::CORE_GENERATED_KEYS`] for Core.
pub fn generated_keys(side: Side) -> &'static [&'static str] {
    match side {
        Side::Runtime => GENERATED_KEYS,
        Side::Core => super::core_target::CORE_GENERATED_KEYS,
    }
}

/// Keys whose values a target Runtime generates; goldens replace them by stable aliases.
pub const GENERATED_KEYS: &[&str] = &[
    "executor_id",
    "admission_handle",
    "runtime_version",
    "run_id",
    "session_id",
    "connection_id",
    "traceparent",
    "tracestate",
];

/// Every capability field of `AgentKindCapabilities`, each `true`.
fn all_capabilities() -> Value {
    serde_json::to_value(contract_impl::core_runtime::wire::AgentKindCapabilities::all(true))
        .unwrap_or_else(|_| Value::Object(Map::new()))
}

/// The default launch configuration (`docs/launch-contract.md`): Environment
/// [`ENVIRONMENT_ID`] / `self_hosted`, one available agent kind `controlled` with every
/// capability `true`. Timers and limits are left to the target's defaults.
pub fn default_launch_config() -> Value {
    json!({
        "environment": { "environment_id": ENVIRONMENT_ID, "environment_type": "self_hosted" },
        "agent_kinds": [
            { "agent_kind": "controlled", "available": true, "capabilities": all_capabilities() }
        ]
    })
}

/// Deep-merges `overlay` into `base`: objects merge key by key, recursively; any other
/// value (arrays included) replaces the base value.
pub fn deep_merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(base), Value::Object(overlay)) => {
            for (key, value) in overlay {
                match base.get_mut(key) {
                    Some(existing) => deep_merge(existing, value),
                    None => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, overlay) => *base = overlay.clone(),
    }
}

/// How to drive one scenario.
#[derive(Debug, Clone)]
pub struct DriveOptions {
    /// The target command (`--target-cmd`).
    pub target_cmd: String,
    /// Deadline of every step.
    pub step_timeout: Duration,
    /// Deadline for the target's readiness.
    pub startup_timeout: Duration,
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveFailure {
    /// Scenario ID (`core_runtime/name`).
    pub scenario: String,
    /// 1-based step index; `None` for launch and end-of-run failures.
    pub step: Option<usize>,
    /// The step's description (`runtime frame heartbeat`) or the phase (`launch`).
    pub what: String,
    /// What was expected and what happened.
    pub message: String,
}

impl fmt::Display for DriveFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.step {
            Some(n) => write!(
                f,
                "scenario {} step {n} ({}): {}",
                self.scenario, self.what, self.message
            ),
            None => write!(
                f,
                "scenario {} ({}): {}",
                self.scenario, self.what, self.message
            ),
        }
    }
}

/// The outcome of driving one scenario against one side.
#[derive(Debug, Clone)]
pub struct DriveOutcome {
    /// The first failure, if any.
    pub failure: Option<DriveFailure>,
    /// Everything the target emitted, in order.
    pub recording: Recording,
    /// The placeholder table at the end of the run.
    pub bindings: Bindings,
    /// The target's stderr tail (empty when it was never launched), the credential
    /// redacted.
    pub stderr_tail: String,
    /// The target's stdout tail (empty when it was never launched or printed nothing),
    /// the credential redacted.
    pub stdout_tail: String,
    /// The target's exit status after shutdown, as text (`None` when unknown).
    pub exit: Option<String>,
}

/// Drives `scenario` with `side` as the target. Never panics on target behaviour; the
/// target is always stopped before this returns.
pub async fn drive(scenario: &Scenario, side: Side, opts: &DriveOptions) -> DriveOutcome {
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
    if side == Side::Core {
        return super::core_target::drive(scenario, opts).await;
    }
    let exit_first = matches!(scenario.steps.first(), Some(Step::ExpectExit { .. }));
    let launched = match launch_runtime(scenario, opts, exit_first).await {
        Ok(launched) => launched,
        Err(message) => {
            outcome.failure = Some(fail("launch", message));
            return outcome;
        }
    };
    let run_dir = launched.run_dir;
    let mut session = Session {
        core: launched.core,
        ws: None,
        ready_instead_of_exit: exit_first && launched.control.is_some(),
        control: launched.control,
        target: launched.target,
        bindings: Bindings::new(),
        recording: Recording::new(),
        credential: launched.credential,
        step_timeout: opts.step_timeout,
        step: 0,
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
    // Drop the connections first so the target sees the end, then stop it.
    let Session {
        bindings,
        recording,
        ws,
        control,
        core,
        mut target,
        credential,
        ..
    } = session;
    drop(ws);
    drop(control);
    drop(core);
    let exit = target.shutdown().await;
    if failure.is_none()
        && let Some(channel) = target.leak_channel()
    {
        failure = Some(fail(
            "end of run",
            leak_message(&format!("the target's {channel}")),
        ));
    }
    outcome.failure = failure.map(|mut f| {
        f.message = redact_secret(&f.message, &credential);
        f
    });
    outcome.recording = recording;
    outcome.bindings = bindings;
    outcome.stderr_tail = redact_secret(&target.stderr_tail(), &credential);
    outcome.stdout_tail = redact_secret(&target.stdout_tail(), &credential);
    outcome.exit = exit.map(|s| s.to_string());
    drop(run_dir);
    outcome
}

struct Launched {
    run_dir: RunDir,
    target: Target,
    core: ScriptedCore,
    /// `None` only when the target exited before readiness and the scenario expects it.
    control: Option<ControlChannel>,
    credential: String,
}

/// Prepares the run directory, the scripted Core and the control socket, launches the
/// target and waits for its hello. With `exit_allowed` (the first step is
/// `expect_exit`), an exit before readiness is not an error: the result then has no
/// control channel.
async fn launch_runtime(
    scenario: &Scenario,
    opts: &DriveOptions,
    exit_allowed: bool,
) -> Result<Launched, String> {
    let run_dir = RunDir::new().map_err(|e| e.to_string())?;
    if let Some(seed) = &scenario.config.workspace {
        run_dir
            .seed_workspace(seed.files.iter(), seed.dirs.iter())
            .map_err(|e| e.to_string())?;
        run_dir
            .seed_generated(&seed.generated)
            .map_err(|e| e.to_string())?;
    }
    let mut config = default_launch_config();
    if let Some(overlay) = &scenario.config.runtime {
        deep_merge(&mut config, overlay);
    }
    let config_text = serde_json::to_string_pretty(&config).map_err(|e| e.to_string())?;
    let config_path = run_dir
        .write_config(&config_text)
        .map_err(|e| e.to_string())?;
    let core = ScriptedCore::start().await.map_err(|e| e.to_string())?;
    let listener = ControlListener::bind(&run_dir.control_socket()).map_err(|e| e.to_string())?;
    let credential = format!("crh-credential-{}", uuid::Uuid::new_v4().simple());
    let env = vec![
        ("CONTRACT_CORE_URL".to_string(), core.base_url()),
        ("CONTRACT_DEVICE_ID".to_string(), DEVICE_ID.to_string()),
        ("CONTRACT_DAEMON_CREDENTIAL".to_string(), credential.clone()),
        (
            "CONTRACT_CONTROL_SOCKET".to_string(),
            run_dir.control_socket().display().to_string(),
        ),
        (
            "CONTRACT_RUNTIME_CONFIG".to_string(),
            config_path.display().to_string(),
        ),
        (
            "CONTRACT_WORKSPACE".to_string(),
            run_dir.workspace().display().to_string(),
        ),
    ];
    let spec = LaunchSpec {
        command: opts.target_cmd.clone(),
        env,
        cwd: run_dir.cwd(),
        secret: credential.clone(),
        capture_stdout: false,
    };
    let mut target = Target::spawn(&spec).map_err(|e| e.to_string())?;
    let started = if exit_allowed {
        target
            .await_ready_or_exit(listener.accept(), opts.startup_timeout)
            .await
    } else {
        target
            .await_ready(listener.accept(), opts.startup_timeout)
            .await
            .map(Startup::Ready)
    };
    let control = match started {
        Ok(Startup::Ready(control)) => Some(control),
        Ok(Startup::Exited(_)) => None,
        Err(e) => {
            target.shutdown().await;
            return Err(e.to_string());
        }
    };
    Ok(Launched {
        run_dir,
        target,
        core,
        control,
        credential,
    })
}

/// What the target did next.
enum Event {
    Http(IncomingRequest),
    Ws(WsEvent),
}

impl Event {
    fn describe(&self) -> String {
        match self {
            Event::Http(req) => req.describe(),
            Event::Ws(ev) => ev.describe(),
        }
    }
}

/// The live state of one run (side `runtime`).
struct Session {
    core: ScriptedCore,
    ws: Option<WsConnection>,
    /// `None` when the target exited before readiness (a first `expect_exit` step).
    control: Option<ControlChannel>,
    /// The first step is `expect_exit`, yet the target became ready.
    ready_instead_of_exit: bool,
    target: Target,
    bindings: Bindings,
    recording: Recording,
    credential: String,
    step_timeout: Duration,
    /// 1-based index of the running step.
    step: usize,
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

async fn ws_recv(ws: &mut Option<WsConnection>) -> Option<WsEvent> {
    match ws {
        Some(conn) => conn.recv().await,
        None => std::future::pending().await,
    }
}

/// Checks one text frame the target emitted after the last step (see
/// [`END_CLOSE_REASON`]): it must be strict JSON, schema-valid in `direction`, and a
/// heartbeat ([`TRAILING_ALLOWED_TYPE`]); anything else is an unexpected frame.
pub(crate) fn trailing_frame(text: &str, direction: Direction) -> Result<(), String> {
    let value = parse_strict(text.as_bytes()).map_err(|e| {
        format!(
            "unexpected frame after the last step, and it is invalid ({}: {e}): {}",
            e.code(),
            truncate(text, 300)
        )
    })?;
    schema_check(&value, direction).map_err(|e| {
        format!(
            "frame after the last step violates the wire schema ({}: {e}): {}",
            e.code(),
            show(&value)
        )
    })?;
    if value.get("type").and_then(Value::as_str) == Some(TRAILING_ALLOWED_TYPE) {
        return Ok(());
    }
    Err(format!(
        "unexpected frame after the last step: {} (only heartbeats may follow the last step)",
        show(&value)
    ))
}

impl Session {
    async fn run_step(&mut self, step: &Step) -> StepResult {
        match step {
            Step::Frame { party, frame } if *party == Party::Runtime => {
                let value = self.expect_frame(&show(frame)).await?;
                match_frame(frame, &value, &mut self.bindings).map_err(|m| {
                    format!(
                        "emitted frame does not match: {m}\n  emitted: {}",
                        show(&value)
                    )
                })
            }
            Step::Frame { party, frame } if *party == Party::Core => self.send_frame(frame).await,
            Step::Frame { party, .. } => Err(format!("`{party}` cannot send frames")),
            Step::Native { op, args, expect } => self.native(op, args, expect.as_ref()).await,
            Step::Bootstrap(spec) => self.bootstrap(spec, None).await,
            Step::Connect(spec) => self.connect(spec).await,
            Step::Handshake {
                heartbeat_interval_ms,
            } => {
                self.bootstrap(&BootstrapStep::default(), *heartbeat_interval_ms)
                    .await?;
                self.connect(&ConnectStep::default()).await?;
                let pattern = json!({"type": "heartbeat"});
                let value = self.expect_frame("runtime: {type: heartbeat}").await?;
                match_frame(&pattern, &value, &mut self.bindings)
                    .map_err(|m| format!("expected the first heartbeat: {m}"))
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
            Step::Api(_) | Step::ApiResult(_) => Ok(()),
            Step::Crash => {
                Err("crash restarts a target Core; the Runtime is the target here".into())
            }
            Step::ExpectExit { code, stderr } => self.expect_exit(*code, stderr).await,
        }
    }

    fn connection(&mut self) -> StepResult<&mut WsConnection> {
        self.ws
            .as_mut()
            .ok_or_else(|| "there is no WebSocket connection (no `connect`/`handshake` step before, or it ended)".to_string())
    }

    fn record(&mut self, label: &str, kind: EntryKind, body: Value) {
        self.recording.push(GoldenEntry {
            step: self.step,
            label: label.to_string(),
            kind,
            body,
        });
    }

    /// The next thing the target does, or `None` if nothing within `timeout`. Checks
    /// every request and message for the credential.
    async fn next_event(&mut self, timeout: Duration) -> StepResult<Option<Event>> {
        let deadline = Instant::now() + timeout;
        loop {
            // Biased towards the WebSocket: what a connection delivered before the target
            // opened a new HTTP exchange (typically: close, then reconnect) comes first.
            let event = tokio::select! {
                biased;
                event = ws_recv(&mut self.ws) => match event {
                    Some(event) => Some(Event::Ws(event)),
                    None => {
                        // The connection ended and every event was consumed.
                        self.ws = None;
                        continue;
                    }
                },
                request = self.core.next_request() => match request {
                    Some(request) => Some(Event::Http(request)),
                    None => return Err("the scripted Core stopped unexpectedly".into()),
                },
                () = tokio::time::sleep_until(deadline) => None,
            };
            if let Some(event) = &event {
                self.check_credential(event)?;
            }
            return Ok(event);
        }
    }

    /// Fails when `event` carries the credential anywhere but an exact
    /// `Authorization: Bearer <credential>` header: URL (also percent-encoded), any other
    /// header (`Sec-WebSocket-Protocol`, `X-Debug-Token`, …), body, frame, close reason.
    fn check_credential(&self, event: &Event) -> StepResult {
        let secret = self.credential.as_str();
        let leak = |place: String| Err(leak_message(&place));
        match event {
            Event::Http(req) => {
                if contains_secret(&req.url(), secret) {
                    return leak(format!("the URL of an HTTP {} request", req.method));
                }
                for (name, value) in &req.headers {
                    if name.eq_ignore_ascii_case("authorization") {
                        if value.contains(secret) && *value != format!("Bearer {secret}") {
                            return leak(format!(
                                "the Authorization header of {} (it must be exactly `Bearer <credential>`)",
                                req.describe()
                            ));
                        }
                    } else if contains_secret(value, secret) {
                        return leak(format!("the {name} header of {}", req.describe()));
                    }
                }
                if let RequestBody::Bytes(body) = &req.body
                    && String::from_utf8_lossy(body).contains(secret)
                {
                    return leak(format!("the body of {}", req.describe()));
                }
                Ok(())
            }
            Event::Ws(WsEvent::Text(text)) if text.contains(secret) => leak("a text frame".into()),
            Event::Ws(WsEvent::Binary(bytes))
                if String::from_utf8_lossy(bytes).contains(secret) =>
            {
                leak("a binary message".into())
            }
            Event::Ws(WsEvent::Close { reason, .. }) if reason.contains(secret) => {
                leak("a close reason".into())
            }
            Event::Ws(_) => Ok(()),
        }
    }

    /// After the last step of a passing scenario: sends Close (1000,
    /// [`END_CLOSE_REASON`]) and reads until the target's Close reply or the connection's
    /// end, within the step deadline. Every data frame in between is schema- and
    /// credential-checked and fails the scenario unless it is a heartbeat
    /// ([`TRAILING_ALLOWED_TYPE`], never recorded). HTTP requests (a reconnecting target)
    /// are credential-checked and answered `503`. Without an open connection only the
    /// requests already queued are checked.
    async fn finish(&mut self) -> StepResult {
        if self.ws.is_some() {
            let timeout = self.step_timeout;
            let deadline = Instant::now() + timeout;
            // A target that already dropped the connection shows up as its end below.
            let _ = self
                .connection()?
                .send_close(DEFAULT_CLOSE_CODE, END_CLOSE_REASON, timeout)
                .await;
            while self.ws.is_some() {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.next_event(left).await? {
                    None => {
                        return Err(format!(
                            "the target answered the harness's Close ({DEFAULT_CLOSE_CODE} \
                             {END_CLOSE_REASON:?}) neither with its Close nor by closing the \
                             connection within {}",
                            show_duration(timeout)
                        ));
                    }
                    // Answered 503 when dropped; the credential was checked.
                    Some(Event::Http(_)) => {}
                    Some(Event::Ws(WsEvent::Text(text))) => {
                        trailing_frame(&text, Direction::RuntimeToCore)?;
                    }
                    Some(Event::Ws(WsEvent::Close { .. } | WsEvent::Eof)) => self.ws = None,
                    Some(Event::Ws(other)) => {
                        return Err(format!(
                            "unexpected {} after the last step",
                            other.describe()
                        ));
                    }
                }
            }
        }
        while let Some(Some(request)) =
            futures_util::FutureExt::now_or_never(self.core.next_request())
        {
            self.check_credential(&Event::Http(request))?;
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

    /// Receives the next text frame from the target, schema-checks it as Runtime → Core
    /// and records it.
    async fn expect_frame(&mut self, expected: &str) -> StepResult<Value> {
        let event = self.next_event(self.step_timeout).await?;
        let text = match event {
            Some(Event::Ws(WsEvent::Text(text))) => text,
            Some(other) => {
                return Err(format!("expected {expected}, got {}", other.describe()));
            }
            None => return Err(self.nothing(expected)),
        };
        let value = parse_strict(text.as_bytes()).map_err(|e| {
            format!(
                "expected {expected}, got an invalid frame ({}: {e}): {}",
                e.code(),
                truncate(&text, 300)
            )
        })?;
        schema_check(&value, Direction::RuntimeToCore).map_err(|e| {
            format!(
                "emitted frame violates the wire schema ({}: {e}): {}",
                e.code(),
                show(&value)
            )
        })?;
        self.record("runtime frame", EntryKind::Frame, value.clone());
        Ok(value)
    }

    async fn send_frame(&mut self, template: &Value) -> StepResult {
        let frame = self
            .bindings
            .substitute(template, true)
            .map_err(|e| format!("cannot build the frame to send: {e}"))?;
        schema_check(&frame, Direction::CoreToRuntime).map_err(|e| {
            format!(
                "the scenario's core frame is invalid ({}: {e}); use send_bytes to send malformed input on purpose",
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

    async fn native(&mut self, op: &str, args: &Value, expect: Option<&Value>) -> StepResult {
        let args = self
            .bindings
            .substitute(args, true)
            .map_err(|e| format!("cannot build the control request: {e}"))?;
        let adapter_wait = args
            .get("timeout_ms")
            .and_then(Value::as_u64)
            .map(Duration::from_millis)
            .unwrap_or(ADAPTER_DEFAULT_TIMEOUT);
        let wait = self.step_timeout.max(adapter_wait + CONTROL_GRACE);
        let control = self.control.as_mut().ok_or_else(|| {
            "the target has no control channel (it exited before it was ready)".to_string()
        })?;
        let result = control
            .request(op, &args, wait)
            .await
            .map_err(|e| format!("{e} ({})", e.code()))?;
        if let Some(pattern) = expect {
            match_frame(pattern, &result, &mut self.bindings).map_err(|m| {
                format!(
                    "result of `{op}` does not match: {m}\n  result: {}",
                    show(&result)
                )
            })?;
        }
        Ok(())
    }

    /// Awaits the next HTTP request; anything else fails.
    async fn expect_request(&mut self, expected: &str) -> StepResult<IncomingRequest> {
        match self.next_event(self.step_timeout).await? {
            Some(Event::Http(req)) => Ok(req),
            Some(other) => Err(format!("expected {expected}, got {}", other.describe())),
            None => Err(self.nothing(expected)),
        }
    }

    /// Checks method, path and the Bearer header; answers 404/401 itself on failure.
    fn check_route(
        &self,
        req: IncomingRequest,
        method: &str,
        path: &str,
    ) -> StepResult<IncomingRequest> {
        if req.method != method || req.path != path {
            let got = req.describe();
            let _ = req.respond(404, Some(&json!({"error": "not_found"})));
            return Err(format!("expected {method} {path}, got {got}"));
        }
        let auth = req.header("authorization").unwrap_or("");
        let ok = auth.split_once(' ').is_some_and(|(scheme, token)| {
            scheme.eq_ignore_ascii_case("bearer") && token == self.credential
        });
        if !ok {
            let got = if auth.is_empty() {
                "no Authorization header".to_string()
            } else {
                "a different Authorization header".to_string()
            };
            let _ = req.respond(401, Some(&json!({"error": "unauthorized"})));
            return Err(format!(
                "{method} {path} must carry `Authorization: Bearer <CONTRACT_DAEMON_CREDENTIAL>`, got {got}"
            ));
        }
        Ok(req)
    }

    async fn bootstrap(&mut self, spec: &BootstrapStep, heartbeat_ms: Option<u64>) -> StepResult {
        let req = self.expect_request("the bootstrap request").await?;
        let req = self.check_route(req, "POST", BOOTSTRAP_PATH)?;
        let body = match &req.body {
            RequestBody::Bytes(bytes) => parse_strict(bytes).map_err(|e| {
                format!(
                    "bootstrap body is not strict JSON ({}: {e}): {}",
                    e.code(),
                    truncate(&String::from_utf8_lossy(bytes), 300)
                )
            }),
            RequestBody::TooLarge => Err(format!(
                "bootstrap body exceeds {} bytes",
                crate::transport::HTTP_BODY_MAX_BYTES
            )),
            RequestBody::Failed(e) => Err(format!("reading the bootstrap body failed: {e}")),
        }?;
        let mut recorded = json!({
            "method": req.method,
            "path": req.path,
            "authorization": "Bearer <credential>",
            "body": body,
        });
        if let Some(q) = &req.query {
            recorded["query"] = Value::String(q.clone());
        }
        self.record("bootstrap request", EntryKind::HttpRequest, recorded);
        let pattern = spec
            .request
            .clone()
            .unwrap_or_else(|| json!({"device_id": DEVICE_ID}));
        match_frame(&pattern, &body, &mut self.bindings)
            .map_err(|m| format!("bootstrap body does not match: {m}"))?;

        let (status, body) = match &spec.response {
            Some(HttpResponseSpec { status, body }) => (*status, body.clone()),
            None => (200, None),
        };
        let mut body = match body {
            Some(template) => Some(
                self.bindings
                    .substitute(&template, true)
                    .map_err(|e| format!("cannot build the bootstrap response: {e}"))?,
            ),
            None if (200..300).contains(&status) => Some(json!({})),
            None => None,
        };
        if (200..300).contains(&status) {
            // Fields the scenario's body leaves out get the defaults.
            if let Some(Value::Object(map)) = &mut body {
                map.entry("heartbeat_interval_ms").or_insert_with(|| {
                    Value::from(heartbeat_ms.unwrap_or(DEFAULT_HEARTBEAT_INTERVAL_MS))
                });
                map.entry("connection_url")
                    .or_insert_with(|| Value::String(self.core.connection_url()));
            }
        }
        req.respond(status, body.as_ref())
            .map_err(|e| format!("cannot answer the bootstrap request: {e}"))
    }

    async fn connect(&mut self, spec: &ConnectStep) -> StepResult {
        let req = self.expect_request("the WebSocket upgrade request").await?;
        let req = self.check_route(req, "GET", WS_PATH)?;
        let mut query = Map::new();
        for (key, value) in req.query_pairs() {
            if query.insert(key.clone(), Value::String(value)).is_some() {
                let _ = req.respond(400, Some(&json!({"error": "duplicate_query_parameter"})));
                return Err(format!("query parameter `{key}` appears twice"));
            }
        }
        let query = Value::Object(query);
        self.record(
            "connect request",
            EntryKind::HttpRequest,
            json!({
                "method": req.method,
                "path": req.path,
                "authorization": "Bearer <credential>",
                "query": query,
            }),
        );
        let pattern = spec
            .query
            .clone()
            .unwrap_or_else(|| json!({"device_id": DEVICE_ID, "version": WIRE_VERSION}));
        if let Err(m) = match_frame(&pattern, &query, &mut self.bindings) {
            let _ = req.respond(400, Some(&json!({"error": "unexpected_query"})));
            return Err(format!("connect query does not match: {m}"));
        }
        match &spec.response {
            None | Some(HttpResponseSpec { status: 101, .. }) => {
                if !req.is_websocket_upgrade() {
                    let _ = req.respond(400, Some(&json!({"error": "not_a_websocket_upgrade"})));
                    return Err("the connect request lacks the WebSocket upgrade headers".into());
                }
                let conn = req
                    .upgrade(self.step_timeout)
                    .await
                    .map_err(|e: TransportError| format!("WebSocket upgrade failed: {e}"))?;
                // A new connection replaces the old one (which is dropped).
                self.ws = Some(conn);
                Ok(())
            }
            Some(HttpResponseSpec { status, body }) => {
                let body = match body {
                    Some(template) => Some(
                        self.bindings
                            .substitute(template, true)
                            .map_err(|e| format!("cannot build the connect response: {e}"))?,
                    ),
                    None => None,
                };
                req.respond(*status, body.as_ref())
                    .map_err(|e| format!("cannot answer the connect request: {e}"))
            }
        }
    }

    async fn silence(&mut self, duration: Duration) -> StepResult {
        match self.next_event(duration).await? {
            None => Ok(()),
            Some(event) => {
                if let Event::Ws(WsEvent::Text(text)) = &event
                    && let Ok(value) = parse_strict(text.as_bytes())
                {
                    self.record("runtime frame", EntryKind::Frame, value);
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
                    party: Party::Runtime,
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
                match match_frame(pattern, &value, &mut self.bindings) {
                    Ok(()) => {
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

    async fn half_close(&mut self, code: u16, reason: &str) -> StepResult {
        let timeout = self.step_timeout;
        self.connection()?
            .send_close(code, reason, timeout)
            .await
            .map_err(|e| format!("sending Close failed: {e}"))?;
        match self.next_event(self.step_timeout).await? {
            Some(Event::Ws(WsEvent::Close { code, reason })) => {
                self.record(
                    "close",
                    EntryKind::Close,
                    json!({"event": "close", "code": code, "reason": reason}),
                );
                if let Some(conn) = self.ws.take() {
                    conn.finish(self.step_timeout).await;
                }
                Ok(())
            }
            Some(other) => Err(format!(
                "expected the target's Close reply, got {}",
                other.describe()
            )),
            None => Err(self.nothing("the target's Close reply")),
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
            Some(Event::Ws(WsEvent::Close {
                code: got_code,
                reason: got_reason,
            })) => {
                self.record(
                    "close",
                    EntryKind::Close,
                    json!({"event": "close", "code": got_code, "reason": got_reason}),
                );
                // Flush the automatic Close reply, then end the connection.
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
            Some(Event::Ws(WsEvent::Eof)) if code.is_none() && reason.is_none() => {
                self.record("close", EntryKind::Close, json!({"event": "dropped"}));
                self.ws = None;
                Ok(())
            }
            Some(other) => Err(format!("expected {expected}, got {}", other.describe())),
            None => Err(self.nothing(&expected)),
        }
    }

    async fn expect_exit(&mut self, code: Option<ExitCodeSpec>, stderr: &[String]) -> StepResult {
        let expected = match code {
            Some(c) => format!("the target to exit with {c}"),
            None => "the target to exit".to_string(),
        };
        if self.ready_instead_of_exit {
            return Err(format!(
                "expected {expected} before it was ready, but it became ready instead (its \
                 controlled adapter connected and said hello); a target must refuse an invalid \
                 launch configuration by exiting non-zero and naming the problem on stderr"
            ));
        }
        let deadline = Instant::now() + self.step_timeout;
        let status = loop {
            // Biased towards the connections: what the target emitted before it exited is
            // reported rather than hidden by the exit.
            let event = tokio::select! {
                biased;
                event = ws_recv(&mut self.ws) => match event {
                    // The connection ending is what an exiting target does.
                    Some(WsEvent::Eof) | None => {
                        self.ws = None;
                        continue;
                    }
                    Some(event) => Event::Ws(event),
                },
                request = self.core.next_request() => match request {
                    Some(request) => Event::Http(request),
                    None => return Err("the scripted Core stopped unexpectedly".into()),
                },
                status = self.target.wait_exit() => break status.map_err(|e| e.to_string())?,
                () = tokio::time::sleep_until(deadline) => {
                    return Err(format!(
                        "expected {expected} within {}, it is still running",
                        show_duration(self.step_timeout)
                    ));
                }
            };
            self.check_credential(&event)?;
            if let Event::Ws(WsEvent::Text(text)) = &event
                && let Ok(value) = parse_strict(text.as_bytes())
            {
                self.record("runtime frame", EntryKind::Frame, value);
            }
            let hint = match &event {
                Event::Ws(WsEvent::Close { .. }) => " (expect it with `expect_close` first)",
                _ => "",
            };
            return Err(format!(
                "expected {expected}, got {}{hint}",
                event.describe()
            ));
        };
        let body = match (
            status.code(),
            std::os::unix::process::ExitStatusExt::signal(&status),
        ) {
            (Some(c), _) => json!({"exit_code": c}),
            (None, Some(sig)) => json!({"signal": sig}),
            (None, None) => json!({"exit_code": Value::Null}),
        };
        self.record("target exit", EntryKind::Exit, body);
        if let Some(c) = code
            && !c.matches(status.code())
        {
            return Err(format!("expected {expected}, it ended with {status}"));
        }
        let tail = self.target.stderr_tail();
        if let Some(needle) = stderr.iter().find(|n| !tail.contains(n.as_str())) {
            return Err(format!(
                "expected the target's stderr to contain {needle:?}; it ended with {status} and \
                 its stderr tail does not"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_deep_and_arrays_replace() {
        let mut base = default_launch_config();
        deep_merge(
            &mut base,
            &json!({"timers": {"admission_expiry_ms": 200}, "environment": {"environment_type": "none"}}),
        );
        assert_eq!(base["environment"]["environment_id"], ENVIRONMENT_ID);
        assert_eq!(base["environment"]["environment_type"], "none");
        assert_eq!(base["timers"]["admission_expiry_ms"], 200);
        deep_merge(&mut base, &json!({"agent_kinds": []}));
        assert_eq!(base["agent_kinds"], json!([]));
    }

    #[test]
    fn default_capabilities_are_complete() {
        let config = default_launch_config();
        let caps = config["agent_kinds"][0]["capabilities"]
            .as_object()
            .unwrap();
        assert!(caps.len() >= 10, "{caps:?}");
        assert!(caps.values().all(|v| v == &Value::Bool(true)));
        assert!(caps.contains_key("streaming"));
    }

    // ---- End-to-end tests of the driver against a fake Runtime -------------------------
    //
    // The fake Runtime is this very test executable, re-run with only the
    // `fake_runtime` test selected: that test is a no-op unless the launch contract's
    // environment is present, in which case it plays a (deliberately simple, optionally
    // misbehaving) Runtime. `CRH_FAKE` picks the behaviour.

    use crate::scenario::model::ScenarioConfig;
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    fn heartbeat() -> String {
        json!({"type": "heartbeat", "id": "hb-1", "payload": {
            "runtime_version": "fake-1",
            "supported_agent_kinds": [{"agent_kind": "controlled", "available": true,
                "capabilities": all_capabilities()}]
        }})
        .to_string()
    }

    async fn fake_main(mode: &str) {
        let env = |k: &str| std::env::var(k).unwrap();
        if mode == "exit" {
            eprintln!("fake runtime: refusing to start");
            std::process::exit(4);
        }
        let credential = env("CONTRACT_DAEMON_CREDENTIAL");
        if mode == "stdout_leak" {
            println!("fake runtime: debug credential={credential}");
        }
        let core = env("CONTRACT_CORE_URL");
        let device = env("CONTRACT_DEVICE_ID");
        let control = tokio::net::UnixStream::connect(env("CONTRACT_CONTROL_SOCKET"))
            .await
            .unwrap();
        let (control_read, mut control_write) = control.into_split();
        control_write
            .write_all(b"{\"hello\": {\"adapter\": \"controlled\", \"protocol\": 1}}\n")
            .await
            .unwrap();
        // Answer every control request with its seq and echo the op.
        tokio::spawn(async move {
            let mut lines = BufReader::new(control_read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let req: Value = serde_json::from_str(&line).unwrap();
                let reply = json!({"seq": req["seq"], "ok": true, "result": {"op": req["op"]}});
                let _ = control_write
                    .write_all(format!("{reply}\n").as_bytes())
                    .await;
            }
        });
        let addr = core.trim_start_matches("http://").to_string();
        let body = json!({"device_id": device}).to_string();
        let mut auth = if mode == "noauth" {
            String::new()
        } else {
            format!("Authorization: Bearer {credential}\r\n")
        };
        if mode == "header_leak" {
            auth.push_str(&format!("X-Debug-Token: {credential}\r\n"));
        }
        let bootstrap_path = if mode == "path_leak" {
            // Percent-encode every byte of the credential into the path.
            let encoded: String = credential.bytes().map(|b| format!("%{b:02X}")).collect();
            format!("/api/v1/agent-daemon/bootstrap/{encoded}")
        } else {
            "/api/v1/agent-daemon/bootstrap".to_string()
        };
        let mut http = tokio::net::TcpStream::connect(&addr).await.unwrap();
        http.write_all(
            format!(
                "POST {bootstrap_path} HTTP/1.1\r\nHost: {addr}\r\n{auth}\
                 Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let mut response = String::new();
        http.read_to_string(&mut response).await.unwrap();
        let json_start = response.find("\r\n\r\n").unwrap() + 4;
        let answer: Value = serde_json::from_str(&response[json_start..]).unwrap();
        let mut url = format!(
            "{}?device_id={device}&version=1.0.0",
            answer["connection_url"].as_str().unwrap()
        );
        if mode == "leak" {
            url.push_str(&format!("&token={credential}"));
        }
        let mut request = url.into_client_request().unwrap();
        if mode == "protocol_leak" {
            request.headers_mut().insert(
                "sec-websocket-protocol",
                format!("v1, {credential}").parse().unwrap(),
            );
        }
        request.headers_mut().insert(
            "authorization",
            format!("Bearer {credential}").parse().unwrap(),
        );
        let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        match mode {
            "badframe" => {
                let mut hb: Value = serde_json::from_str(&heartbeat()).unwrap();
                hb["payload"]
                    .as_object_mut()
                    .unwrap()
                    .remove("runtime_version");
                ws.send(Message::text(hb.to_string())).await.unwrap();
            }
            _ => ws.send(Message::text(heartbeat())).await.unwrap(),
        }
        // Echo every text frame's id back as a delta; close when asked.
        while let Some(Ok(message)) = ws.next().await {
            if let Message::Text(text) = message {
                let frame: Value = serde_json::from_str(text.as_str()).unwrap_or_default();
                if frame["type"] == "prompt_cancel" {
                    let delta =
                        json!({"type": "delta", "id": frame["id"], "payload": {"text": "echo"}});
                    ws.send(Message::text(delta.to_string())).await.unwrap();
                    // Frames after the last one a scenario expects.
                    match mode {
                        "trailing" => {
                            let extra = json!({"type": "delta", "id": frame["id"], "payload": {"text": "late"}});
                            ws.send(Message::text(extra.to_string())).await.unwrap();
                        }
                        "trailing_heartbeat" => {
                            ws.send(Message::text(heartbeat())).await.unwrap();
                        }
                        "trailing_leak" => {
                            let extra = json!({"type": "delta", "id": frame["id"], "payload": {"text": credential}});
                            ws.send(Message::text(extra.to_string())).await.unwrap();
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// The fake Runtime's entry point (a no-op in a normal test run).
    #[test]
    fn fake_runtime() {
        let Ok(mode) = std::env::var("CRH_FAKE") else {
            return;
        };
        if std::env::var_os("CONTRACT_CORE_URL").is_none() {
            return;
        }
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(fake_main(&mode));
    }

    fn scenario(steps: Vec<Step>) -> Scenario {
        Scenario {
            pending: Default::default(),
            family: FAMILY.into(),
            name: "driver_test".into(),
            summary: String::new(),
            covers: vec![],
            sides: None,
            config: ScenarioConfig::default(),
            steps,
            path: "driver_test.yaml".into(),
        }
    }

    async fn drive_fake(mode: &str, steps: Vec<Step>) -> DriveOutcome {
        let exe = std::env::current_exe().unwrap();
        let cmd = format!(
            "env CRH_FAKE={mode} {} --exact family::core_runtime::tests::fake_runtime --nocapture --test-threads 1",
            shell_words::quote(&exe.display().to_string())
        );
        let opts = DriveOptions {
            target_cmd: cmd,
            step_timeout: Duration::from_millis(1500),
            startup_timeout: Duration::from_secs(20),
        };
        drive(&scenario(steps), Side::Runtime, &opts).await
    }

    fn failure(outcome: &DriveOutcome) -> String {
        outcome
            .failure
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    #[tokio::test]
    async fn handshake_frames_and_native_pass() {
        let outcome = drive_fake(
            "ok",
            vec![
                Step::Handshake { heartbeat_interval_ms: None },
                Step::Frame {
                    party: Party::Core,
                    frame: json!({"type": "prompt_cancel", "id": "$run", "payload": {"delivery_id": "d-1"}}),
                },
                Step::Frame {
                    party: Party::Runtime,
                    frame: json!({"type": "delta", "id": "$run", "payload": {"text": "echo"}}),
                },
                Step::Native { op: "report".into(), args: json!({}), expect: Some(json!({"op": "report"})) },
                Step::Silence(Duration::from_millis(50)),
                Step::Api(crate::scenario::model::ApiStep {
                    call: crate::scenario::model::ApiCall {
                        method: "GET".into(),
                        path: "/v1/turns/$t".into(),
                        query: None,
                        body: None,
                    },
                    expect: HttpResponseSpec { status: 200, body: None },
                    poll: false,
                    id: None,
                    wait: true,
                }),
                Step::ApiResult(crate::scenario::model::ApiResultStep { id: "files1".into() }),
                Step::HalfClose { code: None, reason: None },
            ],
        )
        .await;
        assert!(
            outcome.failure.is_none(),
            "{}\n{}",
            failure(&outcome),
            outcome.stderr_tail
        );
        let labels: Vec<&str> = outcome
            .recording
            .entries
            .iter()
            .map(|e| e.label.as_str())
            .collect();
        assert_eq!(
            labels,
            [
                "bootstrap request",
                "connect request",
                "runtime frame",
                "runtime frame",
                "close"
            ]
        );
        assert_eq!(
            outcome.recording.entries[0].body["authorization"],
            "Bearer <credential>"
        );
        assert_eq!(outcome.bindings.get("run"), Some(&json!("run-1")));
    }

    #[tokio::test]
    async fn missing_frame_names_step_and_deadline() {
        let outcome = drive_fake(
            "ok",
            vec![
                Step::Handshake {
                    heartbeat_interval_ms: None,
                },
                Step::Frame {
                    party: Party::Runtime,
                    frame: json!({"type": "delta"}),
                },
            ],
        )
        .await;
        let text = failure(&outcome);
        assert!(
            text.starts_with("scenario core_runtime/driver_test step 2 (runtime frame delta): expected {\"type\":\"delta\"}, got nothing within 1500ms"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn credential_in_url_fails() {
        let outcome = drive_fake(
            "leak",
            vec![Step::Handshake {
                heartbeat_interval_ms: None,
            }],
        )
        .await;
        let text = failure(&outcome);
        assert!(text.contains("credential leaked in the URL"), "{text}");
        assert!(
            !text.contains("crh-credential-"),
            "the failure must not print the secret: {text}"
        );
    }

    #[tokio::test]
    async fn missing_bearer_fails() {
        let outcome = drive_fake(
            "noauth",
            vec![Step::Handshake {
                heartbeat_interval_ms: None,
            }],
        )
        .await;
        let text = failure(&outcome);
        assert!(text.contains("step 1 (handshake)"), "{text}");
        assert!(text.contains("no Authorization header"), "{text}");
    }

    #[tokio::test]
    async fn invalid_emitted_frame_reports_wire_code() {
        let outcome = drive_fake(
            "badframe",
            vec![Step::Handshake {
                heartbeat_interval_ms: None,
            }],
        )
        .await;
        let text = failure(&outcome);
        assert!(
            text.contains("violates the wire schema (missing_field"),
            "{text}"
        );
        assert!(text.contains("runtime_version"), "{text}");
    }

    #[tokio::test]
    async fn early_exit_reports_stderr() {
        let outcome = drive_fake(
            "exit",
            vec![Step::Handshake {
                heartbeat_interval_ms: None,
            }],
        )
        .await;
        let text = failure(&outcome);
        assert!(text.contains("(launch)"), "{text}");
        assert!(text.contains("exited before it was ready"), "{text}");
        assert!(text.contains("fake runtime: refusing to start"), "{text}");
    }

    #[tokio::test]
    async fn expected_exit_before_readiness_passes() {
        let outcome = drive_fake(
            "exit",
            vec![Step::ExpectExit {
                code: Some(ExitCodeSpec::Exact(4)),
                stderr: vec!["refusing".into(), "to start".into()],
            }],
        )
        .await;
        assert!(
            outcome.failure.is_none(),
            "{}\n{}",
            failure(&outcome),
            outcome.stderr_tail
        );
        let entries = &outcome.recording.entries;
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].label, "target exit");
        assert_eq!(entries[0].kind, EntryKind::Exit);
        assert_eq!(entries[0].body, json!({"exit_code": 4}));
        let outcome = drive_fake(
            "exit",
            vec![Step::ExpectExit {
                code: Some(ExitCodeSpec::NonZero),
                stderr: vec![],
            }],
        )
        .await;
        assert!(outcome.failure.is_none(), "{}", failure(&outcome));
    }

    #[tokio::test]
    async fn expected_exit_checks_code_and_stderr() {
        let outcome = drive_fake(
            "exit",
            vec![Step::ExpectExit {
                code: Some(ExitCodeSpec::Exact(3)),
                stderr: vec![],
            }],
        )
        .await;
        let text = failure(&outcome);
        assert!(
            text.contains("step 1 (expect_exit): expected the target to exit with code 3, it ended with exit status: 4"),
            "{text}"
        );
        let outcome = drive_fake(
            "exit",
            vec![Step::ExpectExit {
                code: None,
                stderr: vec!["refusing".into(), "invalid_capability_declaration".into()],
            }],
        )
        .await;
        let text = failure(&outcome);
        assert!(
            text.contains(
                "expected the target's stderr to contain \"invalid_capability_declaration\""
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn ready_instead_of_exit_fails_the_step() {
        let outcome = drive_fake(
            "ok",
            vec![Step::ExpectExit {
                code: Some(ExitCodeSpec::NonZero),
                stderr: vec![],
            }],
        )
        .await;
        let text = failure(&outcome);
        assert!(
            text.contains("step 1 (expect_exit)") && text.contains("became ready instead"),
            "{text}"
        );
        assert!(outcome.recording.entries.is_empty());
    }

    #[tokio::test]
    async fn a_target_that_keeps_running_fails_expect_exit() {
        let outcome = drive_fake(
            "ok",
            vec![
                Step::Handshake {
                    heartbeat_interval_ms: None,
                },
                Step::ExpectExit {
                    code: Some(ExitCodeSpec::Exact(0)),
                    stderr: vec![],
                },
            ],
        )
        .await;
        let text = failure(&outcome);
        assert!(
            text.contains("step 2 (expect_exit): expected the target to exit with code 0 within 1500ms, it is still running"),
            "{text}"
        );
    }

    #[test]
    fn merge_passes_nulls_through() {
        let mut base = default_launch_config();
        deep_merge(
            &mut base,
            &json!({"agent_kinds": [{"agent_kind": "k", "available": true, "capabilities": {"resume": null}}], "timers": null}),
        );
        assert_eq!(
            base["agent_kinds"][0]["capabilities"]["resume"],
            Value::Null
        );
        assert_eq!(base["timers"], Value::Null);
        let text = serde_json::to_string(&base).unwrap();
        assert!(text.contains("\"resume\":null"), "{text}");
    }

    #[tokio::test]
    async fn invalid_core_frame_is_refused_before_sending() {
        let outcome = drive_fake(
            "ok",
            vec![
                Step::Handshake {
                    heartbeat_interval_ms: None,
                },
                Step::Frame {
                    party: Party::Core,
                    frame: json!({"type": "delta", "id": "x", "payload": {"text": "t"}}),
                },
            ],
        )
        .await;
        let text = failure(&outcome);
        assert!(text.contains("step 2 (core frame delta)"), "{text}");
        assert!(text.contains("wrong_direction"), "{text}");
    }

    /// The steps of a scenario that ends right after the echoed delta.
    fn echo_steps() -> Vec<Step> {
        vec![
            Step::Handshake {
                heartbeat_interval_ms: None,
            },
            Step::Frame {
                party: Party::Core,
                frame: json!({"type": "prompt_cancel", "id": "$run", "payload": {"delivery_id": "d-1"}}),
            },
            Step::Frame {
                party: Party::Runtime,
                frame: json!({"type": "delta", "id": "$run", "payload": {"text": "echo"}}),
            },
        ]
    }

    #[tokio::test]
    async fn a_frame_after_the_last_step_fails() {
        let outcome = drive_fake("ok", echo_steps()).await;
        assert!(outcome.failure.is_none(), "{}", failure(&outcome));
        let outcome = drive_fake("trailing", echo_steps()).await;
        let text = failure(&outcome);
        assert!(
            text.starts_with("scenario core_runtime/driver_test (after the last step): unexpected frame after the last step:"),
            "{text}"
        );
        assert!(text.contains("late"), "{text}");
    }

    #[tokio::test]
    async fn a_heartbeat_after_the_last_step_is_allowed_and_not_recorded() {
        let outcome = drive_fake("trailing_heartbeat", echo_steps()).await;
        assert!(outcome.failure.is_none(), "{}", failure(&outcome));
        let frames = outcome
            .recording
            .entries
            .iter()
            .filter(|e| e.label == "runtime frame")
            .count();
        assert_eq!(frames, 2, "the trailing heartbeat must not be recorded");
    }

    #[tokio::test]
    async fn a_late_frame_is_credential_checked() {
        let outcome = drive_fake("trailing_leak", echo_steps()).await;
        let text = failure(&outcome);
        assert!(text.contains("credential leaked in a text frame"), "{text}");
        assert!(!text.contains("crh-credential-"), "{text}");
    }

    #[tokio::test]
    async fn credential_in_other_channels_fails_without_printing_it() {
        for (mode, channel) in [
            (
                "header_leak",
                "credential leaked in the x-debug-token header",
            ),
            (
                "protocol_leak",
                "credential leaked in the sec-websocket-protocol header",
            ),
            (
                "path_leak",
                "credential leaked in the URL of an HTTP POST request",
            ),
            ("stdout_leak", "credential leaked in the target's stdout"),
        ] {
            let outcome = drive_fake(mode, echo_steps()).await;
            let text = failure(&outcome);
            assert!(text.contains(channel), "{mode}: {text}");
            assert!(!text.contains("crh-credential-"), "{mode}: {text}");
            assert!(!text.contains("%63%72%68"), "{mode}: {text}");
            assert!(
                !outcome.stdout_tail.contains("crh-credential-"),
                "{mode}: {}",
                outcome.stdout_tail
            );
        }
    }
}
