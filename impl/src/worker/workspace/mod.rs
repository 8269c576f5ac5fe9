//! Source work of the host ("Message vocabulary", "Source work and policy"):
//! `workspace.info`, `workspace.run` and `evidence.resolve`, answered against one
//! workspace directory and the host's durable operator lane.
//!
//! * `workspace.info` (`{"method":"workspace.info"}`) answers what the host knows of its
//!   workspace ([`Workspace::info`]): the canonical root and the bounds and environment
//!   a run gets. The shape is our reference choice (the spec names the method only).
//! * `workspace.run` (`{"method":"workspace.run","argv":[…],"cwd":".","env":{},
//!   "timeout_ms":120000,"max_output_bytes":750000}`) runs one program
//!   ([`Workspace::run`]): the request is checked by the private `request` module
//!   (bounds, argv, the environment, the working directory inside the workspace), the
//!   program runs in a process group of its own by the private `run` module, and its
//!   output is captured within its bound by [`capture`].
//! * `evidence.resolve` (`{"method":"evidence.resolve","refs":["event:42"]}`) resolves
//!   each reference on its own ([`Workspace::resolve`], the private `evidence` module).
//!
//! What each answers is our reading (the spec shows the requests, not their replies):
//! catalog entries WK-HOST-013 to WK-HOST-018 and `docs/worker-host-control.md`, "Source
//! work and the slots".
//!
//! A refused request is a [`WorkspaceError`] with a stable [`code`](WorkspaceError::code),
//! answered as a `host_reply` error; a program that ran and failed is an `ok` reply that
//! says how it ended. This module owns the workspace root, the processes it starts (every
//! one of them is killed and reaped: at its timeout, when the program exits, when the
//! run is abandoned and at [`Workspace::stop_runs`]) and the reply shapes. It never
//! speaks the worker wire, never writes the operator lane and never runs a program
//! outside the workspace root or with the host's own environment.

pub mod capture;
mod evidence;
mod request;
mod run;

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;

use super::lane::OperatorLane;
use super::wire::Reply;
use super::wire::limits::WAIT_SECONDS_MAX;
pub use evidence::{EVENT_REF_PREFIX, EVIDENCE_REFS_MAX, EVIDENCE_TEXT_MAX_BYTES};
pub use request::{DEFAULT_PATH, INHERITED_ENV};
pub use run::PIPE_DRAIN_AFTER_EXIT;

/// Longest `timeout_ms` of `workspace.run`, in milliseconds. Our reference choice: the
/// spec's example asks for 120,000 ("Message vocabulary") and names no maximum; ours is
/// the longest `runtime.wait` ("Scope, waiting and receipts": "Wait seconds are null or
/// finite >0 and <=600"), [`WAIT_SECONDS_MAX`] in milliseconds.
pub const RUN_TIMEOUT_MS_MAX: u64 = WAIT_SECONDS_MAX as u64 * 1000;

/// Largest `max_output_bytes` of `workspace.run` (stdout and stderr together). Our
/// reference choice: the spec's example asks for 750,000 ("Message vocabulary") and
/// names no maximum; ours stays below the 1,048,576-byte frame ("Transport and bounds")
/// that has to carry the reply.
pub const RUN_OUTPUT_BYTES_MAX: u64 = 1_000_000;

/// Bytes a `host_reply` frame needs besides the reply's value: the envelope, the
/// message's kind and identities (each at most 128 bytes, "Identifiers are 1..128"), the
/// reply's kind. Our reference margin: a run's value is cut to the frame bound
/// ([`super::wire::limits::FRAME_MAX_BYTES`]) less this, so that its reply always fits
/// one frame ("Length must be 1..1,048,576").
pub const REPLY_ENVELOPE_MARGIN_BYTES: usize = 4_096;

/// Longest piece of a request (a cwd, a program name) a refusal's message repeats, in
/// bytes; a longer one is cut and marked `…`. Our reference choice, so that a refusal of
/// a large request still fits one frame.
pub const MESSAGE_ECHO_MAX_BYTES: usize = 256;

