//! Side `host` of the plugin family: the host under test is launched per
//! `docs/plugin-host-control.md` and the harness plays **every plugin process it starts**.
//!
//! The harness copies its own binary into the run directory (a private directory) and
//! binds `$plugin_executable` (that copy's canonical path), `$plugin_sha256` (its digest)
//! and `$plugin_args` (`["peer", "relay", "--socket", PATH]`): the configuration the
//! scenario gives the host (`native: {configure: …}`) names them, so each plugin process
//! the host starts is this binary in relay mode ([`crate::transport::relay`]), which
//! connects back with its launch environment. Host actions are asked for on the control
//! channel (`CONTRACT_PLUGIN_HOST_CONTROL_SOCKET`; the host's hello line is its
//! readiness). Steps:
//!
//! | step | what the harness does |
//! |---|---|
//! | `native: {op: args}` | one control request; `expect:` matches its result |
//! | `launch: {…}` | awaits the host's next plugin launch and checks its environment (`plugin.v1`, a socket path in a private directory, a 64-hex secret no earlier launch had); then, unless told otherwise, binds the socket (0600) and writes the handshake line. `listen: false` binds nothing; `stderr`/`stdout` (text or `{$text: …}`) are written first; `handshake: false` or other text replaces the line; `stdin_eof: ignore` keeps the process alive when the host closes its stdin (default: it exits 0); `observe_end: true` makes the process's end a frame when the host killed it (default: not one: how and when a host ends a refused or retired plugin is its own); `list_tools: scripted` makes its `ListTools` calls steps (default: the process answers them itself with the tools its `Initialize` answer gave, as a plugin does, and they are not frames) |
//! | `host: {call, method, auth, request, process}` | the next call the host makes on any plugin process must match (`process`: the launch's number, from 1) |
//! | `host: {stopped: true, process}` | the host ended that process without it exiting on its own (for a launch that said `observe_end: true`) |
//! | `plugin: {call, message \| message_base64 \| status}` | answers that call; an `Initialize` answer without `secretProof` carries the right proof for the launch's secret and the host's challenge, and one without `limits` the lower of the host's limits and the launch contract's own |
//! | `plugin_process: {exit, crash, stdout, stderr, replace_executable, process}` | the plugin process (default: the last launched) writes on stdout/stderr, then exits with `exit` (its server's answers flushed first) or dies at once (`crash: true`, status 1); `replace_executable: content \| path` renames a new file over the configured executable (other bytes / the same bytes) |
//! | `disconnect` | the last launched plugin process exits with status 1 (it dies) |

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use contract_impl::plugin::wire::{
    HANDSHAKE_LINE, PROTOCOL, PROTOCOL_ENV, SECRET_ENV, SECRET_HEX_LEN, SOCKET_ENV, host_proof,
    secret_proof,
};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};
use tokio::sync::mpsc;

use super::codec::{HOST_ROLE, SERVICE, pool};
use crate::drive::{
    Connection, DriveOptions, Event, FailureCode, NoOther, Outgoing, Peer, Role, Run, Started,
    StepError, StepResult, fail,
};
use crate::scenario::model::Step;
use crate::target::{LaunchSpec, RunDir, Target};
use crate::transport::control::{ControlChannel, ControlListener, Flavor};
use crate::transport::grpc_server::{GrpcServer, IncomingCall};
use crate::transport::relay::{Hello, RelayEvent, RelayListener, RelayMsg};

/// The variable naming the control socket.
pub const CONTROL_ENV: &str = contract_impl::plugin::controlled::CONTROL_ENV;

/// The host's control channel: `{"hello":{"adapter":"plugin-host","protocol":1}}`.
pub const PLUGIN_HOST: Flavor = Flavor {
    adapter: "plugin-host",
    nulls: true,
};

/// The copy of the harness's binary the host is configured to run, in the run directory.
pub const EXECUTABLE: &str = "plugin/conformance-plugin";

/// How long after the last step the harness still reads what the host does.
pub const CLOSE_GRACE: Duration = Duration::from_millis(300);

/// The channel of the plugin's socket on its relay.
const CHANNEL: u32 = 1;

/// Bound of one relay write.
const RELAY_SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes buffered between the relay and the gRPC server, each way.
const PIPE_BYTES: usize = 256 * 1024;

/// Relay chunks (each at most the relay's chunk bound) waiting for the pipe toward the
/// server before the relay is no longer read.
const PIPE_BACKLOG_MAX: usize = 16;

