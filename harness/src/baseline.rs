//! Expected-failure baselines (`--expected-failures FILE`): a vendor adopting the suite
//! lists the scenarios its target is known to fail, with a reason, and a run passes while
//! only those fail. A listed scenario that passes fails the run as **stale** (remove it
//! from the baseline), so a baseline only ever shrinks. `--write-expected-failures FILE`
//! writes today's failures as a starting baseline.
//!
//! Format (YAML): side → scenario ID → reason.
//!
//! ```yaml
//! runtime:
//!   core_runtime/steer_written_accepted: "steering not implemented yet"
//! ```
//!
//! This module reads, judges and writes baselines; it never runs anything.

use std::collections::BTreeMap;
use std::path::Path;

use crate::report::ScenarioResult;
use crate::scenario::Side;

/// A baseline: side → scenario ID → reason.
pub type Baseline = BTreeMap<String, BTreeMap<String, String>>;

/// Reads a baseline file, strictly: a mapping of `sides` (the family's side names) to
/// mappings of scenario ID to a non-empty reason string.
///
/// # Errors
/// The file cannot be read, is not that shape (a side the family does not have, a reason
/// that is not a string, a duplicate key), or names an empty reason.
pub fn load(path: &Path, sides: &[Side]) -> Result<Baseline, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let raw: BTreeMap<String, BTreeMap<String, serde_json::Value>> =
        crate::scenario::loader::parse_yaml(path, &text).map_err(|e| e.to_string())?;
    let mut baseline = Baseline::new();
    for (side, entries) in raw {
        if !sides.iter().any(|s| s.as_str() == side) {
            let known: Vec<&str> = sides.iter().map(|s| s.as_str()).collect();
            return Err(format!(
                "{}: `{side}` is not a side of this family ({})",
                path.display(),
                known.join(", ")
            ));
        }
        let mut reasons = BTreeMap::new();
        for (id, reason) in entries {
            match reason {
                serde_json::Value::String(r) if !r.trim().is_empty() => {
                    reasons.insert(id, r);
                }
                serde_json::Value::String(_) => {
                    return Err(format!(
                        "{}: {side}: {id} has no reason (say why it is expected to fail)",
                        path.display()
                    ));
                }
                other => {
                    return Err(format!(
                        "{}: {side}: {id}: the reason must be a string, not {other}",
                        path.display()
                    ));
                }
            }
        }
        baseline.insert(side, reasons);
    }
    Ok(baseline)
}

/// How a run's failures compare with a baseline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Failures the baseline lists: `(scenario, reason)`.
    pub expected: Vec<(String, String)>,
    /// Failures it does not list.
    pub unexpected: Vec<String>,
    /// Listed scenarios that passed.
    pub stale: Vec<String>,
    /// Listed scenarios that did not apply to the target (`not applicable`): neither
    /// expected nor stale, told so the entry is not left to rot.
    pub not_applicable: Vec<String>,
}

impl Verdict {
    /// Whether the run passes against the baseline.
    pub fn ok(&self) -> bool {
        self.unexpected.is_empty() && self.stale.is_empty()
    }
}

/// Judges `results` of `side` against `baseline`. A `DIFF` (a difference from the
/// reference in vendor mode) is not a failure; a scenario the run did not include is
/// neither expected nor stale.
pub fn judge(baseline: &Baseline, side: Side, results: &[ScenarioResult]) -> Verdict {
    let listed = baseline.get(side.as_str());
    let mut v = Verdict::default();
    // A run that did not apply to the target is neither a failure nor a pass.
    for r in results.iter().filter(|r| r.not_applicable) {
        if listed.is_some_and(|l| l.contains_key(&r.scenario)) {
            v.not_applicable.push(r.scenario.clone());
        }
    }
    for r in results.iter().filter(|r| !r.not_applicable) {
        let reason = listed.and_then(|l| l.get(&r.scenario));
        match (r.passed || r.differs, reason) {
            (false, Some(reason)) => v.expected.push((r.scenario.clone(), reason.clone())),
            (false, None) => v.unexpected.push(r.scenario.clone()),
            (true, Some(_)) => v.stale.push(r.scenario.clone()),
            (true, None) => {}
        }
    }
    v
}

/// The IDs `baseline` lists for `side` that are not in `known` (the scenario IDs of the
/// family on that side): a typo or a removed scenario, which can never fail again.
pub fn unknown(baseline: &Baseline, side: Side, known: &[String]) -> Vec<String> {
    baseline
        .get(side.as_str())
        .into_iter()
        .flat_map(|l| l.keys())
        .filter(|id| !known.contains(id))
        .cloned()
        .collect()
}

