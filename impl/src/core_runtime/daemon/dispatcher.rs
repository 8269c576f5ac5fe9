//! The Runtime dispatcher: routes Core's frames to admission, Runs, interactions,
//! workspace operations and suspension fencing ("Message families").
//!
//! [`Runtime`] is the process-wide service state; one [`Conn`] holds what belongs to
//! the current physical connection only ("Each physical connection gets fresh routes,
//! admission handles and transport state"). The receive loop calls
//! [`Runtime::dispatch`] for every text frame; anything that waits on the Harness runs
//! in a spawned task ("Preparation and start run outside the receive loop and the
//! router lock"). Frames are queued under the state lock, so the statuses of one handle
//! leave in revision order — but only with the non-waiting
//! [`Outbound::send_now`](super::outbound::Outbound::send_now): nothing awaits the
//! outbound queue while the state lock is held (a full queue would otherwise wedge
//! dispatch, heartbeats and cleanup). [`Runtime::apply`] is synchronous for that reason.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::{Mutex, Notify, watch};
use tokio::time::Instant;

use super::admission::{Admission, Effect};
use super::config::RuntimeConfig;
use super::outbound::Outbound;
use super::run::{self, RunCtx};
use super::workspace_ops::{self, PrepTransfer, WriteOp};
use crate::core_runtime::adapter::{AdapterError, HarnessAdapter, RUN_EVENT_QUEUE};
use crate::core_runtime::wire::{
    Direction, ExecutionStart, Frame, Message, MessageType, PreparationRequestId, RunId,
    WorkspaceTarget,
};
use crate::core_runtime::workspace::Workspace;
use crate::wire::WireError;

/// WebSocket close code for a frame that does not decode (RFC 6455 "invalid frame
/// payload data").
pub const CLOSE_INVALID_PAYLOAD: u16 = 1007;

/// WebSocket close code for an over-size frame (RFC 6455 "message too big").
pub const CLOSE_TOO_BIG: u16 = 1009;

/// WebSocket close code of the orderly close after `device_shutdown`.
pub const CLOSE_NORMAL: u16 = 1000;

/// Close reason after `device_shutdown`.
pub const SHUTDOWN_REASON: &str = "device_shutdown";

/// WebSocket close code of the orderly close after a process shutdown (RFC 6455 "going
/// away").
pub const CLOSE_GOING_AWAY: u16 = 1001;

/// Close reason after a process shutdown (SIGTERM or SIGINT).
pub const PROCESS_SHUTDOWN_REASON: &str = "process_shutdown";

/// What began the shutdown; it decides how the WebSocket is closed once every
/// Executor is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownCause {
    /// Core's `device_shutdown`: close 1000 `device_shutdown`.
    DeviceShutdown,
    /// A stop signal, or a connection error that needs operator correction: close 1001
    /// `process_shutdown` (when a connection is open).
    ProcessShutdown,
}

impl ShutdownCause {
    /// The close code and reason (before the profile's prefix) of the final Close.
    pub fn close(self) -> (u16, &'static str) {
        match self {
            Self::DeviceShutdown => (CLOSE_NORMAL, SHUTDOWN_REASON),
            Self::ProcessShutdown => (CLOSE_GOING_AWAY, PROCESS_SHUTDOWN_REASON),
        }
    }
}

/// Close reason for a binary WebSocket message (the protocol is JSON text only).
pub const BINARY_REASON: &str = "binary_message";

/// Why the receive loop must close the WebSocket: close code and reason (the
/// [`WireError::code`] of the offending frame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseWith {
    /// WebSocket close code.
    pub code: u16,
    /// Close reason.
    pub reason: String,
}

impl CloseWith {
    /// The close a malformed frame earns: 1009 for `frame_too_large`, else 1007.
    pub fn from_wire(err: &WireError) -> Self {
        let code = match err {
            WireError::FrameTooLarge { .. } => CLOSE_TOO_BIG,
            _ => CLOSE_INVALID_PAYLOAD,
        };
        Self {
            code,
            reason: err.code().to_string(),
        }
    }
}

/// Progress of `device_shutdown`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownPhase {
    /// Serving.
    Running,
    /// Closing Executors (serially, retrying failures).
    Draining,
    /// Every Executor is closed: close the WebSocket with 1000 and exit 0.
    Done,
}

