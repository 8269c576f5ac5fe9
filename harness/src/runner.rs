//! Running scenarios: one run = launch the target, drive the steps (the family driver),
//! then render and check the golden; [`run_many`] runs a list on a bounded worker pool.
//!
//! This module owns turning a driver outcome into a [`ScenarioResult`] (failure text with
//! the target's stderr tail, golden diff) and the concurrency bound. It never parses
//! scenario files, never prints and never decides the order of results (the caller's
//! list order is kept).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use crate::drive::{DriveOptions, DriveOutcome, FailureCode, Phase};
use crate::family;
use crate::golden::{self, GoldenMode};
use crate::report::ScenarioResult;
use crate::scenario::{Scenario, Side};

/// Default per-step deadline (`--step-timeout`).
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(5);
/// Default start-up deadline (`--startup-timeout`).
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

/// [`run_many`] aborts a run whose first this-many results (in list order) all failed
/// the same hopeless way: launch failures with the same first line (the target will not
/// start), or failures with the same code after the target emitted nothing at all (it
/// started, then never answered). Running every other scenario would only repeat that,
/// each waiting out its start-up or step deadline.
pub const LAUNCH_FAILURES_TO_ABORT: usize = 3;

/// Why one run counts towards aborting the whole run ([`LAUNCH_FAILURES_TO_ABORT`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Abort {
    /// The target did not start; the first line of the launch failure.
    Launch(String),
    /// The target became ready, then emitted nothing at all (no frame, answer, request,
    /// close or exit) before the run failed with this code ([`FailureCode::Timeout`] or
    /// [`FailureCode::TransportFailed`], e.g. a Core that prints its ready line and
    /// then never answers an HTTP request).
    Silent(FailureCode),
    /// The target answered something, then failed the first step with this code and
    /// this message (the scenario's name taken out), e.g. a Core that answers bootstrap
    /// but never upgrades the WebSocket: the same hopeless start in every scenario.
    StuckAtStart(FailureCode, String),
}

impl Abort {
    /// The signature of a failed run, if it is one of the hopeless kinds.
    fn of(failure: &crate::drive::Failure, emitted_nothing: bool) -> Option<Self> {
        match (failure.code, failure.phase) {
            (FailureCode::LaunchFailed, Phase::Launch) => {
                let first = failure.message.lines().next().unwrap_or("");
                Some(Self::Launch(
                    first.trim_end_matches("; stderr tail:").to_string(),
                ))
            }
            (FailureCode::Timeout | FailureCode::TransportFailed, Phase::Step(_))
                if emitted_nothing =>
            {
                Some(Self::Silent(failure.code))
            }
            (FailureCode::Timeout | FailureCode::TransportFailed, Phase::Step(1)) => {
                let first = failure.message.lines().next().unwrap_or("");
                // `scenario <id> step 1 (<keyword>): <what>`: compared without the ID.
                let what = first
                    .strip_prefix("scenario ")
                    .and_then(|rest| rest.split_once(' '))
                    .map_or(first, |(_, rest)| rest);
                Some(Self::StuckAtStart(failure.code, what.to_string()))
            }
            _ => None,
        }
    }

    /// The `ABORTED: …` reason for `skipped` runs left out.
    fn reason(&self, skipped: usize) -> String {
        match self {
            Self::Launch(first_line) => format!(
                "target never became ready: {first_line}; the first {LAUNCH_FAILURES_TO_ABORT} \
                 scenarios failed to launch the same way, {skipped} remaining scenario(s) not run"
            ),
            Self::StuckAtStart(code, what) => format!(
                "target never got past the first step: the first {LAUNCH_FAILURES_TO_ABORT} \
                 scenarios failed with `{code}` the same way ({what}), {skipped} remaining \
                 scenario(s) not run"
            ),
            Self::Silent(code) => format!(
                "target never answered: the first {LAUNCH_FAILURES_TO_ABORT} scenarios received \
                 nothing at all from the target before failing with `{code}`, {skipped} \
                 remaining scenario(s) not run"
            ),
        }
    }
}

