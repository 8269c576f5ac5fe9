//! Side `host` of the worker family: the host under test is launched per
//! `docs/worker-host-control.md` and the harness plays **every worker it starts**.
//!
//! The host is told to run this harness's own binary in relay mode
//! (`contract-harness peer relay --socket PATH`, [`crate::transport::relay`]) as its
//! worker program (`CONTRACT_WORKER_PROGRAM`); each worker it starts connects back to the
//! harness with its launch environment, and the harness dials the host's socket through
//! it. Host actions are asked for on the control channel (`CONTRACT_HOST_CONTROL_SOCKET`,
//! the host's hello line is its readiness). Steps:
//!
//! | step | what the harness does |
//! |---|---|
//! | `native: {op: args}` | one control request; `expect:` matches its result |
//! | `launch: {role, token, revision, skills}` | awaits the host's next worker launch, checks its private directory (no group/other access) and socket (a socket, no group/other access, path within the address bound), a fresh token, the role; dials the socket; binds `token` (default `$token`) and, for `revision`, the revision the worker echoes in hello (a hook worker: the snapshot's source identity; a workbench: the `revision` of the skills set it was given, `null` without `--skills`); with `skills` (a pattern), the launch must carry `--skills <path>`, a regular file of this user's beside the socket with no group/other access, whose JSON matches the pattern (a launch without `--skills` is matched as `null`: `skills: null` requires none) |
//! | `worker:` | sent as that worker: `hello` to the launched worker that has not said hello, `completed`/`host_request` to the worker whose operation or execution it names, else the last worker the host spoke to; the envelope carries that worker's `session_id`/`generation` |
//! | `host:` | the next frame of any worker the host runs (its envelope identity checked against that worker's launch environment) |
//! | `send_bytes` | raw to the last worker the host spoke to |
//! | `half_close` | ends that worker's write side; `disconnect`: that worker process exits (it dies) |
//! | `crash` | SIGKILL of the host's process group, then the same launch again (same working directory, so the same data); the control channel reconnects, workers of the new host connect back through the same relay listener |
//! | `received_by: {id, token}` | the operation `id` the host sent went to the worker launched with `token` |
//! | `write_workspace: {files, dirs, generated, symlinks}` | written into the host's workspace now (its skill roots: "Skills") |
//!
//! The host is given the run's workspace (`config.workspace` seeded into it first):
//! `CONTRACT_WORKSPACE` names it, `KLBR_SKILLS_DIR` its `skills/` (the builtin skill root)
//! and `CONTRACT_HOST_DATA_DIR` its `data/` (the host's data directory, so the managed
//! skill root `data/skills/` is seeded the same way).
//!
//! The end of a connection is an event only for the worker the harness last spoke with
//! (sent to or heard from); the end of another one (a retired hook generation the host
//! stops) is not, and a later frame to it fails the step.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use contract_impl::wire::framing::FrameDecoder;
use contract_impl::worker::wire::limits::{FRAME_MAX_BYTES, SOCKET_PATH_MAX_BYTES};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::codec::HOST_ROLE;
use super::{GENERATION, SESSION_ID};
use crate::drive::{
    Connection, DriveOptions, Event, FailureCode, NoOther, Outgoing, Peer, Process, Role, Run,
    Started, StepError, StepResult, fail,
};
use crate::scenario::model::{Scenario, Step};
use crate::target::{LaunchSpec, RunDir};
use crate::transport::control::{ControlChannel, WORKER_HOST, launch_controlled};
use crate::transport::relay::{Hello, RelayEvent, RelayListener, RelayMsg};

/// The channel of every worker's protocol socket on its relay.
const CHANNEL: u32 = 1;

/// Bound of one relay write.
const RELAY_SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// The builtin skill root under the workspace (`KLBR_SKILLS_DIR`, "Skills").
const BUILTIN_SKILLS: &str = "skills";

/// The host's data directory under the workspace (`CONTRACT_HOST_DATA_DIR`; its
/// `skills/` is the managed root, "Skills").
const HOST_DATA: &str = "data";

/// The argument that passes a workbench its materialized skills set ("Skills").
const SKILLS_ARG: &str = "--skills";

/// What the relay tasks report.
enum Inbound {
    /// A worker the host started connected back.
    Launched {
        idx: usize,
        hello: Hello,
        tx: mpsc::Sender<RelayMsg>,
    },
    /// Something that worker's relay reported.
    Relay { idx: usize, event: RelayEvent },
}

/// One worker the host started.
struct WorkerConn {
    tx: mpsc::Sender<RelayMsg>,
    env: HashMap<String, String>,
    /// The launched process's arguments.
    argv: Vec<String>,
    decoder: FrameDecoder,
    /// `Some(Ok)`: the socket is connected; `Some(Err)`: dialling failed.
    opened: Option<Result<(), String>>,
    /// The host ended the connection (or the worker is gone).
    ended: bool,
    helloed: bool,
}

impl WorkerConn {
    fn var(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str)
    }
}

