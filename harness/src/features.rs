//! The features file of a target (`run --features FILE`): which optional features of its
//! family it supports, so scenarios that require what it lacks are reported
//! `not applicable` and the refusal scenarios that need a feature undeclared run.
//!
//! Shape (YAML), every optional feature of the family named, `true` or `false` (a
//! declaration is complete, as the spec's own capability declarations are: no feature
//! is left to a default):
//!
//! ```yaml
//! family: core_runtime
//! features:
//!   environment_none: true
//!   mcp_http_tools: false
//!   # … every feature of `contract-harness features --family core_runtime`
//! ```
//!
//! This module parses and checks the file against the family's vocabulary
//! ([`crate::scenario::families::FamilyTable::features`]) and renders a template; it
//! never selects scenarios (the caller does, with [`crate::scenario::Scenario::unmet_requirement`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::scenario::families::FamilyTable;

/// Longest features file read, in bytes (a complete declaration is a few KiB).
pub const FEATURES_FILE_MAX_BYTES: u64 = 64 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFeatures {
    family: String,
    // Values are checked to be the booleans `true`/`false` themselves: YAML's `yes`, `off`
    // or a quoted "false" are not a declaration.
    features: BTreeMap<String, serde_json::Value>,
}

/// Reads and checks the features file at `path` for `table`'s family.
///
/// # Errors
/// One message naming the problem: unreadable or too large, not the shape above, another
/// family, a feature the family does not have, or features it leaves out (all named).
pub fn load(path: &Path, table: &FamilyTable) -> Result<BTreeMap<String, bool>, String> {
    let size = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if size > FEATURES_FILE_MAX_BYTES {
        return Err(format!(
            "{}: {size} bytes, more than {FEATURES_FILE_MAX_BYTES}",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(path, &text, table).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses a features file's text, read from `path` (see [`load`]).
///
/// # Errors
/// As [`load`].
pub fn parse(
    path: &Path,
    text: &str,
    table: &FamilyTable,
) -> Result<BTreeMap<String, bool>, String> {
    // The scenario loader's strict YAML: 1.2 booleans only, duplicate keys refused.
    let raw: RawFeatures = crate::scenario::loader::parse_yaml(path, text)
        .map_err(|e| format!("expected `family:` and `features:` (feature: true|false): {e}"))?;
    if raw.family != table.family {
        return Err(format!(
            "the file declares family `{}`, the run is of family `{}`",
            raw.family, table.family
        ));
    }
    if table.features.is_empty() {
        return Err(format!(
            "family `{}` has no optional feature: every scenario applies to every target",
            table.family
        ));
    }
    if let Some((name, value)) = raw.features.iter().find(|(_, v)| !v.is_boolean()) {
        return Err(format!(
            "`{name}`: expected true or false, found {value} (write the YAML booleans \
             themselves, unquoted)"
        ));
    }
    if let Some(unknown) = raw
        .features
        .keys()
        .find(|k| !table.features.contains(&k.as_str()))
    {
        return Err(format!(
            "`{unknown}` is not an optional feature of family `{}` (its features: {})",
            table.family,
            table.features.join(", ")
        ));
    }
    let missing: Vec<&str> = table
        .features
        .iter()
        .copied()
        .filter(|f| !raw.features.contains_key(*f))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "a declaration names every feature, true or false; missing: {}",
            missing.join(", ")
        ));
    }
    Ok(raw
        .features
        .into_iter()
        .map(|(name, value)| (name, value == serde_json::Value::Bool(true)))
        .collect())
}

/// The declaration `scenario` is launched with against a target that declares
/// `declared`: `declared` itself, less every feature the scenario `requires:` `false`
/// (declared unsupported). A refusal scenario proves that a target refuses what it
/// declares unsupported; where the harness sets the declaration (core_runtime side
/// runtime: the launch configuration's `agent_kinds`, which every heartbeat must
/// declare exactly), the scenario's own requirement undeclares what it needs, and the
/// target's every other feature stays as declared. A scenario without such a
/// requirement, or run against a target that already lacks what it requires `false`,
/// is launched with `declared` unchanged.
pub fn launch_declaration(
    declared: &BTreeMap<String, bool>,
    scenario: &crate::scenario::Scenario,
) -> BTreeMap<String, bool> {
    let mut launched = declared.clone();
    for feature in refused_capabilities(scenario) {
        launched.insert(feature.to_string(), false);
    }
    launched
}

/// The features `scenario` requires `false` (declared unsupported), in name order: what
/// a refusal scenario proves is refused; empty for any other scenario.
pub fn refused_capabilities(scenario: &crate::scenario::Scenario) -> Vec<&str> {
    scenario
        .requires
        .iter()
        .filter(|(_, want)| !**want)
        .map(|(feature, _)| feature.as_str())
        .collect()
}

/// Whether `scenario` is a refusal scenario: it requires some feature `false`, so it
/// runs only against a target launched lacking that feature (`run --refusals` selects
/// these).
pub fn is_refusal(scenario: &crate::scenario::Scenario) -> bool {
    scenario.requires.values().any(|want| !want)
}

/// The declaration under which our reference implementation (which supports every
/// optional feature) runs `scenario` on `side`: every feature supported, less those a
/// refusal scenario requires `false` ([`launch_declaration`]). Each refusal scenario
/// thus runs with exactly the features it names undeclared and every other declared,
/// so its refused preparation can be refused for nothing but the missing feature
/// (the unit test `every_refusal_asks_only_for_what_it_names` holds each refused
/// preparation to the features its `requires:` names).
pub fn reference_declaration(
    scenario: &crate::scenario::Scenario,
    side: crate::scenario::Side,
) -> BTreeMap<String, bool> {
    let declared = launch_declaration(&BTreeMap::new(), scenario);
    debug_assert!(scenario.unmet_requirement(side, &declared).is_none());
    declared
}

/// A complete features file for `table`'s family with every feature `true` (what our
/// implementation supports), to edit.
pub fn template(table: &FamilyTable) -> String {
    let mut out = format!(
        "# contract-harness run --features FILE: what the target supports. Name every\n\
         # feature, true or false; a scenario requiring a feature declared false is\n\
         # reported `not applicable`, and the refusal scenarios of that feature run.\n\
         family: {}\nfeatures:\n",
        table.family
    );
    if table.features.is_empty() {
        out.push_str("  {}\n");
    }
    for feature in table.features {
        out.push_str(&format!("  {feature}: true\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::families::CORE_RUNTIME;

    /// Every scenario applies to our implementation under its reference declaration:
    /// the full one for all but the refusal scenarios, which lack exactly what they
    /// require `false`.
    #[test]
    fn every_scenario_applies_under_its_reference_declaration() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        for family in ["core_runtime", "worker", "engine", "plugin"] {
            for s in crate::scenario::load_family(&root, family).unwrap() {
                for side in s.target_sides() {
                    let declared = reference_declaration(&s, side);
                    assert_eq!(
                        s.unmet_requirement(side, &declared),
                        None,
                        "{} [{side}]",
                        s.id()
                    );
                    let lacking: Vec<&str> = declared
                        .iter()
                        .filter(|(_, v)| !**v)
                        .map(|(f, _)| f.as_str())
                        .collect();
                    let refused = refused_capabilities(&s);
                    assert_eq!(lacking, refused, "{} [{side}]", s.id());
                    assert_eq!(is_refusal(&s), !refused.is_empty(), "{}", s.id());
                }
            }
        }
    }

    /// A refusal scenario is launched lacking what it requires `false`, whatever the
    /// target declared, and with the target's declaration otherwise unchanged; any other
    /// scenario is launched with the target's declaration.
    #[test]
    fn the_launch_declaration_undeclares_only_what_a_refusal_requires_false() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let scenarios = crate::scenario::load_family(&root, "core_runtime").unwrap();
        let by_name = |name: &str| {
            scenarios
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("{name}"))
        };
        let vendor: BTreeMap<String, bool> = [
            ("usage".to_string(), false),
            ("mcp_http_tools".to_string(), true),
        ]
        .into();
        let refusal = by_name("undeclared_mcp_http_bearer_auth_alone_refused");
        let launched = launch_declaration(&vendor, refusal);
        assert_eq!(launched.get("mcp_http_bearer_auth"), Some(&false));
        assert_eq!(launched.get("usage"), Some(&false));
        assert_eq!(launched.get("mcp_http_tools"), Some(&true));
        assert_eq!(launched.len(), 3);
        let ordinary = by_name("prepare_start_done");
        assert_eq!(launch_declaration(&vendor, ordinary), vendor);
        assert!(is_refusal(refusal) && !is_refusal(ordinary));
    }

    #[test]
    fn the_template_parses_and_declares_everything_supported() {
        let parsed = parse(Path::new("f.yaml"), &template(&CORE_RUNTIME), &CORE_RUNTIME).unwrap();
        assert_eq!(parsed.len(), CORE_RUNTIME.features.len());
        assert!(parsed.values().all(|v| *v));
    }

    #[test]
    fn an_incomplete_unknown_or_foreign_declaration_is_refused() {
        let full = template(&CORE_RUNTIME);
        let short = full.replace("  usage: true\n", "");
        let err = parse(Path::new("f.yaml"), &short, &CORE_RUNTIME).unwrap_err();
        assert!(err.contains("missing: usage"), "{err}");
        let unknown = full.replace("  usage: true\n", "  usage: true\n  teleport: false\n");
        let err = parse(Path::new("f.yaml"), &unknown, &CORE_RUNTIME).unwrap_err();
        assert!(
            err.contains("`teleport` is not an optional feature"),
            "{err}"
        );
        let foreign = full.replace("family: core_runtime", "family: engine");
        let err = parse(Path::new("f.yaml"), &foreign, &CORE_RUNTIME).unwrap_err();
        assert!(err.contains("family `engine`"), "{err}");
        for loose in ["maybe", "yes", "\"false\"", "'true'", "off", "1", "null"] {
            let not_bool = full.replace("  usage: true\n", &format!("  usage: {loose}\n"));
            let err = parse(Path::new("f.yaml"), &not_bool, &CORE_RUNTIME).err();
            assert!(
                err.as_deref()
                    .is_some_and(|e| e.contains("`usage`: expected true or false")),
                "{loose}: {err:?}"
            );
        }
        let engine = crate::scenario::families::ENGINE;
        let err = parse(
            Path::new("f.yaml"),
            "family: engine\nfeatures: {}\n",
            &engine,
        )
        .unwrap_err();
        assert!(err.contains("no optional feature"), "{err}");
    }
}
