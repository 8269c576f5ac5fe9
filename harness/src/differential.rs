//! Differential runs (`contract-harness diff`): every scenario of a side against two
//! targets, and where their normalized transcripts differ, without goldens — a vendor's
//! binary against ours, or a new build against the last release.
//!
//! Each target's run writes its goldens into a scratch directory of its own (the
//! normalized transcript: placeholders by name, generated values aliased, so two correct
//! targets that generate other identifiers read the same); the two transcripts of a
//! scenario are compared frame by frame with [`crate::changes::frame_changes`]. A
//! scenario that fails on one target is reported with its failure instead.
//!
//! This module runs scenarios and compares texts; it never writes a real golden.

use crate::changes::{self, FrameChange};
use crate::golden::{self, GoldenMode};
use crate::report::ScenarioResult;
use crate::runner::{self, RunOptions};
use crate::scenario::{Scenario, Side};

/// What one scenario did on the two targets.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Both passed with the same transcript.
    Same,
    /// Both passed; the transcripts differ frame by frame.
    Differs(Vec<FrameChange>),
    /// It failed on one target or both (the first failure line of each, `None` when it
    /// passed there).
    Failed {
        /// On the target.
        target: Option<String>,
        /// On the one it is compared against.
        against: Option<String>,
    },
}

/// One scenario's comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioDiff {
    /// `family/name`.
    pub scenario: String,
    /// What happened.
    pub outcome: Outcome,
}

fn failure(r: Option<&ScenarioResult>) -> Option<String> {
    match r {
        Some(r) if r.passed => None,
        Some(r) => Some(r.failure_line().to_string()),
        None => Some("not run".to_string()),
    }
}

/// Runs `scenarios` on `side` against `target` and `against` (each `opts` with its own
/// command; the golden directory is replaced) with `jobs` at once, and compares. The
/// caller runs both in vendor mode, so a value that differs from our reference's choice
/// is compared rather than failed.
///
/// # Errors
/// A scratch directory cannot be made.
pub async fn compare(
    scenarios: &[Scenario],
    side: Side,
    target: &RunOptions,
    against: &RunOptions,
    jobs: usize,
) -> Result<Vec<ScenarioDiff>, String> {
    let runs: Vec<(Scenario, Side)> = scenarios.iter().map(|s| (s.clone(), side)).collect();
    let mut dirs = Vec::new();
    let mut results = Vec::new();
    for opts in [target, against] {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let opts = RunOptions {
            golden_dir: dir.path().to_path_buf(),
            golden_mode: GoldenMode::Accept,
            ..opts.clone()
        };
        results.push(
            runner::run_many(runs.clone(), &opts, jobs, |_| {})
                .await
                .results,
        );
        dirs.push(dir);
    }
    let mut out = Vec::new();
    for s in scenarios {
        let find = |i: usize| results[i].iter().find(|r| r.scenario == s.id());
        let read = |i: usize| {
            std::fs::read_to_string(golden::golden_path(
                dirs[i].path(),
                &s.family,
                &s.name,
                side,
            ))
            .ok()
        };
        let (texts, mut ends) = ([read(0), read(1)], [failure(find(0)), failure(find(1))]);
        // In vendor mode a failed `reference:` group ends a run as a difference and
        // writes no transcript: there is nothing to compare past it, so it is told.
        for i in 0..2 {
            if ends[i].is_none() && texts[i].is_none() {
                ends[i] = Some(find(i).map_or_else(
                    || "no transcript".to_string(),
                    |r| format!("ended at a reference step: {}", r.failure_line()),
                ));
            }
        }
        let [a, b] = ends;
        let outcome = if a.is_some() || b.is_some() {
            Outcome::Failed {
                target: a,
                against: b,
            }
        } else {
            let [t0, t1] = texts;
            let frames = changes::frame_changes(&t1.unwrap_or_default(), &t0.unwrap_or_default());
            if frames.is_empty() {
                Outcome::Same
            } else {
                Outcome::Differs(frames)
            }
        };
        out.push(ScenarioDiff {
            scenario: s.id(),
            outcome,
        });
    }
    Ok(out)
}

/// The comparison as text: one line per scenario (`SAME`, `DIFFERS`, `FAILED`), the
/// differing frames below (`against` → `target`), and a summary line.
pub fn render(side: Side, diffs: &[ScenarioDiff]) -> String {
    let mut out = String::new();
    let (mut same, mut differ, mut failed) = (0, 0, 0);
    for d in diffs {
        match &d.outcome {
            Outcome::Same => {
                same += 1;
                out.push_str(&format!("SAME {} [{side}]\n", d.scenario));
            }
            Outcome::Differs(frames) => {
                differ += 1;
                out.push_str(&format!("DIFFERS {} [{side}]\n", d.scenario));
                for line in changes::render_frames(frames).lines() {
                    out.push_str(&format!("  {line}\n"));
                }
            }
            Outcome::Failed { target, against } => {
                failed += 1;
                out.push_str(&format!("FAILED {} [{side}]\n", d.scenario));
                for (who, f) in [("target", target), ("against", against)] {
                    if let Some(f) = f {
                        out.push_str(&format!("  on the {who}: {f}\n"));
                    }
                }
            }
        }
    }
    out.push_str(&format!(
        "{same} same, {differ} differ, {failed} failed on one side or both\n"
    ));
    out
}

/// Whether the two targets behaved the same on every scenario.
pub fn all_same(diffs: &[ScenarioDiff]) -> bool {
    diffs.iter().all(|d| d.outcome == Outcome::Same)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rendering_names_the_scenario_step_and_field() {
        let old = "## step 3 daemon frame\n{\n  \"message\": {\n    \"name\": \"a\"\n  }\n}\n";
        let new = old.replace("\"a\"", "\"b\"");
        let diffs = vec![
            ScenarioDiff {
                scenario: "engine/x".into(),
                outcome: Outcome::Differs(changes::frame_changes(old, &new)),
            },
            ScenarioDiff {
                scenario: "engine/y".into(),
                outcome: Outcome::Same,
            },
            ScenarioDiff {
                scenario: "engine/z".into(),
                outcome: Outcome::Failed {
                    target: Some("mismatch at step 4".into()),
                    against: None,
                },
            },
        ];
        let text = render(Side::Daemon, &diffs);
        for needle in [
            "DIFFERS engine/x [daemon]",
            "  - step 3 daemon frame `message name`: changed",
            "    - `$.message.name`: `\"a\"` → `\"b\"`",
            "SAME engine/y [daemon]",
            "FAILED engine/z [daemon]\n  on the target: mismatch at step 4",
            "1 same, 1 differ, 1 failed on one side or both",
        ] {
            assert!(text.contains(needle), "{needle} not in\n{text}");
        }
        assert!(!all_same(&diffs));
        assert!(all_same(&diffs[1..2]));
    }
}