/// How long a process that exits (`plugin_process: {exit}`) waits for its server's
/// connection to end gracefully (calls still in flight keep it open).
const GRACEFUL_EXIT_WAIT: Duration = Duration::from_secs(2);

/// How long past its own `timeout_ms` a control request may take.
const CONTROL_GRACE: Duration = Duration::from_secs(5);

/// What the relay and server tasks report.
enum Inbound {
    /// A plugin process the host started connected back.
    Launched {
        hello: Hello,
        tx: mpsc::Sender<RelayMsg>,
        /// The server's end of the pipe that carries the plugin socket's bytes.
        conn: DuplexStream,
        flags: Arc<ProcFlags>,
        /// Becomes true once everything the server wrote reached the relay.
        flushed: tokio::sync::watch::Receiver<bool>,
    },
    /// Something that process's relay reported.
    Relay { idx: usize, event: RelayEvent },
    /// The host made a call on that process's socket.
    Call { idx: usize, call: IncomingCall },
}

/// What a process's relay task acts on by itself, without the driver.
#[derive(Debug)]
struct ProcFlags {
    /// Exit (status 0) when the host closes stdin (`stdin_eof: exit`, the default).
    exit_on_eof: AtomicBool,
    /// The harness asked it to exit.
    exiting: AtomicBool,
}

/// One plugin process the host started.
struct PluginProc {
    tx: mpsc::Sender<RelayMsg>,
    env: HashMap<String, String>,
    secret: String,
    server: Option<GrpcServer>,
    /// The server's end of the socket's pipe, until a `launch` serves it.
    conn: Option<DuplexStream>,
    flags: Arc<ProcFlags>,
    /// True once the server's side of the socket ended and all it wrote was relayed.
    flushed: tokio::sync::watch::Receiver<bool>,
    gone: bool,
    /// Initialize calls: their challenge and the host's limits.
    challenges: HashMap<String, (String, Value)>,
    /// The tools this process announced in Initialize: it answers `ListTools` with them
    /// itself, as a plugin does (in the background, also while a control request
    /// waits), unless the launch said `list_tools: scripted`.
    tools: std::sync::Arc<std::sync::Mutex<Option<Value>>>,
    /// Emit the `{stopped: true}` frame of this process (`observe_end: true`).
    observe_end: bool,
}

/// The plugins the harness plays against a target host, and the control channel.
pub struct ScriptedPluginPeer {
    control: Option<ControlChannel>,
    events: mpsc::Receiver<Inbound>,
    events_tx: mpsc::Sender<Inbound>,
    procs: Vec<PluginProc>,
    /// Launches no `launch` step took yet.
    untaken: VecDeque<usize>,
    /// Which process a call was made on.
    calls: HashMap<String, usize>,
    ready: VecDeque<Event<NoOther>>,
    secrets: HashSet<String>,
    closing: bool,
    executable: PathBuf,
    accept_task: tokio::task::JoinHandle<()>,
    _run_dir: RunDir,
}

