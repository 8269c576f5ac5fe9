//! Launching a target: the run directory, the process, its stderr tail, readiness and
//! the process-group kill.
//!
//! * [`RunDir`]: one short temporary directory per run under `/tmp` holding the control
//!   socket path (checked against the Unix `sun_path` limit before anything binds it),
//!   the launch configuration file, the workspace (seeded from the scenario) and the
//!   target's working directory.
//! * [`Target`]: the target process. [`Target::spawn`] splits `--target-cmd` like a POSIX
//!   shell would (no shell involved), starts it in a **new process group** with the given
//!   environment, captures stderr and stdout into bounded [`StderrTail`]s (last
//!   [`STDERR_TAIL_LINES`] lines, at most [`STDERR_TAIL_BYTES`], each) and scans every
//!   output byte for a secret ([`redact_secret`] keeps it out of messages).
//!   [`resolve_program`] checks a command's program up front. [`Target::await_ready`] races a readiness future against the
//!   process exiting and the start-up deadline ([`Target::await_ready_or_exit`] reports
//!   an exit as an outcome instead of an error, for scenarios that expect one);
//!   [`Target::wait_exit`] awaits the exit itself. [`Target::shutdown`] sends `SIGTERM` to
//!   the group, waits up to [`TERM_GRACE`], then `SIGKILL`s the group; dropping a
//!   [`Target`] that was not shut down `SIGKILL`s the group at once (failure and panic
//!   paths included).
//!
//! This module knows nothing about protocol families: what the environment holds and
//! what "ready" means are the family driver's business. It must never leave a process
//! group running behind it.

use std::future::Future;
use std::path::{Component, Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use contract_impl::process::{OutputTail, ProcessGroup};
use nix::sys::signal::Signal;
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::scenario::GeneratedContent;

/// Most stderr lines kept for failure messages.
pub const STDERR_TAIL_LINES: usize = 64;
/// Most stderr bytes kept for failure messages (longer lines are cut).
pub const STDERR_TAIL_BYTES: usize = 16 * 1024;
/// How long the target may take to exit after `SIGTERM` before the group is `SIGKILL`ed.
pub const TERM_GRACE: Duration = Duration::from_secs(2);
/// Longest Unix socket path (bytes) that fits `sun_path` (108 bytes with the NUL) on
/// Linux; some systems allow less, so the run directory is kept short.
pub const UNIX_SOCKET_PATH_MAX_BYTES: usize = 107;
/// Longest stdout line forwarded to [`Target::take_stdout_lines`] (bytes); a longer line
/// is forwarded cut to one byte more, so the reader can tell it was too long.
pub const FORWARDED_LINE_MAX_BYTES: usize = 4096;
/// Most stdout lines queued for [`Target::take_stdout_lines`]; further lines are not
/// forwarded until the reader catches up (they are still tailed and scanned).
pub const FORWARDED_LINES_MAX: usize = 64;
/// Bound on waiting for the stderr reader to reach end-of-file after the target exited
/// (a grandchild that left the process group could keep the pipe open).
const STDERR_DRAIN_BOUND: Duration = Duration::from_secs(1);

/// Size of the buffer generated content is written through (bytes).
const GENERATED_CHUNK_BYTES: usize = 64 * 1024;

/// Failure to prepare, launch or stop a target. Every variant has a stable
/// [`code`](Self::code); messages name the path, command or deadline involved.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// `--target-cmd` is empty or has unbalanced quotes.
    #[error("invalid target command {command:?}: {reason}")]
    BadCommand {
        /// The command as given.
        command: String,
        /// Why it cannot be split.
        reason: String,
    },
    /// The program of the command does not exist, is not a file or is not executable
    /// (checked up front by [`resolve_program`]).
    #[error("target program {program:?} {reason}")]
    ProgramNotFound {
        /// The program (first word of the command).
        program: String,
        /// What is wrong, e.g. `is not on PATH`.
        reason: String,
    },
    /// The program could not be started.
    #[error("cannot start target program {program:?}: {source}")]
    Spawn {
        /// The program (first word of the command).
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The run directory or one of its files could not be created.
    #[error("cannot prepare {path}: {source}")]
    RunDir {
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A Unix socket path longer than `sun_path` allows.
    #[error(
        "unix socket path {path} is {len} bytes; a Unix socket path must be at most {max} bytes \
         (sun_path is 108 bytes including the NUL): use a shorter temporary directory"
    )]
    SocketPathTooLong {
        /// The offending path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A workspace seed path that is absolute or escapes the workspace.
    #[error("workspace seed path {0:?} must be relative and stay inside the workspace")]
    BadSeedPath(String),
    /// A generated workspace file larger than
    /// [`GENERATED_FILE_MAX_BYTES`](crate::scenario::GENERATED_FILE_MAX_BYTES).
    #[error("generated workspace file {path:?}: {size} bytes exceed the {max}-byte bound")]
    SeedTooLarge {
        /// The file's workspace-relative path.
        path: String,
        /// The requested size.
        size: u64,
        /// The bound.
        max: u64,
    },
    /// The target exited before it was ready.
    #[error("target exited before it was ready ({status}); stderr tail:\n{stderr}")]
    ExitedEarly {
        /// Exit status as text.
        status: String,
        /// The stderr tail.
        stderr: String,
    },
    /// The target was not ready within the start-up deadline.
    #[error("target not ready within {}ms; stderr tail:\n{stderr}", .after.as_millis())]
    StartupTimeout {
        /// The deadline.
        after: Duration,
        /// The stderr tail.
        stderr: String,
    },
    /// Waiting for the target process failed (an OS error, not an exit).
    #[error("waiting for the target process failed: {0}")]
    WaitFailed(#[source] std::io::Error),
    /// The readiness check itself failed (e.g. a malformed hello line).
    #[error("target readiness failed: {reason}; stderr tail:\n{stderr}")]
    NotReady {
        /// What went wrong.
        reason: String,
        /// The stderr tail.
        stderr: String,
    },
}

impl TargetError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            TargetError::BadCommand { .. } => "bad_target_command",
            TargetError::ProgramNotFound { .. } => "program_not_found",
            TargetError::Spawn { .. } => "spawn_failed",
            TargetError::RunDir { .. } => "run_dir_failed",
            TargetError::SocketPathTooLong { .. } => "socket_path_too_long",
            TargetError::BadSeedPath(_) => "bad_seed_path",
            TargetError::SeedTooLarge { .. } => "seed_too_large",
            TargetError::ExitedEarly { .. } => "exited_early",
            TargetError::StartupTimeout { .. } => "startup_timeout",
            TargetError::NotReady { .. } => "not_ready",
            TargetError::WaitFailed(_) => "wait_failed",
        }
    }
}