/// How to run scenarios.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The target command, split like a POSIX shell would.
    pub target_cmd: String,
    /// Root of the golden files (`golden/`).
    pub golden_dir: PathBuf,
    /// The goldens are the target's own (`run --golden-dir`): a difference fails the
    /// run in vendor mode too. `false`: the reference goldens, whose differences are
    /// advisory in vendor mode.
    pub own_goldens: bool,
    /// Check, accept or write pending goldens.
    pub golden_mode: GoldenMode,
    /// Deadline of every step.
    pub step_timeout: Duration,
    /// Deadline for the target's readiness.
    pub startup_timeout: Duration,
    /// Strict (ours) or vendor (a third party's) judgement of `reference:` steps.
    pub mode: Mode,
    /// The `contract-harness` binary targets run as their relay peer (`None`: this
    /// executable, which is that binary unless the runner is embedded in a test).
    pub peer_exe: Option<PathBuf>,
    /// Where to write each scenario's wire log (`<dir>/<family>/<name>.<side>.wire.jsonl`),
    /// if anywhere.
    pub wire_dir: Option<PathBuf>,
    /// The optional features the target declares (`--features FILE`; see
    /// [`crate::features`]): feature → supported; a feature not named is supported.
    /// Each scenario is launched with [`crate::features::launch_declaration`] of it.
    pub features: std::collections::BTreeMap<String, bool>,
    /// `--fail-fast`: [`run_many`] stops at the first failed run (a mutation-testing
    /// judge needs one failure, not all of them); the runs not done are reported as
    /// [`ManyResults::aborted`].
    pub fail_fast: bool,
}

/// What a vendor-mode DIFF names instead of a requirement when the target's frames pass
/// every step but differ from the golden (the recorded wire it was compared with).
pub const GOLDEN_DIFFERENCE: &str = "golden";

/// How failures inside `reference:` steps (our implementation's choices) count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// Our own runs: a reference step is asserted like any other; its failure fails.
    #[default]
    Strict,
    /// A third party's run: a failure inside a reference step ends the run as a
    /// difference from the reference behaviour (reported with the requirement), never as
    /// non-conformance.
    Vendor,
}

impl Mode {
    /// Parses `strict` or `vendor`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "strict" => Some(Mode::Strict),
            "vendor" => Some(Mode::Vendor),
            _ => None,
        }
    }
}

/// Runs `scenario` against `side` and checks its golden. Never panics on target
/// behaviour; the target is always stopped before this returns.
pub async fn run_scenario(scenario: &Scenario, side: Side, opts: &RunOptions) -> ScenarioResult {
    run_scenario_reporting_launch(scenario, side, opts).await.0
}

/// As [`run_scenario`], plus the signature [`run_many`] compares when the run failed in
/// a way that aborts the whole run if it repeats ([`Abort`]).
async fn run_scenario_reporting_launch(
    scenario: &Scenario,
    side: Side,
    opts: &RunOptions,
) -> (ScenarioResult, Option<Abort>) {
    let started = Instant::now();
    let id = scenario.id();
    let drive_opts = DriveOptions {
        target_cmd: opts.target_cmd.clone(),
        step_timeout: opts.step_timeout,
        startup_timeout: opts.startup_timeout,
        vendor: opts.mode == Mode::Vendor,
        peer_exe: opts.peer_exe.clone(),
        // A refusal scenario is launched lacking what it requires `false`.
        features: crate::features::launch_declaration(&opts.features, scenario),
    };
    let outcome = family::drive(scenario, side, &drive_opts).await;
    let generated_keys = family::generated_keys(&scenario.family, side);
    // Written for every run, a failed one above all: the log is how a failure is read
    // without running it again.
    if let Some(dir) = &opts.wire_dir {
        write_wire_log(dir, scenario, side, &outcome.recording.wire);
    }
    if let Some(failure) = &outcome.failure {
        let launch = Abort::of(failure, outcome.recording.entries.is_empty());
        let text = with_target_context(failure.to_string(), &outcome);
        let result = match (&failure.reference, opts.mode) {
            (Some(requirement), Mode::Vendor) => {
                ScenarioResult::differs(id, side, started.elapsed(), requirement, text)
            }
            _ => ScenarioResult::fail(id, side, started.elapsed(), text),
        }
        .with_code(failure.code, failure.phase)
        .with_reference(failure.reference.clone());
        return (result, launch);
    }
    let rendered = golden::render(
        scenario,
        side,
        &outcome.recording,
        &outcome.bindings,
        generated_keys,
    );
    let path = golden::golden_path(&opts.golden_dir, &scenario.family, &scenario.name, side);
    let checked = golden::check_golden(&path, &rendered, opts.golden_mode);
    let mut result = match checked {
        Ok(golden_outcome) => match golden_outcome.failure(&path) {
            None => ScenarioResult::pass(id, side, started.elapsed()),
            // A golden records a wire (ours, by default), not the contract: in a
            // vendor's run a difference from it is reported, never a failure.
            Some(text) if opts.mode == Mode::Vendor && !opts.own_goldens => {
                ScenarioResult::differs(
                    id.clone(),
                    side,
                    started.elapsed(),
                    GOLDEN_DIFFERENCE,
                    format!("scenario {id} [{side}] differs from the recorded wire: {text}"),
                )
            }
            Some(text) => ScenarioResult::fail(
                id.clone(),
                side,
                started.elapsed(),
                with_target_context(format!("scenario {id} [{side}]: {text}"), &outcome),
            )
            .with_code(FailureCode::GoldenMismatch, Phase::Golden),
        },
        Err(e) => ScenarioResult::fail(
            id.clone(),
            side,
            started.elapsed(),
            format!("scenario {id} [{side}]: golden {}: {e}", path.display()),
        )
        .with_code(FailureCode::HarnessError, Phase::Golden),
    };
    result.golden = Some(path.display().to_string());
    if result.passed
        && let Some(first) = outcome.bindings.differences.first()
    {
        let lines: Vec<String> = outcome
            .bindings
            .differences
            .iter()
            .map(|d| match &d.actual {
                Some(actual) => format!(
                    "{} at {}: the reference sends {}, the target sent {actual}",
                    d.requirement, d.path, d.reference
                ),
                None if d.path.starts_with("step") => format!(
                    "{} at {}: the reference sends the typical frame {}, the target did not",
                    d.requirement, d.path, d.reference
                ),
                None => format!(
                    "{} at {}: the reference sends {}, the target left it out",
                    d.requirement, d.path, d.reference
                ),
            })
            .collect();
        let golden = result.golden.take();
        // A golden difference found as well is listed after the reference differences.
        let also = result
            .failure
            .take()
            .map(|golden_text| format!("\n{golden_text}"))
            .unwrap_or_default();
        result = ScenarioResult::differs(
            result.scenario.clone(),
            side,
            result.duration,
            &first.requirement,
            format!(
                "scenario {} [{side}] differs from the reference behaviour:\n{}{also}",
                result.scenario,
                lines.join("\n")
            ),
        );
        result.golden = golden;
    }
    (result, None)
}

