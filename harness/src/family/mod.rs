//! The family registry: the one place that names every protocol family, its sides, and
//! how each side is driven on the step engine ([`crate::drive`]).
//!
//! * [`core_runtime`]: the Core ↔ Runtime family (sides `runtime` and `core`).
//! * [`worker`]: the host ↔ worker family (sides `worker` and `host`).
//! * [`engine`]: the local engine family (sides `daemon` and `client`).
//! * [`plugin`]: the tool plugin family (sides `plugin` and `host`).
//!
//! `--family`/`--side`, the runner, `contract-harness list` and the contract test are all
//! driven from [`FAMILIES`]. A new family adds a folder here, its scenarios and goldens,
//! and one entry in [`FAMILIES`] and in [`drive`]; nothing shared changes. Families never
//! import each other; none of them parses scenario files, renders goldens or prints.

pub mod core_runtime;
pub mod engine;
pub mod plugin;
pub mod worker;

use crate::drive::{DriveOptions, DriveOutcome, Failure, FailureCode, Phase, StepError};
use crate::scenario::model::{Scenario, Side};

/// One side of a family that can be the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SideInfo {
    /// The side (its name is what `--side` and `sides:` say).
    pub side: Side,
    /// Who the harness plays when this side is the target.
    pub harness_plays: &'static str,
    /// The `contract-impl` arguments that start **our** implementation of this side
    /// (what `make check-runtime-contract` and the contract test pass as `--target-cmd`).
    pub impl_args: &'static str,
}

/// One protocol family the harness carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyInfo {
    /// The family's name (`--family`, the scenario and golden directory).
    pub name: &'static str,
    /// The spec the family implements.
    pub spec: &'static str,
    /// Its sides, in report order.
    pub sides: &'static [SideInfo],
}

impl FamilyInfo {
    /// The entry of side `name`, if the family has it.
    pub fn side(&self, name: &str) -> Option<&SideInfo> {
        self.sides.iter().find(|s| s.side.as_str() == name)
    }

