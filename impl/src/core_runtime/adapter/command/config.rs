//! Configuration: the program, its protocol and stdin mode, bounds and graces; resolving and checking the program.

use super::*;

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
    /// The `contract-impl` executable that supervises each program
    /// (`contract-impl worker supervise`, see "Process reaping" in the module docs):
    /// with it no process of a Run outlives the Runtime, not even one that called
    /// `setsid`, and not after the Runtime was SIGKILLed. `None` spawns the program
    /// directly (the documented limits then apply); the CLI always sets it.
    pub supervisor: Option<PathBuf>,
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
            supervisor: None,
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

pub(super) fn is_executable_file(path: &Path) -> bool {
    check_program(path).is_ok()
}