/// Why a source-work request is refused. Every variant has a stable
/// [`code`](Self::code), answered as the `host_reply` error's `code`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceError {
    /// `argv` is empty, or its program is the empty string.
    #[error("argv must name a program")]
    ArgvEmpty,
    /// An argument, environment name or value the operating system cannot take (a NUL
    /// byte, `=` in a name, an empty name or cwd).
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The request field (`argv[2]`, `env.NAME`, `cwd`).
        field: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `timeout_ms` is 0 or over [`RUN_TIMEOUT_MS_MAX`].
    #[error("timeout_ms must be 1..={RUN_TIMEOUT_MS_MAX}, got {0}")]
    TimeoutOutOfRange(u64),
    /// `max_output_bytes` is 0 or over [`RUN_OUTPUT_BYTES_MAX`].
    #[error("max_output_bytes must be 1..={RUN_OUTPUT_BYTES_MAX}, got {0}")]
    OutputBoundOutOfRange(u64),
    /// `cwd` leaves the workspace (`..` past its root, or a symlink out of it).
    #[error("cwd {0} is outside the workspace")]
    CwdOutside(String),
    /// `cwd` does not exist in the workspace, or is not a directory.
    #[error("cwd {cwd} is not a directory of the workspace: {reason}")]
    CwdNotFound {
        /// The cwd, as asked (cut to [`MESSAGE_ECHO_MAX_BYTES`]).
        cwd: String,
        /// Why.
        reason: String,
    },
    /// The program could not be started (not found, not executable).
    #[error("cannot start {program}: {reason}")]
    Spawn {
        /// The program, as asked (cut to [`MESSAGE_ECHO_MAX_BYTES`]).
        program: String,
        /// The operating system's reason.
        reason: String,
    },
    /// Waiting for the program failed after it started (it was killed and reaped).
    #[error("the run failed: {0}")]
    Run(String),
    /// `evidence.resolve` named more than [`EVIDENCE_REFS_MAX`] references.
    #[error("at most {EVIDENCE_REFS_MAX} refs per request, got {0}")]
    TooManyRefs(usize),
    /// The operator lane could not be read.
    #[error("the operator lane cannot be read: {0}")]
    Lane(String),
    /// The workspace directory cannot be made or used.
    #[error("the workspace is unavailable: {0}")]
    Unavailable(String),
}

impl WorkspaceError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            WorkspaceError::ArgvEmpty => "argv_empty",
            WorkspaceError::InvalidArgument { .. } => "invalid_argument",
            WorkspaceError::TimeoutOutOfRange(_) => "timeout_out_of_range",
            WorkspaceError::OutputBoundOutOfRange(_) => "output_bound_out_of_range",
            WorkspaceError::CwdOutside(_) => "cwd_outside_workspace",
            WorkspaceError::CwdNotFound { .. } => "cwd_not_found",
            WorkspaceError::Spawn { .. } => "spawn_failed",
            WorkspaceError::Run(_) => "run_failed",
            WorkspaceError::TooManyRefs(_) => "too_many_refs",
            WorkspaceError::Lane(_) => "lane_failed",
            WorkspaceError::Unavailable(_) => "workspace_unavailable",
        }
    }
}

/// `text` quoted for a message, cut to [`MESSAGE_ECHO_MAX_BYTES`] (at a character
/// boundary, marked `…`).
pub(crate) fn echo(text: &str) -> String {
    if text.len() <= MESSAGE_ECHO_MAX_BYTES {
        return format!("{text:?}");
    }
    let mut end = MESSAGE_ECHO_MAX_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}…", &text[..end])
}

/// The host's workspace: its root, the runs alive in it, and the lane evidence is read
/// from.
#[derive(Debug)]
pub struct Workspace {
    root: PathBuf,
    lane: Arc<OperatorLane>,
    runs: run::Runs,
    different: bool,
}

impl Workspace {
    /// The workspace at `dir` (created 0700 when missing, then canonicalized), reading
    /// evidence from `lane`. `different`: every code is reported under another name
    /// (`host-cwd-outside-workspace`), for the vendor-mode trial of the suite.
    ///
    /// # Errors
    /// [`WorkspaceError::Unavailable`]: the directory cannot be made or is not one.
    pub fn open(
        dir: &Path,
        lane: Arc<OperatorLane>,
        different: bool,
    ) -> Result<Self, WorkspaceError> {
        let unavailable =
            |e: std::io::Error| WorkspaceError::Unavailable(format!("{}: {e}", dir.display()));
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(unavailable)?;
        }
        let root = dir.canonicalize().map_err(unavailable)?;
        if !root.is_dir() {
            return Err(WorkspaceError::Unavailable(format!(
                "{} is not a directory",
                root.display()
            )));
        }
        Ok(Self {
            root,
            lane,
            runs: run::Runs::default(),
            different,
        })
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A code as this host reports it: ours, or (`different`) another name for it.
    fn code(&self, ours: &str) -> String {
        if self.different {
            format!("host-{}", ours.replace('_', "-"))
        } else {
            ours.to_string()
        }
    }

