//! Reports of a harness run: console progress, JUnit XML, JSON, Markdown and requirement
//! coverage.
//!
//! This module owns the result record ([`ScenarioResult`]) and every rendering of a set
//! of results. Renderers are pure functions from results to text; the only I/O is the
//! optional [`write_file`] helper. It never runs scenarios or touches sockets.

pub mod conformance;
pub mod console;
pub mod coverage;
pub mod json;
pub mod junit;
pub mod markdown;

use std::path::Path;
use std::time::Duration;

use crate::drive::{FailureCode, Phase};
use crate::scenario::Side;

/// The outcome of one scenario run against one target side.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioResult {
    /// Scenario ID, `<family>/<name>`.
    pub scenario: String,
    /// The side under test.
    pub side: Side,
    /// Whether the run passed (steps and golden).
    pub passed: bool,
    /// Why it failed (multi-line allowed), when it failed.
    pub failure: Option<String>,
    /// Wall time of the run.
    pub duration: Duration,
    /// The golden file compared, when one was.
    pub golden: Option<String>,
    /// The failure's stable code, when it failed.
    pub code: Option<FailureCode>,
    /// When in the run it failed (the phase; the step index is in [`Self::step`]).
    pub phase: Option<Phase>,
    /// The `level: reference` requirement of the `reference:` step the failure happened
    /// in, when it did.
    pub reference: Option<String>,
    /// In vendor mode: the target is conformant here but differs from our reference
    /// behaviour at [`Self::reference`] ([`Self::failure`] says how).
    pub differs: bool,
    /// The scenario requires a feature the target does not declare (or declares one a
    /// refusal scenario needs undeclared): neither passed nor failed, with
    /// [`Self::failure`] saying which feature and where the declaration came from.
    pub not_applicable: bool,
}

impl ScenarioResult {
    /// The first line of the failure (empty when it passed).
    pub fn failure_line(&self) -> &str {
        self.failure
            .as_deref()
            .and_then(|f| f.lines().next())
            .unwrap_or_default()
    }

    /// A passing result.
    pub fn pass(scenario: impl Into<String>, side: Side, duration: Duration) -> Self {
        Self {
            scenario: scenario.into(),
            side,
            passed: true,
            failure: None,
            duration,
            golden: None,
            code: None,
            phase: None,
            reference: None,
            differs: false,
            not_applicable: false,
        }
    }

    /// A conformant run that differs from the reference behaviour at `requirement`
    /// (vendor mode), `how` saying where.
    pub fn differs(
        scenario: impl Into<String>,
        side: Side,
        duration: Duration,
        requirement: &str,
        how: impl Into<String>,
    ) -> Self {
        let mut result = Self::pass(scenario, side, duration);
        result.failure = Some(how.into());
        result.reference = Some(requirement.to_string());
        result.differs = true;
        result
    }

    /// A run that does not apply to the target (see [`Self::not_applicable`]): `why`
    /// names the feature and where the target declared it.
    pub fn not_applicable(
        scenario: impl Into<String>,
        side: Side,
        duration: Duration,
        why: impl Into<String>,
    ) -> Self {
        let mut result = Self::fail(scenario, side, duration, why);
        result.not_applicable = true;
        result
    }

    /// A failing result.
    pub fn fail(
        scenario: impl Into<String>,
        side: Side,
        duration: Duration,
        failure: impl Into<String>,
    ) -> Self {
        Self {
            scenario: scenario.into(),
            side,
            passed: false,
            failure: Some(failure.into()),
            duration,
            golden: None,
            code: None,
            phase: None,
            reference: None,
            differs: false,
            not_applicable: false,
        }
    }

    /// The same result with the reference requirement of the failure, if any.
    pub fn with_reference(mut self, reference: Option<String>) -> Self {
        self.reference = reference;
        self
    }

    /// The same result with the failure's `code` and `phase`.
    pub fn with_code(mut self, code: FailureCode, phase: Phase) -> Self {
        self.code = Some(code);
        self.phase = Some(phase);
        self
    }

    /// The 1-based step the run failed at, when it failed in a step.
    pub fn step(&self) -> Option<usize> {
        self.phase.and_then(Phase::step)
    }

    /// `mismatch at step 3`, `launch_failed at launch`, … (empty when it passed or the
    /// failure carries no code).
    pub fn code_line(&self) -> String {
        let mut line = match (self.code, self.phase) {
            (Some(code), Some(phase)) => format!("{code} at {}", phase.label()),
            (Some(code), None) => code.to_string(),
            _ => String::new(),
        };
        if let Some(requirement) = &self.reference {
            if !line.is_empty() {
                line.push_str(", ");
            }
            line.push_str(&format!("reference {requirement}"));
        }
        line
    }

    /// The family part of [`Self::scenario`].
    pub fn family(&self) -> &str {
        self.scenario
            .split_once('/')
            .map_or(self.scenario.as_str(), |(f, _)| f)
    }

    /// The name part of [`Self::scenario`].
    pub fn name(&self) -> &str {
        self.scenario
            .split_once('/')
            .map_or(self.scenario.as_str(), |(_, n)| n)
    }
}

/// Pass / fail counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Runs that passed (those that differ from the reference included).
    pub passed: usize,
    /// Runs that failed.
    pub failed: usize,
    /// Passing runs that differ from the reference behaviour (vendor mode).
    pub differ: usize,
    /// Runs that did not apply to the target (neither passed nor failed).
    pub not_applicable: usize,
}

impl Summary {
    /// Counts `results`.
    pub fn of(results: &[ScenarioResult]) -> Self {
        let passed = results.iter().filter(|r| r.passed).count();
        let not_applicable = results.iter().filter(|r| r.not_applicable).count();
        Self {
            passed,
            failed: results.len() - passed - not_applicable,
            differ: results.iter().filter(|r| r.differs).count(),
            not_applicable,
        }
    }

    /// Whether nothing failed.
    pub fn ok(&self) -> bool {
        self.failed == 0
    }
}

impl std::fmt::Display for Summary {
    /// Exactly `N passed, M failed`, then `, K differ from the reference` when any do
    /// and `, J not applicable` when any are.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed)?;
        if self.differ > 0 {
            write!(f, ", {} differ from the reference", self.differ)?;
        }
        if self.not_applicable > 0 {
            write!(f, ", {} not applicable", self.not_applicable)?;
        }
        Ok(())
    }
}

/// Errors writing reports.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// JUnit serialization failed.
    #[error("cannot serialize JUnit XML: {0}")]
    Junit(#[from] quick_junit::SerializeError),
    /// A report file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The report file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Writes `text` to `path`, creating parent directories.
///
/// # Errors
/// [`ReportError::Io`].
pub fn write_file(path: &Path, text: &str) -> Result<(), ReportError> {
    let io = |source| ReportError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, text).map_err(io)
}

#[cfg(test)]
pub(crate) fn sample_results() -> Vec<ScenarioResult> {
    let mut fail = ScenarioResult::fail(
        "core_runtime/expiry",
        Side::Core,
        Duration::from_millis(1500),
        "step 4 (runtime frame preparation_status): at $.payload.revision: different value\nexpected 1, got 2",
    )
    .with_code(FailureCode::Mismatch, Phase::Step(4));
    fail.golden = Some("golden/core_runtime/expiry.core.golden".into());
    vec![
        ScenarioResult::pass(
            "core_runtime/handshake",
            Side::Runtime,
            Duration::from_millis(123),
        ),
        fail,
    ]
}
