//! The controlled Harness adapter: a real [`HarnessAdapter`] whose native side is a
//! conformance harness speaking the control channel of `docs/control-channel.md`.
//!
//! # Shape
//! * [`ControlledAdapter::connect`] connects to the harness's Unix socket
//!   (`CONTRACT_CONTROL_SOCKET`, see `docs/launch-contract.md`), sends the hello line
//!   and spawns two tasks: a *reader* that decodes requests and spawns one handler task
//!   per request that may wait (so a waiting request never delays the others), and a
//!   *writer* that owns the socket's write half and sends response lines.
//! * Native calls from the dispatcher are recorded (the doc's "call record" table),
//!   then subjected to armed holds and failures, then run their default behaviour.
//! * `emit`/`settle`/`accept_input`/`settle_cancel` act on one Run's native stream. They
//!   run in a per-Run *lane*: applied in the order the requests arrived, each bounded by
//!   its own `timeout_ms` counted from arrival (so pipelined `emit`s keep their order
//!   even before the Run starts). `fail`/`hold`/`release`/`report` never wait and are
//!   applied by the reader itself, in arrival order; `await` waits in its own task.
//!
//! # Decisions where the doc is silent
//! * A call is recorded when it *enters* the adapter, before a hold or failure applies,
//!   so `await` sees held calls. Holds and failures are consumed at entry; a held call
//!   applies its failure (if any) after `release`.
//! * `fail` replaces any failure still armed for that call kind; `times` is 1..=10 000.
//!   `hold` may be armed several times (each holds one call); `release` with no held call
//!   disarms one armed hold; with neither it does nothing. Both answer `{}`.
//! * A `cancel` not held or failed is pending from the moment it is recorded, so
//!   `await cancel` followed by `settle_cancel` never races. `settle_cancel` does not
//!   wait for a cancel (only for the Run's earlier lane ops): it answers
//!   `no_pending_cancel` when the Run is known but no cancel waits, and `unknown_run`
//!   when the Run never started and no cancel waits. It resolves every cancel pending on
//!   the Run (a Runtime retry after its own budget is the same native cancellation).
//! * `settle`, `accept_input` and `emit` all wait (bounded) until the Run started; on a
//!   Run already settled, or whose event stream the Runtime dropped, they answer
//!   `unknown_run`. A Run's sink is dropped after its `settle` is delivered.
//! * A request whose `seq` cannot be read (not JSON, duplicated or `null` `seq`, an
//!   over-long line) is answered with a `bad_request` response **without** `seq`.
//! * `timeout_ms` is accepted on every op, at most 600 000; `report` adds
//!   `"dropped": n` only when calls went unrecorded past the 10 000-record bound. A
//!   response line over 4 MiB is replaced by a `bad_request` error response.
//! * When the control channel closes: pending native calls (held, hanging, waiting
//!   cancels) resolve as [`AdapterError::Unknown`]`("control channel closed")`, open
//!   Runs' event streams end (their sinks are dropped), and later native calls fail
//!   with [`AdapterError::Unavailable`].

mod protocol;
mod state;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use protocol::{
    CallKind, DEFAULT_TIMEOUT, FailMode, HELLO_LINE, MAX_FAIL_TIMES, MAX_LINE_BYTES, MAX_TIMEOUT_MS,
};
pub use state::{
    MAX_ARMED_HOLDS, MAX_CALL_RECORDS, MAX_HELD_CALLS, MAX_PENDING_CANCELS_PER_RUN, MAX_RUNS,
};

use self::protocol::{Line, Op, Request, decode_request, encode_error, encode_response, read_line};
use self::state::{RunSlot, State};
use super::{
    AdapterError, CancelSettlement, HarnessAdapter, NativeEvent, NativePrepare, NativeStart,
    RunEventSink,
};
use crate::core_runtime::wire::{
    AgentKindDeclaration, CallId, ExecutorId, InputId, InteractionId, MessageInput,
    PermissionVerdict, PromptForUserChoiceDecision, RunId,
};

