//! Side `daemon` of the engine family: the daemon under test is launched per
//! `docs/engine-launch-contract.md` and the harness plays its **client** over the Unix
//! socket: unary calls and server streams with the endpoint token in metadata (or
//! without it, or a wrong one), deadlines, cancellation, raw payloads and raw HTTP/2
//! bytes. Steps:
//!
//! | step | what the harness does |
//! |---|---|
//! | `client: {call, method, request, …}` | starts the call (engine); its events arrive as daemon frames; `request_size: n` pads the encoded request to exactly `n` bytes with an unknown field |
//! | `client: {call, cancel: true}` | cancels the call in flight (RST_STREAM) |
//! | `client: {call, method, …, read: paused}` | starts the call on a connection of its own and reads nothing (a stalled reader) |
//! | `client: {call, read: discard}` | from now on reads that call's messages and drops them; when it ends, `{call, discarded: {lastSequence}}` then its status |
//! | `daemon: {call, message}` / `{call, status}` | the next event of any call must match (engine) |
//! | `send_bytes: {base64}` | those bytes on a fresh connection; the daemon's answer is `{call: raw, raw: {goaway, closed}}` |
//! | `disconnect` | drops the connection and every call in flight |
//! | `crash` | SIGKILL of the daemon, then the same launch again (same data directory) |
//!
//! The endpoint token is the run's secret: it must never appear in the daemon's output.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use serde_json::{Value, json};

use super::codec::{DAEMON_ROLE, SERVICE, pool};
use crate::drive::{
    Connection, DriveOptions, Event, FailureCode, NoOther, Outgoing, Peer, Process, Role, Run,
    Started, StepError, StepResult, fail,
};
use crate::scenario::model::{Scenario, Step};
use crate::target::{LaunchSpec, RunDir, Target, check_socket_path};
use crate::transport::grpc::{self, CallSpec, GrpcLink};

/// The socket file in the run directory.
pub const SOCKET: &str = "engine.sock";

/// The data directory in the run directory.
pub const DATA_DIR: &str = "data";

/// The token file the daemon writes in its data directory.
pub const TOKEN_FILE: &str = "endpoint-token";

/// How long a raw-bytes connection waits for the daemon to close it.
const RAW_WAIT: Duration = Duration::from_secs(5);

/// The client the harness plays against a target daemon.
pub struct ScriptedClientPeer {
    link: ClientLink,
    spec: LaunchSpec,
    _run_dir: RunDir,
}

/// The channel to the daemon, its token, and raw-bytes outcomes not yet read.
pub struct ClientLink {
    grpc: GrpcLink,
    socket: PathBuf,
    token: String,
    raw: std::collections::VecDeque<Value>,
    /// The run's end was signalled ([`Connection::send_close`]): once nothing is
    /// queued, the connection ends and reads as [`Event::Eof`].
    closing: bool,
}

impl ClientLink {
    fn call(&mut self, frame: &Value) -> StepResult {
        let invalid = |m: String| StepError::new(FailureCode::ScenarioInvalid, m);
        let name = frame
            .get("call")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if frame.get("cancel").is_some() {
            self.grpc.cancel(&name);
            return Ok(());
        }
        let reading = match frame.get("read").and_then(Value::as_str) {
            None | Some("read") => grpc::Reading::Read,
            Some("paused") => grpc::Reading::Paused,
            Some("discard") => grpc::Reading::Discard,
            Some(other) => return Err(invalid(format!("unknown `read: {other}`"))),
        };
        if frame.get("method").is_none() {
            // `{call, read}`: how an in-flight call is read from now on.
            return if self.grpc.set_reading(&name, reading) {
                Ok(())
            } else {
                Err(StepError::new(
                    FailureCode::TransportFailed,
                    format!("call `{name}` is not in flight"),
                ))
            };
        }
        let method_name = frame
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let method = grpc::method(pool(), SERVICE, method_name)
            .ok_or_else(|| invalid(format!("unknown method `{method_name}`")))?;
        let payload = match (frame.get("request"), frame.get("request_base64")) {
            (_, Some(Value::String(b64))) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| invalid(format!("`request_base64`: {e}")))?,
            (Some(request), _) => grpc::from_json(method.input(), request).map_err(|e| {
                invalid(format!(
                    "`request` is not a {}: {e}",
                    method.input().full_name()
                ))
            })?,
            _ => Vec::new(),
        };
        let payload = match frame.get("request_size") {
            None => payload,
            Some(size) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| invalid("`request_size` must be a byte count".into()))?;
                pad_to(payload, size).map_err(invalid)?
            }
        };
        let mut metadata = Vec::new();
        match frame.get("auth").and_then(Value::as_str).unwrap_or("token") {
            "none" => {}
            "wrong" => metadata.push((
                "authorization".to_string(),
                format!("Bearer {}", "0".repeat(self.token.len().max(1))),
            )),
            _ => metadata.push((
                "authorization".to_string(),
                format!("Bearer {}", self.token),
            )),
        }
        if let Some(Value::Object(extra)) = frame.get("metadata") {
            for (k, v) in extra {
                metadata.push((k.clone(), v.as_str().unwrap_or_default().to_string()));
            }
        }
        let timeout = frame
            .get("timeout_ms")
            .and_then(Value::as_u64)
            .map(Duration::from_millis);
        self.grpc
            .start(CallSpec {
                call: name,
                method,
                payload,
                metadata,
                timeout,
                reading,
            })
            .map_err(|e| StepError::new(FailureCode::TransportFailed, e))
    }
}