/// Checks that `path` fits a Unix socket address.
///
/// # Errors
/// [`TargetError::SocketPathTooLong`] naming the path and the limit.
pub fn check_socket_path(path: &Path) -> Result<(), TargetError> {
    let len = path.as_os_str().len();
    if len > UNIX_SOCKET_PATH_MAX_BYTES {
        return Err(TargetError::SocketPathTooLong {
            path: path.to_path_buf(),
            len,
            max: UNIX_SOCKET_PATH_MAX_BYTES,
        });
    }
    Ok(())
}

/// The per-run temporary directory (`/tmp/crh-XXXXXX`), removed when dropped.
///
/// Layout: `control.sock` (control socket path), `launch.json` (launch configuration),
/// `workspace/` (`CONTRACT_WORKSPACE`), `cwd/` (the target's working directory).
#[derive(Debug)]
pub struct RunDir {
    dir: tempfile::TempDir,
}

impl RunDir {
    /// Creates the directory and its `workspace/` and `cwd/` subdirectories, and checks
    /// the control socket path length.
    ///
    /// # Errors
    /// [`TargetError::RunDir`], [`TargetError::SocketPathTooLong`].
    pub fn new() -> Result<Self, TargetError> {
        let base = Path::new("/tmp");
        let dir = tempfile::Builder::new()
            .prefix("crh-")
            .tempdir_in(base)
            .map_err(|source| TargetError::RunDir {
                path: base.to_path_buf(),
                source,
            })?;
        // Private to this user whatever the umask and the temporary-directory library do.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(|source| TargetError::RunDir {
            path: dir.path().to_path_buf(),
            source,
        })?;
        let run = Self { dir };
        for sub in [run.workspace(), run.cwd()] {
            std::fs::create_dir(&sub)
                .map_err(|source| TargetError::RunDir { path: sub, source })?;
        }
        check_socket_path(&run.control_socket())?;
        Ok(run)
    }

    /// The run directory itself.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where the harness listens for the controlled adapter.
    pub fn control_socket(&self) -> PathBuf {
        self.path().join("control.sock")
    }

    /// The launch configuration file.
    pub fn config_file(&self) -> PathBuf {
        self.path().join("launch.json")
    }

    /// The workspace directory (absolute).
    pub fn workspace(&self) -> PathBuf {
        self.path().join("workspace")
    }

    /// The target's working directory.
    pub fn cwd(&self) -> PathBuf {
        self.path().join("cwd")
    }

    /// Writes `contents` to the launch configuration file.
    ///
    /// # Errors
    /// [`TargetError::RunDir`].
    pub fn write_config(&self, contents: &str) -> Result<PathBuf, TargetError> {
        let path = self.config_file();
        std::fs::write(&path, contents).map_err(|source| TargetError::RunDir {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    /// Creates the seed `dirs` and `files` (relative path → contents) in the workspace,
    /// with parent directories as needed.
    ///
    /// # Errors
    /// [`TargetError::BadSeedPath`] for an absolute path or one with `..`;
    /// [`TargetError::RunDir`] on I/O failure.
    pub fn seed_workspace<'a>(
        &self,
        files: impl IntoIterator<Item = (&'a String, &'a String)>,
        dirs: impl IntoIterator<Item = &'a String>,
    ) -> Result<(), TargetError> {
        let root = self.workspace();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TargetError::RunDir { path, source }
        };
        for dir in dirs {
            let path = root.join(safe_relative(dir)?);
            std::fs::create_dir_all(&path).map_err(io(&path))?;
        }
        for (name, contents) in files {
            let path = root.join(safe_relative(name)?);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            std::fs::write(&path, contents).map_err(io(&path))?;
        }
        Ok(())
    }

    /// Creates the workspace file `path` with `size` bytes of [`GeneratedContent`] from
    /// `seed`, written in bounded chunks (never held in memory whole), with parent
    /// directories as needed.
    ///
    /// # Errors
    /// [`TargetError::BadSeedPath`]; [`TargetError::SeedTooLarge`] over
    /// [`GENERATED_FILE_MAX_BYTES`](crate::scenario::GENERATED_FILE_MAX_BYTES);
    /// [`TargetError::RunDir`] on I/O failure.
    pub fn write_generated(&self, path: &str, size: u64, seed: u64) -> Result<(), TargetError> {
        let mut content = GeneratedContent::new(seed);
        self.write_sized(path, size, &mut |buf| content.fill(buf))
    }

    /// Creates the workspace file `path` with `size` bytes of text: `text.prefix`, then
    /// `text.fill` repeated (the `text` form of a generated file).
    ///
    /// # Errors
    /// As [`RunDir::write_generated`].
    pub fn write_text(
        &self,
        path: &str,
        size: u64,
        text: &crate::scenario::GeneratedText,
    ) -> Result<(), TargetError> {
        let prefix = text.prefix.as_bytes();
        let fill = text.fill.as_bytes().first().copied().unwrap_or(b'x');
        let mut at = 0usize;
        self.write_sized(path, size, &mut |buf| {
            for byte in buf {
                *byte = prefix.get(at).copied().unwrap_or(fill);
                at = at.saturating_add(1);
            }
        })
    }

    fn write_sized(
        &self,
        path: &str,
        size: u64,
        content: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), TargetError> {
        use std::io::Write as _;
        let max = crate::scenario::GENERATED_FILE_MAX_BYTES;
        if size > max {
            return Err(TargetError::SeedTooLarge {
                path: path.to_string(),
                size,
                max,
            });
        }
        let full = self.workspace().join(safe_relative(path)?);
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| TargetError::RunDir { path: p, source }
        };
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let file = std::fs::File::create(&full).map_err(io(&full))?;
        let mut out = std::io::BufWriter::new(file);
        let mut buf = vec![0u8; GENERATED_CHUNK_BYTES];
        let mut left = size;
        while left > 0 {
            let n = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
            content(&mut buf[..n]);
            out.write_all(&buf[..n]).map_err(io(&full))?;
            left -= n as u64;
        }
        out.flush().map_err(io(&full))?;
        Ok(())
    }

    /// Creates each symlink `path` → `target` in the workspace (parents created; an
    /// existing entry at `path` is replaced). The target is written as it is: the scenario
    /// checks ([`crate::scenario::validation::symlink_stays_inside`]) keep it inside.
    ///
    /// # Errors
    /// [`TargetError::BadSeedPath`]; [`TargetError::RunDir`] on I/O failure.
    pub fn seed_symlinks<'a>(
        &self,
        links: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<(), TargetError> {
        let root = self.workspace();
        for (link, target) in links {
            if !crate::scenario::validation::symlink_stays_inside(link, target) {
                return Err(TargetError::BadSeedPath(format!("{link} -> {target}")));
            }
            let path = root.join(safe_relative(link)?);
            let io = |source| TargetError::RunDir {
                path: path.clone(),
                source,
            };
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            if std::fs::symlink_metadata(&path).is_ok() {
                std::fs::remove_file(&path).map_err(io)?;
            }
            std::os::unix::fs::symlink(target, &path).map_err(io)?;
        }
        Ok(())
    }

    /// Applies a whole seed to the workspace: `dirs`, `files`, `generated`, `symlinks`.
    ///
    /// # Errors
    /// As [`RunDir::seed_workspace`], [`RunDir::seed_generated`] and
    /// [`RunDir::seed_symlinks`].
    pub fn seed(&self, seed: &crate::scenario::WorkspaceSeed) -> Result<(), TargetError> {
        self.seed_workspace(seed.files.iter(), seed.dirs.iter())?;
        self.seed_generated(&seed.generated)?;
        self.seed_symlinks(seed.symlinks.iter())
    }

    /// Writes every generated file of a scenario's workspace seed.
    ///
    /// # Errors
    /// As [`RunDir::write_generated`].
    pub fn seed_generated(
        &self,
        files: &[crate::scenario::GeneratedFile],
    ) -> Result<(), TargetError> {
        for file in files {
            match &file.text {
                Some(text) => self.write_text(&file.path, file.size, text)?,
                None => self.write_generated(&file.path, file.size, file.seed)?,
            }
        }
        Ok(())
    }
}

