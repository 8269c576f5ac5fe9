//! Which optional capabilities of a Runtime ([`CORE_RUNTIME_FEATURES`]) a core_runtime
//! scenario exercises, derived from its frames by the spec's table ("Capability
//! declarations": "when Core requires it", and the `execution_prepare` opt-ins), so a
//! unit test can hold every scenario's `requires:` to what it really needs: a scenario
//! that prepares an HTTP MCP server without saying `requires: [mcp_http_tools]` would run,
//! and fail, against a Runtime that declares the capability unsupported.
//!
//! The derivation only reads scenarios; it never runs anything and never decides
//! applicability (that is [`crate::scenario::Scenario::unmet_requirement`] and the wire
//! check of the step engine).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::scenario::families::CORE_RUNTIME_FEATURES;
use crate::scenario::model::{Party, Scenario, Step};

/// The capabilities one `execution_prepare` configuration opts into (the spec's table
/// "`execution_prepare` configuration" and "when Core requires it"):
///
/// | configuration | capability |
/// |---|---|
/// | `disable_execution_environment: true` | `environment_none` |
/// | `local_environment` | `local_environment` |
/// | `workspace_read_only: true` | `workspace_read_preparation` |
/// | `observe_messages: true` | `message_items` |
/// | `observe_subagent_identities: true` | `subagent_observations` |
/// | `disable_subagents: true` | `subagent_control` |
/// | `execution_controls.web_search: enabled` | `web_search_control` |
/// | `execution_controls.output_format.type: json_schema` | `structured_output`, `message_items` |
/// | a non-empty `mcp_servers` | `mcp_http_tools`; `mcp_http_required` if one is `required`; `mcp_http_bearer_auth` if one has a `bearer_credential_ref` |
/// | `require_existing_native_session` | `native_session_recovery` |
fn configuration_features(configuration: &Value, out: &mut BTreeSet<&'static str>) {
    let flag = |key: &str| configuration.get(key).and_then(Value::as_bool) == Some(true);
    if flag("disable_execution_environment") {
        out.insert("environment_none");
    }
    if configuration.get("local_environment").is_some() {
        out.insert("local_environment");
    }
    if flag("workspace_read_only") {
        out.insert("workspace_read_preparation");
    }
    if flag("observe_messages") {
        out.insert("message_items");
    }
    if flag("observe_subagent_identities") {
        out.insert("subagent_observations");
    }
    if flag("disable_subagents") {
        out.insert("subagent_control");
    }
    if let Some(controls) = configuration.get("execution_controls") {
        if controls.get("web_search").and_then(Value::as_str) == Some("enabled") {
            out.insert("web_search_control");
        }
        if controls
            .pointer("/output_format/type")
            .and_then(Value::as_str)
            == Some("json_schema")
        {
            out.insert("structured_output");
            out.insert("message_items");
        }
    }
    if let Some(servers) = configuration.get("mcp_servers").and_then(Value::as_array)
        && !servers.is_empty()
    {
        out.insert("mcp_http_tools");
        if servers
            .iter()
            .any(|s| s.get("required").and_then(Value::as_bool) == Some(true))
        {
            out.insert("mcp_http_required");
        }
        if servers
            .iter()
            .any(|s| s.get("bearer_credential_ref").is_some())
        {
            out.insert("mcp_http_bearer_auth");
        }
    }
    if configuration
        .get("require_existing_native_session")
        .is_some()
    {
        out.insert("native_session_recovery");
    }
}

/// The capability a frame exercises by its type, beyond preparation: a Runtime's
/// `permission_request` (`permissions`: "governs permission decisions inside the
/// Runtime"), `function_call` (`function_tools`), `usage` (`usage`), and Core's
/// `workspace_export` (`workspace_output_export`).
fn frame_feature(party: Party, kind: &str) -> Option<&'static str> {
    match (party, kind) {
        (Party::Runtime, "permission_request") => Some("permissions"),
        (Party::Runtime, "function_call") => Some("function_tools"),
        (Party::Runtime, "usage") => Some("usage"),
        (Party::Core, "workspace_export") => Some("workspace_output_export"),
        _ => None,
    }
}