/// The field number of the padding [`pad_to`] appends: one no engine message defines.
pub const PADDING_FIELD: u32 = 15_000;

fn varint_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

/// `payload` with one unknown length-delimited field ([`PADDING_FIELD`]) appended so the
/// encoded message is exactly `size` bytes: a request at a byte bound, and one past it,
/// whatever its fields ("Additive optional fields are tolerated").
///
/// # Errors
/// `size` leaves no room for the padding field after `payload`.
pub fn pad_to(mut payload: Vec<u8>, size: usize) -> Result<Vec<u8>, String> {
    let tag = (PADDING_FIELD << 3 | 2) as usize;
    let room = size
        .checked_sub(payload.len() + varint_len(tag))
        .ok_or_else(|| {
            format!(
                "`request_size` {size} is below the request's own {} bytes plus padding",
                payload.len()
            )
        })?;
    let len = (0..=room)
        .rev()
        .find(|len| len + varint_len(*len) == room)
        .ok_or_else(|| format!("`request_size` {size} cannot be reached with one padding field"))?;
    for mut n in [tag, len] {
        while n >= 0x80 {
            payload.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        payload.push(n as u8);
    }
    payload.resize(payload.len() + len, b'p');
    Ok(payload)
}

#[async_trait]
impl Connection for ClientLink {
    fn is_open(&self) -> bool {
        self.grpc.is_open()
    }

    fn abort(&mut self) -> bool {
        self.grpc.abort()
    }

    async fn send(&mut self, message: Outgoing, _timeout: Duration) -> StepResult {
        match message {
            Outgoing::Text(text) => {
                let frame: Value = serde_json::from_str(&text).map_err(|e| {
                    StepError::new(FailureCode::ScenarioInvalid, format!("a client frame: {e}"))
                })?;
                self.call(&frame)
            }
            Outgoing::Binary(bytes) | Outgoing::TextBytes(bytes) => {
                let outcome = grpc::poke_raw(&self.socket, &bytes, RAW_WAIT)
                    .await
                    .map_err(|e| StepError::new(FailureCode::TransportFailed, e))?;
                self.raw.push_back(json!({
                    "call": "raw",
                    "raw": {"goaway": outcome.goaway, "closed": outcome.closed},
                }));
                Ok(())
            }
        }
    }

    /// Every call's request is complete when it is sent (unary and server-streaming
    /// methods), so the end of the run ends the connection: what is still queued is read
    /// first (and fails the run as trailing output), then the channel is dropped.
    async fn send_close(&mut self, _code: u16, _reason: &str, _timeout: Duration) -> StepResult {
        self.closing = true;
        Ok(())
    }

    async fn end(&mut self, _timeout: Duration) {
        self.grpc.abort();
    }
}

/// The settings of `config.engine`: `retained_events` (a number) and `snapshot_key`
/// (`{scope_id, generation, key}`, hex): extra `serve` flags of the launch contract.
fn engine_flags(scenario: &Scenario, run_dir: &Path) -> Result<Vec<String>, String> {
    let Some(config) = &scenario.config.engine else {
        return Ok(Vec::new());
    };
    let Value::Object(map) = config else {
        return Err("config.engine must be a mapping".into());
    };
    if let Some(k) = map
        .keys()
        .find(|k| !["retained_events", "snapshot_key"].contains(&k.as_str()))
    {
        return Err(format!(
            "config.engine: unknown key `{k}` (keys: retained_events, snapshot_key)"
        ));
    }
    let mut flags = Vec::new();
    if let Some(n) = map.get("retained_events") {
        let n = n
            .as_u64()
            .filter(|n| *n > 0)
            .ok_or("config.engine.retained_events must be a positive integer")?;
        flags.extend(["--retained-events".to_string(), n.to_string()]);
    }
    if let Some(key) = map.get("snapshot_key") {
        let path = run_dir.join("snapshot-key.json");
        std::fs::write(&path, key.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        flags.extend([
            "--snapshot-key-file".to_string(),
            path.display().to_string(),
        ]);
    }
    Ok(flags)
}

/// Waits until the daemon's token file is written and its socket accepts a connection;
/// returns the token.
async fn ready(socket: &Path, token_file: &Path) -> Result<String, String> {
    loop {
        if let Ok(token) = std::fs::read_to_string(token_file) {
            let token = token.trim().to_string();
            if !token.is_empty() && tokio::net::UnixStream::connect(socket).await.is_ok() {
                return Ok(token);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    #[allow(unreachable_code)]
    Err(String::new())
}

async fn launch(
    spec: &LaunchSpec,
    socket: &Path,
    data: &Path,
    timeout: Duration,
) -> Result<(Target, String), String> {
    let token_file = data.join(TOKEN_FILE);
    // A restart: readiness must not be read from the last launch's files.
    let _ = std::fs::remove_file(&token_file);
    let mut target = Target::spawn(spec).map_err(|e| e.to_string())?;
    match target
        .await_ready(ready(socket, &token_file), timeout)
        .await
    {
        Ok(token) => Ok((target, token)),
        Err(e) => {
            target.shutdown().await;
            Err(e.to_string())
        }
    }
}

/// Launches the daemon with `--socket` and `--data-dir` in a private run directory and
/// waits for its readiness.
///
/// # Errors
/// The launch failed (the text names why, with the daemon's stderr tail).
pub async fn start(
    scenario: &Scenario,
    opts: &DriveOptions,
) -> Result<Started<ScriptedClientPeer>, String> {
    let run_dir = RunDir::new().map_err(|e| e.to_string())?;
    let socket = run_dir.path().join(SOCKET);
    check_socket_path(&socket).map_err(|e| e.to_string())?;
    let data = run_dir.path().join(DATA_DIR);
    let mut command = opts.target_cmd.clone();
    let mut args = vec![
        "--socket".to_string(),
        socket.display().to_string(),
        "--data-dir".to_string(),
        data.display().to_string(),
    ];
    args.extend(engine_flags(scenario, run_dir.path())?);
    for a in args {
        command.push(' ');
        command.push_str(&shell_words::quote(&a));
    }
    let spec = LaunchSpec {
        command,
        env: Vec::new(),
        cwd: run_dir.cwd(),
        secret: String::new(),
        capture_stdout: false,
    };
    let (target, token) = launch(&spec, &socket, &data, opts.startup_timeout).await?;
    Ok(Started {
        ready: true,
        peer: ScriptedClientPeer {
            link: ClientLink {
                grpc: GrpcLink::new(&socket),
                socket,
                token: token.clone(),
                raw: std::collections::VecDeque::new(),
                closing: false,
            },
            spec,
            _run_dir: run_dir,
        },
        process: Box::new(target),
        secret: token,
        normalize: super::normalize,
        prebound: Vec::new(),
    })
}

#[async_trait]
impl Peer for ScriptedClientPeer {
    type Other = NoOther;

    const ROLE: &'static Role = &DAEMON_ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<NoOther>>> {
        if let Some(raw) = self.link.raw.pop_front() {
            return Ok(Some(Event::Text(raw.to_string())));
        }
        if self.link.closing {
            // Events already delivered to the queue are read; then the connection ends.
            tokio::task::yield_now().await;
            return Ok(Some(match self.link.grpc.rx.try_recv() {
                Ok(event) => Event::Text(event.frame().to_string()),
                Err(_) => {
                    self.link.grpc.abort();
                    self.link.closing = false;
                    Event::Eof
                }
            }));
        }
        match tokio::time::timeout(timeout, self.link.grpc.next()).await {
            Err(_) => Ok(None),
            Ok(Some(event)) => Ok(Some(Event::Text(event.frame().to_string()))),
            Ok(None) => Ok(None),
        }
    }

    fn leak_in_other(&self, other: &NoOther, _secret: &str) -> Option<String> {
        match *other {}
    }

    fn connection(&mut self) -> &mut dyn Connection {
        &mut self.link
    }

    fn trailing_other(&mut self, other: NoOther) -> StepResult {
        match other {}
    }

    async fn family_step(&mut self, _run: &mut Run, step: &Step) -> StepResult {
        Err(fail::unsupported(format!(
            "`{}` is not a step of the engine family's side daemon",
            step.keyword()
        )))
    }

    fn crashed(&mut self) {
        self.link.grpc.abort();
    }

    async fn relaunch(&mut self, startup_timeout: Duration) -> Result<Box<dyn Process>, String> {
        let socket = self.link.socket.clone();
        let data = self._run_dir.path().join(DATA_DIR);
        let (target, token) = launch(&self.spec, &socket, &data, startup_timeout).await?;
        self.link.token = token;
        self.link.grpc.abort();
        Ok(Box::new(target))
    }

    fn release(&mut self) {
        self.link.grpc.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_reaches_exactly_the_size_asked_and_decodes_as_an_unknown_field() {
        let health = grpc::method(pool(), SERVICE, "Health").unwrap();
        let start = grpc::method(pool(), SERVICE, "StartRun").unwrap();
        let request = grpc::from_json(start.input(), &json!({"initialMessage": "hi"})).unwrap();
        // Every size across the varint boundaries of the padding's length.
        for size in [10, 127, 128, 129, 130, 16_384, 16_389, 4_194_304, 4_194_305] {
            let padded = pad_to(request.clone(), size).unwrap();
            assert_eq!(padded.len(), size, "{size}");
            let back = grpc::to_json(start.input(), &padded).unwrap();
            assert_eq!(back, json!({"initialMessage": "hi"}), "{size}");
        }
        let empty = pad_to(Vec::new(), 4_194_304).unwrap();
        assert_eq!(empty.len(), 4_194_304);
        assert_eq!(grpc::to_json(health.input(), &empty).unwrap(), json!({}));
        assert!(pad_to(request, 3).is_err());
    }
}
