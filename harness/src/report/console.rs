//! Console progress lines and the summary line.
//!
//! Owns the exact console wording that CI greps: one line per run
//! (`PASS core_runtime/name [runtime] 123ms`, or `FAIL … 123ms (mismatch at step 4)`, the
//! failure's code and phase, followed by the failure indented by two spaces) and a summary line that is exactly `N passed, M failed`. Pure string
//! building; printing is the caller's job.

use std::time::Duration;

use super::{ScenarioResult, Summary};

/// Milliseconds, e.g. `123ms`.
pub fn millis(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

/// The line(s) for one run.
pub fn result_line(result: &ScenarioResult) -> String {
    let status = match (result.passed, result.differs, result.not_applicable) {
        (_, _, true) => "N/A ",
        (true, true, _) => "DIFF",
        (true, false, _) => "PASS",
        (false, _, _) => "FAIL",
    };
    let mut out = format!(
        "{status} {} [{}] {}",
        result.scenario,
        result.side.as_str(),
        millis(result.duration)
    );
    let code = result.code_line();
    let shown = !result.passed || result.differs;
    if shown && !code.is_empty() {
        out.push_str(&format!(" ({code})"));
    }
    if let Some(failure) = result.failure.as_deref().filter(|_| shown) {
        for line in failure.lines() {
            out.push_str("\n  ");
            out.push_str(line);
        }
    }
    out
}

/// The summary line, exactly `N passed, M failed`.
pub fn summary_line(results: &[ScenarioResult]) -> String {
    Summary::of(results).to_string()
}

/// Every result line followed by the summary line.
pub fn render(results: &[ScenarioResult]) -> String {
    let mut out = String::new();
    for r in results {
        out.push_str(&result_line(r));
        out.push('\n');
    }
    out.push_str(&summary_line(results));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_summary() {
        let results = super::super::sample_results();
        let text = render(&results);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "PASS core_runtime/handshake [runtime] 123ms");
        assert_eq!(
            lines[1],
            "FAIL core_runtime/expiry [core] 1500ms (mismatch at step 4)"
        );
        assert!(lines[2].starts_with("  step 4"));
        assert_eq!(lines[3], "  expected 1, got 2");
        assert_eq!(lines[4], "1 passed, 1 failed");
        let diff = ScenarioResult::differs(
            "core_runtime/x",
            crate::scenario::Side::Runtime,
            Duration::from_millis(5),
            "CR-PREP-018",
            "revision 1 expected",
        )
        .with_code(
            crate::drive::FailureCode::Mismatch,
            crate::drive::Phase::Step(3),
        )
        .with_reference(Some("CR-PREP-018".into()));
        assert_eq!(
            result_line(&diff),
            "DIFF core_runtime/x [runtime] 5ms (mismatch at step 3, reference CR-PREP-018)\n  revision 1 expected"
        );
        assert_eq!(
            summary_line(&[diff]),
            "1 passed, 0 failed, 1 differ from the reference"
        );
    }
}