/// The workers the harness plays against a target host, and the control channel.
pub struct ScriptedWorkerPeer {
    control: Option<ControlChannel>,
    events: mpsc::Receiver<Inbound>,
    conns: Vec<WorkerConn>,
    /// Launched workers no `launch` step took yet.
    launched: VecDeque<usize>,
    /// Which worker an operation or execution ID belongs to.
    routes: HashMap<String, usize>,
    /// The worker the host last spoke to (or last launched).
    current: Option<usize>,
    ready: VecDeque<Event<NoOther>>,
    tokens: HashSet<String>,
    accept_task: tokio::task::JoinHandle<()>,
    /// The launch, again after a `crash` (same working directory: the host's data).
    spec: LaunchSpec,
    /// Workers below this index were a killed host's (`crash`): what their relays still
    /// report is no event.
    retired: usize,
    run_dir: RunDir,
}

impl Drop for ScriptedWorkerPeer {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

/// Writes every `config.worker.snapshots` entry (and `hooks`) under the run directory;
/// returns the placeholders naming their paths (`$snapshot_<name>`, `$hooks_dir`).
fn write_snapshots(scenario: &Scenario, run_dir: &RunDir) -> Result<Vec<(String, Value)>, String> {
    let mut bound = Vec::new();
    let Some(Value::Object(config)) = &scenario.config.worker else {
        return Ok(bound);
    };
    let mut sets: Vec<(String, PathBuf, &Value)> = Vec::new();
    if let Some(hooks) = config.get("hooks").and_then(|h| h.get("files")) {
        sets.push(("hooks_dir".into(), run_dir.path().join("hooks"), hooks));
    }
    if let Some(Value::Object(snapshots)) = config.get("snapshots") {
        for (name, files) in snapshots {
            let files = files.get("files").unwrap_or(files);
            sets.push((
                format!("snapshot_{name}"),
                run_dir.path().join("snapshots").join(name),
                files,
            ));
        }
    }
    for (placeholder, dir, files) in sets {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let Value::Object(files) = files else {
            return Err(format!("{placeholder}: files must be a mapping"));
        };
        for (path, content) in files {
            let Value::String(content) = content else {
                return Err(format!("{placeholder}: {path} must be text"));
            };
            if path.starts_with('/') || path.split('/').any(|p| p.is_empty() || p == "..") {
                return Err(format!("{placeholder}: `{path}` is not a relative path"));
            }
            let file = dir.join(path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("{}: {e}", parent.display()))?;
            }
            std::fs::write(&file, content).map_err(|e| format!("{}: {e}", file.display()))?;
        }
        bound.push((placeholder, Value::String(dir.display().to_string())));
    }
    Ok(bound)
}

/// Launches the host with the control socket and the relay as its worker program, and
/// waits for its hello line.
///
/// # Errors
/// The launch failed (the text names why, with the target's stderr tail).
pub async fn start(
    scenario: &Scenario,
    opts: &DriveOptions,
) -> Result<Started<ScriptedWorkerPeer>, String> {
    let run_dir = RunDir::new().map_err(|e| e.to_string())?;
    let prebound = write_snapshots(scenario, &run_dir)?;
    if let Some(seed) = &scenario.config.workspace {
        run_dir.seed(seed).map_err(|e| e.to_string())?;
    }
    let workspace = run_dir.workspace();
    let relay_path = run_dir.path().join("relay.sock");
    let relays = RelayListener::bind(&relay_path).map_err(|e| e.to_string())?;
    let exe = match &opts.peer_exe {
        Some(exe) => exe.clone(),
        None => std::env::current_exe().map_err(|e| e.to_string())?,
    };
    let program = json!([
        exe.display().to_string(),
        "peer",
        "relay",
        "--socket",
        relay_path.display().to_string()
    ]);
    let spec = LaunchSpec {
        command: opts.target_cmd.clone(),
        env: vec![
            (
                contract_impl::worker::controlled::CONTROL_ENV.to_string(),
                run_dir.control_socket().display().to_string(),
            ),
            (
                contract_impl::worker::controlled::PROGRAM_ENV.to_string(),
                program.to_string(),
            ),
            (
                "CONTRACT_WORKSPACE".to_string(),
                workspace.display().to_string(),
            ),
            (
                "KLBR_SKILLS_DIR".to_string(),
                workspace.join(BUILTIN_SKILLS).display().to_string(),
            ),
            (
                "CONTRACT_HOST_DATA_DIR".to_string(),
                workspace.join(HOST_DATA).display().to_string(),
            ),
        ],
        cwd: run_dir.cwd(),
        secret: String::new(),
        capture_stdout: false,
        stdin_pipe: false,
    };
    let (target, channel) = launch_controlled(
        &spec,
        &run_dir.control_socket(),
        WORKER_HOST,
        opts.startup_timeout,
    )
    .await?;
    let (events_tx, events) = mpsc::channel(256);
    let accept_task = tokio::spawn(accept_relays(relays, events_tx));
    Ok(Started {
        ready: true,
        peer: ScriptedWorkerPeer::new(Some(channel), events, accept_task, spec, run_dir),
        process: Box::new(target),
        secret: String::new(),
        normalize: mask_clock,
        prebound,
    })
}

