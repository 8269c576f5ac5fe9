//! Launching one candidate process ("Identity and launch"): the verified file executed
//! through its descriptor under the supervisor (`contract-impl worker supervise`, whose
//! subreaper and watch connection leave no process of the plugin alive once the host is
//! gone or stops it, `setsid` descendants included), a private 0700 directory for the
//! socket, a fresh single-use secret, stdin as the plugin's lifeline, stderr drained
//! continuously into a bounded tail, stdout read for the handshake line and watched for
//! contamination afterwards, then `Initialize` and the validation of every fact.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, ChildStdin, Command};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::config::PluginConfig;
use super::validate::{CandidateFault, Expectations, check_initialize};
use super::verify::Verified;
use crate::grpc::common::v1::{BuildIdentity, ProtocolVersion};
use crate::plugin::proto::v1::plugin_service_client::PluginServiceClient;
use crate::plugin::proto::v1::{
    InitializeRequest, InitializeResponse, ListToolsRequest, PluginLimits,
};
use crate::plugin::wire::{
    AUTH_METADATA, HANDSHAKE_LINE, MAX_CONCURRENT_CALLS, MAX_MESSAGE_BYTES, MAX_PAYLOAD_BYTES,
    MAX_PROGRESS_MESSAGES, PROTOCOL, PROTOCOL_ENV, PROTOCOL_MAJOR, PROTOCOL_MINOR, SECRET_ENV,
    SOCKET_ENV, host_proof, random_hex, secret_proof,
};
use crate::process::supervise::{SWEEP_BOUND, WATCH_ENV};
use crate::process::tail::OutputTail;

/// Bytes of a plugin's stderr kept ("bounds stderr"); older output is dropped.
pub const STDERR_TAIL_BYTES: usize = 64 * 1024;

/// Lines of a plugin's stderr kept.
pub const STDERR_TAIL_LINES: usize = 200;

/// Longest stderr line kept whole; a longer one is cut (and marked).
pub const STDERR_LINE_BYTES: usize = 4096;

/// Longest first stdout line read while waiting for the handshake line.
const HANDSHAKE_LINE_MAX: usize = 256;

/// The client of one generation's plugin, with the host's proof on every call.
pub type PluginClient = PluginServiceClient<InterceptedService<Channel, HostProof>>;

/// Adds the host's proof to every call.
#[derive(Clone)]
pub struct HostProof(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl std::fmt::Debug for HostProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostProof(<redacted>)")
    }
}

impl tonic::service::Interceptor for HostProof {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request.metadata_mut().insert(AUTH_METADATA, self.0.clone());
        Ok(request)
    }
}

/// Why a launch failed (stable `code()`): a candidate that fails never changes the
/// active generation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct LaunchError {
    /// Stable code (`digest_mismatch`, `startup_timeout`, `stdout_contamination`, …).
    pub code: &'static str,
    /// What happened, with the plugin's stderr tail when it ran.
    pub message: String,
}

impl From<CandidateFault> for LaunchError {
    fn from(f: CandidateFault) -> Self {
        Self {
            code: f.code,
            message: f.message,
        }
    }
}

fn err(code: &'static str, message: impl Into<String>) -> LaunchError {
    LaunchError {
        code,
        message: message.into(),
    }
}

/// Longest a call's outcome waits for stdout bytes already in the pipe to be read
/// ([`Output::settled_contamination`]): a bound against a stalled reader, never a delay
/// (the wait ends as soon as the reader took the bytes).
pub const STDOUT_SETTLE_BOUND: Duration = Duration::from_secs(2);

/// What the host watches of a running plugin's output.
#[derive(Debug, Default)]
pub struct Output {
    /// The bounded stderr tail.
    pub stderr: Mutex<Option<OutputTail>>,
    /// The first bytes written on stdout after the handshake line, if any.
    pub contamination: Mutex<Option<String>>,
    /// A duplicate of the stdout pipe's read end, only to ask whether unread bytes wait
    /// in it (never read through).
    pub stdout_probe: Option<std::os::fd::OwnedFd>,
    /// Signalled after every read of the stdout reader.
    pub stdout_read: tokio::sync::Notify,
}

