//! The `command` Harness adapter: a real (non-test) [`HarnessAdapter`] that runs one
//! configured local program per Turn ("Scope": a Harness plugs in through the Harness
//! adapter contract; "Message families": "a text-only transport rejects image content
//! rather than dropping it").
//!
//! # What a Run is
//! * **Start** spawns `program args…` in its **own process group** (so the whole tree can
//!   be signalled), with `cwd` = [`CommandConfig::cwd`] (by default the Runtime's
//!   workspace directory), or a fresh private empty directory when the Executor was
//!   prepared with `disable_execution_environment` (Environment type `none`: no
//!   workspace is bound). The environment is **cleared** except `PATH`, `HOME` and
//!   `LANG` (copied from the Runtime's own environment when set) plus
//!   [`RUN_ID_ENV`] and [`SESSION_ID_ENV`]. The daemon credential therefore never
//!   reaches the program.
//! * **Input**: the Turn's text, written to stdin: the text parts of each message
//!   concatenated in order, messages separated by one `\n`, followed by `\n` unless the
//!   text already ends with one (see [`input_text`]). Any image part is refused with
//!   [`AdapterError::Refused`] before anything is spawned. With [`StdinMode::Close`]
//!   (the default) stdin is closed after the input, so programs that read to EOF work;
//!   with [`StdinMode::Open`] it stays open for active input (`write_input`).
//! * **Output**: every stdout line becomes one [`NativeEvent::Delta`] whose text is the
//!   line including its `\n` (`item_id` absent). A line longer than
//!   [`STDOUT_LINE_MAX_BYTES`] is split into pieces of at most that many bytes (cut on
//!   a UTF-8 character boundary when the bytes are valid UTF-8); only the last piece
//!   carries the `\n`, and an unterminated last line is forwarded without one, so the
//!   deltas concatenate to exactly the program's output. Bytes that are not valid UTF-8
//!   are converted lossily (each invalid sequence becomes U+FFFD); program output can
//!   never make the adapter panic or fail.
//! * **Stderr** is not forwarded; its last [`STDERR_TAIL_LINES`] lines (at most
//!   [`STDERR_TAIL_BYTES`] bytes, each line cut at [`STDERR_LINE_MAX_BYTES`]) are kept
//!   as a tail for the error message and the Runtime's log.
//! * **Outcome**: exit status 0 → [`NativeEvent::Settled`] `completed`; any other exit
//!   (non-zero status or a signal the adapter did not send) →
//!   [`NativeEvent::Error`] (message with the status and the last non-blank stderr
//!   line, cut at [`ERROR_DETAIL_MAX_BYTES`]; **no** `code` or `http_status`: the spec
//!   forbids classifying by text, "Native failure classification") followed by
//!   `Settled` `failed`. No native Session identity is reported.
//! * **After the program exits** the adapter waits up to
//!   [`CommandConfig::output_drain_grace`] for stdout and stderr to reach EOF, then
//!   terminates whatever is left of the Run's process group (background children),
//!   and only then settles: a settled Run leaves no process behind.
//! * **Cancel** ([`HarnessAdapter::cancel`]) sends SIGTERM to the group, waits up to
//!   [`CommandConfig::kill_grace`], then SIGKILLs the group, and is confirmed only once
//!   the program was reaped **and** the group has no member left (checked with
//!   `kill(-pgid, 0)` → `ESRCH`, so zombies count as members). It then answers
//!   [`CancelSettlement::StreamSettles`] and the stream ends with `Settled`
//!   `cancelled`. A cancel that arrives after the program exited on its own is
//!   [`AdapterError::Refused`] (nothing was cancelled; the stream settles with the exit
//!   outcome). When the group cannot be confirmed empty within
//!   [`KILL_CONFIRM_TIMEOUT`] after SIGKILL the cancel is [`AdapterError::Unknown`],
//!   the stream ends with `error` + `failed`, and the group is kept as a leftover of
//!   the Executor (still counting against [`CommandConfig::max_processes`]) until
//!   [`HarnessAdapter::close_executor`] confirms it gone.
//! * **Active input** ([`HarnessAdapter::write_input`], [`StdinMode::Open`] only):
//!   the input's text is written to stdin as one line and flushed; `Ok` proves the
//!   write, nothing more. A plain program cannot confirm consumption, so
//!   [`NativeEvent::InputAccepted`] is **never** emitted and `durable_input_receipts`
//!   is declared false. With [`StdinMode::Close`] `steering` is declared false and
//!   `write_input` answers [`AdapterError::Unsupported`].
//! * Permission decisions, user-choice decisions and function results:
//!   [`AdapterError::Unsupported`] (the program can raise none of them, and
//!   `permissions` / `function_tools` are declared false).
//!
//! # Process reaping
//! Members of a Run's group whose parent died are re-parented to the nearest "child
//! subreaper" or to PID 1; a PID 1 that does not reap (as in some containers) would
//! leave them as zombies forever and the group would never be confirmed empty. So
//! [`CommandAdapter::new`] marks the Runtime process as a child subreaper (Linux,
//! `PR_SET_CHILD_SUBREAPER`) and the adapter reaps the exited members of a Run's group
//! itself (`waitpid(-pgid, WNOHANG)`, only after the program itself was reaped).
//!
//! # Limits (what the adapter cannot do)
//! * A process that leaves the Run's process group (`setsid`, `setpgid`) escapes the
//!   group signals; the adapter stops waiting for output it holds after
//!   [`CommandConfig::output_drain_grace`] but cannot terminate it.
//! * If the Runtime itself is SIGKILLed, running programs are not killed (they see
//!   EOF / `EPIPE` on their pipes). A graceful Runtime shutdown closes every Executor,
//!   which terminates their groups.
//! * The program is not sandboxed: "the daemon is not an isolation boundary".
//! * The Agent's `model`, `system_prompt` and `harness_config` options and the
//!   resolved text verbosity are not passed to the program (it receives only its
//!   configured arguments and the input text).
//!
//! # Program protocol
//! [`ProgramProtocol::Plain`] (the default, CLI `--command-protocol plain`) is what the
//! sections above describe. [`ProgramProtocol::Jsonl`] (`--command-protocol jsonl`,
//! requires [`StdinMode::Open`]) changes only input, output and the outcome's error;
//! process handling, cancel and limits are the same:
//! * **stdin**: one JSON record per line ([`jsonl_input_line`]). First the Turn's
//!   input, `{"type":"input","input_id":"initial","content":[…]}` ([`INITIAL_INPUT_ID`];
//!   `content` = the content parts of every message, in order, as the wire encodes
//!   them), then one record per active input with that input's ID. Stdin stays open
//!   until the program exits: the program decides when the Turn is over.
//! * **stdout**: one JSON record per line ([`ProgramRecord`], decoded strictly by
//!   [`decode_record`]): `delta` → [`NativeEvent::Delta`]; `accepted` →
//!   [`NativeEvent::InputAccepted`] (at most once per input, only for an input written
//!   to this Run; accepting `initial` is allowed and produces nothing); `tool_call` →
//!   [`NativeEvent::ToolCall`]; `usage` (cumulative) → [`NativeEvent::Usage`]; `error`
//!   (`message`, raw `code` / `http_status`) → [`NativeEvent::Error`], classified by
//!   the Runtime. Blank lines are skipped. A record is at most
//!   [`JSONL_RECORD_MAX_BYTES`] bytes with its `\n`.
//! * **Protocol violation**: the first record that is too long, not UTF-8, not a known
//!   record shape (unknown type or field, missing field, wrong value) or an `accepted`
//!   for an unknown or already accepted input ([`RecordError`]) stops the program
//!   (SIGTERM, grace, SIGKILL of its group), nothing after it is forwarded, and the Run
//!   ends with [`NativeEvent::Error`] `program protocol violation: stdout record N:
//!   <reason> (<code>)` and `Settled` `failed` — even if the program then exits 0. A
//!   cancel that arrives after such a stop is [`AdapterError::Refused`].
//! * **Outcome**: exit 0 → `completed`; a non-zero exit after the program sent an
//!   `error` record → `failed` with no further error (the program's own error, with
//!   its metadata, is the failure); otherwise as in plain mode.
//! * Stderr is handled as in plain mode. Images are refused as in plain mode.
//!
//! # Declaration
//! One agent kind, [`AGENT_KIND`], available; capabilities: see
//! [`CommandAdapter::capabilities`], which documents each `true`. Of the seven
//! capabilities the spec requires "always, for every execution", plain mode honestly
//! declares `streaming`, `preparation` and `execution_controls` (plus `steering` with
//! [`StdinMode::Open`]) but **not** `durable_turns`, `durable_input_receipts` or
//! `tool_observations`, so Core admits no Turn on it. `jsonl` mode declares all seven
//! (and `usage`): its `accepted` record is the receipt semantics, `tool_call` records
//! the observations, and every Turn settles with one confirmed outcome after a
//! complete, strictly decoded stream. Neither mode declares
//! `native_session_recovery`, so Core admits only the first Turn of a Session (a later
//! one needs it by the capability table).

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{
    AdapterError, CancelSettlement, HarnessAdapter, NativeEvent, NativePrepare, NativeStart,
    RunEventSink,
};
use crate::core_runtime::wire::{
    AgentKind, AgentKindCapabilities, AgentKindDeclaration, CallId, ContentPart, ExecutorId,
    InputId, InteractionId, MessageInput, Outcome, OutputFormat, PermissionVerdict,
    PromptForUserChoiceDecision, RunId, ToolCall, Usage, Uuid,
};

/// The one agent kind this adapter declares.
pub const AGENT_KIND: &str = "command";

/// Longest stdout piece forwarded as one `delta`, in bytes of program output
/// (including the `\n`). Longer lines are split. At least 4, so a UTF-8 character
/// always fits.
pub const STDOUT_LINE_MAX_BYTES: usize = 64 * 1024;

/// Lines of stderr kept in the tail.
pub const STDERR_TAIL_LINES: usize = 64;

/// Bytes (of lossily converted text) of stderr kept in the tail.
pub const STDERR_TAIL_BYTES: usize = 16 * 1024;

/// Longest stderr line kept, in bytes of program output; longer lines are split and
/// each piece counts as one line of the tail.
pub const STDERR_LINE_MAX_BYTES: usize = 4 * 1024;

/// Longest stderr excerpt quoted in an `error` message, in bytes.
pub const ERROR_DETAIL_MAX_BYTES: usize = 2 * 1024;

/// Default time between SIGTERM and SIGKILL of a Run's process group.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);

/// Default time the adapter waits for stdout/stderr EOF after the program exited,
/// before terminating the rest of its process group (and again before it gives up on
/// output held open by escaped processes).
pub const DEFAULT_OUTPUT_DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Bound on confirming, after SIGKILL, that the program was reaped and its group is
/// empty. With the defaults a cancel is confirmed or failed within
/// `DEFAULT_KILL_GRACE + 2 × KILL_CONFIRM_TIMEOUT` = 8 s, inside the spec's 15 s cancel
/// budget ("Active-input receipts").
pub const KILL_CONFIRM_TIMEOUT: Duration = Duration::from_secs(3);

/// Period of polling a process group for emptiness (there is no event for it).
pub const GROUP_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Bound on Executors prepared at once (the daemon's own bounds are far lower).
pub const EXECUTORS_MAX: usize = 4096;

/// Bound on bytes still read from stdout after the adapter gave up waiting for EOF
/// (a process outside the group that keeps writing cannot keep the Run open).
pub const DRAIN_AFTER_GIVE_UP_MAX_BYTES: usize = 1024 * 1024;

/// Size of a write to a pipe that POSIX guarantees to be atomic on Linux (`PIPE_BUF`):
/// a broken pipe on a write this small proves that no byte of it was read.
pub const PIPE_BUF_BYTES: usize = 4096;

/// Longest stdout record of the `jsonl` program protocol, in bytes including its `\n`.
/// A longer record is a protocol violation (the Run fails; see "Program protocol").
pub const JSONL_RECORD_MAX_BYTES: usize = 1024 * 1024;

/// `input_id` of the `jsonl` stdin record that carries the Turn's own input.
pub const INITIAL_INPUT_ID: &str = "initial";

/// Bound on active inputs written to one Run (Core sends at most 256 per Turn). A
/// further `write_input` is refused.
pub const RUN_ACTIVE_INPUTS_MAX: usize = 1024;

/// Variables copied from the Runtime's environment into the program's, when set.
pub const PASSED_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

/// Variable carrying the Run ID to the program.
pub const RUN_ID_ENV: &str = "CONTRACT_RUN_ID";

/// Variable carrying the Session ID (from `execution_prepare`) to the program.
pub const SESSION_ID_ENV: &str = "CONTRACT_SESSION_ID";

const _: () = assert!(STDOUT_LINE_MAX_BYTES >= 4 && STDERR_LINE_MAX_BYTES >= 4);
const _: () = assert!(STDERR_LINE_MAX_BYTES * 3 <= STDERR_TAIL_BYTES);

/// What happens to the program's stdin after the Turn's input was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StdinMode {
    /// Close it: the program sees EOF after the input (works with programs that read
    /// to EOF, such as `cat`, `tr`, `wc`). No active input; `steering` is declared
    /// false.
    #[default]
    Close,
    /// Keep it open for active input until the program exits or is stopped. A program
    /// that reads to EOF then runs until it is cancelled. `steering` is declared true.
    Open,
}