impl ScriptedWorkerPeer {
    /// A peer on `control` (none in unit tests) with no worker launched yet.
    fn new(
        control: Option<ControlChannel>,
        events: mpsc::Receiver<Inbound>,
        accept_task: tokio::task::JoinHandle<()>,
        spec: LaunchSpec,
        run_dir: RunDir,
    ) -> Self {
        Self {
            control,
            events,
            conns: Vec::new(),
            launched: VecDeque::new(),
            routes: HashMap::new(),
            current: None,
            ready: VecDeque::new(),
            tokens: HashSet::new(),
            accept_task,
            spec,
            retired: 0,
            run_dir,
        }
    }
}

/// Masks what differs from run to run in goldens: `now`/`now_ms` of a `host_reply` value
/// (what `runtime.inspect` answers), a wait's `deadline_ms` (a time of the run when it is
/// a number), a program run's `elapsed_ms` (`workspace.run`) and the workspace's `root`
/// (`workspace.info`: a path under the run's own directory).
fn mask_clock(body: &Value) -> Value {
    let mut body = body.clone();
    if body.get("kind").and_then(Value::as_str) == Some("host_reply")
        && let Some(Value::Object(value)) = body.pointer_mut("/reply/value")
    {
        for (key, mask) in [("now", "<now>"), ("now_ms", "<now_ms>")] {
            if let Some(v) = value.get_mut(key) {
                *v = Value::String(mask.into());
            }
        }
        for (key, mask) in [
            ("deadline_ms", "<deadline_ms>"),
            ("elapsed_ms", "<elapsed_ms>"),
        ] {
            if let Some(v) = value.get_mut(key).filter(|v| v.is_number()) {
                *v = Value::String(mask.into());
            }
        }
        if let Some(v) = value.get_mut("root").filter(|v| v.is_string()) {
            *v = Value::String("<root>".into());
        }
    }
    body
}

/// Accepts every relay peer (each worker the host starts) and runs one task per relay.
async fn accept_relays(listener: RelayListener, events: mpsc::Sender<Inbound>) {
    let mut next = 0usize;
    loop {
        let Ok((mut relay, hello)) = listener.accept(Duration::from_secs(3600)).await else {
            continue;
        };
        let idx = next;
        next += 1;
        let (tx, mut rx) = mpsc::channel::<RelayMsg>(64);
        if events
            .send(Inbound::Launched { idx, hello, tx })
            .await
            .is_err()
        {
            return;
        }
        let events = events.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    event = relay.recv() => {
                        let gone = matches!(event, RelayEvent::Gone | RelayEvent::Error(_));
                        if events.send(Inbound::Relay { idx, event }).await.is_err() || gone {
                            return;
                        }
                    }
                    msg = rx.recv() => match msg {
                        Some(msg) => {
                            if relay.send(msg, RELAY_SEND_TIMEOUT).await.is_err() {
                                let _ = events.send(Inbound::Relay { idx, event: RelayEvent::Gone }).await;
                                return;
                            }
                        }
                        // The harness is done with this worker: dropping the link ends it.
                        None => return,
                    },
                }
            }
        });
    }
}

// Frames of the harness's own are bounded by the codec; `send_bytes` goes past the bound
// on purpose, so nothing is checked here.
use crate::transport::framed::encode_frame_unbounded as framed;

impl ScriptedWorkerPeer {
    fn absorb(&mut self, inbound: Inbound) {
        match inbound {
            Inbound::Launched { idx, hello, tx } => {
                let env = hello.env.into_iter().collect();
                debug_assert_eq!(idx, self.conns.len());
                self.conns.push(WorkerConn {
                    tx,
                    env,
                    argv: hello.argv,
                    decoder: FrameDecoder::new(FRAME_MAX_BYTES),
                    opened: None,
                    ended: false,
                    helloed: false,
                });
                self.launched.push_back(idx);
            }
            Inbound::Relay { idx, event } => self.relay_event(idx, event),
        }
    }

    fn relay_event(&mut self, idx: usize, event: RelayEvent) {
        if idx < self.retired {
            return;
        }
        let Some(conn) = self.conns.get_mut(idx) else {
            return;
        };
        match event {
            RelayEvent::Msg(RelayMsg::Opened(CHANNEL)) => conn.opened = Some(Ok(())),
            RelayEvent::Msg(RelayMsg::OpenFailed { reason, .. }) => conn.opened = Some(Err(reason)),
            RelayEvent::Msg(RelayMsg::Data { bytes, .. }) => {
                conn.decoder.push(&bytes);
                let mut frames = Vec::new();
                let mut fault = None;
                loop {
                    match conn.decoder.next_frame() {
                        Ok(Some(payload)) => frames.push(payload),
                        Ok(None) => break,
                        Err(e) => {
                            fault = Some(e);
                            break;
                        }
                    }
                }
                for payload in frames {
                    let event = self.incoming(idx, payload);
                    self.ready.push_back(event);
                }
                if let Some(e) = fault {
                    // Nothing after a framing fault is a frame ("never attempt to resume").
                    self.conns[idx].ended = true;
                    self.ready.push_back(Event::Error {
                        code: e.code(),
                        detail: e.to_string(),
                    });
                }
            }
            RelayEvent::Msg(RelayMsg::Eof(_)) | RelayEvent::Gone | RelayEvent::Error(_) => {
                // The end of a connection the harness is not speaking on (a retired
                // generation the host stopped) is no event; a later send to it fails.
                let quiet = self.current != Some(idx);
                if conn.opened == Some(Ok(())) && !conn.ended {
                    conn.ended = true;
                    if quiet {
                        return;
                    }
                    let truncated = conn.decoder.finish().err();
                    self.ready.push_back(match truncated {
                        Some(e) => Event::Error {
                            code: e.code(),
                            detail: e.to_string(),
                        },
                        None => Event::Eof,
                    });
                }
            }
            RelayEvent::Msg(_) => {}
        }
    }