/// Longest Unix socket path, in bytes (`sun_path` is 108 bytes including its NUL).
pub const UNIX_SOCKET_PATH_MAX_BYTES: usize = 107;

/// Bound of connecting to the control socket and of writing the hello line.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Most requests handled at once; the reader stops reading while all are in flight
/// (every one is bounded by its `timeout_ms`, so slots free up).
pub const MAX_IN_FLIGHT_REQUESTS: usize = 1_024;

/// Capacity, in lines, of the queue in front of the socket writer.
pub const RESPONSE_QUEUE: usize = 1_024;

/// Lane table size above which finished lanes are pruned.
const LANE_PRUNE_THRESHOLD: usize = 4_096;

/// Message of the [`AdapterError`]s caused by a closed control channel.
const CLOSED: &str = "control channel closed";

/// Errors of the control channel: connecting to it, and the error codes its responses
/// carry (`docs/control-channel.md`, "Error codes of the channel itself").
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket path does not fit a Unix socket address.
    #[error(
        "control socket path `{path}` is {len} bytes; a Unix socket path is at most {UNIX_SOCKET_PATH_MAX_BYTES}"
    )]
    SocketPathTooLong {
        /// The path.
        path: String,
        /// Its length in bytes.
        len: usize,
    },
    /// Connecting to the control socket failed or timed out.
    #[error("cannot connect to control socket `{path}`: {source}")]
    Connect {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Writing the hello line failed or timed out.
    #[error("cannot send the hello line: {0}")]
    Hello(std::io::Error),
    /// `bad_request`: unknown op, wrong or malformed arguments, non-strict JSON.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// `unknown_run`: the Run has no open native stream (settled, dropped by the
    /// Runtime, or never started).
    #[error("unknown run: {0}")]
    UnknownRun(String),
    /// `timeout`: the request's wait bound expired.
    #[error("timed out after {0} ms")]
    Timeout(u128),
    /// `no_pending_cancel`: `settle_cancel` on a Run with no `cancel` call waiting.
    #[error("no cancel is pending on run `{0}`")]
    NoPendingCancel(String),
    /// The control channel closed while the request waited (never sent: there is no
    /// channel left to answer on).
    #[error("control channel closed")]
    Closed,
}

impl ControlError {
    /// Stable machine-readable code; the channel's own codes are exactly the doc's.
    pub fn code(&self) -> &'static str {
        match self {
            ControlError::SocketPathTooLong { .. } => "socket_path_too_long",
            ControlError::Connect { .. } => "connect_failed",
            ControlError::Hello(_) => "hello_failed",
            ControlError::BadRequest(_) => "bad_request",
            ControlError::UnknownRun(_) => "unknown_run",
            ControlError::Timeout(_) => "timeout",
            ControlError::NoPendingCancel(_) => "no_pending_cancel",
            ControlError::Closed => "channel_closed",
        }
    }
}

/// How long [`HarnessAdapter::finish`] waits for the responses of requests already read
/// before the Runtime exits.
pub const FINISH_BOUND: Duration = Duration::from_secs(1);

/// State shared by the adapter, its tasks and the request handlers.
struct Shared {
    state: Mutex<State>,
    /// Bumped after every state change that a waiter may be waiting for.
    version: watch::Sender<u64>,
    /// (requests read, responses written): every request read gets exactly one
    /// response, so they are equal when nothing is owed ([`ControlledAdapter::finish`]).
    progress: watch::Sender<(u64, u64)>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    fn close(&self) {
        let was_open = {
            let mut state = self.lock();
            let was_open = !state.closed;
            state.close();
            was_open
        };
        if was_open {
            tracing::info!("controlled adapter: control channel closed");
        }
        self.bump();
    }

