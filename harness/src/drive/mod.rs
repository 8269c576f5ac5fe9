//! The step engine: launch → steps → end-of-run check → shutdown, written once for every
//! family and side.
//!
//! A family supplies, through the traits of [`peer`]: the [`Codec`] of its single wire
//! definition, the [`Peer`] the harness plays for a side (transport, handshake, the
//! family's own steps) and, through its start function, the launch contract (a
//! [`Started`] peer and [`Process`]). The engine owns everything else: the generic steps
//! ([`run`]), per-step deadlines, the secret scan of every event and of the target's
//! output, recording for goldens, the check of what the target emits after the last step,
//! and typed failures ([`failure`]: a code and a phase).
//!
//! This module never imports from `crate::family` (families import it), never renders or
//! compares goldens (it returns the [`Recording`] and the [`Bindings`]) and never prints.

pub mod control;
pub mod failure;
pub mod peer;
pub mod run;

#[cfg(test)]
mod fake;

use std::future::Future;
use std::time::Duration;

pub use failure::{Failure, FailureCode, Phase, StepError, StepResult, fail};
pub use peer::{
    Codec, Connection, Describe, Event, NoOther, Outgoing, Peer, Process, Role, WireFault,
};
pub use run::{
    AFTER_LAST_STEP, DEFAULT_CLOSE_CODE, END_CLOSE_REASON, Run, leak_message, show, show_duration,
};

use crate::bind::Bindings;
use crate::golden::Recording;
use crate::scenario::model::{Scenario, Step};
use crate::target::redact_secret;

/// How to drive one scenario.
#[derive(Debug, Clone)]
pub struct DriveOptions {
    /// The target command (`--target-cmd`).
    pub target_cmd: String,
    /// Deadline of every step.
    pub step_timeout: Duration,
    /// Deadline for the target's readiness.
    pub startup_timeout: Duration,
    /// Vendor mode: `{$reference: …}` values the target does not match are recorded as
    /// differences ([`crate::bind::Difference`]) instead of failing the step.
    pub vendor: bool,
    /// The `contract-harness` binary a target runs as its peer in relay mode (the worker
    /// program a target host launches); `None`: the running executable.
    pub peer_exe: Option<std::path::PathBuf>,
    /// The optional features the target declares (`--features FILE`): feature →
    /// supported. A feature not named is supported. The family's launch contract may
    /// use it (core_runtime: the default launch declaration of side runtime).
    pub features: std::collections::BTreeMap<String, bool>,
}

/// The outcome of driving one scenario against one side.
#[derive(Debug, Clone)]
pub struct DriveOutcome {
    /// The first failure, if any.
    pub failure: Option<Failure>,
    /// Everything the target emitted, in order.
    pub recording: Recording,
    /// The placeholder table at the end of the run.
    pub bindings: Bindings,
    /// The target's stderr tail (empty when it was never launched), the secret redacted.
    pub stderr_tail: String,
    /// The target's stdout tail, the secret redacted.
    pub stdout_tail: String,
    /// The target's exit status after shutdown, as text (`None` when unknown).
    pub exit: Option<String>,
}

impl DriveOutcome {
    /// The outcome of a run that failed before anything ran.
    pub fn failed(failure: Failure) -> Self {
        Self {
            failure: Some(failure),
            recording: Recording::new(),
            bindings: Bindings::new(),
            stderr_tail: String::new(),
            stdout_tail: String::new(),
            exit: None,
        }
    }
}

/// What a side's launch contract hands the engine once the target is up.
pub struct Started<P> {
    /// The peer the harness plays, connected to the target's launch environment.
    pub peer: P,
    /// The target process.
    pub process: Box<dyn Process>,
    /// The secret the target must never reveal (empty: none).
    pub secret: String,
    /// `false` when the target exited before readiness and the first step is
    /// `expect_exit` (see [`expects_exit_first`]).
    pub ready: bool,
    /// The normalization of every recorded body.
    pub normalize: fn(&serde_json::Value) -> serde_json::Value,
    /// Placeholders bound before the first step: values the harness chose at launch
    /// that the target must echo (the worker family's startup token, `$token`).
    pub prebound: Vec<(String, serde_json::Value)>,
}