    /// A frame of worker `idx`: its envelope identity checked against its launch
    /// environment and replaced by the family's fixed one, so the codec sees one
    /// identity; the operation it opens routed to `idx`.
    fn incoming(&mut self, idx: usize, payload: Vec<u8>) -> Event<NoOther> {
        let text = match String::from_utf8(payload) {
            Ok(text) => text,
            Err(e) => {
                return Event::Error {
                    code: "not_utf8",
                    detail: format!(
                        "a frame that is not UTF-8 (byte {})",
                        e.utf8_error().valid_up_to()
                    ),
                };
            }
        };
        let Ok(Value::Object(mut envelope)) =
            contract_impl::wire::parse_strict_with_nulls(text.as_bytes())
        else {
            return Event::Text(text);
        };
        let conn = &self.conns[idx];
        for (field, var, fixed, code) in [
            (
                "session_id",
                "CONTRACT_WORKER_SESSION_ID",
                SESSION_ID,
                "session_mismatch",
            ),
            (
                "generation",
                "CONTRACT_WORKER_GENERATION",
                GENERATION,
                "generation_mismatch",
            ),
        ] {
            let got = envelope.get(field).and_then(Value::as_str);
            if got.is_some() && got != conn.var(var) {
                return Event::Error {
                    code,
                    detail: format!(
                        "the host sent {field} {:?} to the worker it launched with {var}={:?}",
                        got.unwrap_or_default(),
                        conn.var(var).unwrap_or_default()
                    ),
                };
            }
            if got.is_some() {
                envelope.insert(field.into(), Value::String(fixed.into()));
            }
        }
        if let Some(message) = envelope.get("message")
            && let (Some(kind), Some(id)) = (
                message.get("kind").and_then(Value::as_str),
                message.get("id").and_then(Value::as_str),
            )
            && (kind == "execute" || kind == "invoke")
        {
            self.routes.insert(id.to_string(), idx);
        }
        self.current = Some(idx);
        Event::Text(Value::Object(envelope).to_string())
    }

    /// Which worker a frame the harness sends as a worker goes to.
    fn route(&self, message: &Value) -> Option<usize> {
        let kind = message
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let by = |key: &str| {
            message
                .get(key)
                .and_then(Value::as_str)
                .and_then(|id| self.routes.get(id).copied())
        };
        match kind {
            "hello" => self
                .conns
                .iter()
                .position(|c| c.opened == Some(Ok(())) && !c.helloed && !c.ended)
                .or(self.current),
            "completed" => by("id").or(self.current),
            "host_request" => by("execution_id").or(self.current),
            _ => self.current,
        }
    }

    async fn relay_to(&mut self, idx: usize, msg: RelayMsg) -> StepResult {
        let conn = self
            .conns
            .get(idx)
            .ok_or_else(|| not_connected("no such worker"))?;
        conn.tx
            .send(msg)
            .await
            .map_err(|_| StepError::new(FailureCode::TransportFailed, "the worker's relay is gone"))
    }

