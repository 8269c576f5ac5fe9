//! The plugin SDK: what a Rust tool plugin links to speak `plugin.v1` to its host
//! (`plugin-protocol.md`, "Identity and launch", "Initial tool API").
//!
//! A plugin implements [`Plugin`] (its manifest, its tools and how a call runs) and calls
//! [`serve`]. The SDK owns the whole launch contract (`docs/plugin-launch-contract.md`):
//!
//! 1. it reads the socket path and the launch secret from the environment the host set,
//!    and refuses to start without them;
//! 2. it binds the socket (0600) and only then writes the handshake line
//!    ([`HANDSHAKE_LINE`]) on stdout, which it then points at stderr, so a stray print can
//!    never contaminate the protocol channel;
//! 3. it checks the host's proof on every call before decoding it, answers one
//!    `Initialize` with the proof of the secret, and refuses a second one;
//! 4. it validates every `Execute` (identifiers, tool, payload bound, arguments against
//!    the tool's schema) and streams bounded progress followed by exactly one result or
//!    typed failure;
//! 5. it treats the end of stdin as the host's death and exits at once (it never spins
//!    without a host), and exits after a `Drain` once the calls in flight end or the
//!    drain's timeout passes.
//!
//! The SDK never runs a tool before validation, never sends a message after a call's
//! terminal one and never writes the secret anywhere.

mod schema;
mod service;

use std::path::PathBuf;

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::{mpsc, watch};

pub use schema::check_arguments;
pub use service::serve_on;

use super::proto::v1::{FailureCode, Manifest, ToolDefinition};
use super::wire::{
    HANDSHAKE_LINE, MAX_PROGRESS_TEXT_BYTES, PROTOCOL, PROTOCOL_ENV, SECRET_ENV, SOCKET_ENV, clip,
    is_secret_shaped,
};
use crate::grpc::common::v1::BuildIdentity;

/// Exit status when the launch environment is missing or wrong.
pub const EXIT_LAUNCH: i32 = 2;

/// Exit status after the host went away (stdin ended) or a drain completed.
pub const EXIT_OK: i32 = 0;

/// A tool plugin: its identity, its tools and how one call runs.
#[async_trait]
pub trait Plugin: Send + Sync + 'static {
    /// The manifest (its `name` must equal the name the host configured).
    fn manifest(&self) -> Manifest;
    /// The plugin's build identity.
    fn build(&self) -> BuildIdentity;
    /// The tools, in a stable order; the same on every call ("immutable").
    fn tools(&self) -> Vec<ToolDefinition>;
    /// The capabilities the tools use (every tool's `capabilities`, once each).
    fn capabilities(&self) -> Vec<String> {
        let mut all: Vec<String> = Vec::new();
        for tool in self.tools() {
            for c in tool.capabilities {
                if !all.contains(&c) {
                    all.push(c);
                }
            }
        }
        all
    }
    /// Runs one validated call: `Ok` with the output (JSON), or a typed failure.
    async fn execute(&self, call: Call) -> Result<Value, ToolError>;
    /// Writes a tool's output as the `output_json` text the host receives (and the
    /// payload bound measures). Default: compact JSON, no whitespace.
    fn spell(&self, _tool: &str, output: &Value) -> String {
        output.to_string()
    }
    /// How this plugin encodes its refusals (default: ours).
    fn conventions(&self) -> Conventions {
        Conventions::REFERENCE
    }
}

/// How a plugin encodes the refusals whose encoding the spec leaves free (the gRPC code
/// of each refusal, the failure of a malformed call ID, the exit status of a launch
/// without its environment). Our choices are [`Conventions::REFERENCE`] (the launch
/// contract's); [`Conventions::DIFFERENT`] are another correct plugin's, for the
/// vendor-mode trial of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conventions {
    /// A call before `Initialize` succeeded.
    pub not_initialized: tonic::Code,
    /// A second `Initialize`.
    pub already_initialized: tonic::Code,
    /// Another major version.
    pub incompatible_protocol: tonic::Code,
    /// A `Drain` timeout outside 1 to 600000 ms.
    pub invalid_drain_timeout: tonic::Code,
    /// A call without the host's proof, or with another one.
    pub unauthenticated: tonic::Code,
    /// The failure of a call whose ID or progress token breaks the grammar.
    pub invalid_call: FailureCode,
    /// The exit status of a launch without (or with a malformed) launch environment.
    pub exit_launch: i32,
}

impl Conventions {
    /// Ours (docs/plugin-launch-contract.md).
    pub const REFERENCE: Self = Self {
        not_initialized: tonic::Code::FailedPrecondition,
        already_initialized: tonic::Code::FailedPrecondition,
        incompatible_protocol: tonic::Code::FailedPrecondition,
        invalid_drain_timeout: tonic::Code::InvalidArgument,
        unauthenticated: tonic::Code::Unauthenticated,
        invalid_call: FailureCode::InvalidCall,
        exit_launch: EXIT_LAUNCH,
    };
    /// Another correct plugin's.
    pub const DIFFERENT: Self = Self {
        not_initialized: tonic::Code::PermissionDenied,
        already_initialized: tonic::Code::AlreadyExists,
        incompatible_protocol: tonic::Code::Unimplemented,
        invalid_drain_timeout: tonic::Code::OutOfRange,
        unauthenticated: tonic::Code::PermissionDenied,
        invalid_call: FailureCode::InvalidArguments,
        exit_launch: 64,
    };
}