/// How the adapter talks to the program (see "Program protocol" in the module
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgramProtocol {
    /// Input text on stdin, every stdout line a text delta, the exit status as the
    /// outcome. Honest for any program, so it declares neither durable receipts nor
    /// tool observations.
    #[default]
    Plain,
    /// One JSON record per line in both directions: input records on stdin;
    /// `delta`, `accepted`, `tool_call`, `usage` and `error` records on stdout, decoded
    /// strictly. Requires [`StdinMode::Open`].
    Jsonl,
}

/// Configuration of the `command` adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandConfig {
    /// The program: a path, or a bare name looked up in the Runtime's `PATH`.
    /// [`CommandAdapter::new`] resolves it to an absolute path.
    pub program: PathBuf,
    /// Its arguments, in order (no shell is involved).
    pub args: Vec<OsString>,
    /// Working directory of the program (the Runtime's workspace by default; the CLI
    /// sets it). Not used for Executors prepared without an execution environment.
    pub cwd: PathBuf,
    /// Stdin handling ([`StdinMode::Open`] is required by [`ProgramProtocol::Jsonl`]).
    pub stdin: StdinMode,
    /// Program protocol.
    pub protocol: ProgramProtocol,
    /// Most programs alive at once (the daemon's `active_executions` bound). A start
    /// beyond it is refused; a Run counts until its group is confirmed gone.
    pub max_processes: usize,
    /// Time between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Time the adapter waits for output EOF after the program exited (see
    /// [`DEFAULT_OUTPUT_DRAIN_GRACE`]).
    pub output_drain_grace: Duration,
}

impl CommandConfig {
    /// A configuration with no arguments, [`StdinMode::Close`],
    /// [`ProgramProtocol::Plain`], at most `8` processes and the default grace periods.
    pub fn new(program: impl Into<PathBuf>, cwd: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            cwd: cwd.into(),
            stdin: StdinMode::Close,
            protocol: ProgramProtocol::Plain,
            max_processes: 8,
            kill_grace: DEFAULT_KILL_GRACE,
            output_drain_grace: DEFAULT_OUTPUT_DRAIN_GRACE,
        }
    }
}

/// A [`CommandConfig`] that cannot be used. [`CommandConfigError::code`] is stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandConfigError {
    /// The program does not exist (or a bare name is not in `PATH`).
    #[error("program `{program}` not found: {reason}")]
    ProgramNotFound {
        /// The program as configured.
        program: String,
        /// Why.
        reason: String,
    },
    /// The program is not a regular file with an execute permission bit.
    #[error("program `{program}` is not an executable file")]
    ProgramNotExecutable {
        /// The program as resolved.
        program: String,
    },
    /// The working directory is missing or not a directory.
    #[error("working directory `{path}` is unusable: {reason}")]
    WorkingDirectory {
        /// The directory.
        path: String,
        /// Why.
        reason: String,
    },
    /// `max_processes` is 0, or a grace period is zero.
    #[error("invalid command adapter limit: {0}")]
    InvalidLimit(String),
    /// Options that contradict each other ([`ProgramProtocol::Jsonl`] with
    /// [`StdinMode::Close`]: active input needs an open stdin).
    #[error("incompatible command adapter options: {0}")]
    IncompatibleOptions(String),
}

impl CommandConfigError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            CommandConfigError::ProgramNotFound { .. } => "program_not_found",
            CommandConfigError::ProgramNotExecutable { .. } => "program_not_executable",
            CommandConfigError::WorkingDirectory { .. } => "invalid_working_directory",
            CommandConfigError::InvalidLimit(_) => "invalid_limit",
            CommandConfigError::IncompatibleOptions(_) => "incompatible_options",
        }
    }
}

/// Resolves `program` like `execvp` would: a name without `/` is looked up in `PATH`,
/// a path is made absolute against the Runtime's current directory. Then checks that
/// it is a regular file with an execute bit.
///
/// # Errors
/// [`CommandConfigError::ProgramNotFound`], [`CommandConfigError::ProgramNotExecutable`].
pub fn resolve_program(program: &Path) -> Result<PathBuf, CommandConfigError> {
    let shown = program.display().to_string();
    let not_found = |reason: String| CommandConfigError::ProgramNotFound {
        program: shown.clone(),
        reason,
    };
    let text = program.as_os_str().as_encoded_bytes();
    let bare = !text.is_empty() && !text.contains(&b'/');
    let resolved = if bare {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| is_executable_file(candidate))
            .ok_or_else(|| not_found("not found in PATH".into()))?
    } else {
        std::path::absolute(program).map_err(|e| not_found(e.to_string()))?
    };
    check_program(&resolved).map_err(|err| match err {
        CommandConfigError::ProgramNotFound { reason, .. } => not_found(reason),
        other => other,
    })?;
    Ok(resolved)
}

/// Checks that `path` exists and is a regular file with an execute permission bit.
///
/// # Errors
/// [`CommandConfigError::ProgramNotFound`], [`CommandConfigError::ProgramNotExecutable`].
pub fn check_program(path: &Path) -> Result<(), CommandConfigError> {
    let meta = std::fs::metadata(path).map_err(|e| CommandConfigError::ProgramNotFound {
        program: path.display().to_string(),
        reason: e.to_string(),
    })?;
    if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
        Ok(())
    } else {
        Err(CommandConfigError::ProgramNotExecutable {
            program: path.display().to_string(),
        })
    }
}

fn is_executable_file(path: &Path) -> bool {
    check_program(path).is_ok()
}

/// The text a Run or an active input writes to stdin: the text parts of each message
/// concatenated in order, messages joined by `\n`, then `\n` unless the text is empty
/// or already ends with one.
///
/// # Errors
/// [`AdapterError::Refused`] when any part is an image ("a text-only transport rejects
/// image content rather than dropping it").
pub fn input_text(input: &[MessageInput]) -> Result<String, AdapterError> {
    let mut text = String::new();
    for (m, message) in input.iter().enumerate() {
        if m > 0 {
            text.push('\n');
        }
        for (p, part) in message.content.iter().enumerate() {
            match part {
                ContentPart::Text { text: t } => text.push_str(t.as_str()),
                ContentPart::Image { .. } => {
                    return Err(AdapterError::Refused(format!(
                        "message {m} part {p} is an image; the command adapter's stdin is text-only"
                    )));
                }
            }
        }
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// The `jsonl` stdin record of one input, with its `\n`:
/// `{"type":"input","input_id":"<input_id>","content":[<parts>]}` where `content` is
/// the content parts of every message of `input`, in order, as the wire encodes them
/// (`{"type":"text","text":"…"}`).
///
/// # Errors
/// [`AdapterError::Refused`] when any part is an image (the adapter's stdin is
/// text-only, as in plain mode, and `message_images` is declared false).
pub fn jsonl_input_line(input_id: &str, input: &[MessageInput]) -> Result<String, AdapterError> {
    let mut parts = Vec::new();
    for (m, message) in input.iter().enumerate() {
        for (p, part) in message.content.iter().enumerate() {
            match part {
                ContentPart::Text { .. } => parts.push(part),
                ContentPart::Image { .. } => {
                    return Err(AdapterError::Refused(format!(
                        "message {m} part {p} is an image; the command adapter's stdin is text-only"
                    )));
                }
            }
        }
    }
    let record = serde_json::json!({"type": "input", "input_id": input_id, "content": parts});
    let mut line = serde_json::to_string(&record)
        .map_err(|e| AdapterError::Refused(format!("cannot encode the input record: {e}")))?;
    line.push('\n');
    Ok(line)
}

/// One stdout record of the `jsonl` program protocol (see "Program protocol"). Decoded
/// strictly: an unknown `type`, an unknown or missing field, or a value of the wrong
/// shape is refused.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProgramRecord {
    /// `{"type":"delta","text":"…"}`: a text fragment (→ [`NativeEvent::Delta`]).
    Delta {
        /// The text.
        text: String,
    },
    /// `{"type":"accepted","input_id":"…"}`: the program consumed that input
    /// (→ [`NativeEvent::InputAccepted`]).
    Accepted {
        /// The consumed input (an active input's ID, or [`INITIAL_INPUT_ID`]).
        input_id: InputId,
    },
    /// `{"type":"tool_call","call_id","tool_name","state","observation":{"kind","summary"}}`
    /// (→ [`NativeEvent::ToolCall`]; `state` is `started`, `completed` or `failed`).
    ToolCall(ToolCall),
    /// `{"type":"usage","input_tokens"?,"cached_input_tokens"?,"output_tokens"?,
    /// "reasoning_output_tokens"?}`: a cumulative snapshot (→ [`NativeEvent::Usage`]).
    Usage(Usage),
    /// `{"type":"error","message":"…","code"?:…,"http_status"?:…}`: a native error
    /// with raw metadata (→ [`NativeEvent::Error`]; the Runtime classifies it,
    /// "Native failure classification").
    Error {
        /// The message.
        message: String,
        /// Raw native code (any JSON value).
        #[serde(default)]
        code: Option<Value>,
        /// Raw native HTTP status (any JSON value).
        #[serde(default)]
        http_status: Option<Value>,
    },
}

/// Why a `jsonl` stdout record was refused. Any of them fails the Run.
/// [`RecordError::code`] is stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Longer than [`JSONL_RECORD_MAX_BYTES`] (an unterminated last record counts
    /// with its missing `\n`).
    #[error("longer than {max} bytes")]
    TooLong {
        /// The bound.
        max: usize,
    },
    /// Not valid UTF-8.
    #[error("not valid UTF-8")]
    NotUtf8,
    /// Not a JSON object of a known record shape.
    #[error("not a valid record: {0}")]
    Invalid(String),
    /// `accepted` names an input this Run never wrote to the program.
    #[error("`accepted` names input `{0}`, which was never written to this Run")]
    UnknownInput(String),
    /// `accepted` repeats an input already accepted.
    #[error("`accepted` repeats input `{0}`")]
    DuplicateAccept(String),
}

impl RecordError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            RecordError::TooLong { .. } => "record_too_long",
            RecordError::NotUtf8 => "record_not_utf8",
            RecordError::Invalid(_) => "invalid_record",
            RecordError::UnknownInput(_) => "unknown_input",
            RecordError::DuplicateAccept(_) => "duplicate_accept",
        }
    }
}

/// Decodes one stdout piece (a line with its `\n`, or the unterminated last one) of
/// the `jsonl` protocol. A blank line (only whitespace) is `Ok(None)`.
///
/// # Errors
/// [`RecordError::TooLong`], [`RecordError::NotUtf8`], [`RecordError::Invalid`].
pub fn decode_record(piece: &[u8]) -> Result<Option<ProgramRecord>, RecordError> {
    let terminated = piece.ends_with(b"\n");
    if piece.len() + usize::from(!terminated) > JSONL_RECORD_MAX_BYTES {
        return Err(RecordError::TooLong {
            max: JSONL_RECORD_MAX_BYTES,
        });
    }
    let text = std::str::from_utf8(piece).map_err(|_| RecordError::NotUtf8)?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| RecordError::Invalid(e.to_string()))
}

/// The active inputs of one `jsonl` Run.
#[derive(Debug, Default)]
struct JsonlInputs {
    /// Inputs written (or being written) to the program.
    written: HashSet<InputId>,
    /// Inputs the program accepted.
    accepted: HashSet<InputId>,
}