fn safe_relative(path: &str) -> Result<&Path, TargetError> {
    let p = Path::new(path);
    let ok = !path.is_empty()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if ok {
        Ok(p)
    } else {
        Err(TargetError::BadSeedPath(path.to_string()))
    }
}

/// The last lines a target wrote to stderr (or stdout), bounded by
/// [`STDERR_TAIL_LINES`] and [`STDERR_TAIL_BYTES`] (a single longer line is cut, marked
/// with `…`): the shared [`OutputTail`], with terminal colours removed from its text.
#[derive(Debug)]
pub struct StderrTail(OutputTail);

impl Default for StderrTail {
    fn default() -> Self {
        Self(OutputTail::new(
            STDERR_TAIL_LINES,
            STDERR_TAIL_BYTES,
            STDERR_TAIL_BYTES,
        ))
    }
}

impl StderrTail {
    /// Appends raw output bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.0.push(chunk);
    }

    /// The tail as text: complete lines, then any unterminated last line; terminal
    /// escape sequences (colours) are removed.
    pub fn text(&self) -> String {
        strip_ansi(&self.0.text())
    }
}

/// Removes ANSI CSI escape sequences (`ESC [ … final-byte`) and other lone `ESC`s.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, then one final byte in 0x40..=0x7e.
            for c in chars.by_ref() {
                if ('\u{40}'..='\u{7e}').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

/// Finds `needle` in a byte stream delivered in chunks (matches across chunk borders).
#[derive(Debug)]
struct StreamScanner {
    needle: Vec<u8>,
    carry: Vec<u8>,
}

impl StreamScanner {
    fn new(needle: &str) -> Self {
        Self {
            needle: needle.as_bytes().to_vec(),
            carry: Vec::new(),
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> bool {
        if self.needle.is_empty() {
            return false;
        }
        let mut window = std::mem::take(&mut self.carry);
        window.extend_from_slice(chunk);
        let found = window
            .windows(self.needle.len())
            .any(|w| w == self.needle.as_slice());
        let keep = self.needle.len() - 1;
        self.carry = window[window.len().saturating_sub(keep)..].to_vec();
        found
    }
}

/// How to launch a target.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The command line (`--target-cmd`), split like a POSIX shell would.
    pub command: String,
    /// Environment variables added to the harness's own environment.
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: PathBuf,
    /// A secret that must never appear on stderr or stdout (empty: no scan).
    pub secret: String,
    /// Also forward stdout's complete lines ([`Target::take_stdout_lines`]), for targets
    /// that announce readiness on stdout. Stdout is always tailed and scanned.
    pub capture_stdout: bool,
    /// Stdin is a pipe the harness holds ([`Target::take_stdin`]) instead of
    /// `/dev/null`: for targets that read their host's death from its end (a plugin).
    pub stdin_pipe: bool,
}

/// What happened first while a target was starting ([`Target::await_ready_or_exit`]).
#[derive(Debug)]
pub enum Startup<T> {
    /// The readiness future completed first, with this value.
    Ready(T),
    /// The process exited first, with this status.
    Exited(ExitStatus),
}

/// A running target process in its own process group.
#[derive(Debug)]
pub struct Target {
    child: Child,
    group: ProcessGroup,
    tail: Arc<Mutex<StderrTail>>,
    secret_seen: Arc<AtomicBool>,
    stderr_task: Option<JoinHandle<()>>,
    stdout_tail: Arc<Mutex<StderrTail>>,
    stdout_secret_seen: Arc<AtomicBool>,
    stdout_task: Option<JoinHandle<()>>,
    stdout_lines: Option<mpsc::Receiver<Vec<u8>>>,
    exit: Option<ExitStatus>,
    stopped: bool,
}

impl Target {
    /// Splits the command and starts it (stdin is `/dev/null` unless
    /// [`LaunchSpec::stdin_pipe`]; stdout and stderr are
    /// captured into bounded tails and scanned for the secret; with
    /// [`LaunchSpec::capture_stdout`] stdout's lines are also forwarded). A relative
    /// program path containing `/` is resolved against the harness's working directory;
    /// a bare name is looked up in `PATH`.
    ///
    /// # Errors
    /// [`TargetError::BadCommand`], [`TargetError::Spawn`].
    pub fn spawn(spec: &LaunchSpec) -> Result<Self, TargetError> {
        let words = split_command(&spec.command)?;
        let (program, args) = words.split_first().ok_or_else(|| TargetError::BadCommand {
            command: spec.command.clone(),
            reason: "empty command".into(),
        })?;
        // A relative program path with a `/` means "relative to where the harness runs",
        // not to the target's fresh working directory.
        let program_path = Path::new(program);
        let program_path = if program.contains('/') && program_path.is_relative() {
            std::env::current_dir()
                .map(|cwd| cwd.join(program_path))
                .unwrap_or_else(|_| program_path.to_path_buf())
        } else {
            program_path.to_path_buf()
        };
        let mut command = Command::new(&program_path);
        command
            .args(args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&spec.cwd)
            .stdin(if spec.stdin_pipe {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        // The watchdog runs before the spawn, so the registration below is one write.
        contract_impl::process::watchdog::start();
        let mut child = command.spawn().map_err(|source| TargetError::Spawn {
            program: program.clone(),
            source,
        })?;
        let pid = child.id().ok_or_else(|| TargetError::Spawn {
            program: program.clone(),
            source: std::io::Error::other("the process exited before its id was read"),
        })?;
        let group = ProcessGroup::of_leader(pid);
        // A target never outlives the harness, even one killed outright (SIGKILL skips
        // `kill_on_drop` and the group kill of `Drop`).
        contract_impl::process::watchdog::register(group);
        let tail = Arc::new(Mutex::new(StderrTail::default()));
        let secret_seen = Arc::new(AtomicBool::new(false));
        let stderr_task = child.stderr.take().map(|stderr| {
            tokio::spawn(read_output(
                stderr,
                tail.clone(),
                StreamScanner::new(&spec.secret),
                secret_seen.clone(),
                None,
            ))
        });
        let stdout_tail = Arc::new(Mutex::new(StderrTail::default()));
        let stdout_secret_seen = Arc::new(AtomicBool::new(false));
        let (lines_tx, lines_rx) = if spec.capture_stdout {
            let (tx, rx) = mpsc::channel(FORWARDED_LINES_MAX);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let stdout_task = child.stdout.take().map(|stdout| {
            tokio::spawn(read_output(
                stdout,
                stdout_tail.clone(),
                StreamScanner::new(&spec.secret),
                stdout_secret_seen.clone(),
                lines_tx,
            ))
        });
        Ok(Self {
            child,
            group,
            tail,
            secret_seen,
            stderr_task,
            stdout_tail,
            stdout_secret_seen,
            stdout_task,
            stdout_lines: lines_rx,
            exit: None,
            stopped: false,
        })
    }

    /// The target's complete stdout lines (without the `\n`; a line longer than
    /// [`FORWARDED_LINE_MAX_BYTES`] arrives cut to one byte more), once, only with
    /// [`LaunchSpec::capture_stdout`]. The channel ends with stdout. Dropping the
    /// receiver is fine: stdout keeps being tailed and scanned.
    pub fn take_stdout_lines(&mut self) -> Option<mpsc::Receiver<Vec<u8>>> {
        self.stdout_lines.take()
    }

    /// The write end of the target's stdin, once, with [`LaunchSpec::stdin_pipe`];
    /// dropping it is the end of the target's stdin.
    pub fn take_stdin(&mut self) -> Option<tokio::process::ChildStdin> {
        self.child.stdin.take()
    }

    /// Kills the whole process group with `SIGKILL` at once (no `SIGTERM`, no grace: a
    /// crash), reaps the process and drains stderr. Returns the exit status.
    ///
    /// # Errors
    /// [`TargetError::WaitFailed`].
    pub async fn kill_now(&mut self) -> Result<ExitStatus, TargetError> {
        self.group.signal(Signal::SIGKILL);
        self.stopped = true;
        self.wait_exit().await
    }

    /// Sends `SIGTERM` to the whole process group and returns at once (a `terminate:`
    /// step); the exit is awaited by a later `expect_exit` or at the end of the run.
    pub fn terminate(&self) {
        self.group.signal(Signal::SIGTERM);
    }

    /// The process (and process group) ID.
    pub fn pid(&self) -> i32 {
        self.group.id().as_raw()
    }

    /// The current stderr tail.
    pub fn stderr_tail(&self) -> String {
        self.tail.lock().map(|t| t.text()).unwrap_or_default()
    }

    /// The current stdout tail (same bounds as the stderr tail).
    pub fn stdout_tail(&self) -> String {
        self.stdout_tail
            .lock()
            .map(|t| t.text())
            .unwrap_or_default()
    }

    /// Whether the secret of the [`LaunchSpec`] has appeared on stderr or stdout so far.
    pub fn secret_leaked(&self) -> bool {
        self.leak_channel().is_some()
    }

    /// The output channel (`"stderr"` or `"stdout"`) the secret appeared on, if any.
    pub fn leak_channel(&self) -> Option<&'static str> {
        if self.secret_seen.load(Ordering::SeqCst) {
            Some("stderr")
        } else if self.stdout_secret_seen.load(Ordering::SeqCst) {
            Some("stdout")
        } else {
            None
        }
    }

    /// The exit status, if the process has exited (non-blocking).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Waits for `ready` while watching the process: the first of readiness, exit and
    /// `deadline` decides.
    ///
    /// # Errors
    /// [`TargetError::ExitedEarly`], [`TargetError::StartupTimeout`], or
    /// [`TargetError::NotReady`] carrying `ready`'s own error.
    pub async fn await_ready<T, E: std::fmt::Display>(
        &mut self,
        ready: impl Future<Output = Result<T, E>>,
        deadline: Duration,
    ) -> Result<T, TargetError> {
        match self.await_ready_or_exit(ready, deadline).await? {
            Startup::Ready(value) => Ok(value),
            Startup::Exited(status) => Err(TargetError::ExitedEarly {
                status: status.to_string(),
                stderr: self.stderr_tail(),
            }),
        }
    }

    /// As [`Self::await_ready`], but an exit before readiness is an outcome
    /// ([`Startup::Exited`], stderr drained) rather than an error: for scenarios that
    /// expect the target to refuse to start.
    ///
    /// # Errors
    /// [`TargetError::StartupTimeout`], [`TargetError::NotReady`],
    /// [`TargetError::ExitedEarly`] when waiting for the process itself failed.
    pub async fn await_ready_or_exit<T, E: std::fmt::Display>(
        &mut self,
        ready: impl Future<Output = Result<T, E>>,
        deadline: Duration,
    ) -> Result<Startup<T>, TargetError> {
        let outcome = tokio::select! {
            result = ready => Ok(result),
            status = self.child.wait() => Err(status),
            () = tokio::time::sleep(deadline) => {
                return Err(TargetError::StartupTimeout { after: deadline, stderr: self.stderr_tail() });
            }
        };
        match outcome {
            Ok(Ok(value)) => Ok(Startup::Ready(value)),
            Ok(Err(e)) => Err(TargetError::NotReady {
                reason: e.to_string(),
                stderr: self.stderr_tail(),
            }),
            Err(Ok(status)) => {
                self.exit = Some(status);
                self.drain_stderr().await;
                Ok(Startup::Exited(status))
            }
            Err(Err(e)) => {
                self.drain_stderr().await;
                Err(TargetError::ExitedEarly {
                    status: format!("wait failed: {e}"),
                    stderr: self.stderr_tail(),
                })
            }
        }
    }

    /// Waits (unbounded: race it against a deadline) for the process to exit, then for
    /// its stderr to reach end-of-file (bounded), so [`Self::stderr_tail`] is complete.
    /// Returns at once when the exit is already known. Cancel-safe.
    ///
    /// # Errors
    /// [`TargetError::WaitFailed`].
    pub async fn wait_exit(&mut self) -> Result<ExitStatus, TargetError> {
        let status = match self.exit {
            Some(status) => status,
            None => {
                let status = self.child.wait().await.map_err(TargetError::WaitFailed)?;
                self.exit = Some(status);
                status
            }
        };
        self.drain_stderr().await;
        Ok(status)
    }

    /// Waits (bounded) until the stderr and stdout readers have seen end-of-file.
    async fn drain_stderr(&mut self) {
        let deadline = tokio::time::Instant::now() + STDERR_DRAIN_BOUND;
        for slot in [&mut self.stderr_task, &mut self.stdout_task] {
            if let Some(task) = slot.as_mut()
                && tokio::time::timeout_at(deadline, task).await.is_ok()
            {
                *slot = None;
            }
        }
    }

    /// Stops the target: `SIGTERM` to the process group, up to [`TERM_GRACE`] for the
    /// process to exit, then `SIGKILL` to the whole group (stragglers included), reaps
    /// the process and drains stderr. Idempotent. Returns the exit status when known.
    pub async fn shutdown(&mut self) -> Option<ExitStatus> {
        if self.stopped {
            return self.exit;
        }
        self.stopped = true;
        if self.try_exit().is_none() {
            self.group.signal(Signal::SIGTERM);
            if let Ok(Ok(status)) = tokio::time::timeout(TERM_GRACE, self.child.wait()).await {
                self.exit = Some(status);
            }
        }
        // The leader may be gone while others of its group live on: always kill the group.
        self.group.signal(Signal::SIGKILL);
        if self.exit.is_none()
            && let Ok(Ok(status)) = tokio::time::timeout(TERM_GRACE, self.child.wait()).await
        {
            self.exit = Some(status);
        }
        self.drain_stderr().await;
        self.exit
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if !self.stopped {
            self.group.signal(Signal::SIGKILL);
        }
        contract_impl::process::watchdog::unregister(self.group);
        for task in [self.stderr_task.take(), self.stdout_task.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
    }
}

/// Splits a command line like a POSIX shell (quotes, backslashes; no expansion).
///
/// # Errors
/// [`TargetError::BadCommand`] on unbalanced quotes or an empty command.
pub fn split_command(command: &str) -> Result<Vec<String>, TargetError> {
    let words = shell_words::split(command).map_err(|e| TargetError::BadCommand {
        command: command.to_string(),
        reason: e.to_string(),
    })?;
    if words.is_empty() {
        return Err(TargetError::BadCommand {
            command: command.to_string(),
            reason: "empty command".into(),
        });
    }
    Ok(words)
}

/// What [`redact_secret`] puts in place of a secret.
pub const REDACTED: &str = "<credential>";

/// Whether `text` holds `secret`, written as is or (partly) percent-encoded (`%63rh-…`),
/// as in a URL path or query.
pub fn contains_secret(text: &str, secret: &str) -> bool {
    !secret.is_empty()
        && (0..text.len()).any(|i| match_encoded(text.as_bytes(), i, secret.as_bytes()).is_some())
}

/// `text` with every occurrence of `secret`, as is or percent-encoded, replaced by
/// [`REDACTED`], so failure messages and output tails never print a credential.
pub fn redact_secret(text: &str, secret: &str) -> String {
    if secret.is_empty() || !contains_secret(text, secret) {
        return text.to_string();
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match match_encoded(bytes, i, secret.as_bytes()) {
            Some(end) => {
                out.extend_from_slice(REDACTED.as_bytes());
                i = end;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The end of `secret` matched at `text[i..]`, each byte literal or `%XX`-encoded.
fn match_encoded(text: &[u8], mut i: usize, secret: &[u8]) -> Option<usize> {
    for &want in secret {
        let (got, next) = match *text.get(i)? {
            b'%' => {
                let hex = std::str::from_utf8(text.get(i + 1..i + 3)?).ok()?;
                (u8::from_str_radix(hex, 16).ok()?, i + 3)
            }
            b => (b, i + 1),
        };
        if got != want {
            return None;
        }
        i = next;
    }
    Some(i)
}

/// Splits `command` and resolves its program the way [`Target::spawn`] will run it: a
/// path with a `/` (relative ones against the harness's working directory), else a bare
/// name looked up in `PATH`. The program must be an executable file. Returns the
/// resolved program path.
///
/// # Errors
/// [`TargetError::BadCommand`] (empty command, unbalanced quotes);
/// [`TargetError::ProgramNotFound`].
pub fn resolve_program(command: &str) -> Result<PathBuf, TargetError> {
    use std::os::unix::fs::PermissionsExt as _;
    let words = split_command(command)?;
    let program = &words[0];
    let not_found = |reason: String| TargetError::ProgramNotFound {
        program: program.clone(),
        reason,
    };
    let executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = Path::new(program);
        let path = if path.is_relative() {
            std::env::current_dir()
                .map(|cwd| cwd.join(path))
                .unwrap_or_else(|_| path.to_path_buf())
        } else {
            path.to_path_buf()
        };
        return match std::fs::metadata(&path) {
            Err(e) => Err(not_found(format!("cannot be used: {e}"))),
            Ok(m) if !m.is_file() => Err(not_found("is not a file".into())),
            Ok(_) if !executable(&path) => Err(not_found("is not executable".into())),
            Ok(_) => Ok(path),
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&search)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
        .ok_or_else(|| not_found("is not an executable file on PATH".into()))
}

/// Reads one output pipe to its end: tails it, scans it for the secret and, when
/// `lines` is given, forwards its complete lines (bounded, see
/// [`Target::take_stdout_lines`]; never blocking on a full or dropped receiver).
async fn read_output(
    mut pipe: impl AsyncRead + Unpin,
    tail: Arc<Mutex<StderrTail>>,
    mut scanner: StreamScanner,
    secret_seen: Arc<AtomicBool>,
    mut lines: Option<mpsc::Sender<Vec<u8>>>,
) {
    let mut buf = vec![0u8; 8 * 1024];
    let mut line = Vec::new();
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if scanner.feed(&buf[..n]) {
                    secret_seen.store(true, Ordering::SeqCst);
                }
                if let Ok(mut tail) = tail.lock() {
                    tail.push(&buf[..n]);
                }
                let Some(tx) = &lines else { continue };
                let mut closed = false;
                for byte in &buf[..n] {
                    if *byte == b'\n' {
                        let complete = std::mem::take(&mut line);
                        if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(complete) {
                            closed = true;
                            break;
                        }
                    } else if line.len() <= FORWARDED_LINE_MAX_BYTES {
                        line.push(*byte);
                    }
                }
                if closed {
                    lines = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(command: &str, secret: &str) -> (RunDir, LaunchSpec) {
        let run = RunDir::new().unwrap();
        let spec = LaunchSpec {
            command: command.into(),
            env: vec![("CONTRACT_TEST_VALUE".into(), "from-env".into())],
            cwd: run.cwd(),
            secret: secret.into(),
            capture_stdout: false,
            stdin_pipe: false,
        };
        (run, spec)
    }

    #[test]
    fn tail_keeps_last_lines_and_bytes() {
        let mut tail = StderrTail::default();
        for i in 0..100 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        tail.push(b"partial");
        let text = tail.text();
        assert!(text.starts_with("line 37\n"), "{text}");
        assert!(text.ends_with("line 99\npartial"));
        let mut tail = StderrTail::default();
        tail.push(&vec![b'x'; 40 * 1024]);
        tail.push(b"\nshort\n");
        let text = tail.text();
        assert!(text.len() <= STDERR_TAIL_BYTES + 8);
        assert!(text.ends_with("short"));
    }

    #[test]
    fn ansi_colours_are_stripped() {
        assert_eq!(
            strip_ansi("\u{1b}[2mtime\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m x"),
            "time  INFO x"
        );
        let mut tail = StderrTail::default();
        tail.push(b"\x1b[31merror\x1b[0m\n");
        assert_eq!(tail.text(), "error");
    }

    #[test]
    fn scanner_finds_secret_across_chunks() {
        let mut s = StreamScanner::new("secret-123");
        assert!(!s.feed(b"hello secr"));
        assert!(s.feed(b"et-123 there"));
        let mut s = StreamScanner::new("abc");
        assert!(!s.feed(b"ab"));
        assert!(!s.feed(b"xc"));
    }

    #[test]
    fn command_splitting() {
        assert_eq!(
            split_command("bin/x runtime --flag 'a b' \"c d\"").unwrap(),
            vec!["bin/x", "runtime", "--flag", "a b", "c d"]
        );
        assert_eq!(
            split_command("  ").unwrap_err().code(),
            "bad_target_command"
        );
        assert_eq!(
            split_command("x 'open").unwrap_err().code(),
            "bad_target_command"
        );
    }

    #[test]
    fn secrets_are_found_and_redacted_even_percent_encoded() {
        let secret = "crh-credential-ab12";
        assert!(contains_secret("/x/crh-credential-ab12/y", secret));
        assert!(contains_secret("/x/%63rh-credential-ab%31%32", secret));
        assert!(!contains_secret("/x/crh-credential-ab1", secret));
        assert!(!contains_secret("anything", ""));
        assert_eq!(
            redact_secret(
                "GET /a/%63rh-credential-ab%312?t=crh-credential-ab12",
                secret
            ),
            "GET /a/<credential>?t=<credential>"
        );
        assert_eq!(redact_secret("nothing here", secret), "nothing here");
    }

    #[test]
    fn programs_are_resolved_up_front() {
        assert!(resolve_program("sh -c true").unwrap().is_absolute());
        let err = resolve_program("/nonexistent/crh-runtime --x").unwrap_err();
        assert_eq!(err.code(), "program_not_found");
        assert!(
            err.to_string().contains("/nonexistent/crh-runtime"),
            "{err}"
        );
        assert_eq!(
            resolve_program("crh-no-such-program-anywhere")
                .unwrap_err()
                .code(),
            "program_not_found"
        );
        assert_eq!(
            resolve_program("sh -c 'open").unwrap_err().code(),
            "bad_target_command"
        );
        // A directory and a non-executable file are refused.
        let run = RunDir::new().unwrap();
        assert_eq!(
            resolve_program(&run.cwd().display().to_string())
                .unwrap_err()
                .code(),
            "program_not_found"
        );
        let plain = run.path().join("plain");
        std::fs::write(&plain, "x").unwrap();
        let err = resolve_program(&plain.display().to_string()).unwrap_err();
        assert!(err.to_string().contains("not executable"), "{err}");
    }

    #[test]
    fn socket_path_limit_names_the_path() {
        let long = PathBuf::from(format!("/tmp/{}", "a".repeat(120)));
        let err = check_socket_path(&long).unwrap_err();
        assert_eq!(err.code(), "socket_path_too_long");
        assert!(err.to_string().contains(&long.display().to_string()));
        let run = RunDir::new().unwrap();
        assert!(check_socket_path(&run.control_socket()).is_ok());
    }

    #[test]
    fn seed_rejects_escaping_paths() {
        let run = RunDir::new().unwrap();
        let files = [("a/b.txt".to_string(), "hi".to_string())];
        let dirs = ["empty/nested".to_string()];
        run.seed_workspace(files.iter().map(|(a, b)| (a, b)), dirs.iter())
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(run.workspace().join("a/b.txt")).unwrap(),
            "hi"
        );
        assert!(run.workspace().join("empty/nested").is_dir());
        let bad = ["../x".to_string(), "/etc/x".to_string()];
        for b in &bad {
            let err = run
                .seed_workspace(std::iter::empty(), std::iter::once(b))
                .unwrap_err();
            assert_eq!(err.code(), "bad_seed_path");
        }
    }

    #[test]
    fn generated_content_is_deterministic_and_chunk_independent() {
        // Cross-checked with an independent implementation of docs/scenario-format.md.
        let mut first = [0u8; 16];
        GeneratedContent::new(7).fill(&mut first);
        assert_eq!(
            first,
            [
                0xd7, 0x0d, 0x32, 0x59, 0xe4, 0xe1, 0xcb, 0x63, 0x36, 0x36, 0x95, 0xef, 0xb0, 0x51,
                0x56, 0x9e
            ]
        );
        let mut whole = vec![0u8; 100];
        GeneratedContent::new(7).fill(&mut whole);
        let mut pieces = vec![0u8; 100];
        let mut g = GeneratedContent::new(7);
        for chunk in pieces.chunks_mut(3) {
            g.fill(chunk);
        }
        assert_eq!(whole, pieces);
        let mut other = vec![0u8; 100];
        GeneratedContent::new(8).fill(&mut other);
        assert_ne!(whole, other);
        // Seed 8 is seed 7 shifted by one word.
        assert_eq!(whole[8..], other[..92]);
        // The seed addition wraps.
        let mut wrap = [0u8; 16];
        GeneratedContent::new(u64::MAX).fill(&mut wrap);
        assert_eq!(wrap[8..], GeneratedContent::splitmix64(0).to_le_bytes());
    }

    #[test]
    fn generated_files_are_written_and_bounded() {
        let run = RunDir::new().unwrap();
        let size = GENERATED_CHUNK_BYTES as u64 * 2 + 5;
        run.seed_generated(&[
            crate::scenario::GeneratedFile {
                path: "big/data.bin".into(),
                size,
                seed: 7,
                text: None,
            },
            crate::scenario::GeneratedFile {
                path: "empty.bin".into(),
                size: 0,
                seed: 0,
                text: None,
            },
        ])
        .unwrap();
        let text = crate::scenario::GeneratedText {
            prefix: "# é\n".into(),
            fill: "-".into(),
        };
        run.write_text("t/SKILL.md", size, &text).unwrap();
        let written = std::fs::read(run.workspace().join("t/SKILL.md")).unwrap();
        assert_eq!(written.len() as u64, size);
        assert!(written.starts_with("# é\n-".as_bytes()));
        assert!(written[5..].iter().all(|&b| b == b'-'));
        let written = std::fs::read(run.workspace().join("big/data.bin")).unwrap();
        let mut expected = vec![0u8; written.len()];
        GeneratedContent::new(7).fill(&mut expected);
        assert_eq!(written.len() as u64, size);
        assert_eq!(written, expected);
        assert_eq!(
            std::fs::metadata(run.workspace().join("empty.bin"))
                .unwrap()
                .len(),
            0
        );
        let too_big = crate::scenario::GENERATED_FILE_MAX_BYTES + 1;
        let err = run.write_generated("x", too_big, 0).unwrap_err();
        assert_eq!(err.code(), "seed_too_large");
        assert!(!run.workspace().join("x").exists());
        assert_eq!(
            run.write_generated("../x", 1, 0).unwrap_err().code(),
            "bad_seed_path"
        );
    }

    #[tokio::test]
    async fn exit_before_readiness_can_be_an_outcome() {
        let (_run, spec) = spec("sh -c 'echo refusing >&2; exit 3'", "");
        let mut target = Target::spawn(&spec).unwrap();
        let started = target
            .await_ready_or_exit(
                std::future::pending::<Result<(), String>>(),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        let Startup::Exited(status) = started else {
            panic!("expected an exit");
        };
        assert_eq!(status.code(), Some(3));
        assert_eq!(target.stderr_tail(), "refusing");
        // The exit is remembered.
        assert_eq!(target.wait_exit().await.unwrap().code(), Some(3));
        assert_eq!(target.shutdown().await.and_then(|s| s.code()), Some(3));
    }

    #[tokio::test]
    async fn wait_exit_collects_the_whole_stderr() {
        let (_run, spec) = spec("sh -c 'echo one >&2; echo two >&2; exit 0'", "");
        let mut target = Target::spawn(&spec).unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), target.wait_exit())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success());
        assert_eq!(target.stderr_tail(), "one\ntwo");
        target.shutdown().await;
    }

    #[tokio::test]
    async fn early_exit_reports_stderr_tail() {
        let (_run, spec) = spec(
            "sh -c 'echo \"starting $CONTRACT_TEST_VALUE\" >&2; echo boom >&2; exit 3'",
            "",
        );
        let mut target = Target::spawn(&spec).unwrap();
        let never = std::future::pending::<Result<(), String>>();
        let err = target
            .await_ready(never, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "exited_early");
        let text = err.to_string();
        assert!(text.contains("starting from-env\nboom"), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
        target.shutdown().await;
    }

    /// Whether `pid` is gone (no such process, or a zombie awaiting its reaper), waiting
    /// up to 2 s: a `SIGKILL`ed process dies when next scheduled, and there is no event
    /// to await for a process that is not our child.
    async fn gone_within_2s(pid: i32) -> bool {
        let dead = || {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.contains(") Z "))
                    .unwrap_or(true)
        };
        for _ in 0..200 {
            if dead() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        dead()
    }

    #[tokio::test]
    async fn startup_timeout() {
        let (_run, spec) = spec("sleep 300", "");
        let mut target = Target::spawn(&spec).unwrap();
        let err = target
            .await_ready(
                std::future::pending::<Result<(), String>>(),
                Duration::from_millis(200),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), "startup_timeout");
        target.shutdown().await;
    }

    #[tokio::test]
    async fn shutdown_kills_the_whole_group() {
        // The shell ignores SIGTERM (so does its child, which inherits SIG_IGN): both
        // must be SIGKILLed after the grace period.
        let (run, spec) = spec(
            "sh -c 'trap \"\" TERM; sleep 300 & echo $! > child.pid.tmp; mv child.pid.tmp child.pid; wait'",
            "",
        );
        let mut target = Target::spawn(&spec).unwrap();
        let pid_file = run.cwd().join("child.pid");
        let ready = async {
            loop {
                if let Ok(text) = std::fs::read_to_string(&pid_file) {
                    return text.trim().parse::<i32>().map_err(|e| e.to_string());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let child_pid = target
            .await_ready(ready, Duration::from_secs(10))
            .await
            .unwrap();
        let status = target.shutdown().await;
        assert!(status.is_some());
        assert!(
            gone_within_2s(child_pid).await,
            "grandchild {child_pid} survived the group kill"
        );
    }

    #[tokio::test]
    async fn readiness_wins() {
        let (_run, spec) = spec("sleep 300", "");
        let mut target = Target::spawn(&spec).unwrap();
        let value = target
            .await_ready(async { Ok::<_, String>(7) }, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(value, 7);
        assert!(target.shutdown().await.is_some());
        assert!(!target.secret_leaked());
    }

    #[tokio::test]
    async fn secret_on_stderr_is_detected() {
        let (_run, spec) = spec("sh -c 'echo leaking s3cr3t-value >&2'", "s3cr3t-value");
        let mut target = Target::spawn(&spec).unwrap();
        let err = target
            .await_ready(
                std::future::pending::<Result<(), String>>(),
                Duration::from_secs(10),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), "exited_early");
        assert!(target.secret_leaked());
        assert!(target.stderr_tail().contains("leaking"));
    }

    #[tokio::test]
    async fn secret_on_stdout_is_detected_and_tailed() {
        let (_run, spec) = spec("sh -c 'echo out s3cr3t-value; echo done'", "s3cr3t-value");
        let mut target = Target::spawn(&spec).unwrap();
        target.wait_exit().await.unwrap();
        assert_eq!(target.leak_channel(), Some("stdout"));
        assert_eq!(target.stdout_tail(), "out s3cr3t-value\ndone");
        assert_eq!(target.stderr_tail(), "");
        target.shutdown().await;
    }

    #[tokio::test]
    async fn stdout_lines_are_forwarded_and_bounded() {
        let (_run, mut spec) = spec(
            &format!(
                "sh -c 'echo one; printf \"%0{}d\\n\" 0; echo three'",
                FORWARDED_LINE_MAX_BYTES + 50
            ),
            "",
        );
        spec.capture_stdout = true;
        let mut target = Target::spawn(&spec).unwrap();
        let mut lines = target.take_stdout_lines().unwrap();
        assert_eq!(lines.recv().await.unwrap(), b"one");
        assert_eq!(
            lines.recv().await.unwrap().len(),
            FORWARDED_LINE_MAX_BYTES + 1
        );
        assert_eq!(lines.recv().await.unwrap(), b"three");
        assert_eq!(lines.recv().await, None);
        target.shutdown().await;
    }

    #[tokio::test]
    async fn drop_kills_the_group() {
        let (_run, spec) = spec("sleep 300", "");
        let target = Target::spawn(&spec).unwrap();
        let pid = target.pid();
        drop(target);
        assert!(gone_within_2s(pid).await);
    }
}
