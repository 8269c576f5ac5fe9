//! Identity newtypes of the Core ↔ Runtime protocol ("Envelope and identity").

use crate::wire::ids::ID_MAX_BYTES;

pub use crate::wire::ids::Uuid;

crate::wire_id!(
    /// Runtime-owned native resource; may be kept across settled Turns with identical configuration.
    ExecutorId, ID_MAX_BYTES);
crate::wire_id!(
    /// Runtime-generated reservation, valid only on the connection that accepted it.
    AdmissionHandle, ID_MAX_BYTES);
crate::wire_id!(
    /// One execution attempt; `Envelope.id` of output, cancel, active input and function frames.
    RunId, ID_MAX_BYTES);
crate::wire_id!(
    /// `Envelope.id` of prepare, start, release and status; distinct from the Run.
    PreparationRequestId, ID_MAX_BYTES);
crate::wire_id!(
    /// `permission_request.payload.request_id` or `prompt_for_user_choice.payload.ask_id`.
    InteractionId, ID_MAX_BYTES);
crate::wire_id!(
    /// One resolve attempt of an interaction, function result or cancel.
    DeliveryId, ID_MAX_BYTES);
crate::wire_id!(
    /// One active-input receipt.
    InputId, ID_MAX_BYTES);
crate::wire_id!(
    /// One native function call.
    CallId, ID_MAX_BYTES);
crate::wire_id!(
    /// Connection-local transfer correlation (`Envelope.id` of `runtime_prepare` frames).
    TransferId, ID_MAX_BYTES);
crate::wire_id!(
    /// Fencing of a durable suspension attempt (`Envelope.id` of quiesce/resume frames).
    SuspensionId, ID_MAX_BYTES);
crate::wire_id!(
    /// Name of an agent kind (a Runtime + Harness combination) declared in heartbeats.
    AgentKind, 64);
crate::wire_id!(
    /// Native Session identity reported by the Harness.
    NativeSessionId, ID_MAX_BYTES);
crate::wire_id!(
    /// Native output item identity (message items, tool calls).
    ItemId, ID_MAX_BYTES);
