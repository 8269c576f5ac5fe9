//! [`HarnessAdapter`] for [`CommandAdapter`]: prepare, start, input, cancel, close.

use super::*;

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
        // Everything under the state lock, which must not live across an await.
        let (
            mut child,
            pid,
            stdout,
            stderr,
            stdin_task,
            stop_rx,
            ended_tx,
            jsonl,
            permit,
            supervisor_watch,
        ) = {
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
            let supervisor_watch = match &config.supervisor {
                Some(_) => Some(SupervisorWatch::bind().map_err(|e| {
                    AdapterError::Refused(format!("cannot prepare the program's supervisor: {e}"))
                })?),
                None => None,
            };
            let mut command = match (&config.supervisor, &supervisor_watch) {
                (Some(supervisor), Some(_)) => {
                    let mut command = Command::new(supervisor);
                    command
                        .args(["worker", "supervise", "--reraise-signal", "--"])
                        .arg(&config.program);
                    command
                }
                _ => Command::new(&config.program),
            };
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
            if let Some(w) = &supervisor_watch {
                command
                    .env(WATCH_ENV, w.path())
                    .env(SCRATCH_BASE_ENV, std::env::temp_dir());
            }
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
            let jsonl =
                (config.protocol == ProgramProtocol::Jsonl).then(|| Arc::new(JsonlRun::new()));
            state.runs.insert(
                request.run_id.clone(),
                RunEntry {
                    executor_id: request.executor_id.clone(),
                    child_pid: pid.cast_signed(),
                    stop,
                    ended,
                    stdin: (!close_after).then_some(stdin),
                    jsonl: jsonl.clone(),
                },
            );
            (
                child,
                pid,
                stdout,
                stderr,
                stdin_task,
                stop_rx,
                ended_tx,
                jsonl,
                permit,
                supervisor_watch,
            )
        };
        let mut pgid = Pid::from_raw(pid.cast_signed());
        // Supervised, the Run's group is the program's own (the supervisor reports its
        // pid); the watch connection is held until the Run settles.
        let watch = match supervisor_watch {
            Some(w) => match w.accept(&mut child).await {
                Ok((stream, program_pid)) => {
                    pgid = Pid::from_raw(program_pid.cast_signed());
                    Some((w, stream))
                }
                Err(e) => {
                    self.shared.lock().runs.remove(&request.run_id);
                    stdin_task.abort();
                    // `kill_on_drop`: the supervisor (and so the program) goes with it.
                    drop(child);
                    return Err(AdapterError::Refused(format!(
                        "cannot start `{}`: {e}",
                        config.program.display()
                    )));
                }
            },
            None => None,
        };
        tracing::info!(run_id = %request.run_id, pid = pgid.as_raw(), program = %config.program.display(), "command adapter: program started");
        tokio::spawn(supervise(
            self.shared.clone(),
            RunProcess {
                run_id: request.run_id,
                child,
                watch,
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
            let group = ProcessGroup::new(leftover.pgid);
            if group.is_alive() {
                group.signal(Signal::SIGKILL);
                if !group.wait_gone(Instant::now() + KILL_CONFIRM_TIMEOUT).await {
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
