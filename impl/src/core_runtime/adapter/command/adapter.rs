//! The adapter's state (Executors, Runs, leftovers) and its constructor.

use super::*;

/// Why a Run's program is being stopped by the adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StopReason {
    /// `prompt_cancel`.
    Cancel,
    /// `close_executor`, or the adapter was dropped.
    Close,
}

/// How a Run ended, as seen by waiting cancels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RunEnd {
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
pub(super) struct StdinPipe {
    pub(super) pipe: Option<ChildStdin>,
    /// A write was started and not finished (its future was dropped): the pipe may
    /// hold part of a line, so later writes are refused.
    pub(super) interrupted: bool,
}

pub(super) type SharedStdin = Arc<tokio::sync::Mutex<StdinPipe>>;

/// One live Run.
pub(super) struct RunEntry {
    pub(super) executor_id: ExecutorId,
    /// PID of the process the adapter spawned (the supervisor when supervised): Tokio
    /// reaps it, so an adopted-process sweep must leave it alone.
    pub(super) child_pid: i32,
    pub(super) stop: watch::Sender<Option<StopReason>>,
    pub(super) ended: watch::Receiver<Option<RunEnd>>,
    /// `Some` with [`StdinMode::Open`].
    pub(super) stdin: Option<SharedStdin>,
    /// `Some` with [`ProgramProtocol::Jsonl`].
    pub(super) jsonl: Option<Arc<JsonlRun>>,
}

/// One prepared Executor.
pub(super) struct ExecutorEntry {
    pub(super) session_id: Uuid,
    /// Private empty working directory of an Executor without an execution
    /// environment; removed on close.
    pub(super) scratch: Option<PathBuf>,
}

/// A process group that survived SIGKILL past [`KILL_CONFIRM_TIMEOUT`].
pub(super) struct Leftover {
    pub(super) pgid: Pid,
    pub(super) _permit: OwnedSemaphorePermit,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) executors: HashMap<ExecutorId, ExecutorEntry>,
    pub(super) runs: HashMap<RunId, RunEntry>,
    pub(super) leftovers: HashMap<ExecutorId, Vec<Leftover>>,
}

pub(super) struct Shared {
    pub(super) config: CommandConfig,
    /// `PASSED_ENV` values captured at construction.
    pub(super) env: Vec<(OsString, OsString)>,
    pub(super) state: Mutex<State>,
    pub(super) permits: Arc<Semaphore>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The `command` Harness adapter (see the module documentation).
pub struct CommandAdapter {
    pub(super) shared: Arc<Shared>,
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
        // Scratch directories of a Runtime that was killed before it could remove them.
        crate::process::scratch::sweep_stale(&std::env::temp_dir());
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
    pub(super) fn stdin_of(
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

/// Marks the Runtime a child subreaper (see "Process reaping" in the module docs).
pub(super) fn become_subreaper() {
    if let Err(e) = crate::process::group::become_subreaper() {
        tracing::warn!(error = %e, "command adapter: cannot become a child subreaper; orphaned grandchildren may not be confirmed gone");
    }
}

pub(super) fn request_stop(stop: &watch::Sender<Option<StopReason>>, reason: StopReason) {
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
/// It lives under the Runtime's scratch root ([`crate::process::scratch`]), so a
/// directory a SIGKILLed Runtime left is swept by a supervisor or the next start.
pub(super) fn create_scratch() -> io::Result<PathBuf> {
    crate::process::scratch::create_dir("command-")
}

pub(super) fn remove_scratch(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
