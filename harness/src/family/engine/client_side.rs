//! Side `client` of the engine family: the client under test is launched per
//! `docs/engine-client-control.md` and the harness plays its **daemon** on a Unix socket
//! (every answer scripted), while a control channel tells the client what to do. Steps:
//!
//! | step | what the harness does |
//! |---|---|
//! | `native: {op: args}` | one request on the client's control channel; `expect:` matches its result |
//! | `client: {call, method, auth, request}` | the next call the client makes must match (bind `call` to a placeholder) |
//! | `daemon: {call, message}` | one response message on that call (proto3 JSON, the method's output type) |
//! | `daemon: {call, message_base64}` | one response message of those payload bytes (unknown fields on purpose) |
//! | `daemon: {call, status: {code, message?, trailers?}}` | ends that call |
//! | `disconnect` | drops every connection of the client (no status: a transport failure) |
//! | `crash` | SIGKILL of the client, then the same launch again (same state directory) |
//!
//! The endpoint token is the run's secret: the client may present it only as
//! `authorization` metadata; calls are recorded with `auth: token|wrong|none`, never the
//! value.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::codec::{CLIENT_ROLE, SERVICE, pool};
use crate::drive::{
    Connection, DriveOptions, Event, NoOther, Outgoing, Peer, Process, Role, Run, Started,
    StepResult, fail,
};
use crate::scenario::model::Step;
use crate::target::{LaunchSpec, RunDir, check_socket_path};
use crate::transport::control::{ControlChannel, Flavor, launch_controlled};
use crate::transport::grpc_server::{GrpcServer, IncomingCall};

/// The daemon's socket in the run directory.
pub const SOCKET: &str = "engine.sock";

/// The token file in the run directory.
pub const TOKEN_FILE: &str = "endpoint-token";

/// The client's state directory in the run directory.
pub const STATE_DIR: &str = "state";

/// The variables of the launch contract.
pub const SOCKET_ENV: &str = "CONTRACT_ENGINE_SOCKET";
/// The token file's variable.
pub const TOKEN_FILE_ENV: &str = "CONTRACT_ENGINE_TOKEN_FILE";
/// The control socket's variable.
pub const CONTROL_ENV: &str = "CONTRACT_ENGINE_CONTROL_SOCKET";
/// The state directory's variable.
pub const STATE_DIR_ENV: &str = "CONTRACT_ENGINE_STATE_DIR";

/// The client's control channel: `{"hello":{"adapter":"engine-client","protocol":1}}`;
/// outcomes carry `null` (`terminal: null`).
pub const ENGINE_CLIENT: Flavor = Flavor {
    adapter: "engine-client",
    nulls: true,
};

/// How long after the last step the harness still reads calls the client makes (then
/// the run ends): a call under way when the last control outcome was read arrives well
/// within it on a loaded machine.
pub const CLOSE_GRACE: Duration = Duration::from_millis(300);

/// How long past its own `timeout_ms` a control request may take.
const CONTROL_GRACE: Duration = Duration::from_secs(5);

/// The daemon the harness plays against a target client.
pub struct ScriptedDaemonPeer {
    link: DaemonLink,
    /// Calls taken off the server's queue to name them in a failure, still to be read.
    early: std::collections::VecDeque<IncomingCall>,
    control: Option<ControlChannel>,
    spec: LaunchSpec,
    run_dir: RunDir,
}

/// The listening daemon and the end of the run.
pub struct DaemonLink {
    server: GrpcServer,
    /// The run's end was signalled: once nothing is queued, the link reads as ended.
    closing: bool,
}

/// A call as the emitted frame the scenario matches.
fn call_frame(call: IncomingCall) -> Value {
    let mut frame = json!({"call": call.call, "method": call.method, "auth": call.auth.as_str()});
    match call.request {
        Ok(request) => frame["request"] = request,
        Err(e) => frame["undecodable"] = json!(e),
    }
    frame
}

impl DaemonLink {
    async fn answer(&mut self, frame: &Value) -> StepResult {
        crate::rpc::answer::answer(&self.server.answerer(), frame, |_, _| {}).await
    }
}

#[async_trait]
impl Connection for DaemonLink {
    fn is_open(&self) -> bool {
        self.server.connected()
    }

    fn abort(&mut self) -> bool {
        self.server.disconnect()
    }

    async fn send(&mut self, message: Outgoing, _timeout: Duration) -> StepResult {
        let frame = crate::rpc::answer::answer_frame(message, "a daemon frame")?;
        self.answer(&frame).await
    }

    async fn send_close(&mut self, _code: u16, _reason: &str, _timeout: Duration) -> StepResult {
        self.closing = true;
        Ok(())
    }

    async fn end(&mut self, _timeout: Duration) {
        self.server.close();
    }
}