impl Drop for ScriptedPluginPeer {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

fn io_err(path: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

/// Copies `exe` to [`EXECUTABLE`] in `run_dir` (a 0700 directory, the file 0700) and
/// returns its canonical path and SHA-256.
fn install_executable(exe: &Path, run_dir: &RunDir) -> Result<(PathBuf, String), String> {
    let path = run_dir.path().join(EXECUTABLE);
    let dir = path.parent().unwrap_or(run_dir.path());
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_err(dir, e))?;
    std::fs::copy(exe, &path).map_err(|e| io_err(&path, e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| io_err(&path, e))?;
    let path = path.canonicalize().map_err(|e| io_err(&path, e))?;
    let digest = contract_impl::plugin::host::verify::sha256_of(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((path, digest))
}

/// `PATH` for the host: the directory of `executable`, then the harness's own `PATH`.
fn search_path(executable: &Path) -> String {
    let dir = executable.parent().unwrap_or(Path::new("/"));
    match std::env::var("PATH") {
        Ok(rest) if !rest.is_empty() => format!("{}:{rest}", dir.display()),
        _ => dir.display().to_string(),
    }
}

/// Launches the host with the control socket, and waits for its hello line. Binds
/// `$plugin_executable`, `$plugin_sha256` and `$plugin_args`.
///
/// # Errors
/// The launch failed (the text names why, with the target's stderr tail).
pub async fn start(opts: &DriveOptions) -> Result<Started<ScriptedPluginPeer>, String> {
    let run_dir = RunDir::new().map_err(|e| e.to_string())?;
    let control = ControlListener::bind(&run_dir.control_socket()).map_err(|e| e.to_string())?;
    let relay_path = run_dir.path().join("relay.sock");
    let relays = RelayListener::bind(&relay_path).map_err(|e| e.to_string())?;
    let exe = match &opts.peer_exe {
        Some(exe) => exe.clone(),
        None => std::env::current_exe().map_err(|e| e.to_string())?,
    };
    let (executable, digest) = install_executable(&exe, &run_dir)?;
    let prebound = vec![
        (
            "plugin_executable".to_string(),
            json!(executable.display().to_string()),
        ),
        ("plugin_sha256".to_string(), json!(digest)),
        (
            "plugin_args".to_string(),
            json!([
                "peer",
                "relay",
                "--socket",
                relay_path.display().to_string()
            ]),
        ),
    ];
    let spec = LaunchSpec {
        command: opts.target_cmd.clone(),
        env: vec![
            (
                CONTROL_ENV.to_string(),
                run_dir.control_socket().display().to_string(),
            ),
            // The installed plugin's directory leads PATH: a host that looked a bare
            // executable name up in PATH would find and run it (the scenarios check it
            // never does).
            ("PATH".to_string(), search_path(&executable)),
        ],
        cwd: run_dir.cwd(),
        secret: String::new(),
        capture_stdout: false,
        stdin_pipe: false,
    };
    let mut target = Target::spawn(&spec).map_err(|e| e.to_string())?;
    let channel = match target
        .await_ready(control.accept(PLUGIN_HOST), opts.startup_timeout)
        .await
    {
        Ok(channel) => channel,
        Err(e) => {
            target.shutdown().await;
            return Err(e.to_string());
        }
    };
    let (events_tx, events) = mpsc::channel(256);
    let accept_task = tokio::spawn(accept_relays(relays, events_tx.clone()));
    Ok(Started {
        ready: true,
        peer: ScriptedPluginPeer {
            control: Some(channel),
            events,
            events_tx,
            procs: Vec::new(),
            untaken: VecDeque::new(),
            calls: HashMap::new(),
            ready: VecDeque::new(),
            secrets: HashSet::new(),
            closing: false,
            executable,
            accept_task,
            _run_dir: run_dir,
        },
        process: Box::new(target),
        secret: String::new(),
        normalize: super::normalize,
        prebound,
    })
}

/// Accepts every relay peer (each plugin process the host starts) and runs one task per
/// relay. The task carries the plugin socket's bytes between the relay and a pipe whose
/// other end the process's gRPC server reads, and exits the process when its stdin ends
/// (unless told otherwise): neither waits for the driver, so a host's calls flow while a
/// control request is pending.
async fn accept_relays(listener: RelayListener, events: mpsc::Sender<Inbound>) {
    let mut idx = 0;
    loop {
        let Ok((mut relay, hello)) = listener.accept(Duration::from_secs(3600)).await else {
            continue;
        };
        let (tx, mut rx) = mpsc::channel::<RelayMsg>(64);
        let (ours, conn) = tokio::io::duplex(PIPE_BYTES);
        let flags = Arc::new(ProcFlags {
            exit_on_eof: AtomicBool::new(true),
            exiting: AtomicBool::new(false),
        });
        let (flushed_tx, flushed) = tokio::sync::watch::channel(false);
        let launched = Inbound::Launched {
            hello,
            tx: tx.clone(),
            conn,
            flags: flags.clone(),
            flushed,
        };
        if events.send(launched).await.is_err() {
            return;
        }
        let (mut pipe_read, mut pipe_write) = tokio::io::split(ours);
        let (to_pipe, mut from_relay) = mpsc::channel::<Option<Vec<u8>>>(64);
        tokio::spawn(async move {
            while let Some(Some(bytes)) = from_relay.recv().await {
                if pipe_write.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            let _ = pipe_write.shutdown().await;
        });
        let to_relay = tx.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match pipe_read.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = to_relay.send(RelayMsg::Eof(CHANNEL)).await;
                        let _ = flushed_tx.send(true);
                        return;
                    }
                    Ok(n) => {
                        let msg = RelayMsg::Data {
                            channel: CHANNEL,
                            bytes: buf[..n].to_vec(),
                        };
                        if to_relay.send(msg).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let events = events.clone();
        let me = idx;
        idx += 1;
        tokio::spawn(async move {
            // Bytes for the pipe wait here rather than in a blocking send, so the other
            // direction (the server's answers toward the relay) always moves on; past
            // PIPE_BACKLOG_MAX chunks the relay is no longer read (backpressure).
            let mut backlog: VecDeque<Option<Vec<u8>>> = VecDeque::new();
            loop {
                tokio::select! {
                    permit = to_pipe.reserve(), if !backlog.is_empty() => {
                        match permit {
                            Ok(permit) => {
                                if let Some(item) = backlog.pop_front() {
                                    permit.send(item);
                                }
                            }
                            // The pipe's writer is gone: nothing reads these any more.
                            Err(_) => backlog.clear(),
                        }
                    }
                    event = relay.recv(), if backlog.len() < PIPE_BACKLOG_MAX => {
                        match event {
                            RelayEvent::Msg(RelayMsg::Data { bytes, .. }) => {
                                backlog.push_back(Some(bytes));
                                continue;
                            }
                            RelayEvent::Msg(RelayMsg::Eof(_)) => {
                                backlog.push_back(None);
                                continue;
                            }
                            RelayEvent::Msg(RelayMsg::StdinEof)
                                if flags.exit_on_eof.load(Ordering::SeqCst)
                                    && !flags.exiting.swap(true, Ordering::SeqCst) =>
                            {
                                let _ = relay.send(RelayMsg::Exit(0), RELAY_SEND_TIMEOUT).await;
                            }
                            _ => {}
                        }
                        let gone = matches!(event, RelayEvent::Gone | RelayEvent::Error(_));
                        if events.send(Inbound::Relay { idx: me, event }).await.is_err() || gone {
                            return;
                        }
                    }
                    msg = rx.recv() => {
                        let Some(msg) = msg else { return };
                        if relay.send(msg, RELAY_SEND_TIMEOUT).await.is_err() {
                            let _ = events.send(Inbound::Relay { idx: me, event: RelayEvent::Gone }).await;
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// A call as the emitted frame the scenario matches.
fn call_frame(call: &IncomingCall, process: usize) -> Value {
    let mut frame = json!({
        "call": call.call,
        "method": call.method,
        "auth": call.auth.as_str(),
        "process": process + 1,
    });
    match &call.request {
        Ok(request) => frame["request"] = request.clone(),
        Err(e) => frame["undecodable"] = json!(e),
    }
    frame
}

impl ScriptedPluginPeer {
    fn text(&mut self, frame: Value) {
        self.ready.push_back(Event::Text(frame.to_string()));
    }

    async fn absorb(&mut self, inbound: Inbound) {
        match inbound {
            Inbound::Launched {
                hello,
                tx,
                conn,
                flags,
                flushed,
            } => {
                let env: HashMap<String, String> = hello.env.into_iter().collect();
                let secret = env.get(SECRET_ENV).cloned().unwrap_or_default();
                self.procs.push(PluginProc {
                    tx,
                    env,
                    secret,
                    server: None,
                    conn: Some(conn),
                    flags,
                    flushed,
                    gone: false,
                    challenges: HashMap::new(),
                    tools: std::sync::Arc::default(),
                    observe_end: false,
                });
                self.untaken.push_back(self.procs.len() - 1);
            }
            Inbound::Call { idx, call } => {
                if call.method == "Initialize"
                    && let Ok(request) = &call.request
                    && let Some(challenge) = request.get("challenge").and_then(Value::as_str)
                    && let Some(p) = self.procs.get_mut(idx)
                {
                    let limits = request.get("hostLimits").cloned().unwrap_or(Value::Null);
                    p.challenges
                        .insert(call.call.clone(), (challenge.to_string(), limits));
                }
                self.calls.insert(call.call.clone(), idx);
                self.text(call_frame(&call, idx));
            }
            Inbound::Relay { idx, event } => self.relay_event(idx, event).await,
        }
    }

    async fn relay_event(&mut self, idx: usize, event: RelayEvent) {
        let Some(p) = self.procs.get_mut(idx) else {
            return;
        };
        match event {
            RelayEvent::Msg(RelayMsg::OpenFailed { reason, .. }) => {
                let text = format!(
                    "the plugin process could not serve its socket {}: {reason}",
                    p.env.get(SOCKET_ENV).map_or("", String::as_str)
                );
                self.ready.push_back(Event::Error {
                    code: "listen_failed",
                    detail: text,
                });
            }
            RelayEvent::Gone | RelayEvent::Error(_) => {
                if p.gone {
                    return;
                }
                p.gone = true;
                if let Some(server) = &mut p.server {
                    server.close();
                }
                if p.observe_end && !p.flags.exiting.load(Ordering::SeqCst) {
                    self.text(json!({"stopped": true, "process": idx + 1}));
                }
            }
            RelayEvent::Msg(_) => {}
        }
    }

    /// Waits (until `deadline`) for `done` to hold.
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
                Ok(Some(inbound)) => self.absorb(inbound).await,
                Ok(None) | Err(_) => return done(self),
            }
        }
    }

    async fn relay_to(&self, idx: usize, msg: RelayMsg) -> StepResult {
        let p = self
            .procs
            .get(idx)
            .ok_or_else(|| fail::not_connected("no such plugin process"))?;
        p.tx.send(msg).await.map_err(|_| {
            StepError::new(
                FailureCode::TransportFailed,
                "the plugin process's relay is gone",
            )
        })
    }

    /// The process a step names (`process: N`), else the last one a `launch` took.
    fn process_of(&self, args: &Map<String, Value>) -> StepResult<usize> {
        match args.get("process") {
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| (1..=self.procs.len()).contains(n))
                .map(|n| n - 1)
                .ok_or_else(|| fail::scenario(format!("no plugin process {v} was launched"))),
            None => self.last_taken(),
        }
    }

    fn last_taken(&self) -> StepResult<usize> {
        (0..self.procs.len())
            .rev()
            .find(|i| !self.untaken.contains(i))
            .ok_or_else(|| fail::not_connected("no plugin process was launched"))
    }

    async fn launch(&mut self, run: &mut Run, args: &Map<String, Value>) -> StepResult {
        let deadline = tokio::time::Instant::now() + run.step_timeout;
        if !self.pump_until(deadline, |p| !p.untaken.is_empty()).await {
            return Err(fail::mismatch(format!(
                "the host launched no plugin within {}",
                crate::drive::show_duration(run.step_timeout)
            )));
        }
        let idx = self.untaken.pop_front().unwrap_or_default();
        let p = &self.procs[idx];
        let var = |name: &str| {
            p.env
                .get(name)
                .cloned()
                .ok_or_else(|| fail::mismatch(format!("the host launched a plugin without {name}")))
        };
        let protocol = var(PROTOCOL_ENV)?;
        if protocol != PROTOCOL {
            return Err(fail::mismatch(format!(
                "{PROTOCOL_ENV}={protocol:?}, expected {PROTOCOL}"
            )));
        }
        let socket = PathBuf::from(var(SOCKET_ENV)?);
        check_socket_dir(&socket)?;
        let secret = var(SECRET_ENV)?;
        let hex = secret.len() == SECRET_HEX_LEN
            && secret
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !hex {
            return Err(fail::mismatch(format!(
                "{SECRET_ENV} is not {SECRET_HEX_LEN} lowercase hexadecimal characters"
            )));
        }
        if !self.secrets.insert(secret.clone()) {
            return Err(fail::mismatch(
                "the launch secret of an earlier plugin process was given again (it is single-use)"
                    .to_string(),
            ));
        }
        let Value::Object(args) =
            crate::matcher::expand_text(&Value::Object(args.clone())).map_err(fail::scenario)?
        else {
            return Err(fail::scenario("launch arguments must be a mapping"));
        };
        let flag = |key: &str| args.get(key).and_then(Value::as_bool);
        let scripted_list = match args.get("list_tools").map(|v| v.as_str()) {
            None | Some(Some("plugin")) => false,
            Some(Some("scripted")) => true,
            _ => return Err(fail::scenario("`list_tools` is `plugin` or `scripted`")),
        };
        match args.get("observe_end") {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => self.procs[idx].observe_end = true,
            _ => return Err(fail::scenario("`observe_end` is true or false")),
        }
        if let Some(v) = args.get("stdin_eof") {
            match v.as_str() {
                Some("exit") => {}
                Some("ignore") => self.procs[idx]
                    .flags
                    .exit_on_eof
                    .store(false, Ordering::SeqCst),
                _ => return Err(fail::scenario("`stdin_eof` is `exit` or `ignore`")),
            }
        }
        if flag("listen") != Some(false) {
            let (conn_tx, conn_rx) = mpsc::channel(1);
            if let Some(conn) = self.procs[idx].conn.take() {
                let _ = conn_tx.try_send(conn);
            }
            let token = host_proof(&secret);
            let mut server = GrpcServer::over(
                &socket.display().to_string(),
                &format!("p{}-call-", idx + 1),
                pool(),
                SERVICE,
                &token,
                conn_rx,
            );
            let (_, closed) = mpsc::channel(1);
            let mut calls = std::mem::replace(&mut server.rx, closed);
            let events = self.events_tx.clone();
            let answerer = server.answerer();
            let tools = self.procs[idx].tools.clone();
            tokio::spawn(async move {
                while let Some(call) = calls.recv().await {
                    let listed = if call.method == "ListTools" && !scripted_list {
                        tools.lock().ok().and_then(|t| t.clone())
                    } else {
                        None
                    };
                    if let Some(tools) = listed {
                        // The immutable definitions, as a plugin answers them: not a step.
                        let answer = json!({"call": call.call, "message": {"tools": tools}});
                        let done = json!({"call": call.call, "status": {"code": "OK"}});
                        let _ = crate::rpc::answer::answer(&answerer, &answer, |_, _| {}).await;
                        let _ = crate::rpc::answer::answer(&answerer, &done, |_, _| {}).await;
                        continue;
                    }
                    if events.send(Inbound::Call { idx, call }).await.is_err() {
                        return;
                    }
                }
            });
            let p = &mut self.procs[idx];
            p.server = Some(server);
            self.relay_to(
                idx,
                RelayMsg::Listen {
                    channel: CHANNEL,
                    path: socket.display().to_string(),
                },
            )
            .await?;
        }
        self.stdio(idx, &args).await?;
        let line = match args.get("handshake") {
            None | Some(Value::Bool(true)) => Some(format!("{HANDSHAKE_LINE}\n")),
            Some(Value::Bool(false)) => None,
            Some(Value::String(text)) => Some(text.clone()),
            Some(other) => {
                return Err(fail::scenario(format!(
                    "`handshake` is true, false or the text to write, not {other}"
                )));
            }
        };
        if let Some(line) = line {
            self.relay_to(idx, RelayMsg::Stdout(line.into_bytes()))
                .await?;
        }
        Ok(())
    }

    /// Writes `stderr` then `stdout` of `args` on the process's own streams.
    async fn stdio(&mut self, idx: usize, args: &Map<String, Value>) -> StepResult {
        for (key, out) in [("stderr", false), ("stdout", true)] {
            match args.get(key) {
                None => {}
                Some(Value::String(text)) => {
                    let bytes = text.as_bytes().to_vec();
                    let msg = if out {
                        RelayMsg::Stdout(bytes)
                    } else {
                        RelayMsg::Stderr(bytes)
                    };
                    self.relay_to(idx, msg).await?;
                }
                Some(other) => {
                    return Err(fail::scenario(format!("`{key}` must be text, not {other}")));
                }
            }
        }
        Ok(())
    }

    async fn plugin_process(&mut self, args: &Value) -> StepResult {
        let args = crate::matcher::expand_text(args).map_err(fail::scenario)?;
        let Value::Object(args) = args else {
            return Err(fail::scenario("plugin_process arguments must be a mapping"));
        };
        if let Some(how) = args.get("replace_executable") {
            self.replace_executable(how)?;
        }
        let acts = ["stdout", "stderr", "exit", "crash"];
        if acts.iter().any(|k| args.contains_key(*k)) {
            let idx = self.process_of(&args)?;
            let ends = args.contains_key("exit") || args.contains_key("crash");
            if ends && self.procs[idx].gone {
                // It already ended (its host stopped it, or closed its stdin): there is
                // nothing left to end.
                return Ok(());
            }
            self.stdio(idx, &args).await?;
            if args.get("crash") == Some(&Value::Bool(true)) {
                // Dies at once: what its server had not written yet is lost, and no call
                // the host makes from now on reaches it.
                let p = &mut self.procs[idx];
                p.flags.exiting.store(true, Ordering::SeqCst);
                if let Some(server) = &mut p.server {
                    server.close();
                }
                // A relay already gone is a process already ended.
                let _ = self.relay_to(idx, RelayMsg::Exit(1)).await;
                return Ok(());
            }
            if let Some(code) = args.get("exit") {
                let code = code
                    .as_i64()
                    .and_then(|c| i32::try_from(c).ok())
                    .filter(|c| (0..=255).contains(c))
                    .ok_or_else(|| fail::scenario("`exit` is a status of 0..=255"))?;
                let p = &self.procs[idx];
                p.flags.exiting.store(true, Ordering::SeqCst);
                // A process that exits ends its server first: every answer it wrote
                // reaches the host before the process is gone.
                if let Some(server) = &p.server {
                    server.close_gracefully();
                    let mut flushed = p.flushed.clone();
                    let _ =
                        tokio::time::timeout(GRACEFUL_EXIT_WAIT, flushed.wait_for(|f| *f)).await;
                }
                // A relay already gone is a process already ended.
                let _ = self.relay_to(idx, RelayMsg::Exit(code)).await;
            }
        }
        Ok(())
    }

    /// A new file is renamed over the configured path: `content`, with other bytes (the
    /// pinned digest no longer matches); `path`, with the same bytes. (A running
    /// executable cannot be written in place: the OS refuses with ETXTBSY.)
    fn replace_executable(&self, how: &Value) -> StepResult {
        let path = &self.executable;
        let failed = |e: std::io::Error| fail::scenario(io_err(path, e));
        match how.as_str() {
            Some(how @ ("content" | "path")) => {
                let other = path.with_extension("replacement");
                std::fs::copy(path, &other).map_err(failed)?;
                if how == "content" {
                    let mut file = std::fs::OpenOptions::new()
                        .append(true)
                        .open(&other)
                        .map_err(failed)?;
                    std::io::Write::write_all(&mut file, b"\0changed").map_err(failed)?;
                }
                std::fs::rename(&other, path).map_err(failed)
            }
            _ => Err(fail::scenario(
                "`replace_executable` is `content` or `path`",
            )),
        }
    }

    /// The answer `frame` on its call, with the launch's proof in an `Initialize` answer
    /// that does not give one.
    async fn answer(&mut self, frame: &Value) -> StepResult {
        let call = frame
            .get("call")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let idx = *self
            .calls
            .get(call)
            .ok_or_else(|| fail::not_connected(format!("the host made no call `{call}`")))?;
        if let Some(tools) = frame.get("message").and_then(|m| m.get("tools"))
            && self.procs[idx].challenges.contains_key(call)
            && let Ok(mut slot) = self.procs[idx].tools.lock()
        {
            *slot = Some(tools.clone());
        }
        let p = &self.procs[idx];
        let server = p
            .server
            .as_ref()
            .ok_or_else(|| fail::not_connected("that plugin process serves no socket"))?;
        let init = p.challenges.get(call).map(|(challenge, host_limits)| {
            (secret_proof(&p.secret, challenge), negotiated(host_limits))
        });
        crate::rpc::answer::answer(&server.answerer(), frame, |method, message| {
            if method.name() == "Initialize"
                && let (Some((proof, limits)), Value::Object(map)) = (init, message)
            {
                map.entry("secretProof").or_insert(Value::String(proof));
                map.entry("limits").or_insert(limits);
            }
        })
        .await
    }
}

/// The limits a plugin of the conformance tool set answers to `host_limits` (the proto3
/// JSON of `PluginLimits`): each the lower of the host's and the launch contract's own,
/// a host limit of 0 (or none) meaning "no limit of the host's".
fn negotiated(host_limits: &Value) -> Value {
    use contract_impl::plugin::wire::{
        MAX_CONCURRENT_CALLS, MAX_PAYLOAD_BYTES, MAX_PROGRESS_MESSAGES,
    };
    let host = |key: &str| -> u64 {
        match host_limits.get(key) {
            Some(Value::String(s)) => s.parse().unwrap_or(0),
            Some(v) => v.as_u64().unwrap_or(0),
            None => 0,
        }
    };
    let lower = |key: &str, ours: u64| match host(key) {
        0 => ours,
        theirs => theirs.min(ours),
    };
    json!({
        "maxPayloadBytes": lower("maxPayloadBytes", MAX_PAYLOAD_BYTES).to_string(),
        "maxProgressMessages": lower("maxProgressMessages", u64::from(MAX_PROGRESS_MESSAGES)),
        "maxConcurrentCalls": lower("maxConcurrentCalls", u64::from(MAX_CONCURRENT_CALLS)),
    })
}

/// The socket's directory is this user's with no access for group or others, and the
/// socket does not exist before the plugin binds it.
fn check_socket_dir(socket: &Path) -> StepResult {
    if !socket.is_absolute() {
        return Err(fail::mismatch(format!(
            "{SOCKET_ENV}={} is not an absolute path",
            socket.display()
        )));
    }
    let me = nix::unistd::getuid().as_raw();
    let dir = socket.parent().unwrap_or(Path::new("/"));
    let meta = std::fs::metadata(dir)
        .map_err(|e| fail::mismatch(format!("the socket's directory {}: {e}", dir.display())))?;
    let mode = meta.permissions().mode() & 0o777;
    if !meta.is_dir() || meta.uid() != me || mode & 0o077 != 0 {
        return Err(fail::mismatch(format!(
            "the socket's directory {} is not private (mode {mode:03o}, owner {})",
            dir.display(),
            meta.uid()
        )));
    }
    if let Ok(existing) = std::fs::symlink_metadata(socket) {
        return Err(fail::mismatch(format!(
            "{} exists before the plugin binds it ({})",
            socket.display(),
            if existing.file_type().is_socket() {
                "a socket"
            } else {
                "not a socket"
            }
        )));
    }
    Ok(())
}

#[async_trait]
impl Connection for ScriptedPluginPeer {
    fn is_open(&self) -> bool {
        self.procs.iter().any(|p| !p.gone) || !self.ready.is_empty()
    }

    /// `disconnect`: the last launched plugin process exits with status 1 (it dies).
    fn abort(&mut self) -> bool {
        if self.closing {
            self.procs.iter_mut().for_each(|p| p.gone = true);
            return true;
        }
        let Ok(idx) = self.last_taken() else {
            return false;
        };
        let p = &mut self.procs[idx];
        p.flags.exiting.store(true, Ordering::SeqCst);
        // Dead from now on: no call the host makes after this reaches it.
        if let Some(server) = &mut p.server {
            server.close();
        }
        // A relay already gone is a process already ended.
        p.tx.try_send(RelayMsg::Exit(1)).is_ok() || p.gone || p.tx.is_closed()
    }

    async fn send(&mut self, message: Outgoing, _timeout: Duration) -> StepResult {
        let frame = crate::rpc::answer::answer_frame(message, "a plugin frame")?;
        self.answer(&frame).await
    }

    async fn send_close(&mut self, _code: u16, _reason: &str, _timeout: Duration) -> StepResult {
        self.closing = true;
        Ok(())
    }

    async fn end(&mut self, _timeout: Duration) {
        self.procs.clear();
    }
}

#[async_trait]
impl Peer for ScriptedPluginPeer {
    type Other = NoOther;

    const ROLE: &'static Role = &HOST_ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<NoOther>>> {
        if self.closing {
            // What the host does right after the last step is still read (a call fails
            // the run as trailing output; the end of lifelines may trail); then the end.
            let grace = tokio::time::Instant::now() + timeout.min(CLOSE_GRACE);
            self.pump_until(grace, |p| !p.ready.is_empty()).await;
            return Ok(Some(self.ready.pop_front().unwrap_or(Event::Eof)));
        }
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
            Step::Native { op, args, expect } => {
                crate::drive::control::native_step(
                    self.control.as_mut(),
                    run,
                    op,
                    args,
                    expect.as_ref(),
                    Duration::ZERO,
                    CONTROL_GRACE,
                )
                .await
            }
            Step::Launch { args } => {
                let Value::Object(args) = args else {
                    return Err(fail::unsupported("launch arguments must be a mapping"));
                };
                self.launch(run, args).await
            }
            Step::PluginProcess { args } => self.plugin_process(args).await,
            other => Err(fail::unsupported(format!(
                "`{}` is not a step of the plugin family's side host",
                other.keyword()
            ))),
        }
    }

    /// A plugin launch that no `launch` step took is something the host did unasked (a
    /// restart nobody asked for).
    async fn end_check(&mut self) -> StepResult {
        let now = tokio::time::Instant::now();
        self.pump_until(now, |_| false).await;
        match self.untaken.front() {
            None => Ok(()),
            Some(idx) => Err(StepError::new(
                FailureCode::TrailingOutput,
                format!(
                    "the host launched plugin process {} that no `launch` step took",
                    idx + 1
                ),
            )),
        }
    }

    fn release(&mut self) {
        self.procs.clear();
        self.control = None;
    }
}
