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
//!
//! With [`CommandConfig::supervisor`] set (the CLI always sets it) each program runs
//! under `contract-impl worker supervise`, a child subreaper of its own per Run, which
//! holds a watch connection to the Runtime: the program's group is the
//! Run's group as above, and when the program ends, the Run settles, or the Runtime goes
//! away by any means (SIGKILL included), the supervisor SIGKILLs the group and every
//! descendant re-parented to it, a `setsid` one included, and reaps them. Chosen over
//! `PR_SET_PDEATHSIG` (it reaches the direct child only, and fires on the death of the
//! spawning *thread*) and over a cgroup (it needs a delegated cgroup tree this
//! unprivileged Runtime cannot count on); the worker and plugin hosts use the same
//! supervisor.
//! Should the supervisor itself be killed outright (SIGKILL: it cannot sweep), the
//! Runtime kills the program's group, and the descendants that left it, now re-parented
//! to the Runtime, are found in `/proc`, killed and reaped
//! ([`crate::process::adopted`]). A Run without an execution environment works in a
//! scratch directory under the Runtime's locked scratch root
//! ([`crate::process::scratch`]); a SIGKILLed Runtime's root is removed by the
//! supervisors of its Runs or at the next start. The one case nothing covers: the
//! Runtime and a Run's supervisor both killed outright at the same moment leave nobody
//! to notice, and the program and its descendants live on (a cgroup would reach them;
//! see above why the Runtime does not count on one).
//! # Limits (what the adapter cannot do)
//! * Without a supervisor (a library user leaving [`CommandConfig::supervisor`] unset),
//!   a process that leaves the Run's process group (`setsid`, `setpgid`) escapes the
//!   group signals, and a SIGKILLed Runtime leaves its running programs alive (they see
//!   EOF / `EPIPE` on their pipes). A graceful Runtime shutdown closes every Executor,
//!   which terminates their groups either way.
//! * A process that double-forks out of the supervisor's tree before the sweep (its
//!   parent chain already gone) is still re-parented to the supervisor, so it is
//!   swept too; only a process that escapes by other means (a new PID namespace) is out
//!   of reach.
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

mod adapter;
mod config;
mod harness;
mod jsonl;
mod output;
mod stdin;
mod supervision;
mod supervisor;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::process::supervise::{SCRATCH_BASE_ENV, WATCH_ENV};
use crate::process::{OutputTail, ProcessGroup};

use super::{
    AdapterError, CancelSettlement, HarnessAdapter, NativeEvent, NativePrepare, NativeStart,
    RunEventSink,
};
use crate::core_runtime::wire::{
    AgentKind, AgentKindCapabilities, AgentKindDeclaration, CallId, ContentPart, ExecutorId,
    InputId, InteractionId, MessageInput, Outcome, OutputFormat, PermissionVerdict,
    PromptForUserChoiceDecision, RunId, ToolCall, Usage, Uuid,
};

pub use adapter::*;
pub use config::*;
pub use jsonl::*;
use output::*;
use stdin::*;
use supervision::*;
use supervisor::SupervisorWatch;

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
/// empty (the shared [`crate::process::group`] bound). With the defaults a cancel is
/// confirmed or failed within `DEFAULT_KILL_GRACE + 2 × KILL_CONFIRM_TIMEOUT` = 8 s,
/// inside the spec's 15 s cancel budget ("Active-input receipts"); also the period of
/// polling a group for emptiness, [`GROUP_POLL_INTERVAL`].
pub use crate::process::group::{GROUP_POLL_INTERVAL, KILL_CONFIRM_TIMEOUT};

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
