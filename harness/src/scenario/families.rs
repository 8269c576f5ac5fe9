//! What each family's scenarios may say: its sides, the parties that write frames, its
//! own step keywords, its `config` keys, and the check of a frame against the family's
//! single wire definition. Validation ([`super::validation`]) consults the table of the
//! scenario's family, so another family's keyword in a scenario is a load error with
//! file:line:column.
//!
//! This module is data plus one frame check per family; it never runs anything. The
//! engine's generic steps ([`GENERIC_STEPS`]) are valid in every family.

use contract_impl::core_runtime::gateway::admission::CAPABILITY_TABLE;
use contract_impl::core_runtime::wire::{AgentKindCapabilities, Direction, MessageType};
use serde_json::Value;

use std::collections::BTreeSet;

use super::model::{Party, Scenario, Side};

/// Step keywords every family has (the step engine's own steps).
pub const GENERIC_STEPS: &[&str] = &[
    "silence",
    "sleep",
    "any_order",
    "repeat",
    "optional",
    "tolerated",
    "reference",
    "disconnect",
    "half_close",
    "send_bytes",
    "expect_close",
    "expect_exit",
    "crash",
    "terminate",
];

/// One family's vocabulary.
#[derive(Debug, Clone, Copy)]
pub struct FamilyTable {
    /// The family (directory) name.
    pub family: &'static str,
    /// The sides that can be the target (`sides:`, `pending:`).
    pub sides: &'static [Side],
    /// The parties whose frames a scenario writes (their names are step keywords).
    pub parties: &'static [Party],
    /// The family's own step keywords (beyond the parties and [`GENERIC_STEPS`]).
    pub steps: &'static [&'static str],
    /// The `config:` keys the family's launch contracts read.
    pub config_keys: &'static [&'static str],
    /// The ops of `native:` steps (the target's control channel), when the family has
    /// that step.
    pub native_ops: &'static [&'static str],
    /// The side whose control channel performs `native:` steps.
    pub native_side: Option<Side>,
    /// Placeholders the launch contract binds before the first step (from `config:`), so
    /// a single use of one is no typo.
    pub prebound: fn(&str) -> bool,
    /// Checks a frame `party` writes against the family's wire (message type, direction);
    /// the reason when it does not fit.
    pub check_frame: fn(Party, &Value) -> Result<(), String>,
    /// Whether `null` is a value of the family's wire (worker: `revision: null`); where it
    /// is not, a scenario frame holding one is refused at load.
    pub nulls: bool,
    /// The optional features a target of this family may declare or not (`requires:` of
    /// a scenario and `--features FILE` name only these). Empty where the family's spec
    /// names nothing optional for a target.
    pub features: &'static [&'static str],
    /// The side whose target declares [`Self::features`] (core_runtime: the Runtime's
    /// capabilities); on other sides `requires:` is not judged and `--features` is refused.
    pub feature_side: Option<Side>,
    /// The features a scenario's steps exercise on [`Self::feature_side`], derived from
    /// its frames: the `requires:` of a scenario generated from a value table
    /// ([`super::tables`]).
    pub implied_features: fn(&Scenario) -> BTreeSet<&'static str>,
}

/// No feature derived (a family whose spec names nothing optional).
fn no_features(_: &Scenario) -> BTreeSet<&'static str> {
    BTreeSet::new()
}

impl FamilyTable {
    /// Whether `keyword` is a step of this family.
    pub fn has_step(&self, keyword: &str) -> bool {
        GENERIC_STEPS.contains(&keyword)
            || self.steps.contains(&keyword)
            || self.parties.iter().any(|p| p.as_str() == keyword)
    }

    /// Every step keyword of this family, for messages.
    pub fn step_names(&self) -> String {
        let mut names: Vec<&str> = self.parties.iter().map(|p| p.as_str()).collect();
        names.extend(self.steps);
        names.extend(GENERIC_STEPS);
        names.join(", ")
    }
}