/// Whether the scenario's first step is `expect_exit`: then an exit before readiness is
/// not a launch failure, and a target that became ready fails that step.
pub fn expects_exit_first(scenario: &Scenario) -> bool {
    matches!(scenario.steps.first(), Some(Step::ExpectExit { .. }))
}

/// Drives `scenario`: awaits `start` (the side's launch contract), runs every step,
/// checks the trailing output, stops the target and scans its output for the secret.
/// Never panics on target behaviour; the target is always stopped before this returns.
pub async fn drive<P, F>(scenario: &Scenario, opts: &DriveOptions, start: F) -> DriveOutcome
where
    P: Peer,
    F: Future<Output = Result<Started<P>, String>>,
{
    let id = scenario.id();
    let started = match start.await {
        Ok(started) => started,
        Err(message) => {
            return DriveOutcome::failed(Failure::outside(
                &id,
                Phase::Launch,
                StepError::new(FailureCode::LaunchFailed, message),
            ));
        }
    };
    let Started {
        mut peer,
        process,
        secret,
        ready,
        normalize,
        prebound,
    } = started;
    let mut run = Run::new(process, secret, opts.step_timeout, opts.startup_timeout);
    run.bindings.vendor = opts.vendor;
    for (name, value) in prebound {
        // Fresh bindings: a name cannot be bound twice unless the peer repeats it.
        let _ = run.bindings.bind(&name, value);
    }
    run.set_normalize(normalize);
    run.ready_instead_of_exit = ready && expects_exit_first(scenario);
    let failure = drive_steps(&mut run, &mut peer, scenario).await;
    finish(run, peer, &id, failure).await
}

/// Runs every step of `scenario` and the after-the-last-step check; the first failure.
pub async fn drive_steps<P: Peer>(
    run: &mut Run,
    peer: &mut P,
    scenario: &Scenario,
) -> Option<Failure> {
    let id = scenario.id();
    for (i, step) in scenario.steps.iter().enumerate() {
        run.step = i + 1;
        if let Err(error) = run.exec(peer, step).await {
            return Some(Failure {
                scenario: id,
                phase: Phase::Step(i + 1),
                what: step.describe(),
                code: error.code,
                message: error.message,
                reference: error.reference,
            });
        }
    }
    run.finish(peer)
        .await
        .err()
        .map(|error| Failure::outside(&id, Phase::AfterLastStep, error))
}

/// Ends a run: releases the peer's connections (the target sees the end), stops the
/// target, scans its output for the secret, redacts the secret from everything reported.
async fn finish<P: Peer>(
    mut run: Run,
    mut peer: P,
    id: &str,
    mut failure: Option<Failure>,
) -> DriveOutcome {
    peer.release();
    let exit = run.process.shutdown().await;
    let leaked = run.earlier_leak.or(run.process.leak_channel());
    if failure.is_none()
        && let Some(channel) = leaked
    {
        failure = Some(Failure::outside(
            id,
            Phase::EndOfRun,
            fail::leak(leak_message(&format!("the target's {channel}"))),
        ));
    }
    if failure.is_none()
        && let Some(label) = run.recorded_leak.take()
    {
        failure = Some(Failure::outside(
            id,
            Phase::EndOfRun,
            fail::leak(leak_message(&format!(
                "a recorded {label} (escaped on the wire)"
            ))),
        ));
    }
    let secret = run.secret.clone();
    let redact = |text: &str| {
        if secret.is_empty() {
            text.to_string()
        } else {
            redact_secret(text, &secret)
        }
    };
    let outcome = DriveOutcome {
        failure: failure.map(|mut f| {
            f.message = redact(&f.message);
            f
        }),
        stderr_tail: redact(&format!(
            "{}{}",
            run.earlier_stderr,
            run.process.stderr_tail()
        )),
        stdout_tail: redact(&run.process.stdout_tail()),
        exit: exit.map(|s| s.to_string()),
        recording: std::mem::take(&mut run.recording),
        bindings: std::mem::take(&mut run.bindings),
    };
    // The run directory (held by the peer) goes only after the target stopped.
    drop(peer);
    outcome
}
