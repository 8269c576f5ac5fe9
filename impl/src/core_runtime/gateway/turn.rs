//! Scheduling and the five-step Turn execution ("Preparation and execution order",
//! "Active-input receipts", "Faults, retries and cleanup").
//!
//! The scheduler selects a connected device whose latest heartbeat declares the
//! Agent's kind, available, and passes the capability table; it repeats the check
//! right before the durable claim. A claimed Turn is driven by one task:
//!
//! 1. (local Environments, once per connection) `runtime_prepare` `initialize`;
//! 2. `execution_prepare` (no input): `ready` → step 3; `rejected`
//!    `preparation_capacity` → back to `queued` after `preparation_retry`; any other
//!    rejection or failure → `failed`/`preparation_failed`, never replayed;
//! 3. `starting` is recorded durably, then `execution_start` with the Turn's input;
//! 4. Run events go into the Turn's durable event log until `done`;
//! 5. cancel: `prompt_cancel`, the receipt owns the outcome; no receipt within
//!    `cancel_confirm` → `failed`/`cancel_unconfirmed`.
//!
//! Connection loss before `started` → `failed`/`delivery_unknown`; after →
//! `failed`/`event_stream_incomplete`. No terminal event is ever invented.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::admission::{
    self, AdmissionContext, AdmissionRefusal, AgentDefinition, DeviceChoice, check_admission,
    execution_configuration,
};
use super::connection::{DeviceConnection, RouteKind};
use super::{
    ACTIVE_TURNS_MAX, Core, EVENT_BATCH_MAX, SCHEDULER_BATCH, SCHEDULER_IDLE, TURN_QUEUE_MAX,
    TurnMsg, now_ms,
};
use crate::core_runtime::store::outcome::state_from_done;
use crate::core_runtime::store::{
    CoreErrorCode, EnvironmentKind, InputState, InteractionKind, InteractionRecord,
    InteractionState, TurnOutcome, TurnRecord, TurnState,
};
use crate::core_runtime::wire::limits::INPUT_MESSAGES_MAX;
use crate::core_runtime::wire::{
    AckOperation, AgentKindDeclaration, ContentPart, ControlOperation, DeliveryId,
    ExecutionPrepare, ExecutionRelease, ExecutionStart, Frame, FunctionResult, Message,
    MessageInput, NativeSessionId, PermissionDecision, PreparationErrorCode, PreparationStatus,
    PromptCancel, PromptForUserChoiceDecision, PromptSteer, RunId, RuntimePrepare,
    RuntimePrepareResult, SteerReceipt, Uuid,
};
use crate::wire::bounded::BoundedVec;

/// Bound on waiting for `runtime_prepare` `initialized` (Core policy; the spec names no
/// timer). Expiry fails the Turn with `delivery_unknown`.
pub const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(30);

/// The frozen Session configuration stored at Session creation.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrozenSession {
    /// The Agent definition at Session creation (MCP origins frozen).
    pub agent: AgentDefinition,
    /// Environment type.
    pub environment_type: EnvironmentKind,
}

/// Whether an ordered input carries image content.
pub fn has_images(input: &[MessageInput]) -> bool {
    input.iter().any(|m| {
        m.content
            .iter()
            .any(|c| matches!(c, ContentPart::Image { .. }))
    })
}

fn decode_input(value: &Value) -> Option<BoundedVec<MessageInput, INPUT_MESSAGES_MAX>> {
    crate::wire::strict::from_value_strict(value.clone()).ok()
}

/// The handle and revision a preparation status carries; `None` for `rejected`, which
/// "does not replace the handle's current revision".
fn status_revision(status: &PreparationStatus) -> Option<(&str, u64)> {
    match status {
        PreparationStatus::Preparing {
            admission_handle,
            revision,
        }
        | PreparationStatus::Ready {
            admission_handle,
            revision,
            ..
        }
        | PreparationStatus::Starting {
            admission_handle,
            revision,
            ..
        }
        | PreparationStatus::Started {
            admission_handle,
            revision,
            ..
        }
        | PreparationStatus::Released {
            admission_handle,
            revision,
        }
        | PreparationStatus::Expired {
            admission_handle,
            revision,
        }
        | PreparationStatus::Failed {
            admission_handle,
            revision,
            ..
        } => Some((admission_handle.as_str(), *revision)),
        PreparationStatus::Rejected { .. } => None,
    }
}

/// Whether `status` is a new observation for the request whose handle and last applied
/// revision are `tracked` (`None` before its first status, which names the request's
/// handle): "ignore old or duplicate revisions, and never apply a status to another
/// handle". A `rejected` control operation carries no revision and always applies.
fn is_fresh(tracked: Option<&(String, u64)>, status: &PreparationStatus) -> bool {
    match status_revision(status) {
        None => true,
        Some((h, r)) => tracked.is_none_or(|(th, tr)| th == h && r > *tr),
    }
}