    /// Waits until `check` yields a value, the channel closes, or `deadline` passes.
    async fn wait_for<T>(
        &self,
        deadline: Instant,
        timeout: Duration,
        mut check: impl FnMut(&State) -> Option<T>,
    ) -> Result<T, ControlError> {
        let mut changes = self.version.subscribe();
        loop {
            {
                let state = self.lock();
                if let Some(value) = check(&state) {
                    return Ok(value);
                }
                if state.closed {
                    return Err(ControlError::Closed);
                }
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                // The sender lives in `self`; treat its loss like a closed channel.
                Ok(Err(_)) => return Err(ControlError::Closed),
                Err(_) => return Err(ControlError::Timeout(timeout.as_millis())),
            }
        }
    }

    /// Resolves when the control channel is closed.
    async fn closed(&self) {
        let mut changes = self.version.subscribe();
        loop {
            if self.lock().closed {
                return;
            }
            if changes.changed().await.is_err() {
                return;
            }
        }
    }
}

/// The controlled Harness adapter (see the module documentation).
pub struct ControlledAdapter {
    declarations: Vec<AgentKindDeclaration>,
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl std::fmt::Debug for ControlledAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlledAdapter")
            .field("declarations", &self.declarations.len())
            .finish_non_exhaustive()
    }
}

impl Drop for ControlledAdapter {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
        self.shared.close();
    }
}

impl ControlledAdapter {
    /// Connects to the harness's control socket at `socket_path`, sends the hello line
    /// `{"hello":{"adapter":"controlled","protocol":1}}` and spawns the reader and writer
    /// tasks. `declarations` are returned as-is by [`HarnessAdapter::declarations`] (the
    /// Runtime validates them). Must be called inside a Tokio runtime.
    ///
    /// # Errors
    /// [`ControlError::SocketPathTooLong`], [`ControlError::Connect`] (including a
    /// connection not established within [`CONNECT_TIMEOUT`]), [`ControlError::Hello`].
    pub async fn connect(
        socket_path: &Path,
        declarations: Vec<AgentKindDeclaration>,
    ) -> Result<Arc<ControlledAdapter>, ControlError> {
        let path_text = socket_path.display().to_string();
        let len = socket_path.as_os_str().len();
        if len > UNIX_SOCKET_PATH_MAX_BYTES {
            return Err(ControlError::SocketPathTooLong {
                path: path_text,
                len,
            });
        }
        let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let stream =
            match tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(socket_path)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(source)) => {
                    return Err(ControlError::Connect {
                        path: path_text,
                        source,
                    });
                }
                Err(_) => {
                    return Err(ControlError::Connect {
                        path: path_text,
                        source: timed_out(),
                    });
                }
            };
        let (read_half, mut write_half) = stream.into_split();
        let hello = format!("{HELLO_LINE}\n");
        match tokio::time::timeout(CONNECT_TIMEOUT, async {
            write_half.write_all(hello.as_bytes()).await?;
            write_half.flush().await
        })
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ControlError::Hello(e)),
            Err(_) => return Err(ControlError::Hello(timed_out())),
        }
        tracing::info!(socket = %path_text, "controlled adapter: connected to the control channel");

        let (version, _) = watch::channel(0u64);
        let (progress, _) = watch::channel((0u64, 0u64));
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            version,
            progress,
        });
        let (responses, response_rx) = mpsc::channel(RESPONSE_QUEUE);
        let writer = tokio::spawn(write_loop(write_half, response_rx, shared.clone()));
        let reader = tokio::spawn(read_loop(read_half, responses, shared.clone()));
        Ok(Arc::new(ControlledAdapter {
            declarations,
            shared,
            reader,
            writer,
        }))
    }

    /// Records a native call and consumes the hold and failure armed for its kind.
    /// `at_entry` runs under the same lock (with the consumed failure), so whatever it
    /// registers is visible as soon as the record is.
    fn enter<T>(
        &self,
        kind: CallKind,
        record: Value,
        at_entry: impl FnOnce(&mut State, Option<FailMode>) -> Result<T, AdapterError>,
    ) -> Result<Entered<T>, AdapterError> {
        let entered = {
            let mut state = self.shared.lock();
            if state.closed {
                return Err(AdapterError::Unavailable(CLOSED.into()));
            }
            state.push_record(record);
            let hold = state.take_hold(kind);
            let fault = state.take_fault(kind);
            at_entry(&mut state, fault).map(|extra| Entered { hold, fault, extra })
        };
        self.shared.bump();
        entered
    }

    /// Waits out a hold, then applies the failure, if any.
    async fn proceed(
        &self,
        kind: CallKind,
        hold: Option<oneshot::Receiver<()>>,
        fault: Option<FailMode>,
    ) -> Result<(), AdapterError> {
        if let Some(hold) = hold {
            hold.await
                .map_err(|_| AdapterError::Unknown(CLOSED.into()))?;
        }
        match fault {
            None => Ok(()),
            Some(FailMode::Refuse) => Err(AdapterError::Refused(format!(
                "{} refused by the control channel",
                kind.as_str()
            ))),
            Some(FailMode::Unknown) => Err(AdapterError::Unknown(format!(
                "{} outcome made unknown by the control channel",
                kind.as_str()
            ))),
            Some(FailMode::Unsupported) => Err(AdapterError::Unsupported(kind.as_str().into())),
            Some(FailMode::Hang) => {
                self.shared.closed().await;
                Err(AdapterError::Unknown(CLOSED.into()))
            }
        }
    }

    /// A call with no default effect beyond succeeding.
    async fn simple_call(&self, kind: CallKind, record: Value) -> Result<(), AdapterError> {
        let entered = self.enter(kind, record, |_, _| Ok(()))?;
        self.proceed(kind, entered.hold, entered.fault).await
    }
}