/// A typed failure of one call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ToolError {
    /// The failure code.
    pub code: FailureCode,
    /// Why, for people (clipped to the wire's bound).
    pub message: String,
}

impl ToolError {
    /// A failure with `code`.
    pub fn new(code: FailureCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
    /// The tool ran and failed.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(FailureCode::ToolFailed, message)
    }
    /// The call was cancelled.
    pub fn cancelled() -> Self {
        Self::new(FailureCode::Cancelled, "the call was cancelled")
    }
}

/// Why a progress report was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProgressError {
    /// The call already sent `max_progress_messages` reports.
    #[error("the call's progress bound is reached")]
    BoundReached,
    /// The host stopped reading the call (cancelled it or went away).
    #[error("the host no longer reads this call")]
    Gone,
}

/// One validated call, as the tool sees it.
pub struct Call {
    /// The tool called.
    pub tool: String,
    /// The call's ID (`ExecuteRequest.call_id`).
    pub call_id: String,
    /// The arguments, a JSON object valid against the tool's schema.
    pub arguments: Value,
    progress: mpsc::Sender<(u64, String)>,
    sent: u64,
    max_progress: u64,
    cancel: watch::Receiver<bool>,
}

impl Call {
    /// Reports progress (text clipped to [`MAX_PROGRESS_TEXT_BYTES`]). Waits while the
    /// host reads slowly (backpressure, nothing dropped).
    ///
    /// # Errors
    /// [`ProgressError::BoundReached`] past the call's bound; [`ProgressError::Gone`].
    pub async fn progress(&mut self, message: &str) -> Result<(), ProgressError> {
        if self.sent >= self.max_progress {
            return Err(ProgressError::BoundReached);
        }
        self.sent += 1;
        let text = clip(message, MAX_PROGRESS_TEXT_BYTES).to_string();
        self.progress
            .send((self.sent, text))
            .await
            .map_err(|_| ProgressError::Gone)
    }

    /// The call's progress bound: the negotiated `max_progress_messages`.
    pub fn max_progress(&self) -> u64 {
        self.max_progress
    }

    /// Whether the host cancelled the call.
    pub fn is_cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    /// Completes when the host cancels the call (never, otherwise).
    pub async fn cancelled(&mut self) {
        if self.cancel.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A command for a process the plugin starts, without the launch secret in its
/// environment (Rust forbids a safe process from editing its own environment once
/// threads run, so the SDK cannot scrub it; it keeps it out of every child instead).
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
    let mut command = std::process::Command::new(program);
    command.env_remove(SECRET_ENV);
    command
}

/// What the SDK read from the launch environment (its `Debug` never shows the secret).
#[derive(Clone)]
pub struct Launch {
    /// The socket to serve on.
    pub socket: PathBuf,
    /// The launch secret (never logged).
    pub secret: String,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("socket", &self.socket)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl Launch {
    /// Reads [`SOCKET_ENV`], [`SECRET_ENV`] and [`PROTOCOL_ENV`].
    ///
    /// # Errors
    /// What is missing or malformed (never the secret's value).
    pub fn from_env() -> Result<Self, String> {
        let protocol = std::env::var(PROTOCOL_ENV).unwrap_or_default();
        if protocol != PROTOCOL {
            return Err(format!(
                "{PROTOCOL_ENV} is {protocol:?}; this plugin speaks {PROTOCOL}"
            ));
        }
        let socket = std::env::var_os(SOCKET_ENV)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .ok_or_else(|| format!("{SOCKET_ENV} must name an absolute socket path"))?;
        let secret = std::env::var(SECRET_ENV).unwrap_or_default();
        if !is_secret_shaped(&secret) {
            return Err(format!(
                "{SECRET_ENV} must hold 64 lowercase hexadecimal characters"
            ));
        }
        Ok(Self { socket, secret })
    }
}

/// Serves `plugin` under the launch contract until the host goes away or a drain ends;
/// returns the process's exit status ([`EXIT_OK`], or the plugin's
/// [`Conventions::exit_launch`] ([`EXIT_LAUNCH`] by default) with the reason
/// on stderr).
pub async fn serve(plugin: impl Plugin) -> i32 {
    let exit_launch = plugin.conventions().exit_launch;
    let launch = match Launch::from_env() {
        Ok(launch) => launch,
        Err(message) => {
            eprintln!("plugin: {message}");
            return exit_launch;
        }
    };
    match serve_on(plugin, launch).await {
        Ok(()) => EXIT_OK,
        Err(message) => {
            eprintln!("plugin: {message}");
            exit_launch
        }
    }
}

/// Writes the handshake line and points stdout at stderr from then on.
fn announce() -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{HANDSHAKE_LINE}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the handshake line: {e}"))?;
    drop(out);
    nix::unistd::dup2_stdout(std::io::stderr())
        .map_err(|e| format!("pointing stdout at stderr: {e}"))
}