/// The scheduler: claims queued Turns on suitable devices, forever.
pub async fn scheduler(core: Arc<Core>) {
    loop {
        if let Err(err) = schedule_once(&core).await {
            tracing::error!(code = err.code(), "scheduler pass failed: {err}");
        }
        tokio::select! {
            _ = core.wake.notified() => {}
            _ = tokio::time::sleep(SCHEDULER_IDLE) => {}
        }
    }
}

struct Prepared {
    turn: TurnRecord,
    frozen: FrozenSession,
    environment_id: String,
    native_session: Option<String>,
    ctx: AdmissionContext,
}

async fn load(
    core: &Core,
    turn: TurnRecord,
) -> Result<Prepared, crate::core_runtime::store::StoreError> {
    let session_id = turn.session_id.clone();
    let session = core.store.call(move |s| s.session(&session_id)).await?;
    let frozen: FrozenSession = serde_json::from_value(session.frozen.clone())
        .map_err(|e| crate::core_runtime::store::StoreError::Corrupt(e.to_string()))?;
    let images = decode_input(&turn.input).is_some_and(|i| has_images(&i));
    let ctx = AdmissionContext::for_execution(
        &frozen.agent,
        frozen.environment_type,
        core.config.profile(frozen.agent.agent_kind.as_str()),
        session.started_turns > 0 && session.native_session_id.is_none(),
        images,
    );
    Ok(Prepared {
        turn,
        frozen,
        environment_id: session.environment_id,
        native_session: session.native_session_id,
        ctx,
    })
}

fn select_device(core: &Core, p: &Prepared) -> DeviceChoice<Arc<DeviceConnection>> {
    let kind = p.frozen.agent.agent_kind.as_str();
    let mut devices: Vec<Arc<DeviceConnection>> = core
        .devices
        .lock()
        .map(|d| d.values().cloned().collect())
        .unwrap_or_default();
    devices.sort_by(|a, b| a.device_id.cmp(&b.device_id));
    let candidates = devices.into_iter().filter_map(|conn| {
        let decl = conn.declaration(kind)?;
        Some((conn, decl))
    });
    admission::select_device(candidates, &p.ctx)
}

async fn schedule_once(core: &Arc<Core>) -> Result<(), crate::core_runtime::store::StoreError> {
    let now = now_ms();
    let queued = core
        .store
        .call(move |s| s.claimable_turns(now, SCHEDULER_BATCH))
        .await?;
    for turn in queued {
        if core.turns.lock().map(|t| t.len()).unwrap_or(usize::MAX) >= ACTIVE_TURNS_MAX {
            break;
        }
        if core
            .files_reserved
            .lock()
            .is_ok_and(|set| set.contains(&turn.session_id))
        {
            // A Files operation holds the Session's scheduling reservation.
            continue;
        }
        let p = load(core, turn).await?;
        let (conn, decl) = match select_device(core, &p) {
            DeviceChoice::Wait => continue,
            DeviceChoice::Refuse(refusal) => {
                // "unsupported capability: reject before starting the operation; never
                // fall back to another Harness".
                let outcome = TurnOutcome {
                    error_code: Some(CoreErrorCode::UnsupportedCapability),
                    missing_capability: match &refusal {
                        AdmissionRefusal::Missing { capability, .. } => {
                            Some(capability.to_string())
                        }
                        AdmissionRefusal::Unavailable => None,
                    },
                    ..TurnOutcome::default()
                };
                let id = p.turn.turn_id.clone();
                core.store
                    .call(move |s| s.finish_turn(&id, TurnState::Failed, &outcome, now_ms()))
                    .await?;
                continue;
            }
            DeviceChoice::Admit(conn, decl) => (conn, decl),
        };
        // Final pre-claim check against the connection's current snapshot.
        let Some(latest) = conn.declaration(p.frozen.agent.agent_kind.as_str()) else {
            continue;
        };
        if conn.is_closed() || latest != decl || check_admission(&latest, &p.ctx).is_err() {
            continue;
        }
        let run_id = format!("run-{}", Uuid::random());
        let (id, device, epoch, run) = (
            p.turn.turn_id.clone(),
            conn.device_id.clone(),
            conn.epoch,
            run_id.clone(),
        );
        let claimed = core
            .store
            .call(move |s| s.claim_turn(&id, &device, epoch, &run, now_ms()))
            .await?;
        if !claimed {
            continue;
        }
        let (tx, rx) = mpsc::channel(TURN_QUEUE_MAX);
        if let Ok(mut turns) = core.turns.lock() {
            turns.insert(p.turn.turn_id.clone(), tx);
        }
        tokio::spawn(drive(core.clone(), p, conn, decl, run_id, rx));
    }
    Ok(())
}

/// A [`TurnMsg`] with its frame unboxed, for matching (short-lived, on the stack).
#[allow(clippy::large_enum_variant)]
enum Unboxed {
    Frame(Frame),
    ConnectionLost,
    Overflow,
    Wake,
}

impl From<TurnMsg> for Unboxed {
    fn from(msg: TurnMsg) -> Self {
        match msg {
            TurnMsg::Frame(frame) => Unboxed::Frame(*frame),
            TurnMsg::ConnectionLost => Unboxed::ConnectionLost,
            TurnMsg::Overflow => Unboxed::Overflow,
            TurnMsg::Wake => Unboxed::Wake,
        }
    }
}