    /// Waits (until `deadline`) for `ready` to hold an event or `done` to hold.
    async fn pump_until(
        &mut self,
        deadline: tokio::time::Instant,
        done: impl Fn(&Self) -> bool,
    ) -> bool {
        loop {
            if done(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(inbound)) => self.absorb(inbound),
                Ok(None) | Err(_) => return done(self),
            }
        }
    }

    async fn native(
        &mut self,
        run: &mut Run,
        op: &str,
        args: &Value,
        expect: Option<&Value>,
    ) -> StepResult {
        // The host's own `await` bound is `timeout_ms` (600 s without it).
        crate::drive::control::native_step(
            self.control.as_mut(),
            run,
            op,
            args,
            expect,
            Duration::ZERO,
            Duration::from_secs(5),
        )
        .await
    }

    async fn launch(&mut self, run: &mut Run, args: &Map<String, Value>) -> StepResult {
        let deadline = tokio::time::Instant::now() + run.step_timeout;
        if !self.pump_until(deadline, |p| !p.launched.is_empty()).await {
            return Err(fail::mismatch(format!(
                "the host launched no worker within {}",
                crate::drive::show_duration(run.step_timeout)
            )));
        }
        let idx = self.launched.pop_front().unwrap_or_default();
        let conn = &self.conns[idx];
        let var = |name: &str| {
            conn.var(name)
                .map(str::to_string)
                .ok_or_else(|| fail::mismatch(format!("the host launched a worker without {name}")))
        };
        let socket = PathBuf::from(var("CONTRACT_WORKER_SOCKET")?);
        let token = var("CONTRACT_WORKER_TOKEN")?;
        let role = conn
            .var("CONTRACT_WORKER_ROLE")
            .unwrap_or("workbench")
            .to_string();
        let hooks_dir = conn.var("CONTRACT_WORKER_HOOKS_DIR").map(PathBuf::from);
        for name in ["CONTRACT_WORKER_SESSION_ID", "CONTRACT_WORKER_GENERATION"] {
            let value = var(name)?;
            if contract_impl::worker::wire::Identifier::new(value.clone()).is_err() {
                return Err(fail::mismatch(format!(
                    "{name}={value:?} is not an identifier"
                )));
            }
        }
        check_private(&socket)?;
        if contract_impl::worker::wire::Identifier::new(token.clone()).is_err() {
            return Err(fail::mismatch(
                "the startup token is not an identifier".to_string(),
            ));
        }
        if !self.tokens.insert(token.clone()) {
            return Err(fail::mismatch(
                "the startup token of an earlier worker was given again (it must be random)"
                    .to_string(),
            ));
        }
        if let Some(want) = args.get("role").and_then(Value::as_str)
            && want != role
        {
            return Err(fail::mismatch(format!(
                "the host launched a {role} worker, expected {want}"
            )));
        }
        self.relay_to(
            idx,
            RelayMsg::Dial {
                channel: CHANNEL,
                path: socket.display().to_string(),
            },
        )
        .await?;
        if !self
            .pump_until(deadline, |p| p.conns[idx].opened.is_some())
            .await
        {
            return Err(fail::transport(format!(
                "dialling {} did not finish",
                socket.display()
            )));
        }
        if let Some(Err(reason)) = &self.conns[idx].opened {
            return Err(fail::transport(format!(
                "cannot connect to the host's socket {}: {reason}",
                socket.display()
            )));
        }
        self.current = Some(idx);
        let bind = |run: &mut Run, key: &str, default: &str, value: Value| -> StepResult {
            let name = match args.get(key) {
                Some(Value::String(p)) => p.strip_prefix('$').unwrap_or(p).to_string(),
                None if default.is_empty() => return Ok(()),
                None => default.to_string(),
                Some(other) => {
                    return Err(fail::unsupported(format!(
                        "launch `{key}` must be a placeholder, not {other}"
                    )));
                }
            };
            run.bindings
                .bind(&name, value)
                .map_err(|e| fail::bind(e, "the launch"))
        };
        bind(run, "token", "token", Value::String(token))?;
        if let Some(pattern) = args.get("skills") {
            // A launch without `--skills` is matched as `null` (`skills: null`: no set).
            let set = skills_set(&self.conns[idx].argv, &socket)?;
            let value = set.clone().unwrap_or(Value::Null);
            crate::matcher::match_frame(pattern, &value, &mut run.bindings).map_err(|m| {
                let e = fail::mismatch(match &set {
                    Some(set) => format!(
                        "the materialized skills set does not match: {m}\n  set: {}",
                        crate::drive::show(set)
                    ),
                    None => format!(
                        "the host launched the workbench without `{SKILLS_ARG} <path>` (arguments: {:?}): {m}",
                        self.conns[idx].argv
                    ),
                });
                match &m.reference {
                    Some(requirement) => e.in_reference(requirement),
                    None => e,
                }
            })?;
        }
        if args.contains_key("revision") && role == "workbench" {
            // What the workbench must echo in hello: the revision of the set it was given
            // (`null` when it was launched without `--skills`).
            let set = skills_set(&self.conns[idx].argv, &socket)?;
            let revision = match set {
                None => Value::Null,
                Some(set) => set.get("revision").cloned().ok_or_else(|| {
                    fail::mismatch(format!(
                        "the materialized skills set has no `revision`: {}",
                        crate::drive::show(&set)
                    ))
                })?,
            };
            bind(run, "revision", "", revision)?;
        } else if args.contains_key("revision") {
            let dir = hooks_dir.ok_or_else(|| {
                fail::mismatch(
                    "a hook worker was launched without CONTRACT_WORKER_HOOKS_DIR".to_string(),
                )
            })?;
            let revision = contract_impl::worker::source::source_identity(&dir).map_err(|e| {
                fail::mismatch(format!("the host's snapshot {}: {e}", dir.display()))
            })?;
            bind(run, "revision", "", Value::String(revision))?;
        }
        Ok(())
    }
}

