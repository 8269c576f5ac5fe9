//! The `host_request` variants ("Message vocabulary": "Implemented request variants"),
//! one typed request per method the spec lists, so that the wire is checked even for
//! methods whose behaviour the host implements later. Field names and shapes are the
//! spec's JSON examples; a value the examples leave free (`payload`, `result`, `evidence`
//! items) is any JSON value.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::hooks::Slot;
use super::ids::Nullable;

/// The `scope` of an orientation request (the spec's example: `{"kind":"global"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Scope {
    /// The global scope.
    Global,
}

/// One host request (`host_request.request`), tagged by `method`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "method", deny_unknown_fields)]
pub enum HostRequest {
    /// `local.send`: local speech to the operator lane.
    #[serde(rename = "local.send")]
    LocalSend {
        /// The message text.
        text: String,
    },
    /// `runtime.wait`: the turn boundary ("Wait seconds are null or finite >0 and
    /// <=600").
    #[serde(rename = "runtime.wait")]
    RuntimeWait {
        /// Seconds to wait, or `null` for no deadline.
        seconds: Nullable<f64>,
        /// Why the cell waits.
        reason: String,
    },
    /// `hooks.list`.
    #[serde(rename = "hooks.list")]
    HooksList {},
    /// `hooks.describe`.
    #[serde(rename = "hooks.describe")]
    HooksDescribe {
        /// The slot to describe.
        slot: Slot,
    },
    /// `runtime.inspect`.
    #[serde(rename = "runtime.inspect")]
    RuntimeInspect {},
    /// `runtime.instructions`.
    #[serde(rename = "runtime.instructions")]
    RuntimeInstructions {},
    /// `skills.index`.
    #[serde(rename = "skills.index")]
    SkillsIndex {},
    /// `skills.load`.
    #[serde(rename = "skills.load")]
    SkillsLoad {
        /// The skill ID.
        id: String,
    },
    /// `workspace.info`.
    #[serde(rename = "workspace.info")]
    WorkspaceInfo {},
    /// `workspace.run`.
    #[serde(rename = "workspace.run")]
    WorkspaceRun {
        /// Program and arguments.
        argv: Vec<String>,
        /// Working directory, workspace-relative.
        cwd: String,
        /// Extra environment.
        env: BTreeMap<String, String>,
        /// Time bound, in milliseconds.
        timeout_ms: u64,
        /// Output bound, in bytes.
        max_output_bytes: u64,
    },
    /// `evidence.resolve`.
    #[serde(rename = "evidence.resolve")]
    EvidenceResolve {
        /// Evidence references (`event:42`).
        refs: Vec<String>,
    },
    /// `behavior.activate`: activate a source release at an expected epoch.
    #[serde(rename = "behavior.activate")]
    BehaviorActivate {
        /// Absolute path of the release.
        path: String,
        /// The epoch the caller expects to replace.
        expected_epoch: u64,
    },
    /// `maintenance.originate`.
    #[serde(rename = "maintenance.originate")]
    MaintenanceOriginate {
        /// Purpose of the work item.
        purpose: String,
        /// Why.
        reason: String,
        /// Evidence references.
        evidence_refs: Vec<String>,
    },
    /// `maintenance.assess`.
    #[serde(rename = "maintenance.assess")]
    MaintenanceAssess {
        /// The work item.
        work_item_id: String,
        /// The outcome (`no-change`, …).
        outcome: String,
    },
    /// `orientation.stage`.
    #[serde(rename = "orientation.stage")]
    OrientationStage {
        /// Candidate ID.
        candidate_id: String,
        /// Candidate text.
        text: String,
        /// Its target.
        target: String,
        /// Its scope.
        scope: Scope,
    },
    /// `orientation.current`.
    #[serde(rename = "orientation.current")]
    OrientationCurrent {
        /// The scope.
        scope: Scope,
    },
    /// `orientation.adopt`.
    #[serde(rename = "orientation.adopt")]
    OrientationAdopt {
        /// Candidate ID.
        candidate_id: String,
        /// Operation ID.
        operation_id: String,
    },
    /// `frontier.select`.
    #[serde(rename = "frontier.select")]
    FrontierSelect {},
    /// `peer.open` (also accepted as `agents.open`).
    #[serde(rename = "peer.open", alias = "agents.open")]
    PeerOpen {
        /// Peer mode (`independent`, …).
        mode: String,
        /// Evidence.
        evidence: Vec<Value>,
    },
    /// `peer.send` (also accepted as `peer.message`).
    #[serde(rename = "peer.send", alias = "peer.message")]
    PeerSend {
        /// The peer.
        peer_id: String,
        /// The request ID.
        request_id: String,
        /// Content.
        content: String,
        /// Evidence.
        evidence: Vec<Value>,
    },
    /// `peer.result`.
    #[serde(rename = "peer.result")]
    PeerResult {
        /// The request ID.
        request_id: String,
        /// How long to wait, in milliseconds.
        wait_ms: u64,
    },
    /// `peer.submit_result`.
    #[serde(rename = "peer.submit_result")]
    PeerSubmitResult {
        /// The request ID.
        request_id: String,
        /// The result.
        result: Value,
    },
    /// `peer.cancel`.
    #[serde(rename = "peer.cancel")]
    PeerCancel {
        /// The request ID.
        request_id: String,
    },
    /// `peer.get`.
    #[serde(rename = "peer.get")]
    PeerGet {
        /// The peer.
        peer_id: String,
    },
    /// `peer.list`.
    #[serde(rename = "peer.list")]
    PeerList {},
    /// `peer.stop`.
    #[serde(rename = "peer.stop")]
    PeerStop {
        /// The peer.
        peer_id: String,
        /// Drain before stopping.
        drain: bool,
    },
    /// `remote.ensure`.
    #[serde(rename = "remote.ensure")]
    RemoteEnsure {
        /// The remote target.
        target: String,
    },
    /// `remote.call`.
    #[serde(rename = "remote.call")]
    RemoteCall {
        /// The remote target.
        target: String,
        /// Namespace ID.
        namespace_id: String,
        /// Namespace generation.
        namespace_generation: String,
        /// Operation ID.
        operation_id: String,
        /// Operation (`execute`, …).
        operation: String,
        /// Its payload.
        payload: Value,
    },
    /// `remote.cancel`.
    #[serde(rename = "remote.cancel")]
    RemoteCancel {
        /// Namespace ID.
        namespace_id: String,
        /// Namespace generation.
        namespace_generation: String,
        /// Operation ID.
        operation_id: String,
    },
    /// `remote.close`.
    #[serde(rename = "remote.close")]
    RemoteClose {
        /// Namespace ID.
        namespace_id: String,
        /// Namespace generation.
        namespace_generation: String,
    },
}