    /// The family's side names, comma-separated.
    pub fn side_names(&self) -> String {
        self.sides
            .iter()
            .map(|s| s.side.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Every family the harness carries.
pub const FAMILIES: &[FamilyInfo] = &[
    FamilyInfo {
        name: core_runtime::FAMILY,
        spec: "core-runtime-protocol",
        sides: &[
            SideInfo {
                side: Side::Runtime,
                harness_plays: "Core (scripted Core, controlled-adapter channel)",
                impl_args: "runtime",
            },
            SideInfo {
                side: Side::Core,
                harness_plays: "the Runtime and the user (public API)",
                impl_args: "core serve",
            },
        ],
    },
    FamilyInfo {
        name: worker::FAMILY,
        spec: "worker-protocol",
        sides: &[
            SideInfo {
                side: Side::Worker,
                harness_plays: "the host (private socket, startup token, spawn)",
                impl_args: "worker python",
            },
            SideInfo {
                side: Side::Host,
                harness_plays: "every worker the host launches (relay), host control channel",
                impl_args: "worker host",
            },
        ],
    },
    FamilyInfo {
        name: engine::FAMILY,
        spec: "engine-protocol",
        sides: &[
            SideInfo {
                side: Side::Daemon,
                harness_plays: "the daemon's client (gRPC over its Unix socket, dynamic messages)",
                impl_args: "engine serve",
            },
            SideInfo {
                side: Side::Client,
                harness_plays: "the client's daemon (gRPC server on a Unix socket), client control channel",
                impl_args: "engine controlled",
            },
        ],
    },
    FamilyInfo {
        name: plugin::FAMILY,
        spec: "plugin-protocol",
        sides: &[
            SideInfo {
                side: Side::Plugin,
                harness_plays: "the plugin's host (launch secret, handshake line, calls with the host's proof)",
                impl_args: "plugin fixture",
            },
            SideInfo {
                side: Side::Host,
                harness_plays: "every plugin process the host launches (relay), host control channel",
                impl_args: "plugin host",
            },
        ],
    },
];

/// The family named `name`.
pub fn family(name: &str) -> Option<&'static FamilyInfo> {
    FAMILIES.iter().find(|f| f.name == name)
}

/// What exists, for usage errors: `core_runtime (sides: runtime, core)`.
pub fn known() -> String {
    FAMILIES
        .iter()
        .map(|f| format!("{} (sides: {})", f.name, f.side_names()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Resolves a `--family`/`--side` pair.
///
/// # Errors
/// A usage message naming the families and sides that exist.
pub fn resolve(family_name: &str, side_name: &str) -> Result<(&'static FamilyInfo, Side), String> {
    let Some(info) = family(family_name) else {
        return Err(format!(
            "unknown family `{family_name}`; families: {}",
            known()
        ));
    };
    match info.side(side_name) {
        Some(side) => Ok((info, side.side)),
        None => Err(format!(
            "family `{family_name}` has no side `{side_name}`; its sides: {}",
            info.side_names()
        )),
    }
}

/// Drives `scenario` with `side` as the target, through its family's peer.
pub async fn drive(scenario: &Scenario, side: Side, opts: &DriveOptions) -> DriveOutcome {
    let known_side = family(&scenario.family).and_then(|f| f.side(side.as_str()));
    match (scenario.family.as_str(), known_side) {
        (core_runtime::FAMILY, Some(_)) => core_runtime::drive(scenario, side, opts).await,
        (worker::FAMILY, Some(_)) => worker::drive(scenario, side, opts).await,
        (engine::FAMILY, Some(_)) => engine::drive(scenario, side, opts).await,
        (plugin::FAMILY, Some(_)) => plugin::drive(scenario, side, opts).await,
        _ => DriveOutcome::failed(Failure::outside(
            &scenario.id(),
            Phase::Launch,
            StepError::new(
                FailureCode::UnsupportedStep,
                format!(
                    "family `{}` has no side `{side}` in this harness; families: {}",
                    scenario.family,
                    known()
                ),
            ),
        )),
    }
}

/// The placeholder the feature probe binds to the heartbeat's `supported_agent_kinds`.
const PROBED_KINDS: &str = "probed_kinds";

/// What the target declares of its family's optional features on the wire, where the
/// family declares them there (core_runtime, side runtime: the capabilities of kind
/// `controlled` in its first heartbeat, `docs/scenario-format.md` "Features"): the target
/// is launched once with the full launch declaration for a bootstrap, a connect and that
/// heartbeat. `None`: the
/// family declares no features on this side's wire.
///
/// # Errors
/// The probe run recorded no declaration (the failure, or why).
pub async fn probe_features(
    family_name: &str,
    side: Side,
    opts: &DriveOptions,
) -> Option<Result<std::collections::BTreeMap<String, bool>, String>> {
    use crate::drive::Codec as _;
    let table = crate::scenario::families::table(family_name)?;
    if family_name != core_runtime::FAMILY || table.feature_side != Some(side) {
        return None;
    }
    let probe = Scenario {
        family: family_name.to_string(),
        name: "feature_probe".into(),
        summary: "the target's declaration of its optional features".into(),
        covers: Vec::new(),
        sides: Some(vec![side]),
        config: Default::default(),
        // The declaration binds a placeholder: recorded frames are masked for goldens.
        steps: vec![
            crate::scenario::model::Step::Bootstrap(Default::default()),
            crate::scenario::model::Step::Connect(Default::default()),
            crate::scenario::model::Step::Frame {
                party: crate::scenario::model::Party::Runtime,
                frame: serde_json::json!({"type": "heartbeat", "payload": {
                    "supported_agent_kinds": format!("${PROBED_KINDS}")
                }}),
            },
        ],
        pending: Default::default(),
        requires: Default::default(),
        edges: Default::default(),
        path: "feature_probe".into(),
    };
    let opts = DriveOptions {
        features: Default::default(),
        ..opts.clone()
    };
    let outcome = drive(&probe, side, &opts).await;
    let codec = core_runtime::codec::EnvelopeCodec::RUNTIME_TARGET;
    let declared = outcome.bindings.get(PROBED_KINDS).and_then(|kinds| {
        codec.declared_features(&serde_json::json!({
            "type": "heartbeat",
            "payload": {"supported_agent_kinds": kinds}
        }))
    });
    Some(declared.ok_or_else(|| {
        let first_line = |text: String| {
            text.lines()
                .next()
                .unwrap_or("")
                .trim_end_matches("; stderr tail:")
                .to_string()
        };
        match (&outcome.failure, outcome.bindings.get(PROBED_KINDS)) {
            (_, Some(_)) => "the first heartbeat declares no agent kind `controlled` (the kind \
                             every scenario runs)"
                .to_string(),
            (Some(f), None) => {
                format!(
                    "the probe run recorded no heartbeat: {}",
                    first_line(f.to_string())
                )
            }
            (None, None) => "the probe run recorded no heartbeat".to_string(),
        }
    }))
}

/// Keys whose values the target generates on `side` (aliased in goldens).
pub fn generated_keys(family_name: &str, side: Side) -> &'static [&'static str] {
    match family_name {
        core_runtime::FAMILY => core_runtime::generated_keys(side),
        worker::FAMILY => worker::GENERATED_KEYS,
        engine::FAMILY => engine::generated_keys(side),
        plugin::FAMILY => plugin::GENERATED_KEYS,
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_and_the_scenario_tables_name_the_same_sides() {
        for info in FAMILIES {
            let table = crate::scenario::families::table(info.name)
                .unwrap_or_else(|| panic!("{} has no scenario table", info.name));
            let ours: Vec<Side> = info.sides.iter().map(|s| s.side).collect();
            assert_eq!(ours, table.sides, "{}", info.name);
        }
    }

    #[test]
    fn pairs_resolve_or_name_what_exists() {
        assert_eq!(resolve("core_runtime", "core").unwrap().1, Side::Core);
        let err = resolve("no_such", "x").unwrap_err();
        assert!(err.contains("unknown family `no_such`"), "{err}");
        assert!(err.contains("core_runtime (sides: runtime, core)"), "{err}");
        let err = resolve("core_runtime", "plugin").unwrap_err();
        assert!(err.contains("its sides: runtime, core"), "{err}");
    }
}