impl ScriptedWorkerPeer {
    /// `worker_stdio`: the last launched worker writes on its stdout/stderr.
    /// `received_by: {id, token}`: the worker the host sent operation `id` to is the one
    /// launched with `token` (a cell pinned to a retiring hook generation is reviewed by
    /// that generation, "Each executing cell pins its policy object").
    fn received_by(&self, run: &mut Run, args: &Value) -> StepResult {
        let field = |key: &str| {
            args.get(key)
                .ok_or_else(|| fail::scenario(format!("received_by needs `{key}` (a pattern)")))
        };
        let (id_pattern, token_pattern) = (field("id")?, field("token")?);
        // The operation the pattern names (a bound placeholder: exactly one).
        let named: Vec<(&String, usize)> = self
            .routes
            .iter()
            .filter(|(id, _)| {
                let mut scratch = run.bindings.clone();
                crate::matcher::match_frame(id_pattern, &Value::String((*id).clone()), &mut scratch)
                    .is_ok()
            })
            .map(|(id, idx)| (id, *idx))
            .collect();
        let (id, idx) = match named.as_slice() {
            [(id, idx)] => ((*id).clone(), *idx),
            [] => {
                return Err(fail::mismatch(format!(
                    "the host sent no operation {id_pattern} to any worker"
                )));
            }
            _ => {
                return Err(fail::scenario(
                    "received_by `id` must name one operation (a bound placeholder)".to_string(),
                ));
            }
        };
        let token = Value::String(
            self.conns[idx]
                .var("CONTRACT_WORKER_TOKEN")
                .unwrap_or_default()
                .to_string(),
        );
        crate::matcher::match_frame(token_pattern, &token, &mut run.bindings).map_err(|m| {
            fail::mismatch(format!(
                "operation `{id}` went to the worker launched with another token: {m}"
            ))
        })
    }

