//! Run events.

use super::*;

/// `delta` (Runtime → Core). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Delta {
    /// Text fragment.
    pub text: Text,
    /// Native item ID (only with `observe_messages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<ItemId>,
}

/// `thinking` (Runtime → Core). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Thinking {
    /// Reasoning text fragment.
    pub text: Text,
}

/// Lifecycle state of an output message item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Item started.
    Started,
    /// Item completed.
    Completed,
}

/// `output_message` (Runtime → Core, only with `observe_messages`). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputMessage {
    /// Native item ID.
    pub item_id: ItemId,
    /// Started or completed.
    pub state: ItemState,
    /// Message phase (e.g. `commentary`, `final_answer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BoundedString<64>>,
    /// Completed text (on `completed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Text>,
}

/// Tool call lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallState {
    /// Started.
    Started,
    /// Completed.
    Completed,
    /// Failed.
    Failed,
}

/// Engine-independent observation of a native tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolObservation {
    /// Category, e.g. `command`, `file_change`, `web_search`, `mcp`.
    pub kind: BoundedString<64>,
    /// Human-readable summary.
    pub summary: BoundedString<4096>,
}

/// `tool_call` (Runtime → Core). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// Native tool call ID.
    pub call_id: CallId,
    /// Tool name.
    pub tool_name: BoundedString<128>,
    /// Lifecycle state.
    pub state: ToolCallState,
    /// Engine-independent observation.
    pub observation: ToolObservation,
}

/// `usage` (Runtime → Core). `Envelope.id`: Run ID. A **cumulative** snapshot of the
/// current execution that replaces the previous one; an absent field is unknown, not zero.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Input tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Cached input tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    /// Output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Reasoning output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_output_tokens: Option<u64>,
}

/// Accepted native failure classification codes ("Native failure classification").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EngineErrorCode {
    /// authentication_error
    AuthenticationError,
    /// rate_limit_exceeded
    RateLimitExceeded,
    /// usage_limit_exceeded
    UsageLimitExceeded,
    /// server_overloaded
    ServerOverloaded,
    /// server_error
    ServerError,
    /// invalid_request
    InvalidRequest,
    /// resource_not_found
    ResourceNotFound,
    /// request_timeout
    RequestTimeout,
    /// context_length_exceeded
    ContextLengthExceeded,
    /// cyber_policy
    CyberPolicy,
    /// connection_failed (the only code that keeps `http_status`)
    ConnectionFailed,
}

impl EngineErrorCode {
    /// Every accepted code, as on the wire.
    pub const ALL: [&'static str; 11] = [
        "authentication_error",
        "rate_limit_exceeded",
        "usage_limit_exceeded",
        "server_overloaded",
        "server_error",
        "invalid_request",
        "resource_not_found",
        "request_timeout",
        "context_length_exceeded",
        "cyber_policy",
        "connection_failed",
    ];

    /// Parses an accepted code; anything else (unknown, malformed) is `None`.
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_value(Value::String(value.to_string())).ok()
    }
}

/// Classifies a native error's metadata: an unknown or malformed code stays
/// unclassified, and `http_status` survives only for `connection_failed` when it is
/// an integer in 100..=599 ("Native failure classification"). Never looks at text.
pub fn classify_native_error(
    code: Option<&Value>,
    http_status: Option<&Value>,
) -> (Option<EngineErrorCode>, Option<u16>) {
    let code = code
        .and_then(Value::as_str)
        .and_then(EngineErrorCode::parse);
    let status = match code {
        Some(EngineErrorCode::ConnectionFailed) => http_status
            .and_then(Value::as_u64)
            .filter(|s| (100..=599).contains(s))
            .map(|s| s as u16),
        _ => None,
    };
    (code, status)
}

/// `error` (Runtime → Core). `Envelope.id`: Run ID. Always followed by `done`.
///
/// Decoding classifies the optional metadata ("Native failure classification"): "A
/// missing, malformed or unknown value stays an unclassified error, without dropping
/// Usage or `done`", so a `code` that is not an accepted code (or not a string) decodes
/// as `None` and `http_status` survives only beside `connection_failed` as an integer in
/// 100..=599, instead of failing the frame. Only `message` and unknown fields can refuse
/// an `error` frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, from = "RawRunError")]
#[schemars(!from)]
pub struct RunError {
    /// Human-readable message.
    pub message: BoundedString<8192>,
    /// Optional accepted classification code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<EngineErrorCode>,
    /// Only with `connection_failed`, 100..=599.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 599))]
    pub http_status: Option<u16>,
}

/// An `error` payload as it arrives: `code` and `http_status` are any JSON value until
/// [`classify_native_error`] keeps the accepted ones.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRunError {
    message: BoundedString<8192>,
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    http_status: Option<Value>,
}

impl From<RawRunError> for RunError {
    fn from(raw: RawRunError) -> Self {
        let (code, http_status) =
            classify_native_error(raw.code.as_ref(), raw.http_status.as_ref());
        Self {
            message: raw.message,
            code,
            http_status,
        }
    }
}

/// Native terminal outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Completed.
    Completed,
    /// Failed (an `error` preceded `done`).
    Failed,
    /// Cancelled.
    Cancelled,
}

/// `done` (Runtime → Core). `Envelope.id`: Run ID. Closes the Run's stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Done {
    /// Observed native outcome.
    pub outcome: Outcome,
    /// Final cumulative usage snapshot, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Native Session identity, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_session_id: Option<NativeSessionId>,
}

/// `prompt_cancel` (Core → Runtime). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptCancel {
    /// Identifies this cancel attempt; the cancel receipt must match it.
    pub delivery_id: DeliveryId,
}
