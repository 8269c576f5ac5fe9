//! The worker host ("Transport and bounds", "Message vocabulary"): spawns one worker
//! generation in a private directory, binds it with a startup token, runs its cells and
//! answers its requests, and keeps the hard-stop authority over every process of it.
//!
//! * A private directory (0700) under the system's temporary directory holds the one
//!   protocol socket (0600; its path checked against [`SOCKET_PATH_MAX_BYTES`] with an
//!   error naming it) and the supervisor's watch socket.
//! * The host spawns the [`crate::process::supervise`] process (`contract-impl worker supervise --
//!   PROGRAM…`), which starts the worker program with the launch environment of
//!   `docs/worker-launch-contract.md` and kills every process of the worker when the host
//!   drops the watch connection or dies, SIGKILL included.
//! * The handshake: the first frame must be `hello` with the token, the expected role and
//!   exactly the role's slots, within the handshake bound.
//! * Any bad frame, identity mismatch, end of stream or timed-out exchange invalidates the
//!   generation: the host stops it and never resumes it. Worker death gives a
//!   host-observed `failed` record, never an invented completion.
//! * One foreground operation at a time (`&mut self`); at most
//!   [`super::wire::limits::REQUESTS_PER_CELL_MAX`] requests per cell (the 129th is answered
//!   `request_limit`); replies carry the request's own identity.
//! * The worker's stdout and stderr are drained continuously into separate bounded
//!   [`DIAGNOSTIC_TAIL_BYTES`] tails, never parsed.
//!
//! What a request *does* is the [`RequestHandler`]'s (the host services of the host
//! services issue); this module only routes them.

use std::ffi::OsString;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::process::{Child, Command};
use tokio::sync::Notify;

use super::skills::SkillIndex;
use super::skills::set::{SKILLS_ARG, materialize};
use super::wire::frame::encode_frame;
use super::wire::limits::{DIAGNOSTIC_TAIL_BYTES, SOCKET_PATH_MAX_BYTES};
use super::wire::{
    CellStatus, Envelope, HostRequest, Identifier, Message, OutputRecord, Reply, Role, Slot,
    WorkerWireError, encode_envelope,
};
use crate::process::tail::OutputTail;

mod cell;
mod reader;

/// Default bound of the handshake: spawn to `hello`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default grace between `shutdown` and the hard stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Default bound of one frame written to the worker: a worker that does not read its
/// socket for this long abandons the exchange, and the generation is invalidated
/// ("timed-out/abandoned Rust exchange").
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Default grace between `interrupt` and the hard stop of a cell that does not end
/// ("Rust retains the final hard-stop authority when code blocks or catches
/// cancellation").
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// Why the host refused or lost a worker. Every variant has a stable [`code`](Self::code).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The private directory or a socket could not be made.
    #[error("cannot prepare the worker's directory: {0}")]
    Setup(String),
    /// The socket path is longer than a Unix socket address holds.
    #[error(
        "the socket path {path} is {len} bytes, over the {SOCKET_PATH_MAX_BYTES}-byte limit of a Unix socket address"
    )]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// The worker program could not be started.
    #[error("cannot start the worker: {0}")]
    Spawn(String),
    /// The hook snapshot has no source identity (a refused file, a bound).
    #[error("the hook snapshot is refused: {0}")]
    Snapshot(String),
    /// No hello within the bound (or the worker exited first).
    #[error("the worker did not say hello within {0:?}")]
    HandshakeTimeout(Duration),
    /// The hello does not bind this subprocess (wrong token, role or slots).
    #[error("the worker's hello is refused: {0}")]
    Handshake(String),
    /// A well-formed message the exchange cannot take (a completion of another
    /// operation, a yield the host did not accept); the generation is invalidated.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A frame of the worker was refused; the generation is invalidated.
    #[error("invalid frame from the worker ({code}): {0}", code = .0.code())]
    Wire(WorkerWireError),
    /// The exchange did not end within its bound; the generation is invalidated.
    #[error("the worker did not answer within {0:?}")]
    Timeout(Duration),
    /// The generation was invalidated earlier.
    #[error("the worker generation is no longer valid")]
    Invalidated,
    /// The worker closed the connection (between frames).
    #[error("the worker closed the connection")]
    Eof,
    /// Reading or writing the socket failed.
    #[error("the worker connection failed: {0}")]
    Io(String),
}

