//! Typed payloads of every message in the spec's "Message families" table.
//!
//! Each struct is the `payload` of one Envelope `type`; the Envelope `id` it travels
//! with is documented on the struct (its meaning depends on the type, see
//! "Envelope and identity"). All structs deny unknown fields; optional fields are
//! absent rather than `null`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::capabilities::AgentKindDeclaration;
use super::ids::*;
use super::limits::*;
use crate::wire::bounded::{Base64Bytes, BoundedString, BoundedVec};

/// Workspace-relative path (`/`-separated, no `..`, no leading `/`; validated by the Runtime).
pub type WirePath = BoundedString<PATH_MAX_BYTES>;
/// Bounded text field.
pub type Text = BoundedString<TEXT_MAX_BYTES>;
/// Lower-case hex SHA-256 digest (64 characters; validated by the receiver).
pub type Sha256Hex = BoundedString<64>;

// ---------------------------------------------------------------------------
// Capabilities and liveness
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// runtime_prepare: initialization and file/archive transfer
// ---------------------------------------------------------------------------

/// Kind of a `runtime_prepare` transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransferKind {
    /// One file installed at `path`.
    File,
    /// A POSIX tar archive unpacked under directory `path`.
    Archive,
}

/// `runtime_prepare` (Core → Runtime). `Envelope.id`: the transfer ID (for
/// `initialize`, a request ID). Phases follow "Preparation and execution order":
/// `begin` → `ready`, ordered `chunk` → matching `received`, `commit` → `completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum RuntimePrepare {
    /// Initialize the connection's Environment binding.
    Initialize {
        /// Environment the Runtime must be bound to.
        environment_id: Uuid,
    },
    /// Typed header opening a transfer; carries no file data.
    Begin {
        /// Environment the transfer installs into.
        environment_id: Uuid,
        /// File or archive.
        kind: TransferKind,
        /// Workspace-relative destination.
        path: WirePath,
        /// Total bytes that will follow, at most [`WRITE_TRANSFER_MAX_BYTES`].
        size: u64,
        /// SHA-256 of the complete body.
        sha256: Sha256Hex,
    },
    /// One ordered chunk of at most [`WRITE_CHUNK_MAX_BYTES`].
    Chunk {
        /// Byte offset of `data` in the body; must equal the bytes received so far.
        offset: u64,
        /// The chunk bytes.
        data: Base64Bytes<WRITE_CHUNK_MAX_BYTES>,
    },
    /// Typed trailer: verify and install.
    Commit {},
}

/// Bounded error codes of `runtime_prepare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransferErrorCode {
    /// Another transfer is open on this connection ("One transfer per connection at a time").
    TransferInProgress,
    /// No open transfer has this ID.
    UnknownTransfer,
    /// A chunk's offset is not the next expected offset.
    UnexpectedOffset,
    /// The body exceeds its declared size or the transfer bound.
    SizeExceeded,
    /// Commit arrived before all declared bytes.
    Incomplete,
    /// The SHA-256 of the received body differs from the declared one.
    DigestMismatch,
    /// The destination path is not a valid workspace-relative path.
    InvalidPath,
    /// The environment is not the one this Runtime is bound to.
    EnvironmentMismatch,
    /// Installing the verified body failed.
    InstallFailed,
}

/// `runtime_prepare_result` (Runtime → Core). `Envelope.id`: as the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum RuntimePrepareResult {
    /// The Environment binding is initialized.
    Initialized {
        /// The bound Environment.
        environment_id: Uuid,
    },
    /// The transfer is open; send chunks.
    Ready {},
    /// A chunk was staged (not installed).
    Received {
        /// Offset of the staged chunk.
        offset: u64,
        /// Bytes staged so far.
        received: u64,
    },
    /// The commit was verified and installed.
    Completed {
        /// Installed workspace-relative path.
        path: WirePath,
        /// Installed body size.
        size: u64,
        /// Verified SHA-256.
        sha256: Sha256Hex,
    },
    /// The transfer (or initialization) failed and is closed.
    Failed {
        /// Bounded error category.
        code: TransferErrorCode,
    },
}

// ---------------------------------------------------------------------------
// Execution admission
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Run events
// ---------------------------------------------------------------------------

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
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