impl HostRequest {
    /// The method name as written on the wire.
    pub fn method(&self) -> &'static str {
        match self {
            HostRequest::LocalSend { .. } => "local.send",
            HostRequest::RuntimeWait { .. } => "runtime.wait",
            HostRequest::HooksList {} => "hooks.list",
            HostRequest::HooksDescribe { .. } => "hooks.describe",
            HostRequest::RuntimeInspect {} => "runtime.inspect",
            HostRequest::RuntimeInstructions {} => "runtime.instructions",
            HostRequest::SkillsIndex {} => "skills.index",
            HostRequest::SkillsLoad { .. } => "skills.load",
            HostRequest::WorkspaceInfo {} => "workspace.info",
            HostRequest::WorkspaceRun { .. } => "workspace.run",
            HostRequest::EvidenceResolve { .. } => "evidence.resolve",
            HostRequest::BehaviorActivate { .. } => "behavior.activate",
            HostRequest::MaintenanceOriginate { .. } => "maintenance.originate",
            HostRequest::MaintenanceAssess { .. } => "maintenance.assess",
            HostRequest::OrientationStage { .. } => "orientation.stage",
            HostRequest::OrientationCurrent { .. } => "orientation.current",
            HostRequest::OrientationAdopt { .. } => "orientation.adopt",
            HostRequest::FrontierSelect {} => "frontier.select",
            HostRequest::PeerOpen { .. } => "peer.open",
            HostRequest::PeerSend { .. } => "peer.send",
            HostRequest::PeerResult { .. } => "peer.result",
            HostRequest::PeerSubmitResult { .. } => "peer.submit_result",
            HostRequest::PeerCancel { .. } => "peer.cancel",
            HostRequest::PeerGet { .. } => "peer.get",
            HostRequest::PeerList {} => "peer.list",
            HostRequest::PeerStop { .. } => "peer.stop",
            HostRequest::RemoteEnsure { .. } => "remote.ensure",
            HostRequest::RemoteCall { .. } => "remote.call",
            HostRequest::RemoteCancel { .. } => "remote.cancel",
            HostRequest::RemoteClose { .. } => "remote.close",
        }
    }

    /// Checks what typed decoding cannot: `runtime.wait` seconds are `null` or finite,
    /// `> 0` and `<=` [`super::limits::WAIT_SECONDS_MAX`].
    ///
    /// # Errors
    /// The reason, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if let HostRequest::RuntimeWait {
            seconds: Nullable(Some(s)),
            ..
        } = self
            && !(s.is_finite() && *s > 0.0 && *s <= super::limits::WAIT_SECONDS_MAX)
        {
            return Err(format!(
                "runtime.wait seconds must be null or finite, > 0 and <= {}, got {s}",
                super::limits::WAIT_SECONDS_MAX
            ));
        }
        Ok(())
    }
}