impl HostError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            HostError::Setup(_) => "setup_failed",
            HostError::SocketPathTooLong { .. } => "socket_path_too_long",
            HostError::Spawn(_) => "spawn_failed",
            HostError::Snapshot(_) => "snapshot_refused",
            HostError::HandshakeTimeout(_) => "handshake_timeout",
            HostError::Handshake(_) => "handshake_refused",
            HostError::Protocol(_) => "protocol_violation",
            HostError::Wire(e) => e.code(),
            HostError::Timeout(_) => "timeout",
            HostError::Invalidated => "invalidated",
            HostError::Eof => "eof",
            HostError::Io(_) => "io_error",
        }
    }
}

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The worker program and its arguments (no shell, no `PATH` lookup beyond the OS's).
    pub program: Vec<OsString>,
    /// The role the worker must announce.
    pub role: Role,
    /// The hook source snapshot (role `hooks`).
    pub hooks_dir: Option<PathBuf>,
    /// The session of the generation.
    pub session_id: Identifier,
    /// The generation's identifier.
    pub generation: Identifier,
    /// Spawn-to-hello bound.
    pub handshake_timeout: Duration,
    /// Bound of one cell (execute to completed), `None`: none.
    pub cell_timeout: Option<Duration>,
    /// The supervisor binary (`contract-impl`); default the running executable.
    pub supervisor: Option<PathBuf>,
    /// The worker's working directory; default the private directory.
    pub cwd: Option<PathBuf>,
    /// Interrupt-to-hard-stop grace of a cell ([`INTERRUPT_GRACE`]).
    pub interrupt_grace: Duration,
    /// Bound of one frame written to the worker ([`SEND_TIMEOUT`]).
    pub send_timeout: Duration,
    /// The host's free choices: operation IDs and refusal codes.
    pub choices: Choices,
    /// The skills a workbench is given ("Skills"): when the set holds a skill it is
    /// materialized beside the socket, passed as `--skills <path>`, its revision is the one
    /// the hello must echo, and the file is removed once the handshake is done.
    pub skills: Option<Arc<SkillIndex>>,
}

/// What the spec leaves to the host: how it names operations and refuses requests.
/// [`Choices::REFERENCE`] is ours; [`Choices::DIFFERENT`] another conformant set (the
/// vendor-mode trial of the suite).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choices {
    /// Prefix of cell operation IDs (`c` → `c1`, `c2`, …).
    pub cell_prefix: &'static str,
    /// Prefix of hook operation IDs.
    pub hook_prefix: &'static str,
    /// Reply code of a cell's requests past [`super::wire::limits::REQUESTS_PER_CELL_MAX`].
    pub request_limit: &'static str,
    /// Reply code of a request without scope (another execution, a hook).
    pub no_scope: &'static str,
    /// The record of a cell the host stopped after `interrupt`: `interrupted` (`true`)
    /// or failed (`false`); the spec allows either ("a failed/interrupted record").
    pub interrupted_record: bool,
    /// The status of a cell the host recorded itself after losing the generation
    /// (invalidation, the worker's death): `None` (a failed record) or another status the
    /// spec's "failed/interrupted record" allows.
    pub lost_status: Option<CellStatus>,
    /// The first words of that record's error text.
    pub lost_text: &'static str,
}

impl Choices {
    /// Ours.
    pub const REFERENCE: Self = Self {
        cell_prefix: "c",
        hook_prefix: "h",
        request_limit: "request_limit",
        no_scope: "no_scope",
        interrupted_record: true,
        lost_status: None,
        lost_text: "host observed",
    };
    /// Another conformant set.
    pub const DIFFERENT: Self = Self {
        cell_prefix: "cell-",
        hook_prefix: "hook-call-",
        request_limit: "too_many_requests",
        no_scope: "outside_scope",
        interrupted_record: false,
        lost_status: Some(CellStatus::Interrupted),
        lost_text: "generation lost",
    };
}

impl HostConfig {
    /// A workbench running `program`, session `root`, generation `g-1`, default bounds.
    pub fn workbench(program: Vec<OsString>) -> Self {
        Self {
            program,
            role: Role::Workbench,
            hooks_dir: None,
            session_id: Identifier::new("root").expect("a valid identifier"),
            generation: Identifier::new("g-1").expect("a valid identifier"),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            cell_timeout: None,
            supervisor: None,
            cwd: None,
            interrupt_grace: INTERRUPT_GRACE,
            send_timeout: SEND_TIMEOUT,
            choices: Choices::REFERENCE,
            skills: None,
        }
    }

    /// A hook worker running `program` on the snapshot `hooks_dir`.
    pub fn hooks(program: Vec<OsString>, hooks_dir: PathBuf) -> Self {
        Self {
            role: Role::Hooks,
            hooks_dir: Some(hooks_dir),
            ..Self::workbench(program)
        }
    }
}

/// The host variables a worker inherits besides those a run of the source work does
/// ([`crate::worker::workspace::INHERITED_ENV`]), when the host has them (values the
/// host's): the Python interpreter's own settings, the Rust backtrace switch and our
/// worker's profile. Our reference choice ("Processes run with same-user trust", so this
/// is about what a cell can read, not a sandbox); everything else of the host's
/// environment (its control socket, its worker program, a secret) stays the host's.
pub const WORKER_EXTRA_ENV: &[&str] = &[
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "RUST_BACKTRACE",
    "CONTRACT_WORKER_PROFILE",
];