/// Appends the target's exit status and stderr tail to a failure text.
fn with_target_context(mut text: String, outcome: &DriveOutcome) -> String {
    if let Some(exit) = &outcome.exit {
        text.push_str(&format!("\ntarget ended with {exit}"));
    }
    let tail = outcome.stderr_tail.trim_end();
    if tail.is_empty() {
        // A launch failure may already quote the tail it read before the target ended.
        if !text.contains("stderr tail:") {
            text.push_str("\ntarget stderr: (empty)");
        }
    } else {
        text.push_str("\ntarget stderr (tail):");
        for line in tail.lines() {
            text.push_str("\n  | ");
            text.push_str(line);
        }
    }
    let tail = outcome.stdout_tail.trim_end();
    if !tail.is_empty() {
        text.push_str("\ntarget stdout (tail):");
        for line in tail.lines() {
            text.push_str("\n  | ");
            text.push_str(line);
        }
    }
    text
}

/// Writes one scenario's wire log as JSON lines; a failure to write is reported on
/// stderr and never fails the scenario.
fn write_wire_log(
    dir: &std::path::Path,
    scenario: &Scenario,
    side: Side,
    wire: &[serde_json::Value],
) {
    let path =
        dir.join(&scenario.family)
            .join(format!("{}.{}.wire.jsonl", scenario.name, side.as_str()));
    let text: String = wire.iter().map(|v| format!("{v}\n")).collect();
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, text));
    if let Err(e) = written {
        {
            use std::io::Write as _;
            // Stderr may be gone; a diagnostic never panics the run.
            let _ = writeln!(std::io::stderr(), "wire log {}: {e}", path.display());
        }
    }
}

/// The results of [`run_many`].
#[derive(Debug, Clone)]
pub struct ManyResults {
    /// One result per run that was reported, in list order.
    pub results: Vec<ScenarioResult>,
    /// Why the remaining runs were not run (`target never became ready: …`, `target
    /// never answered: …`), when the run was aborted after [`LAUNCH_FAILURES_TO_ABORT`]
    /// identical hopeless failures.
    pub aborted: Option<String>,
}

