//! One Run on the wire: native events forwarded in native order with the Run ID as
//! `Envelope.id`, active-input receipts, the cancel receipt, interactions and function
//! results ("Preparation and execution order" step 3, "Active-input receipts",
//! "What each acknowledgement proves", "Native failure classification").
//!
//! Ordering rules kept here:
//! * `done` is sent only after the native Turn settled **and** the receipt send of the
//!   input in flight ended **and** a pending cancel receipt was sent;
//! * `accepted` for an input follows that input's `written` receipt;
//! * after a confirmed [`CancelSettlement::Stopped`] nothing more is published for the
//!   Run (the cancel receipt carries the continuity snapshot instead of `done`);
//! * a connection loss never invents `error` or `done`: the Run's frames die with the
//!   connection while the pump keeps draining native events so the Runtime can settle
//!   the Executor.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::admission::Executor;
use super::dispatcher::Runtime;
use super::outbound::Outbound;
use crate::core_runtime::adapter::{AdapterError, CancelSettlement, NativeEvent};
use crate::core_runtime::wire::limits::TEXT_MAX_BYTES;
use crate::core_runtime::wire::{
    AckErrorCode, AckOperation, AgentKindCapabilities, CallId, ContentPart, ContinuitySnapshot,
    DeliveryId, Delta, Done, ExecutorId, FunctionResult, InputId, InteractionDecisionAck,
    InteractionId, ItemId, Message, MessageInput, NativeSessionId, PermissionCancel,
    PermissionDecision, PromptCancel, PromptForUserChoiceDecision, PromptSteer, PromptSteerAck,
    Question, RunError, RunId, SteerErrorCode, SteerReceipt, Thinking, Usage,
    classify_native_error, validate_question_answers,
};
use crate::wire::bounded::BoundedString;

/// Bound on interactions (permission requests, user-choice prompts) remembered per Run;
/// the oldest resolved ones are forgotten first.
pub const RUN_INTERACTIONS_MAX: usize = 256;

/// Bound on function calls remembered per Run.
pub const RUN_CALLS_MAX: usize = 256;

/// Bound on input IDs remembered per Run for duplicate detection.
pub const RUN_INPUT_IDS_MAX: usize = 1024;

/// Bound on cancel deliveries waiting for one native cancel.
pub const CANCEL_WAITERS_MAX: usize = 16;

/// Bound on an error message forwarded in an `error` frame (the wire type's bound).
pub const ERROR_MESSAGE_MAX_BYTES: usize = 8192;

/// Resolution state of an interaction or function call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolution {
    Pending,
    Resolving,
    Resolved,
}

#[derive(Debug, Clone)]
enum InteractionKind {
    Permission,
    UserChoice(Vec<Question>),
}

#[derive(Debug)]
struct Interaction {
    kind: InteractionKind,
    state: Resolution,
}

#[derive(Debug, Default)]
enum CancelState {
    #[default]
    Idle,
    Pending(Vec<DeliveryId>),
}

/// Receipt sends the pump must wait for before `done` / `accepted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Barrier {
    steer: bool,
    cancel: bool,
}

#[derive(Debug, Default)]
struct RunInner {
    finished: bool,
    text: String,
    usage: Option<Usage>,
    native_session_id: Option<NativeSessionId>,
    steer_in_flight: Option<InputId>,
    seen_inputs: HashSet<InputId>,
    seen_order: VecDeque<InputId>,
    interactions: HashMap<InteractionId, Interaction>,
    interaction_order: VecDeque<InteractionId>,
    calls: HashMap<CallId, Resolution>,
    call_order: VecDeque<CallId>,
    cancel: CancelState,
}

/// One Run routed on a connection.
#[derive(Debug)]
pub struct RunCtx {
    /// The Run.
    pub run_id: RunId,
    /// Its Executor.
    pub executor_id: ExecutorId,
    /// The declaration snapshot the Executor was admitted under.
    pub capabilities: AgentKindCapabilities,
    /// `observe_messages` opt-in.
    pub observe_messages: bool,
    out: Option<Outbound>,
    inner: StdMutex<RunInner>,
    barrier: watch::Sender<Barrier>,
}