/// A reply still being made, borrowing nothing of the handler or the cell: see
/// [`RequestHandler::start`].
pub type PendingReply = std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>;

/// Answers a worker's host requests.
#[async_trait]
pub trait RequestHandler: Send {
    /// The reply to request `request_id` of execution `execution_id`.
    async fn handle(
        &mut self,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Reply;

    /// A request whose reply takes long to make (a program run): its reply as a future
    /// that the cell runs beside its exchange, so that the worker's next messages (more
    /// requests, the cell's completion) and an interrupt are read meanwhile ("The Python
    /// reader keeps running while a cell awaits an RPC"; "Pending replies are correlated
    /// by identity, not arrival order"). The cell drops it, abandoning the work, when the
    /// execution's scope ends first. `None` (the default): the request is answered by
    /// [`RequestHandler::handle`] before the worker's next message is read.
    fn start(
        &mut self,
        _execution_id: &Identifier,
        _request_id: &Identifier,
        _request: &HostRequest,
    ) -> Option<PendingReply> {
        None
    }
}

/// The services available without the host-services layer: `runtime.inspect` (`now`,
/// `now_ms`); every other method is answered `unsupported_method`.
#[derive(Debug, Default)]
pub struct BasicServices;

#[async_trait]
impl RequestHandler for BasicServices {
    async fn handle(
        &mut self,
        _execution_id: &Identifier,
        _request_id: &Identifier,
        request: &HostRequest,
    ) -> Reply {
        match request {
            HostRequest::RuntimeInspect {} => {
                let now = now_since_epoch();
                Reply::Ok {
                    // "`now` uses the same `Z` shape as these stamps" (whole seconds).
                    value: json!({"now": rfc3339_utc_seconds(now), "now_ms": now.as_millis() as u64}),
                }
            }
            other => Reply::Error {
                code: "unsupported_method".into(),
                message: match super::stores::unsupported_reason(other) {
                    Some(why) => format!("{} is not supported by this host: {why}", other.method()),
                    None => format!("{} is not served by this host", other.method()),
                },
            },
        }
    }
}

/// The host clock: the time since the Unix epoch (zero before it).
pub fn now_since_epoch() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a time since the Unix epoch (the `Z` shape).
pub fn rfc3339_utc(since_epoch: Duration) -> String {
    format!(
        "{}.{:03}Z",
        civil_utc(since_epoch.as_secs()),
        since_epoch.subsec_millis()
    )
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a time since the Unix epoch, in whole seconds (a fraction
/// of a second is dropped): the stamps of "Framing what the model reads"
/// (`[2026-09-13T18:59:00Z · operator]`).
pub fn rfc3339_utc_seconds(since_epoch: Duration) -> String {
    format!("{}Z", civil_utc(since_epoch.as_secs()))
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC) for whole seconds since the Unix epoch.
fn civil_utc(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
    )
}

/// How a cell ended, as the host records it.
#[derive(Debug, Clone, PartialEq)]
pub struct CellRecord {
    /// The operation ID.
    pub id: Identifier,
    /// `ok`, `error`, `yielded`, `interrupted`; `None` when the worker failed the
    /// operation or died (then `error` says how).
    pub status: Option<CellStatus>,
    /// Output records.
    pub output: Vec<OutputRecord>,
    /// Bytes counted and discarded.
    pub truncated_bytes: u64,
    /// Error text.
    pub error: Option<String>,
    /// Whether this record is the host's own observation (the worker died or was
    /// invalidated), not the worker's completion.
    pub observed_by_host: bool,
}

/// One running worker generation.
pub struct Worker {
    config: HostConfig,
    dir: PrivateDir,
    child: Child,
    /// The writing half, shared with the reader, which refuses a request of no live
    /// execution itself ([`reader`]).
    writer: SharedWriter,
    reader: Option<reader::Reader>,
    /// The supervisor's watch connection: dropping it stops every process of the
    /// generation. Shared with the reader, which drops it after a fault.
    watch: WatchHandle,
    stdout: Arc<Mutex<OutputTail>>,
    stderr: Arc<Mutex<OutputTail>>,
    /// The drain tasks' flush requests ([`Tails::flush`]).
    flushers: Vec<Flusher>,
    next_op: u64,
    valid: bool,
    interrupts: Interrupts,
    /// The revision the worker announced: its hook snapshot's source identity, or the
    /// revision of the skills set a workbench was given.
    pub revision: Option<String>,
}

/// Which cell an `interrupt` may target: the running one, and only while it runs
/// ("`interrupt` targets one operation ID").
#[derive(Debug, Clone, Default)]
struct Interrupts {
    state: Arc<Mutex<InterruptState>>,
    notify: Arc<Notify>,
}

#[derive(Debug, Default)]
struct InterruptState {
    running: Option<Identifier>,
    requested: bool,
}

impl Interrupts {
    fn begin(&self, id: &Identifier) {
        if let Ok(mut s) = self.state.lock() {
            s.running = Some(id.clone());
            s.requested = false;
        }
    }

    fn end(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.running = None;
            s.requested = false;
        }
    }

    /// Resolves once an interrupt was asked for the running cell (a stale wake-up of an
    /// earlier cell is ignored).
    async fn requested(&self) {
        loop {
            self.notify.notified().await;
            if self.state.lock().is_ok_and(|s| s.requested) {
                return;
            }
        }
    }
}

/// Interrupts the running cell of a [`Worker`] from another task ([`Worker::interrupter`]).
#[derive(Debug, Clone)]
pub struct Interrupter(Interrupts);

impl Interrupter {
    /// Sends `interrupt` for the cell running now and returns its operation ID; past the
    /// configured grace the host stops the generation hard. With no cell running it does
    /// nothing (`None`): an interrupt never reaches a later cell.
    pub fn interrupt(&self) -> Option<Identifier> {
        let running = {
            let mut s = self.0.state.lock().ok()?;
            let id = s.running.clone()?;
            s.requested = true;
            id
        };
        self.0.notify.notify_one();
        Some(running)
    }

