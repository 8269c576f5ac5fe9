//! Function calls.

use super::*;

/// `function_call` (Runtime → Core). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionCall {
    /// Native function call identity.
    pub call_id: CallId,
    /// Function name.
    pub name: BoundedString<128>,
    /// Arguments as a JSON value.
    pub arguments: Value,
}

/// `function_result` (Core → Runtime). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FunctionResult {
    /// The call answered.
    pub call_id: CallId,
    /// This resolve attempt.
    pub delivery_id: DeliveryId,
    /// Output text.
    pub output: Text,
    /// Whether the output is an error.
    pub is_error: bool,
}
