//! Side `runtime` of the Core ↔ Runtime family: the Runtime under test is launched per
//! `docs/launch-contract.md` and the harness plays **Core** (a [`crate::transport::http::ScriptedServer`]) and drives the Runtime's controlled adapter over the
//! control channel ([`crate::transport::control`]). The generic steps are the engine's
//! ([`crate::drive`]); this module adds the scripted Core's transport and these steps:
//!
//! | step | what the harness does |
//! |---|---|
//! | `core:` | substitute placeholders (minting unbound ones), schema-check as Core → Runtime, send as one text frame (engine) |
//! | `runtime:` | the next thing the target does must be a text frame: strict parse, schema-check as Runtime → Core, record, match (engine) |
//! | `native:` | control request `{op, ...args}` (placeholders substituted, unbound minted); `expect` matched against the result |
//! | `bootstrap` | the next request must be the bootstrap POST with the Bearer credential; body matched (default `{device_id}`); answer per `response` (default 200 with `connection_url` and `heartbeat_interval_ms: 3600000`) |
//! | `connect` | the next request must be the WebSocket upgrade with the Bearer credential; query matched (default `{device_id, version: WIRE_VERSION}`); upgrade (default) or answer the scripted status |
//! | `handshake` | `bootstrap` + `connect` + one `runtime: {type: heartbeat}` |
//! | `reconnect` | `bootstrap` + `connect` with defaults |
//! | `api:`, `api_result:` | skipped (Core is not the target) |
//! | `crash` | refused (it restarts a target Core) |
//!
//! Every HTTP request the target sends is checked for the daemon credential (URL also
//! percent-encoded, every header but an exact `Authorization: Bearer <credential>`,
//! body); the engine checks frames, close reasons and the target's output. HTTP requests
//! after the last step are credential-checked and answered `503`.

use std::time::Duration;

use async_trait::async_trait;
use contract_impl::core_runtime::wire::limits::WIRE_VERSION;
use contract_impl::wire::parse_strict;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::codec::RUNTIME_ROLE;
use super::link::{Link, Seen};
use super::steps::{Bootstrap, CoreRuntimePeer, Native, family_step};
use super::{
    BOOTSTRAP_PATH, DECLARED_CAPABILITIES, DEFAULT_HEARTBEAT_INTERVAL_MS, DEVICE_ID, WS_LIMITS,
    WS_PATH, declared_capabilities, launch_config_for,
};
use crate::drive::{
    Connection, Describe, DriveOptions, Event, FailureCode, Peer, Role, Run, Started, StepError,
    StepResult, fail,
};
use crate::golden::EntryKind;
use crate::matcher::match_frame;
use crate::scenario::model::{ApiStep, ConnectStep, HttpResponseSpec, Scenario, Step};
use crate::target::{LaunchSpec, RunDir, Startup, Target, contains_secret};
use crate::transport::TransportError;
use crate::transport::control::{CONTROLLED_ADAPTER, ControlChannel, ControlListener};
use crate::transport::http::{IncomingRequest, RequestBody, ScriptedServer};
use crate::transport::ws::truncate;

/// Default wait of the controlled adapter for a request (`timeout_ms`, control-channel.md).
const ADAPTER_DEFAULT_TIMEOUT: Duration = Duration::from_millis(5000);

/// Extra time the harness grants a control request beyond the adapter's own timeout, so
/// the adapter's `timeout` answer arrives before the harness gives up.
const CONTROL_GRACE: Duration = Duration::from_secs(1);

impl Describe for IncomingRequest {
    fn describe(&self) -> String {
        IncomingRequest::describe(self)
    }
}

/// The scripted Core the harness plays against a target Runtime.
pub struct ScriptedCorePeer {
    core: ScriptedServer,
    ws: Link,
    /// `None` when the target exited before readiness (a first `expect_exit` step).
    control: Option<ControlChannel>,
    credential: String,
    /// The agent-kind declarations of the launch configuration (`agent_kinds`): what
    /// every heartbeat of a `handshake` or `reconnect` must declare.
    declared_kinds: Value,
    /// Held until the peer is dropped, after the target stopped.
    _run_dir: RunDir,
}