/// The core_runtime frame check: an Envelope shape (`payload` a mapping, `id` a string),
/// a known message type, sent in its direction.
fn core_runtime_frame(party: Party, frame: &Value) -> Result<(), String> {
    let kind = frame
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match frame.get("payload") {
        Some(Value::Object(_)) => {}
        Some(Value::String(s)) if crate::bind::placeholder(s).is_some() => {}
        _ => return Err(format!("`{kind}`: `payload` must be a mapping")),
    }
    match frame.get("id") {
        Some(Value::String(_)) => {}
        Some(id) if matches!(crate::matcher::ReferencePattern::parse(id), Ok(Some(_))) => {}
        _ => return Err(format!("`{kind}`: `id` must be a string")),
    }
    let Some(t) = MessageType::parse(kind) else {
        return Err(format!("unknown message type `{kind}`"));
    };
    let expected = match party {
        Party::Core => Direction::CoreToRuntime,
        _ => Direction::RuntimeToCore,
    };
    if t.direction() == expected {
        Ok(())
    } else {
        Err(format!(
            "`{kind}` is not sent by {} (it travels {:?})",
            party.as_str(),
            t.direction()
        ))
    }
}

/// The Core ↔ Runtime family.
pub const CORE_RUNTIME: FamilyTable = FamilyTable {
    family: "core_runtime",
    sides: &[Side::Runtime, Side::Core],
    parties: &[Party::Core, Party::Runtime],
    steps: &[
        "native",
        "bootstrap",
        "connect",
        "handshake",
        "reconnect",
        "api",
        "api_result",
    ],
    config_keys: &["runtime", "core", "workspace"],
    native_ops: &[
        "emit",
        "settle",
        "accept_input",
        "settle_cancel",
        "fail",
        "hold",
        "release",
        "await",
        "report",
    ],
    native_side: Some(Side::Runtime),
    // `$declared_capabilities`: the declaration of kind `controlled` in the launch
    // configuration (`crate::family::core_runtime::DECLARED_CAPABILITIES`).
    prebound: |name| name == "declared_capabilities",
    check_frame: core_runtime_frame,
    nulls: false,
    features: CORE_RUNTIME_FEATURES,
    feature_side: Some(Side::Runtime),
    implied_features: crate::family::core_runtime::requires::implied_features,
};

/// The core_runtime capabilities a Runtime may declare unsupported while its kind stays
/// usable: every `AgentKindCapabilities` field but the seven the spec's table
/// ("Capability declarations") requires "always, for every execution on that Harness"
/// (`streaming`, `steering`, `durable_turns`, `durable_input_receipts`, `preparation`,
/// `execution_controls`, `tool_observations`): a kind without one of those runs nothing.
pub const CORE_RUNTIME_FEATURES: &[&str] = AgentKindCapabilities::FIELDS
    .split_at(CORE_RUNTIME_ALWAYS.len())
    .1;

/// The capabilities the spec's table requires "always" (its first row, as Core's
/// admission applies it); they lead the single wire definition's field order
/// ([`AgentKindCapabilities::FIELDS`]).
pub const CORE_RUNTIME_ALWAYS: &[&str] = CAPABILITY_TABLE[0].capabilities;

/// The worker frame check: a known message kind, sent in its direction.
fn worker_frame(party: Party, frame: &Value) -> Result<(), String> {
    use contract_impl::worker::wire::{Direction as WorkerDirection, KINDS};
    let kind = frame
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let Some((_, direction)) = KINDS.iter().find(|(k, _)| *k == kind) else {
        return Err(format!(
            "unknown message kind `{kind}` (kinds: {})",
            KINDS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
        ));
    };
    let expected = match party {
        Party::Host => WorkerDirection::HostToWorker,
        _ => WorkerDirection::WorkerToHost,
    };
    if *direction == expected {
        Ok(())
    } else {
        Err(format!("`{kind}` is not sent by the {}", party.as_str()))
    }
}

/// The host ↔ worker family.
pub const WORKER: FamilyTable = FamilyTable {
    family: "worker",
    sides: &[Side::Worker, Side::Host],
    parties: &[Party::Host, Party::Worker],
    steps: &[
        "native",
        "launch",
        "worker_stdio",
        "received_by",
        "write_workspace",
    ],
    // `workspace`: the host's workspace and data directory (side `host`, its skill roots).
    config_keys: &["worker", "workspace"],
    native_ops: &[
        "configure",
        "start_workbench",
        "execute",
        "interrupt",
        "attention",
        "review",
        "activate",
        "epoch",
        "diagnostics",
        "input",
        "instructions",
        "assemble",
        "fold",
        "lane",
        "shutdown",
        "await",
    ],
    native_side: Some(Side::Host),
    // The snapshot paths side host writes from `config.worker` (`hooks`, `snapshots`).
    prebound: |name| name == "hooks_dir" || name.starts_with("snapshot_"),
    check_frame: worker_frame,
    nulls: true,
    // "Message vocabulary" lists every `host_request` method as the host's to implement;
    // the spec names no optional part of either side.
    features: &[],
    feature_side: None,
    implied_features: no_features,
};

