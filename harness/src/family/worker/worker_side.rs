//! Side `worker` of the worker family: the worker under test is launched per
//! `docs/worker-launch-contract.md` and the harness plays the **host**: it creates the
//! private directory (0700) and the one socket (0600), mints the startup token, spawns
//! the worker with the launch environment and accepts its connection. Steps:
//!
//! | step | what the harness does |
//! |---|---|
//! | `host:` | substitute placeholders, schema-check as host → worker, wrap in the connection's envelope, send as one frame (engine) |
//! | `worker:` | the next thing the target does must be one frame: strict decode, identity check, schema-check as worker → host, record the message, match (engine) |
//! | `send_bytes: {text}` / `{text_base64}` | one frame of those payload bytes (a bad envelope, bad JSON, bad UTF-8) |
//! | `send_bytes: {base64}` | those bytes as they are, length prefix included (framing faults) |
//! | `half_close` / end of run | the harness closes its write side (the worker reads the end of the stream) |
//! | `native:` / `launch:` | nothing: they are the host's actions, and the harness is the host |
//!
//! With `config.worker.skills` (a JSON value: the skills set a host materialized,
//! "Skills"), the harness writes it to a private file (0600) beside the socket and appends
//! `--skills <path>` to the target's command; it removes the file as soon as the worker
//! connected ("The worker reads it before it connects, so the payload file cannot outlive
//! the handshake").
//!
//! The startup token is bound as `$token` before the first step. The socket, token and
//! environment are the host's choices of our reference; the spec fixes only that the
//! socket is private and the token binds the subprocess ("Transport and bounds").

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use async_trait::async_trait;
use contract_impl::worker::wire::limits::FRAME_MAX_BYTES;
use serde_json::Value;
use tokio::net::UnixListener;

use super::codec::WORKER_ROLE;
use super::{GENERATION, SESSION_ID};
use crate::drive::{
    Connection, DriveOptions, Event, FailureCode, NoOther, Outgoing, Peer, Role, Run, Started,
    StepError, StepResult, fail,
};
use crate::scenario::model::{Scenario, Step};
use crate::target::{LaunchSpec, RunDir, Startup, Target, check_socket_path};
use crate::transport::framed::{FramedConnection, FramedEvent};

/// The host the harness plays against a target worker.
pub struct ScriptedHostPeer {
    link: FramedLink,
    /// Held until the peer is dropped, after the target stopped.
    _run_dir: RunDir,
}

/// The one framed connection to the worker.
#[derive(Default)]
pub struct FramedLink {
    conn: Option<FramedConnection>,
    /// The worker exited before it connected and the scenario starts with
    /// `expect_close` ([`ends_first`]): its stream ended before its first frame, once.
    ended_unopened: bool,
}

/// Whether the scenario's first step is `expect_close` (or a `reference:` group starting
/// with one): a worker that refuses its launch (a startup validation) says no hello and
/// ends its stream, whether it connected first or exited before. Then an exit before
/// the connection is not a launch failure: the stream reads as ended.
pub fn ends_first(scenario: &Scenario) -> bool {
    match scenario.steps.first() {
        Some(Step::ExpectClose { .. }) => true,
        Some(Step::Reference { steps, .. }) => {
            matches!(steps.first(), Some(Step::ExpectClose { .. }))
        }
        _ => false,
    }
}

#[async_trait]
impl Connection for FramedLink {
    fn is_open(&self) -> bool {
        self.conn.is_some()
    }

    fn abort(&mut self) -> bool {
        self.conn.take().is_some()
    }