/// What [`ControlledAdapter::enter`] consumed for one call.
struct Entered<T> {
    hold: Option<oneshot::Receiver<()>>,
    fault: Option<FailMode>,
    extra: T,
}

/// Serializes a record field with its wire type's serde.
fn field<T: Serialize + ?Sized>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_else(|e| Value::String(format!("<unserializable: {e}>")))
}

/// Builds a call record: `{"call": kind, ...fields}`.
fn record(kind: CallKind, fields: Vec<(&'static str, Value)>) -> Value {
    let mut map = Map::new();
    map.insert("call".into(), Value::String(kind.as_str().into()));
    for (name, value) in fields {
        map.insert(name.into(), value);
    }
    Value::Object(map)
}

#[async_trait]
impl HarnessAdapter for ControlledAdapter {
    fn declarations(&self) -> Vec<AgentKindDeclaration> {
        self.declarations.clone()
    }

    async fn prepare(&self, request: NativePrepare) -> Result<(), AdapterError> {
        let rec = record(
            CallKind::Prepare,
            vec![
                ("executor_id", field(&request.executor_id)),
                ("session_id", field(&request.session_id)),
                ("agent_kind", field(&request.agent_kind)),
                ("configuration", field(&request.configuration)),
            ],
        );
        self.simple_call(CallKind::Prepare, rec).await
    }

    async fn start(&self, request: NativeStart, events: RunEventSink) -> Result<(), AdapterError> {
        let kind = CallKind::Start;
        let rec = record(
            kind,
            vec![
                ("executor_id", field(&request.executor_id)),
                ("run_id", field(&request.run_id)),
                ("input", field(&request.input)),
            ],
        );
        let entered = self.enter(kind, rec, |_, _| Ok(()))?;
        self.proceed(kind, entered.hold, entered.fault).await?;
        {
            let mut state = self.shared.lock();
            if state.closed {
                return Err(AdapterError::Unknown(CLOSED.into()));
            }
            state
                .open_run(request.run_id, events)
                .map_err(AdapterError::Refused)?;
        }
        self.shared.bump();
        Ok(())
    }

    async fn write_input(
        &self,
        run_id: &RunId,
        input_id: &InputId,
        input: &[MessageInput],
    ) -> Result<(), AdapterError> {
        let rec = record(
            CallKind::WriteInput,
            vec![
                ("run_id", field(run_id)),
                ("input_id", field(input_id)),
                ("input", field(input)),
            ],
        );
        self.simple_call(CallKind::WriteInput, rec).await
    }

    async fn cancel(&self, run_id: &RunId) -> Result<CancelSettlement, AdapterError> {
        let kind = CallKind::Cancel;
        let rec = record(kind, vec![("run_id", field(run_id))]);
        let entered = self.enter(kind, rec, |state, fault| match fault {
            None => state
                .add_pending_cancel(run_id)
                .map(Some)
                .map_err(AdapterError::Refused),
            Some(_) => Ok(None),
        })?;
        self.proceed(kind, entered.hold, entered.fault).await?;
        match entered.extra {
            Some(settled) => settled
                .await
                .map_err(|_| AdapterError::Unknown(CLOSED.into())),
            // `proceed` returned Ok, so there was no failure and a waiter exists.
            None => Err(AdapterError::Unknown(CLOSED.into())),
        }
    }

    async fn resolve_permission(
        &self,
        run_id: &RunId,
        request_id: &InteractionId,
        decision: PermissionVerdict,
    ) -> Result<(), AdapterError> {
        let rec = record(
            CallKind::ResolvePermission,
            vec![
                ("run_id", field(run_id)),
                ("request_id", field(request_id)),
                ("decision", field(&decision)),
            ],
        );
        self.simple_call(CallKind::ResolvePermission, rec).await
    }

    async fn resolve_user_choice(
        &self,
        run_id: &RunId,
        ask_id: &InteractionId,
        decision: &PromptForUserChoiceDecision,
    ) -> Result<(), AdapterError> {
        let rec = record(
            CallKind::ResolveUserChoice,
            vec![
                ("run_id", field(run_id)),
                ("ask_id", field(ask_id)),
                ("decision", field(decision)),
            ],
        );
        self.simple_call(CallKind::ResolveUserChoice, rec).await
    }

    async fn function_result(
        &self,
        run_id: &RunId,
        call_id: &CallId,
        output: &str,
        is_error: bool,
    ) -> Result<(), AdapterError> {
        let rec = record(
            CallKind::FunctionResult,
            vec![
                ("run_id", field(run_id)),
                ("call_id", field(call_id)),
                ("output", Value::String(output.to_string())),
                ("is_error", Value::Bool(is_error)),
            ],
        );
        self.simple_call(CallKind::FunctionResult, rec).await
    }

    async fn close_executor(&self, executor_id: &ExecutorId) -> Result<(), AdapterError> {
        let rec = record(
            CallKind::CloseExecutor,
            vec![("executor_id", field(executor_id))],
        );
        self.simple_call(CallKind::CloseExecutor, rec).await
    }

    /// Waits, at most [`FINISH_BOUND`], until every request read has its response
    /// written ("exactly one response per request", docs/control-channel.md).
    async fn finish(&self) {
        let mut progress = self.shared.progress.subscribe();
        let answered = progress.wait_for(|(read, written)| written >= read);
        if tokio::time::timeout(FINISH_BOUND, answered).await.is_err() {
            tracing::warn!(
                bound_ms = FINISH_BOUND.as_millis() as u64,
                "controlled adapter: exiting with control requests unanswered"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Tasks
// ---------------------------------------------------------------------------

/// Sends queued response lines; closes the channel state when the socket fails.
async fn write_loop(
    mut socket: OwnedWriteHalf,
    mut lines: mpsc::Receiver<String>,
    shared: Arc<Shared>,
) {
    while let Some(mut line) = lines.recv().await {
        line.push('\n');
        let written = async {
            socket.write_all(line.as_bytes()).await?;
            socket.flush().await
        };
        if let Err(e) = written.await {
            tracing::warn!(error = %e, "controlled adapter: writing a response failed");
            break;
        }
        shared.progress.send_modify(|(_, written)| *written += 1);
    }
    shared.close();
}

/// Reads request lines, answers undecodable ones, and spawns one handler per request.
async fn read_loop(socket: OwnedReadHalf, responses: mpsc::Sender<String>, shared: Arc<Shared>) {
    let mut reader = BufReader::new(socket);
    let mut line = Vec::new();
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT_REQUESTS));
    // Per-Run lanes: the completion signal of the last op queued on each Run.
    let mut lanes: std::collections::HashMap<RunId, oneshot::Receiver<()>> =
        std::collections::HashMap::new();
    loop {
        if shared.lock().closed {
            break;
        }
        let read = read_line(&mut reader, &mut line).await;
        if matches!(read, Ok(Line::Complete | Line::TooLong)) {
            shared.progress.send_modify(|(read, _)| *read += 1);
        }
        let request = match read {
            Ok(Line::Complete) => decode_request(&line),
            Ok(Line::TooLong) => Err(protocol::Rejected {
                seq: None,
                error: ControlError::BadRequest(format!(
                    "line exceeds the {MAX_LINE_BYTES}-byte bound"
                )),
            }),
            Ok(Line::Eof) => break,
            Err(e) => {
                tracing::warn!(error = %e, "controlled adapter: reading the control channel failed");
                break;
            }
        };
        let arrived = Instant::now();
        let request = match request {
            Ok(request) => request,
            Err(rejected) => {
                tracing::debug!(error = %rejected.error, "controlled adapter: bad request");
                if responses
                    .send(encode_error(rejected.seq, &rejected.error))
                    .await
                    .is_err()
                {
                    break;
                }
                continue;
            }
        };
        if request.op.is_immediate() {
            // Instant ops apply in arrival order, before any later request is read.
            let response = encode_response(request.seq, apply_now(request.op, &shared));
            if responses.send(response).await.is_err() {
                break;
            }
            continue;
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let lane = request.op.lane().cloned().map(|run_id| {
            if lanes.len() > LANE_PRUNE_THRESHOLD {
                lanes.retain(|_, done| {
                    matches!(done.try_recv(), Err(oneshot::error::TryRecvError::Empty))
                });
            }
            let (done_tx, done_rx) = oneshot::channel();
            let previous = lanes.insert(run_id, done_rx);
            Lane {
                previous,
                _done: done_tx,
            }
        });
        tokio::spawn(handle(
            request,
            arrived,
            lane,
            permit,
            shared.clone(),
            responses.clone(),
        ));
    }
    shared.close();
}

/// A request's place in its Run's lane: it waits for `previous` to finish, and its own
/// completion is signalled by dropping `_done`.
struct Lane {
    previous: Option<oneshot::Receiver<()>>,
    _done: oneshot::Sender<()>,
}

/// Handles one request and queues its response.
async fn handle(
    request: Request,
    arrived: Instant,
    lane: Option<Lane>,
    _permit: OwnedSemaphorePermit,
    shared: Arc<Shared>,
    responses: mpsc::Sender<String>,
) {
    let Request { seq, timeout, op } = request;
    let deadline = arrived + timeout;
    let result = run_op(op, deadline, timeout, &shared, lane).await;
    if matches!(result, Err(ControlError::Closed)) {
        return;
    }
    let _ = responses.send(encode_response(seq, result)).await;
}

/// Waits for the lane predecessor, then performs `op`.
async fn run_op(
    op: Op,
    deadline: Instant,
    timeout: Duration,
    shared: &Shared,
    mut lane: Option<Lane>,
) -> Result<Value, ControlError> {
    if let Some(previous) = lane.as_mut().and_then(|l| l.previous.take()) {
        // Either outcome (completion or predecessor dropped) means it finished.
        if tokio::time::timeout_at(deadline, previous).await.is_err() {
            return Err(ControlError::Timeout(timeout.as_millis()));
        }
    }
    let result = match op {
        Op::RunEvent { run_id, event } => deliver(shared, &run_id, event, deadline, timeout).await,
        Op::SettleCancel { run_id, done } => {
            let settlement = if done {
                CancelSettlement::StreamSettles
            } else {
                CancelSettlement::Stopped
            };
            let mut state = shared.lock();
            if state.settle_cancels(&run_id, settlement) > 0 {
                Ok(json!({}))
            } else if state.runs.contains_key(&run_id) {
                Err(ControlError::NoPendingCancel(run_id.to_string()))
            } else {
                Err(ControlError::UnknownRun(format!(
                    "run `{run_id}` never started and has no pending cancel"
                )))
            }
        }
        Op::Await {
            call,
            matcher,
            count,
        } => {
            shared
                .wait_for(deadline, timeout, |state| {
                    state.nth_match(call, &matcher, count).cloned()
                })
                .await
        }
        other => apply_now(other, shared),
    };
    drop(lane);
    result
}

/// Applies an op that never waits (`fail`, `hold`, `release`, `report`).
fn apply_now(op: Op, shared: &Shared) -> Result<Value, ControlError> {
    match op {
        Op::RunEvent { .. } | Op::SettleCancel { .. } | Op::Await { .. } => Err(
            ControlError::BadRequest("internal: a waiting op was applied immediately".into()),
        ),
        Op::Fail { call, mode, times } => {
            shared.lock().faults[call.index()] = Some((mode, times));
            Ok(json!({}))
        }
        Op::Hold { call } => {
            let mut state = shared.lock();
            let hold = &mut state.holds[call.index()];
            if hold.armed >= MAX_ARMED_HOLDS {
                Err(ControlError::BadRequest(format!(
                    "more than {MAX_ARMED_HOLDS} holds armed for `{}`",
                    call.as_str()
                )))
            } else {
                hold.armed += 1;
                Ok(json!({}))
            }
        }
        Op::Release { call } => {
            shared.lock().release(call);
            Ok(json!({}))
        }
        Op::Report => {
            let state = shared.lock();
            let mut result = json!({ "calls": state.records });
            if state.dropped_records > 0 {
                result["dropped"] = json!(state.dropped_records);
            }
            Ok(result)
        }
    }
}

/// Delivers one native event to a Run's sink once the Run started natively.
async fn deliver(
    shared: &Shared,
    run_id: &RunId,
    event: NativeEvent,
    deadline: Instant,
    timeout: Duration,
) -> Result<Value, ControlError> {
    let sink = shared
        .wait_for(deadline, timeout, |state| match state.runs.get(run_id) {
            Some(RunSlot::Open(sink)) => Some(Ok(sink.clone())),
            Some(RunSlot::Closed) => Some(Err(ControlError::UnknownRun(format!(
                "run `{run_id}` has settled; nothing more is emitted"
            )))),
            None => None,
        })
        .await??;
    let settles = matches!(event, NativeEvent::Settled { .. });
    match tokio::time::timeout_at(deadline, sink.send(event)).await {
        Err(_) => Err(ControlError::Timeout(timeout.as_millis())),
        Ok(Err(_)) => {
            shared.lock().runs.insert(run_id.clone(), RunSlot::Closed);
            shared.bump();
            Err(ControlError::UnknownRun(format!(
                "the Runtime dropped the event stream of run `{run_id}`"
            )))
        }
        Ok(Ok(())) => {
            if settles {
                shared.lock().runs.insert(run_id.clone(), RunSlot::Closed);
                shared.bump();
            }
            Ok(json!({}))
        }
    }
}