// ---------------------------------------------------------------------------
// Interactions
// ---------------------------------------------------------------------------

/// `permission_request` (Runtime → Core). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionRequest {
    /// The interaction ID.
    pub request_id: InteractionId,
    /// Tool asking for permission.
    pub tool_name: BoundedString<128>,
    /// What would happen.
    pub description: BoundedString<8192>,
}

/// `permission_cancel` (Runtime → Core). `Envelope.id`: the interaction ID.
/// The native side withdrew the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionCancel {
    /// The Run the request belonged to.
    pub run_id: RunId,
}

/// A permission decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PermissionVerdict {
    /// Allow once.
    Allow,
    /// Deny.
    Deny,
}

/// `permission_decision` (Core → Runtime). `Envelope.id`: the interaction ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PermissionDecision {
    /// This resolve attempt.
    pub delivery_id: DeliveryId,
    /// The decision.
    pub decision: PermissionVerdict,
}

/// One option of a question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChoiceOption {
    /// Label (also the answer value).
    pub label: BoundedString<256>,
    /// Optional description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<BoundedString<1024>>,
}

/// One question of a user-choice prompt. Order and header do not identify answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Question {
    /// Identity of the question.
    pub question_id: InteractionId,
    /// Display header.
    pub header: BoundedString<256>,
    /// Question text.
    pub question: BoundedString<4096>,
    /// Options.
    pub options: BoundedVec<ChoiceOption, CHOICES_MAX>,
    /// Whether several answers may be chosen.
    pub multi_select: bool,
}

/// `prompt_for_user_choice` (Runtime → Core). `Envelope.id`: Run ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptForUserChoice {
    /// The interaction ID.
    pub ask_id: InteractionId,
    /// The questions.
    pub questions: BoundedVec<Question, QUESTIONS_MAX>,
}

/// One provided answer: explicit `question_id`, `answers` (empty = explicitly not answered).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuestionAnswer {
    /// The question answered.
    pub question_id: InteractionId,
    /// Chosen labels.
    pub answers: BoundedVec<BoundedString<256>, CHOICES_MAX>,
}

/// `prompt_for_user_choice_decision` (Core → Runtime). `Envelope.id`: the interaction ID.
///
/// Exactly one shape is valid: `question_answers` (no `cancelled`), or
/// `cancelled: true` with no answers; see [`validate_question_answers`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromptForUserChoiceDecision {
    /// This resolve attempt.
    pub delivery_id: DeliveryId,
    /// Answers; omitted questions stay unanswered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question_answers: Option<BoundedVec<QuestionAnswer, QUESTIONS_MAX>>,
    /// `true` for a cancellation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<bool>,
}

/// Why a user-choice decision has an invalid shape ("Envelope and identity").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuestionAnswersError {
    /// Neither answers nor `cancelled: true`, or `cancelled: false`.
    #[error("a decision carries question_answers or cancelled: true")]
    NoShape,
    /// Both `cancelled: true` and answers.
    #[error("a cancellation carries no answers")]
    CancelledWithAnswers,
    /// An answer names a question that was not asked.
    #[error("question `{0}` was not asked")]
    UnknownQuestion(String),
    /// Two answers name the same question.
    #[error("question `{0}` is answered twice")]
    RepeatedQuestion(String),
}

/// Shared validation of a user-choice decision against the asked questions.
///
/// # Errors
/// [`QuestionAnswersError`] for any shape other than the two the spec allows.
pub fn validate_question_answers(
    asked: &[Question],
    decision: &PromptForUserChoiceDecision,
) -> Result<(), QuestionAnswersError> {
    match (&decision.question_answers, decision.cancelled) {
        (None, Some(true)) => Ok(()),
        (Some(_), Some(true)) => Err(QuestionAnswersError::CancelledWithAnswers),
        (None, _) | (Some(_), Some(false)) => Err(QuestionAnswersError::NoShape),
        (Some(answers), None) => {
            let mut seen = std::collections::HashSet::new();
            for answer in answers.iter() {
                let id = answer.question_id.as_str();
                if !asked.iter().any(|q| q.question_id.as_str() == id) {
                    return Err(QuestionAnswersError::UnknownQuestion(id.to_string()));
                }
                if !seen.insert(id) {
                    return Err(QuestionAnswersError::RepeatedQuestion(id.to_string()));
                }
            }
            Ok(())
        }
    }
}

