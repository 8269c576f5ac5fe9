//! The golden-only audit (`contract-harness golden audit`): for every golden, the fields
//! of the target's recorded frames that no step of the scenario asserts, so what a golden
//! checks beyond the contract is listed rather than discovered by a vendor who accepted
//! their own goldens.
//!
//! A field counts as asserted when the scenario's pattern for that frame (the frame step
//! of the recorded step, or the candidate of an `any_order`/`optional`/`tolerated`/
//! `reference` group it matches best) names it: a value, a placeholder (it binds and is
//! compared wherever else it appears), or an operator mapping (`$reference`, `$gt`, …).
//! A field the pattern leaves out is golden-only: our reference's value is in the golden,
//! and no run of the scenario would fail without it. Frames recorded by a family's own
//! steps (`handshake`, `launch`, …) are listed by step keyword: what those steps assert is
//! their documented check, not a pattern.
//!
//! This module reads scenarios and golden texts only; it never runs a target and never
//! writes a golden. Whether a golden-only field is a rule the scenario must assert (its
//! `covers:` names it) or a value the spec leaves free is the reviewer's call: the audit
//! makes the list.

use serde::Serialize;
use serde_json::Value;

use crate::golden::parse_entries;
use crate::scenario::model::{Scenario, Step};

/// One recorded frame with fields no step asserts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The scenario ID.
    pub scenario: String,
    /// The golden entry's header (`step 7 runtime frame`).
    pub entry: String,
    /// JSON paths of the unasserted fields (`$.payload.usage`); empty when the frame was
    /// recorded by a family step (see [`Finding::family_step`]).
    pub fields: Vec<String>,
    /// The family step keyword that recorded the frame, when no frame step did.
    pub family_step: Option<String>,
}

/// Fields of `actual` that `pattern` leaves out, as JSON paths under `path`. A pattern
/// that is a placeholder or an operator mapping (a key starting with `$`) asserts the
/// whole value.
pub fn unasserted(pattern: &Value, actual: &Value, path: &str, out: &mut Vec<String>) {
    match (pattern, actual) {
        // `$_` and `$unspecified` match anything: they assert nothing.
        (Value::String(s), _) if s == "$_" || s == "$unspecified" => out.push(path.to_string()),
        (Value::String(s), _) if s.starts_with('$') => {}
        (Value::Object(p), _) if p.keys().any(|k| k.starts_with('$')) => {}
        (Value::Object(p), Value::Object(a)) => {
            for (key, value) in a {
                let child = crate::matcher::child_path(path, key);
                match p.get(key) {
                    Some(sub) => unasserted(sub, value, &child, out),
                    None => out.push(child),
                }
            }
        }
        (Value::Array(p), Value::Array(a)) => {
            for (i, (sub, value)) in p.iter().zip(a).enumerate() {
                unasserted(sub, value, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The frame patterns a step offers the target's `party` (nested groups flattened).
fn patterns<'a>(step: &'a Step, party: &str, out: &mut Vec<&'a Value>) {
    match step {
        Step::Frame { party: p, frame } if p.as_str() == party => out.push(frame),
        Step::AnyOrder(steps) | Step::Repeat { steps, .. } | Step::Reference { steps, .. } => {
            steps.iter().for_each(|s| patterns(s, party, out));
        }
        Step::Optional(inner) | Step::Tolerated(inner) => patterns(inner, party, out),
        _ => {}
    }
}

/// The audit of one golden text of `scenario`: every recorded frame of the target with a
/// field no step asserts.
pub fn audit(scenario: &Scenario, golden: &str) -> Vec<Finding> {
    let mut findings = Vec::new();
    for entry in parse_entries(golden) {
        let mut words = entry.header.split(' ');
        let (Some("step"), Some(n), Some(party), Some("frame")) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        let Some(step) = n
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|i| scenario.steps.get(i))
        else {
            continue;
        };
        let Ok(actual) = serde_json::from_str::<Value>(&entry.body) else {
            continue;
        };
        let mut candidates = Vec::new();
        patterns(step, party, &mut candidates);
        if candidates.is_empty() {
            findings.push(Finding {
                scenario: scenario.id(),
                entry: entry.header.clone(),
                fields: Vec::new(),
                family_step: Some(step.keyword().to_string()),
            });
            continue;
        }
        // The candidate that leaves out the fewest fields is the one it matched.
        let fields = candidates
            .iter()
            .map(|pattern| {
                let mut fields = Vec::new();
                unasserted(pattern, &actual, "$", &mut fields);
                fields
            })
            .min_by_key(Vec::len)
            .unwrap_or_default();
        if !fields.is_empty() {
            findings.push(Finding {
                scenario: scenario.id(),
                entry: entry.header,
                fields,
                family_step: None,
            });
        }
    }
    findings
}

/// The findings as text, one line each: `scenario [side] entry: fields` or `… recorded
/// by family step <keyword>`.
pub fn render(side: &str, findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        match &f.family_step {
            Some(step) => out.push_str(&format!(
                "{} [{side}] {}: recorded by family step `{step}`\n",
                f.scenario, f.entry
            )),
            None => out.push_str(&format!(
                "{} [{side}] {}: {}\n",
                f.scenario,
                f.entry,
                f.fields.join(", ")
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fields_a_pattern_leaves_out_are_listed_and_placeholders_assert_all() {
        let mut out = Vec::new();
        unasserted(
            &json!({"type": "done", "payload": {"a": 1, "b": "$x", "c": {"$gt": 0}, "e": "$_"}}),
            &json!({"type": "done", "id": "r", "payload": {"a": 1, "b": {"deep": 1}, "c": 4, "d": [1], "e": 2}}),
            "$",
            &mut out,
        );
        assert_eq!(out, vec!["$.id", "$.payload.d", "$.payload.e"]);
    }

    #[test]
    fn a_golden_is_audited_against_its_steps() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let scenarios = crate::scenario::load_family(&dir, "core_runtime").unwrap();
        let scenario = scenarios
            .iter()
            .find(|s| s.name == "handshake_heartbeat")
            .unwrap();
        let golden = "## step 1 runtime frame\n{\"type\": \"heartbeat\"}\n\n\
                      ## step 3 runtime frame\n{\"type\": \"heartbeat\", \"id\": \"hb-1\", \"extra\": 1, \
                      \"payload\": {\"runtime_version\": \"v\", \"supported_agent_kinds\": []}}\n";
        let findings = audit(scenario, golden);
        assert_eq!(findings.len(), 2, "{findings:?}");
        assert_eq!(findings[0].family_step.as_deref(), Some("bootstrap"));
        assert_eq!(findings[1].fields, vec!["$.extra"]);
    }
}
