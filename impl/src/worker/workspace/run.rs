//! Running one checked `workspace.run` ([`super::request::RunSpec`]) without blocking the
//! host: the program starts in a process group of its own, its stdout and stderr are read
//! continuously into a [`Capture`], and the whole group is SIGKILLed at the timeout, as
//! soon as the program itself exits (what it left running in its group goes with it),
//! when the run is abandoned (its future dropped) and when the host stops
//! ([`Runs::stop`]). Each group is registered with the death watchdog
//! ([`crate::process::watchdog`]) while it may have members, so that it is killed even
//! when the host is killed outright.
//!
//! A process that leaves its group (`setsid`) is out of the group's reach, as
//! [`crate::process::group`] documents; the host stops reading pipes such a process
//! still holds [`PIPE_DRAIN_AFTER_EXIT`] after the program exited. This module never
//! decides what a run may do (that is [`super::request`]'s).

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::capture::{Capture, Captured, Stream};
use super::request::RunSpec;
use super::{REPLY_ENVELOPE_MARGIN_BYTES, WorkspaceError, echo};
use crate::process::group::KILL_CONFIRM_TIMEOUT;
use crate::process::{ProcessGroup, watchdog};
use crate::worker::wire::limits::FRAME_MAX_BYTES;

/// How long the host still reads a run's pipes after the program exited and its group
/// was killed: only a process that left the group can still hold them. Our reference
/// choice.
pub const PIPE_DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);

/// Bytes read from a pipe at once.
const READ_CHUNK_BYTES: usize = 8192;

/// The process groups of the runs alive now, so that the host's stop kills them all.
#[derive(Debug, Default, Clone)]
pub(super) struct Runs(Arc<Mutex<RunsState>>);

#[derive(Debug, Default)]
struct RunsState {
    next: u64,
    live: HashMap<u64, ProcessGroup>,
    stopped: bool,
}

impl Runs {
    /// Registers the group `child` leads (here and with the watchdog) for as long as the
    /// returned run lives; a group registered after [`Runs::stop`] is killed at once.
    fn enter(&self, child: Child, group: ProcessGroup) -> LiveRun {
        watchdog::register(group);
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.next += 1;
        let key = state.next;
        state.live.insert(key, group);
        if state.stopped {
            group.signal(Signal::SIGKILL);
        }
        LiveRun {
            runs: self.clone(),
            key,
            group,
            child: Some(child),
        }
    }

    /// Kills every live group, and every group registered from now on.
    pub(super) fn stop(&self) {
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.stopped = true;
        for group in state.live.values() {
            group.signal(Signal::SIGKILL);
        }
    }
}

/// One run's program and its group. Dropped before [`LiveRun::finish`] (an abandoned
/// run: the cell's scope ended, the host stops), it SIGKILLs the group at once and reaps
/// the program and what was left of its group in the background.
struct LiveRun {
    runs: Runs,
    key: u64,
    group: ProcessGroup,
    /// The program until it was reaped by [`LiveRun::finish`].
    child: Option<Child>,
}

impl LiveRun {
    /// With the program reaped: kills what is left of the group, waits until it is empty
    /// (members re-parented to the host are reaped, [`ProcessGroup::reap`]) and
    /// unregisters it. A group that does not empty stays registered with the watchdog,
    /// so that it dies with the host at the latest.
    async fn finish(mut self) {
        self.child = None;
        self.group.signal(Signal::SIGKILL);
        if self
            .group
            .wait_gone(Instant::now() + KILL_CONFIRM_TIMEOUT)
            .await
        {
            watchdog::unregister(self.group);
        } else {
            tracing::warn!(pgid = %self.group, "a workspace run's process group survived SIGKILL");
        }
    }
}

impl Drop for LiveRun {
    fn drop(&mut self) {
        {
            let mut state = self
                .runs
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state.live.remove(&self.key);
        }
        let Some(mut child) = self.child.take() else {
            return;
        };
        let group = self.group;
        group.signal(Signal::SIGKILL);
        // Reaping needs the runtime; without one the program is killed on drop and
        // Tokio's orphan queue reaps it, and the group stays registered with the
        // watchdog.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = child.wait().await;
                if group.wait_gone(Instant::now() + KILL_CONFIRM_TIMEOUT).await {
                    watchdog::unregister(group);
                }
            });
        }
    }
}

/// How a run ended: the `ok` value of `workspace.run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Outcome {
    /// The exit code, when the program exited.
    pub(super) exit_code: Option<i32>,
    /// The signal that ended it, when one did (9 after a timeout).
    pub(super) signal: Option<i32>,
    /// Whether the host killed it at its timeout.
    pub(super) timed_out: bool,
    /// Its output.
    pub(super) captured: Captured,
    /// From the start to the program's exit, in milliseconds.
    pub(super) elapsed_ms: u64,
}

impl Outcome {
    fn value(&self) -> Value {
        let captured = &self.captured;
        json!({
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "elapsed_ms": self.elapsed_ms,
            "stdout": captured.stdout(),
            "stderr": captured.stderr(),
            "stdout_bytes": captured.stdout_bytes(),
            "stderr_bytes": captured.stderr_bytes(),
            "stdout_truncated_bytes": captured.stdout_truncated_bytes(),
            "stderr_truncated_bytes": captured.stderr_truncated_bytes(),
            "truncated": captured.stdout_truncated_bytes() + captured.stderr_truncated_bytes() > 0,
        })
    }

