//! The conformance report a vendor publishes (`run --conformance FILE`): for each
//! requirement of the family's catalog, what this target's run showed on this side —
//! `pass` (every scenario covering it passed; a difference from the reference goldens
//! alone is advisory and still a pass), `fail` (one failed), `differs` (a `level:
//! reference` requirement whose scenario differs from our reference's choices, vendor
//! mode; a `required` one whose scenario ended at such a difference is `not run`, since
//! a required rule only passes or fails), `not applicable` (every scenario
//! of it that ran requires a feature the target does not declare), `not run` (its
//! scenarios were filtered out or pending), `uncovered` (no scenario covers it on this side, with the
//! catalog's reason) — with its level and spec section, as Markdown or JSON.
//!
//! This module only renders from the catalog, the scenarios and the results.

use serde::Serialize;
use serde_json::Value;

use super::ScenarioResult;
use crate::requirements::{Level, Requirement};
use crate::scenario::{Scenario, Side};

/// One requirement's line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    /// Its ID.
    pub id: String,
    /// `required` or `reference`.
    pub level: &'static str,
    /// Its spec section.
    pub section: String,
    /// `pass`, `fail`, `differs`, `not applicable`, `not run` or `uncovered`.
    pub status: &'static str,
    /// The scenarios of this side that cover it, each with its own status.
    pub scenarios: Vec<(String, &'static str)>,
    /// Why it is uncovered, when the catalog says.
    pub reason: Option<String>,
}

fn status_of(r: Option<&ScenarioResult>) -> &'static str {
    match r {
        None => "not run",
        // A difference from our reference's choices ends that run in vendor mode: what
        // came after it was not checked.
        // Every step passed; only the recorded wire differs from the reference goldens.
        Some(r)
            if r.differs && r.reference.as_deref() == Some(crate::runner::GOLDEN_DIFFERENCE) =>
        {
            "pass"
        }
        Some(r) if r.differs => "differs",
        Some(r) if r.not_applicable => "not applicable",
        Some(r) if r.passed => "pass",
        Some(_) => "fail",
    }
}

/// The report's lines: every requirement of `catalog`, in catalog order.
pub fn lines(
    catalog: &[Requirement],
    scenarios: &[Scenario],
    side: Side,
    results: &[ScenarioResult],
) -> Vec<Line> {
    catalog
        .iter()
        .map(|req| {
            let covering: Vec<(String, &'static str)> = scenarios
                .iter()
                .filter(|s| s.runs_on(side) && s.covers.contains(&req.id))
                .map(|s| {
                    let id = s.id();
                    let status = status_of(results.iter().find(|r| r.scenario == id));
                    (id, status)
                })
                .collect();
            let required = req.level == crate::requirements::Level::Required;
            let status = if covering.is_empty() {
                "uncovered"
            } else if covering.iter().any(|(_, s)| *s == "fail") {
                "fail"
            } else if covering.iter().any(|(_, s)| *s == "differs") && !required {
                "differs"
            } else if covering
                .iter()
                .all(|(_, s)| *s == "not run" || (required && *s == "differs"))
            {
                "not run"
            } else if !covering.iter().any(|(_, s)| *s == "pass") {
                "not applicable"
            } else {
                "pass"
            };
            Line {
                id: req.id.clone(),
                level: match req.level {
                    Level::Required => "required",
                    Level::Reference => "reference",
                },
                section: req.section.clone(),
                status,
                reason: (status == "uncovered")
                    .then(|| req.uncovered_reason.clone())
                    .flatten(),
                scenarios: covering,
            }
        })
        .collect()
}

fn count(lines: &[Line], level: &str, status: &str) -> usize {
    lines
        .iter()
        .filter(|l| l.level == level && l.status == status)
        .count()
}

/// The report as Markdown: a summary per level, then a table of every requirement.
pub fn markdown(family: &str, side: Side, target: &str, lines: &[Line]) -> String {
    let mut out = format!("# Conformance: {family}, side {side}\n\nTarget: `{target}`\n\n");
    out.push_str(
        "| level | pass | fail | differs | not applicable | not run | uncovered |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for level in ["required", "reference"] {
        out.push_str(&format!(
            "| {level} | {} | {} | {} | {} | {} | {} |\n",
            count(lines, level, "pass"),
            count(lines, level, "fail"),
            count(lines, level, "differs"),
            count(lines, level, "not applicable"),
            count(lines, level, "not run"),
            count(lines, level, "uncovered"),
        ));
    }
    out.push_str(
        "\n| requirement | level | section | status | scenarios |\n|---|---|---|---|---|\n",
    );
    for l in lines {
        let detail = match (&l.reason, l.scenarios.is_empty()) {
            (Some(reason), _) => reason.replace('|', "\\|"),
            (None, true) => String::new(),
            (None, false) => l
                .scenarios
                .iter()
                .map(|(s, st)| format!("{s} ({st})"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {detail} |\n",
            l.id, l.level, l.section, l.status
        ));
    }
    out
}

/// The report as JSON: `{family, side, target, requirements: [...]}`.
pub fn json(family: &str, side: Side, target: &str, lines: &[Line]) -> String {
    let value = serde_json::json!({
        "family": family,
        "side": side.as_str(),
        "target": target,
        "requirements": lines,
    });
    serde_json::to_string_pretty(&value).unwrap_or_else(|_| Value::Null.to_string())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_requirement_takes_the_worst_status_of_its_scenarios() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let scenarios = crate::scenario::load_family(&dir, "engine").unwrap();
        let catalog =
            crate::requirements::load_catalog(&dir.join("requirements/engine.yaml")).unwrap();
        let side = Side::Client;
        let mut results: Vec<ScenarioResult> = scenarios
            .iter()
            .filter(|s| s.runs_on(side))
            .map(|s| ScenarioResult::pass(s.id(), side, Duration::ZERO))
            .collect();
        let all = lines(&catalog, &scenarios, side, &results);
        let token = all.iter().find(|l| l.id == "EN-CLIENT-010").unwrap();
        assert_eq!(token.status, "pass");
        assert!(all.iter().any(|l| l.status == "uncovered"));
        // One covering scenario fails: the requirement fails.
        let failing = "engine/client_initialize_as_a_new_owner";
        results.retain(|r| r.scenario != failing);
        results.push(ScenarioResult::fail(
            failing,
            side,
            Duration::ZERO,
            "mismatch",
        ));
        let all = lines(&catalog, &scenarios, side, &results);
        let token = all.iter().find(|l| l.id == "EN-CLIENT-010").unwrap();
        assert_eq!(token.status, "fail");
        assert!(token.scenarios.contains(&(failing.to_string(), "fail")));
        let md = markdown("engine", side, "t", &all);
        assert!(
            md.contains("| EN-CLIENT-010 | required | Initialization | fail |"),
            "{md}"
        );
        assert!(json("engine", side, "t", &all).contains("\"EN-CLIENT-010\""));
    }
}
