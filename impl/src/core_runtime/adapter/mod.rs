//! The Harness adapter contract ("Scope": a Harness plugs in through the Harness
//! adapter contract, which owns the Executor and Turn lifecycle obligations behind
//! the Runtime registry).
//!
//! The Runtime dispatcher calls a [`HarnessAdapter`]; the adapter reports native
//! output of a Run through a bounded [`RunEventSink`]. The dispatcher — never the
//! adapter — owns wire framing, admission, receipts and ordering.
//!
//! Implementations:
//! * [`controlled::ControlledAdapter`]: driven by a conformance harness over the
//!   documented control channel (`docs/control-channel.md`).
//! * [`command::CommandAdapter`]: a real Harness that runs a configured local program
//!   per Turn (input on stdin, stdout lines as deltas, exit status as the outcome).
//!
//! An adapter must never block the dispatcher's receive loop: every method is async
//! and the dispatcher bounds each call with the spec's timers.

pub mod command;
pub mod controlled;

use async_trait::async_trait;
use serde_json::Value;

use super::wire::{
    AgentKind, AgentKindDeclaration, CallId, ExecutionConfiguration, ExecutorId, FunctionCall,
    InputId, InteractionId, MessageInput, NativeSessionId, Outcome, OutputMessage,
    PermissionRequest, PermissionVerdict, PromptForUserChoice, PromptForUserChoiceDecision, RunId,
    ToolCall, Usage, Uuid,
};

/// Capacity of one Run's native event queue. A full queue applies backpressure to the
/// adapter; it never drops events.
pub const RUN_EVENT_QUEUE: usize = 256;

/// Why a native call did not succeed. The distinction matters: a `Refused` call had no
/// effect, an `Unknown` one may have, and `Unsupported` from a declared operation is a
/// contract violation ("Capability declarations").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// The native side refused or failed the call; nothing was applied.
    #[error("native call refused: {0}")]
    Refused(String),
    /// The outcome is unknown (for instance the call was interrupted).
    #[error("native outcome unknown: {0}")]
    Unknown(String),
    /// `ErrUnsupportedOperation`: the adapter does not implement the operation.
    #[error("unsupported operation: {0}")]
    Unsupported(String),
    /// The Harness is unavailable.
    #[error("harness unavailable: {0}")]
    Unavailable(String),
}

impl AdapterError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            AdapterError::Refused(_) => "refused",
            AdapterError::Unknown(_) => "unknown",
            AdapterError::Unsupported(_) => "unsupported",
            AdapterError::Unavailable(_) => "unavailable",
        }
    }
}

/// Native preparation of a new Executor.
#[derive(Debug, Clone, PartialEq)]
pub struct NativePrepare {
    /// Executor ID the Runtime allocated for it.
    pub executor_id: ExecutorId,
    /// Session identity.
    pub session_id: Uuid,
    /// Agent kind.
    pub agent_kind: AgentKind,
    /// Immutable configuration (already validated by the dispatcher).
    pub configuration: ExecutionConfiguration,
}

/// Native start of a Run on a prepared Executor.
#[derive(Debug, Clone, PartialEq)]
pub struct NativeStart {
    /// The Executor.
    pub executor_id: ExecutorId,
    /// The Run.
    pub run_id: RunId,
    /// Ordered input.
    pub input: Vec<MessageInput>,
}

/// How a confirmed native cancellation ends the Run's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelSettlement {
    /// The native stream will still deliver [`NativeEvent::Settled`] (so `done` follows
    /// the cancel receipt).
    StreamSettles,
    /// The native Turn stopped without a terminal event: no `done` is published and the
    /// cancel receipt carries the continuity snapshot.
    Stopped,
}

/// Native output of one Run, in native order.
#[derive(Debug, Clone, PartialEq)]
pub enum NativeEvent {
    /// Text fragment.
    Delta {
        /// Text.
        text: String,
        /// Native item ID.
        item_id: Option<String>,
    },
    /// Reasoning fragment.
    Thinking {
        /// Text.
        text: String,
    },
    /// Message item lifecycle (forwarded only with `observe_messages`).
    OutputMessage(OutputMessage),
    /// Tool observation.
    ToolCall(ToolCall),
    /// Cumulative usage snapshot.
    Usage(Usage),
    /// Native error with *unclassified* metadata; the Runtime classifies it.
    Error {
        /// Message.
        message: String,
        /// Raw native code (any JSON value).
        code: Option<Value>,
        /// Raw native HTTP status (any JSON value).
        http_status: Option<Value>,
    },
    /// Permission request.
    PermissionRequest(PermissionRequest),
    /// The native side withdrew a permission request.
    PermissionCancel {
        /// The withdrawn request.
        request_id: InteractionId,
    },
    /// User-choice prompt.
    PromptForUserChoice(PromptForUserChoice),
    /// Function call.
    FunctionCall(FunctionCall),
    /// Native consumption of an active input was confirmed.
    InputAccepted {
        /// The input.
        input_id: InputId,
    },
    /// The native Turn settled; no event follows.
    Settled {
        /// Native outcome.
        outcome: Outcome,
        /// Native Session identity, when known.
        native_session_id: Option<NativeSessionId>,
    },
}

/// Where an adapter delivers one Run's native events (bounded, see [`RUN_EVENT_QUEUE`]).
pub type RunEventSink = tokio::sync::mpsc::Sender<NativeEvent>;

/// The Harness adapter the Runtime dispatcher calls.
#[async_trait]
pub trait HarnessAdapter: Send + Sync + 'static {
    /// Declarations for the registry (validated by the Runtime before use).
    fn declarations(&self) -> Vec<AgentKindDeclaration>;

    /// Prepares a new native Executor.
    async fn prepare(&self, request: NativePrepare) -> Result<(), AdapterError>;

    /// Starts a Run; native output goes to `events` until [`NativeEvent::Settled`].
    async fn start(&self, request: NativeStart, events: RunEventSink) -> Result<(), AdapterError>;

    /// Writes one active input natively. `Ok` proves the write, not consumption
    /// (consumption arrives as [`NativeEvent::InputAccepted`]).
    async fn write_input(
        &self,
        run_id: &RunId,
        input_id: &InputId,
        input: &[MessageInput],
    ) -> Result<(), AdapterError>;

    /// Requests native cancellation; resolves when the native side confirmed it.
    async fn cancel(&self, run_id: &RunId) -> Result<CancelSettlement, AdapterError>;

    /// Applies a permission decision.
    async fn resolve_permission(
        &self,
        run_id: &RunId,
        request_id: &InteractionId,
        decision: PermissionVerdict,
    ) -> Result<(), AdapterError>;

    /// Applies a validated user-choice decision.
    async fn resolve_user_choice(
        &self,
        run_id: &RunId,
        ask_id: &InteractionId,
        decision: &PromptForUserChoiceDecision,
    ) -> Result<(), AdapterError>;

    /// Delivers a function result.
    async fn function_result(
        &self,
        run_id: &RunId,
        call_id: &CallId,
        output: &str,
        is_error: bool,
    ) -> Result<(), AdapterError>;

    /// Closes an Executor (cleanup). An error keeps ownership: the Runtime retries.
    async fn close_executor(&self, executor_id: &ExecutorId) -> Result<(), AdapterError>;

    /// Called once, just before the Runtime process exits: the adapter settles what it
    /// owes its own peers within a short bound (the controlled adapter answers every
    /// control request it has read, so a request whose effect let the Runtime finish is
    /// not left unanswered). Default: nothing.
    async fn finish(&self) {}
}