    /// The operation ID of the cell running now, if any (nothing is sent).
    pub fn running(&self) -> Option<Identifier> {
        self.0.state.lock().ok()?.running.clone()
    }
}

/// The host's (write) half of the supervisor's watch connection: while it is held the
/// generation may run; dropping it (shutting the half down) makes the supervisor kill
/// every process of the worker.
pub(super) type WatchHandle = Arc<Mutex<Option<tokio::net::unix::OwnedWriteHalf>>>;

/// The writing half of a generation's connection: every frame the host sends goes
/// through it whole (the lock is held for one frame); `None` once the generation was
/// released.
pub(super) type SharedWriter = Arc<tokio::sync::Mutex<Option<tokio::net::unix::OwnedWriteHalf>>>;

/// Writes one frame through `writer` within `bound`.
///
/// # Errors
/// [`HostError::Invalidated`] when the writer is gone, [`HostError::Io`], and
/// [`HostError::Timeout`] when the worker did not take the frame in time (a frame may
/// then be half written: nothing may follow it).
pub(super) async fn write_frame(
    writer: &SharedWriter,
    envelope: &Envelope,
    bound: Duration,
) -> Result<(), HostError> {
    let payload = encode_envelope(envelope).map_err(HostError::Wire)?;
    let frame = encode_frame(&payload).map_err(|e| HostError::Wire(e.into()))?;
    let mut guard = writer.lock().await;
    let write = guard.as_mut().ok_or(HostError::Invalidated)?;
    match tokio::time::timeout(bound, write.write_all(&frame)).await {
        Ok(written) => written.map_err(|e| HostError::Io(e.to_string())),
        Err(_) => {
            guard.take();
            Err(HostError::Timeout(bound))
        }
    }
}

/// Stops a [`Worker`]'s generation from another task, whatever it is doing
/// ([`Worker::killer`]): the supervisor's watch connection is dropped, and the
/// supervisor kills every process of the worker; the worker's own exchange then fails
/// and ends with the host's record.
#[derive(Debug, Clone)]
pub struct Killer(WatchHandle);

impl Killer {
    /// Stops the generation (idempotent).
    pub fn kill(&self) {
        if let Ok(mut watch) = self.0.lock() {
            watch.take();
        }
    }
}

/// The diagnostic tails of a [`Worker`], readable from another task while it runs
/// ([`Worker::tails`]).
#[derive(Debug, Clone)]
pub struct Tails {
    stdout: Arc<Mutex<OutputTail>>,
    stderr: Arc<Mutex<OutputTail>>,
    flushers: Vec<Flusher>,
}

/// Asks a drain task to read what its pipe holds now; it answers once that is in its
/// tail.
type Flusher = tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>;

/// Longest wait for a drain task to read what its pipe holds ([`Tails::flush`]).
pub const FLUSH_BOUND: Duration = Duration::from_secs(1);

impl Tails {
    /// Reads what the worker's stdout and stderr pipes hold at this moment into the
    /// tails (at most [`FLUSH_BOUND`] each): bytes the worker wrote before the host was
    /// asked are in the tails however busy the machine is, since the pipes and the
    /// protocol socket are not ordered with each other.
    pub async fn flush(&self) {
        for flusher in &self.flushers {
            let (ack, done) = tokio::sync::oneshot::channel();
            if flusher.send(ack).await.is_ok() {
                let _ = tokio::time::timeout(FLUSH_BOUND, done).await;
            }
        }
    }

