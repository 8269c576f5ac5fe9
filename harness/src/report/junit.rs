//! JUnit XML (via `quick-junit`): one test suite per family and side, one test case per
//! scenario run; a failure's `type` is its stable code and the test case carries the
//! `phase` (and `step`) as properties. Pure rendering; never touches sockets.

use std::collections::BTreeMap;
use std::time::Duration;

use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};

use super::{ReportError, ScenarioResult};

/// Renders `results` as a JUnit XML document named `report_name`.
///
/// # Errors
/// [`ReportError::Junit`] if serialization fails.
pub fn render(report_name: &str, results: &[ScenarioResult]) -> Result<String, ReportError> {
    let mut suites: BTreeMap<(String, &str), Vec<&ScenarioResult>> = BTreeMap::new();
    for r in results {
        suites
            .entry((r.family().to_string(), r.side.as_str()))
            .or_default()
            .push(r);
    }
    let mut report = Report::new(report_name);
    let mut total = Duration::ZERO;
    for ((family, side), runs) in suites {
        let mut suite = TestSuite::new(format!("{family} [{side} target]"));
        let mut suite_time = Duration::ZERO;
        for r in runs {
            let status = if r.passed {
                TestCaseStatus::success()
            } else if r.not_applicable {
                let mut status = TestCaseStatus::skipped();
                let why = r.failure.as_deref().unwrap_or("not applicable");
                status.set_message(format!("not applicable: {why}"));
                status
            } else {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                let failure = r.failure.as_deref().unwrap_or("failed");
                status.set_message(failure.lines().next().unwrap_or("failed"));
                status.set_description(failure);
                if let Some(code) = r.code {
                    status.set_type(code.as_str());
                }
                status
            };
            let mut case = TestCase::new(format!("{} [{side}]", r.name()), status);
            case.set_classname(format!("{family}.{side}"));
            case.set_time(r.duration);
            if let Some(phase) = r.phase {
                case.add_property(("phase", phase.as_str()));
            }
            if let Some(step) = r.step() {
                case.add_property(("step", step.to_string().as_str()));
            }
            if let Some(golden) = &r.golden {
                case.add_property(("golden", golden.as_str()));
            }
            suite_time += r.duration;
            suite.add_test_case(case);
        }
        suite.set_time(suite_time);
        total += suite_time;
        report.add_test_suite(suite);
    }
    report.set_time(total);
    Ok(report.to_string()?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn junit_has_cases_and_failure() {
        let xml = super::render("contract", &super::super::sample_results()).unwrap();
        assert!(
            xml.contains("<testsuite name=\"core_runtime [core target]\""),
            "{xml}"
        );
        assert!(xml.contains("name=\"handshake [runtime]\""), "{xml}");
        assert!(xml.contains("<failure"), "{xml}");
        assert!(xml.contains("different value"), "{xml}");
        assert!(xml.contains("type=\"mismatch\""), "{xml}");
        assert!(xml.contains("name=\"phase\" value=\"step\""), "{xml}");
        assert!(xml.contains("name=\"step\" value=\"4\""), "{xml}");
    }
}
