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

/// Where the declaration our reference implementation is run with for `family`'s
/// refusal scenarios lives under the scenario root (`features/<family>.lacking.yaml`):
/// every feature some scenario requires `false` is declared unsupported there, unless a
/// further declaration ([`lacking_paths`]) runs that scenario.
pub fn lacking_path(scenario_root: &Path, family: &str) -> std::path::PathBuf {
    scenario_root
        .join("features")
        .join(format!("{family}.lacking.yaml"))
}

/// Every declaration our reference implementation is run with for `family`'s refusal
/// scenarios: [`lacking_path`] first, then each `features/<family>.lacking-<name>.yaml`
/// in name order. A further declaration is for refusals that need other features
/// declared supported beside the missing one (`workspace_output_export` undeclared on
/// an owner the read-only profile prepared, which needs `local_environment` and
/// `workspace_read_preparation`), which the first declaration lacks.
pub fn lacking_paths(scenario_root: &Path, family: &str) -> Vec<std::path::PathBuf> {
    let prefix = format!("{family}.lacking-");
    let mut more: Vec<std::path::PathBuf> = std::fs::read_dir(scenario_root.join("features"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".yaml"))
        })
        .collect();
    more.sort();
    let mut paths = vec![lacking_path(scenario_root, family)];
    paths.extend(more);
    paths
}

/// The declaration under which our reference implementation runs `scenario` on `side`:
/// none (every feature supported) when the scenario applies to a full target, else the
/// first of the family's [`lacking_paths`] declarations under which it applies; `None`
/// when it applies to none of them (or one of them does not load, the message saying
/// why).
///
/// # Errors
/// A lacking declaration is needed but does not load.
pub fn reference_declaration(
    scenario_root: &Path,
    scenario: &crate::scenario::Scenario,
    side: crate::scenario::Side,
) -> Result<Option<BTreeMap<String, bool>>, String> {
    let full = BTreeMap::new();
    if scenario.unmet_requirement(side, &full).is_none() {
        return Ok(Some(full));
    }
    let Some(table) = crate::scenario::families::table(&scenario.family) else {
        return Ok(None);
    };
    for path in lacking_paths(scenario_root, &scenario.family) {
        let lacking = load(&path, table)?;
        if scenario.unmet_requirement(side, &lacking).is_none() {
            return Ok(Some(lacking));
        }
    }
    Ok(None)
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

    /// Every refusal scenario runs against our implementation under one of the
    /// committed lacking declarations, and every other scenario under the full one.
    #[test]
    fn every_scenario_has_a_reference_declaration() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        for family in ["core_runtime", "worker", "engine", "plugin"] {
            for s in crate::scenario::load_family(&root, family).unwrap() {
                for side in s.target_sides() {
                    let declared = reference_declaration(&root, &s, side).unwrap();
                    let declared = declared.unwrap_or_else(|| {
                        panic!("{} [{side}] applies to no reference run", s.id())
                    });
                    let refusal = s.requires.values().any(|want| !want);
                    assert_eq!(declared.is_empty(), !refusal, "{} [{side}]", s.id());
                }
            }
        }
    }

    /// Every committed lacking declaration is the one some refusal scenario runs under:
    /// none is dead weight in `make check`.
    #[test]
    fn every_lacking_declaration_runs_a_refusal_scenario() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let family = "core_runtime";
        let scenarios = crate::scenario::load_family(&root, family).unwrap();
        let paths = lacking_paths(&root, family);
        assert!(paths.len() > 1, "{paths:?}");
        for path in paths {
            let declared = load(&path, &CORE_RUNTIME).unwrap();
            let runs = scenarios
                .iter()
                .filter(|s| {
                    reference_declaration(&root, s, crate::scenario::Side::Runtime)
                        .unwrap()
                        .is_some_and(|d| !d.is_empty() && d == declared)
                })
                .count();
            assert!(
                runs > 0,
                "{}: no refusal scenario runs under it",
                path.display()
            );
        }
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
