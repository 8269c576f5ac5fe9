//! The controlled host (`contract-impl worker host`, `docs/worker-host-control.md`): our
//! worker host driven over a control channel, so that a scripted peer (the conformance
//! harness) can make it start workers, run cells, call hooks and activate revisions, and
//! read what the host decided.
//!
//! * The host connects to `CONTRACT_HOST_CONTROL_SOCKET`, sends the hello line
//!   [`HELLO_LINE`], then answers one request per line (`{"seq", "op", ...}` →
//!   `{"seq", "ok", "result"|"error"}`).
//! * Requests take effect in the order they were sent: every op but `await` is applied
//!   before the next line is read (long operations register their outcome and run on in
//!   the background); `await`s wait concurrently, at most [`AWAITS_MAX`] at once, after
//!   which the host stops reading (backpressure, never unbounded memory).
//! * Every worker it starts runs `CONTRACT_WORKER_PROGRAM` (a JSON array: the program and
//!   its arguments; default our Python worker) under the supervisor, with the launch
//!   environment of `docs/worker-launch-contract.md`.
//! * A cell's source work (`workspace.info`, `workspace.run`, `evidence.resolve`) is
//!   served in one workspace directory ([`super::workspace`]): `--workspace DIR` (or
//!   `CONTRACT_WORKSPACE`), by default [`WORKSPACE_DIR`] under the data directory (made
//!   0700).
//! * A data directory whose epoch names a revision (a restart) starts that revision's
//!   hook worker while the host says hello; the first request applies once it is up (or
//!   failed), so requests never race it.
//! * Its skill roots ([`super::skills::SkillRoots`]): builtin from `KLBR_SKILLS_DIR`, else
//!   `<workspace>/skills` (the same workspace); managed `<data>/skills` (`--data-dir`/`CONTRACT_HOST_DATA_DIR`), created
//!   at start. Each workbench is given the index scanned when it starts.
//! * SIGTERM or the end of the control channel stops every worker (a running cell is
//!   stopped hard) and every workspace run, and ends the process.
//!
//! The framing, the request checks, the outcome registry and `await` are the shared
//! [`crate::control`]'s. This module owns the mapping of the host's operations (the
//! private `ops` module) onto [`super::host`], [`super::policy`], [`super::activation`],
//! [`super::lane`], [`super::skills`] and [`super::instructions`] (the private
//! `instructions` module); it never speaks the worker wire itself.

mod instructions;
mod ops;
mod services;

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use super::activation::Policies;
use super::host::{CellRecord, Choices};
use super::lane::OperatorLane;
use super::policy::INVOKE_BUDGET;
use super::skills::SkillRoots;
use super::stores::HostStores;
use super::turns::TurnBoundary;
use super::workspace::Workspace;
pub use crate::control::{AWAIT_MAX, AWAITS_MAX, CONTROL_LINE_MAX_BYTES, OUTCOMES_MAX};
use ops::Host;

/// The first line the host sends on the control channel.
pub const HELLO_LINE: &str = r#"{"hello":{"adapter":"worker-host","protocol":1}}"#;

/// The variable naming the control socket.
pub const CONTROL_ENV: &str = "CONTRACT_HOST_CONTROL_SOCKET";

/// The workspace directory under the data directory, when `--workspace` names none.
pub const WORKSPACE_DIR: &str = "workspace";

/// The variable naming the worker program (a JSON array of strings).
pub const PROGRAM_ENV: &str = "CONTRACT_WORKER_PROGRAM";

/// Reads the worker program from [`PROGRAM_ENV`] (default: this binary's Python worker).
///
/// # Errors
/// The variable is not a JSON array of strings.
pub fn program_from_env() -> Result<Vec<OsString>, String> {
    match std::env::var(PROGRAM_ENV) {
        Ok(text) => {
            let argv: Vec<String> = serde_json::from_str(&text)
                .map_err(|e| format!("{PROGRAM_ENV} must be a JSON array of strings: {e}"))?;
            if argv.is_empty() {
                return Err(format!("{PROGRAM_ENV} names no program"));
            }
            Ok(argv.into_iter().map(OsString::from).collect())
        }
        Err(_) => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            Ok(vec![exe.into_os_string(), "worker".into(), "python".into()])
        }
    }
}

/// Runs the controlled host until the control channel ends or SIGTERM; stops every
/// worker and every workspace run before it returns. Returns the process exit code (0;
/// 2 when it cannot start).
///
/// `workspace`: the directory of its source work (created 0700 when missing); `None`:
/// [`WORKSPACE_DIR`] under `data_dir`.
///
/// `data_dir` holds the activation epoch, the operator lane, the host's stores
/// (`maintenance.*`, `orientation.*`, `peer.*`) and the managed skills;
/// `workspace` is where the builtin skills default to (`<workspace>/skills`).
///
/// `different`: the host makes every choice the spec leaves free otherwise
/// ([`Choices::DIFFERENT`], another session and generation naming, other outcome codes,
/// another wake priority of its own plans), for the vendor-mode trial of the suite.
pub async fn run(data_dir: &Path, workspace: Option<&Path>, different: bool) -> i32 {
    match serve(data_dir, workspace, different).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("contract-impl worker host: {e}");
            2
        }
    }
}

async fn serve(data_dir: &Path, workspace: Option<&Path>, different: bool) -> Result<(), String> {
    let socket = std::env::var(CONTROL_ENV).map_err(|_| format!("{CONTROL_ENV} is not set"))?;
    let program = program_from_env()?;
    let choices = if different {
        Choices::DIFFERENT
    } else {
        Choices::REFERENCE
    };
    // A workspace run's program is killed with its whole group; a member whose parent
    // died first is re-parented to the host rather than to init, so that the host reaps
    // it before it answers the run (`ProcessGroup::reap`) and no zombie is left behind.
    if let Err(e) = crate::process::group::become_subreaper() {
        eprintln!(
            "contract-impl worker host: not a child subreaper ({e}); init reaps what a run leaves"
        );
    }
    let policies = Policies::open_idle(data_dir, program.clone(), INVOKE_BUDGET, choices)
        .map_err(|e| e.to_string())?;
    let lane = Arc::new(OperatorLane::open(data_dir)?);
    let workspace_dir = workspace.map_or_else(|| data_dir.join(WORKSPACE_DIR), Path::to_path_buf);
    let workspace =
        Workspace::open(&workspace_dir, lane.clone(), different).map_err(|e| e.to_string())?;
    let skills = SkillRoots::resolve(&workspace_dir, data_dir);
    skills.prepare()?;
    let turns = TurnBoundary::open(data_dir)?;
    let instructions =
        instructions::Instructions::open(data_dir, ops::session(different).as_str())?
            .answering(different);
    let host = Arc::new(Host::new(
        program,
        Arc::new(policies),
        ops::Stores {
            lane,
            skills,
            workspace: Arc::new(workspace),
            turns: Arc::new(turns),
            instructions: Arc::new(instructions),
            stores: Arc::new(HostStores::open(data_dir, different)?),
        },
        different,
    ));
    // The recorded revision starts beside the hello, before the first request applies.
    host.restore().await;
    crate::control::serve(Path::new(&socket), HELLO_LINE, host).await
}

/// A cell record as the control channel reports it.
pub fn record_json(record: &CellRecord) -> Value {
    json!({
        "status": record.status,
        "output": record.output,
        "truncated_bytes": record.truncated_bytes,
        "error": record.error,
        "observed_by_host": record.observed_by_host,
    })
}
