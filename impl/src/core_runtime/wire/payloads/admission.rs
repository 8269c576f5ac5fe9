//! Execution admission.

use super::*;

/// Web search control value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebSearch {
    /// Core always sends `disabled`.
    Disabled,
    /// Allowed when the engine profile declares the control.
    Enabled,
}

/// Text verbosity (default `medium`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TextVerbosity {
    /// Low.
    Low,
    /// Medium (default).
    Medium,
    /// High.
    High,
}

/// Programmatic tool calling control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProgrammaticToolCalling {
    /// Explicitly disabled (what Core sends).
    Disabled,
    /// Enabled.
    Enabled,
}

/// Structured output format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum OutputFormat {
    /// JSON Schema constrained output.
    JsonSchema {
        /// Schema name.
        name: BoundedString<128>,
        /// The JSON Schema.
        schema: Value,
    },
}

/// `execution_controls` of an execution configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionControls {
    /// Web search control.
    pub web_search: WebSearch,
    /// Resolved text verbosity.
    pub text_verbosity: TextVerbosity,
    /// Programmatic tool calling control.
    pub programmatic_tool_calling: ProgrammaticToolCalling,
    /// Optional `json_schema` output format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_format: Option<OutputFormat>,
}

/// Environment type of a local Environment binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentType {
    /// Hosted by the platform.
    OpenaiHosted,
    /// User-owned.
    SelfHosted,
}

/// `local_environment`: the exact Environment binding; carries no working directory
/// (the Runtime checks its own `workspace_directory` binding).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LocalEnvironment {
    /// The bound Environment.
    pub environment_id: Uuid,
    /// Its type.
    pub environment_type: EnvironmentType,
}

/// `require_existing_native_session`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NativeSessionRef {
    /// The verified native Session identity to resume.
    pub native_session_id: NativeSessionId,
}

/// One public `MCPHTTPServer` ("MCP connection permissions").
///
/// `connection_origin` is carried as a string so that a missing or unknown value is
/// rejected by the Runtime's shared validator as `invalid_mcp_connection_origin`
/// (a preparation rejection), not as a transport-level decode failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpHttpServer {
    /// Server name.
    pub name: BoundedString<128>,
    /// Server URL.
    pub url: BoundedString<2048>,
    /// Whether the Agent requires this server.
    pub required: bool,
    /// Vault credential reference for bearer auth, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_credential_ref: Option<BoundedString<256>>,
    /// `core_relay` or `runtime_direct`; see [`ConnectionOrigin`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_origin: Option<BoundedString<64>>,
}

/// The accepted `connection_origin` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionOrigin {
    /// Connections leave through Core.
    CoreRelay,
    /// Connections leave from the Runtime's own network.
    RuntimeDirect,
}

impl ConnectionOrigin {
    /// Parses a wire value with the shared validator.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "core_relay" => Some(Self::CoreRelay),
            "runtime_direct" => Some(Self::RuntimeDirect),
            _ => None,
        }
    }
}

/// The keys `agent_options` may carry ("Capability declarations" opt-in table).
pub const AGENT_OPTION_KEYS: [&str; 4] =
    ["model", "system_prompt", "model_provider", "harness_config"];

/// Immutable execution configuration of `execution_prepare`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct ExecutionConfiguration {
    /// `model`, `system_prompt`, optional `model_provider` and `harness_config`; any other
    /// key is rejected with `unsupported_configuration` before preparing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_options: Option<Map<String, Value>>,
    /// Execution controls (always set by Core for executions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_controls: Option<ExecutionControls>,
    /// Text deltas carry native item IDs and `output_message` frames are emitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe_messages: Option<bool>,
    /// Observe subagent identities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe_subagent_identities: Option<bool>,
    /// Disable subagents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_subagents: Option<bool>,
    /// Set when the Environment type is `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_execution_environment: Option<bool>,
    /// Set for `openai_hosted` and `self_hosted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_environment: Option<LocalEnvironment>,
    /// Set when a native Session must be resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_existing_native_session: Option<NativeSessionRef>,
    /// Public HTTP MCP servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<BoundedVec<McpHttpServer, MCP_SERVERS_MAX>>,
    /// The read-only preparation profile ("Workspace operations").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_read_only: Option<bool>,
}

/// `execution_prepare` (Core → Runtime). `Envelope.id`: the preparation request ID.
/// Carries no model input and no Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionPrepare {
    /// Explicit Session identity.
    pub session_id: Uuid,
    /// Agent kind to prepare.
    pub agent_kind: AgentKind,
    /// Immutable Session configuration.
    pub configuration: ExecutionConfiguration,
}

/// Role of a message input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InputRole {
    /// The user.
    User,
}

/// One content part of a message, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ContentPart {
    /// Text.
    Text {
        /// The text.
        text: Text,
    },
    /// An image; a text-only transport rejects it rather than dropping it.
    Image {
        /// MIME type, e.g. `image/png`.
        media_type: BoundedString<64>,
        /// Image bytes.
        data: Base64Bytes<IMAGE_MAX_BYTES>,
    },
}