    async fn send(&mut self, message: Outgoing, timeout: Duration) -> StepResult {
        let Some(conn) = self.conn.as_mut() else {
            return Err(StepError::new(
                FailureCode::NotConnected,
                "no connection to the worker is open",
            ));
        };
        // A payload is framed here without the bound: frames of the harness's own are
        // bounded by the codec, and `send_bytes` goes past the bound on purpose.
        let framed = crate::transport::framed::encode_frame_unbounded;
        let sent = match message {
            Outgoing::Text(text) => conn.send_raw(&framed(text.as_bytes()), timeout).await,
            Outgoing::TextBytes(bytes) => conn.send_raw(&framed(&bytes), timeout).await,
            Outgoing::Binary(bytes) => conn.send_raw(&bytes, timeout).await,
        };
        sent.map_err(|e| StepError::new(FailureCode::TransportFailed, e.to_string()))
    }

    /// The transport has no Close: the harness ends its write side.
    async fn send_close(&mut self, _code: u16, _reason: &str, _timeout: Duration) -> StepResult {
        match self.conn.as_mut() {
            Some(conn) => {
                conn.close_write().await;
                Ok(())
            }
            None => Err(StepError::new(
                FailureCode::NotConnected,
                "no connection to the worker is open",
            )),
        }
    }

    async fn end(&mut self, _timeout: Duration) {
        self.conn = None;
    }
}

/// Hook source files: relative path and content.
type SourceFiles = Vec<(String, String)>;

/// Settings of `config.worker`.
struct WorkerConfig {
    /// `workbench` (default) or `hooks`.
    role: String,
    /// The hook source snapshot.
    hooks: Option<SourceFiles>,
    /// The materialized skills set, written as JSON.
    skills: Option<Value>,
}