/// Prepares the run directory, the scripted Core and the control socket, launches the
/// target Runtime and waits for its controlled adapter's hello. With `exit_allowed` (the
/// first step is `expect_exit`), an exit before readiness is not an error.
///
/// # Errors
/// The launch failed (the text names why, with the target's stderr tail).
pub async fn start(
    scenario: &Scenario,
    opts: &DriveOptions,
    exit_allowed: bool,
) -> Result<Started<ScriptedCorePeer>, String> {
    let run_dir = RunDir::new().map_err(|e| e.to_string())?;
    if let Some(seed) = &scenario.config.workspace {
        run_dir.seed(seed).map_err(|e| e.to_string())?;
    }
    let config = launch_config_for(&opts.features, scenario.config.runtime.as_ref());
    let config_text = serde_json::to_string_pretty(&config).map_err(|e| e.to_string())?;
    let config_path = run_dir
        .write_config(&config_text)
        .map_err(|e| e.to_string())?;
    let core = ScriptedServer::start(WS_LIMITS)
        .await
        .map_err(|e| e.to_string())?;
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
        stdin_pipe: false,
    };
    let mut target = Target::spawn(&spec).map_err(|e| e.to_string())?;
    let started = if exit_allowed {
        target
            .await_ready_or_exit(listener.accept(CONTROLLED_ADAPTER), opts.startup_timeout)
            .await
    } else {
        target
            .await_ready(listener.accept(CONTROLLED_ADAPTER), opts.startup_timeout)
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
    Ok(Started {
        ready: control.is_some(),
        peer: ScriptedCorePeer {
            core,
            ws: Link::default(),
            control,
            credential: credential.clone(),
            declared_kinds: config.get("agent_kinds").cloned().unwrap_or(Value::Null),
            _run_dir: run_dir,
        },
        process: Box::new(target),
        secret: credential,
        normalize: super::masks::mask_declarations,
        prebound: vec![(
            DECLARED_CAPABILITIES.to_string(),
            declared_capabilities(&config),
        )],
    })
}

#[async_trait]
impl Peer for ScriptedCorePeer {
    type Other = IncomingRequest;

    const ROLE: &'static Role = &RUNTIME_ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<IncomingRequest>>> {
        let deadline = Instant::now() + timeout;
        loop {
            // The deadline first (a target that keeps sending cannot outlast it), then the
            // WebSocket: what a connection delivered before the target opened a new HTTP
            // exchange (typically: close, then reconnect) comes first.
            let seen = tokio::select! {
                biased;
                () = tokio::time::sleep_until(deadline) => return Ok(None),
                seen = self.ws.next() => seen,
                request = self.core.next_request() => {
                    return match request {
                        Some(request) => Ok(Some(Event::Other(request))),
                        None => Err(fail::harness("the scripted Core stopped unexpectedly")),
                    };
                }
            };
            match seen {
                Seen::Event(event) => return Ok(Some(event)),
                // The connection ended and every event was consumed: wait for the rest.
                Seen::Ended => {}
            }
        }
    }

    /// URL (also percent-encoded), any header but an exact `Authorization: Bearer
    /// <credential>` (`Sec-WebSocket-Protocol`, `X-Debug-Token`, …), body.
    fn leak_in_other(&self, req: &IncomingRequest, secret: &str) -> Option<String> {
        if contains_secret(&req.url(), secret) {
            return Some(format!("the URL of an HTTP {} request", req.method));
        }
        for (name, value) in &req.headers {
            if name.eq_ignore_ascii_case("authorization") {
                // The scheme is case-insensitive (RFC 7235); the credential is the token.
                let exact = value.split_once(' ').is_some_and(|(scheme, token)| {
                    scheme.eq_ignore_ascii_case("bearer") && token == secret
                });
                if value.contains(secret) && !exact {
                    return Some(format!(
                        "the Authorization header of {} (it must be exactly `Bearer <credential>`)",
                        req.describe()
                    ));
                }
            } else if contains_secret(value, secret) {
                return Some(format!("the {name} header of {}", req.describe()));
            }
        }
        if let RequestBody::Bytes(body) = &req.body
            && String::from_utf8_lossy(body).contains(secret)
        {
            return Some(format!("the body of {}", req.describe()));
        }
        None
    }

    fn connection(&mut self) -> &mut dyn Connection {
        &mut self.ws
    }

    /// Requests after the last step (a reconnecting target) are answered `503` when
    /// dropped; the engine checked them for the credential.
    fn trailing_other(&mut self, _request: IncomingRequest) -> StepResult {
        Ok(())
    }

    fn queued_others(&mut self) -> Vec<IncomingRequest> {
        let mut queued = Vec::new();
        while let Some(Some(request)) =
            futures_util::FutureExt::now_or_never(self.core.next_request())
        {
            queued.push(request);
        }
        queued
    }

    async fn family_step(&mut self, run: &mut Run, step: &Step) -> StepResult {
        family_step(self, run, step).await
    }

    fn release(&mut self) {
        // The WebSocket ends; the control channel stays open until the peer is dropped
        // (after the target stopped), so that the Executors a Runtime closes on SIGTERM
        // are closed through it as scripted rather than failing for a missing channel.
        self.ws.abort();
    }
}

