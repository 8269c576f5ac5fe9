//! Capabilities and liveness.

use super::*;

/// `heartbeat` (Runtime → Core). `Envelope.id`: `hb-<n>`, counting from 1 per connection.
///
/// Proves liveness only ("Ownership and connection" step 5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// Runtime build version (not the wire version).
    pub runtime_version: BoundedString<64>,
    /// Every agent kind the Runtime declares; a kind missing here is undeclared.
    pub supported_agent_kinds: BoundedVec<AgentKindDeclaration, AGENT_KINDS_MAX>,
}

/// `device_shutdown` (Core → Runtime). `Envelope.id`: a request ID. Empty payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct DeviceShutdown {}
