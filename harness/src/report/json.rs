//! Machine-readable JSON report. Pure rendering; never touches sockets.
//!
//! Shape: `{"summary": {"passed": N, "failed": M}, "results": [{"scenario", "side",
//! "passed", "status", "duration_ms", "failure"?, "code"?, "phase"?, "step"?,
//! "reference"?, "differs_from_reference"?, "not_applicable"?, "golden"?}...]}` (the
//! summary also counts `differ` and `not_applicable`; `status` is `pass`, `fail`,
//! `differs` or `not_applicable`, and `failure` of a `not_applicable` run says why):
//! `code` is the failure's stable code (`mismatch`, `launch_failed`, …), `phase` one of
//! `launch`, `step`, `after_last_step`, `end_of_run`, `golden`, and `step` the 1-based
//! step index when the phase is `step`.

use serde_json::{Map, Value, json};

use super::{ScenarioResult, Summary};

/// One run as JSON.
pub fn result_value(r: &ScenarioResult) -> Value {
    let mut map = Map::new();
    map.insert("scenario".into(), json!(r.scenario));
    map.insert("side".into(), json!(r.side.as_str()));
    map.insert("passed".into(), json!(r.passed));
    map.insert(
        "status".into(),
        json!(match (r.passed, r.differs, r.not_applicable) {
            (_, _, true) => "not_applicable",
            (true, true, _) => "differs",
            (true, false, _) => "pass",
            (false, _, _) => "fail",
        }),
    );
    map.insert(
        "duration_ms".into(),
        json!(u64::try_from(r.duration.as_millis()).unwrap_or(u64::MAX)),
    );
    if let Some(f) = &r.failure {
        map.insert("failure".into(), json!(f));
    }
    if let Some(code) = r.code {
        map.insert("code".into(), json!(code.as_str()));
    }
    if let Some(phase) = r.phase {
        map.insert("phase".into(), json!(phase.as_str()));
    }
    if let Some(step) = r.step() {
        map.insert("step".into(), json!(step));
    }
    if let Some(reference) = &r.reference {
        map.insert("reference".into(), json!(reference));
    }
    if r.differs {
        map.insert("differs_from_reference".into(), json!(true));
    }
    if r.not_applicable {
        map.insert("not_applicable".into(), json!(true));
    }
    if let Some(g) = &r.golden {
        map.insert("golden".into(), json!(g));
    }
    Value::Object(map)
}

/// The whole report as JSON.
pub fn render_value(results: &[ScenarioResult]) -> Value {
    let summary = Summary::of(results);
    json!({
        "summary": { "passed": summary.passed, "failed": summary.failed, "differ": summary.differ, "not_applicable": summary.not_applicable },
        "results": results.iter().map(result_value).collect::<Vec<_>>(),
    })
}

/// The whole report as pretty JSON text.
pub fn render(results: &[ScenarioResult]) -> String {
    serde_json::to_string_pretty(&render_value(results)).unwrap_or_else(|_| "{}".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_report() {
        let v = super::render_value(&super::super::sample_results());
        assert_eq!(v["summary"]["failed"], 1);
        assert_eq!(v["results"][0]["duration_ms"], 123);
        assert_eq!(v["results"][1]["side"], "core");
        assert!(v["results"][0].get("failure").is_none());
        assert!(v["results"][0].get("code").is_none());
        assert_eq!(v["results"][1]["code"], "mismatch");
        assert_eq!(v["results"][1]["phase"], "step");
        assert_eq!(v["results"][1]["step"], 4);
    }
}