#[async_trait]
impl CoreRuntimePeer for ScriptedCorePeer {
    async fn native(&mut self, run: &mut Run, call: Native<'_>) -> StepResult {
        let Native { op, args, expect } = call;
        crate::drive::control::native_step(
            self.control.as_mut(),
            run,
            op,
            args,
            expect,
            ADAPTER_DEFAULT_TIMEOUT,
            CONTROL_GRACE,
        )
        .await
    }

    async fn bootstrap(&mut self, run: &mut Run, call: Bootstrap<'_>) -> StepResult {
        let Bootstrap {
            spec,
            heartbeat_ms,
            within,
        } = call;
        let req = self
            .expect_request(run, "the bootstrap request", within)
            .await?;
        let req = self.check_route(req, "POST", BOOTSTRAP_PATH)?;
        let body = match &req.body {
            RequestBody::Bytes(bytes) => parse_strict(bytes).map_err(|e| {
                StepError::new(
                    FailureCode::InvalidFrame,
                    format!(
                        "bootstrap body is not strict JSON ({}: {e}): {}",
                        e.code(),
                        truncate(&String::from_utf8_lossy(bytes), 300)
                    ),
                )
            }),
            RequestBody::TooLarge => Err(StepError::new(
                FailureCode::InvalidFrame,
                format!(
                    "bootstrap body exceeds {} bytes",
                    crate::transport::HTTP_BODY_MAX_BYTES
                ),
            )),
            RequestBody::Failed(e) => Err(fail::transport(format!(
                "reading the bootstrap body failed: {e}"
            ))),
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
        run.record("bootstrap request", EntryKind::HttpRequest, recorded);
        let pattern = spec
            .request
            .clone()
            .unwrap_or_else(|| json!({"device_id": DEVICE_ID}));
        match_frame(&pattern, &body, &mut run.bindings)
            .map_err(|m| fail::mismatch(format!("bootstrap body does not match: {m}")))?;

        let (status, body) = match &spec.response {
            Some(HttpResponseSpec { status, body }) => (*status, body.clone()),
            None => (200, None),
        };
        let mut body = match body {
            Some(template) => Some(run.bindings.substitute(&template, true).map_err(|e| {
                fail::scenario(format!("cannot build the bootstrap response: {e}"))
            })?),
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
                    .or_insert_with(|| Value::String(self.core.ws_url(WS_PATH)));
            }
        }
        run.log_wire(
            "to target",
            "bootstrap response",
            &json!({"status": status, "body": body}),
        );
        req.respond(status, body.as_ref())
            .map_err(|e| fail::transport(format!("cannot answer the bootstrap request: {e}")))
    }