impl Output {
    /// The stderr tail's text.
    pub fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .ok()
            .and_then(|t| t.as_ref().map(OutputTail::text))
            .unwrap_or_default()
    }
    /// The contamination seen on stdout, if any.
    pub fn contaminated(&self) -> Option<String> {
        self.contamination.lock().ok().and_then(|c| c.clone())
    }

    /// The contamination, once every byte the plugin wrote on stdout before now has been
    /// read: a plugin that writes on stdout and then answers a call has its stdout bytes
    /// in the pipe before its answer reaches the host, so a call's outcome is checked
    /// against them, not against how fast the reader task happened to run. Waits (at most
    /// [`STDOUT_SETTLE_BOUND`]) only while unread bytes are in the pipe.
    pub async fn settled_contamination(&self) -> Option<String> {
        use std::os::fd::AsFd;
        let Some(probe) = &self.stdout_probe else {
            return self.contaminated();
        };
        let deadline = tokio::time::Instant::now() + STDOUT_SETTLE_BOUND;
        while self.contaminated().is_none() {
            let notified = self.stdout_read.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let mut fds = [nix::poll::PollFd::new(
                probe.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            let unread = matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
                && fds[0]
                    .revents()
                    .is_some_and(|r| r.contains(nix::poll::PollFlags::POLLIN));
            if !unread || tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        self.contaminated()
    }
}

/// One running, validated plugin process.
#[derive(Debug)]
pub struct Process {
    /// The supervisor (the plugin runs in its process group, under it).
    pub child: Child,
    /// The plugin's stdin: dropping it tells the plugin its host is gone.
    pub stdin: Option<ChildStdin>,
    /// The watch connection: dropping it makes the supervisor kill every process of the
    /// plugin.
    pub watch: Option<UnixStream>,
    /// The client.
    pub client: PluginClient,
    /// What `Initialize` answered.
    pub initialized: InitializeResponse,
    /// The plugin's output.
    pub output: Arc<Output>,
    /// The private directory (removed when dropped).
    pub dir: tempfile::TempDir,
}

impl Process {
    /// Stops every process of the plugin at once (the supervisor kills its group and
    /// every descendant) and reaps the supervisor. `true` when its exit was confirmed.
    pub async fn hard_stop(&mut self) -> bool {
        self.stdin = None;
        self.watch = None;
        let bound = SWEEP_BOUND + Duration::from_secs(1);
        if tokio::time::timeout(bound, self.child.wait()).await.is_ok() {
            return true;
        }
        let _ = self.child.kill().await;
        tokio::time::timeout(bound, self.child.wait()).await.is_ok()
    }
}

/// The limits the host sends and holds the plugin to.
pub fn host_limits() -> PluginLimits {
    PluginLimits {
        max_payload_bytes: MAX_PAYLOAD_BYTES,
        max_progress_messages: MAX_PROGRESS_MESSAGES,
        max_concurrent_calls: MAX_CONCURRENT_CALLS,
    }
}

fn private_dir() -> Result<tempfile::TempDir, LaunchError> {
    let dir = tempfile::Builder::new()
        .prefix("plugin-")
        .tempdir()
        .map_err(|e| err("setup_failed", e.to_string()))?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
        .map_err(|e| err("setup_failed", e.to_string()))?;
    Ok(dir)
}

/// A gRPC channel to the Unix socket `socket`.
///
/// # Errors
/// The connection failed (the text says why).
pub async fn unix_channel(socket: &Path) -> Result<Channel, String> {
    let path = socket.to_path_buf();
    Endpoint::try_from("http://localhost")
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| e.to_string())
}

/// Reads stdout: the first line must be the handshake line; every later byte is
/// contamination, recorded once.
fn watch_stdout(
    stdout: tokio::process::ChildStdout,
    output: Arc<Output>,
) -> tokio::sync::oneshot::Receiver<Result<(), String>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout);
        let mut first = Vec::new();
        let read = (&mut reader)
            .take(HANDSHAKE_LINE_MAX as u64)
            .read_until(b'\n', &mut first)
            .await;
        let verdict = match read {
            Ok(0) | Err(_) => Err("stdout ended before the handshake line".to_string()),
            Ok(_) if first.strip_suffix(b"\n") == Some(HANDSHAKE_LINE.as_bytes()) => Ok(()),
            Ok(_) => Err(format!(
                "stdout_contamination: the first stdout bytes are {:?}, not the handshake line",
                String::from_utf8_lossy(&first[..first.len().min(80)])
            )),
        };
        let ok = verdict.is_ok();
        let _ = tx.send(verdict);
        if !ok {
            return;
        }
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if let Ok(mut c) = output.contamination.lock()
                && c.is_none()
            {
                *c = Some(String::from_utf8_lossy(&buf[..n.min(80)]).into_owned());
            }
            output.stdout_read.notify_waiters();
        }
        output.stdout_read.notify_waiters();
    });
    rx
}