fn remember<K: Clone + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    order: &mut VecDeque<K>,
    max: usize,
    key: K,
    value: V,
    evictable: impl Fn(&V) -> bool,
) {
    if !map.contains_key(&key) {
        while map.len() >= max {
            let victim = order
                .iter()
                .position(|k| map.get(k).is_some_and(&evictable))
                .unwrap_or(0);
            match order.remove(victim) {
                Some(k) => {
                    map.remove(&k);
                }
                None => break,
            }
        }
        order.push_back(key.clone());
    }
    map.insert(key, value);
}

/// Splits `text` into pieces of at most [`TEXT_MAX_BYTES`] on character boundaries.
fn text_pieces(text: &str) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut rest = text;
    while rest.len() > TEXT_MAX_BYTES {
        let piece = crate::wire::bounded::utf8_prefix(rest, TEXT_MAX_BYTES);
        pieces.push(piece);
        rest = &rest[piece.len()..];
    }
    pieces.push(rest);
    pieces
}

fn has_images(input: &[MessageInput]) -> bool {
    input.iter().any(|m| {
        m.content
            .iter()
            .any(|c| matches!(c, ContentPart::Image { .. }))
    })
}

impl RunCtx {
    /// A Run on `executor`, publishing on `out` (its connection, if still open).
    pub fn new(run_id: RunId, executor: &Executor, out: Option<Outbound>) -> Self {
        let (barrier, _) = watch::channel(Barrier::default());
        Self {
            run_id,
            executor_id: executor.id.clone(),
            capabilities: executor.capabilities,
            observe_messages: executor.configuration.observe_messages == Some(true),
            out,
            inner: StdMutex::new(RunInner::default()),
            barrier,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunInner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn send(&self, id: impl Into<String>, message: Message) {
        if let Some(out) = &self.out {
            out.send(id, message).await;
        }
    }

    async fn send_run(&self, message: Message) {
        self.send(self.run_id.as_str(), message).await;
    }

    async fn wait_barrier(&self, f: impl Fn(&Barrier) -> bool) {
        let mut rx = self.barrier.subscribe();
        let _ = rx.wait_for(|b| f(b)).await;
    }

    fn snapshot(&self) -> ContinuitySnapshot {
        let inner = self.lock();
        ContinuitySnapshot {
            text: (!inner.text.is_empty())
                .then(|| BoundedString::new(inner.text.clone()).ok())
                .flatten(),
            native_session_id: inner.native_session_id.clone(),
            usage: inner.usage.clone(),
        }
    }
}

/// Removes a finished Run from its connection and settles its Executor.
async fn finish(rt: &Arc<Runtime>, generation: u64, run: &RunCtx, settled: bool) {
    let mut st = rt.state.lock().await;
    if let Some(conn) = st.conn_at(generation) {
        conn.runs.remove(&run.run_id);
    }
    let now = Instant::now();
    let effects = if settled {
        st.admission.run_settled(&run.executor_id, &run.run_id, now)
    } else {
        st.admission.run_lost(&run.executor_id, &run.run_id, now)
    };
    rt.apply(&mut st, effects);
}

/// Forwards one Run's native events until it settles (or the adapter drops its sink).
pub async fn pump(
    rt: Arc<Runtime>,
    generation: u64,
    run: Arc<RunCtx>,
    mut events: mpsc::Receiver<NativeEvent>,
) {
    while let Some(event) = events.recv().await {
        if run.lock().finished {
            // Stopped by a confirmed cancel: drain silently.
            if matches!(event, NativeEvent::Settled { .. }) {
                return;
            }
            continue;
        }
        match event {
            NativeEvent::Delta { text, item_id } => {
                {
                    let mut inner = run.lock();
                    let room = TEXT_MAX_BYTES.saturating_sub(inner.text.len());
                    let add = crate::wire::bounded::utf8_prefix(&text, room).to_string();
                    inner.text.push_str(&add);
                }
                let item_id = if run.observe_messages {
                    item_id.and_then(|i| ItemId::new(i).ok())
                } else {
                    None
                };
                for piece in text_pieces(&text) {
                    if let Ok(text) = BoundedString::new(piece) {
                        run.send_run(Message::Delta(Delta {
                            text,
                            item_id: item_id.clone(),
                        }))
                        .await;
                    }
                }
            }
            NativeEvent::Thinking { text } => {
                for piece in text_pieces(&text) {
                    if let Ok(text) = BoundedString::new(piece) {
                        run.send_run(Message::Thinking(Thinking { text })).await;
                    }
                }
            }
            NativeEvent::OutputMessage(message) => {
                if run.observe_messages {
                    run.send_run(Message::OutputMessage(message)).await;
                }
            }
            NativeEvent::ToolCall(call) => run.send_run(Message::ToolCall(call)).await,
            NativeEvent::Usage(usage) => {
                run.lock().usage = Some(usage.clone());
                run.send_run(Message::Usage(usage)).await;
            }
            NativeEvent::Error {
                message,
                code,
                http_status,
            } => {
                let (code, http_status) =
                    classify_native_error(code.as_ref(), http_status.as_ref());
                let Ok(message) = BoundedString::new(crate::wire::bounded::utf8_prefix(
                    &message,
                    ERROR_MESSAGE_MAX_BYTES,
                )) else {
                    continue;
                };
                run.send_run(Message::Error(RunError {
                    message,
                    code,
                    http_status,
                }))
                .await;
            }
            NativeEvent::PermissionRequest(request) => {
                {
                    let mut inner = run.lock();
                    let RunInner {
                        interactions,
                        interaction_order,
                        ..
                    } = &mut *inner;
                    remember(
                        interactions,
                        interaction_order,
                        RUN_INTERACTIONS_MAX,
                        request.request_id.clone(),
                        Interaction {
                            kind: InteractionKind::Permission,
                            state: Resolution::Pending,
                        },
                        |i| i.state == Resolution::Resolved,
                    );
                }
                run.send_run(Message::PermissionRequest(request)).await;
            }
            NativeEvent::PermissionCancel { request_id } => {
                let withdrawn = {
                    let mut inner = run.lock();
                    match inner.interactions.get(&request_id) {
                        Some(i) if i.state == Resolution::Pending => {
                            inner.interactions.remove(&request_id);
                            inner.interaction_order.retain(|k| k != &request_id);
                            true
                        }
                        _ => false,
                    }
                };
                if withdrawn {
                    run.send(
                        request_id.as_str(),
                        Message::PermissionCancel(PermissionCancel {
                            run_id: run.run_id.clone(),
                        }),
                    )
                    .await;
                }
            }
            NativeEvent::PromptForUserChoice(prompt) => {
                {
                    let mut inner = run.lock();
                    let RunInner {
                        interactions,
                        interaction_order,
                        ..
                    } = &mut *inner;
                    remember(
                        interactions,
                        interaction_order,
                        RUN_INTERACTIONS_MAX,
                        prompt.ask_id.clone(),
                        Interaction {
                            kind: InteractionKind::UserChoice(prompt.questions.to_vec()),
                            state: Resolution::Pending,
                        },
                        |i| i.state == Resolution::Resolved,
                    );
                }
                run.send_run(Message::PromptForUserChoice(prompt)).await;
            }
            NativeEvent::FunctionCall(call) => {
                {
                    let mut inner = run.lock();
                    let RunInner {
                        calls, call_order, ..
                    } = &mut *inner;
                    remember(
                        calls,
                        call_order,
                        RUN_CALLS_MAX,
                        call.call_id.clone(),
                        Resolution::Pending,
                        |r| *r == Resolution::Resolved,
                    );
                }
                run.send_run(Message::FunctionCall(call)).await;
            }
            NativeEvent::InputAccepted { input_id } => {
                // `accepted` follows the input's `written` receipt.
                run.wait_barrier(|b| !b.steer).await;
                if run.lock().finished {
                    continue;
                }
                run.send_run(Message::PromptSteerAck(PromptSteerAck {
                    input_id,
                    receipt: SteerReceipt::Accepted,
                    error_code: None,
                }))
                .await;
            }
            NativeEvent::Settled {
                outcome,
                native_session_id,
            } => {
                // "the Runtime sends done only after the native Turn has settled and the
                // receipt send for the input in flight has ended".
                run.wait_barrier(|b| !b.steer && !b.cancel).await;
                let done = {
                    let mut inner = run.lock();
                    if inner.finished {
                        None
                    } else {
                        inner.finished = true;
                        if native_session_id.is_some() {
                            inner.native_session_id = native_session_id.clone();
                        }
                        Some(Done {
                            outcome,
                            usage: inner.usage.clone(),
                            native_session_id: inner.native_session_id.clone(),
                        })
                    }
                };
                if let Some(done) = done {
                    run.send_run(Message::Done(done)).await;
                    finish(&rt, generation, &run, true).await;
                }
                return;
            }
        }
    }
    // The adapter dropped the sink without a settlement: no `done` is invented, and the
    // Executor is not known healthy, so it is closed.
    let already = {
        let mut inner = run.lock();
        std::mem::replace(&mut inner.finished, true)
    };
    if !already {
        tracing::warn!(run_id = %run.run_id, "native stream ended without settlement");
        finish(&rt, generation, &run, false).await;
    }
}

async fn lookup_run(
    rt: &Arc<Runtime>,
    generation: u64,
    run_id: &str,
) -> (Option<Arc<RunCtx>>, Option<Outbound>) {
    let mut st = rt.state.lock().await;
    let Some(conn) = st.conn_at(generation) else {
        return (None, None);
    };
    let out = conn.out.clone();
    let run = RunId::new(run_id)
        .ok()
        .and_then(|r| conn.runs.get(&r).cloned());
    (run, Some(out))
}

/// `prompt_steer` (`Envelope.id` = Run ID): one input per Run in flight.
pub async fn prompt_steer(rt: &Arc<Runtime>, generation: u64, id: String, request: PromptSteer) {
    let (run, out) = lookup_run(rt, generation, &id).await;
    let Some(out) = out else { return };
    let reject = |code: SteerErrorCode| {
        Message::PromptSteerAck(PromptSteerAck {
            input_id: request.input_id.clone(),
            receipt: SteerReceipt::Rejected,
            error_code: Some(code),
        })
    };
    let Some(run) = run else {
        out.send(id, reject(SteerErrorCode::UnknownRun)).await;
        return;
    };
    let refusal = {
        let mut inner = run.lock();
        if inner.finished {
            Some(SteerErrorCode::UnknownRun)
        } else if inner.seen_inputs.contains(&request.input_id) {
            Some(SteerErrorCode::DuplicateInput)
        } else if inner.steer_in_flight.is_some() {
            Some(SteerErrorCode::InputInFlight)
        } else if !run.capabilities.steering {
            Some(SteerErrorCode::UnsupportedOperation)
        } else if has_images(&request.input) && !run.capabilities.message_images {
            Some(SteerErrorCode::InvalidInput)
        } else {
            if inner.seen_inputs.len() >= RUN_INPUT_IDS_MAX
                && let Some(old) = inner.seen_order.pop_front()
            {
                inner.seen_inputs.remove(&old);
            }
            inner.seen_inputs.insert(request.input_id.clone());
            inner.seen_order.push_back(request.input_id.clone());
            inner.steer_in_flight = Some(request.input_id.clone());
            None
        }
    };
    if let Some(code) = refusal {
        out.send(id, reject(code)).await;
        return;
    }
    run.barrier.send_modify(|b| b.steer = true);
    let rt = rt.clone();
    tokio::spawn(async move {
        let timers = rt.config.timers;
        let input = request.input.into_inner();
        let write = rt
            .adapter
            .write_input(&run.run_id, &request.input_id, &input);
        let (receipt, error_code) = match tokio::time::timeout(timers.native_write, write).await {
            Ok(Ok(())) => (SteerReceipt::Written, None),
            Ok(Err(AdapterError::Unknown(_))) => (
                SteerReceipt::Unknown,
                Some(SteerErrorCode::NativeWriteFailed),
            ),
            Ok(Err(AdapterError::Unsupported(_))) => (
                SteerReceipt::Failed,
                Some(SteerErrorCode::UnsupportedOperation),
            ),
            Ok(Err(_)) => (
                SteerReceipt::Failed,
                Some(SteerErrorCode::NativeWriteFailed),
            ),
            Err(_) => (
                SteerReceipt::Unknown,
                Some(SteerErrorCode::NativeWriteTimeout),
            ),
        };
        let ack = Message::PromptSteerAck(PromptSteerAck {
            input_id: request.input_id.clone(),
            receipt,
            error_code,
        });
        // "each receipt send has its own 5-second budget". The input is settled once its
        // receipt is decided: the slot is free before Core can read the receipt (and so
        // before it sends the next input); `done` still waits for the send to end.
        if let Some(out) = &run.out
            && !out
                .send_confirmed_then(run.run_id.as_str(), ack, timers.receipt_send, || {
                    run.lock().steer_in_flight = None;
                })
                .await
        {
            tracing::warn!(run_id = %run.run_id, input_id = %request.input_id, "receipt send did not complete within its budget");
        }
        run.lock().steer_in_flight = None;
        run.barrier.send_modify(|b| b.steer = false);
    });
}

fn ack(
    operation: AckOperation,
    delivery_id: DeliveryId,
    applied: bool,
    error_code: Option<AckErrorCode>,
) -> InteractionDecisionAck {
    InteractionDecisionAck {
        operation,
        delivery_id,
        applied,
        call_id: None,
        error_code,
        snapshot: None,
    }
}

/// `prompt_cancel` (`Envelope.id` = Run ID): native cancel bounded by `cancel_settle`;
/// the receipt (`Envelope.id` = Run ID) echoes the delivery ID.
pub async fn prompt_cancel(rt: &Arc<Runtime>, generation: u64, id: String, request: PromptCancel) {
    let (run, out) = lookup_run(rt, generation, &id).await;
    let Some(out) = out else { return };
    let op = AckOperation::PromptCancel;
    let Some(run) = run else {
        let msg = ack(
            op,
            request.delivery_id,
            false,
            Some(AckErrorCode::UnknownInteraction),
        );
        out.send(id, Message::InteractionDecisionAck(msg)).await;
        return;
    };
    let start = {
        let mut inner = run.lock();
        if inner.finished {
            Err(Some(AckErrorCode::UnknownInteraction))
        } else {
            match &mut inner.cancel {
                CancelState::Pending(waiters) if waiters.len() < CANCEL_WAITERS_MAX => {
                    waiters.push(request.delivery_id.clone());
                    Err(None)
                }
                CancelState::Pending(_) => Err(Some(AckErrorCode::SettlementUnknown)),
                CancelState::Idle => {
                    inner.cancel = CancelState::Pending(vec![request.delivery_id.clone()]);
                    Ok(())
                }
            }
        }
    };
    match start {
        Err(None) => return,
        Err(Some(code)) => {
            let msg = ack(op, request.delivery_id, false, Some(code));
            out.send(id, Message::InteractionDecisionAck(msg)).await;
            return;
        }
        Ok(()) => {}
    }
    run.barrier.send_modify(|b| b.cancel = true);
    let rt = rt.clone();
    tokio::spawn(async move {
        let budget = rt.config.timers.cancel_settle;
        let result = tokio::time::timeout(budget, rt.adapter.cancel(&run.run_id)).await;
        let (applied, error_code, stopped) = match result {
            Ok(Ok(CancelSettlement::StreamSettles)) => (true, None, false),
            Ok(Ok(CancelSettlement::Stopped)) => (true, None, true),
            Ok(Err(AdapterError::Unknown(_))) | Err(_) => {
                (false, Some(AckErrorCode::SettlementUnknown), false)
            }
            Ok(Err(AdapterError::Unsupported(_))) => {
                (false, Some(AckErrorCode::UnsupportedOperation), false)
            }
            Ok(Err(_)) => (false, Some(AckErrorCode::NativeFailure), false),
        };
        let snapshot = stopped.then(|| run.snapshot());
        let waiters = {
            let mut inner = run.lock();
            if stopped {
                inner.finished = true;
            }
            match std::mem::take(&mut inner.cancel) {
                CancelState::Pending(waiters) => waiters,
                CancelState::Idle => Vec::new(),
            }
        };
        for delivery_id in waiters {
            let mut msg = ack(AckOperation::PromptCancel, delivery_id, applied, error_code);
            msg.snapshot = snapshot.clone();
            run.send_run(Message::InteractionDecisionAck(msg)).await;
        }
        run.barrier.send_modify(|b| b.cancel = false);
        if stopped {
            // The Turn stopped without a terminal event: the Executor is idle again.
            finish(&rt, generation, &run, true).await;
        }
    });
}

/// Finds the Run holding interaction `id` on connection `generation`.
async fn lookup_interaction(
    rt: &Arc<Runtime>,
    generation: u64,
    id: &str,
) -> (Option<Arc<RunCtx>>, Option<Outbound>) {
    let mut st = rt.state.lock().await;
    let Some(conn) = st.conn_at(generation) else {
        return (None, None);
    };
    let out = conn.out.clone();
    let run = InteractionId::new(id).ok().and_then(|iid| {
        conn.runs
            .values()
            .find(|r| r.lock().interactions.contains_key(&iid))
            .cloned()
    });
    (run, Some(out))
}

/// Claims interaction `id` of `run` for resolution, after shared validation.
fn claim_interaction(
    run: &RunCtx,
    id: &InteractionId,
    user_choice: Option<&PromptForUserChoiceDecision>,
) -> Result<(), AckErrorCode> {
    let mut inner = run.lock();
    if inner.finished {
        return Err(AckErrorCode::UnknownInteraction);
    }
    let Some(interaction) = inner.interactions.get_mut(id) else {
        return Err(AckErrorCode::UnknownInteraction);
    };
    match (&interaction.kind, user_choice) {
        (InteractionKind::Permission, None) => {}
        (InteractionKind::UserChoice(questions), Some(decision)) => {
            if interaction.state == Resolution::Pending
                && validate_question_answers(questions, decision).is_err()
            {
                return Err(AckErrorCode::InvalidDecision);
            }
        }
        _ => return Err(AckErrorCode::UnknownInteraction),
    }
    if interaction.state != Resolution::Pending {
        return Err(AckErrorCode::AlreadyResolved);
    }
    if user_choice.is_none() && !run.capabilities.permissions {
        return Err(AckErrorCode::UnsupportedOperation);
    }
    interaction.state = Resolution::Resolving;
    Ok(())
}

/// Maps a bounded native call's outcome to (applied, error code, new state).
fn settle_call(
    result: Result<Result<(), AdapterError>, tokio::time::error::Elapsed>,
) -> (bool, Option<AckErrorCode>, Resolution) {
    match result {
        Ok(Ok(())) => (true, None, Resolution::Resolved),
        // A refused call had no effect: the interaction stays open for another delivery.
        Ok(Err(AdapterError::Refused(_) | AdapterError::Unavailable(_))) => (
            false,
            Some(AckErrorCode::NativeFailure),
            Resolution::Pending,
        ),
        Ok(Err(AdapterError::Unsupported(_))) => (
            false,
            Some(AckErrorCode::UnsupportedOperation),
            Resolution::Pending,
        ),
        // Uncertain: never replayed automatically.
        Ok(Err(AdapterError::Unknown(_))) | Err(_) => (
            false,
            Some(AckErrorCode::SettlementUnknown),
            Resolution::Resolved,
        ),
    }
}

/// `permission_decision` (`Envelope.id` = interaction ID).
pub async fn permission_decision(
    rt: &Arc<Runtime>,
    generation: u64,
    id: String,
    decision: PermissionDecision,
) {
    let op = AckOperation::PermissionDecision;
    let (run, out) = lookup_interaction(rt, generation, &id).await;
    let Some(out) = out else { return };
    let (Some(run), Ok(iid)) = (run, InteractionId::new(id.clone())) else {
        let msg = ack(
            op,
            decision.delivery_id,
            false,
            Some(AckErrorCode::UnknownInteraction),
        );
        out.send(id, Message::InteractionDecisionAck(msg)).await;
        return;
    };
    if let Err(code) = claim_interaction(&run, &iid, None) {
        let msg = ack(op, decision.delivery_id, false, Some(code));
        out.send(id, Message::InteractionDecisionAck(msg)).await;
        return;
    }
    let rt = rt.clone();
    tokio::spawn(async move {
        let call = rt
            .adapter
            .resolve_permission(&run.run_id, &iid, decision.decision);
        let (applied, code, state) =
            settle_call(tokio::time::timeout(rt.config.timers.native_write, call).await);
        if let Some(i) = run.lock().interactions.get_mut(&iid) {
            i.state = state;
        }
        let msg = ack(op, decision.delivery_id, applied, code);
        out.send(id, Message::InteractionDecisionAck(msg)).await;
    });
}

/// `prompt_for_user_choice_decision` (`Envelope.id` = interaction ID); the decision is
/// validated with the shared validator before any native call.
pub async fn user_choice_decision(
    rt: &Arc<Runtime>,
    generation: u64,
    id: String,
    decision: PromptForUserChoiceDecision,
) {
    let op = AckOperation::PromptForUserChoiceDecision;
    let (run, out) = lookup_interaction(rt, generation, &id).await;
    let Some(out) = out else { return };
    let (Some(run), Ok(iid)) = (run, InteractionId::new(id.clone())) else {
        let msg = ack(
            op,
            decision.delivery_id,
            false,
            Some(AckErrorCode::UnknownInteraction),
        );
        out.send(id, Message::InteractionDecisionAck(msg)).await;
        return;
    };
    if let Err(code) = claim_interaction(&run, &iid, Some(&decision)) {
        let msg = ack(op, decision.delivery_id, false, Some(code));
        out.send(id, Message::InteractionDecisionAck(msg)).await;
        return;
    }
    let rt = rt.clone();
    tokio::spawn(async move {
        let call = rt.adapter.resolve_user_choice(&run.run_id, &iid, &decision);
        let (applied, code, state) =
            settle_call(tokio::time::timeout(rt.config.timers.native_write, call).await);
        if let Some(i) = run.lock().interactions.get_mut(&iid) {
            i.state = state;
        }
        let msg = ack(op, decision.delivery_id.clone(), applied, code);
        out.send(id, Message::InteractionDecisionAck(msg)).await;
    });
}

/// `function_result` (`Envelope.id` = Run ID); the acknowledgement (`Envelope.id` = Run
/// ID) carries the call ID and the delivery ID.
pub async fn function_result(
    rt: &Arc<Runtime>,
    generation: u64,
    id: String,
    result: FunctionResult,
) {
    let op = AckOperation::FunctionResult;
    let (run, out) = lookup_run(rt, generation, &id).await;
    let Some(out) = out else { return };
    let refuse = |code: AckErrorCode| {
        let mut msg = ack(op, result.delivery_id.clone(), false, Some(code));
        msg.call_id = Some(result.call_id.clone());
        Message::InteractionDecisionAck(msg)
    };
    let Some(run) = run else {
        out.send(id, refuse(AckErrorCode::UnknownInteraction)).await;
        return;
    };
    let claim = {
        let mut inner = run.lock();
        let finished = inner.finished;
        match inner.calls.get_mut(&result.call_id) {
            _ if finished => Err(AckErrorCode::UnknownInteraction),
            None => Err(AckErrorCode::UnknownInteraction),
            Some(Resolution::Pending) if !run.capabilities.function_tools => {
                Err(AckErrorCode::UnsupportedOperation)
            }
            Some(state @ Resolution::Pending) => {
                *state = Resolution::Resolving;
                Ok(())
            }
            Some(_) => Err(AckErrorCode::AlreadyResolved),
        }
    };
    if let Err(code) = claim {
        out.send(id, refuse(code)).await;
        return;
    }
    let rt = rt.clone();
    tokio::spawn(async move {
        let call = rt.adapter.function_result(
            &run.run_id,
            &result.call_id,
            &result.output,
            result.is_error,
        );
        let (applied, code, state) =
            settle_call(tokio::time::timeout(rt.config.timers.native_write, call).await);
        if let Some(s) = run.lock().calls.get_mut(&result.call_id) {
            *s = state;
        }
        let mut msg = ack(op, result.delivery_id.clone(), applied, code);
        msg.call_id = Some(result.call_id.clone());
        out.send(id, Message::InteractionDecisionAck(msg)).await;
    });
}

/// Whether the Run is still active (not settled, not stopped).
pub fn is_active(run: &RunCtx) -> bool {
    !run.lock().finished
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_split_on_char_boundaries() {
        let text = "é".repeat(TEXT_MAX_BYTES);
        let pieces = text_pieces(&text);
        assert!(pieces.iter().all(|p| p.len() <= TEXT_MAX_BYTES));
        assert_eq!(pieces.concat(), text);
        assert_eq!(crate::wire::bounded::utf8_prefix("aé", 2), "a");
    }

    #[test]
    fn remember_evicts_resolved_first() {
        let mut map = HashMap::new();
        let mut order = VecDeque::new();
        for i in 0..3 {
            remember(&mut map, &mut order, 3, i, i == 1, |v| *v);
        }
        remember(&mut map, &mut order, 3, 9, false, |v| *v);
        assert_eq!(map.len(), 3);
        assert!(!map.contains_key(&1));
        assert!(map.contains_key(&0));
    }
}