/// How a Turn task ended.
#[expect(
    clippy::large_enum_variant,
    reason = "one short-lived value per Turn task, returned once; boxing buys nothing"
)]
enum End {
    Finish(TurnState, TurnOutcome),
    Requeue,
}

struct Driver {
    core: Arc<Core>,
    conn: Arc<DeviceConnection>,
    turn_id: String,
    run_id: String,
    prep_id: String,
    admitted: AgentKindDeclaration,
    outcome: TurnOutcome,
    done_seen: Option<crate::core_runtime::wire::Outcome>,
    cancel: Option<(String, Instant)>,
    input_in_flight: Option<(String, Option<Instant>)>,
    steer_blocked: bool,
    cancel_marker: bool,
    sent_answers: std::collections::HashSet<(InteractionKind, String)>,
}

async fn drive(
    core: Arc<Core>,
    p: Prepared,
    conn: Arc<DeviceConnection>,
    admitted: AgentKindDeclaration,
    run_id: String,
    mut rx: mpsc::Receiver<TurnMsg>,
) {
    let turn_id = p.turn.turn_id.clone();
    let mut d = Driver {
        core: core.clone(),
        conn: conn.clone(),
        turn_id: turn_id.clone(),
        prep_id: format!("prep-{}", Uuid::random()),
        run_id,
        admitted,
        outcome: p.turn.outcome.clone(),
        done_seen: None,
        cancel: None,
        input_in_flight: None,
        steer_blocked: false,
        cancel_marker: false,
        sent_answers: Default::default(),
    };
    let end = d.run(&p, &mut rx).await;
    conn.unroute_turn(&turn_id);
    if let Ok(mut turns) = core.turns.lock() {
        turns.remove(&turn_id);
    }
    let id = turn_id.clone();
    let result = match end {
        End::Finish(state, outcome) => {
            core.store
                .call(move |s| s.finish_turn(&id, state, &outcome, now_ms()))
                .await
        }
        End::Requeue => {
            let retry = core.config.timers.preparation_retry;
            let at = now_ms() + retry.as_millis() as i64;
            let r = core
                .store
                .call(move |s| s.requeue_turn(&id, at, now_ms()))
                .await;
            if matches!(r, Ok(TurnState::Queued)) {
                let waker = core.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(retry).await;
                    waker.wake.notify_one();
                });
            }
            r.map(|_| ())
        }
    };
    if let Err(err) = result {
        tracing::error!(turn_id = %turn_id, code = err.code(), "cannot record the Turn's end: {err}");
    }
    core.wake.notify_one();
}

impl Driver {
    fn fail(&self, code: CoreErrorCode) -> End {
        let mut outcome = self.outcome.clone();
        outcome.error_code = Some(code);
        End::Finish(TurnState::Failed, outcome)
    }