/// The engine family (gRPC on a Unix socket; frames are RPC events on named calls).
pub const ENGINE: FamilyTable = FamilyTable {
    family: "engine",
    sides: &[Side::Daemon, Side::Client],
    parties: &[Party::Client, Party::Daemon],
    steps: &["native"],
    config_keys: &["engine"],
    native_ops: &[
        "initialize",
        "start_run",
        "follow",
        "interactions",
        "respond",
        "cancel",
        "suspend",
        "resume",
        "export",
        "await",
    ],
    native_side: Some(Side::Client),
    prebound: |_| false,
    check_frame: crate::family::engine::codec::check_frame,
    nulls: false,
    // "The implementation advertises protocol range 1.0 through 1.1" with snapshot
    // authority: the capabilities are the implementation's, not a target's option.
    features: &[],
    feature_side: None,
    implied_features: no_features,
};

/// The plugin family (gRPC on the plugin's Unix socket; frames are RPC events on named
/// calls, plus the host's `{lifeline: close}`).
pub const PLUGIN: FamilyTable = FamilyTable {
    family: "plugin",
    sides: &[Side::Plugin, Side::Host],
    parties: &[Party::Host, Party::Plugin],
    steps: &["native", "launch", "plugin_process"],
    config_keys: &["plugin"],
    native_ops: &[
        "configure",
        "activate",
        "lease",
        "release",
        "call",
        "cancel",
        "status",
        "shutdown",
        "await",
    ],
    native_side: Some(Side::Host),
    // Side plugin: its launch contract (fresh per run); side host: the executable the
    // harness installs for the host to run.
    prebound: |name| {
        matches!(
            name,
            "challenge"
                | "other_challenge"
                | "proof"
                | "plugin_executable"
                | "plugin_sha256"
                | "plugin_args"
        )
    },
    check_frame: crate::family::plugin::codec::check_frame,
    nulls: true,
    // A plugin's capabilities are what it declares and the host approves per scenario
    // (`config.plugin`); no part of either side is optional.
    features: &[],
    feature_side: None,
    implied_features: no_features,
};

/// A family of generic steps only, for the loader's own tests.
#[cfg(test)]
pub const DEMO: FamilyTable = FamilyTable {
    family: "demo",
    sides: &[Side::Core],
    parties: &[Party::Core],
    steps: &[],
    config_keys: &[],
    native_ops: &[],
    native_side: None,
    prebound: |_| false,
    check_frame: |_, _| Ok(()),
    nulls: false,
    features: &["alpha", "beta"],
    feature_side: Some(Side::Core),
    implied_features: no_features,
};

/// Every family's table.
#[cfg(not(test))]
pub const TABLES: &[FamilyTable] = &[CORE_RUNTIME, WORKER, ENGINE, PLUGIN];

/// Every family's table (and the test-only [`DEMO`]).
#[cfg(test)]
pub const TABLES: &[FamilyTable] = &[CORE_RUNTIME, WORKER, ENGINE, PLUGIN, DEMO];

/// The table of `family`.
pub fn table(family: &str) -> Option<&'static FamilyTable> {
    TABLES.iter().find(|t| t.family == family)
}

/// The families that have tables, comma-separated.
pub fn family_names() -> String {
    TABLES
        .iter()
        .map(|t| t.family)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The optional features are the wire's capability fields after the seven the spec
    /// requires always, and those seven lead the wire's field order.
    #[test]
    fn core_runtime_features_are_the_wire_s_optional_capabilities() {
        assert_eq!(
            CAPABILITY_TABLE[0].when,
            "always, for every execution on that Harness"
        );
        assert_eq!(
            AgentKindCapabilities::FIELDS[..CORE_RUNTIME_ALWAYS.len()],
            *CORE_RUNTIME_ALWAYS
        );
        assert_eq!(CORE_RUNTIME_FEATURES.len(), 22);
        assert!(CORE_RUNTIME_FEATURES.contains(&"resume"));
        assert!(!CORE_RUNTIME_FEATURES.contains(&"steering"));
    }
}