    /// `{stdout: {bytes, last_line}, stderr: …}`: bytes of the lines kept and the last
    /// complete line of each tail.
    pub fn diagnostics(&self) -> serde_json::Value {
        let one = |tail: &Arc<Mutex<OutputTail>>| match tail.lock() {
            Ok(t) => json!({
                "bytes": t.lines().map(str::len).sum::<usize>(),
                "last_line": t.lines().last(),
            }),
            Err(_) => json!({"bytes": 0, "last_line": null}),
        };
        json!({"stdout": one(&self.stdout), "stderr": one(&self.stderr)})
    }
}

/// Watches the supervisor from the host's side: it reports the worker's process group
/// (a `pid N` line) on the watch connection, and the connection's end means the
/// supervisor is gone. If it went while the host still held the generation (something
/// killed the supervisor), the host kills the worker's process group itself, so the
/// worker does not run on unsupervised; its connection's end then invalidates the
/// generation.
async fn guard_supervisor(read: tokio::net::unix::OwnedReadHalf, watch: WatchHandle) {
    let mut lines = tokio::io::BufReader::new(read);
    let mut line = String::new();
    let mut first = (&mut lines).take(64);
    let pid = match tokio::io::AsyncBufReadExt::read_line(&mut first, &mut line).await {
        Ok(_) => line
            .trim()
            .strip_prefix("pid ")
            .and_then(|p| p.parse::<i32>().ok())
            .filter(|p| *p > 1),
        Err(_) => None,
    };
    let mut rest = [0u8; 64];
    while let Ok(n) = tokio::io::AsyncReadExt::read(&mut lines, &mut rest).await {
        if n == 0 {
            break;
        }
    }
    let still_held = watch.lock().is_ok_and(|w| w.is_some());
    if still_held && let Some(pid) = pid {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// A directory removed when dropped.
struct PrivateDir(PathBuf);

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tail() -> Arc<Mutex<OutputTail>> {
    Arc::new(Mutex::new(OutputTail::new(
        256,
        DIAGNOSTIC_TAIL_BYTES,
        DIAGNOSTIC_TAIL_BYTES,
    )))
}

/// `EAGAIN`, for a `WouldBlock` that carries no OS error.
fn libc_eagain() -> i32 {
    nix::errno::Errno::EAGAIN as i32
}

/// Drains one of the worker's output pipes into `into`, continuously, and on request
/// ([`Tails::flush`]) reads at once what the pipe holds before answering.
fn drain(fd: std::os::fd::OwnedFd, into: Arc<Mutex<OutputTail>>) -> Option<Flusher> {
    use tokio::net::unix::pipe;
    let pipe = pipe::Receiver::from_owned_fd(fd).ok()?;
    let (tx, mut requests) = tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>(8);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 8192];
        // Reads what is there without waiting (the descriptor is non-blocking; tokio's
        // own `try_read` would trust its cached readiness and read nothing before the
        // reactor has seen the pipe readable); `false` once the pipe has ended.
        // `raw`: past tokio's readiness (a flush); else through it, which clears the
        // readiness at the end (a wake-up), so the loop never spins.
        let mut read_now = |pipe: &pipe::Receiver, raw: bool| loop {
            use std::os::fd::AsFd;
            let read = if raw {
                nix::unistd::read(pipe.as_fd(), &mut buf)
            } else {
                pipe.try_read(&mut buf).map_err(|e| {
                    nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc_eagain()))
                })
            };
            match read {
                Ok(0) => return false,
                Ok(n) => {
                    if let Ok(mut t) = into.lock() {
                        t.push(&buf[..n]);
                    }
                }
                Err(nix::errno::Errno::EAGAIN) => return true,
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return false,
            }
        };
        let mut open = true;
        loop {
            tokio::select! {
                ready = pipe.readable(), if open => {
                    open = ready.is_ok() && read_now(&pipe, false);
                }
                request = requests.recv() => match request {
                    Some(ack) => {
                        if open {
                            open = read_now(&pipe, true);
                        }
                        let _ = ack.send(());
                    }
                    // The worker is gone with its last handle.
                    None => return,
                },
            }
        }
    });
    Some(tx)
}