    fn prep_failed(&self, code: PreparationErrorCode) -> End {
        let mut outcome = self.outcome.clone();
        outcome.error_code = Some(CoreErrorCode::PreparationFailed);
        outcome.preparation_error_code = serde_json::to_value(code)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string));
        End::Finish(TurnState::Failed, outcome)
    }

    async fn turn(&self) -> Option<TurnRecord> {
        let id = self.turn_id.clone();
        self.core.store.call(move |s| s.turn(&id)).await.ok()
    }

    async fn run(&mut self, p: &Prepared, rx: &mut mpsc::Receiver<TurnMsg>) -> End {
        let conn = self.conn.clone();
        if !conn.route(RouteKind::Preparation, &self.prep_id, &self.turn_id)
            || !conn.route(RouteKind::Run, &self.run_id, &self.turn_id)
        {
            // Nothing was sent: the claim is undone, the Turn stays queued.
            return End::Requeue;
        }
        let Ok(env_uuid) = Uuid::new(p.environment_id.clone()) else {
            return self.prep_failed(PreparationErrorCode::InvalidBinding);
        };
        // Step 0: initialize the Environment binding on this connection.
        if p.frozen.environment_type != EnvironmentKind::None
            && !conn.initialized(&p.environment_id)
        {
            let transfer = format!("init-{}", Uuid::random());
            conn.route(RouteKind::Transfer, &transfer, &self.turn_id);
            let frame = Frame::new(
                transfer,
                Message::RuntimePrepare(RuntimePrepare::Initialize {
                    environment_id: env_uuid.clone(),
                }),
            );
            if !conn.send(&frame).await {
                // The frame never entered the send queue: nothing was delivered.
                return End::Requeue;
            }
            let deadline = Instant::now() + INITIALIZE_TIMEOUT;
            loop {
                let msg = tokio::select! {
                    m = rx.recv() => m.map(Unboxed::from),
                    _ = tokio::time::sleep_until(deadline) => return self.fail(CoreErrorCode::DeliveryUnknown),
                };
                match msg {
                    Some(Unboxed::Frame(Frame {
                        message: Message::RuntimePrepareResult(r),
                        ..
                    })) => match r {
                        RuntimePrepareResult::Initialized { .. } => {
                            conn.mark_initialized(&p.environment_id);
                            break;
                        }
                        RuntimePrepareResult::Failed { code } => {
                            let mut outcome = self.outcome.clone();
                            outcome.error_code = Some(CoreErrorCode::PreparationFailed);
                            outcome.preparation_error_code = serde_json::to_value(code)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string));
                            return End::Finish(TurnState::Failed, outcome);
                        }
                        _ => {}
                    },
                    Some(Unboxed::ConnectionLost | Unboxed::Overflow) | None => {
                        return self.fail(CoreErrorCode::DeliveryUnknown);
                    }
                    _ => {}
                }
            }
        }
        // Step 1: execution_prepare with the immutable configuration and no input.
        let native = p
            .native_session
            .as_deref()
            .and_then(|n| NativeSessionId::new(n).ok());
        let configuration = execution_configuration(
            &p.frozen.agent,
            p.frozen.environment_type,
            &env_uuid,
            &self.admitted.capabilities,
            native.as_ref(),
        );
        let Ok(session_uuid) = Uuid::new(p.turn.session_id.clone()) else {
            return self.prep_failed(PreparationErrorCode::InvalidBinding);
        };
        let prepare = Frame::new(
            self.prep_id.clone(),
            Message::ExecutionPrepare(ExecutionPrepare {
                session_id: session_uuid,
                agent_kind: self.admitted.agent_kind.clone(),
                configuration,
            }),
        );
        if !conn.send(&prepare).await {
            // The frame never entered the send queue: nothing was delivered.
            return End::Requeue;
        }
        // The handle and last revision applied: "Each handle's `revision` orders its
        // status observations: ignore old or duplicate revisions, and never apply a
        // status to another handle."
        let mut handle: Option<(String, u64)> = None;
        let (handle_id, executor, ready_revision) = loop {
            let Some(msg) = rx.recv().await.map(Unboxed::from) else {
                return self.fail(CoreErrorCode::DeliveryUnknown);
            };
            match msg {
                Unboxed::Frame(Frame {
                    message: Message::PreparationStatus(status),
                    ..
                }) => {
                    if !is_fresh(handle.as_ref(), &status) {
                        continue;
                    }
                    if let Some((h, r)) = status_revision(&status) {
                        handle = Some((h.to_string(), r));
                    }
                    match status {
                        PreparationStatus::Ready {
                            admission_handle,
                            revision,
                            executor_id,
                            ..
                        } => break (admission_handle, executor_id, revision),
                        PreparationStatus::Rejected {
                            operation: ControlOperation::Prepare,
                            error_code: PreparationErrorCode::PreparationCapacity,
                            ..
                        } => {
                            return End::Requeue;
                        }
                        PreparationStatus::Rejected { error_code, .. }
                        | PreparationStatus::Failed { error_code, .. } => {
                            return self.prep_failed(error_code);
                        }
                        PreparationStatus::Expired { .. } => {
                            return self.prep_failed(PreparationErrorCode::AdmissionExpired);
                        }
                        PreparationStatus::Preparing { .. }
                        | PreparationStatus::Released { .. }
                        | PreparationStatus::Starting { .. }
                        | PreparationStatus::Started { .. } => {}
                    }
                }
                Unboxed::ConnectionLost | Unboxed::Overflow => {
                    return self.fail(CoreErrorCode::DeliveryUnknown);
                }
                _ => {}
            }
        };
        // Abandoning before start: release the admission (step 4).
        if self.turn().await.is_some_and(|t| t.cancel_requested) {
            let release = Frame::new(
                self.prep_id.clone(),
                Message::ExecutionRelease(ExecutionRelease {
                    admission_handle: handle_id,
                }),
            );
            conn.send(&release).await;
            return End::Finish(TurnState::Cancelled, self.outcome.clone());
        }
        // Step 2: durable `starting`, then execution_start with the ordered input.
        let id = self.turn_id.clone();
        if self
            .core
            .store
            .call(move |s| s.advance_turn(&id, TurnState::Starting, now_ms()))
            .await
            .is_err()
        {
            return self.fail(CoreErrorCode::DeliveryUnknown);
        }
        let Some(input) = decode_input(&p.turn.input) else {
            return self.prep_failed(PreparationErrorCode::InvalidInput);
        };
        let Ok(run) = RunId::new(self.run_id.clone()) else {
            return self.fail(CoreErrorCode::DeliveryUnknown);
        };
        let start = Frame::new(
            self.prep_id.clone(),
            Message::ExecutionStart(ExecutionStart {
                executor_id: executor,
                admission_handle: handle_id.clone(),
                run_id: run,
                input,
            }),
        );
        if !conn.send(&start).await {
            return self.fail(CoreErrorCode::DeliveryUnknown);
        }
        let mut started = false;
        let mut tracked = (handle_id.to_string(), ready_revision);
        // A message taken from the queue while gathering a batch, handled next.
        let mut carried: Option<Unboxed> = None;
        // Steps 3 and 5: consume events, deliver input, cancel.
        loop {
            let msg = match carried.take() {
                Some(msg) => Some(msg),
                None => {
                    let deadline = self.next_deadline();
                    tokio::select! {
                        m = rx.recv() => m.map(Unboxed::from),
                        _ = async { match deadline { Some(at) => tokio::time::sleep_until(at).await, None => std::future::pending().await } } => {
                            if let Some(end) = self.on_deadline().await { return end; }
                            continue;
                        }
                    }
                }
            };
            let Some(msg) = msg else {
                return self.lost(started);
            };
            match msg {
                Unboxed::ConnectionLost | Unboxed::Overflow => return self.lost(started),
                Unboxed::Wake => {}
                // Group commit: the output events already queued behind this one are
                // stored with it in one transaction ("Load is part of correctness").
                Unboxed::Frame(frame) if self.is_output(&frame) => {
                    if !started {
                        // Output can race the status: a Run event proves the
                        // admission was transferred to this Run.
                        started = true;
                        self.mark_running().await;
                    }
                    let mut batch = vec![frame];
                    while batch.len() < EVENT_BATCH_MAX {
                        match rx.try_recv().map(Unboxed::from) {
                            Ok(Unboxed::Frame(next)) if self.is_output(&next) => batch.push(next),
                            Ok(other) => {
                                carried = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.store_output(&batch).await;
                }
                Unboxed::Frame(frame) => {
                    if let Message::PreparationStatus(status) = &frame.message {
                        if !is_fresh(Some(&tracked), status) {
                            continue;
                        }
                        if let Some((_, r)) = status_revision(status) {
                            tracked.1 = r;
                        }
                        match status {
                            PreparationStatus::Started { .. } if !started => {
                                started = true;
                                self.mark_running().await;
                            }
                            PreparationStatus::Rejected {
                                operation: ControlOperation::Start,
                                error_code,
                                ..
                            } if !started => {
                                return self.prep_failed(*error_code);
                            }
                            PreparationStatus::Failed { error_code, .. } if !started => {
                                return self.prep_failed(*error_code);
                            }
                            _ => {}
                        }
                    } else {
                        if !started && frame.id == self.run_id {
                            // Output can race the status: a Run event proves the
                            // admission was transferred to this Run.
                            started = true;
                            self.mark_running().await;
                        }
                        if let Some(end) = self.on_run_frame(frame).await {
                            return end;
                        }
                    }
                }
            }
            if (started || self.done_seen.is_some())
                && let Some(end) = self.on_wake().await
            {
                return end;
            }
        }
    }

    /// Records `running` durably (the admission moved to the Run).
    async fn mark_running(&self) {
        let id = self.turn_id.clone();
        if let Err(err) = self
            .core
            .store
            .call(move |s| s.advance_turn(&id, TurnState::Running, now_ms()))
            .await
        {
            tracing::warn!(turn_id = %self.turn_id, code = err.code(), "running not recorded: {err}");
        }
    }

    fn lost(&self, started: bool) -> End {
        if self.cancel.is_some() {
            return self.fail(CoreErrorCode::CancelUnconfirmed);
        }
        self.fail(if started {
            CoreErrorCode::EventStreamIncomplete
        } else {
            CoreErrorCode::DeliveryUnknown
        })
    }

    fn next_deadline(&self) -> Option<Instant> {
        let a = self.cancel.as_ref().map(|(_, at)| *at);
        let b = self.input_in_flight.as_ref().and_then(|(_, at)| *at);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    async fn on_deadline(&mut self) -> Option<End> {
        let now = Instant::now();
        if self.cancel.as_ref().is_some_and(|(_, at)| *at <= now) {
            return Some(self.fail(CoreErrorCode::CancelUnconfirmed));
        }
        if let Some((input_id, Some(at))) = self.input_in_flight.clone()
            && at <= now
        {
            // No `written` within the budget: the input outcome is unknown; it is
            // never redelivered and no later input goes to this Run.
            self.set_input(&input_id, InputState::Unknown, None).await;
            self.input_in_flight = None;
            self.steer_blocked = true;
        }
        None
    }

    async fn set_input(&self, input_id: &str, state: InputState, code: Option<String>) {
        let id = input_id.to_string();
        if let Err(err) = self
            .core
            .store
            .call(move |s| s.set_input_state(&id, state, code.as_deref()))
            .await
        {
            tracing::warn!(code = err.code(), "input receipt not recorded: {err}");
        }
    }

    /// Whether `frame` is an output event of this Run that is stored with no other state
    /// change than the last usage snapshot: what [`Driver::append_batch`] may group.
    fn is_output(&self, frame: &Frame) -> bool {
        frame.id == self.run_id
            && matches!(
                frame.message,
                Message::Delta(_)
                    | Message::Thinking(_)
                    | Message::OutputMessage(_)
                    | Message::ToolCall(_)
                    | Message::Usage(_)
            )
    }

    /// Stores Run events in one transaction (group commit). Past the Turn's event bound
    /// they are not stored but counted in the outcome's `events_dropped` (saved with the
    /// batch, so the events API shows the truncation while the Turn runs).
    async fn append_batch(&mut self, frames: &[Frame]) {
        let events: Vec<(String, Value)> = frames
            .iter()
            .filter_map(|f| f.to_envelope().ok())
            .map(|e| (e.kind, e.payload))
            .collect();
        let id = self.turn_id.clone();
        match self
            .core
            .store
            .call(move |s| s.append_events(&id, &events, now_ms()))
            .await
        {
            Ok(appended) if appended.dropped == 0 => {}
            Ok(appended) => {
                let dropped = appended.dropped;
                let before = self.outcome.events_dropped.unwrap_or(0);
                self.outcome.events_dropped = Some(before + dropped);
                if before == 0 {
                    tracing::warn!(turn_id = %self.turn_id, "the Turn's event bound is reached: later events are counted, not stored");
                }
                // Saved with every batch that dropped something (at most once per
                // EVENT_BATCH_MAX events), so the count the events API shows keeps up.
                self.save_outcome().await;
            }
            Err(err) => tracing::warn!(code = err.code(), "events not recorded: {err}"),
        }
    }

    /// Stores output events ([`Driver::is_output`]) in one transaction; the last usage
    /// snapshot among them (cumulative) becomes the outcome's.
    async fn store_output(&mut self, frames: &[Frame]) {
        self.append_batch(frames).await;
        if let Some(usage) = frames.iter().rev().find_map(|f| match &f.message {
            Message::Usage(usage) => Some(usage.clone()),
            _ => None,
        }) {
            self.outcome.usage = Some(usage);
            self.save_outcome().await;
        }
    }

    /// Stores one Run event ([`Driver::append_batch`] of one).
    async fn append(&mut self, frame: &Frame) {
        self.append_batch(std::slice::from_ref(frame)).await;
    }

    async fn save_outcome(&self) {
        let id = self.turn_id.clone();
        let outcome = self.outcome.clone();
        let _ = self
            .core
            .store
            .call(move |s| s.update_outcome(&id, &outcome, now_ms()))
            .await;
    }

    async fn record_interaction(&self, kind: InteractionKind, id: &str, request: Value) {
        if kind != InteractionKind::Function {
            self.conn.route(RouteKind::Interaction, id, &self.turn_id);
        }
        let record = InteractionRecord {
            turn_id: self.turn_id.clone(),
            interaction_id: id.to_string(),
            kind,
            request,
            state: InteractionState::Pending,
            answer: None,
            delivery_id: None,
        };
        let _ = self
            .core
            .store
            .call(move |s| s.record_interaction(&record))
            .await;
    }

    async fn settle(&self, kind: InteractionKind, id: &str, state: InteractionState) {
        let (turn, id) = (self.turn_id.clone(), id.to_string());
        let _ = self
            .core
            .store
            .call(move |s| s.settle_interaction(&turn, &id, kind, state))
            .await;
    }

    fn finish_from_done(&self) -> Option<End> {
        let outcome = self.done_seen?;
        let (state, code) = state_from_done(outcome);
        let mut o = self.outcome.clone();
        o.error_code = code;
        Some(End::Finish(state, o))
    }

    async fn on_run_frame(&mut self, frame: Frame) -> Option<End> {
        let payload = frame
            .to_envelope()
            .ok()
            .map(|e| e.payload)
            .unwrap_or(Value::Null);
        match &frame.message {
            // Output events normally arrive through the run loop's batches; one that
            // reaches here (no batch was open) is stored the same way.
            Message::Delta(_)
            | Message::Thinking(_)
            | Message::OutputMessage(_)
            | Message::ToolCall(_)
            | Message::Usage(_) => {
                self.store_output(std::slice::from_ref(&frame)).await;
            }
            Message::Error(err) => {
                // The outcome first: once the event is readable, so is the outcome it
                // makes (a reader that saw the event never reads an outcome without it).
                self.outcome
                    .record_error(err.message.as_str(), err.code, err.http_status);
                self.save_outcome().await;
                self.append(&frame).await;
            }
            Message::Done(done) => {
                self.append(&frame).await;
                self.outcome.native_outcome = Some(done.outcome);
                if let Some(u) = &done.usage {
                    self.outcome.usage = Some(u.clone());
                }
                if let Some(n) = &done.native_session_id {
                    self.outcome.native_session_id = Some(n.to_string());
                }
                self.done_seen = Some(done.outcome);
                if let Some((input_id, _)) = self.input_in_flight.take() {
                    // `done` comes after the in-flight receipt send ended; no receipt
                    // arrived, so the input's fate stays unknown.
                    self.set_input(&input_id, InputState::Unknown, None).await;
                }
                if self.cancel.is_none() {
                    return self.finish_from_done();
                }
                // A done does not override the cancel receipt: wait for it.
            }
            Message::PermissionRequest(r) => {
                self.append(&frame).await;
                self.record_interaction(
                    InteractionKind::Permission,
                    r.request_id.as_str(),
                    payload,
                )
                .await;
            }
            Message::PromptForUserChoice(r) => {
                self.append(&frame).await;
                self.record_interaction(InteractionKind::UserChoice, r.ask_id.as_str(), payload)
                    .await;
            }
            Message::FunctionCall(r) => {
                self.append(&frame).await;
                self.record_interaction(InteractionKind::Function, r.call_id.as_str(), payload)
                    .await;
            }
            Message::PermissionCancel(_) => {
                self.append(&frame).await;
                self.settle(
                    InteractionKind::Permission,
                    &frame.id,
                    InteractionState::Withdrawn,
                )
                .await;
            }
            Message::PromptSteerAck(ack) => {
                let matches = self
                    .input_in_flight
                    .as_ref()
                    .is_some_and(|(id, _)| id == ack.input_id.as_str());
                if !matches {
                    return None;
                }
                let code = ack
                    .error_code
                    .and_then(|c| serde_json::to_value(c).ok())
                    .and_then(|v| v.as_str().map(str::to_string));
                let id = ack.input_id.to_string();
                match ack.receipt {
                    SteerReceipt::Written => {
                        self.set_input(&id, InputState::Written, None).await;
                        if let Some((_, deadline)) = &mut self.input_in_flight {
                            *deadline = None;
                        }
                    }
                    SteerReceipt::Accepted => {
                        self.set_input(&id, InputState::Accepted, None).await;
                        self.input_in_flight = None;
                    }
                    SteerReceipt::Failed => {
                        self.set_input(&id, InputState::Failed, code).await;
                        self.input_in_flight = None;
                    }
                    SteerReceipt::Rejected => {
                        self.set_input(&id, InputState::Rejected, code).await;
                        self.input_in_flight = None;
                    }
                    SteerReceipt::Unknown => {
                        self.set_input(&id, InputState::Unknown, code).await;
                        self.input_in_flight = None;
                        self.steer_blocked = true;
                    }
                }
            }
            Message::InteractionDecisionAck(ack) => {
                return self.on_ack(&frame.id, ack.clone()).await;
            }
            _ => {}
        }
        None
    }

    async fn on_ack(
        &mut self,
        envelope_id: &str,
        ack: crate::core_runtime::wire::InteractionDecisionAck,
    ) -> Option<End> {
        match ack.operation {
            AckOperation::PromptCancel => {
                let ours = envelope_id == self.run_id
                    && self
                        .cancel
                        .as_ref()
                        .is_some_and(|(d, _)| d == ack.delivery_id.as_str());
                if !ours {
                    return None;
                }
                self.cancel = None;
                if ack.applied {
                    if let Some(snap) = &ack.snapshot {
                        if let Some(n) = &snap.native_session_id {
                            self.outcome.native_session_id = Some(n.to_string());
                        }
                        if let Some(t) = &snap.text {
                            self.outcome.snapshot_text = Some(t.to_string());
                        }
                        if let Some(u) = &snap.usage {
                            self.outcome.usage = Some(u.clone());
                        }
                    }
                    let mut o = self.outcome.clone();
                    o.error_code = None;
                    return Some(End::Finish(TurnState::Cancelled, o));
                }
                // Not applied: the cancel settled nothing; a done already seen decides.
                self.finish_from_done()
            }
            op => {
                let kind = match op {
                    AckOperation::PermissionDecision => InteractionKind::Permission,
                    AckOperation::PromptForUserChoiceDecision => InteractionKind::UserChoice,
                    _ => InteractionKind::Function,
                };
                let interaction_id = if kind == InteractionKind::Function {
                    if envelope_id != self.run_id {
                        return None;
                    }
                    ack.call_id.as_ref()?.to_string()
                } else {
                    envelope_id.to_string()
                };
                let (turn, iid) = (self.turn_id.clone(), interaction_id.clone());
                let record = self
                    .core
                    .store
                    .call(move |s| s.interaction(&turn, &iid, kind))
                    .await
                    .ok()?;
                // Every applied-decision receipt must match the delivery ID.
                if record.delivery_id.as_deref() != Some(ack.delivery_id.as_str()) {
                    return None;
                }
                let state = if ack.applied {
                    InteractionState::Applied
                } else {
                    InteractionState::NotApplied
                };
                self.settle(kind, &interaction_id, state).await;
                None
            }
        }
    }

    /// Reacts to durable state: cancel requests, queued inputs, answered interactions.
    async fn on_wake(&mut self) -> Option<End> {
        let turn = self.turn().await?;
        if turn.cancel_requested && self.cancel.is_none() && !self.cancel_sent() {
            let delivery = format!("cancel-{}", Uuid::random());
            let frame = Frame::new(
                self.run_id.clone(),
                Message::PromptCancel(PromptCancel {
                    delivery_id: DeliveryId::new(delivery.clone()).ok()?,
                }),
            );
            if !self.conn.send(&frame).await {
                return Some(self.fail(CoreErrorCode::CancelUnconfirmed));
            }
            self.cancel = Some((
                delivery,
                Instant::now() + self.core.config.timers.cancel_confirm,
            ));
            self.cancel_marker = true;
        }
        if self.done_seen.is_some() {
            return None;
        }
        if self.input_in_flight.is_none() && !self.steer_blocked && !turn.cancel_requested {
            let id = self.turn_id.clone();
            let inputs = self.core.store.call(move |s| s.inputs(&id)).await.ok()?;
            if let Some(next) = inputs.into_iter().find(|i| i.state == InputState::Queued)
                && let Some(input) = decode_input(&next.input)
            {
                {
                    self.set_input(&next.input_id, InputState::Delivering, None)
                        .await;
                    let frame = Frame::new(
                        self.run_id.clone(),
                        Message::PromptSteer(PromptSteer {
                            input_id: crate::core_runtime::wire::InputId::new(
                                next.input_id.clone(),
                            )
                            .ok()?,
                            input,
                            durable_receipt: true,
                        }),
                    );
                    let deadline = Instant::now() + self.core.config.timers.written_receipt;
                    self.input_in_flight = Some((next.input_id.clone(), Some(deadline)));
                    if !self.conn.send(&frame).await {
                        self.set_input(&next.input_id, InputState::Failed, Some("not_sent".into()))
                            .await;
                        self.input_in_flight = None;
                    }
                }
            }
        }
        self.send_answers().await;
        None
    }

    fn cancel_sent(&self) -> bool {
        self.cancel_marker
    }

    async fn send_answers(&mut self) {
        let id = self.turn_id.clone();
        let Ok(records) = self.core.store.call(move |s| s.interactions(&id)).await else {
            return;
        };
        for r in records {
            if r.state != InteractionState::Delivering
                || self
                    .sent_answers
                    .contains(&(r.kind, r.interaction_id.clone()))
            {
                continue;
            }
            let (Some(answer), Some(delivery)) = (r.answer.clone(), r.delivery_id.clone()) else {
                continue;
            };
            let Ok(delivery_id) = DeliveryId::new(delivery) else {
                continue;
            };
            let message = match r.kind {
                InteractionKind::Permission => serde_json::from_value(answer["decision"].clone())
                    .ok()
                    .map(|decision| {
                        (
                            r.interaction_id.clone(),
                            Message::PermissionDecision(PermissionDecision {
                                delivery_id,
                                decision,
                            }),
                        )
                    }),
                InteractionKind::UserChoice => {
                    let mut obj = answer.clone();
                    obj["delivery_id"] = Value::String(delivery_id.to_string());
                    crate::wire::strict::from_value_strict::<PromptForUserChoiceDecision>(obj)
                        .ok()
                        .map(|d| {
                            (
                                r.interaction_id.clone(),
                                Message::PromptForUserChoiceDecision(d),
                            )
                        })
                }
                InteractionKind::Function => {
                    let mut obj = answer.clone();
                    obj["delivery_id"] = Value::String(delivery_id.to_string());
                    obj["call_id"] = Value::String(r.interaction_id.clone());
                    crate::wire::strict::from_value_strict::<FunctionResult>(obj)
                        .ok()
                        .map(|f| (self.run_id.clone(), Message::FunctionResult(f)))
                }
            };
            self.sent_answers.insert((r.kind, r.interaction_id.clone()));
            match message {
                Some((envelope_id, message)) => {
                    if !self.conn.send(&Frame::new(envelope_id, message)).await {
                        self.settle(r.kind, &r.interaction_id, InteractionState::Unknown)
                            .await;
                    }
                }
                None => {
                    self.settle(r.kind, &r.interaction_id, InteractionState::NotApplied)
                        .await
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core_runtime::wire::AdmissionHandle;

    fn handle(h: &str) -> AdmissionHandle {
        AdmissionHandle::new(h.to_string()).unwrap()
    }

    #[test]
    fn only_newer_revisions_of_the_tracked_handle_apply() {
        let failed = |h: &str, revision| PreparationStatus::Failed {
            admission_handle: handle(h),
            revision,
            error_code: PreparationErrorCode::NativePreparationFailed,
        };
        let preparing = |h: &str, revision| PreparationStatus::Preparing {
            admission_handle: handle(h),
            revision,
        };
        // The first status names the request's handle.
        assert!(is_fresh(None, &preparing("h1", 2)));
        let tracked = ("h1".to_string(), 2);
        assert!(is_fresh(Some(&tracked), &failed("h1", 3)));
        // Old and duplicate revisions are ignored ...
        assert!(!is_fresh(Some(&tracked), &failed("h1", 1)));
        assert!(!is_fresh(Some(&tracked), &preparing("h1", 2)));
        // ... and a status naming another handle never applies, whatever its revision.
        assert!(!is_fresh(Some(&tracked), &failed("h2", 9)));
        assert_eq!(status_revision(&failed("h2", 9)), Some(("h2", 9)));
        // A rejected control operation carries no revision and does not replace it.
        let rejected = PreparationStatus::Rejected {
            operation: ControlOperation::Start,
            error_code: PreparationErrorCode::NativePreparationFailed,
            admission_handle: None,
        };
        assert_eq!(status_revision(&rejected), None);
        assert!(is_fresh(Some(&tracked), &rejected));
    }
}