/// State of the current physical connection.
#[derive(Debug)]
pub struct Conn {
    /// Connection generation (increases with every connection).
    pub generation: u64,
    /// Its outbound queue.
    pub out: Outbound,
    /// Runs started on this connection and not yet finished.
    pub runs: HashMap<RunId, Arc<RunCtx>>,
    /// The open `runtime_prepare` transfer (one per connection).
    pub prep_transfer: Option<PrepTransfer>,
    /// Open `workspace_write` transfers by operation ID.
    pub writes: HashMap<String, WriteOp>,
    /// Pending `workspace_read` / `workspace_export` operation IDs.
    pub pending_ops: HashSet<String>,
    /// Owners (Executors) whose reads stopped after an ambiguous read.
    pub stopped_owners: HashSet<crate::core_runtime::wire::ExecutorId>,
}

/// Mutable service state, behind one async lock.
#[derive(Debug)]
pub struct State {
    /// Admission records and Executors.
    pub admission: Admission,
    /// The current connection, if any.
    pub conn: Option<Conn>,
    /// Generation counter.
    pub generation: u64,
}

impl State {
    /// The current connection if its generation is `generation`.
    pub fn conn_at(&mut self, generation: u64) -> Option<&mut Conn> {
        self.conn.as_mut().filter(|c| c.generation == generation)
    }
}

/// The process-wide Runtime service.
pub struct Runtime {
    /// Launch configuration.
    pub config: Arc<RuntimeConfig>,
    /// The Harness adapter.
    pub adapter: Arc<dyn HarnessAdapter>,
    /// The bound workspace.
    pub workspace: Arc<Workspace>,
    /// Service state.
    pub state: Mutex<State>,
    cleanup_wake: Notify,
    shutdown: watch::Sender<ShutdownPhase>,
    shutdown_cause: std::sync::OnceLock<ShutdownCause>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

impl Runtime {
    /// Builds the service and starts its serial cleanup worker.
    pub fn start(
        config: RuntimeConfig,
        adapter: Arc<dyn HarnessAdapter>,
        workspace: Workspace,
    ) -> Arc<Self> {
        let admission = Admission::new(
            config.limits,
            config.timers.admission_expiry,
            config.timers.cleanup_retry,
            config.environment.clone(),
            config.agent_kinds.clone(),
        )
        .with_profile(config.profile.clone());
        let (shutdown, _) = watch::channel(ShutdownPhase::Running);
        let rt = Arc::new(Self {
            config: Arc::new(config),
            adapter,
            workspace: Arc::new(workspace),
            state: Mutex::new(State {
                admission,
                conn: None,
                generation: 0,
            }),
            cleanup_wake: Notify::new(),
            shutdown,
            shutdown_cause: std::sync::OnceLock::new(),
        });
        tokio::spawn(cleanup_worker(rt.clone()));
        rt
    }

    /// Watches the shutdown progress.
    pub fn shutdown_phase(&self) -> watch::Receiver<ShutdownPhase> {
        self.shutdown.subscribe()
    }

    /// What began the shutdown (`DeviceShutdown` when none began).
    pub fn shutdown_cause(&self) -> ShutdownCause {
        self.shutdown_cause
            .get()
            .copied()
            .unwrap_or(ShutdownCause::DeviceShutdown)
    }

    /// Installs a new connection; returns its generation.
    pub async fn connection_opened(&self, out: Outbound) -> u64 {
        let mut st = self.state.lock().await;
        st.generation += 1;
        let generation = st.generation;
        st.conn = Some(Conn {
            generation,
            out,
            runs: HashMap::new(),
            prep_transfer: None,
            writes: HashMap::new(),
            pending_ops: HashSet::new(),
            stopped_owners: HashSet::new(),
        });
        generation
    }

    /// The connection `generation` ended: drop every connection-local route and record
    /// (nothing is replayed); Runs, preparations and cleanup keep going.
    pub async fn connection_closed(self: &Arc<Self>, generation: u64) {
        let mut st = self.state.lock().await;
        if st.conn.as_ref().is_some_and(|c| c.generation == generation) {
            st.conn = None;
            let effects = st.admission.connection_lost(Instant::now());
            self.apply(&mut st, effects);
        }
    }