/// Every frame step of `steps`, nested groups flattened, in order.
fn frames<'a>(steps: &'a [Step], out: &mut Vec<(Party, &'a Value)>) {
    for step in steps {
        match step {
            Step::Frame { party, frame } => out.push((*party, frame)),
            Step::AnyOrder(steps) | Step::Repeat { steps, .. } | Step::Reference { steps, .. } => {
                frames(steps, out)
            }
            Step::Optional(inner) | Step::Tolerated(inner) => {
                frames(std::slice::from_ref(inner.as_ref()), out);
            }
            _ => {}
        }
    }
}

/// The capabilities the frames exercise: the configuration of every `execution_prepare`
/// the Runtime does not reject (its next `preparation_status` under the same Envelope
/// ID is `rejected` with `operation: prepare`: refused whatever it asks for), the
/// frame types of [`frame_feature`], and every capability a Runtime heartbeat pattern
/// asserts literally `true` (the target must declare it).
fn kind_of(frame: &Value) -> &str {
    frame
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn visit(all: &[(Party, &Value)], out: &mut BTreeSet<&'static str>) {
    visit_preparations(all, out, false);
}

/// [`visit`], or with `refused` the configurations of the preparations the Runtime
/// rejects instead (and nothing else).
fn visit_preparations(all: &[(Party, &Value)], out: &mut BTreeSet<&'static str>, refused: bool) {
    // A preparation whose next status (same Envelope ID) is a `prepare` rejection.
    let rejected = |i: usize, id: &str| {
        all[i + 1..]
            .iter()
            .find(|(party, frame)| {
                *party == Party::Runtime
                    && kind_of(frame) == "preparation_status"
                    && frame.get("id").and_then(Value::as_str) == Some(id)
            })
            .is_some_and(|(_, frame)| {
                frame.pointer("/payload/status").and_then(Value::as_str) == Some("rejected")
                    && frame.pointer("/payload/operation").and_then(Value::as_str)
                        == Some("prepare")
            })
    };
    for (i, (party, frame)) in all.iter().enumerate() {
        let kind = kind_of(frame);
        let id = frame.get("id").and_then(Value::as_str).unwrap_or_default();
        if *party == Party::Core
            && kind == "execution_prepare"
            && rejected(i, id) == refused
            && let Some(configuration) = frame.pointer("/payload/configuration")
        {
            configuration_features(configuration, out);
        }
        if refused {
            continue;
        }
        if let Some(feature) = frame_feature(*party, kind) {
            out.insert(feature);
        }
        if *party == Party::Runtime && kind == "heartbeat" {
            let kinds = frame.pointer("/payload/supported_agent_kinds");
            for kind in kinds.and_then(Value::as_array).into_iter().flatten() {
                let Some(caps) = kind.get("capabilities").and_then(Value::as_object) else {
                    continue;
                };
                out.extend(
                    CORE_RUNTIME_FEATURES
                        .iter()
                        .filter(|f| caps.get(**f) == Some(&Value::Bool(true))),
                );
            }
        }
    }
}

/// The optional capabilities `scenario` exercises on side runtime: those its frames opt
/// into, less those its own launch declaration (`config.runtime.agent_kinds`, kind
/// `controlled`) declares `false` and those it `requires:` `false` (the scenario then
/// proves the refusal, and a target that lacks the capability passes it).
///
/// A refusal scenario's preparation that is refused for the missing feature exercises
/// nothing, whatever else it asks for (as every rejected preparation); one that is
/// admitted exercises what it opts into (the read-only profile an undeclared export is
/// refused on needs `local_environment` and `workspace_read_preparation`).
pub fn implied_features(scenario: &Scenario) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    let mut all = Vec::new();
    frames(&scenario.steps, &mut all);
    visit(&all, &mut out);
    let configured = scenario
        .config
        .runtime
        .as_ref()
        .map(super::declared_capabilities)
        .unwrap_or(Value::Null);
    out.retain(|f| {
        CORE_RUNTIME_FEATURES.contains(f)
            && configured.get(*f).and_then(Value::as_bool) != Some(false)
            && scenario.requires.get(*f) != Some(&false)
    });
    out
}

