//! Active input.

use super::*;

/// `prompt_steer` (Core → Runtime). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptSteer {
    /// Receipt identity of this input.
    pub input_id: InputId,
    /// Ordered input.
    pub input: BoundedVec<MessageInput, INPUT_MESSAGES_MAX>,
    /// Core sets `true` on every active input it delivers.
    pub durable_receipt: bool,
}

/// Active-input receipt kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SteerReceipt {
    /// The native write happened (not consumption).
    Written,
    /// The adapter confirmed native consumption.
    Accepted,
    /// The write was refused (definitely not written).
    Failed,
    /// The write did not finish within its budget; the outcome is unknown.
    Unknown,
    /// The input was refused before any native call.
    Rejected,
}

/// Bounded error categories of active input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SteerErrorCode {
    /// Another input of this Run has no settled receipt yet.
    InputInFlight,
    /// This input ID was already delivered.
    DuplicateInput,
    /// The Run is not active on this connection.
    UnknownRun,
    /// The native write failed.
    NativeWriteFailed,
    /// The native write exceeded its 10-second budget.
    NativeWriteTimeout,
    /// The owner was not admitted with `steering`.
    UnsupportedOperation,
    /// The input is invalid.
    InvalidInput,
}

/// `prompt_steer_ack` (Runtime → Core). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptSteerAck {
    /// The input this receipt is for.
    pub input_id: InputId,
    /// Receipt kind.
    pub receipt: SteerReceipt,
    /// Why, for `failed`, `unknown` and `rejected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<SteerErrorCode>,
}
