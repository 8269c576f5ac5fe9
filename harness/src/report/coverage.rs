//! Requirement-coverage printouts (text and Markdown) of a
//! [`crate::requirements::Coverage`]. Pure rendering; never touches sockets.

use crate::requirements::{Coverage, Level};

/// `required 120/130 covered, reference 10/16 covered; on side runtime: required 90/130,
/// reference 9/16; on side core: …`.
fn levels_line(coverage: &Coverage) -> String {
    let (rc, rt) = coverage.count(Level::Required);
    let (fc, ft) = coverage.count(Level::Reference);
    let mut line = format!("required {rc}/{rt} covered, reference {fc}/{ft} covered");
    for side in coverage.by_side.keys() {
        let (rc, rt) = coverage.count_on(side, Level::Required);
        let (fc, ft) = coverage.count_on(side, Level::Reference);
        line.push_str(&format!(
            "; on side {side}: required {rc}/{rt}, reference {fc}/{ft}"
        ));
    }
    line
}

/// Plain-text coverage report for `family`; ends with the error lines, if any.
pub fn render_text(family: &str, coverage: &Coverage) -> String {
    let mut out = format!(
        "coverage {family}: {}/{} requirements covered ({:.0}%): {}\n",
        coverage.covered.len(),
        coverage.total,
        coverage.percent(),
        levels_line(coverage)
    );
    for level in [Level::Required, Level::Reference] {
        out.push_str(&format!("{}:\n", level.as_str()));
        for (id, scenarios) in &coverage.covered {
            if coverage.levels.get(id) == Some(&level) {
                out.push_str(&format!("  covered   {id}: {}\n", scenarios.join(", ")));
            }
        }
        for u in coverage.uncovered.iter().filter(|u| u.level == level) {
            match &u.reason {
                Some(reason) => {
                    out.push_str(&format!("  uncovered {} ({}): {reason}\n", u.id, u.section))
                }
                None => out.push_str(&format!(
                    "  MISSING   {} ({}): no scenario and no reason\n",
                    u.id, u.section
                )),
            }
        }
    }
    out.push_str(&bounds_text(coverage));
    for error in coverage.errors() {
        out.push_str(&format!("error: {error}\n"));
    }
    out
}

/// `bounds: 12/15 tested at both edges` and one line per bound missing an edge.
fn bounds_text(coverage: &Coverage) -> String {
    let exempt = match coverage.bounds_exempt.len() {
        0 => String::new(),
        n => format!(
            "; {n} more not counted, {} uncovered with a reason: {}",
            if n == 1 {
                "its requirement"
            } else {
                "their requirements"
            },
            coverage.bounds_exempt.join(", ")
        ),
    };
    let mut out = format!(
        "bounds: {}/{} tested at both edges (at the bound, and one past it){exempt}\n",
        coverage.bounds_total - coverage.bound_gaps.len(),
        coverage.bounds_total
    );
    for gap in &coverage.bound_gaps {
        let missing: Vec<&str> = gap.missing.iter().map(|e| e.as_str()).collect();
        out.push_str(&format!(
            "  EDGE      {} ({} {}): no scenario exercises {}\n",
            gap.key,
            gap.bound.value,
            gap.bound.unit.as_str(),
            missing.join(" and ")
        ));
    }
    out
}

/// Markdown coverage table for `family`.
pub fn render_markdown(family: &str, coverage: &Coverage) -> String {
    let mut out = format!(
        "### Requirement coverage: {family}\n\n{}/{} covered ({:.0}%): {}\n\n| Requirement | Level | Status | Scenarios / reason |\n|---|---|---|---|\n",
        coverage.covered.len(),
        coverage.total,
        coverage.percent(),
        levels_line(coverage)
    );
    for (id, scenarios) in &coverage.covered {
        let level = coverage.levels.get(id).map_or("", |l| l.as_str());
        out.push_str(&format!(
            "| {id} | {level} | covered | {} |\n",
            scenarios.join(", ")
        ));
    }
    for u in &coverage.uncovered {
        let (status, reason) = match &u.reason {
            Some(r) => ("uncovered", r.replace('|', "\\|")),
            None => ("**missing**", "no scenario and no reason".to_string()),
        };
        out.push_str(&format!(
            "| {} | {} | {status} | {reason} |\n",
            u.id,
            u.level.as_str()
        ));
    }
    out.push_str(&format!("\n```\n{}```\n", bounds_text(coverage)));
    let errors = coverage.errors();
    if !errors.is_empty() {
        out.push_str("\n**Errors**\n\n");
        for e in errors {
            out.push_str(&format!("- {e}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requirements::Uncovered;

    #[test]
    fn text_lists_everything() {
        let cov = Coverage {
            covered: vec![("CR-A-001".into(), vec!["core_runtime/x".into()])],
            uncovered: vec![Uncovered {
                id: "CR-A-002".into(),
                section: "S".into(),
                level: Level::Reference,
                reason: None,
            }],
            total: 2,
            levels: [
                ("CR-A-001".to_string(), Level::Required),
                ("CR-A-002".to_string(), Level::Reference),
            ]
            .into(),
            ..Coverage::default()
        };
        let text = render_text("core_runtime", &cov);
        assert!(text.starts_with(
            "coverage core_runtime: 1/2 requirements covered (50%): required 1/1 covered, reference 0/1 covered"
        ), "{text}");
        assert!(text.contains("required:\n  covered   CR-A-001"), "{text}");
        assert!(text.contains("reference:\n  MISSING   CR-A-002"), "{text}");
        assert!(text.contains("error: requirement CR-A-002"));
        assert!(
            render_markdown("core_runtime", &cov)
                .contains("| CR-A-002 | reference | **missing** |")
        );
    }
}
