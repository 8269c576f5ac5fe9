//! Markdown summary (for CI job summaries and pull-request comments). Pure rendering;
//! never touches sockets.

use super::console::millis;
use super::{ScenarioResult, Summary};

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// A results table followed by one detail block per failure.
pub fn render(results: &[ScenarioResult]) -> String {
    let summary = Summary::of(results);
    let mut out = format!("## Contract harness\n\n**{summary}**\n\n");
    out.push_str("| Scenario | Target | Result | Time |\n|---|---|---|---|\n");
    for r in results {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            cell(&r.scenario),
            r.side.as_str(),
            if r.passed {
                "pass".to_string()
            } else if r.not_applicable {
                "not applicable".to_string()
            } else if r.code.is_some() {
                format!("**FAIL** `{}`", r.code_line())
            } else {
                "**FAIL**".to_string()
            },
            millis(r.duration)
        ));
    }
    let failures: Vec<&ScenarioResult> = results
        .iter()
        .filter(|r| !r.passed && !r.not_applicable)
        .collect();
    if !failures.is_empty() {
        out.push_str("\n### Failures\n");
        for r in failures {
            out.push_str(&format!(
                "\n<details><summary><code>{}</code> [{}]</summary>\n\n```text\n{}\n```\n\n</details>\n",
                r.scenario,
                r.side.as_str(),
                r.failure.as_deref().unwrap_or("failed").replace("```", "'''")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn markdown_table() {
        let md = super::render(&super::super::sample_results());
        assert!(md.contains("**1 passed, 1 failed**"));
        assert!(
            md.contains(
                "| `core_runtime/expiry` | core | **FAIL** `mismatch at step 4` | 1500ms |"
            ),
            "{md}"
        );
        assert!(md.contains("<details>"));
    }
}