/// Runs every `(scenario, side)` with at most `jobs` runs at once (each on its own
/// task), calling `on_result` for each result **in list order** as soon as it and all
/// earlier ones are done, and returns the results in list order. A run whose task
/// panicked becomes a failed result (the target's drop guard has killed it).
///
/// When the first [`LAUNCH_FAILURES_TO_ABORT`] results all failed the same hopeless way
/// (launch failures with the same first line, or a target that answered nothing), the
/// rest is not run: runs in flight are cancelled (their targets'
/// process groups are killed) and [`ManyResults::aborted`] says why.
pub async fn run_many(
    runs: Vec<(Scenario, Side)>,
    opts: &RunOptions,
    jobs: usize,
    mut on_result: impl FnMut(&ScenarioResult),
) -> ManyResults {
    let opts = Arc::new(opts.clone());
    let total = runs.len();
    let tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
    let mut stream = futures_util::stream::iter(runs)
        .map(|(scenario, side)| {
            let opts = opts.clone();
            let tasks = tasks.clone();
            async move {
                let id = scenario.id();
                let started = Instant::now();
                let task = tokio::spawn(async move {
                    run_scenario_reporting_launch(&scenario, side, &opts).await
                });
                if let Ok(mut handles) = tasks.lock() {
                    handles.retain(|h| !h.is_finished());
                    handles.push(task.abort_handle());
                }
                match task.await {
                    Ok(reported) => reported,
                    Err(e) => (
                        ScenarioResult::fail(
                            id.clone(),
                            side,
                            started.elapsed(),
                            format!("scenario {id} [{side}]: the harness task failed: {e}"),
                        )
                        .with_code(FailureCode::HarnessError, Phase::Launch),
                        None,
                    ),
                }
            }
        })
        .buffered(jobs.max(1));
    let mut results = Vec::new();
    let mut launch_failures: Vec<Abort> = Vec::new();
    while let Some((result, launch)) = stream.next().await {
        on_result(&result);
        results.push(result);
        if results.len() <= LAUNCH_FAILURES_TO_ABORT {
            match launch {
                Some(first_line) => launch_failures.push(first_line),
                None => launch_failures.clear(),
            }
        }
        let identical = launch_failures.len() == LAUNCH_FAILURES_TO_ABORT
            && launch_failures.iter().all(|l| *l == launch_failures[0]);
        let hopeless = results.len() == LAUNCH_FAILURES_TO_ABORT && identical;
        let failed_fast = opts.fail_fast && results.last().is_some_and(|r| !r.passed);
        if (hopeless || failed_fast) && total > results.len() {
            drop(stream);
            if let Ok(handles) = tasks.lock() {
                handles.iter().for_each(tokio::task::AbortHandle::abort);
            }
            let skipped = total - results.len();
            let reason = if hopeless {
                launch_failures[0].reason(skipped)
            } else {
                format!(
                    "stopped at the first failure (--fail-fast), {skipped} remaining scenario(s) not run"
                )
            };
            return ManyResults {
                results,
                aborted: Some(reason),
            };
        }
    }
    ManyResults {
        results,
        aborted: None,
    }
}

/// The default worker count: the machine's available parallelism (1 if unknown).
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::Failure;

    fn failure(code: FailureCode, phase: Phase, message: &str) -> Failure {
        Failure {
            scenario: "f/s".into(),
            phase,
            what: "handshake".into(),
            code,
            message: message.into(),
            reference: None,
        }
    }

    /// Which failures count towards aborting a run, and how they compare.
    #[test]
    fn hopeless_failures_have_a_signature_and_others_none() {
        let launch = failure(
            FailureCode::LaunchFailed,
            Phase::Launch,
            "exited (status 3); stderr tail:\nboom",
        );
        assert_eq!(
            Abort::of(&launch, true),
            Some(Abort::Launch("exited (status 3)".into()))
        );
        let dial = failure(
            FailureCode::TransportFailed,
            Phase::Step(1),
            "the WebSocket dial failed: timed out after 1000ms",
        );
        assert_eq!(
            Abort::of(&dial, true),
            Some(Abort::Silent(FailureCode::TransportFailed))
        );
        assert_eq!(
            Abort::of(&dial, false),
            Some(Abort::StuckAtStart(
                FailureCode::TransportFailed,
                "the WebSocket dial failed: timed out after 1000ms".into()
            ))
        );
        // A target that got past the first step, or failed otherwise, is judged per
        // scenario.
        let later = failure(FailureCode::Timeout, Phase::Step(4), "no frame");
        assert_eq!(Abort::of(&later, false), None);
        let mismatch = failure(FailureCode::Mismatch, Phase::Step(1), "bad body");
        assert_eq!(Abort::of(&mismatch, false), None);
    }
}