/// The operation an `interaction_decision_ack` settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AckOperation {
    /// A `permission_decision`.
    PermissionDecision,
    /// A `prompt_for_user_choice_decision`.
    PromptForUserChoiceDecision,
    /// A `function_result`.
    FunctionResult,
    /// A `prompt_cancel` (the cancel receipt).
    PromptCancel,
}

/// Bounded error categories of decision acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AckErrorCode {
    /// The decision shape failed shared validation.
    InvalidDecision,
    /// No pending interaction, call or Run with this identity on this connection.
    UnknownInteraction,
    /// The interaction was already resolved by another delivery.
    AlreadyResolved,
    /// The native side refused or failed to apply the operation.
    NativeFailure,
    /// The operation needs a capability the owner was not admitted with.
    UnsupportedOperation,
    /// Native settlement could not be confirmed.
    SettlementUnknown,
}

/// Confirmed continuity snapshot of a stopped Turn, carried by a cancel receipt
/// when no `done` was emitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContinuitySnapshot {
    /// Partial text observed before the stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<Text>,
    /// Native Session identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_session_id: Option<NativeSessionId>,
    /// Last cumulative usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `interaction_decision_ack` (Runtime → Core). `Envelope.id`: the interaction ID for
/// decisions, the Run ID for cancel and function-result acknowledgements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InteractionDecisionAck {
    /// What was settled.
    pub operation: AckOperation,
    /// Must match the delivery ID of the request it acknowledges.
    pub delivery_id: DeliveryId,
    /// `true` only when the named operation settled natively.
    pub applied: bool,
    /// Function call this acknowledges (function results only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<CallId>,
    /// Why it was not applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<AckErrorCode>,
    /// Cancel receipts without a published `done` carry the continuity snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<ContinuitySnapshot>,
}

// ---------------------------------------------------------------------------
// Active input
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Function calls
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Workspace operations
// ---------------------------------------------------------------------------

/// The owner a workspace operation runs against: an existing preparation handle or
/// the Run it was transferred to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspaceTarget {
    /// A preparation handle on this connection.
    AdmissionHandle(AdmissionHandle),
    /// A Run on this connection.
    RunId(RunId),
}

/// Kind of a `workspace_read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReadOperation {
    /// List one directory.
    Directory,
    /// Read a file's bytes.
    Bytes,
}

/// `workspace_read` (Core → Runtime). `Envelope.id`: operation ID (≤ 128 bytes).
/// The payload (its compact JSON encoding; not the Envelope's `id` or `trace`) is
/// bounded to [`WORKSPACE_REQUEST_MAX_BYTES`] ("request payloads are bounded to 8 KiB").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceRead {
    /// Owner of the read.
    pub target: WorkspaceTarget,
    /// The exact frozen Environment identity.
    pub environment_id: Uuid,
    /// Directory listing or byte read.
    pub operation: ReadOperation,
    /// Workspace-relative path; empty selects the root (directory reads).
    pub path: WirePath,
    /// Byte limit (bytes reads; for directories mutually exclusive with `max_entries`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Entry limit (directory reads only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
    /// Starting byte offset (bytes reads only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else.
    Other,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DirectoryEntry {
    /// Single path component, at most 255 bytes of UTF-8.
    pub name: BoundedString<DIRECTORY_ENTRY_NAME_MAX_BYTES>,
    /// Entry kind.
    pub kind: EntryKind,
    /// Size in bytes (regular files only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// Status of a workspace operation result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceStatus {
    /// Complete (or explicitly truncated) and the native close is confirmed.
    Ok,
    /// A safe native refusal; carries no bytes.
    Refused,
    /// Interrupted, ambiguous or cleanup uncertain; carries no data.
    Unavailable,
    /// Refused before admission (bounds, identity, target checks).
    Rejected,
}