    fn refuse(&self, e: &WorkspaceError) -> Reply {
        Reply::Error {
            code: self.code(e.code()),
            message: e.to_string(),
        }
    }

    /// `workspace.info`: `{root, run: {timeout_ms_max, max_output_bytes_max,
    /// env_inherited, default_path}, evidence: {ref_forms, refs_max, text_max_bytes}}`.
    /// `root` is the canonical absolute path every `cwd` is resolved against;
    /// `env_inherited` the names a run takes from the host's environment when the host
    /// has them (never their values).
    /// The different profile answers in another shape the spec leaves as free:
    /// `{workspace_root, limits: {run_timeout_ms, run_output_bytes, evidence_refs}}`.
    pub fn info(&self) -> Reply {
        if self.different {
            return Reply::Ok {
                value: json!({
                    "workspace_root": self.root.to_string_lossy(),
                    "limits": {
                        "run_timeout_ms": RUN_TIMEOUT_MS_MAX,
                        "run_output_bytes": RUN_OUTPUT_BYTES_MAX,
                        "evidence_refs": EVIDENCE_REFS_MAX,
                    },
                }),
            };
        }
        Reply::Ok {
            value: json!({
                "root": self.root.to_string_lossy(),
                "run": {
                    "timeout_ms_max": RUN_TIMEOUT_MS_MAX,
                    "max_output_bytes_max": RUN_OUTPUT_BYTES_MAX,
                    "env_inherited": INHERITED_ENV,
                    "default_path": DEFAULT_PATH,
                },
                "evidence": {
                    "ref_forms": [format!("{EVENT_REF_PREFIX}<n>")],
                    "refs_max": EVIDENCE_REFS_MAX,
                    "text_max_bytes": EVIDENCE_TEXT_MAX_BYTES,
                },
            }),
        }
    }

    /// `workspace.run`: checks the request, runs the program and answers how it ended,
    /// `ok` also for a non-zero exit, a signal or a timeout: `{exit_code, signal,
    /// timed_out, elapsed_ms, stdout, stderr, stdout_bytes, stderr_bytes,
    /// stdout_truncated_bytes, stderr_truncated_bytes, truncated}` (the different
    /// profile: `{end, took_ms, output: {stdout: {text, written, dropped}, stderr}}`); or
    /// the refusal. The future owns the run: dropped before it ends, it kills the
    /// program's group.
    pub async fn run(
        &self,
        argv: &[String],
        cwd: &str,
        env: &BTreeMap<String, String>,
        timeout_ms: u64,
        max_output_bytes: u64,
    ) -> Reply {
        let spec = match request::check(
            &self.root,
            request::Asked {
                argv,
                cwd,
                env,
                timeout_ms,
                max_output_bytes,
            },
            std::env::vars_os(),
        ) {
            Ok(spec) => spec,
            Err(e) => return self.refuse(&e),
        };
        match run::run(spec, &self.runs).await {
            Ok(outcome) => Reply::Ok {
                value: outcome.into_value(self.different),
            },
            Err(e) => self.refuse(&e),
        }
    }

    /// `evidence.resolve`: `{results: [...]}`, one result per ref in the request's order:
    /// `{kind: "ok", value: {event_id, effect_id, text, truncated_bytes}}` or `{kind:
    /// "error", code, message}` (`malformed_ref`, `unknown_ref`). Only a request over
    /// [`EVIDENCE_REFS_MAX`] refs, or a lane that cannot be read, fails as a whole.
    pub fn resolve(&self, refs: &[String]) -> Reply {
        match evidence::resolve(&self.lane, refs, |code| self.code(code)) {
            Ok(value) => Reply::Ok { value },
            Err(e) => self.refuse(&e),
        }
    }

    /// Kills every run alive now (its whole process group) and every run started from
    /// now on, at once: the host is stopping. Each run then ends (signal 9) and is reaped
    /// by its own task.
    pub fn stop_runs(&self) {
        self.runs.stop();
    }
}

/// The reply value of `value` for tests: `Ok` value or `(code, message)`.
#[cfg(test)]
fn split(reply: Reply) -> Result<serde_json::Value, (String, String)> {
    match reply {
        Reply::Ok { value } => Ok(value),
        Reply::Error { code, message } => Err((code, message)),
    }
}

#[cfg(test)]
mod tests;