/// Protocol state of one `jsonl` Run, shared by `write_input`, the stdout decoder and
/// the supervisor.
struct JsonlRun {
    inputs: Mutex<JsonlInputs>,
    /// The program sent at least one `error` record.
    reported_error: AtomicBool,
    /// The first protocol violation (the Run fails with it).
    violation: Mutex<Option<String>>,
    /// Set to `true` on the first violation, so the supervisor stops the program.
    violated: watch::Sender<bool>,
}

impl JsonlRun {
    fn new() -> Self {
        Self {
            inputs: Mutex::new(JsonlInputs::default()),
            reported_error: AtomicBool::new(false),
            violation: Mutex::new(None),
            violated: watch::Sender::new(false),
        }
    }

    fn inputs(&self) -> MutexGuard<'_, JsonlInputs> {
        self.inputs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn violation(&self) -> Option<String> {
        self.violation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn violate(&self, message: String) {
        tracing::warn!(%message, "command adapter: program protocol violation; stopping the program");
        self.violation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(message);
        self.violated.send_replace(true);
    }

    /// Resolves once a violation was recorded.
    async fn wait_violated(&self) {
        let mut rx = self.violated.subscribe();
        // The sender lives in `self`, so the wait cannot fail while `self` is borrowed.
        let _ = rx.wait_for(|v| *v).await;
    }

    /// Registers `input_id` as written before it is written.
    fn register_input(&self, input_id: &InputId) -> Result<(), AdapterError> {
        if input_id.as_str() == INITIAL_INPUT_ID {
            return Err(AdapterError::Refused(format!(
                "input ID `{INITIAL_INPUT_ID}` is reserved for the Turn's own input"
            )));
        }
        let mut inputs = self.inputs();
        if inputs.written.len() >= RUN_ACTIVE_INPUTS_MAX {
            return Err(AdapterError::Refused(format!(
                "{RUN_ACTIVE_INPUTS_MAX} active inputs were already written to this run"
            )));
        }
        if !inputs.written.insert(input_id.clone()) {
            return Err(AdapterError::Refused(format!(
                "input `{input_id}` was already written to this run"
            )));
        }
        Ok(())
    }

    /// Forgets an input whose write provably did not reach the program.
    fn unregister_input(&self, input_id: &InputId) {
        self.inputs().written.remove(input_id);
    }

    /// The native event of one stdout piece (`None` for a blank line and for the
    /// acceptance of [`INITIAL_INPUT_ID`], which the Run's start already committed).
    fn translate(&self, piece: &[u8]) -> Result<Option<NativeEvent>, RecordError> {
        let Some(record) = decode_record(piece)? else {
            return Ok(None);
        };
        Ok(Some(match record {
            ProgramRecord::Delta { text } => NativeEvent::Delta {
                text,
                item_id: None,
            },
            ProgramRecord::Accepted { input_id } => {
                if input_id.as_str() == INITIAL_INPUT_ID {
                    return Ok(None);
                }
                let mut inputs = self.inputs();
                if !inputs.written.contains(&input_id) {
                    return Err(RecordError::UnknownInput(input_id.to_string()));
                }
                if !inputs.accepted.insert(input_id.clone()) {
                    return Err(RecordError::DuplicateAccept(input_id.to_string()));
                }
                NativeEvent::InputAccepted { input_id }
            }
            ProgramRecord::ToolCall(call) => NativeEvent::ToolCall(call),
            ProgramRecord::Usage(usage) => NativeEvent::Usage(usage),
            ProgramRecord::Error {
                message,
                code,
                http_status,
            } => {
                self.reported_error.store(true, Ordering::SeqCst);
                NativeEvent::Error {
                    message,
                    code,
                    http_status,
                }
            }
        }))
    }
}

/// Why a Run's program is being stopped by the adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    /// `prompt_cancel`.
    Cancel,
    /// `close_executor`, or the adapter was dropped.
    Close,
}

/// How a Run ended, as seen by waiting cancels.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RunEnd {
    /// The program exited on its own before the adapter stopped it.
    Exited,
    /// Stopped by the adapter; the program was reaped and its group is empty.
    Stopped,
    /// Stopped, but the group could not be confirmed empty (the reason).
    Unconfirmed(String),
    /// Stopped by the adapter because the program broke the `jsonl` protocol.
    Violated,
}

/// The program's stdin, shared by the initial write and active input.
struct StdinPipe {
    pipe: Option<ChildStdin>,
    /// A write was started and not finished (its future was dropped): the pipe may
    /// hold part of a line, so later writes are refused.
    interrupted: bool,
}

type SharedStdin = Arc<tokio::sync::Mutex<StdinPipe>>;

/// One live Run.
struct RunEntry {
    executor_id: ExecutorId,
    stop: watch::Sender<Option<StopReason>>,
    ended: watch::Receiver<Option<RunEnd>>,
    /// `Some` with [`StdinMode::Open`].
    stdin: Option<SharedStdin>,
    /// `Some` with [`ProgramProtocol::Jsonl`].
    jsonl: Option<Arc<JsonlRun>>,
}

/// One prepared Executor.
struct ExecutorEntry {
    session_id: Uuid,
    /// Private empty working directory of an Executor without an execution
    /// environment; removed on close.
    scratch: Option<PathBuf>,
}

/// A process group that survived SIGKILL past [`KILL_CONFIRM_TIMEOUT`].
struct Leftover {
    pgid: Pid,
    _permit: OwnedSemaphorePermit,
}

#[derive(Default)]
struct State {
    executors: HashMap<ExecutorId, ExecutorEntry>,
    runs: HashMap<RunId, RunEntry>,
    leftovers: HashMap<ExecutorId, Vec<Leftover>>,
}

struct Shared {
    config: CommandConfig,
    /// `PASSED_ENV` values captured at construction.
    env: Vec<(OsString, OsString)>,
    state: Mutex<State>,
    permits: Arc<Semaphore>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The `command` Harness adapter (see the module documentation).
pub struct CommandAdapter {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CommandAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandAdapter")
            .field("program", &self.shared.config.program)
            .field("stdin", &self.shared.config.stdin)
            .field("protocol", &self.shared.config.protocol)
            .finish_non_exhaustive()
    }
}

impl Drop for CommandAdapter {
    fn drop(&mut self) {
        // Stop every program; their supervisors terminate the groups if the Tokio
        // runtime still runs (and `kill_on_drop` kills the programs otherwise).
        for run in self.shared.lock().runs.values() {
            request_stop(&run.stop, StopReason::Close);
        }
    }
}

impl CommandAdapter {
    /// Validates `config` (resolving the program to an absolute path), marks the
    /// process as a child subreaper (Linux; see "Process reaping") and returns the
    /// adapter. Must be called inside a Tokio runtime only if Runs are started.
    ///
    /// # Errors
    /// Any [`CommandConfigError`].
    pub fn new(mut config: CommandConfig) -> Result<Arc<Self>, CommandConfigError> {
        config.program = resolve_program(&config.program)?;
        match std::fs::metadata(&config.cwd) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(CommandConfigError::WorkingDirectory {
                    path: config.cwd.display().to_string(),
                    reason: "not a directory".into(),
                });
            }
            Err(e) => {
                return Err(CommandConfigError::WorkingDirectory {
                    path: config.cwd.display().to_string(),
                    reason: e.to_string(),
                });
            }
        }
        config.cwd =
            std::path::absolute(&config.cwd).map_err(|e| CommandConfigError::WorkingDirectory {
                path: config.cwd.display().to_string(),
                reason: e.to_string(),
            })?;
        if config.max_processes == 0 || config.max_processes > Semaphore::MAX_PERMITS {
            return Err(CommandConfigError::InvalidLimit(format!(
                "max_processes must be 1..={}, got {}",
                Semaphore::MAX_PERMITS,
                config.max_processes
            )));
        }
        if config.kill_grace.is_zero() || config.output_drain_grace.is_zero() {
            return Err(CommandConfigError::InvalidLimit(
                "grace periods must be positive".into(),
            ));
        }
        if config.protocol == ProgramProtocol::Jsonl && config.stdin == StdinMode::Close {
            return Err(CommandConfigError::IncompatibleOptions(
                "the jsonl program protocol keeps stdin open for active input (stdin mode `open`)"
                    .into(),
            ));
        }
        become_subreaper();
        let env = PASSED_ENV
            .iter()
            .filter_map(|name| std::env::var_os(name).map(|value| (OsString::from(name), value)))
            .collect();
        let permits = Arc::new(Semaphore::new(config.max_processes));
        Ok(Arc::new(Self {
            shared: Arc::new(Shared {
                config,
                env,
                state: Mutex::new(State::default()),
                permits,
            }),
        }))
    }

    /// The configuration in force (program resolved to an absolute path).
    pub fn config(&self) -> &CommandConfig {
        &self.shared.config
    }

    /// The capability declaration of the `command` agent kind for `protocol` and
    /// `stdin` (a [`ProgramProtocol::Jsonl`] configuration always has
    /// [`StdinMode::Open`]; [`CommandAdapter::new`] refuses the other combination).
    ///
    /// `true` in both protocols, and why it is honest:
    /// * `streaming`: stdout is forwarded as it is read.
    /// * `steering` (only with [`StdinMode::Open`]): active input is written to the
    ///   running program's stdin; `written` proves that write and nothing more.
    /// * `preparation`: `prepare` validates the program and reserves an Executor.
    /// * `execution_controls`: the controls block is accepted. Web search `disabled`
    ///   and programmatic tool calling `disabled` hold because the adapter gives the
    ///   program neither (it cannot stop arbitrary code from using the network: the
    ///   daemon is not an isolation boundary); a `json_schema` output format is
    ///   refused at preparation; text verbosity is not applied, which is what
    ///   `text_verbosity: false` says.
    /// * `programmatic_tool_calling_disable`, `subagent_control`: the adapter exposes
    ///   no programmatic tool calling and no native subagents, so the "disabled"
    ///   request always holds.
    /// * `environment_none`: the program then runs in a private empty directory, with
    ///   no workspace bound.
    /// * `local_environment`: the program runs in the bound workspace directory.
    /// * `workspace_read_preparation`, `workspace_output_export`: served by the
    ///   daemon's own workspace implementation, never by the program ("Workspace
    ///   support includes the public Runtime workspace implementation").
    ///
    /// `true` only with [`ProgramProtocol::Jsonl`]:
    /// * `durable_input_receipts`: the receipt semantics are the protocol's `accepted`
    ///   record — the program's own statement that it consumed the input. It becomes
    ///   [`NativeEvent::InputAccepted`] at most once per input, only for an input
    ///   this Run wrote (anything else fails the Run), so `accepted` is never
    ///   invented by the adapter ("active input `accepted`: the adapter confirmed
    ///   native consumption under its declared receipt semantics").
    /// * `tool_observations`: `tool_call` records carry the program's tool lifecycle
    ///   with an engine-independent observation.
    /// * `usage`: `usage` records carry a cumulative snapshot.
    /// * `durable_turns`: every admitted Turn ends in exactly one confirmed native
    ///   outcome delivered as the stream's last event after a complete, strictly
    ///   decoded stream: the reaped exit status (an undecodable record fails the
    ///   Run with an `error`, it is never dropped), or a cancellation confirmed only
    ///   once the process group is empty. What it does **not** claim: a Run does not
    ///   survive a Runtime restart and cannot be resumed (`native_session_recovery`
    ///   and `resume` stay false); losing the Runtime is a lost event stream, which
    ///   Core already records as `event_stream_incomplete` without inventing an
    ///   outcome. A plain program's stdout is not a typed stream (lines are split
    ///   and decoded lossily), so plain mode keeps `durable_turns` false.
    ///
    /// Everything else is `false`: `native_session_recovery`, `resume` (no native
    /// Session), `permissions`, `function_tools`, `function_result_images`,
    /// `message_images` (the adapter's stdin is text-only), `message_items`,
    /// `structured_output`, `web_search_control`, `text_verbosity`, `tool_search`,
    /// `subagent_observations`, every `mcp_http_*`; and in plain mode
    /// `durable_turns`, `durable_input_receipts` (consumption of stdin cannot be
    /// confirmed), `tool_observations` (the program's actions are opaque) and `usage`
    /// (no measurement).
    pub fn capabilities(protocol: ProgramProtocol, stdin: StdinMode) -> AgentKindCapabilities {
        let mut caps = AgentKindCapabilities::all(false);
        caps.streaming = true;
        caps.steering = stdin == StdinMode::Open;
        caps.preparation = true;
        caps.execution_controls = true;
        caps.programmatic_tool_calling_disable = true;
        caps.subagent_control = true;
        caps.environment_none = true;
        caps.local_environment = true;
        caps.workspace_read_preparation = true;
        caps.workspace_output_export = true;
        if protocol == ProgramProtocol::Jsonl {
            caps.durable_turns = true;
            caps.durable_input_receipts = true;
            caps.tool_observations = true;
            caps.usage = true;
        }
        caps
    }

    /// The single declaration: [`AGENT_KIND`], available, [`Self::capabilities`].
    pub fn declaration(&self) -> AgentKindDeclaration {
        AgentKindDeclaration {
            agent_kind: AgentKind::new(AGENT_KIND)
                .unwrap_or_else(|_| unreachable!("`command` is a valid agent kind")),
            available: true,
            capabilities: Self::capabilities(self.shared.config.protocol, self.shared.config.stdin),
        }
    }

    /// The stdin and (`jsonl` only) protocol state of a running program.
    fn stdin_of(
        &self,
        run_id: &RunId,
    ) -> Result<(SharedStdin, Option<Arc<JsonlRun>>), AdapterError> {
        let state = self.shared.lock();
        let run = state.runs.get(run_id).ok_or_else(|| {
            AdapterError::Refused(format!("no program is running for run `{run_id}`"))
        })?;
        let stdin = run.stdin.clone().ok_or_else(|| {
            AdapterError::Unsupported(
                "active input: stdin is closed after the Turn input (stdin mode `close`)".into(),
            )
        })?;
        Ok((stdin, run.jsonl.clone()))
    }
}