/// What the preparations the Runtime rejects ask for. In a refusal scenario a
/// capability among them it `requires:` `true` names which missing capability the
/// rejection proves (`json_schema` output needs `structured_output` and
/// `message_items`: requiring the first declared makes the rejection the second's).
pub fn refused_features(scenario: &Scenario) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    let mut all = Vec::new();
    frames(&scenario.steps, &mut all);
    visit_preparations(&all, &mut out, true);
    out.retain(|f| CORE_RUNTIME_FEATURES.contains(f));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Side;

    fn scenarios() -> Vec<Scenario> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        crate::scenario::load_family(&dir, "core_runtime").unwrap()
    }

    /// Every scenario on side runtime says in `requires:` exactly the capabilities it
    /// exercises: none is missing (it would fail a Runtime that lacks it instead of being
    /// not applicable) and none is extra (it would be skipped for no reason).
    #[test]
    fn every_runtime_scenario_requires_exactly_what_it_exercises() {
        let mut wrong = Vec::new();
        for s in scenarios().iter().filter(|s| s.runs_on(Side::Runtime)) {
            let mut implied = implied_features(s);
            if crate::features::is_refusal(s) {
                // A refusal's cause, selected by declaring the rest of what it asks for.
                implied.extend(
                    refused_features(s)
                        .into_iter()
                        .filter(|f| s.requires.get(*f) == Some(&true)),
                );
            }
            let declared: BTreeSet<&str> = s
                .requires
                .iter()
                .filter(|(_, want)| **want)
                .map(|(f, _)| f.as_str())
                .collect();
            if declared != implied {
                wrong.push(format!(
                    "{}: requires {:?}, exercises {:?}",
                    s.path.display(),
                    declared,
                    implied
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// A refusal scenario runs lacking exactly what it requires `false`
    /// (`crate::features::launch_declaration`), so every capability its rejected
    /// preparations ask for is named in its `requires:`: `false`, the refusal it proves,
    /// or `true`, declared beside it. One asked for but not named would be undeclared
    /// too against a target that lacks it, and the preparation could be refused for it
    /// while the capability the scenario is named for goes unchecked. And it requires
    /// exactly one capability `false`, one its rejected preparations ask for.
    #[test]
    fn every_refusal_asks_only_for_what_it_names() {
        let mut wrong = Vec::new();
        for s in scenarios() {
            if !crate::features::is_refusal(&s) {
                continue;
            }
            let unnamed: Vec<&str> = refused_features(&s)
                .into_iter()
                .filter(|f| !s.requires.contains_key(*f))
                .collect();
            if !unnamed.is_empty() {
                wrong.push(format!(
                    "{}: asks for {unnamed:?} unnamed",
                    s.path.display()
                ));
            }
            // One refusal per scenario, of a capability its rejected preparations ask
            // for (an export refusal rejects no preparation: its capability is the
            // export's): a second `false` would let a target refuse for that one alone.
            let missing = crate::features::refused_capabilities(&s);
            let refused = refused_features(&s);
            let proven = match missing.as_slice() {
                [one] => refused.is_empty() || refused.contains(one),
                _ => false,
            };
            if !proven {
                wrong.push(format!(
                    "{}: requires {missing:?} false, its rejected preparations ask for \
                     {refused:?}: exactly one of those",
                    s.path.display()
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// A scenario that needs a capability undeclared (a refusal scenario) relies on the
    /// default launch declaration, which follows `--features`: an explicit declaration
    /// of its own would make the requirement meaningless.
    #[test]
    fn refusal_scenarios_use_the_declaration_the_target_made() {
        for s in scenarios() {
            if crate::features::is_refusal(&s) {
                assert!(
                    s.config
                        .runtime
                        .as_ref()
                        .is_none_or(|r| r.get("agent_kinds").is_none()),
                    "{}: a scenario requiring a feature `false` must not declare agent kinds",
                    s.id()
                );
                assert_eq!(s.target_sides(), vec![Side::Runtime], "{}", s.id());
            }
        }
    }
}