    /// Performs admission effects. Called with the state lock held, so statuses are
    /// queued in revision order; it never waits (statuses go through
    /// [`Outbound::send_now`](super::outbound::Outbound::send_now), native work is
    /// spawned), so holding the lock across it cannot wedge on a full outbound queue.
    pub fn apply(self: &Arc<Self>, st: &mut State, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Status { request_id, status } => {
                    if let Some(conn) = &st.conn {
                        conn.out
                            .send_now(request_id, Message::PreparationStatus(status));
                    }
                }
                Effect::NativePrepare(request) => {
                    tokio::spawn(native_prepare(self.clone(), request));
                }
                Effect::NativeStart(request) => {
                    let generation = st.conn.as_ref().map(|c| c.generation).unwrap_or(0);
                    tokio::spawn(native_start(self.clone(), generation, request));
                }
                Effect::ArmExpiry(deadline) => {
                    let rt = self.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep_until(deadline).await;
                        let mut st = rt.state.lock().await;
                        let effects = st.admission.expire_due(Instant::now());
                        rt.apply(&mut st, effects);
                    });
                }
                Effect::WakeCleanup => self.cleanup_wake.notify_one(),
            }
        }
    }

    /// Handles one text frame from Core on connection `generation`.
    ///
    /// # Errors
    /// [`CloseWith`] when the frame is malformed: the caller closes the WebSocket
    /// with that code and reason and reconnects.
    pub async fn dispatch(
        self: &Arc<Self>,
        generation: u64,
        bytes: &[u8],
    ) -> Result<(), CloseWith> {
        // Workspace requests whose Envelope decodes get typed rejections instead of a
        // transport close ("Workspace operations": bounds before admission).
        let envelope = crate::core_runtime::wire::frame::decode_envelope(bytes)
            .map_err(|e| CloseWith::from_wire(&e))?;
        match MessageType::parse(&envelope.kind) {
            Some(MessageType::WorkspaceRead) | Some(MessageType::WorkspaceExport) => {
                workspace_ops::dispatch_read_or_export(self, generation, envelope).await;
                return Ok(());
            }
            Some(MessageType::WorkspaceWrite) => {
                workspace_ops::dispatch_write(self, generation, envelope).await;
                return Ok(());
            }
            _ => {}
        }
        let frame =
            Frame::decode(bytes, Direction::CoreToRuntime).map_err(|e| CloseWith::from_wire(&e))?;
        let id = frame.id;
        let now = Instant::now();
        match frame.message {
            Message::ExecutionPrepare(request) => {
                check_request_id(&id)?;
                let mut st = self.state.lock().await;
                let effects = st.admission.prepare(&id, request, now);
                self.apply(&mut st, effects);
            }
            Message::ExecutionStart(request) => {
                check_request_id(&id)?;
                self.execution_start(generation, &id, request).await;
            }
            Message::ExecutionRelease(request) => {
                check_request_id(&id)?;
                let mut st = self.state.lock().await;
                let effects = st.admission.release(&id, request, now);
                self.apply(&mut st, effects);
            }
            Message::EnvironmentQuiesce(fence) => {
                let mut st = self.state.lock().await;
                let result = st.admission.quiesce(&id, &fence);
                if let Some(conn) = st.conn_at(generation) {
                    conn.out.send_now(id, Message::EnvironmentQuiesced(result));
                }
            }
            Message::EnvironmentResume(fence) => {
                let mut st = self.state.lock().await;
                let result = st.admission.resume(&id, &fence);
                if let Some(conn) = st.conn_at(generation) {
                    conn.out.send_now(id, Message::EnvironmentResumed(result));
                }
            }
            Message::DeviceShutdown(_) => self.begin_shutdown(ShutdownCause::DeviceShutdown).await,
            Message::RuntimePrepare(request) => {
                workspace_ops::runtime_prepare(self, generation, id, request).await;
            }
            Message::PromptSteer(request) => run::prompt_steer(self, generation, id, request).await,
            Message::PromptCancel(request) => {
                run::prompt_cancel(self, generation, id, request).await
            }
            Message::PermissionDecision(decision) => {
                run::permission_decision(self, generation, id, decision).await;
            }
            Message::PromptForUserChoiceDecision(decision) => {
                run::user_choice_decision(self, generation, id, decision).await;
            }
            Message::FunctionResult(result) => {
                run::function_result(self, generation, id, result).await
            }
            // Direction was checked by `Frame::decode`; workspace types were routed above.
            other => {
                return Err(CloseWith {
                    code: CLOSE_INVALID_PAYLOAD,
                    reason: WireError::WrongDirection(other.message_type().as_str().to_string())
                        .code()
                        .to_string(),
                });
            }
        }
        Ok(())
    }

    async fn execution_start(self: &Arc<Self>, generation: u64, id: &str, request: ExecutionStart) {
        let mut st = self.state.lock().await;
        let write_open = match (
            st.admission.handle_owner(&request.admission_handle),
            st.conn_at(generation),
        ) {
            (Some(owner), Some(conn)) => conn
                .writes
                .values()
                .any(|w| w.executor_id == owner.executor_id),
            _ => false,
        };
        let effects = st.admission.start(id, request, write_open, Instant::now());
        self.apply(&mut st, effects);
    }

    /// Closes the current connection, if any, as `cause` says without waiting for the
    /// Executors (a stop signal under a profile that does not keep the connection,
    /// CR-CONN-025); the connection loop then no longer reconnects.
    pub async fn close_connection(&self, cause: ShutdownCause) {
        let st = self.state.lock().await;
        if let Some(conn) = &st.conn {
            let (code, reason) = cause.close();
            conn.out
                .close(code, self.config.profile.close_reason(reason));
        }
    }

    /// `device_shutdown` or a process shutdown (`cause`): refuse new work, close every
    /// Executor serially (retrying failed closes every `cleanup_retry`, forever), then
    /// report [`ShutdownPhase::Done`]; the connection then closes as `cause` says.
    pub async fn begin_shutdown(self: &Arc<Self>, cause: ShutdownCause) {
        let mut st = self.state.lock().await;
        if st.admission.shutting_down() {
            return;
        }
        // The first cause stays: a signal during a `device_shutdown` still ends it 1000.
        let _ = self.shutdown_cause.set(cause);
        tracing::info!("device_shutdown: closing every Executor");
        let effects = st.admission.begin_shutdown(Instant::now());
        self.shutdown.send_replace(ShutdownPhase::Draining);
        self.apply(&mut st, effects);
        self.check_drained(&st);
    }

    fn check_drained(&self, st: &State) {
        if st.admission.shutting_down() && st.admission.is_drained() {
            self.shutdown.send_if_modified(|phase| {
                let changed = *phase != ShutdownPhase::Done;
                *phase = ShutdownPhase::Done;
                changed
            });
        }
    }
}