/// `MessageInput`: one ordered message of initial, prepared or active input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageInput {
    /// Role.
    pub role: InputRole,
    /// Ordered content.
    pub content: BoundedVec<ContentPart, CONTENT_PARTS_MAX>,
}

/// `execution_start` (Core → Runtime). `Envelope.id`: the preparation request ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionStart {
    /// Executor from `ready`.
    pub executor_id: ExecutorId,
    /// Handle from `ready`.
    pub admission_handle: AdmissionHandle,
    /// The Run this start creates.
    pub run_id: RunId,
    /// Ordered input.
    pub input: BoundedVec<MessageInput, INPUT_MESSAGES_MAX>,
}

/// `execution_release` (Core → Runtime). `Envelope.id`: the preparation request ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutionRelease {
    /// Handle to release.
    pub admission_handle: AdmissionHandle,
}

/// The control operation a `rejected` status answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ControlOperation {
    /// `execution_prepare`.
    Prepare,
    /// `execution_start`.
    Start,
    /// `execution_release`.
    Release,
}

/// Bounded error categories of execution admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PreparationErrorCode {
    /// A Runtime bound (active preparations, executions, idle resources, admission
    /// records) is full; Core leaves the Turn queued for retry.
    PreparationCapacity,
    /// The configuration carries a key or shape the Runtime does not support.
    UnsupportedConfiguration,
    /// The declaration the owner was admitted under lacks a required capability.
    UnsupportedCapability,
    /// The Environment binding does not match the Runtime's own.
    InvalidBinding,
    /// A public MCP server has a missing or unknown `connection_origin`.
    InvalidMcpConnectionOrigin,
    /// The agent kind is not declared.
    UnknownAgentKind,
    /// The agent kind is declared unavailable.
    AgentUnavailable,
    /// No admission with this handle exists on this connection.
    UnknownHandle,
    /// The handle was already used, released, expired or failed.
    StaleHandle,
    /// The handle is not `ready` yet.
    HandleNotReady,
    /// The admission expired.
    AdmissionExpired,
    /// The same request ID arrived with a different fingerprint.
    ConflictingRequest,
    /// The start names another Executor than the handle's.
    ExecutorMismatch,
    /// The read-only preparation profile cannot be started.
    ReadOnlyProfile,
    /// The input is invalid (for instance image content on a text-only transport).
    InvalidInput,
    /// The Environment is quiesced.
    EnvironmentQuiesced,
    /// A workspace write holds the mutation owner.
    WorkspaceWriteInProgress,
    /// The Runtime is shutting down.
    ShuttingDown,
    /// Native preparation failed (confirmed).
    NativePreparationFailed,
    /// Native start failed (confirmed).
    NativeStartFailed,
    /// Local close failed; the Runtime keeps ownership and will retry.
    CleanupUnconfirmed,
}

/// `preparation_status` (Runtime → Core). `Envelope.id`: the preparation request ID.
///
/// `revision` orders one handle's observations; `rejected` answers a control
/// operation and does not replace the handle's revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum PreparationStatus {
    /// The Runtime owns the preparation.
    Preparing {
        /// Connection-local handle.
        admission_handle: AdmissionHandle,
        /// Revision of this observation.
        revision: u64,
    },
    /// The reservation is ready; no Run input is committed yet.
    Ready {
        /// Connection-local handle.
        admission_handle: AdmissionHandle,
        /// Revision.
        revision: u64,
        /// Owning Executor.
        executor_id: ExecutorId,
        /// Milliseconds until the admission expires (not extended by retries).
        expires_in_ms: u64,
    },
    /// Start accepted; transferring the reservation.
    Starting {
        /// Handle.
        admission_handle: AdmissionHandle,
        /// Revision.
        revision: u64,
        /// The Run.
        run_id: RunId,
    },
    /// Admission transferred to the named Turn.
    Started {
        /// Handle.
        admission_handle: AdmissionHandle,
        /// Revision.
        revision: u64,
        /// The Run.
        run_id: RunId,
    },
    /// Admission released (after a confirmed local close for the read-only profile).
    Released {
        /// Handle.
        admission_handle: AdmissionHandle,
        /// Revision.
        revision: u64,
    },
    /// Admission expired.
    Expired {
        /// Handle.
        admission_handle: AdmissionHandle,
        /// Revision.
        revision: u64,
    },
    /// Preparation failed, or cleanup is unconfirmed.
    Failed {
        /// Handle.
        admission_handle: AdmissionHandle,
        /// Revision.
        revision: u64,
        /// Bounded error category.
        error_code: PreparationErrorCode,
    },
    /// A control operation was rejected.
    Rejected {
        /// The rejected operation.
        operation: ControlOperation,
        /// Bounded error category.
        error_code: PreparationErrorCode,
        /// Handle the operation named, when it named a valid one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        admission_handle: Option<AdmissionHandle>,
    },
}
