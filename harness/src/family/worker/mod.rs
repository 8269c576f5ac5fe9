//! The host ↔ worker family (`worker-protocol.md`, "Runtime control protocol v1"): its
//! codec and the peers the harness plays.
//!
//! * Side `worker` ([`worker_side`]): the worker under test; the harness plays the host
//!   (private directory, socket, token, spawn).
//! * Side `host` ([`host_side`]): the host under test, driven over its control channel;
//!   the harness plays every worker it launches, through the relay.
//!
//! Both run on the step engine ([`crate::drive`]); this module holds only what is the
//! worker protocol's. It never renders or compares goldens and never prints.

pub mod codec;
pub mod host_side;
pub mod worker_side;

use crate::drive::{self, DriveOptions, DriveOutcome};
use crate::scenario::model::{Scenario, Side};

/// The family's name (scenario directory and `--family` value).
pub const FAMILY: &str = "worker";

/// The `session_id` of every connection the harness runs (the spec's example, `root`).
pub const SESSION_ID: &str = "root";

/// The `generation` of every connection the harness runs (the spec's example, `g-1`).
pub const GENERATION: &str = "g-1";

/// Keys whose values a target worker generates (aliased in goldens): its request IDs.
pub const GENERATED_KEYS: &[&str] = &[];

/// Drives `scenario` with `side` as the target, on the step engine.
pub async fn drive(scenario: &Scenario, side: Side, opts: &DriveOptions) -> DriveOutcome {
    let exit_first = drive::expects_exit_first(scenario) || worker_side::ends_first(scenario);
    match side {
        Side::Worker => {
            drive::drive(
                scenario,
                opts,
                worker_side::start(scenario, opts, exit_first),
            )
            .await
        }
        Side::Host => drive::drive(scenario, opts, host_side::start(scenario, opts)).await,
        other => DriveOutcome::failed(drive::Failure::outside(
            &scenario.id(),
            drive::Phase::Launch,
            drive::StepError::new(
                drive::FailureCode::UnsupportedStep,
                format!("the worker family has no side `{other}` in this harness yet"),
            ),
        )),
    }
}