/// Request IDs (`Envelope.id` of prepare, start, release) are bounded identifiers.
fn check_request_id(id: &str) -> Result<(), CloseWith> {
    PreparationRequestId::new(id)
        .map(|_| ())
        .map_err(|reason| CloseWith {
            code: CLOSE_INVALID_PAYLOAD,
            reason: WireError::invalid("$.id", reason).code().to_string(),
        })
}

/// Native preparation, bounded by the admission expiry (a preparation that cannot
/// become ready within it is failed, and its resource closed).
async fn native_prepare(rt: Arc<Runtime>, request: crate::core_runtime::adapter::NativePrepare) {
    let executor_id = request.executor_id.clone();
    let budget = rt.config.timers.admission_expiry;
    let result = match tokio::time::timeout(budget, rt.adapter.prepare(request)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(AdapterError::Unknown(reason))) => {
            tracing::warn!(%executor_id, "native preparation outcome unknown: {reason}");
            Err(true)
        }
        Ok(Err(err)) => {
            tracing::warn!(%executor_id, code = err.code(), "native preparation failed: {err}");
            Err(false)
        }
        Err(_) => {
            tracing::warn!(%executor_id, "native preparation exceeded its budget");
            Err(true)
        }
    };
    let mut st = rt.state.lock().await;
    let effects = st
        .admission
        .prepare_finished(&executor_id, result, Instant::now());
    rt.apply(&mut st, effects);
    rt.check_drained(&st);
}

/// Native start; on success the Run is routed on the connection it was started on
/// and its event pump starts (after `started` was queued).
async fn native_start(
    rt: Arc<Runtime>,
    generation: u64,
    request: crate::core_runtime::adapter::NativeStart,
) {
    let executor_id = request.executor_id.clone();
    let run_id = request.run_id.clone();
    let (events_tx, events_rx) = tokio::sync::mpsc::channel(RUN_EVENT_QUEUE);
    let budget = rt.config.timers.admission_expiry;
    let ok = match tokio::time::timeout(budget, rt.adapter.start(request, events_tx)).await {
        Ok(Ok(())) => true,
        Ok(Err(err)) => {
            tracing::warn!(%run_id, code = err.code(), "native start failed: {err}");
            false
        }
        Err(_) => {
            tracing::warn!(%run_id, "native start exceeded its budget");
            false
        }
    };
    let mut st = rt.state.lock().await;
    let effects = st
        .admission
        .start_finished(&executor_id, &run_id, ok, Instant::now());
    let started = ok
        && st
            .admission
            .executor(&executor_id)
            .is_some_and(|e| e.state == super::admission::ExecutorState::Active(run_id.clone()));
    let mut ctx = None;
    let out = st.conn_at(generation).map(|c| c.out.clone());
    if started && let Some(executor) = st.admission.executor(&executor_id) {
        let run = Arc::new(RunCtx::new(run_id.clone(), executor, out));
        if let Some(conn) = st.conn_at(generation) {
            conn.runs.insert(run_id.clone(), run.clone());
        }
        ctx = Some(run);
    }
    rt.apply(&mut st, effects);
    rt.check_drained(&st);
    drop(st);
    if let Some(run) = ctx {
        tokio::spawn(run::pump(rt.clone(), generation, run, events_rx));
    }
}

