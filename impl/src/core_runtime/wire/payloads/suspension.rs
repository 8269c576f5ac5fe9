//! Suspension fencing.

use super::*;

/// `environment_quiesce` / `environment_resume` (Core → Runtime).
/// `Envelope.id`: the suspension ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentFence {
    /// The Environment to quiesce or resume.
    pub environment_id: Uuid,
}

/// Outcome of a suspension fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FenceStatus {
    /// Applied.
    Applied,
    /// Rejected (see `error_code`).
    Rejected,
}

/// Bounded error categories of suspension fencing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FenceErrorCode {
    /// Not this Runtime's Environment.
    EnvironmentMismatch,
    /// Executions are still active; quiesce refused.
    ExecutionActive,
    /// Resume names another suspension than the current one.
    StaleSuspension,
    /// Not quiesced.
    NotQuiesced,
}

/// `environment_quiesced` / `environment_resumed` (Runtime → Core).
/// `Envelope.id`: the suspension ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentFenceResult {
    /// The Environment.
    pub environment_id: Uuid,
    /// Applied or rejected.
    pub status: FenceStatus,
    /// Why rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<FenceErrorCode>,
}