fn private_dir() -> Result<PrivateDir, HostError> {
    let base = std::env::temp_dir();
    let path = base.join(format!("cw-{}", uuid::Uuid::new_v4().simple()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&path)
        .map_err(|e| HostError::Setup(format!("{}: {e}", path.display())))?;
    Ok(PrivateDir(path))
}

fn bind_private(path: &Path) -> Result<UnixListener, HostError> {
    let len = path.as_os_str().len();
    if len > SOCKET_PATH_MAX_BYTES {
        return Err(HostError::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
        });
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| HostError::Setup(format!("{}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| HostError::Setup(format!("{}: {e}", path.display())))?;
    Ok(listener)
}

impl Worker {
    /// Starts a generation and completes its handshake.
    ///
    /// # Errors
    /// [`HostError`]: setup, spawn, handshake timeout or refusal (the worker is stopped).
    pub async fn spawn(config: HostConfig) -> Result<Self, HostError> {
        // A hook worker must announce the source identity of its snapshot.
        let expected_revision = match (&config.role, &config.hooks_dir) {
            (Role::Hooks, Some(dir)) => Some(
                super::source::source_identity(dir)
                    .map_err(|e| HostError::Snapshot(e.to_string()))?,
            ),
            (Role::Hooks, None) => {
                return Err(HostError::Snapshot("a hook worker needs a snapshot".into()));
            }
            (Role::Workbench, _) => config.skills.as_ref().and_then(|s| s.loaded_revision()),
        };
        let dir = private_dir()?;
        let socket = dir.0.join("worker.sock");
        let listener = bind_private(&socket)?;
        // "The worker reads it before it connects, so the payload file cannot outlive the
        // handshake": written beside the socket, removed once the hello is accepted.
        let skills_file = match (&config.role, &config.skills) {
            (Role::Workbench, Some(index)) if index.materialized() => {
                Some(materialize(index, &dir.0).map_err(HostError::Setup)?)
            }
            _ => None,
        };
        let watch_path = dir.0.join("watch.sock");
        let watch_listener = bind_private(&watch_path)?;
        let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
        let supervisor = match &config.supervisor {
            Some(path) => path.clone(),
            None => std::env::current_exe().map_err(|e| HostError::Spawn(e.to_string()))?,
        };
        let mut command = Command::new(&supervisor);
        // Not the host's environment: a cell can read every variable its worker has, so
        // the worker gets the allow-list's values and the launch environment, never the
        // host's control socket, its worker program or a secret of its own.
        command.env_clear().envs(
            crate::worker::workspace::INHERITED_ENV
                .iter()
                .chain(WORKER_EXTRA_ENV)
                .filter_map(|name| std::env::var_os(name).map(|value| (*name, value))),
        );
        command
            .arg("worker")
            .arg("supervise")
            .arg("--")
            .args(&config.program)
            .args(
                skills_file
                    .iter()
                    .flat_map(|path| [SKILLS_ARG.as_ref(), path.as_os_str()]),
            )
            .env(crate::process::supervise::WATCH_ENV, &watch_path)
            .env("CONTRACT_WORKER_SOCKET", &socket)
            .env("CONTRACT_WORKER_TOKEN", &token)
            .env("CONTRACT_WORKER_SESSION_ID", config.session_id.as_str())
            .env("CONTRACT_WORKER_GENERATION", config.generation.as_str())
            .env(
                "CONTRACT_WORKER_ROLE",
                match config.role {
                    Role::Workbench => "workbench",
                    Role::Hooks => "hooks",
                },
            )
            .current_dir(config.cwd.as_deref().unwrap_or(&dir.0))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(hooks) = &config.hooks_dir {
            command.env("CONTRACT_WORKER_HOOKS_DIR", hooks);
        }
        let mut child = command
            .spawn()
            .map_err(|e| HostError::Spawn(format!("{}: {e}", supervisor.display())))?;
        let (stdout, stderr) = (tail(), tail());
        let mut flushers = Vec::new();
        if let Some(fd) = child.stdout.take().and_then(|o| o.into_owned_fd().ok()) {
            flushers.extend(drain(fd, stdout.clone()));
        }
        if let Some(fd) = child.stderr.take().and_then(|e| e.into_owned_fd().ok()) {
            flushers.extend(drain(fd, stderr.clone()));
        }
        let bound = config.handshake_timeout;
        let accept = async {
            let (watch, _) = watch_listener.accept().await?;
            let (conn, _) = listener.accept().await?;
            Ok::<_, std::io::Error>((watch, conn))
        };
        // A worker that exits before it connects is reported at once, with its stderr.
        let accepted = tokio::select! {
            accepted = tokio::time::timeout(bound, accept) => accepted,
            status = child.wait() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let tail = stderr.lock().map(|t| t.lines().collect::<Vec<_>>().join("\n")).unwrap_or_default();
                return Err(HostError::Spawn(format!(
                    "the worker exited before it connected ({}); stderr: {tail}",
                    status.map_or_else(|e| e.to_string(), |s| s.to_string())
                )));
            }
        };
        let (watch, conn) = match accepted {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Err(HostError::Io(e.to_string())),
            Err(_) => {
                let _ = child.kill().await;
                return Err(HostError::HandshakeTimeout(bound));
            }
        };
        let (watch_read, watch_write) = watch.into_split();
        let watch: WatchHandle = Arc::new(Mutex::new(Some(watch_write)));
        tokio::spawn(guard_supervisor(watch_read, watch.clone()));
        let (read, write) = conn.into_split();
        let writer: SharedWriter = Arc::new(tokio::sync::Mutex::new(Some(write)));
        let interrupts = Interrupts::default();
        let reader = reader::start(
            read,
            watch.clone(),
            reader::Refusals {
                writer: writer.clone(),
                live: Interrupter(interrupts.clone()),
                no_scope: config.choices.no_scope,
                message: match config.role {
                    Role::Hooks => "a hook has no host-effect scope",
                    Role::Workbench => "the execution is not the current live one",
                },
                bound: config.send_timeout,
            },
            config.session_id.clone(),
            config.generation.clone(),
        );
        let mut worker = Self {
            config,
            dir,
            child,
            writer,
            reader: Some(reader),
            watch,
            stdout,
            stderr,
            flushers,
            next_op: 0,
            valid: true,
            interrupts,
            revision: None,
        };
        let hello = tokio::time::timeout(bound, worker.read_message()).await;
        let message = match hello {
            Ok(Ok(message)) => message,
            Ok(Err(e)) => {
                worker.hard_stop().await;
                return Err(e);
            }
            Err(_) => {
                worker.hard_stop().await;
                return Err(HostError::HandshakeTimeout(bound));
            }
        };
        match message {
            Message::Hello {
                token: got,
                role,
                revision,
                slots,
            } => {
                let problem = if got.as_str() != token {
                    Some("the token is not the one this subprocess was started with".to_string())
                } else if role != worker.config.role {
                    Some(format!("role {role:?}, expected {:?}", worker.config.role))
                } else if role == Role::Hooks && slots.as_slice() != Slot::ALL {
                    Some(
                        "a hook worker implements exactly attention.plan and delivery.review"
                            .into(),
                    )
                } else if role == Role::Workbench && !slots.is_empty() {
                    Some("a workbench has no slots".into())
                } else if revision.0 != expected_revision {
                    Some(format!(
                        "revision {:?}, expected {:?}",
                        revision.0, expected_revision
                    ))
                } else {
                    None
                };
                if let Some(problem) = problem {
                    worker.hard_stop().await;
                    return Err(HostError::Handshake(problem));
                }
                worker.revision = revision.0;
                if let Some(path) = skills_file {
                    // The worker read it before it connected; the private directory goes
                    // with the generation in any case.
                    let _ = std::fs::remove_file(path);
                }
                Ok(worker)
            }
            other => {
                worker.hard_stop().await;
                Err(HostError::Handshake(format!(
                    "the first message is {}, not hello",
                    other.kind()
                )))
            }
        }
    }

    /// A handle that interrupts this worker's running cell from another task.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter(self.interrupts.clone())
    }

    /// A handle that stops this generation from another task, whatever it is doing.
    pub fn killer(&self) -> Killer {
        Killer(self.watch.clone())
    }

    /// A handle on the diagnostic tails, readable while a cell runs.
    pub fn tails(&self) -> Tails {
        Tails {
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            flushers: self.flushers.clone(),
        }
    }

    /// The skills this generation was given (`None`: none were offered to it).
    pub fn skills(&self) -> Option<Arc<SkillIndex>> {
        self.config.skills.clone()
    }

    /// The generation's identifier.
    pub fn generation(&self) -> &Identifier {
        &self.config.generation
    }

    /// Whether the generation is still valid (not invalidated, stopped or shut down).
    pub fn is_valid(&self) -> bool {
        self.valid
            && self
                .reader
                .as_ref()
                .is_some_and(|r| r.valid.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// The private directory of this generation.
    pub fn dir(&self) -> &Path {
        &self.dir.0
    }

    /// The worker's process ID (the supervisor's).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The bounded tail of the worker's stderr.
    pub fn stderr_tail(&self) -> String {
        self.stderr
            .lock()
            .map(|t| t.lines().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }

    /// What the stdout and stderr tails hold ([`Tails::diagnostics`]).
    pub fn diagnostics(&self) -> serde_json::Value {
        self.tails().diagnostics()
    }

    /// The bounded tail of the worker's stdout.
    pub fn stdout_tail(&self) -> String {
        self.stdout
            .lock()
            .map(|t| t.lines().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }

    async fn send(&mut self, message: Message) -> Result<(), HostError> {
        let envelope = Envelope {
            version: super::wire::limits::PROTOCOL_VERSION,
            session_id: self.config.session_id.clone(),
            generation: self.config.generation.clone(),
            message,
        };
        match write_frame(&self.writer, &envelope, self.config.send_timeout).await {
            // The worker stopped reading: the exchange is abandoned, the generation gone
            // (a frame may be half written, so nothing may follow it).
            Err(e @ HostError::Timeout(_)) => {
                self.release();
                Err(e)
            }
            other => other,
        }
    }

    /// The next message of the worker, in order (the reader decoded and checked it).
    async fn read_message(&mut self) -> Result<Message, HostError> {
        let reader = self.reader.as_mut().ok_or(HostError::Invalidated)?;
        reader
            .inbox
            .recv()
            .await
            .unwrap_or(Err(HostError::Invalidated))
    }

    /// The generation is lost: stop it, and record what the host observed (the worker's
    /// own exit status when it ended by itself, and its stderr tail).
    async fn lost(&mut self, id: &Identifier, why: &HostError) -> CellRecord {
        // A worker that is exiting gets a moment to do so, so that its own status (not the
        // hard stop's) is the one reported.
        let own = tokio::time::timeout(Duration::from_millis(500), self.child.wait())
            .await
            .ok()
            .and_then(Result::ok);
        self.hard_stop().await;
        let status = own.or_else(|| self.child.try_wait().ok().flatten());
        let tail = self.stderr_tail();
        CellRecord {
            id: id.clone(),
            status: self.config.choices.lost_status,
            output: Vec::new(),
            truncated_bytes: 0,
            error: Some(format!(
                "{}: {} ({}); worker {}{}",
                self.config.choices.lost_text,
                why,
                why.code(),
                status.map_or("stopped".to_string(), |s| format!("ended with {s}")),
                if tail.is_empty() {
                    String::new()
                } else {
                    format!("; its stderr ends:\n{tail}")
                }
            )),
            observed_by_host: true,
        }
    }

    /// Drops the connection and the watch (the supervisor then stops every process).
    fn release(&mut self) {
        self.valid = false;
        // The reader's task ends with it; a frame it is writing now ends with the task.
        self.reader = None;
        if let Ok(mut writer) = self.writer.try_lock() {
            writer.take();
        }
        if let Ok(mut watch) = self.watch.lock() {
            watch.take();
        }
    }

    /// Asks the worker to exit, waits `grace`, then stops it hard. Returns the exit
    /// status the host observed.
    pub async fn shutdown(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if self.valid
            && self.send(Message::Shutdown {}).await.is_ok()
            && let Ok(Ok(status)) = tokio::time::timeout(grace, self.child.wait()).await
        {
            self.release();
            return Some(status);
        }
        self.hard_stop().await;
        self.child.try_wait().ok().flatten()
    }

    /// The hard stop: drops the watch connection, on which the supervisor kills every
    /// process of the worker (its group and every descendant, wherever it moved), and
    /// reaps the supervisor (SIGKILL after [`crate::process::supervise::SWEEP_BOUND`] more).
    pub async fn hard_stop(&mut self) {
        self.release();
        let bound = crate::process::supervise::SWEEP_BOUND + Duration::from_secs(1);
        if tokio::time::timeout(bound, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn inspect_states_now_in_the_stamp_shape_and_now_ms() {
        let id = |s: &str| Identifier::new(s).unwrap();
        let reply = BasicServices
            .handle(&id("c1"), &id("r1"), &HostRequest::RuntimeInspect {})
            .await;
        let Reply::Ok { value } = reply else {
            panic!("{reply:?}")
        };
        let now_ms = value["now_ms"].as_u64().unwrap();
        // The same instant, in whole seconds of the `Z` shape (`2026-09-13T19:54:53Z`).
        assert_eq!(
            value["now"],
            json!(rfc3339_utc_seconds(Duration::from_millis(now_ms)))
        );
        let now = value["now"].as_str().unwrap();
        assert_eq!(now.len(), 20, "{now}");
        assert!(now.ends_with('Z') && now.as_bytes()[10] == b'T', "{now}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_flush_puts_what_the_pipe_holds_into_the_tail_before_the_answer() {
        let (read, write) = std::io::pipe().unwrap();
        let (out, err) = (tail(), tail());
        let flusher = drain(read.into(), out.clone()).unwrap();
        let tails = Tails {
            stdout: out,
            stderr: err,
            flushers: vec![flusher],
        };
        std::io::Write::write_all(&mut &write, b"first line\nthe last line\n").unwrap();
        // On this single-threaded runtime the drain task has not run yet: nothing is in
        // the tail until the flush has been answered.
        assert_eq!(tails.diagnostics()["stdout"]["last_line"], json!(null));
        tails.flush().await;
        assert_eq!(
            tails.diagnostics()["stdout"]["last_line"],
            json!("the last line")
        );
        // After the writer is gone a flush still answers at once.
        drop(write);
        tokio::time::timeout(FLUSH_BOUND, tails.flush())
            .await
            .unwrap();
    }
}