/// The serial cleanup worker: closes one Executor at a time, retrying failures every
/// `cleanup_retry` ("keeps the targets whose close failed, and allows a later serial
/// retry"). A close attempt is bounded by `cancel_settle`; a timeout is a failure.
async fn cleanup_worker(rt: Arc<Runtime>) {
    loop {
        let next = {
            let mut st = rt.state.lock().await;
            st.admission.take_due_close(Instant::now())
        };
        match next {
            Ok(executor_id) => {
                let budget = rt.config.timers.cancel_settle;
                let ok = match tokio::time::timeout(budget, rt.adapter.close_executor(&executor_id))
                    .await
                {
                    Ok(Ok(())) => true,
                    Ok(Err(err)) => {
                        tracing::warn!(%executor_id, code = err.code(), "executor close failed; will retry: {err}");
                        false
                    }
                    Err(_) => {
                        tracing::warn!(%executor_id, "executor close exceeded its budget; will retry");
                        false
                    }
                };
                let mut st = rt.state.lock().await;
                let effects = st
                    .admission
                    .close_finished(&executor_id, ok, Instant::now());
                rt.apply(&mut st, effects);
                rt.check_drained(&st);
            }
            Err(Some(at)) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = rt.cleanup_wake.notified() => {}
                }
            }
            Err(None) => rt.cleanup_wake.notified().await,
        }
    }
}

/// Resolves a workspace target on connection `generation` to its owner.
pub fn resolve_target(
    st: &mut State,
    generation: u64,
    target: &WorkspaceTarget,
) -> Option<(super::admission::Owner, Option<Arc<RunCtx>>)> {
    match target {
        WorkspaceTarget::AdmissionHandle(handle) => {
            let owner = st.admission.handle_owner(handle)?;
            let conn = st.conn_at(generation)?;
            let run = match &owner.run_id {
                Some(run_id) => Some(conn.runs.get(run_id)?.clone()),
                None => None,
            };
            Some((owner, run))
        }
        WorkspaceTarget::RunId(run_id) => {
            let run = st.conn_at(generation)?.runs.get(run_id)?.clone();
            let executor = st.admission.executor(&run.executor_id)?;
            Some((
                super::admission::Owner {
                    executor_id: executor.id.clone(),
                    environment_id: executor.environment_id.clone(),
                    capabilities: run.capabilities,
                    read_only: executor.read_only,
                    run_id: Some(run_id.clone()),
                },
                Some(run),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::config::DEFAULT_ENVIRONMENT_ID;
    use super::super::test_support::Harness;
    use super::*;
    use crate::core_runtime::wire::DeviceShutdown;

    /// Regression (wedged dispatch): statuses and fence results used to be awaited on
    /// the outbound queue while holding the state lock, so a full queue blocked every
    /// task needing the lock. They are queued without waiting, in lock order, even when
    /// the queue is full and another producer is waiting for room.
    #[tokio::test]
    async fn statuses_and_fence_results_never_wait_on_a_full_queue() {
        let mut h = Harness::start(1).await;
        let _handle = h.ready_handle("prep-1").await;
        // Fill the one-byte budget; a second producer waits for room.
        assert!(
            h.out
                .send("filler", Message::DeviceShutdown(DeviceShutdown {}))
                .await
        );
        let waiting = tokio::spawn({
            let out = h.out.clone();
            async move {
                out.send("waiter", Message::DeviceShutdown(DeviceShutdown {}))
                    .await
            }
        });
        let fence = json!({ "environment_id": DEFAULT_ENVIRONMENT_ID });
        h.core(json!({ "type": "environment_quiesce", "id": "susp-1", "payload": fence }))
            .await;
        h.core(json!({ "type": "environment_resume", "id": "susp-1", "payload": fence }))
            .await;
        assert!(h.rt.state.try_lock().is_ok());
        let mut seen = Vec::new();
        for _ in 0..4 {
            let frame = h.next().await;
            seen.push(format!(
                "{} {}",
                frame["type"].as_str().unwrap(),
                frame["id"]
            ));
        }
        assert!(waiting.await.unwrap());
        assert_eq!(
            seen,
            [
                "device_shutdown \"filler\"",
                "environment_quiesced \"susp-1\"",
                "environment_resumed \"susp-1\"",
                "device_shutdown \"waiter\"",
            ]
        );
    }
}
