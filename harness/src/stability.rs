//! Stable goldens: a golden must not depend on how busy the machine is or how many
//! scenarios run beside it, or every pull request would show noise a reviewer learns to
//! ignore. [`check_side`] replays scenarios of one side twice, once one at a time and once
//! with the given parallelism, each into its own scratch golden directory, and compares
//! the two sets byte for byte; a difference names the scenario, the step and the field.
//!
//! This module runs scenarios through [`crate::runner`] and compares golden texts with
//! [`crate::golden`]; it never writes into the real golden directory.

use std::path::Path;

use crate::golden::{self, GoldenMode};
use crate::runner::{self, RunOptions};
use crate::scenario::{Scenario, Side};

/// Every `step`-th scenario of those that run on `side` against our implementation (all
/// of them when `sample` is `None` or covers them), in file order: a sample that keeps
/// the family's spread. Every scenario applies to our implementation, which supports
/// every optional feature: a refusal scenario is launched lacking what it requires
/// `false` (the runner's `crate::features::launch_declaration`).
pub fn sample(scenarios: &[Scenario], side: Side, sample: Option<usize>) -> Vec<Scenario> {
    let runs: Vec<Scenario> = scenarios
        .iter()
        .filter(|s| s.runs_on(side) && s.pending_reason(side).is_none())
        .cloned()
        .collect();
    match sample {
        Some(n) if n > 0 && n < runs.len() => {
            let step = runs.len().div_ceil(n);
            runs.into_iter().step_by(step).collect()
        }
        _ => runs,
    }
}

/// What [`check_side`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stability {
    /// Scenarios replayed (each twice).
    pub replayed: usize,
    /// `scenario [side]: …` for every run that failed (its golden cannot be compared).
    pub failures: Vec<String>,
    /// `family/name.side.golden: step N field $.x: golden A, now B` for every golden
    /// that differs between the two replays.
    pub differences: Vec<String>,
}

impl Stability {
    /// Whether both replays passed and wrote the same goldens.
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty() && self.differences.is_empty()
    }
}

/// Replays `scenarios` on `side` with `--jobs 1` and with `jobs`, each into a scratch
/// golden directory, and compares the goldens. `opts` gives the target and the timers
/// (its golden directory and mode are replaced).
///
/// # Errors
/// A scratch directory cannot be made.
pub async fn check_side(
    scenarios: &[Scenario],
    side: Side,
    opts: &RunOptions,
    jobs: usize,
) -> Result<Stability, String> {
    let runs: Vec<(Scenario, Side)> = scenarios.iter().map(|s| (s.clone(), side)).collect();
    let mut dirs = Vec::new();
    let mut out = Stability {
        replayed: runs.len(),
        ..Stability::default()
    };
    for jobs in [1, jobs.max(1)] {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let opts = RunOptions {
            golden_dir: dir.path().to_path_buf(),
            golden_mode: GoldenMode::Accept,
            ..opts.clone()
        };
        let many = runner::run_many(runs.clone(), &opts, jobs, |_| {}).await;
        for r in many.results.iter().filter(|r| !r.passed) {
            out.failures.push(format!(
                "{} [{}] with --jobs {jobs}: {}",
                r.scenario,
                r.side,
                r.failure_line()
            ));
        }
        if let Some(why) = many.aborted {
            out.failures.push(format!("--jobs {jobs}: {why}"));
        }
        dirs.push(dir);
    }
    out.differences = differences(scenarios, side, dirs[0].path(), dirs[1].path(), jobs);
    Ok(out)
}

/// The goldens of `scenarios` that differ between the replay one at a time (under
/// `one`) and the parallel one (under `many`), each naming its step and field.
pub fn differences(
    scenarios: &[Scenario],
    side: Side,
    one: &Path,
    many: &Path,
    jobs: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    for scenario in scenarios {
        let path = |root: &Path| golden::golden_path(root, &scenario.family, &scenario.name, side);
        let (Ok(a), Ok(b)) = (
            std::fs::read_to_string(path(one)),
            std::fs::read_to_string(path(many)),
        ) else {
            continue;
        };
        if a != b {
            out.push(format!(
                "{}/{}.{}.golden: {} (--jobs 1 vs --jobs {jobs})",
                scenario.family,
                scenario.name,
                side.as_str(),
                golden::first_difference(&a, &b)
                    .replace("golden ", "one at a time ")
                    .replace(", now ", ", in parallel "),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_keeps_the_spread_and_never_exceeds_the_set() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let all = crate::scenario::load_family(&dir, "engine").unwrap();
        let daemon = sample(&all, Side::Daemon, None);
        let four = sample(&all, Side::Daemon, Some(4));
        assert!(four.len() <= 4 && !four.is_empty(), "{}", four.len());
        assert_eq!(four[0].name, daemon[0].name);
        assert!(four.iter().all(|s| s.runs_on(Side::Daemon)));
        assert_eq!(sample(&all, Side::Daemon, Some(10_000)).len(), daemon.len());
    }

    #[test]
    fn a_golden_that_differs_between_the_replays_names_its_step_and_field() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let all = crate::scenario::load_family(&dir, "engine").unwrap();
        let two = sample(&all, Side::Daemon, Some(2));
        let (one, many) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let text = |seq: u32| {
            format!("# golden\n\n## step 4 daemon frame\n{{\n  \"sequence\": \"{seq}\"\n}}\n")
        };
        for (root, seq) in [(one.path(), 1), (many.path(), 1)] {
            let p = golden::golden_path(root, "engine", &two[0].name, Side::Daemon);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text(seq)).unwrap();
        }
        for (root, seq) in [(one.path(), 1), (many.path(), 2)] {
            let p = golden::golden_path(root, "engine", &two[1].name, Side::Daemon);
            std::fs::write(p, text(seq)).unwrap();
        }
        let found = differences(&two, Side::Daemon, one.path(), many.path(), 2);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(&format!(
                "engine/{}.daemon.golden: step 4 field $.sequence",
                two[1].name
            )),
            "{}",
            found[0]
        );
        assert!(
            found[0].contains("one at a time \"1\", in parallel \"2\""),
            "{}",
            found[0]
        );
    }
}