    async fn connect(&mut self, run: &mut Run, spec: &ConnectStep) -> StepResult {
        let req = self
            .expect_request(run, "the WebSocket upgrade request", None)
            .await?;
        let req = self.check_route(req, "GET", WS_PATH)?;
        let mut query = Map::new();
        for (key, value) in req.query_pairs() {
            if query.insert(key.clone(), Value::String(value)).is_some() {
                let _ = req.respond(400, Some(&json!({"error": "duplicate_query_parameter"})));
                return Err(fail::mismatch(format!(
                    "query parameter `{key}` appears twice"
                )));
            }
        }
        let query = Value::Object(query);
        run.record(
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
        if let Err(m) = match_frame(&pattern, &query, &mut run.bindings) {
            let _ = req.respond(400, Some(&json!({"error": "unexpected_query"})));
            return Err(fail::mismatch(format!("connect query does not match: {m}")));
        }
        match &spec.response {
            None | Some(HttpResponseSpec { status: 101, .. }) => {
                if !req.is_websocket_upgrade() {
                    let _ = req.respond(400, Some(&json!({"error": "not_a_websocket_upgrade"})));
                    return Err(fail::mismatch(
                        "the connect request lacks the WebSocket upgrade headers",
                    ));
                }
                let conn = req
                    .upgrade(run.step_timeout)
                    .await
                    .map_err(|e: TransportError| {
                        fail::transport(format!("WebSocket upgrade failed: {e}"))
                    })?;
                // A new connection replaces the old one (which is dropped).
                self.ws.replace(conn);
                Ok(())
            }
            Some(HttpResponseSpec { status, body }) => {
                let body = match body {
                    Some(template) => {
                        Some(run.bindings.substitute(template, true).map_err(|e| {
                            fail::scenario(format!("cannot build the connect response: {e}"))
                        })?)
                    }
                    None => None,
                };
                req.respond(*status, body.as_ref())
                    .map_err(|e| fail::transport(format!("cannot answer the connect request: {e}")))
            }
        }
    }

    /// The heartbeat must declare exactly the launch configuration's agent kinds, each
    /// with its availability and complete capabilities, in any order ("Each heartbeat
    /// declares `supported_agent_kinds`, their availability and capabilities"; "a kind
    /// missing from a heartbeat is undeclared").
    async fn first_heartbeat(&mut self, run: &mut Run) -> StepResult {
        let pattern = json!({"type": "heartbeat"});
        let value = run.expect_frame(self, "runtime: {type: heartbeat}").await?;
        match_frame(&pattern, &value, &mut run.bindings)
            .map_err(|m| fail::mismatch(format!("expected the first heartbeat: {m}")))?;
        let declared = value
            .pointer("/payload/supported_agent_kinds")
            .unwrap_or(&Value::Null);
        declaration_difference(&self.declared_kinds, declared).map_or(Ok(()), |why| {
            Err(fail::mismatch(format!(
                "the heartbeat's declaration is not the launch configuration's: {why}"
            )))
        })
    }

    async fn api(&mut self, _run: &mut Run, _api: &ApiStep) -> StepResult {
        Ok(())
    }

    async fn api_result(&mut self, _run: &mut Run, _id: &str) -> StepResult {
        Ok(())
    }
}

/// How the agent kinds a heartbeat declares (`declared`) differ from the launch
/// configuration's (`launched`), kinds compared by name in any order: the first kind
/// missing, added or declared otherwise, with the field; `None` when they are the same.
pub fn declaration_difference(launched: &Value, declared: &Value) -> Option<String> {
    let by_name = |kinds: &Value| -> std::collections::BTreeMap<String, Value> {
        kinds
            .as_array()
            .into_iter()
            .flatten()
            .map(|k| {
                let name = k.get("agent_kind").and_then(Value::as_str).unwrap_or("");
                (name.to_string(), k.clone())
            })
            .collect()
    };
    let (launched, declared) = (by_name(launched), by_name(declared));
    if let Some(name) = launched.keys().find(|k| !declared.contains_key(*k)) {
        return Some(format!("kind `{name}` is launched but not declared"));
    }
    if let Some(name) = declared.keys().find(|k| !launched.contains_key(*k)) {
        return Some(format!("kind `{name}` is declared but not launched"));
    }
    launched.iter().find_map(|(name, want)| {
        let got = &declared[name];
        for key in ["available", "capabilities"] {
            if want.get(key) != got.get(key) {
                let field = match (want.get(key), got.get(key)) {
                    (Some(Value::Object(w)), Some(Value::Object(g))) => w
                        .iter()
                        .find(|(f, v)| g.get(*f) != Some(*v))
                        .map(|(f, v)| {
                            format!(".{f}: launched {v}, declared {}", show_opt(g.get(f)))
                        })
                        .or_else(|| {
                            g.keys()
                                .find(|f| !w.contains_key(*f))
                                .map(|f| format!(".{f}: not launched, declared"))
                        })
                        .unwrap_or_default(),
                    (w, g) => format!(": launched {}, declared {}", show_opt(w), show_opt(g)),
                };
                return Some(format!("kind `{name}` {key}{field}"));
            }
        }
        None
    })
}

fn show_opt(value: Option<&Value>) -> String {
    value.map_or_else(|| "nothing".to_string(), Value::to_string)
}

impl ScriptedCorePeer {
    /// Awaits the next HTTP request; anything else fails.
    /// The next HTTP request, within `within` (`reconnect: {within}`) or else the step
    /// timeout.
    async fn expect_request(
        &mut self,
        run: &mut Run,
        expected: &str,
        within: Option<Duration>,
    ) -> StepResult<IncomingRequest> {
        match run
            .next_event(self, within.unwrap_or(run.step_timeout))
            .await?
        {
            Some(Event::Other(req)) => Ok(req),
            Some(other) => Err(fail::unexpected(format!(
                "expected {expected}, got {}",
                other.describe()
            ))),
            None => Err(match within {
                None => run.nothing(self, expected),
                Some(limit) => fail::timeout(format!(
                    "expected {expected} within {} (reconnect: within)",
                    crate::drive::show_duration(limit)
                )),
            }),
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
            return Err(fail::mismatch(format!(
                "expected {method} {path}, got {got}"
            )));
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
            return Err(fail::mismatch(format!(
                "{method} {path} must carry `Authorization: Bearer <CONTRACT_DAEMON_CREDENTIAL>`, got {got}"
            )));
        }
        Ok(req)
    }
}

#[cfg(test)]
#[path = "runtime_side_tests.rs"]
mod tests;