    /// The different profile's shape of the same facts, one the spec leaves as free as
    /// ours: `{end: {kind: "exit", code} | {kind: "signal", signal, timeout}, took_ms,
    /// output: {stdout: {text, written, dropped}, stderr: {…}}}`.
    fn different_value(&self) -> Value {
        let captured = &self.captured;
        let end = match (self.exit_code, self.signal) {
            (Some(code), _) => json!({"kind": "exit", "code": code}),
            (None, signal) => {
                json!({"kind": "signal", "signal": signal, "timeout": self.timed_out})
            }
        };
        json!({
            "end": end,
            "took_ms": self.elapsed_ms,
            "output": {
                "stdout": {
                    "text": captured.stdout(),
                    "written": captured.stdout_bytes(),
                    "dropped": captured.stdout_truncated_bytes(),
                },
                "stderr": {
                    "text": captured.stderr(),
                    "written": captured.stderr_bytes(),
                    "dropped": captured.stderr_truncated_bytes(),
                },
            },
        })
    }

    /// The reply value `{exit_code, signal, timed_out, elapsed_ms, stdout, stderr,
    /// stdout_bytes, stderr_bytes, stdout_truncated_bytes, stderr_truncated_bytes,
    /// truncated}`: `*_bytes` what the program wrote on the stream, `*_truncated_bytes`
    /// what of it the reply does not hold (past `max_output_bytes`, or cut where the
    /// reply would not fit one frame), `truncated` whether any byte is missing.
    /// `different`: the same facts in the different profile's shape
    /// ([`Outcome::different_value`]), fitted to one frame alike.
    pub(super) fn into_value(mut self, different: bool) -> Value {
        let budget = FRAME_MAX_BYTES - REPLY_ENVELOPE_MARGIN_BYTES;
        let (exit_code, signal, timed_out, elapsed_ms) =
            (self.exit_code, self.signal, self.timed_out, self.elapsed_ms);
        let shaped = |outcome: &Outcome| {
            if different {
                outcome.different_value()
            } else {
                outcome.value()
            }
        };
        self.captured.fit(budget, |captured| {
            let probe = Outcome {
                exit_code,
                signal,
                timed_out,
                captured: captured.clone(),
                elapsed_ms,
            };
            serde_json::to_string(&shaped(&probe)).map_or(usize::MAX, |t| t.len())
        });
        shaped(&self)
    }
}

/// Runs `spec` to its end (see the module docs); `runs` holds its group meanwhile.
///
/// # Errors
/// [`WorkspaceError::Spawn`] when the program cannot start; [`WorkspaceError::Run`] when
/// waiting for it fails (its group is killed).
pub(super) async fn run(spec: RunSpec, runs: &Runs) -> Result<Outcome, WorkspaceError> {
    let (program, args) = spec.argv.split_first().ok_or(WorkspaceError::ArgvEmpty)?;
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(n, v)| (n, v)))
        .current_dir(&spec.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let started = Instant::now();
    // The watchdog runs before the spawn, so the registration after it is one write.
    watchdog::start();
    let mut child = command.spawn().map_err(|e| WorkspaceError::Spawn {
        program: echo(&program.to_string_lossy()),
        reason: e.to_string(),
    })?;
    let pid = child
        .id()
        .ok_or_else(|| WorkspaceError::Run("the program has no process ID".into()))?;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let mut live = runs.enter(child, ProcessGroup::of_leader(pid));
    let group = live.group;
    let child = live
        .child
        .as_mut()
        .ok_or_else(|| WorkspaceError::Run("the program is gone".into()))?;
    let mut capture = Capture::new(spec.max_output);
    let (mut out_buf, mut err_buf) = (vec![0u8; READ_CHUNK_BYTES], vec![0u8; READ_CHUNK_BYTES]);
    let deadline = started + spec.timeout;
    let mut timed_out = false;
    let mut exited: Option<(std::process::ExitStatus, Instant)> = None;
    loop {
        if exited.is_some() && stdout.is_none() && stderr.is_none() {
            break;
        }
        let drain_until = exited.map(|(_, at)| at + PIPE_DRAIN_AFTER_EXIT);
        tokio::select! {
            biased;
            read = read_some(stdout.as_mut(), &mut out_buf), if stdout.is_some() => match read {
                Some(n) => capture.push(Stream::Stdout, &out_buf[..n]),
                None => stdout = None,
            },
            read = read_some(stderr.as_mut(), &mut err_buf), if stderr.is_some() => match read {
                Some(n) => capture.push(Stream::Stderr, &err_buf[..n]),
                None => stderr = None,
            },
            status = child.wait(), if exited.is_none() => {
                let status = status.map_err(|e| WorkspaceError::Run(e.to_string()))?;
                // What the program left running in its group ends with it, so that its
                // pipes close and nothing of the run outlives the reply.
                group.signal(Signal::SIGKILL);
                exited = Some((status, Instant::now()));
            }
            () = tokio::time::sleep_until(deadline), if exited.is_none() && !timed_out => {
                timed_out = true;
                group.signal(Signal::SIGKILL);
            }
            () = sleep_until_some(drain_until), if exited.is_some() => break,
        }
    }
    let (status, ended) = exited.ok_or_else(|| WorkspaceError::Run("no exit status".into()))?;
    live.finish().await;
    use std::os::unix::process::ExitStatusExt;
    Ok(Outcome {
        exit_code: status.code(),
        signal: status.signal(),
        timed_out,
        captured: capture.finish(),
        elapsed_ms: u64::try_from((ended - started).as_millis()).unwrap_or(u64::MAX),
    })
}

/// Reads what `pipe` has: `Some(n)` bytes, `None` at its end (or an error, which ends it
/// too).
async fn read_some<R: AsyncReadExt + Unpin>(pipe: Option<&mut R>, buf: &mut [u8]) -> Option<usize> {
    match pipe?.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