/// Bounded error categories of workspace operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceErrorCode {
    /// The request payload exceeds 8 KiB.
    RequestTooLarge,
    /// The correlation ID exceeds 128 bytes (and is not echoed).
    IdTooLong,
    /// The frame does not decode as this operation.
    InvalidRequest,
    /// No such handle or Run on this connection.
    UnknownTarget,
    /// The Environment is not the owner's frozen Environment.
    EnvironmentMismatch,
    /// The path is absolute, escapes the workspace or is malformed.
    InvalidPath,
    /// Both byte and entry limits were given for a directory read.
    ConflictingLimits,
    /// The path does not exist.
    NotFound,
    /// The path is not a directory (directory reads) or not a file (byte reads).
    WrongKind,
    /// Permission denied by the file system.
    PermissionDenied,
    /// An operation with this ID is already pending.
    DuplicateOperation,
    /// An earlier read of this owner was interrupted; later reads are stopped.
    OwnerStopped,
    /// A write transfer is already open for the owner, or execution is running.
    Busy,
    /// A write chunk's offset is not the next expected offset.
    UnexpectedOffset,
    /// The write exceeds its declared size or 50 MiB.
    SizeExceeded,
    /// Commit before all declared bytes.
    Incomplete,
    /// The SHA-256 of the written body differs.
    DigestMismatch,
    /// The transfer expired before commit.
    Expired,
    /// The native close could not be confirmed.
    CleanupUnconfirmed,
    /// The export exceeds the 1 MiB result bound.
    ResultTooLarge,
    /// The owner lacks the capability the operation needs.
    UnsupportedOperation,
}

/// `workspace_read_result` (Runtime → Core). `Envelope.id`: the operation ID, or `""`
/// when the request's ID was over 128 bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceReadResult {
    /// Outcome.
    pub status: WorkspaceStatus,
    /// Directory entries (directory reads with `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<BoundedVec<DirectoryEntry, DIRECTORY_ENTRIES_MAX>>,
    /// File bytes (byte reads with `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Base64Bytes<WORKSPACE_READ_RESULT_MAX_BYTES>>,
    /// Explicit truncation (with `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// Why not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<WorkspaceErrorCode>,
}

/// `workspace_write` (Core → Runtime). `Envelope.id`: the operation ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspaceWrite {
    /// Typed header; no file data.
    Begin {
        /// Owner of the write.
        target: WorkspaceTarget,
        /// The exact frozen Environment identity.
        environment_id: Uuid,
        /// Workspace-relative file path.
        path: WirePath,
        /// Total size, at most 50 MiB.
        size: u64,
        /// SHA-256 of the complete body.
        sha256: Sha256Hex,
    },
    /// One acknowledged chunk of at most 64 KiB.
    Chunk {
        /// Offset; must equal the bytes received so far.
        offset: u64,
        /// The bytes.
        data: Base64Bytes<WRITE_CHUNK_MAX_BYTES>,
    },
    /// Verify the digest and run the installer.
    Commit {},
}

/// `workspace_write_result` (Runtime → Core). `Envelope.id`: the operation ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspaceWriteResult {
    /// The transfer is open.
    Ready {},
    /// A chunk was staged.
    Received {
        /// Offset of the staged chunk.
        offset: u64,
        /// Bytes staged so far.
        received: u64,
    },
    /// The exact commit receipt: the file is installed.
    Committed {
        /// Installed path.
        path: WirePath,
        /// Size.
        size: u64,
        /// Verified digest.
        sha256: Sha256Hex,
    },
    /// The exact rejection receipt: nothing was installed.
    Rejected {
        /// Why.
        error_code: WorkspaceErrorCode,
    },
}

/// `workspace_export` (Core → Runtime). `Envelope.id`: the operation ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceExport {
    /// Owner of the export.
    pub target: WorkspaceTarget,
    /// The exact frozen Environment identity.
    pub environment_id: Uuid,
    /// Workspace-relative file or directory to export.
    pub path: WirePath,
}

/// `workspace_export_result` (Runtime → Core). `Envelope.id`: the operation ID.
/// `data` is a POSIX tar archive of the exported path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceExportResult {
    /// Outcome.
    pub status: WorkspaceStatus,
    /// Tar archive bytes (with `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Base64Bytes<WORKSPACE_READ_RESULT_MAX_BYTES>>,
    /// SHA-256 of `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Sha256Hex>,
    /// Why not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<WorkspaceErrorCode>,
}

// ---------------------------------------------------------------------------
// Suspension fencing
// ---------------------------------------------------------------------------

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
