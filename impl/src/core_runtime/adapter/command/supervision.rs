//! Supervising one Run: from spawn to settlement.

use super::*;

/// Everything the supervisor of one Run owns.
pub(super) struct RunProcess {
    pub(super) run_id: RunId,
    pub(super) child: Child,
    /// The supervisor's watch (private directory and held connection), when supervised:
    /// dropped when the Run settles, or with the Runtime, whatever ends it.
    pub(super) watch: Option<(SupervisorWatch, tokio::net::UnixStream)>,
    /// The group of the program (its pid): the supervisor's child when supervised.
    pub(super) pgid: Pid,
    pub(super) stdout: Box<dyn AsyncRead + Send + Unpin>,
    pub(super) stderr: Box<dyn AsyncRead + Send + Unpin>,
    pub(super) stdin_task: JoinHandle<()>,
    pub(super) events: RunEventSink,
    pub(super) stop: watch::Receiver<Option<StopReason>>,
    pub(super) ended: watch::Sender<Option<RunEnd>>,
    pub(super) permit: OwnedSemaphorePermit,
    /// `Some` with [`ProgramProtocol::Jsonl`].
    pub(super) jsonl: Option<Arc<JsonlRun>>,
}

/// How the program ended, natively.
pub(super) enum Native {
    Exited(io::Result<ExitStatus>),
    Stopped,
}

/// The `error` message of an unsuccessful exit: status, then the stderr excerpt.
pub(super) fn exit_message(status: ExitStatus, stderr: Option<&str>) -> String {
    let mut message = match (status.code(), status.signal()) {
        (Some(code), _) => format!("program exited with status {code}"),
        (None, Some(signal)) => format!("program was terminated by signal {signal}"),
        (None, None) => format!("program ended unsuccessfully ({status})"),
    };
    if let Some(line) = stderr {
        message.push_str(": ");
        message.push_str(crate::wire::bounded::utf8_prefix(
            line,
            ERROR_DETAIL_MAX_BYTES,
        ));
    }
    message
}

/// The program's own status when a supervisor stands between: a supervisor whose
/// program a signal ended says `signal <N>` on the watch connection (it may not be able
/// to die by that signal itself), so its `128 + N` exit becomes "terminated by signal N".
fn reported_status(
    status: ExitStatus,
    watch: Option<&(SupervisorWatch, tokio::net::UnixStream)>,
) -> ExitStatus {
    let (Some((_, stream)), Some(code)) = (watch, status.code()) else {
        return status;
    };
    let mut buf = [0u8; 64];
    let Ok(n) = stream.try_read(&mut buf) else {
        return status;
    };
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(|text| text.lines().find_map(|l| l.strip_prefix("signal ")))
        .and_then(|n| n.trim().parse::<i32>().ok())
        .filter(|signal| 128 + signal == code)
        .map_or(status, ExitStatus::from_raw)
}

pub(super) async fn supervise(shared: Arc<Shared>, mut p: RunProcess) {
    let config = &shared.config;
    let (give_up, give_up_rx) = watch::channel(false);
    let tail = Arc::new(Mutex::new(stderr_tail()));
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
        status = p.child.wait() => Some(status.map(|s| reported_status(s, p.watch.as_ref()))),
        // A dropped sender (adapter gone) also stops the program.
        _ = stop.wait_for(Option::is_some) => None,
        // A protocol violation stops it too.
        () = violated => None,
    };
    let (native, cleanup) = match exited {
        Some(status) => {
            // Let output reach EOF, then remove what the program left behind.
            let _ = tokio::time::timeout(config.output_drain_grace, output.join()).await;
            let cleanup = ProcessGroup::new(p.pgid).clean(config.kill_grace).await;
            // A supervisor killed outright never swept: the program's descendants that
            // left its group were re-parented to this Runtime (a child subreaper).
            let supervisor_killed = p.watch.is_some()
                && status
                    .as_ref()
                    .is_ok_and(|s| s.signal() == Some(nix::sys::signal::Signal::SIGKILL as i32));
            if supervisor_killed {
                let reaped = crate::process::adopted::sweep(|| {
                    shared.lock().runs.values().map(|r| r.child_pid).collect()
                })
                .await;
                tracing::warn!(run_id = %p.run_id, reaped, "command adapter: the program's supervisor was killed; its adopted descendants were killed and reaped");
            }
            (Native::Exited(status), cleanup)
        }
        None => {
            let cleanup = ProcessGroup::new(p.pgid)
                .terminate(&mut p.child, config.kill_grace)
                .await;
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
    // Settled: ending the watch makes a supervisor still running sweep what is left.
    drop(p.watch);
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
                Some(
                    crate::wire::bounded::utf8_prefix(&message, ERROR_DETAIL_MAX_BYTES).to_string(),
                ),
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
            tracing::info!(run_id = %p.run_id, %status, stderr_tail = %tail.text(), "command adapter: program failed");
            (
                Some(exit_message(status, tail.last_line().as_deref())),
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