fn drain_stderr(stderr: tokio::process::ChildStderr, output: Arc<Output>) {
    tokio::spawn(async move {
        let mut stderr = stderr;
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = stderr.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if let Ok(mut t) = output.stderr.lock()
                && let Some(t) = t.as_mut()
            {
                t.push(&buf[..n]);
            }
        }
    });
}

/// Launches a candidate from `verified` and validates it; the caller makes it visible.
///
/// # Errors
/// [`LaunchError`]; the candidate's processes are stopped before it returns.
pub async fn launch(
    config: &PluginConfig,
    verified: &Verified,
    supervisor: &Path,
) -> Result<Process, LaunchError> {
    launch_with(config, verified, supervisor, Checks::ALL).await
}

/// The checks of a candidate the spec leaves to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checks {
    /// Call `ListTools` at activation and refuse a candidate whose answer differs from
    /// the tools of `Initialize` (`tools_changed`).
    pub list_tools: bool,
}

impl Checks {
    /// Every check (ours).
    pub const ALL: Self = Self { list_tools: true };
}

/// [`launch`] with the host's own `checks`.
///
/// # Errors
/// As [`launch`].
pub async fn launch_with(
    config: &PluginConfig,
    verified: &Verified,
    supervisor: &Path,
    checks: Checks,
) -> Result<Process, LaunchError> {
    if let Some(drift) = verified.drift() {
        return Err(err(
            drift.code(),
            format!("{} drifted after verification", verified.path.display()),
        ));
    }
    let dir = private_dir()?;
    let socket = dir.path().join("plugin.sock");
    let watch_path = dir.path().join("watch.sock");
    let watch_listener =
        UnixListener::bind(&watch_path).map_err(|e| err("setup_failed", e.to_string()))?;
    std::fs::set_permissions(&watch_path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| err("setup_failed", e.to_string()))?;
    let secret = random_hex();
    let (fd, exec_path) = verified
        .inheritable()
        .map_err(|e| err("setup_failed", e.to_string()))?;
    let mut command = Command::new(supervisor);
    command
        .args(["worker", "supervise", "--"])
        .arg(&exec_path)
        .args(&config.args)
        .env_clear()
        .envs(&config.env)
        .env(WATCH_ENV, &watch_path)
        .env(PROTOCOL_ENV, PROTOCOL)
        .env(SOCKET_ENV, &socket)
        .env(SECRET_ENV, &secret)
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let spawned = command.spawn();
    drop(fd);
    let mut child =
        spawned.map_err(|e| err("spawn_failed", format!("{}: {e}", supervisor.display())))?;
    let output = Arc::new(Output {
        stderr: Mutex::new(Some(OutputTail::new(
            STDERR_TAIL_LINES,
            STDERR_TAIL_BYTES,
            STDERR_LINE_BYTES,
        ))),
        contamination: Mutex::new(None),
        stdout_probe: child.stdout.as_ref().and_then(|stdout| {
            use std::os::fd::AsFd;
            stdout.as_fd().try_clone_to_owned().ok()
        }),
        stdout_read: tokio::sync::Notify::new(),
    });
    if let Some(stderr) = child.stderr.take() {
        drain_stderr(stderr, output.clone());
    }
    let handshake = match child.stdout.take() {
        Some(stdout) => watch_stdout(stdout, output.clone()),
        None => return Err(err("spawn_failed", "no stdout pipe")),
    };
    let stdin = child.stdin.take();
    let mut watch = None;
    // Once the handshake line came, an exit is the plugin dying during Initialize: the
    // same outcome whichever the host notices first, the exit or the broken call.
    let handshaken = std::sync::atomic::AtomicBool::new(false);
    let started = tokio::time::timeout(config.startup_timeout(), async {
        let (accepted, _) = watch_listener
            .accept()
            .await
            .map_err(|e| err("spawn_failed", e.to_string()))?;
        watch = Some(accepted);
        match handshake.await {
            Ok(Ok(())) => {}
            Ok(Err(why)) if why.starts_with("stdout_contamination") => {
                return Err(err("stdout_contamination", why));
            }
            Ok(Err(why)) => return Err(err("exited_before_handshake", why)),
            Err(_) => {
                return Err(err(
                    "exited_before_handshake",
                    "the plugin exited before its handshake line",
                ));
            }
        }
        handshaken.store(true, std::sync::atomic::Ordering::SeqCst);
        initialize(config, verified, &socket, &secret, &output, checks).await
    });
    let outcome = tokio::select! {
        outcome = started => outcome.unwrap_or_else(|_| Err(err("startup_timeout", format!("no validated candidate within {:?}", config.startup_timeout())))),
        status = child.wait() => {
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            if handshaken.load(std::sync::atomic::Ordering::SeqCst) {
                Err(err("initialize_refused", format!("the plugin's supervisor exited during Initialize ({status})")))
            } else {
                Err(err("exited_before_handshake", format!("the plugin's supervisor exited ({status})")))
            }
        }
    };
    match outcome {
        Ok((client, initialized)) => Ok(Process {
            child,
            stdin,
            watch,
            client,
            initialized,
            output,
            dir,
        }),
        Err(mut e) => {
            drop(stdin);
            drop(watch);
            let bound = SWEEP_BOUND + Duration::from_secs(1);
            if tokio::time::timeout(bound, child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
            // The tail is complete once the processes are gone.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let tail = output.stderr_text();
            if !tail.is_empty() {
                e.message = format!("{}; stderr:\n{tail}", e.message);
            }
            Err(e)
        }
    }
}

async fn initialize(
    config: &PluginConfig,
    verified: &Verified,
    socket: &Path,
    secret: &str,
    output: &Output,
    checks: Checks,
) -> Result<(PluginClient, InitializeResponse), LaunchError> {
    let channel = unix_channel(socket)
        .await
        .map_err(|e| err("connect_failed", e))?;
    let proof = format!("Bearer {}", host_proof(secret))
        .parse()
        .map_err(|_| err("setup_failed", "proof metadata"))?;
    let mut client = PluginServiceClient::with_interceptor(channel, HostProof(proof))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let challenge = random_hex();
    let answer = client
        .initialize(InitializeRequest {
            protocol: Some(ProtocolVersion {
                major: PROTOCOL_MAJOR,
                minor: PROTOCOL_MINOR,
            }),
            host_build: Some(BuildIdentity {
                name: "contract-impl plugin host".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                revision: String::new(),
            }),
            challenge: challenge.clone(),
            approved_capabilities: config.approved_capabilities.clone(),
            host_limits: Some(host_limits()),
        })
        .await
        .map_err(|s| {
            err(
                "initialize_refused",
                format!("{:?}: {}", s.code(), s.message()),
            )
        })?
        .into_inner();
    check_initialize(
        &answer,
        &Expectations {
            name: &config.name,
            proof: &secret_proof(secret, &challenge),
            approved: &config.approved_capabilities,
            host_limits: host_limits(),
        },
    )?;
    // "ListTools returns immutable bounded definitions": the same as Initialize's.
    if checks.list_tools {
        let listed = client
            .list_tools(ListToolsRequest {})
            .await
            .map_err(|s| {
                err(
                    "list_tools_failed",
                    format!("{:?}: {}", s.code(), s.message()),
                )
            })?
            .into_inner();
        if listed.tools != answer.tools {
            return Err(err(
                "tools_changed",
                "ListTools differs from the tools of Initialize",
            ));
        }
    }
    if let Some(c) = output.contaminated() {
        return Err(err(
            "stdout_contamination",
            format!("the plugin wrote {c:?} on stdout after its handshake line"),
        ));
    }
    if let Some(drift) = verified.drift() {
        return Err(err(
            drift.code(),
            format!(
                "{} drifted while the candidate started",
                verified.path.display()
            ),
        ));
    }
    Ok((client, answer))
}

/// The path of the supervisor: this program (`contract-impl`).
///
/// # Errors
/// The running executable cannot be found.
pub fn this_program() -> Result<PathBuf, LaunchError> {
    std::env::current_exe().map_err(|e| err("setup_failed", e.to_string()))
}
