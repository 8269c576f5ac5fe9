//! Typed harness failures: a stable [`FailureCode`], the [`Phase`] of the run it
//! happened in, and a message for people.
//!
//! Reports (console, JSON, JUnit, Markdown) print the code and the phase; the runner's
//! fail-fast on launch failures compares codes, never message text. This module never
//! decides *whether* something failed; the step engine and the families do.

use std::fmt;

/// What kind of fault a failure is. The string form ([`FailureCode::as_str`]) is stable:
/// reports, JSON consumers and CI filters compare it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureCode {
    /// The target could not be started or never became ready (`launch_failed`).
    LaunchFailed,
    /// Nothing (or not the whole answer) arrived within the step deadline (`timeout`).
    Timeout,
    /// The target did something other than what the step expects next
    /// (`unexpected_event`): another frame kind, a close instead of a frame, a request.
    UnexpectedEvent,
    /// The target emitted a frame its family's strict decoder refuses (`invalid_frame`).
    InvalidFrame,
    /// The target emitted a decodable frame that violates the family's single wire
    /// definition (`schema_violation`).
    SchemaViolation,
    /// An emitted frame, answer or result does not match the scenario's pattern
    /// (`mismatch`).
    Mismatch,
    /// The target's credential appeared somewhere it may not (`credential_leak`).
    CredentialLeak,
    /// Sending to the target failed (`transport_failed`).
    TransportFailed,
    /// The step needs an open connection and there is none (`not_connected`).
    NotConnected,
    /// The target's exit (or its refusal to exit) is not what `expect_exit` demands
    /// (`target_exit`).
    TargetExit,
    /// The step cannot run on this side (`unsupported_step`).
    UnsupportedStep,
    /// The scenario's own frame or request cannot be built or is invalid
    /// (`scenario_invalid`).
    ScenarioInvalid,
    /// A frame the codec does not allow after the last step (`trailing_output`).
    TrailingOutput,
    /// The family's control channel to the target failed (`control_failed`).
    ControlFailed,
    /// The emitted frames differ from the golden, or it is missing (`golden_mismatch`).
    GoldenMismatch,
    /// The harness itself failed (a task panicked, a file could not be read)
    /// (`harness_error`).
    HarnessError,
}

impl FailureCode {
    /// Every code, in a stable order.
    pub const ALL: [FailureCode; 16] = [
        FailureCode::LaunchFailed,
        FailureCode::Timeout,
        FailureCode::UnexpectedEvent,
        FailureCode::InvalidFrame,
        FailureCode::SchemaViolation,
        FailureCode::Mismatch,
        FailureCode::CredentialLeak,
        FailureCode::TransportFailed,
        FailureCode::NotConnected,
        FailureCode::TargetExit,
        FailureCode::UnsupportedStep,
        FailureCode::ScenarioInvalid,
        FailureCode::TrailingOutput,
        FailureCode::ControlFailed,
        FailureCode::GoldenMismatch,
        FailureCode::HarnessError,
    ];

    /// The stable code (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureCode::LaunchFailed => "launch_failed",
            FailureCode::Timeout => "timeout",
            FailureCode::UnexpectedEvent => "unexpected_event",
            FailureCode::InvalidFrame => "invalid_frame",
            FailureCode::SchemaViolation => "schema_violation",
            FailureCode::Mismatch => "mismatch",
            FailureCode::CredentialLeak => "credential_leak",
            FailureCode::TransportFailed => "transport_failed",
            FailureCode::NotConnected => "not_connected",
            FailureCode::TargetExit => "target_exit",
            FailureCode::UnsupportedStep => "unsupported_step",
            FailureCode::ScenarioInvalid => "scenario_invalid",
            FailureCode::TrailingOutput => "trailing_output",
            FailureCode::ControlFailed => "control_failed",
            FailureCode::GoldenMismatch => "golden_mismatch",
            FailureCode::HarnessError => "harness_error",
        }
    }
}

impl fmt::Display for FailureCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When in a run a failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Preparing the run or starting the target, before the first step.
    Launch,
    /// While running step N (1-based).
    Step(usize),
    /// Reading the target's trailing output after the last step passed.
    AfterLastStep,
    /// The end-of-run checks after the target was stopped (its output's credential
    /// scan).
    EndOfRun,
    /// Comparing the recording with the golden (the runner's phase).
    Golden,
}