/// Today's failures of `side` as a baseline file, each with its first failure line as
/// the reason to replace.
/// [`render`], keeping the sections of every other side of `existing` (the file being
/// replaced), so writing one side's baseline never drops another's.
pub fn render_keeping(side: Side, results: &[ScenarioResult], existing: &Baseline) -> String {
    let mut out = render(side, results);
    for (other, entries) in existing.iter().filter(|(s, _)| s.as_str() != side.as_str()) {
        if entries.is_empty() {
            out.push_str(&format!("{other}: {{}}\n"));
            continue;
        }
        out.push_str(&format!("{other}:\n"));
        for (id, reason) in entries {
            let reason = serde_json::to_string(reason).unwrap_or_else(|_| "\"\"".into());
            out.push_str(&format!("  {id}: {reason}\n"));
        }
    }
    out
}

/// Today's failures of `side` as a starting baseline (each reason the failure line).
pub fn render(side: Side, results: &[ScenarioResult]) -> String {
    let mut out = format!(
        "# Expected failures (contract-harness --expected-failures). Replace each reason with\n\
         # why the target fails it; remove a line once the scenario passes.\n{}:\n",
        side.as_str()
    );
    let failed: Vec<&ScenarioResult> = results
        .iter()
        .filter(|r| !r.passed && !r.differs && !r.not_applicable)
        .collect();
    if failed.is_empty() {
        out = format!("{}: {{}}\n", side.as_str());
    }
    for r in failed {
        let reason = serde_json::to_string(r.failure_line()).unwrap_or_else(|_| "\"\"".into());
        out.push_str(&format!("  {}: {reason}\n", r.scenario));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn results() -> Vec<ScenarioResult> {
        vec![
            ScenarioResult::pass("f/ok", Side::Runtime, Duration::ZERO),
            ScenarioResult::fail(
                "f/known",
                Side::Runtime,
                Duration::ZERO,
                "mismatch at step 3",
            ),
            ScenarioResult::fail("f/new", Side::Runtime, Duration::ZERO, "timeout at step 9"),
        ]
    }

    #[test]
    fn listed_failures_pass_unlisted_fail_and_listed_passes_are_stale() {
        let mut baseline = Baseline::new();
        baseline
            .entry("runtime".into())
            .or_default()
            .insert("f/known".into(), "not implemented".into());
        let v = judge(&baseline, Side::Runtime, &results());
        assert_eq!(
            v.expected,
            vec![("f/known".into(), "not implemented".into())]
        );
        assert_eq!(v.unexpected, vec!["f/new".to_string()]);
        assert!(v.stale.is_empty() && !v.ok());
        baseline
            .get_mut("runtime")
            .unwrap()
            .insert("f/new".into(), "flaky transport".into());
        assert!(judge(&baseline, Side::Runtime, &results()).ok());
        baseline
            .get_mut("runtime")
            .unwrap()
            .insert("f/ok".into(), "was broken".into());
        let v = judge(&baseline, Side::Runtime, &results());
        assert_eq!(v.stale, vec!["f/ok".to_string()]);
        assert!(!v.ok());
        // Another side's list does not apply.
        assert!(judge(&baseline, Side::Core, &results()).unexpected.len() == 2);
    }

    #[test]
    fn a_written_baseline_reads_back_and_accepts_the_same_failures() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("expected.yaml");
        std::fs::write(&path, render(Side::Runtime, &results())).unwrap();
        let sides = [Side::Runtime, Side::Core];
        let baseline = load(&path, &sides).unwrap();
        assert_eq!(baseline["runtime"]["f/new"], "timeout at step 9");
        assert!(judge(&baseline, Side::Runtime, &results()).ok());
        let refused = |text: &str| {
            std::fs::write(&path, text).unwrap();
            load(&path, &sides).unwrap_err()
        };
        assert!(refused("runtime:\n  f/known: \"\"\n").contains("has no reason"));
        assert!(refused("runtime: [1, 2]\n").contains("expected.yaml"));
        assert!(refused("runtme:\n  f/known: x\n").contains("`runtme` is not a side"));
        assert!(refused("runtime:\n  f/known: 5\n").contains("must be a string"));
        assert!(refused("runtime:\n  f/known: true\n").contains("must be a string"));
        assert!(refused("runtime:\n  f/a: x\n  f/a: y\n").contains("expected.yaml"));
        // Rewriting one side keeps the other side's entries and reasons.
        let mut existing = Baseline::new();
        existing.insert(
            "core".into(),
            BTreeMap::from([("f/core".to_string(), "ticket 12".to_string())]),
        );
        existing.insert(
            "runtime".into(),
            BTreeMap::from([("f/old".to_string(), "gone".to_string())]),
        );
        std::fs::write(&path, render_keeping(Side::Runtime, &results(), &existing)).unwrap();
        let merged = load(&path, &sides).unwrap();
        assert_eq!(merged["core"]["f/core"], "ticket 12");
        assert!(!merged["runtime"].contains_key("f/old"));
        assert_eq!(merged["runtime"]["f/new"], "timeout at step 9");
    }
}