#[cfg(target_os = "linux")]
fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(error = %e, "command adapter: cannot become a child subreaper; orphaned grandchildren may not be confirmed gone");
    }
}

#[cfg(not(target_os = "linux"))]
fn become_subreaper() {}

fn request_stop(stop: &watch::Sender<Option<StopReason>>, reason: StopReason) {
    stop.send_if_modified(|current| match (*current, reason) {
        (None, _) | (Some(StopReason::Close), StopReason::Cancel) => {
            *current = Some(reason);
            true
        }
        _ => false,
    });
}

/// Creates a private empty directory (mode 0700) for an Executor without an
/// execution environment.
fn create_scratch() -> io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("contract-command-{}", Uuid::random()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

fn remove_scratch(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[async_trait]
impl HarnessAdapter for CommandAdapter {
    fn declarations(&self) -> Vec<AgentKindDeclaration> {
        vec![self.declaration()]
    }

    async fn prepare(&self, request: NativePrepare) -> Result<(), AdapterError> {
        if request.agent_kind.as_str() != AGENT_KIND {
            return Err(AdapterError::Refused(format!(
                "agent kind `{}` is not served by the command adapter",
                request.agent_kind
            )));
        }
        check_program(&self.shared.config.program)
            .map_err(|e| AdapterError::Refused(e.to_string()))?;
        if let Some(controls) = &request.configuration.execution_controls
            && let Some(OutputFormat::JsonSchema { .. }) = controls.output_format
        {
            return Err(AdapterError::Refused(
                "json_schema output cannot be enforced on a plain program".into(),
            ));
        }
        let scratch = if request.configuration.disable_execution_environment == Some(true) {
            Some(create_scratch().map_err(|e| {
                AdapterError::Refused(format!("cannot create a private working directory: {e}"))
            })?)
        } else {
            None
        };
        let refusal = {
            let mut state = self.shared.lock();
            if state.executors.contains_key(&request.executor_id) {
                Some(format!(
                    "executor `{}` is already prepared",
                    request.executor_id
                ))
            } else if state.executors.len() >= EXECUTORS_MAX {
                Some(format!("{EXECUTORS_MAX} executors are already prepared"))
            } else {
                state.executors.insert(
                    request.executor_id.clone(),
                    ExecutorEntry {
                        session_id: request.session_id.clone(),
                        scratch: scratch.clone(),
                    },
                );
                None
            }
        };
        match refusal {
            None => Ok(()),
            Some(reason) => {
                if let Some(dir) = &scratch {
                    let _ = remove_scratch(dir);
                }
                Err(AdapterError::Refused(reason))
            }
        }
    }

    async fn start(&self, request: NativeStart, events: RunEventSink) -> Result<(), AdapterError> {
        let config = &self.shared.config;
        let text = match config.protocol {
            ProgramProtocol::Plain => input_text(&request.input)?,
            ProgramProtocol::Jsonl => jsonl_input_line(INITIAL_INPUT_ID, &request.input)?,
        };
        let mut state = self.shared.lock();
        let executor = state.executors.get(&request.executor_id).ok_or_else(|| {
            AdapterError::Refused(format!(
                "executor `{}` is not prepared",
                request.executor_id
            ))
        })?;
        if state.runs.contains_key(&request.run_id) {
            return Err(AdapterError::Refused(format!(
                "run `{}` already started",
                request.run_id
            )));
        }
        if state
            .runs
            .values()
            .any(|r| r.executor_id == request.executor_id)
        {
            return Err(AdapterError::Refused(format!(
                "executor `{}` already runs a program",
                request.executor_id
            )));
        }
        let permit = self
            .shared
            .permits
            .clone()
            .try_acquire_owned()
            .map_err(|_| {
                AdapterError::Refused(format!(
                    "{} programs are already running (or awaiting cleanup)",
                    config.max_processes
                ))
            })?;
        let mut command = Command::new(&config.program);
        command
            .args(&config.args)
            .current_dir(executor.scratch.as_deref().unwrap_or(&config.cwd))
            .env_clear()
            .envs(self.shared.env.iter().map(|(k, v)| (k, v)))
            .env(RUN_ID_ENV, request.run_id.as_str())
            .env(SESSION_ID_ENV, executor.session_id.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| {
            AdapterError::Refused(format!("cannot start `{}`: {e}", config.program.display()))
        })?;
        let (Some(pid), Some(stdin), Some(stdout), Some(stderr)) = (
            child.id(),
            child.stdin.take(),
            child.stdout.take(),
            child.stderr.take(),
        ) else {
            // Unreachable with piped stdio on a child not yet waited for; the child is
            // killed on drop.
            return Err(AdapterError::Unknown(
                "the spawned program has no pid or pipes".into(),
            ));
        };
        let pgid = Pid::from_raw(pid.cast_signed());
        let stdin: SharedStdin = Arc::new(tokio::sync::Mutex::new(StdinPipe {
            pipe: Some(stdin),
            interrupted: false,
        }));
        // Taken before any active input can be, so the Turn's input is written first.
        let Ok(mut initial) = stdin.clone().try_lock_owned() else {
            return Err(AdapterError::Unknown(
                "stdin lock contended at start".into(),
            ));
        };
        let close_after = config.stdin == StdinMode::Close;
        let stdin_task = tokio::spawn(async move {
            if !text.is_empty()
                && let Err(e) = write_stdin(&mut initial, text.as_bytes()).await
            {
                tracing::debug!(error = %e, "command adapter: the Turn input was not fully written");
            }
            if close_after {
                initial.pipe = None;
            }
        });
        let (stop, stop_rx) = watch::channel(None);
        let (ended_tx, ended) = watch::channel(None);
        let jsonl = (config.protocol == ProgramProtocol::Jsonl).then(|| Arc::new(JsonlRun::new()));
        state.runs.insert(
            request.run_id.clone(),
            RunEntry {
                executor_id: request.executor_id.clone(),
                stop,
                ended,
                stdin: (!close_after).then_some(stdin),
                jsonl: jsonl.clone(),
            },
        );
        drop(state);
        tracing::info!(run_id = %request.run_id, pid, program = %config.program.display(), "command adapter: program started");
        tokio::spawn(supervise(
            self.shared.clone(),
            RunProcess {
                run_id: request.run_id,
                child,
                pgid,
                stdout: Box::new(stdout),
                stderr: Box::new(stderr),
                stdin_task,
                events,
                stop: stop_rx,
                ended: ended_tx,
                permit,
                jsonl,
            },
        ));
        Ok(())
    }

    async fn write_input(
        &self,
        run_id: &RunId,
        input_id: &InputId,
        input: &[MessageInput],
    ) -> Result<(), AdapterError> {
        let (stdin, jsonl) = self.stdin_of(run_id)?;
        let Some(jsonl) = jsonl else {
            let mut text = input_text(input)?;
            if text.is_empty() {
                text.push('\n');
            }
            let mut pipe = stdin.lock().await;
            write_stdin(&mut pipe, text.as_bytes()).await?;
            tracing::debug!(%run_id, %input_id, bytes = text.len(), "command adapter: active input written");
            return Ok(());
        };
        let line = jsonl_input_line(input_id.as_str(), input)?;
        jsonl.register_input(input_id)?;
        let mut pipe = stdin.lock().await;
        let written = write_stdin(&mut pipe, line.as_bytes()).await;
        if let Err(AdapterError::Refused(_)) = &written {
            jsonl.unregister_input(input_id);
        }
        written?;
        tracing::debug!(%run_id, %input_id, bytes = line.len(), "command adapter: active input record written");
        Ok(())
    }

    async fn cancel(&self, run_id: &RunId) -> Result<CancelSettlement, AdapterError> {
        let mut ended = {
            let state = self.shared.lock();
            let run = state.runs.get(run_id).ok_or_else(|| {
                AdapterError::Refused(format!("no program is running for run `{run_id}`"))
            })?;
            request_stop(&run.stop, StopReason::Cancel);
            run.ended.clone()
        };
        let end = ended
            .wait_for(Option::is_some)
            .await
            .map(|end| end.clone())
            .map_err(|_| AdapterError::Unknown("the run's supervisor ended unexpectedly".into()))?;
        match end {
            Some(RunEnd::Stopped) => Ok(CancelSettlement::StreamSettles),
            Some(RunEnd::Exited) => Err(AdapterError::Refused(
                "the program had already exited; nothing was cancelled".into(),
            )),
            Some(RunEnd::Unconfirmed(reason)) => Err(AdapterError::Unknown(reason)),
            Some(RunEnd::Violated) => Err(AdapterError::Refused(
                "the program was stopped for a protocol violation; nothing was cancelled".into(),
            )),
            None => Err(AdapterError::Unknown(
                "the run ended without an outcome".into(),
            )),
        }
    }

    async fn resolve_permission(
        &self,
        _run_id: &RunId,
        _request_id: &InteractionId,
        _decision: PermissionVerdict,
    ) -> Result<(), AdapterError> {
        Err(AdapterError::Unsupported(
            "permission decisions (a plain program raises no permission requests)".into(),
        ))
    }

    async fn resolve_user_choice(
        &self,
        _run_id: &RunId,
        _ask_id: &InteractionId,
        _decision: &PromptForUserChoiceDecision,
    ) -> Result<(), AdapterError> {
        Err(AdapterError::Unsupported(
            "user-choice decisions (a plain program asks no questions)".into(),
        ))
    }

    async fn function_result(
        &self,
        _run_id: &RunId,
        _call_id: &CallId,
        _output: &str,
        _is_error: bool,
    ) -> Result<(), AdapterError> {
        Err(AdapterError::Unsupported(
            "function results (a plain program makes no function calls)".into(),
        ))
    }

    async fn close_executor(&self, executor_id: &ExecutorId) -> Result<(), AdapterError> {
        let running: Vec<_> = {
            let state = self.shared.lock();
            state
                .runs
                .values()
                .filter(|r| &r.executor_id == executor_id)
                .map(|r| {
                    request_stop(&r.stop, StopReason::Close);
                    r.ended.clone()
                })
                .collect()
        };
        for mut ended in running {
            let _ = ended.wait_for(Option::is_some).await;
        }
        let leftovers = self
            .shared
            .lock()
            .leftovers
            .remove(executor_id)
            .unwrap_or_default();
        let mut remaining = Vec::new();
        for leftover in leftovers {
            if group_alive(leftover.pgid) {
                signal_group(leftover.pgid, Signal::SIGKILL);
                if !wait_group_gone(leftover.pgid, Instant::now() + KILL_CONFIRM_TIMEOUT).await {
                    remaining.push(leftover);
                }
            }
        }
        if !remaining.is_empty() {
            let groups: Vec<String> = remaining.iter().map(|l| l.pgid.to_string()).collect();
            self.shared
                .lock()
                .leftovers
                .insert(executor_id.clone(), remaining);
            return Err(AdapterError::Unknown(format!(
                "process groups {} still have members after SIGKILL; cleanup unconfirmed",
                groups.join(", ")
            )));
        }
        let scratch = self
            .shared
            .lock()
            .executors
            .get(executor_id)
            .and_then(|e| e.scratch.clone());
        if let Some(dir) = scratch {
            remove_scratch(&dir).map_err(|e| {
                AdapterError::Unknown(format!(
                    "cannot remove the private working directory {}: {e}",
                    dir.display()
                ))
            })?;
        }
        self.shared.lock().executors.remove(executor_id);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Stdin
// ---------------------------------------------------------------------------

/// Writes and flushes `bytes`. A broken pipe on a write of at most
/// [`PIPE_BUF_BYTES`] proves nothing was read (`Refused`); otherwise a failure leaves
/// the outcome unknown.
async fn write_stdin(pipe: &mut StdinPipe, bytes: &[u8]) -> Result<(), AdapterError> {
    if pipe.interrupted {
        return Err(AdapterError::Refused(
            "an earlier write to stdin was interrupted; the pipe may hold a partial line".into(),
        ));
    }
    pipe.interrupted = true;
    let Some(writer) = pipe.pipe.as_mut() else {
        pipe.interrupted = false;
        return Err(AdapterError::Refused(
            "the program's stdin is closed".into(),
        ));
    };
    let written = async {
        writer.write_all(bytes).await?;
        writer.flush().await
    }
    .await;
    match written {
        Ok(()) => {
            pipe.interrupted = false;
            Ok(())
        }
        Err(e) => {
            pipe.pipe = None;
            if e.kind() == io::ErrorKind::BrokenPipe && bytes.len() <= PIPE_BUF_BYTES {
                pipe.interrupted = false;
                Err(AdapterError::Refused("the program closed its stdin".into()))
            } else {
                Err(AdapterError::Unknown(format!(
                    "writing to the program's stdin failed: {e}"
                )))
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

/// Index at which `bytes` (a full piece) is cut so that a UTF-8 character whose first
/// bytes end the piece moves whole to the next piece.
fn utf8_cut(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let byte = bytes[len - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue; // continuation byte: look further back
        }
        let needed = match byte {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            // ASCII, or a byte that never starts a character: it stays.
            _ => 1,
        };
        return if needed > back { len - back } else { len };
    }
    len
}

/// Reads a pipe in pieces: a line (with its `\n`) or, for longer lines, at most `max`
/// bytes.
struct PieceReader<R> {
    inner: BufReader<R>,
    max: usize,
    carry: Vec<u8>,
}

impl<R: AsyncRead + Unpin> PieceReader<R> {
    fn new(inner: R, max: usize) -> Self {
        Self {
            inner: BufReader::new(inner),
            max,
            carry: Vec::new(),
        }
    }

    /// The next piece, or `None` at EOF. Not cancel-safe: a cancelled call loses the
    /// piece it was assembling.
    async fn next_piece(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut piece = std::mem::take(&mut self.carry);
        loop {
            if piece.len() >= self.max {
                let cut = utf8_cut(&piece[..self.max]);
                self.carry = piece.split_off(cut);
                return Ok(Some(piece));
            }
            let buf = self.inner.fill_buf().await?;
            if buf.is_empty() {
                return Ok((!piece.is_empty()).then_some(piece));
            }
            let window = &buf[..buf.len().min(self.max - piece.len())];
            if let Some(pos) = window.iter().position(|&b| b == b'\n') {
                piece.extend_from_slice(&window[..=pos]);
                self.inner.consume(pos + 1);
                return Ok(Some(piece));
            }
            let n = window.len();
            piece.extend_from_slice(window);
            self.inner.consume(n);
        }
    }
}

/// The next piece of `reader`, or `None` at EOF, on a read error, or when the adapter
/// gave up waiting and no data is ready (then at most
/// [`DRAIN_AFTER_GIVE_UP_MAX_BYTES`] more are read).
async fn next_or_give_up<R: AsyncRead + Unpin>(
    reader: &mut PieceReader<R>,
    give_up: &mut watch::Receiver<bool>,
    after_give_up: &mut usize,
) -> Option<Vec<u8>> {
    if *give_up.borrow() && *after_give_up > DRAIN_AFTER_GIVE_UP_MAX_BYTES {
        return None;
    }
    let piece = tokio::select! {
        biased;
        piece = reader.next_piece() => piece,
        _ = give_up.wait_for(|g| *g) => return None,
    };
    match piece {
        Ok(Some(bytes)) => {
            if *give_up.borrow() {
                *after_give_up += bytes.len();
            }
            Some(bytes)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "command adapter: reading program output failed");
            None
        }
    }
}

/// Forwards stdout pieces as deltas. Keeps reading (and discarding) when the Run's
/// event stream was dropped, so the program never blocks on a full pipe.
async fn forward_stdout(
    stdout: Box<dyn AsyncRead + Send + Unpin>,
    events: RunEventSink,
    mut give_up: watch::Receiver<bool>,
) {
    let mut reader = PieceReader::new(stdout, STDOUT_LINE_MAX_BYTES);
    let mut after_give_up = 0;
    let mut delivering = true;
    while let Some(bytes) = next_or_give_up(&mut reader, &mut give_up, &mut after_give_up).await {
        if delivering {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let delta = NativeEvent::Delta {
                text,
                item_id: None,
            };
            delivering = events.send(delta).await.is_ok();
        }
    }
}

/// Decodes `jsonl` stdout records into native events. The first refused record is
/// recorded as the Run's protocol violation (which stops the program); nothing after
/// it is delivered. Keeps reading (and discarding) afterwards, and when the Run's event
/// stream was dropped, so the program never blocks on a full pipe.
async fn forward_jsonl(
    stdout: Box<dyn AsyncRead + Send + Unpin>,
    events: RunEventSink,
    mut give_up: watch::Receiver<bool>,
    run: Arc<JsonlRun>,
) {
    let mut reader = PieceReader::new(stdout, JSONL_RECORD_MAX_BYTES);
    let mut after_give_up = 0;
    let mut delivering = true;
    let mut number: u64 = 0;
    while let Some(bytes) = next_or_give_up(&mut reader, &mut give_up, &mut after_give_up).await {
        if !delivering {
            continue;
        }
        number += 1;
        match run.translate(&bytes) {
            Ok(None) => {}
            Ok(Some(event)) => delivering = events.send(event).await.is_ok(),
            Err(e) => {
                run.violate(format!("stdout record {number}: {e} ({})", e.code()));
                delivering = false;
            }
        }
    }
}

/// The bounded tail of stderr.
#[derive(Debug, Default)]
struct StderrTail {
    lines: VecDeque<String>,
    bytes: usize,
}

impl StderrTail {
    fn push(&mut self, piece: &[u8]) {
        let line = String::from_utf8_lossy(piece)
            .trim_end_matches(['\n', '\r'])
            .to_string();
        self.bytes += line.len();
        self.lines.push_back(line);
        while self.lines.len() > STDERR_TAIL_LINES || self.bytes > STDERR_TAIL_BYTES {
            match self.lines.pop_front() {
                Some(old) => self.bytes -= old.len(),
                None => break,
            }
        }
    }

    /// The last line that is not blank, trimmed.
    fn last_line(&self) -> Option<&str> {
        self.lines
            .iter()
            .rev()
            .map(|l| l.trim())
            .find(|l| !l.is_empty())
    }
}

async fn collect_stderr(
    stderr: Box<dyn AsyncRead + Send + Unpin>,
    tail: Arc<Mutex<StderrTail>>,
    mut give_up: watch::Receiver<bool>,
) {
    let mut reader = PieceReader::new(stderr, STDERR_LINE_MAX_BYTES);
    let mut after_give_up = 0;
    while let Some(bytes) = next_or_give_up(&mut reader, &mut give_up, &mut after_give_up).await {
        tail.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(&bytes);
    }
}

/// The stdout and stderr tasks of one Run.
struct OutputTasks {
    stdout: Option<JoinHandle<()>>,
    stderr: Option<JoinHandle<()>>,
}

impl OutputTasks {
    /// Waits for both tasks (cancel-safe: a finished task is not polled again).
    async fn join(&mut self) {
        for slot in [&mut self.stdout, &mut self.stderr] {
            if let Some(task) = slot.as_mut() {
                let _ = task.await;
                *slot = None;
            }
        }
    }

    /// Waits up to `grace` for EOF, then gives up on output held open by processes
    /// outside the group and waits for the tasks to stop (delivery of pieces already
    /// read is the Run's event queue's business and is never cut).
    async fn finish(&mut self, give_up: &watch::Sender<bool>, grace: Duration) {
        if tokio::time::timeout(grace, self.join()).await.is_err() {
            tracing::warn!(
                "command adapter: program output still open after the program ended; giving up on it"
            );
            give_up.send_replace(true);
            self.join().await;
        }
    }
}

// ---------------------------------------------------------------------------
// Process groups
// ---------------------------------------------------------------------------

/// Reaps the exited members of group `pgid` that are children of this process (the
/// program's re-parented descendants). Only called after the program itself was
/// reaped, so it never steals the program's exit status from Tokio.
fn reap_group(pgid: Pid) {
    let group = Pid::from_raw(-pgid.as_raw());
    loop {
        match waitpid(group, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return,
            Ok(_) | Err(Errno::EINTR) => continue,
            // ECHILD: none of our children is in the group.
            Err(_) => return,
        }
    }
}

/// Whether group `pgid` still has a member (a zombie counts), after reaping ours.
fn group_alive(pgid: Pid) -> bool {
    reap_group(pgid);
    !matches!(killpg(pgid, None), Err(Errno::ESRCH))
}

fn signal_group(pgid: Pid, signal: Signal) {
    match killpg(pgid, signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => {
            tracing::warn!(%pgid, ?signal, error = %e, "command adapter: cannot signal the process group");
        }
    }
}

/// Polls until group `pgid` is empty (`true`) or `deadline` passes (`false`).
async fn wait_group_gone(pgid: Pid, deadline: Instant) -> bool {
    loop {
        if !group_alive(pgid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(GROUP_POLL_INTERVAL).await;
    }
}

/// With the program already reaped and SIGTERM already sent: waits until
/// `term_deadline` for the group to empty, then SIGKILLs it and confirms.
async fn finish_group(pgid: Pid, term_deadline: Instant) -> Result<(), String> {
    if wait_group_gone(pgid, term_deadline).await {
        return Ok(());
    }
    signal_group(pgid, Signal::SIGKILL);
    if wait_group_gone(pgid, Instant::now() + KILL_CONFIRM_TIMEOUT).await {
        Ok(())
    } else {
        Err(format!(
            "process group {pgid} still has members {} after SIGKILL",
            humanize(KILL_CONFIRM_TIMEOUT)
        ))
    }
}

/// Terminates what is left of group `pgid` after the program exited on its own.
async fn clean_group(pgid: Pid, grace: Duration) -> Result<(), String> {
    if !group_alive(pgid) {
        return Ok(());
    }
    tracing::info!(%pgid, "command adapter: terminating processes left behind by the program");
    signal_group(pgid, Signal::SIGTERM);
    finish_group(pgid, Instant::now() + grace).await
}

/// Stops the running program and its group: SIGTERM, `grace`, SIGKILL; `Ok` once the
/// program was reaped and the group is empty.
async fn terminate(child: &mut Child, pgid: Pid, grace: Duration) -> Result<(), String> {
    // The program is not reaped yet, so the group ID cannot have been reused.
    signal_group(pgid, Signal::SIGTERM);
    let term_deadline = Instant::now() + grace;
    if tokio::time::timeout_at(term_deadline, child.wait())
        .await
        .is_err()
    {
        signal_group(pgid, Signal::SIGKILL);
        if tokio::time::timeout(KILL_CONFIRM_TIMEOUT, child.wait())
            .await
            .is_err()
        {
            return Err(format!(
                "the program (pid {pgid}) did not exit {} after SIGKILL",
                humanize(KILL_CONFIRM_TIMEOUT)
            ));
        }
    }
    finish_group(pgid, term_deadline).await
}

fn humanize(duration: Duration) -> String {
    format!("{} ms", duration.as_millis())
}

// ---------------------------------------------------------------------------
// Supervision
// ---------------------------------------------------------------------------

/// Everything the supervisor of one Run owns.
struct RunProcess {
    run_id: RunId,
    child: Child,
    pgid: Pid,
    stdout: Box<dyn AsyncRead + Send + Unpin>,
    stderr: Box<dyn AsyncRead + Send + Unpin>,
    stdin_task: JoinHandle<()>,
    events: RunEventSink,
    stop: watch::Receiver<Option<StopReason>>,
    ended: watch::Sender<Option<RunEnd>>,
    permit: OwnedSemaphorePermit,
    /// `Some` with [`ProgramProtocol::Jsonl`].
    jsonl: Option<Arc<JsonlRun>>,
}

/// How the program ended, natively.
enum Native {
    Exited(io::Result<ExitStatus>),
    Stopped,
}

fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The `error` message of an unsuccessful exit: status, then the stderr excerpt.
fn exit_message(status: ExitStatus, stderr: Option<&str>) -> String {
    let mut message = match (status.code(), status.signal()) {
        (Some(code), _) => format!("program exited with status {code}"),
        (None, Some(signal)) => format!("program was terminated by signal {signal}"),
        (None, None) => format!("program ended unsuccessfully ({status})"),
    };
    if let Some(line) = stderr {
        message.push_str(": ");
        message.push_str(cut(line, ERROR_DETAIL_MAX_BYTES));
    }
    message
}

async fn supervise(shared: Arc<Shared>, mut p: RunProcess) {
    let config = &shared.config;
    let (give_up, give_up_rx) = watch::channel(false);
    let tail = Arc::new(Mutex::new(StderrTail::default()));
    let stdout_task = match &p.jsonl {
        Some(run) => tokio::spawn(forward_jsonl(
            p.stdout,
            p.events.clone(),
            give_up_rx.clone(),
            run.clone(),
        )),
        None => tokio::spawn(forward_stdout(
            p.stdout,
            p.events.clone(),
            give_up_rx.clone(),
        )),
    };
    let mut output = OutputTasks {
        stdout: Some(stdout_task),
        stderr: Some(tokio::spawn(collect_stderr(
            p.stderr,
            tail.clone(),
            give_up_rx,
        ))),
    };
    let mut stop = p.stop.clone();
    let jsonl = p.jsonl.clone();
    let violated = async {
        match &jsonl {
            Some(run) => run.wait_violated().await,
            None => std::future::pending().await,
        }
    };
    let exited = tokio::select! {
        status = p.child.wait() => Some(status),
        // A dropped sender (adapter gone) also stops the program.
        _ = stop.wait_for(Option::is_some) => None,
        // A protocol violation stops it too.
        () = violated => None,
    };
    let (native, cleanup) = match exited {
        Some(status) => {
            // Let output reach EOF, then remove what the program left behind.
            let _ = tokio::time::timeout(config.output_drain_grace, output.join()).await;
            let cleanup = clean_group(p.pgid, config.kill_grace).await;
            (Native::Exited(status), cleanup)
        }
        None => {
            let cleanup = terminate(&mut p.child, p.pgid, config.kill_grace).await;
            (Native::Stopped, cleanup)
        }
    };
    output.finish(&give_up, config.output_drain_grace).await;
    p.stdin_task.abort();
    let reason = *p.stop.borrow();
    let violation = p.jsonl.as_ref().and_then(|run| run.violation());
    let reported_error = p
        .jsonl
        .as_ref()
        .is_some_and(|run| run.reported_error.load(Ordering::SeqCst));

    let end = match (&native, &cleanup) {
        (Native::Exited(_), _) => RunEnd::Exited,
        // Only a cancel request can claim a stop the violation caused.
        (Native::Stopped, _) if violation.is_some() && reason != Some(StopReason::Cancel) => {
            RunEnd::Violated
        }
        (Native::Stopped, Ok(())) => RunEnd::Stopped,
        (Native::Stopped, Err(reason)) => RunEnd::Unconfirmed(reason.clone()),
    };
    {
        let mut state = shared.lock();
        let executor_id = state.runs.remove(&p.run_id).map(|r| r.executor_id);
        match (&cleanup, executor_id) {
            (Err(reason), Some(executor_id)) => {
                tracing::warn!(run_id = %p.run_id, "command adapter: {reason}; kept for the Executor's close");
                state
                    .leftovers
                    .entry(executor_id)
                    .or_default()
                    .push(Leftover {
                        pgid: p.pgid,
                        _permit: p.permit,
                    });
            }
            _ => drop(p.permit),
        }
    }
    let _ = p.ended.send(Some(end));

    let (error, outcome) = match native {
        // An undecodable record fails the Run, whatever the program did next.
        _ if violation.is_some() => {
            let violation = violation.unwrap_or_default();
            let mut message = format!("program protocol violation: {violation}");
            if let Err(reason) = &cleanup {
                message.push_str("; ");
                message.push_str(reason);
            }
            (
                Some(cut(&message, ERROR_DETAIL_MAX_BYTES).to_string()),
                Outcome::Failed,
            )
        }
        Native::Exited(Ok(status)) if status.success() => (None, Outcome::Completed),
        // The program already reported its failure natively (`jsonl` `error` record):
        // an unclassified exit error after it would only bury its metadata.
        Native::Exited(Ok(status)) if reported_error => {
            tracing::info!(run_id = %p.run_id, %status, "command adapter: program failed after reporting an error");
            (None, Outcome::Failed)
        }
        Native::Exited(Ok(status)) => {
            let tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
            tracing::info!(run_id = %p.run_id, %status, stderr_tail = ?tail.lines, "command adapter: program failed");
            (
                Some(exit_message(status, tail.last_line())),
                Outcome::Failed,
            )
        }
        Native::Exited(Err(e)) => (
            Some(format!("cannot wait for the program: {e}")),
            Outcome::Failed,
        ),
        Native::Stopped => match (reason, cleanup) {
            (Some(StopReason::Cancel), Ok(())) => (None, Outcome::Cancelled),
            (Some(StopReason::Cancel), Err(reason)) => (
                Some(format!("cancellation unconfirmed: {reason}")),
                Outcome::Failed,
            ),
            (_, Ok(())) => (
                Some("the program was stopped because its Executor was closed".into()),
                Outcome::Failed,
            ),
            (_, Err(reason)) => (
                Some(format!(
                    "the program was stopped because its Executor was closed; {reason}"
                )),
                Outcome::Failed,
            ),
        },
    };
    tracing::info!(run_id = %p.run_id, ?outcome, "command adapter: run settled");
    if let Some(message) = error {
        let _ = p
            .events
            .send(NativeEvent::Error {
                message,
                code: None,
                http_status: None,
            })
            .await;
    }
    let _ = p
        .events
        .send(NativeEvent::Settled {
            outcome,
            native_session_id: None,
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core_runtime::adapter::RUN_EVENT_QUEUE;
    use crate::core_runtime::wire::{ExecutionConfiguration, InputRole, Text};
    use crate::wire::bounded::{Base64Bytes, BoundedString, BoundedVec};
    use nix::sys::signal::kill;
    use tokio::sync::mpsc;

    /// Bound of every test step, so a broken adapter fails instead of hanging.
    const STEP: Duration = Duration::from_secs(20);

    async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(STEP, future)
            .await
            .expect("test step timed out")
    }

    struct Fixture {
        adapter: Arc<CommandAdapter>,
        dir: tempfile::TempDir,
    }

    fn fixture_with(script: &str, stdin: StdinMode, max_processes: usize) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut config = CommandConfig::new("/bin/sh", dir.path());
        config.args = vec!["-c".into(), script.into()];
        config.stdin = stdin;
        config.max_processes = max_processes;
        config.kill_grace = Duration::from_millis(500);
        config.output_drain_grace = Duration::from_millis(200);
        Fixture {
            adapter: CommandAdapter::new(config).unwrap(),
            dir,
        }
    }

    fn fixture(script: &str) -> Fixture {
        fixture_with(script, StdinMode::Close, 4)
    }

    /// A `/bin/sh -c script` fixture speaking the `jsonl` protocol.
    fn fixture_jsonl(script: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut config = CommandConfig::new("/bin/sh", dir.path());
        config.args = vec!["-c".into(), script.into()];
        config.stdin = StdinMode::Open;
        config.protocol = ProgramProtocol::Jsonl;
        config.kill_grace = Duration::from_millis(500);
        config.output_drain_grace = Duration::from_millis(200);
        Fixture {
            adapter: CommandAdapter::new(config).unwrap(),
            dir,
        }
    }

    /// The `Error` event's message (panics on anything else).
    fn error_message(event: &NativeEvent) -> &str {
        match event {
            NativeEvent::Error { message, .. } => message,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    fn run(id: &str) -> RunId {
        RunId::new(id).unwrap()
    }

    fn executor(id: &str) -> ExecutorId {
        ExecutorId::new(id).unwrap()
    }

    const SESSION: &str = "6f1c2a8e-1b2c-4d3e-8f9a-0b1c2d3e4f5a";

    fn message(parts: Vec<ContentPart>) -> MessageInput {
        MessageInput {
            role: InputRole::User,
            content: BoundedVec::new(parts).unwrap(),
        }
    }

    fn text(t: &str) -> ContentPart {
        ContentPart::Text {
            text: Text::new(t).unwrap(),
        }
    }

    fn image() -> ContentPart {
        ContentPart::Image {
            media_type: BoundedString::new("image/png").unwrap(),
            data: Base64Bytes::new(vec![0x89, b'P', b'N', b'G']).unwrap(),
        }
    }

    async fn prepare(adapter: &CommandAdapter, executor_id: &str) {
        within(adapter.prepare(NativePrepare {
            executor_id: executor(executor_id),
            session_id: Uuid::new(SESSION).unwrap(),
            agent_kind: AgentKind::new(AGENT_KIND).unwrap(),
            configuration: ExecutionConfiguration::default(),
        }))
        .await
        .unwrap();
    }

    /// Prepares `ex-<run_id>` and starts `run_id` on it with `input`.
    async fn start(
        adapter: &CommandAdapter,
        run_id: &str,
        input: Vec<MessageInput>,
    ) -> mpsc::Receiver<NativeEvent> {
        let executor_id = format!("ex-{run_id}");
        prepare(adapter, &executor_id).await;
        let (tx, rx) = mpsc::channel(RUN_EVENT_QUEUE);
        within(adapter.start(
            NativeStart {
                executor_id: executor(&executor_id),
                run_id: run(run_id),
                input,
            },
            tx,
        ))
        .await
        .unwrap();
        rx
    }

    async fn next(rx: &mut mpsc::Receiver<NativeEvent>) -> NativeEvent {
        within(rx.recv()).await.expect("event stream ended")
    }

    /// Every event until (and including) `Settled`; the stream must then end.
    async fn until_settled(rx: &mut mpsc::Receiver<NativeEvent>) -> Vec<NativeEvent> {
        let mut events = Vec::new();
        loop {
            let event = next(rx).await;
            let settled = matches!(event, NativeEvent::Settled { .. });
            events.push(event);
            if settled {
                assert!(within(rx.recv()).await.is_none(), "event after Settled");
                return events;
            }
        }
    }

    fn delta(t: &str) -> NativeEvent {
        NativeEvent::Delta {
            text: t.into(),
            item_id: None,
        }
    }

    fn settled(outcome: Outcome) -> NativeEvent {
        NativeEvent::Settled {
            outcome,
            native_session_id: None,
        }
    }

    fn pid_of(event: &NativeEvent) -> Pid {
        match event {
            NativeEvent::Delta { text, .. } => Pid::from_raw(text.trim().parse().unwrap()),
            other => panic!("expected a pid delta, got {other:?}"),
        }
    }

    fn assert_gone(pid: Pid) {
        assert_eq!(kill(pid, None), Err(Errno::ESRCH), "process {pid} survived");
    }

    #[tokio::test]
    async fn stdout_lines_become_deltas_then_completed() {
        let f = fixture("echo one; printf 'two\\n'; printf 'three'");
        let mut rx = start(&f.adapter, "r1", vec![message(vec![text("hi")])]).await;
        assert_eq!(
            until_settled(&mut rx).await,
            vec![
                delta("one\n"),
                delta("two\n"),
                delta("three"),
                settled(Outcome::Completed)
            ]
        );
    }

    #[tokio::test]
    async fn non_zero_exit_is_an_unclassified_error_then_failed() {
        let f = fixture(
            "echo partial; echo 'first problem' >&2; echo 'disk on fire' >&2; echo >&2; exit 3",
        );
        let mut rx = start(&f.adapter, "r1", vec![]).await;
        let events = until_settled(&mut rx).await;
        assert_eq!(events.len(), 3, "{events:?}");
        assert_eq!(events[0], delta("partial\n"));
        assert_eq!(
            events[1],
            NativeEvent::Error {
                message: "program exited with status 3: disk on fire".into(),
                code: None,
                http_status: None,
            }
        );
        assert_eq!(events[2], settled(Outcome::Failed));
    }

    #[tokio::test]
    async fn killed_by_a_foreign_signal_is_failed() {
        let f = fixture("kill -9 $$");
        let mut rx = start(&f.adapter, "r1", vec![]).await;
        let events = until_settled(&mut rx).await;
        assert!(
            matches!(&events[0], NativeEvent::Error { message, .. } if message == "program was terminated by signal 9"),
            "{events:?}"
        );
        assert_eq!(events[1], settled(Outcome::Failed));
    }

    #[tokio::test]
    async fn stdin_receives_the_input_in_order_then_eof() {
        let f = fixture("cat; echo end");
        let input = vec![
            message(vec![text("a"), text("b")]),
            message(vec![text("c")]),
        ];
        let mut rx = start(&f.adapter, "r1", input).await;
        assert_eq!(
            until_settled(&mut rx).await,
            vec![
                delta("ab\n"),
                delta("c\n"),
                delta("end\n"),
                settled(Outcome::Completed)
            ]
        );
    }

    #[tokio::test]
    async fn environment_is_cleared_and_cwd_is_the_configured_directory() {
        let f = fixture(
            "echo \"$CONTRACT_RUN_ID|$CONTRACT_SESSION_ID|${CARGO_MANIFEST_DIR-unset}|${PATH:+path}\"; pwd -P",
        );
        let mut rx = start(&f.adapter, "r-env", vec![]).await;
        let events = until_settled(&mut rx).await;
        assert_eq!(events[0], delta(&format!("r-env|{SESSION}|unset|path\n")));
        let cwd = std::fs::canonicalize(f.dir.path()).unwrap();
        assert_eq!(events[1], delta(&format!("{}\n", cwd.display())));
    }

    #[tokio::test]
    async fn long_lines_are_split_and_invalid_utf8_is_lossy() {
        let f =
            fixture("head -c 150000 /dev/zero | tr '\\000' a; echo; printf 'bad \\377 byte\\n'");
        let mut rx = start(&f.adapter, "r1", vec![]).await;
        let events = until_settled(&mut rx).await;
        let texts: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                NativeEvent::Delta { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            texts.len(),
            4,
            "{:?}",
            texts.iter().map(|t| t.len()).collect::<Vec<_>>()
        );
        assert!(texts.iter().all(|t| t.len() <= STDOUT_LINE_MAX_BYTES));
        assert_eq!(texts[..3].concat(), format!("{}\n", "a".repeat(150_000)));
        assert_eq!(texts[3], "bad \u{FFFD} byte\n");
        assert_eq!(events.last(), Some(&settled(Outcome::Completed)));
    }

    #[test]
    fn utf8_cut_moves_a_split_character_to_the_next_piece() {
        assert_eq!(utf8_cut(b"abcd"), 4);
        assert_eq!(utf8_cut("ab\u{e9}".as_bytes()), 4); // complete 2-byte char
        assert_eq!(utf8_cut(&"ab\u{20ac}".as_bytes()[..4]), 2); // 2 of 3 bytes
        assert_eq!(utf8_cut(&"a\u{1F600}".as_bytes()[..4]), 1); // 3 of 4 bytes
        assert_eq!(utf8_cut(&[b'a', 0xff, 0xff]), 3); // invalid bytes stay
    }

    #[test]
    fn stderr_tail_is_bounded() {
        let mut tail = StderrTail::default();
        for i in 0..1000 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        assert_eq!(tail.lines.len(), STDERR_TAIL_LINES);
        assert_eq!(tail.last_line(), Some("line 999"));
        let long = vec![b'x'; STDERR_LINE_MAX_BYTES];
        for _ in 0..10 {
            tail.push(&long);
        }
        assert!(tail.bytes <= STDERR_TAIL_BYTES);
    }

    #[tokio::test]
    async fn cancel_kills_the_whole_process_tree() {
        let f = fixture("sleep 1000 & echo \"$!\"; wait");
        let mut rx = start(&f.adapter, "r1", vec![message(vec![text("x")])]).await;
        let grandchild = pid_of(&next(&mut rx).await);
        assert_eq!(kill(grandchild, None), Ok(()));
        let settlement = within(f.adapter.cancel(&run("r1"))).await.unwrap();
        assert_eq!(settlement, CancelSettlement::StreamSettles);
        // Confirmed: the program was reaped and its group is empty.
        assert_gone(grandchild);
        assert_eq!(
            until_settled(&mut rx).await,
            vec![settled(Outcome::Cancelled)]
        );
        // Nothing is left to cancel.
        assert!(matches!(
            within(f.adapter.cancel(&run("r1"))).await,
            Err(AdapterError::Refused(_))
        ));
    }

    #[tokio::test]
    async fn cancel_escalates_to_sigkill_when_sigterm_is_ignored() {
        let f = fixture("trap '' TERM; sleep 1000 & echo \"$!\"; while :; do wait; done");
        let mut rx = start(&f.adapter, "r1", vec![]).await;
        let grandchild = pid_of(&next(&mut rx).await);
        let settlement = within(f.adapter.cancel(&run("r1"))).await.unwrap();
        assert_eq!(settlement, CancelSettlement::StreamSettles);
        assert_gone(grandchild);
        assert_eq!(
            until_settled(&mut rx).await,
            vec![settled(Outcome::Cancelled)]
        );
    }

    #[tokio::test]
    async fn processes_left_behind_are_terminated_before_settling() {
        let f = fixture("sleep 1000 & echo \"$!\"");
        let mut rx = start(&f.adapter, "r1", vec![]).await;
        let events = until_settled(&mut rx).await;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[1], settled(Outcome::Completed));
        assert_gone(pid_of(&events[0]));
        assert!(matches!(
            within(f.adapter.cancel(&run("r1"))).await,
            Err(AdapterError::Refused(_))
        ));
    }

    #[tokio::test]
    async fn images_are_refused_before_anything_runs() {
        let f = fixture_with("read l; echo \"$l\"", StdinMode::Open, 4);
        prepare(&f.adapter, "ex-1").await;
        let (tx, mut rx) = mpsc::channel(RUN_EVENT_QUEUE);
        let err = within(f.adapter.start(
            NativeStart {
                executor_id: executor("ex-1"),
                run_id: run("r1"),
                input: vec![message(vec![text("look:"), image()])],
            },
            tx,
        ))
        .await
        .unwrap_err();
        assert!(matches!(err, AdapterError::Refused(_)), "{err:?}");
        assert!(within(rx.recv()).await.is_none());
        // Active input with an image is refused too.
        let mut rx = start(&f.adapter, "r2", vec![message(vec![text("go")])]).await;
        let err = within(f.adapter.write_input(
            &run("r2"),
            &InputId::new("i1").unwrap(),
            &[message(vec![image()])],
        ))
        .await
        .unwrap_err();
        assert!(matches!(err, AdapterError::Refused(_)), "{err:?}");
        assert_eq!(
            until_settled(&mut rx).await,
            vec![delta("go\n"), settled(Outcome::Completed)]
        );
    }

    #[tokio::test]
    async fn write_input_reaches_the_running_program() {
        let f = fixture_with(
            "read first; echo \"first:$first\"; read second; echo \"second:$second\"",
            StdinMode::Open,
            4,
        );
        let mut rx = start(&f.adapter, "r1", vec![message(vec![text("one")])]).await;
        assert_eq!(next(&mut rx).await, delta("first:one\n"));
        within(f.adapter.write_input(
            &run("r1"),
            &InputId::new("i1").unwrap(),
            &[message(vec![text("two")])],
        ))
        .await
        .unwrap();
        assert_eq!(
            until_settled(&mut rx).await,
            vec![delta("second:two\n"), settled(Outcome::Completed)]
        );
        // No InputAccepted was emitted (consumption cannot be confirmed).
    }

    #[tokio::test]
    async fn write_input_without_open_stdin_is_unsupported() {
        let f = fixture("cat >/dev/null; sleep 1000");
        let mut rx = start(&f.adapter, "r1", vec![]).await;
        let err = within(f.adapter.write_input(
            &run("r1"),
            &InputId::new("i1").unwrap(),
            &[message(vec![text("late")])],
        ))
        .await
        .unwrap_err();
        assert!(matches!(err, AdapterError::Unsupported(_)), "{err:?}");
        within(f.adapter.cancel(&run("r1"))).await.unwrap();
        assert_eq!(
            until_settled(&mut rx).await,
            vec![settled(Outcome::Cancelled)]
        );
    }

    #[tokio::test]
    async fn process_bound_and_close_executor() {
        let f = fixture_with("echo started; sleep 1000", StdinMode::Close, 1);
        let mut rx = start(&f.adapter, "r1", vec![]).await;
        assert_eq!(next(&mut rx).await, delta("started\n"));
        prepare(&f.adapter, "ex-2").await;
        let (tx, _rx2) = mpsc::channel(RUN_EVENT_QUEUE);
        let err = within(f.adapter.start(
            NativeStart {
                executor_id: executor("ex-2"),
                run_id: run("r2"),
                input: vec![],
            },
            tx,
        ))
        .await
        .unwrap_err();
        assert!(matches!(err, AdapterError::Refused(_)), "{err:?}");
        // Closing the Executor stops its program.
        within(f.adapter.close_executor(&executor("ex-r1")))
            .await
            .unwrap();
        let events = until_settled(&mut rx).await;
        assert!(matches!(events[0], NativeEvent::Error { .. }), "{events:?}");
        assert_eq!(events[1], settled(Outcome::Failed));
        // The slot is free again.
        let mut rx = start(&f.adapter, "r3", vec![]).await;
        assert_eq!(next(&mut rx).await, delta("started\n"));
        within(f.adapter.cancel(&run("r3"))).await.unwrap();
        // Closing an unknown (or read-only, never natively prepared) Executor is a no-op.
        within(f.adapter.close_executor(&executor("never")))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn start_requires_a_prepared_executor() {
        let f = fixture("true");
        let (tx, _rx) = mpsc::channel(RUN_EVENT_QUEUE);
        let err = within(f.adapter.start(
            NativeStart {
                executor_id: executor("missing"),
                run_id: run("r1"),
                input: vec![],
            },
            tx,
        ))
        .await
        .unwrap_err();
        assert!(matches!(err, AdapterError::Refused(_)), "{err:?}");
    }

    #[tokio::test]
    async fn environment_none_runs_in_a_private_empty_directory() {
        let f = fixture("ls -A | wc -l; pwd -P");
        std::fs::write(f.dir.path().join("workspace-file"), b"x").unwrap();
        let configuration = ExecutionConfiguration {
            disable_execution_environment: Some(true),
            ..ExecutionConfiguration::default()
        };
        within(f.adapter.prepare(NativePrepare {
            executor_id: executor("ex-none"),
            session_id: Uuid::new(SESSION).unwrap(),
            agent_kind: AgentKind::new(AGENT_KIND).unwrap(),
            configuration,
        }))
        .await
        .unwrap();
        let (tx, mut rx) = mpsc::channel(RUN_EVENT_QUEUE);
        within(f.adapter.start(
            NativeStart {
                executor_id: executor("ex-none"),
                run_id: run("r1"),
                input: vec![],
            },
            tx,
        ))
        .await
        .unwrap();
        let events = until_settled(&mut rx).await;
        assert_eq!(events[0], delta("0\n"), "{events:?}");
        let NativeEvent::Delta { text: dir, .. } = &events[1] else {
            panic!("{events:?}")
        };
        let dir = PathBuf::from(dir.trim_end());
        assert!(dir.is_dir());
        within(f.adapter.close_executor(&executor("ex-none")))
            .await
            .unwrap();
        assert!(!dir.exists());
    }

    #[tokio::test]
    async fn prepare_refuses_a_program_that_vanished_or_is_not_executable() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("prog");
        std::fs::write(&program, "#!/bin/sh\necho hi\n").unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let adapter = CommandAdapter::new(CommandConfig::new(&program, dir.path())).unwrap();
        prepare(&adapter, "ex-1").await;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o644)).unwrap();
        let request = NativePrepare {
            executor_id: executor("ex-2"),
            session_id: Uuid::new(SESSION).unwrap(),
            agent_kind: AgentKind::new(AGENT_KIND).unwrap(),
            configuration: ExecutionConfiguration::default(),
        };
        assert!(matches!(
            within(adapter.prepare(request.clone())).await,
            Err(AdapterError::Refused(_))
        ));
        std::fs::remove_file(&program).unwrap();
        assert!(matches!(
            within(adapter.prepare(request)).await,
            Err(AdapterError::Refused(_))
        ));
    }

    #[test]
    fn construction_validates_the_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let err =
            CommandAdapter::new(CommandConfig::new("/no/such/program", dir.path())).unwrap_err();
        assert_eq!(err.code(), "program_not_found");
        let err = CommandAdapter::new(CommandConfig::new("definitely-not-on-path-xyz", dir.path()))
            .unwrap_err();
        assert_eq!(err.code(), "program_not_found");
        let err = CommandAdapter::new(CommandConfig::new(dir.path(), dir.path())).unwrap_err();
        assert_eq!(err.code(), "program_not_executable");
        let err = CommandAdapter::new(CommandConfig::new("/bin/sh", dir.path().join("missing")))
            .unwrap_err();
        assert_eq!(err.code(), "invalid_working_directory");
        let mut config = CommandConfig::new("/bin/sh", dir.path());
        config.max_processes = 0;
        assert_eq!(
            CommandAdapter::new(config).unwrap_err().code(),
            "invalid_limit"
        );
        // A bare name is looked up in PATH.
        let adapter = CommandAdapter::new(CommandConfig::new("sh", dir.path())).unwrap();
        assert!(adapter.config().program.is_absolute());
    }

    #[test]
    fn declaration_is_honest_and_complete() {
        let dir = tempfile::tempdir().unwrap();
        let adapter = CommandAdapter::new(CommandConfig::new("/bin/sh", dir.path())).unwrap();
        let declarations = adapter.declarations();
        assert_eq!(declarations.len(), 1);
        let d = &declarations[0];
        assert_eq!(d.agent_kind.as_str(), AGENT_KIND);
        assert!(d.available);
        let expected_true = [
            "streaming",
            "preparation",
            "execution_controls",
            "programmatic_tool_calling_disable",
            "subagent_control",
            "environment_none",
            "local_environment",
            "workspace_read_preparation",
            "workspace_output_export",
        ];
        for field in AgentKindCapabilities::FIELDS {
            assert_eq!(
                d.capabilities.get(field),
                Some(expected_true.contains(&field)),
                "{field}"
            );
        }
        assert!(CommandAdapter::capabilities(ProgramProtocol::Plain, StdinMode::Open).steering);
        assert!(
            !CommandAdapter::capabilities(ProgramProtocol::Plain, StdinMode::Open)
                .durable_input_receipts
        );
    }

    #[test]
    fn jsonl_records_decode_strictly() {
        assert_eq!(decode_record(b"  \n"), Ok(None));
        assert_eq!(
            decode_record(b"{\"type\":\"delta\",\"text\":\"hi\"}\n"),
            Ok(Some(ProgramRecord::Delta { text: "hi".into() }))
        );
        let call = decode_record(
            br#"{"type":"tool_call","call_id":"c1","tool_name":"ls","state":"completed","observation":{"kind":"command","summary":"ls -l"}}"#,
        )
        .unwrap()
        .unwrap();
        assert!(matches!(call, ProgramRecord::ToolCall(ref c) if c.call_id.as_str() == "c1"));
        assert_eq!(
            decode_record(br#"{"type":"usage","output_tokens":7}"#),
            Ok(Some(ProgramRecord::Usage(Usage {
                output_tokens: Some(7),
                ..Usage::default()
            })))
        );
        assert_eq!(
            decode_record(br#"{"type":"error","message":"m","http_status":"x"}"#),
            Ok(Some(ProgramRecord::Error {
                message: "m".into(),
                code: None,
                http_status: Some(Value::from("x")),
            }))
        );
        for bad in [
            &br#"{"type":"delta","text":"hi","extra":1}"#[..],
            br#"{"type":"delta"}"#,
            br#"{"type":"shout","text":"hi"}"#,
            br#"{"text":"hi"}"#,
            br#"{"type":"usage","output_tokens":-1}"#,
            br#"{"type":"tool_call","call_id":"c1","tool_name":"ls","state":"running","observation":{"kind":"k","summary":"s"}}"#,
            b"[1,2]",
            b"delta hi",
        ] {
            let err = decode_record(bad).unwrap_err();
            assert_eq!(err.code(), "invalid_record", "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(decode_record(b"{\xff}\n"), Err(RecordError::NotUtf8));
        // The bound counts the `\n`, present or missing.
        let mut long = vec![b' '; JSONL_RECORD_MAX_BYTES - 1];
        long.push(b'\n');
        assert_eq!(decode_record(&long), Ok(None));
        long.pop();
        long.push(b' ');
        assert_eq!(
            decode_record(&long),
            Err(RecordError::TooLong {
                max: JSONL_RECORD_MAX_BYTES
            })
        );
    }

    #[test]
    fn jsonl_input_lines_carry_the_content_parts() {
        let line = jsonl_input_line(
            INITIAL_INPUT_ID,
            &[message(vec![text("a")]), message(vec![text("b\nc")])],
        )
        .unwrap();
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        let record: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            record,
            serde_json::json!({"type": "input", "input_id": "initial", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b\nc"}]})
        );
        assert!(matches!(
            jsonl_input_line("i1", &[message(vec![image()])]),
            Err(AdapterError::Refused(_))
        ));
    }

    #[tokio::test]
    async fn jsonl_run_streams_typed_events_and_confirms_written_inputs() {
        let f = fixture_jsonl(concat!(
            "read first; printf '%s\\n' \"$first\" > initial.jsonl; ",
            r#"echo '{"type":"delta","text":"one"}'; "#,
            r#"echo '{"type":"tool_call","call_id":"c1","tool_name":"t","state":"started","observation":{"kind":"command","summary":"s"}}'; "#,
            "read second; printf '%s\\n' \"$second\" > active.jsonl; ",
            r#"echo '{"type":"accepted","input_id":"initial"}'; "#,
            r#"echo '{"type":"accepted","input_id":"i1"}'; "#,
            r#"echo '{"type":"usage","input_tokens":3}'"#,
        ));
        let mut rx = start(&f.adapter, "r1", vec![message(vec![text("hello")])]).await;
        assert_eq!(next(&mut rx).await, delta("one"));
        assert!(matches!(next(&mut rx).await, NativeEvent::ToolCall(_)));
        // The Turn's own ID is reserved; a real input is written as one record.
        let reserved = within(f.adapter.write_input(
            &run("r1"),
            &InputId::new(INITIAL_INPUT_ID).unwrap(),
            &[message(vec![text("x")])],
        ))
        .await;
        assert!(
            matches!(reserved, Err(AdapterError::Refused(_))),
            "{reserved:?}"
        );
        within(f.adapter.write_input(
            &run("r1"),
            &InputId::new("i1").unwrap(),
            &[message(vec![text("more")])],
        ))
        .await
        .unwrap();
        assert_eq!(
            until_settled(&mut rx).await,
            vec![
                NativeEvent::InputAccepted {
                    input_id: InputId::new("i1").unwrap()
                },
                NativeEvent::Usage(Usage {
                    input_tokens: Some(3),
                    ..Usage::default()
                }),
                settled(Outcome::Completed)
            ]
        );
        let initial = std::fs::read_to_string(f.dir.path().join("initial.jsonl")).unwrap();
        assert_eq!(
            initial,
            jsonl_input_line(INITIAL_INPUT_ID, &[message(vec![text("hello")])]).unwrap()
        );
        let active = std::fs::read_to_string(f.dir.path().join("active.jsonl")).unwrap();
        assert_eq!(
            active,
            jsonl_input_line("i1", &[message(vec![text("more")])]).unwrap()
        );
    }

    /// Runs `script` (jsonl) to its end; returns every event.
    async fn jsonl_events(script: &str) -> Vec<NativeEvent> {
        let f = fixture_jsonl(script);
        let mut rx = start(&f.adapter, "r1", vec![message(vec![text("go")])]).await;
        let events = until_settled(&mut rx).await;
        // The Run's process group is gone once it settled.
        assert!(f.adapter.shared.lock().runs.is_empty());
        events
    }

    #[tokio::test]
    async fn malformed_records_fail_the_run_and_stop_the_program() {
        let cases = [
            (
                r#"echo '{"type":"delta","text":"ok"}'; echo 'not json'; echo '{"type":"delta","text":"late"}'; sleep 1000"#,
                "stdout record 2: not a valid record",
            ),
            (
                r#"echo '{"type":"accepted","input_id":"never"}'; sleep 1000"#,
                "(unknown_input)",
            ),
            (
                "head -c 1100000 /dev/zero | tr '\\0' a; echo; sleep 1000",
                "(record_too_long)",
            ),
            // A violation fails the Run even when the program then exits 0.
            (
                r#"echo '{"type":"delta","txt":"x"}'"#,
                "unknown field `txt`",
            ),
        ];
        for (script, expected) in cases {
            let events = jsonl_events(script).await;
            let n = events.len();
            assert!(n >= 2, "{events:?}");
            let message = error_message(&events[n - 2]);
            assert!(
                message.starts_with("program protocol violation: stdout record ")
                    && message.contains(expected),
                "{script}: {message}"
            );
            assert_eq!(events[n - 1], settled(Outcome::Failed));
            assert!(!events.contains(&delta("late")), "{events:?}");
        }
    }

    #[tokio::test]
    async fn a_reported_error_is_the_failure_of_a_non_zero_exit() {
        let events = jsonl_events(
            r#"echo '{"type":"error","message":"quota","code":"usage_limit_exceeded","http_status":429}'; exit 3"#,
        )
        .await;
        assert_eq!(
            events,
            vec![
                NativeEvent::Error {
                    message: "quota".into(),
                    code: Some(Value::from("usage_limit_exceeded")),
                    http_status: Some(Value::from(429)),
                },
                settled(Outcome::Failed)
            ]
        );
        // Without an error record, the exit status is reported as in plain mode.
        let events = jsonl_events("exit 4").await;
        assert!(error_message(&events[0]).contains("status 4"), "{events:?}");
    }

    #[tokio::test]
    async fn jsonl_cancel_kills_the_whole_tree() {
        let f = fixture_jsonl(r#"sleep 1000 & echo "{\"type\":\"delta\",\"text\":\"$!\"}"; wait"#);
        let mut rx = start(&f.adapter, "r1", vec![message(vec![text("go")])]).await;
        let child = pid_of(&next(&mut rx).await);
        assert_eq!(
            within(f.adapter.cancel(&run("r1"))).await,
            Ok(CancelSettlement::StreamSettles)
        );
        assert_eq!(
            until_settled(&mut rx).await,
            vec![settled(Outcome::Cancelled)]
        );
        assert_gone(child);
    }

    #[test]
    fn jsonl_requires_open_stdin_and_declares_its_receipts() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = CommandConfig::new("/bin/sh", dir.path());
        config.protocol = ProgramProtocol::Jsonl;
        let err = CommandAdapter::new(config.clone()).unwrap_err();
        assert_eq!(err.code(), "incompatible_options");
        config.stdin = StdinMode::Open;
        let adapter = CommandAdapter::new(config).unwrap();
        let caps = &adapter.declarations()[0].capabilities;
        let expected_true = [
            "streaming",
            "steering",
            "durable_turns",
            "durable_input_receipts",
            "preparation",
            "execution_controls",
            "tool_observations",
            "usage",
            "programmatic_tool_calling_disable",
            "subagent_control",
            "environment_none",
            "local_environment",
            "workspace_read_preparation",
            "workspace_output_export",
        ];
        for field in AgentKindCapabilities::FIELDS {
            assert_eq!(
                caps.get(field),
                Some(expected_true.contains(&field)),
                "{field}"
            );
        }
    }

    #[tokio::test]
    async fn interactions_and_function_results_are_unsupported() {
        let f = fixture("true");
        let r = run("r1");
        let id = InteractionId::new("q1").unwrap();
        assert!(matches!(
            f.adapter
                .resolve_permission(&r, &id, PermissionVerdict::Allow)
                .await,
            Err(AdapterError::Unsupported(_))
        ));
        assert!(matches!(
            f.adapter
                .function_result(&r, &CallId::new("c1").unwrap(), "out", false)
                .await,
            Err(AdapterError::Unsupported(_))
        ));
    }
}