impl Phase {
    /// The stable phase name: `launch`, `step`, `after_last_step`, `end_of_run`,
    /// `golden`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Launch => "launch",
            Phase::Step(_) => "step",
            Phase::AfterLastStep => "after_last_step",
            Phase::EndOfRun => "end_of_run",
            Phase::Golden => "golden",
        }
    }

    /// The step index, for [`Phase::Step`].
    pub fn step(self) -> Option<usize> {
        match self {
            Phase::Step(n) => Some(n),
            _ => None,
        }
    }

    /// How the phase reads in a failure line (`step 3`, `after the last step`, …).
    pub fn label(self) -> String {
        match self {
            Phase::Launch => "launch".into(),
            Phase::Step(n) => format!("step {n}"),
            Phase::AfterLastStep => "after the last step".into(),
            Phase::EndOfRun => "end of run".into(),
            Phase::Golden => "golden".into(),
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// Why one step (or one phase) failed: a code and a message. The engine adds the
/// scenario, the phase and the step's description ([`Failure`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    /// What kind of fault.
    pub code: FailureCode,
    /// What was expected and what happened.
    pub message: String,
    /// The `level: reference` requirement of the `reference:` step it happened in.
    pub reference: Option<String>,
}

impl StepError {
    /// A failure with `code`.
    pub fn new(code: FailureCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            reference: None,
        }
    }

    /// The same failure, inside the `reference:` step of `requirement` (the innermost
    /// one wins).
    pub fn in_reference(mut self, requirement: &str) -> Self {
        self.reference
            .get_or_insert_with(|| requirement.to_string());
        self
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// The result of a step or of a part of one.
pub type StepResult<T = ()> = Result<T, StepError>;

/// Shorthand constructors, one per [`FailureCode`] the families use most.
pub mod fail {
    use super::{FailureCode, StepError};

    /// [`FailureCode::Mismatch`].
    pub fn mismatch(message: impl Into<String>) -> StepError {
        StepError::new(FailureCode::Mismatch, message)
    }
    /// [`FailureCode::Timeout`].
    pub fn timeout(message: impl Into<String>) -> StepError {
        StepError::new(FailureCode::Timeout, message)
    }
    /// [`FailureCode::UnexpectedEvent`].
    pub fn unexpected(message: impl Into<String>) -> StepError {
        StepError::new(FailureCode::UnexpectedEvent, message)
    }
    /// [`FailureCode::TransportFailed`].
    pub fn transport(message: impl Into<String>) -> StepError {
        StepError::new(FailureCode::TransportFailed, message)
    }
    /// [`FailureCode::ScenarioInvalid`].
    pub fn scenario(message: impl Into<String>) -> StepError {
        StepError::new(FailureCode::ScenarioInvalid, message)
    }
    /// A value the harness must build (`what`) cannot be: [`FailureCode::ScenarioInvalid`],
    /// except that a placeholder only a typical frame the target did not send carries is a
    /// [`FailureCode::Mismatch`] (inside that frame's reference requirement, if any): the
    /// step needs the frame.
    pub fn bind(error: crate::bind::BindError, what: &str) -> StepError {
        match error {
            crate::bind::BindError::Skipped {
                ref requirement, ..
            } => {
                let e = mismatch(format!("cannot build {what}: {error}"));
                match requirement.clone() {
                    Some(r) => e.in_reference(&r),
                    None => e,
                }
            }
            other => scenario(format!("cannot build {what}: {other}")),
        }
    }
    /// [`FailureCode::UnsupportedStep`].
    pub fn unsupported(message: impl Into<String>) -> StepError {
        StepError::new(FailureCode::UnsupportedStep, message)
    }
    /// [`FailureCode::CredentialLeak`].
    pub fn leak(message: impl Into<String>) -> StepError {
        StepError::new(FailureCode::CredentialLeak, message)
    }
    /// [`FailureCode::NotConnected`].
    pub fn not_connected(message: impl Into<String>) -> StepError {
        StepError::new(FailureCode::NotConnected, message)
    }
    /// [`FailureCode::HarnessError`].
    pub fn harness(message: impl Into<String>) -> StepError {
        StepError::new(FailureCode::HarnessError, message)
    }
}

/// Why a run failed: the scenario, the phase, the step's description (or the phase's
/// name), the code and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Scenario ID (`family/name`).
    pub scenario: String,
    /// When it happened.
    pub phase: Phase,
    /// The step's description (`runtime frame heartbeat`) or the phase's name (`launch`).
    pub what: String,
    /// What kind of fault.
    pub code: FailureCode,
    /// What was expected and what happened.
    pub message: String,
    /// The `level: reference` requirement whose `reference:` step failed: the target
    /// differs from our reference behaviour there (in vendor mode not a failure).
    pub reference: Option<String>,
}

impl Failure {
    /// A failure outside any step (`phase` is not [`Phase::Step`]): `what` is the phase's
    /// label.
    pub fn outside(scenario: &str, phase: Phase, error: StepError) -> Self {
        Self {
            scenario: scenario.to_string(),
            phase,
            what: phase.label(),
            code: error.code,
            message: error.message,
            reference: error.reference,
        }
    }

    /// The 1-based step index, when the failure happened in a step.
    pub fn step(&self) -> Option<usize> {
        self.phase.step()
    }
}

impl fmt::Display for Failure {
    /// `scenario S step N (what): message` or `scenario S (phase): message`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.phase {
            Phase::Step(n) => write!(
                f,
                "scenario {} step {n} ({}): {}",
                self.scenario, self.what, self.message
            ),
            _ => write!(
                f,
                "scenario {} ({}): {}",
                self.scenario, self.what, self.message
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_snake_case() {
        let mut seen = std::collections::BTreeSet::new();
        for code in FailureCode::ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "{text} twice");
            assert!(
                text.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{text}"
            );
        }
    }

    #[test]
    fn failures_read_as_before() {
        let f = Failure {
            scenario: "f/s".into(),
            phase: Phase::Step(3),
            what: "runtime frame delta".into(),
            code: FailureCode::Timeout,
            message: "nothing".into(),
            reference: None,
        };
        assert_eq!(
            f.to_string(),
            "scenario f/s step 3 (runtime frame delta): nothing"
        );
        assert_eq!(f.step(), Some(3));
        let f = Failure::outside("f/s", Phase::AfterLastStep, fail::unexpected("late"));
        assert_eq!(f.to_string(), "scenario f/s (after the last step): late");
        assert_eq!(f.phase.as_str(), "after_last_step");
        assert_eq!(f.step(), None);
    }
}