/// Longest hook source file `{$text: {size}}` may write (bytes): past the 2 MiB bound.
const SOURCE_TEXT_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// One hook source file's content: text, or `{$text: {size, fill?, prefix?}}`, exactly
/// `size` bytes (`prefix`, then `fill`, one printable ASCII character, default `x`): a
/// snapshot at its byte bound and one past it.
fn source_text(path: &str, content: &Value) -> Result<String, String> {
    let bad = || {
        format!(
            "config.worker.hooks.files.{path} must be text or {{$text: {{size, fill?, prefix?}}}}"
        )
    };
    let spec = match content {
        Value::String(text) => return Ok(text.clone()),
        Value::Object(m) if m.len() == 1 => m.get("$text").ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    let Value::Object(spec) = spec else {
        return Err(bad());
    };
    if spec
        .keys()
        .any(|k| !["size", "fill", "prefix"].contains(&k.as_str()))
    {
        return Err(bad());
    }
    let size = spec
        .get("size")
        .and_then(Value::as_u64)
        .filter(|s| *s <= SOURCE_TEXT_MAX_BYTES)
        .ok_or_else(bad)?;
    let prefix = match spec.get("prefix") {
        None => "",
        Some(Value::String(p)) => p.as_str(),
        Some(_) => return Err(bad()),
    };
    let fill = match spec.get("fill") {
        None => 'x',
        Some(Value::String(f)) if f.len() == 1 && f.bytes().all(|b| b.is_ascii_graphic()) => {
            f.chars().next().unwrap_or('x')
        }
        Some(_) => return Err(bad()),
    };
    let size = usize::try_from(size).map_err(|_| bad())?;
    if prefix.len() > size {
        return Err(format!(
            "config.worker.hooks.files.{path}: the prefix is longer than `size`"
        ));
    }
    let mut text = String::with_capacity(size);
    text.push_str(prefix);
    text.extend(std::iter::repeat_n(fill, size - prefix.len()));
    Ok(text)
}

/// Settings of `config.worker`: `role` (`workbench`, default, or `hooks`), `hooks`
/// (`{files: {relative path: content}}`, the hook source snapshot) and `skills` (the
/// skills set file's JSON).
fn worker_config(scenario: &Scenario) -> Result<WorkerConfig, String> {
    if scenario.config.workspace.is_some() {
        return Err("config.workspace is a setting of side host (the host's skill roots)".into());
    }
    let Some(config) = &scenario.config.worker else {
        return Ok(WorkerConfig {
            role: "workbench".into(),
            hooks: None,
            skills: None,
        });
    };
    let Value::Object(map) = config else {
        return Err("config.worker must be a mapping".into());
    };
    if let Some(key) = map
        .keys()
        .find(|k| !["role", "hooks", "skills"].contains(&k.as_str()))
    {
        return Err(format!(
            "config.worker: unknown key `{key}` (keys: role, hooks, skills)"
        ));
    }
    let role = match map.get("role") {
        None => "workbench".to_string(),
        Some(Value::String(r)) => r.clone(),
        Some(other) => return Err(format!("config.worker.role must be a string, not {other}")),
    };
    let hooks = match map.get("hooks") {
        None => None,
        Some(Value::Object(h)) => {
            let Some(Value::Object(files)) = h.get("files") else {
                return Err("config.worker.hooks needs `files: {path: content}`".into());
            };
            let mut out = Vec::new();
            for (path, content) in files {
                let content = source_text(path, content)?;
                if path.starts_with('/') || path.split('/').any(|p| p.is_empty() || p == "..") {
                    return Err(format!(
                        "config.worker.hooks.files: `{path}` is not a relative path"
                    ));
                }
                out.push((path.clone(), content));
            }
            Some(out)
        }
        Some(other) => {
            return Err(format!(
                "config.worker.hooks must be a mapping, not {other}"
            ));
        }
    };
    Ok(WorkerConfig {
        role,
        hooks,
        skills: map.get("skills").cloned(),
    })
}

/// Prepares the private directory and socket, launches the worker and accepts its
/// connection. With `exit_allowed` (the first step is `expect_exit`), an exit before the
/// connection is not an error.
///
/// # Errors
/// The launch failed (the text names why, with the target's stderr tail).
pub async fn start(
    scenario: &Scenario,
    opts: &DriveOptions,
    exit_allowed: bool,
) -> Result<Started<ScriptedHostPeer>, String> {
    let WorkerConfig {
        role,
        hooks,
        skills,
    } = worker_config(scenario)?;
    let run_dir = RunDir::new().map_err(|e| e.to_string())?;
    let socket = run_dir.path().join("worker.sock");
    check_socket_path(&socket).map_err(|e| e.to_string())?;
    let listener = UnixListener::bind(&socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
    let mut env = vec![
        (
            "CONTRACT_WORKER_SOCKET".to_string(),
            socket.display().to_string(),
        ),
        ("CONTRACT_WORKER_TOKEN".to_string(), token.clone()),
        (
            "CONTRACT_WORKER_SESSION_ID".to_string(),
            SESSION_ID.to_string(),
        ),
        (
            "CONTRACT_WORKER_GENERATION".to_string(),
            GENERATION.to_string(),
        ),
        ("CONTRACT_WORKER_ROLE".to_string(), role),
    ];
    if let Some(files) = hooks {
        let dir = run_dir.path().join("hooks");
        for (path, content) in files {
            let file = dir.join(&path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("{}: {e}", parent.display()))?;
            }
            std::fs::write(&file, content).map_err(|e| format!("{}: {e}", file.display()))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        env.push((
            "CONTRACT_WORKER_HOOKS_DIR".to_string(),
            dir.display().to_string(),
        ));
    }
    let mut command = opts.target_cmd.clone();
    let skills_file = match skills {
        Some(set) => {
            let path = run_dir.path().join("skills.json");
            contract_impl::private_fs::create_private(&path, set.to_string().as_bytes())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            command.push_str(&format!(
                " --skills {}",
                shell_words::quote(&path.display().to_string())
            ));
            Some(path)
        }
        None => None,
    };
    let spec = LaunchSpec {
        command,
        env,
        cwd: run_dir.cwd(),
        secret: String::new(),
        capture_stdout: false,
        stdin_pipe: false,
    };
    let mut target = Target::spawn(&spec).map_err(|e| e.to_string())?;
    let accept = async {
        listener
            .accept()
            .await
            .map(|(stream, _)| FramedConnection::new(stream, FRAME_MAX_BYTES))
    };
    let started = if exit_allowed {
        target
            .await_ready_or_exit(accept, opts.startup_timeout)
            .await
    } else {
        target
            .await_ready(accept, opts.startup_timeout)
            .await
            .map(Startup::Ready)
    };
    if let Some(path) = skills_file {
        // Read before the worker connected: nothing may need it from here on.
        let _ = std::fs::remove_file(path);
    }
    let conn = match started {
        Ok(Startup::Ready(conn)) => Some(conn),
        Ok(Startup::Exited(_)) => None,
        Err(e) => {
            target.shutdown().await;
            return Err(e.to_string());
        }
    };
    Ok(Started {
        ready: conn.is_some(),
        peer: ScriptedHostPeer {
            link: FramedLink {
                ended_unopened: conn.is_none(),
                conn,
            },
            _run_dir: run_dir,
        },
        process: Box::new(target),
        secret: String::new(),
        normalize: Value::clone,
        prebound: vec![("token".to_string(), Value::String(token))],
    })
}

#[async_trait]
impl Peer for ScriptedHostPeer {
    type Other = NoOther;

    const ROLE: &'static Role = &WORKER_ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<NoOther>>> {
        let Some(conn) = self.link.conn.as_mut() else {
            if std::mem::take(&mut self.link.ended_unopened) {
                return Ok(Some(Event::Eof));
            }
            tokio::time::sleep(timeout).await;
            return Ok(None);
        };
        let event = match tokio::time::timeout(timeout, conn.recv()).await {
            Err(_) => return Ok(None),
            Ok(event) => event,
        };
        Ok(Some(match event {
            Some(FramedEvent::Frame(bytes)) => match String::from_utf8(bytes) {
                Ok(text) => Event::Text(text),
                Err(e) => Event::Error {
                    code: "not_utf8",
                    detail: format!(
                        "a frame that is not UTF-8 (byte {})",
                        e.utf8_error().valid_up_to()
                    ),
                },
            },
            Some(FramedEvent::Error { code, detail }) => {
                self.link.conn = None;
                Event::Error { code, detail }
            }
            Some(FramedEvent::Eof) | None => {
                self.link.conn = None;
                Event::Eof
            }
        }))
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

    /// `native` (a host action) and `launch` are the host's: with the worker as the
    /// target the harness is the host and has launched it, so both are no-ops.
    async fn family_step(&mut self, _run: &mut Run, step: &Step) -> StepResult {
        if matches!(step, Step::Native { .. } | Step::Launch { .. }) {
            return Ok(());
        }
        Err(fail::unsupported(format!(
            "`{}` is not a step of the worker family",
            step.keyword()
        )))
    }

    fn release(&mut self) {
        self.link.conn = None;
    }
}

#[cfg(test)]
mod tests {
    use super::source_text;
    use serde_json::json;

    #[test]
    fn a_source_file_is_text_or_a_sized_text() {
        assert_eq!(source_text("a.md", &json!("hi")).unwrap(), "hi");
        let t = source_text(
            "a.md",
            &json!({"$text": {"size": 5, "prefix": "# ", "fill": "o"}}),
        )
        .unwrap();
        assert_eq!(t, "# ooo");
        assert_eq!(
            source_text("a.md", &json!({"$text": {"size": 3}})).unwrap(),
            "xxx"
        );
        for bad in [
            json!(3),
            json!({"$text": {"size": 2, "prefix": "abc"}}),
            json!({"$text": {"size": 2, "fill": "ab"}}),
            json!({"$text": {"size": 2, "other": 1}}),
            json!({"$text": {"size": 5_000_000}}),
            json!({"$text": 4}),
        ] {
            assert!(source_text("a.md", &bad).is_err(), "{bad}");
        }
    }
}