    async fn stdio(&mut self, args: &Value) -> StepResult {
        let args = crate::matcher::expand_text(args).map_err(fail::scenario)?;
        let idx = self
            .current
            .or_else(|| self.conns.len().checked_sub(1))
            .ok_or_else(|| not_connected("no worker was launched"))?;
        for (key, stream) in [("stdout", true), ("stderr", false)] {
            match args.get(key) {
                None => {}
                Some(Value::String(text)) => {
                    let bytes = text.as_bytes().to_vec();
                    let msg = if stream {
                        RelayMsg::Stdout(bytes)
                    } else {
                        RelayMsg::Stderr(bytes)
                    };
                    self.relay_to(idx, msg).await?;
                }
                Some(other) => {
                    return Err(fail::scenario(format!(
                        "worker_stdio `{key}` must be text, not {other}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The skills set a launch was given ("A local spawn also materializes the whole validated
/// set beside the control socket and passes it as `--skills <path>`"): the file after
/// `--skills` in `argv`, a regular file of this user's in the socket's directory with no
/// group or other access, read as JSON (the worker reads it before it connects, so it is
/// there now); `None` when the launch carries no `--skills`.
fn skills_set(argv: &[String], socket: &Path) -> StepResult<Option<Value>> {
    let Some(at) = argv.iter().position(|a| a == SKILLS_ARG) else {
        return Ok(None);
    };
    let path = argv.get(at + 1).map(PathBuf::from).ok_or_else(|| {
        fail::mismatch(format!(
            "the host launched the workbench with `{SKILLS_ARG}` and no path (arguments: {argv:?})"
        ))
    })?;
    if path.parent() != socket.parent() {
        return Err(fail::mismatch(format!(
            "the skills set {} is not beside the socket {}",
            path.display(),
            socket.display()
        )));
    }
    let meta = std::fs::symlink_metadata(&path)
        .map_err(|e| fail::mismatch(format!("the skills set {}: {e}", path.display())))?;
    let mode = meta.permissions().mode() & 0o777;
    if !meta.is_file() || meta.uid() != nix::unistd::getuid().as_raw() || mode & 0o077 != 0 {
        return Err(fail::mismatch(format!(
            "the skills set {} is not a private regular file (mode {mode:03o})",
            path.display()
        )));
    }
    let bytes = std::fs::read(&path)
        .map_err(|e| fail::mismatch(format!("the skills set {}: {e}", path.display())))?;
    let set = contract_impl::wire::parse_strict_with_nulls(&bytes).map_err(|e| {
        fail::mismatch(format!(
            "the skills set {} is not JSON: {e}",
            path.display()
        ))
    })?;
    if set.is_null() {
        // `null` stands for "no set" in a `skills:` pattern.
        return Err(fail::mismatch(format!(
            "the skills set {} is JSON `null`",
            path.display()
        )));
    }
    Ok(Some(set))
}

fn not_connected(what: &str) -> StepError {
    fail::not_connected(what)
}

/// "One dedicated Unix-domain stream socket per worker, located in a private temporary
/// directory created by the host": the directory and the socket are this user's, with
/// no access for group or others; the path fits a socket address.
fn check_private(socket: &Path) -> StepResult {
    let me = nix::unistd::getuid().as_raw();
    let len = socket.as_os_str().len();
    if !socket.is_absolute() || len > SOCKET_PATH_MAX_BYTES {
        return Err(fail::mismatch(format!(
            "the worker socket {} is not an absolute path of at most {SOCKET_PATH_MAX_BYTES} bytes ({len})",
            socket.display()
        )));
    }
    let dir = socket.parent().unwrap_or(Path::new("/"));
    for (what, path, socket_kind) in [("directory", dir, false), ("socket", socket, true)] {
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| fail::mismatch(format!("the worker {what} {}: {e}", path.display())))?;
        let mode = meta.permissions().mode() & 0o777;
        let kind_ok = if socket_kind {
            meta.file_type().is_socket()
        } else {
            meta.is_dir()
        };
        if !kind_ok || meta.uid() != me || mode & 0o077 != 0 {
            return Err(fail::mismatch(format!(
                "the worker {what} {} is not private (mode {mode:03o}, owner {}, {})",
                path.display(),
                meta.uid(),
                if kind_ok { "kind ok" } else { "wrong kind" }
            )));
        }
    }
    Ok(())
}

#[async_trait]
impl Connection for ScriptedWorkerPeer {
    fn is_open(&self) -> bool {
        self.current
            .and_then(|i| self.conns.get(i))
            .is_some_and(|c| c.opened == Some(Ok(())) && !c.ended)
    }

    /// `disconnect`: the current worker process exits, as if it died.
    fn abort(&mut self) -> bool {
        let Some(conn) = self.current.and_then(|i| self.conns.get_mut(i)) else {
            return false;
        };
        conn.ended = true;
        conn.tx.try_send(RelayMsg::Exit(1)).is_ok()
    }

    async fn send(&mut self, message: Outgoing, _timeout: Duration) -> StepResult {
        let (idx, bytes) = match message {
            Outgoing::Text(text) => {
                let parsed = contract_impl::wire::parse_strict_with_nulls(text.as_bytes()).ok();
                // Frames in the family's fixed envelope identity (everything the codec
                // encodes, and `send_bytes: {frame}`) go to the worker their identity
                // names, in that worker's envelope; any other text goes as it is.
                let fixed = parsed.as_ref().is_some_and(|v| {
                    v.get("session_id").and_then(Value::as_str) == Some(SESSION_ID)
                        && v.get("generation").and_then(Value::as_str) == Some(GENERATION)
                });
                match parsed {
                    Some(mut envelope) if fixed => {
                        let message = envelope.get("message").cloned().unwrap_or(Value::Null);
                        let idx = self.route(&message).ok_or_else(|| {
                            not_connected(
                                "no launched worker to send this as (a `launch` step first?)",
                            )
                        })?;
                        let conn = &mut self.conns[idx];
                        if message.get("kind").and_then(Value::as_str) == Some("hello") {
                            conn.helloed = true;
                        }
                        for (field, var) in [
                            ("session_id", "CONTRACT_WORKER_SESSION_ID"),
                            ("generation", "CONTRACT_WORKER_GENERATION"),
                        ] {
                            if let Some(value) = conn.var(var) {
                                envelope[field] = Value::String(value.to_string());
                            }
                        }
                        (idx, framed(envelope.to_string().as_bytes()))
                    }
                    _ => (
                        self.current
                            .ok_or_else(|| not_connected("no worker is connected"))?,
                        framed(text.as_bytes()),
                    ),
                }
            }
            Outgoing::TextBytes(bytes) => (
                self.current
                    .ok_or_else(|| not_connected("no worker is connected"))?,
                framed(&bytes),
            ),
            Outgoing::Binary(bytes) => (
                self.current
                    .ok_or_else(|| not_connected("no worker is connected"))?,
                bytes,
            ),
        };
        self.relay_to(
            idx,
            RelayMsg::Data {
                channel: CHANNEL,
                bytes,
            },
        )
        .await
    }

    async fn send_close(&mut self, _code: u16, _reason: &str, _timeout: Duration) -> StepResult {
        let idx = self
            .current
            .ok_or_else(|| not_connected("no worker is connected"))?;
        self.relay_to(idx, RelayMsg::Eof(CHANNEL)).await
    }

    async fn end(&mut self, _timeout: Duration) {
        self.conns.clear();
        self.current = None;
    }
}

#[async_trait]
impl Peer for ScriptedWorkerPeer {
    type Other = NoOther;

    const ROLE: &'static Role = &HOST_ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<NoOther>>> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.pump_until(deadline, |p| !p.ready.is_empty()).await;
        Ok(self.ready.pop_front())
    }

    fn leak_in_other(&self, other: &NoOther, _secret: &str) -> Option<String> {
        match *other {}
    }

    fn connection(&mut self) -> &mut dyn Connection {
        self
    }

    fn trailing_other(&mut self, other: NoOther) -> StepResult {
        match other {}
    }

    async fn family_step(&mut self, run: &mut Run, step: &Step) -> StepResult {
        match step {
            Step::Native { op, args, expect } => self.native(run, op, args, expect.as_ref()).await,
            Step::Launch { args } => {
                let Value::Object(args) = args else {
                    return Err(fail::unsupported("launch arguments must be a mapping"));
                };
                self.launch(run, args).await
            }
            Step::WorkerStdio { args } => self.stdio(args).await,
            Step::ReceivedBy { args } => self.received_by(run, args),
            Step::WriteWorkspace(seed) => self
                .run_dir
                .seed(seed)
                .map_err(|e| fail::scenario(e.to_string())),
            other => Err(fail::unsupported(format!(
                "`{}` is not a step of the worker family",
                other.keyword()
            ))),
        }
    }

    /// A worker launch that no `launch` step took is something the host did unasked (a
    /// workbench replaced by a hook-only activation, a restart nobody asked for).
    async fn end_check(&mut self) -> StepResult {
        let deadline = tokio::time::Instant::now();
        self.pump_until(deadline, |_| false).await;
        match self.launched.front() {
            None => Ok(()),
            Some(idx) => Err(StepError::new(
                FailureCode::TrailingOutput,
                format!(
                    "the host launched a {} worker that no `launch` step took",
                    self.conns[*idx]
                        .var("CONTRACT_WORKER_ROLE")
                        .unwrap_or("workbench")
                ),
            )),
        }
    }

    /// `crash`: the control channel and every worker connection of the killed host are
    /// gone (its workers die with it: their supervisors stop them). What they still
    /// report is no event; the relay listener stays, for the workers of the next launch.
    fn crashed(&mut self) {
        self.control = None;
        for conn in &mut self.conns {
            conn.ended = true;
        }
        self.retired = self.conns.len();
        self.ready.clear();
        self.current = None;
    }

    async fn relaunch(&mut self, startup_timeout: Duration) -> Result<Box<dyn Process>, String> {
        let (target, control) = launch_controlled(
            &self.spec,
            &self.run_dir.control_socket(),
            WORKER_HOST,
            startup_timeout,
        )
        .await?;
        self.control = Some(control);
        Ok(Box::new(target))
    }

    fn release(&mut self) {
        self.conns.clear();
        self.current = None;
        self.control = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer with no target and no relay listener: inbound events are fed by hand.
    fn peer() -> ScriptedWorkerPeer {
        let (_tx, events) = mpsc::channel(8);
        let run_dir = RunDir::new().unwrap();
        let spec = LaunchSpec {
            command: "unused".into(),
            env: Vec::new(),
            cwd: run_dir.cwd(),
            secret: String::new(),
            capture_stdout: false,
            stdin_pipe: false,
        };
        ScriptedWorkerPeer::new(None, events, tokio::spawn(async {}), spec, run_dir)
    }

    fn launched(peer: &mut ScriptedWorkerPeer) -> usize {
        let (tx, _rx) = mpsc::channel(8);
        let idx = peer.conns.len();
        peer.absorb(Inbound::Launched {
            idx,
            hello: Hello {
                argv: Vec::new(),
                env: vec![
                    ("CONTRACT_WORKER_SESSION_ID".into(), SESSION_ID.into()),
                    ("CONTRACT_WORKER_GENERATION".into(), GENERATION.into()),
                ],
                cwd: String::new(),
                pid: 1,
            },
            tx,
        });
        peer.relay_event(idx, RelayEvent::Msg(RelayMsg::Opened(CHANNEL)));
        peer.current = Some(idx);
        idx
    }

    fn frame(message: Value) -> RelayEvent {
        let envelope = json!({"version": 1, "session_id": SESSION_ID, "generation": GENERATION, "message": message});
        RelayEvent::Msg(RelayMsg::Data {
            channel: CHANNEL,
            bytes: framed(envelope.to_string().as_bytes()),
        })
    }

    #[test]
    fn run_dependent_reply_values_are_masked_and_nothing_else() {
        let reply = |value: Value| json!({"kind": "host_reply", "id": "r", "execution_id": "c", "reply": {"kind": "ok", "value": value}});
        assert_eq!(
            mask_clock(&reply(
                json!({"exit_code": 0, "elapsed_ms": 12, "root": "/tmp/x/ws", "deadline_ms": null})
            )),
            reply(
                json!({"exit_code": 0, "elapsed_ms": "<elapsed_ms>", "root": "<root>", "deadline_ms": null})
            )
        );
        // Not a host reply: recorded as it is.
        let other = json!({"kind": "execute", "id": "c", "code": "1", "root": "/x"});
        assert_eq!(mask_clock(&other), other);
    }

    #[tokio::test]
    async fn after_a_crash_the_killed_hosts_workers_are_no_events_and_new_ones_are() {
        let mut peer = peer();
        let old = launched(&mut peer);
        peer.relay_event(old, frame(json!({"kind": "shutdown"})));
        assert_eq!(peer.ready.len(), 1);
        peer.crashed();
        // Queued frames of the killed host are gone, and what its relays still report
        // (a late frame, the end of the connection) is no event.
        assert!(peer.ready.is_empty() && !peer.is_open());
        peer.relay_event(old, frame(json!({"kind": "shutdown"})));
        peer.relay_event(old, RelayEvent::Gone);
        assert!(peer.ready.is_empty());
        // A worker of the new host is heard, and its end is an event.
        let new = launched(&mut peer);
        assert!(peer.is_open());
        peer.relay_event(new, frame(json!({"kind": "shutdown"})));
        peer.relay_event(new, RelayEvent::Gone);
        assert!(matches!(peer.ready.pop_front(), Some(Event::Text(_))));
        assert!(matches!(peer.ready.pop_front(), Some(Event::Eof)));
    }
}
