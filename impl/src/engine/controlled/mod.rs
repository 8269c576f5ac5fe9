//! `contract-impl engine controlled` (`docs/engine-client-control.md`): our engine
//! client driven over a control channel, so that the conformance harness, playing the
//! daemon, can cause every call it makes ("start this run", "follow it", "answer that
//! prompt") and check each one.
//!
//! * It reads `CONTRACT_ENGINE_SOCKET`, `CONTRACT_ENGINE_TOKEN_FILE`,
//!   `CONTRACT_ENGINE_CONTROL_SOCKET` and `CONTRACT_ENGINE_STATE_DIR` ([`Config`]),
//!   connects to the control socket, sends [`HELLO_LINE`] and serves the ops of the doc
//!   through the shared [`crate::control`] (framing, `as`, `await`, bounds, SIGTERM).
//! * Every call is the consequence of an op: it connects to the daemon lazily, on the
//!   first `initialize`, and keeps that channel (which reconnects on its own when the
//!   daemon dropped it).
//! * A won `initialize` is recorded in `<state dir>/`[`STATE_FILE`] (0600, durably)
//!   before its outcome is reported; the next `initialize`, in this process or after a
//!   crash, is a reconnect with that ID and epoch.
//! * Outcomes are messages in the proto3 JSON mapping; a call ending with a status other
//!   than `OK` is `{"error": {"code": "<CANONICAL_NAME>", "message"}}`; a refusal before
//!   any call is `{"error": {"code": "<client code>", "message"}}`.
//!
//! This module owns the mapping of the control ops (the private `ops` module) onto
//! [`super::session`] and [`super::cli::state`]. It never speaks gRPC itself, never
//! retries on its own (the session does), and never lets the endpoint token reach a
//! control line, stdout or stderr: every outcome is scrubbed of it.

mod ops;

pub use ops::Choices;

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use tonic::{Code, Status};

/// The first line the client sends on the control channel (its readiness).
pub const HELLO_LINE: &str = r#"{"hello":{"adapter":"engine-client","protocol":1}}"#;

/// The variable naming the daemon's Unix socket.
pub const SOCKET_ENV: &str = "CONTRACT_ENGINE_SOCKET";

/// The variable naming the endpoint token file.
pub const TOKEN_FILE_ENV: &str = "CONTRACT_ENGINE_TOKEN_FILE";

/// The variable naming the control socket.
pub const CONTROL_ENV: &str = "CONTRACT_ENGINE_CONTROL_SOCKET";

/// The variable naming the directory kept between launches.
pub const STATE_DIR_ENV: &str = "CONTRACT_ENGINE_STATE_DIR";

/// The client-state file in the state directory.
pub const STATE_FILE: &str = "client-state.json";

/// Where the client finds the daemon and keeps its identity.
#[derive(Debug, Clone)]
pub struct Config {
    /// The daemon's Unix socket.
    pub socket: PathBuf,
    /// The endpoint token file.
    pub token_file: PathBuf,
    /// The directory for the client state (made 0700 when missing).
    pub state_dir: PathBuf,
}

impl Config {
    /// The configuration and the control socket, from the environment.
    ///
    /// # Errors
    /// A variable is not set.
    pub fn from_env() -> Result<(Self, PathBuf), String> {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .ok_or_else(|| format!("{name} is not set"))
        };
        Ok((
            Self {
                socket: var(SOCKET_ENV)?,
                token_file: var(TOKEN_FILE_ENV)?,
                state_dir: var(STATE_DIR_ENV)?,
            },
            var(CONTROL_ENV)?,
        ))
    }

    /// The client-state file.
    pub fn state_file(&self) -> PathBuf {
        self.state_dir.join(STATE_FILE)
    }
}

/// Runs the controlled client until the control channel ends or SIGTERM. Returns the
/// process exit code: 0, or 2 when it cannot start (a variable missing, the control
/// socket unreachable).
///
/// `different`: the client makes the choices the spec leaves free otherwise
/// ([`Choices::DIFFERENT`]), for the vendor-mode trial of the suite.
pub async fn run(different: bool) -> u8 {
    let choices = if different {
        Choices::DIFFERENT
    } else {
        Choices::REFERENCE
    };
    let served = match Config::from_env() {
        Ok((config, control)) => {
            let client = Arc::new(ops::EngineClient::new(config, choices));
            crate::control::serve(&control, HELLO_LINE, client).await
        }
        Err(e) => Err(e),
    };
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("contract-impl engine controlled: {e}");
            2
        }
    }
}

/// The canonical name of a gRPC status code (`NOT_FOUND`, `DATA_LOSS`, …).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The outcome `{"error": {"code", "message"}}`.
pub fn error_outcome(code: &str, message: impl Into<String>) -> Value {
    json!({"error": {"code": code, "message": message.into()}})
}

/// The outcome of a call that ended with `status`: its canonical code name and message.
pub fn status_outcome(status: &Status) -> Value {
    error_outcome(code_name(status.code()), status.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_become_outcomes_by_canonical_name() {
        assert_eq!(
            status_outcome(&Status::not_found("no run r-1")),
            json!({"error": {"code": "NOT_FOUND", "message": "no run r-1"}})
        );
        for (code, name) in [
            (Code::DataLoss, "DATA_LOSS"),
            (Code::Unavailable, "UNAVAILABLE"),
            (Code::FailedPrecondition, "FAILED_PRECONDITION"),
            (Code::ResourceExhausted, "RESOURCE_EXHAUSTED"),
            (Code::Unauthenticated, "UNAUTHENTICATED"),
        ] {
            assert_eq!(code_name(code), name);
        }
    }
}
