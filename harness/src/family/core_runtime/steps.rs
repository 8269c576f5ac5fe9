//! The family's own steps (`bootstrap`, `connect`, `handshake`, `reconnect`, `native:`,
//! `api:`, `api_result:`), dispatched once for both sides: each side says what the step
//! means when the harness plays its role ([`CoreRuntimePeer`]).

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::drive::{Peer, Run, StepResult, fail};
use crate::scenario::model::{ApiStep, BootstrapStep, ConnectStep, Step};

/// A `bootstrap` step as a side sees it: the scenario's spec and, inside `handshake`,
/// the heartbeat interval that step names.
#[derive(Debug, Clone, Copy)]
pub struct Bootstrap<'a> {
    /// The scenario's `bootstrap:` (defaults inside `handshake`/`reconnect`).
    pub spec: &'a BootstrapStep,
    /// `handshake: {heartbeat_interval_ms}`.
    pub heartbeat_ms: Option<u64>,
    /// `reconnect: {within}`: how long a target Runtime may take to send the bootstrap
    /// request (`None`: the step timeout).
    pub within: Option<Duration>,
}

/// A `native:` step: the control-channel operation, its arguments and the pattern its
/// result must match.
#[derive(Debug, Clone, Copy)]
pub struct Native<'a> {
    /// Operation name.
    pub op: &'a str,
    /// Arguments (an object; placeholders substituted).
    pub args: &'a Value,
    /// Pattern of the result, when given.
    pub expect: Option<&'a Value>,
}

/// What a side of this family does for each of the family's steps.
#[async_trait]
pub trait CoreRuntimePeer: Peer {
    /// `bootstrap` (`heartbeat_ms`: the interval `handshake` names).
    async fn bootstrap(&mut self, run: &mut Run, call: Bootstrap<'_>) -> StepResult;
    /// `connect`.
    async fn connect(&mut self, run: &mut Run, spec: &ConnectStep) -> StepResult;
    /// The first heartbeat of `handshake` (expected from a target Runtime; sent, and
    /// awaited as applied, to a target Core).
    async fn first_heartbeat(&mut self, run: &mut Run) -> StepResult;
    /// `native:` (the controlled adapter; skipped where the harness plays the Runtime).
    async fn native(&mut self, run: &mut Run, call: Native<'_>) -> StepResult;
    /// `api:` (Core's public API; skipped where the harness plays Core).
    async fn api(&mut self, run: &mut Run, api: &ApiStep) -> StepResult;
    /// `api_result:`.
    async fn api_result(&mut self, run: &mut Run, id: &str) -> StepResult;
}

/// Runs one of the family's steps on `peer`.
///
/// # Errors
/// The step's failure; a step of another family is [`crate::drive::FailureCode::UnsupportedStep`].
pub async fn family_step<P: CoreRuntimePeer>(
    peer: &mut P,
    run: &mut Run,
    step: &Step,
) -> StepResult {
    match step {
        Step::Native { op, args, expect } => {
            let call = Native {
                op,
                args,
                expect: expect.as_ref(),
            };
            peer.native(run, call).await
        }
        Step::Bootstrap(spec) => {
            let call = Bootstrap {
                spec,
                heartbeat_ms: None,
                within: None,
            };
            peer.bootstrap(run, call).await
        }
        Step::Connect(spec) => peer.connect(run, spec).await,
        Step::Handshake {
            heartbeat_interval_ms,
        } => {
            let spec = BootstrapStep::default();
            let call = Bootstrap {
                spec: &spec,
                heartbeat_ms: *heartbeat_interval_ms,
                within: None,
            };
            peer.bootstrap(run, call).await?;
            peer.connect(run, &ConnectStep::default()).await?;
            peer.first_heartbeat(run).await
        }
        Step::Reconnect { within } => {
            let spec = BootstrapStep::default();
            let call = Bootstrap {
                spec: &spec,
                heartbeat_ms: None,
                within: *within,
            };
            peer.bootstrap(run, call).await?;
            peer.connect(run, &ConnectStep::default()).await
        }
        Step::Api(api) => peer.api(run, api).await,
        Step::ApiResult(r) => peer.api_result(run, &r.id).await,
        other => Err(fail::unsupported(format!(
            "`{}` is not a step of the core_runtime family",
            other.keyword()
        ))),
    }
}