fn private_file(path: &std::path::Path, contents: &str) -> Result<(), String> {
    contract_impl::private_fs::create_private(path, contents.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Listens as the daemon in a private run directory, writes the token file, launches the
/// client with the launch contract's environment and waits for its hello.
///
/// # Errors
/// The launch failed (the text names why, with the client's stderr tail).
pub async fn start(opts: &DriveOptions) -> Result<Started<ScriptedDaemonPeer>, String> {
    let run_dir = RunDir::new().map_err(|e| e.to_string())?;
    let socket: PathBuf = run_dir.path().join(SOCKET);
    check_socket_path(&socket).map_err(|e| e.to_string())?;
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let token_file = run_dir.path().join(TOKEN_FILE);
    private_file(&token_file, &token)?;
    let state = run_dir.path().join(STATE_DIR);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&state)
        .map_err(|e| format!("{}: {e}", state.display()))?;
    let server = GrpcServer::bind(&socket, pool(), SERVICE, &token)?;
    let path = |p: &std::path::Path| p.display().to_string();
    let spec = LaunchSpec {
        command: opts.target_cmd.clone(),
        env: vec![
            (SOCKET_ENV.to_string(), path(&socket)),
            (TOKEN_FILE_ENV.to_string(), path(&token_file)),
            (CONTROL_ENV.to_string(), path(&run_dir.control_socket())),
            (STATE_DIR_ENV.to_string(), path(&state)),
        ],
        cwd: run_dir.cwd(),
        secret: token.clone(),
        capture_stdout: false,
        stdin_pipe: false,
    };
    let (target, control) = launch_controlled(
        &spec,
        &run_dir.control_socket(),
        ENGINE_CLIENT,
        opts.startup_timeout,
    )
    .await?;
    Ok(Started {
        ready: true,
        peer: ScriptedDaemonPeer {
            link: DaemonLink {
                server,
                closing: false,
            },
            early: std::collections::VecDeque::new(),
            control: Some(control),
            spec,
            run_dir,
        },
        process: Box::new(target),
        secret: token,
        normalize: super::normalize,
        prebound: Vec::new(),
    })
}

#[async_trait]
impl Peer for ScriptedDaemonPeer {
    type Other = NoOther;

    const ROLE: &'static Role = &CLIENT_ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<NoOther>>> {
        if let Some(call) = self.early.pop_front() {
            return Ok(Some(Event::Text(call_frame(call).to_string())));
        }
        if self.link.closing {
            // A call the client makes right after the last step is still read (and fails
            // the run as trailing output): the control channel is closed first, and the
            // client gets CLOSE_GRACE to make any call it had under way.
            self.control = None;
            let grace = timeout.min(CLOSE_GRACE);
            return Ok(Some(
                match tokio::time::timeout(grace, self.link.server.rx.recv()).await {
                    Ok(Some(call)) => Event::Text(call_frame(call).to_string()),
                    Ok(None) | Err(_) => {
                        self.link.server.close();
                        self.link.closing = false;
                        Event::Eof
                    }
                },
            ));
        }
        match tokio::time::timeout(timeout, self.link.server.rx.recv()).await {
            Ok(Some(call)) => Ok(Some(Event::Text(call_frame(call).to_string()))),
            Err(_) | Ok(None) => Ok(None),
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

    async fn family_step(&mut self, run: &mut Run, step: &Step) -> StepResult {
        match step {
            Step::Native { op, args, expect } => {
                // The client's own `await` bound is `timeout_ms` (600 s without it).
                let done = crate::drive::control::native_step(
                    self.control.as_mut(),
                    run,
                    op,
                    args,
                    expect.as_ref(),
                    Duration::ZERO,
                    CONTROL_GRACE,
                )
                .await;
                // An outcome that never came is often a call no step expected (the
                // client waits for its answer): name the calls it made meanwhile.
                done.map_err(|mut e| {
                    while let Ok(call) = self.link.server.rx.try_recv() {
                        self.early.push_back(call);
                    }
                    if !self.early.is_empty() {
                        let calls: Vec<String> = self
                            .early
                            .iter()
                            .map(|c| format!("{} ({}, {})", c.method, c.call, c.auth.as_str()))
                            .collect();
                        e.message.push_str(&format!(
                            "; meanwhile the client made calls no step has expected yet: {}",
                            calls.join(", ")
                        ));
                    }
                    e
                })
            }
            other => Err(fail::unsupported(format!(
                "`{}` is not a step of the engine family's side client",
                other.keyword()
            ))),
        }
    }

    fn crashed(&mut self) {
        self.control = None;
        self.link.server.disconnect();
    }

    async fn relaunch(&mut self, startup_timeout: Duration) -> Result<Box<dyn Process>, String> {
        let (target, control) = launch_controlled(
            &self.spec,
            &self.run_dir.control_socket(),
            ENGINE_CLIENT,
            startup_timeout,
        )
        .await?;
        self.control = Some(control);
        Ok(Box::new(target))
    }

    fn release(&mut self) {
        self.control = None;
        self.link.server.close();
    }
}
