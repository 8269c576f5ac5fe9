//! The scripted kernel's executor: one daemon-owned task per run that turns its program
//! ([`crate::engine::kernel::script`]) into events, and the supervisor that contains its
//! panics ("Executor panics and unexpected errors are contained as one bounded canonical
//! uncertain outcome and a secret-safe sentinel; expected business failures are explicit
//! canonical outcomes").
//!
//! Steering is cooperative: cancel, suspend and resume are flags the executor reads
//! between directives and while it waits ("Cancellation is cooperative and terminal
//! events remain authoritative"). A suspension happens only right after a completed turn
//! ("SuspendRun pauses at a safe completed-turn boundary"); the position to continue from
//! is made durable before the run is reported suspended.
//!
//! This module decides what a run emits; it never touches a client or a socket.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use super::log::EventLog;
use super::runs::{self, Lifecycle, Progress, Run};
use crate::engine::kernel::script::{Directive, ToolResult};
use crate::engine::proto::common::v1::{Outcome, UncertainDetail};
use crate::engine::proto::engine::v1 as pb;
use pb::run_event::Kind;

/// The sentinel of a contained executor panic (it carries no panic text: "secret-safe").
pub const SENTINEL_EXECUTOR_PANIC: &str = "engine.executor_panic";

/// The sentinel of a run that was executing when the daemon stopped.
pub const SENTINEL_DAEMON_RESTARTED: &str = "engine.daemon_restarted";

/// The sentinel of a tool whose acknowledgement was lost.
pub const SENTINEL_ACK_LOST: &str = "engine.acknowledgement_lost";

/// Deltas a `repeat` emits between two looks at the cancel flag.
const CANCEL_CHECK_EVERY: u64 = 64;

/// What the executor needs from the daemon.
#[derive(Debug, Clone)]
pub struct Deps {
    /// The event log.
    pub log: Arc<EventLog>,
    /// The state database (`runs`).
    pub db: Arc<Mutex<Connection>>,
    /// How the free choices are made.
    pub profile: super::Profile,
}

/// Starts the executor of `run` from `progress`: fresh (emitting `RunStarted`) or, when
/// `suspended`, parked until resumed or canceled. Its supervisor ends the run
/// `uncertain` if it panics.
pub fn spawn(deps: Deps, run: Arc<Run>, progress: Progress, fresh: bool) {
    let exec = Executor {
        deps: deps.clone(),
        run: run.clone(),
        progress,
        last_was_turn: !fresh,
        boundary: match run.lifecycle() {
            Lifecycle::Suspended { boundary } => boundary,
            _ => 0,
        },
        suspended_at_turn: !fresh,
    };
    let task = tokio::spawn(exec.run(fresh));
    tokio::spawn(async move {
        if let Err(e) = task.await
            && !matches!(run.lifecycle(), Lifecycle::Terminal { .. })
        {
            let summary = if e.is_panic() {
                "the executor stopped unexpectedly; the run's effects are unknown"
            } else {
                "the executor was stopped; the run's effects are unknown"
            };
            let detail = UncertainDetail {
                sentinel: deps.profile.sentinel_panic().into(),
                summary: summary.into(),
            };
            let _ = end(&deps, &run, Outcome::Uncertain, Some(detail)).await;
        }
    });
}

/// Ends `run` with `outcome`: closes its pending interactions, appends the terminal
/// event, waits for it to commit, records it, and publishes the lifecycle.
///
/// # Errors
/// The log or the database failed (the lifecycle is still published).
pub async fn end(
    deps: &Deps,
    run: &Arc<Run>,
    outcome: Outcome,
    uncertain: Option<UncertainDetail>,
) -> Result<(), String> {
    let pending: Vec<String> = run
        .interactions()
        .pending
        .iter()
        .map(|p| p.interaction_id.clone())
        .collect();
    for id in pending {
        run.interactions().close(&id);
        emit(
            deps,
            run,
            Kind::InteractionClosed(pb::InteractionClosed { interaction_id: id }),
            false,
        )
        .await?;
    }
    let sequence = emit(
        deps,
        run,
        Kind::Terminal(pb::RunTerminal {
            outcome: outcome as i32,
            uncertain,
        }),
        true,
    )
    .await?;
    run.log.committed(sequence).await;
    let recorded = deps
        .db
        .lock()
        .map_err(|_| "poisoned".to_string())
        .and_then(|c| {
            runs::update(&c, &run.id, "terminal", None, 0, outcome as i32)
                .map_err(|e| e.to_string())
        });
    run.interactions().finish();
    run.lifecycle.send_replace(Lifecycle::Terminal { outcome });
    recorded
}

async fn emit(deps: &Deps, run: &Arc<Run>, kind: Kind, close: bool) -> Result<u64, String> {
    let sequence = run.log.next_sequence();
    deps.log
        .append(
            &run.log,
            pb::RunEvent {
                run_id: run.id.clone(),
                sequence,
                kind: Some(kind),
            },
            close,
        )
        .await?;
    Ok(sequence)
}

struct Executor {
    deps: Deps,
    run: Arc<Run>,
    progress: Progress,
    last_was_turn: bool,
    boundary: u64,
    /// A suspension happened at the last completed turn (a `hold` right after it is
    /// released: the suspension it waits for has happened).
    suspended_at_turn: bool,
}

/// Why the executor stopped early.
enum Stop {
    Canceled,
    /// An explicit outcome the program asked for.
    End(Outcome),
    Failed(String),
}

impl Executor {
    async fn run(mut self, fresh: bool) {
        let result = self.body(fresh).await;
        let (outcome, detail) = match result {
            Ok(()) => (Outcome::Succeeded, None),
            Err(Stop::Canceled) => (Outcome::Canceled, None),
            Err(Stop::End(outcome)) => (outcome, None),
            Err(Stop::Failed(why)) => {
                eprintln!("contract-impl engine: run {}: {why}", self.run.id);
                (
                    Outcome::Uncertain,
                    Some(UncertainDetail {
                        sentinel: self.deps.profile.sentinel_panic().into(),
                        summary: "the run's event log failed; its effects are unknown".into(),
                    }),
                )
            }
        };
        let _ = end(&self.deps, &self.run, outcome, detail).await;
    }

    fn canceled(&self) -> bool {
        self.run.signals.cancel.load(Ordering::Acquire)
    }

    async fn emit(&mut self, kind: Kind) -> Result<u64, Stop> {
        self.last_was_turn = matches!(kind, Kind::TurnCompleted(_));
        if !matches!(kind, Kind::Suspended(_) | Kind::Resumed(_)) {
            // The run moved on from the boundary it was suspended at.
            self.suspended_at_turn = false;
        }
        emit(&self.deps, &self.run, kind, false)
            .await
            .map_err(Stop::Failed)
    }

    async fn body(&mut self, fresh: bool) -> Result<(), Stop> {
        if fresh {
            self.emit(Kind::Started(pb::RunStarted {
                definition_id: self.run.definition.id.clone(),
                definition_revision: self.run.definition.revision,
                plan_id: self.run.plan_id.clone(),
            }))
            .await?;
        } else {
            self.parked().await?;
        }
        while self.progress.position < self.progress.program.len() {
            if self.canceled() {
                return Err(Stop::Canceled);
            }
            let directive = self.progress.program[self.progress.position].clone();
            self.progress.position += 1;
            match directive {
                Directive::Say { text } => {
                    self.emit(Kind::Message(pb::MessageDelta { text })).await?;
                }
                Directive::Repeat { count, text } => {
                    for i in 0..count {
                        if i % CANCEL_CHECK_EVERY == 0 && self.canceled() {
                            return Err(Stop::Canceled);
                        }
                        self.emit(Kind::Message(pb::MessageDelta { text: text.clone() }))
                            .await?;
                    }
                }
                Directive::Turn => {
                    self.progress.turns += 1;
                    let sequence = self
                        .emit(Kind::TurnCompleted(pb::TurnCompleted {
                            turn: self.progress.turns,
                        }))
                        .await?;
                    self.boundary = sequence;
                    self.suspended_at_turn = false;
                    if self.run.signals.suspend.load(Ordering::Acquire) {
                        self.suspend(self.progress.position).await?;
                    }
                }
                Directive::Tool { name, result } => {
                    let (outcome, uncertain) = match result {
                        ToolResult::Succeeded => (Outcome::Succeeded, None),
                        ToolResult::Failed => (Outcome::Failed, None),
                        ToolResult::Uncertain => (
                            Outcome::Uncertain,
                            Some(UncertainDetail {
                                sentinel: self.deps.profile.sentinel_ack_lost().into(),
                                summary: "the tool's acknowledgement was lost; it is not replayed"
                                    .into(),
                            }),
                        ),
                    };
                    let call = format!("call-{}", self.progress.position);
                    self.emit(Kind::ToolOutcome(pb::ToolOutcome {
                        tool_call_id: call,
                        tool: name,
                        outcome: outcome as i32,
                        uncertain,
                    }))
                    .await?;
                }
                Directive::Ask { id, prompt } => self.ask(id, prompt).await?,
                Directive::Hold => self.hold().await?,
                Directive::Fail => return Err(Stop::End(Outcome::Failed)),
                Directive::Panic => {
                    panic!("scripted executor panic");
                }
            }
        }
        Ok(())
    }

    async fn ask(&mut self, id: String, prompt: String) -> Result<(), Stop> {
        let pending = pb::PendingInteraction {
            interaction_id: id.clone(),
            prompt,
            response_schema_json: r#"{"type":"string"}"#.into(),
        };
        self.run.interactions().open(pending);
        self.emit(Kind::InteractionOpened(pb::InteractionOpened {
            interaction_id: id.clone(),
        }))
        .await?;
        loop {
            let run = self.run.clone();
            let wake = run.signals.wake.notified();
            if self.canceled() {
                return Err(Stop::Canceled);
            }
            // Answered: recorded with the pending prompts, closed (and forgotten) below.
            let answered = self.run.interactions().answered.contains(&id);
            if answered {
                self.run.interactions().close(&id);
                self.emit(Kind::InteractionClosed(pb::InteractionClosed {
                    interaction_id: id,
                }))
                .await?;
                return Ok(());
            }
            wake.await;
        }
    }

    /// Waits until the run is suspended (at the turn just completed) or canceled; after
    /// the suspension it continues with the next directive. A suspension that already
    /// happened at that turn releases it at once, so a program behaves the same whether
    /// the suspension arrived before or after it reached the hold.
    async fn hold(&mut self) -> Result<(), Stop> {
        if self.suspended_at_turn {
            return Ok(());
        }
        loop {
            let run = self.run.clone();
            let wake = run.signals.wake.notified();
            if self.canceled() {
                return Err(Stop::Canceled);
            }
            if self.last_was_turn && self.run.signals.suspend.load(Ordering::Acquire) {
                // Continued (here, after a restart or after an import) past this hold.
                return self.suspend(self.progress.position).await;
            }
            wake.await;
        }
    }

    /// Suspends at the boundary just reached, to continue at directive `resume_at`:
    /// durable first, then the event and the lifecycle; then parked.
    async fn suspend(&mut self, resume_at: usize) -> Result<(), Stop> {
        let progress = Progress {
            position: resume_at,
            ..self.progress.clone()
        };
        self.run.signals.suspend.store(false, Ordering::Release);
        self.run.signals.resume.store(false, Ordering::Release);
        {
            let db = self
                .deps
                .db
                .lock()
                .map_err(|_| Stop::Failed("poisoned".into()))?;
            runs::update(
                &db,
                &self.run.id,
                "suspended",
                Some(&progress),
                self.boundary,
                0,
            )
            .map_err(|e| Stop::Failed(e.to_string()))?;
        }
        let sequence = self.emit(Kind::Suspended(pb::RunSuspended {})).await?;
        self.last_was_turn = true;
        self.suspended_at_turn = true;
        self.run.log.committed(sequence).await;
        self.run.lifecycle.send_replace(Lifecycle::Suspended {
            boundary: self.boundary,
        });
        self.parked().await
    }

    /// Waits while suspended; a resume records `running` and emits `RunResumed`.
    async fn parked(&mut self) -> Result<(), Stop> {
        loop {
            let run = self.run.clone();
            let wake = run.signals.wake.notified();
            if self.canceled() {
                return Err(Stop::Canceled);
            }
            if self.run.signals.resume.swap(false, Ordering::AcqRel) {
                {
                    let db = self
                        .deps
                        .db
                        .lock()
                        .map_err(|_| Stop::Failed("poisoned".into()))?;
                    runs::update(&db, &self.run.id, "running", None, 0, 0)
                        .map_err(|e| Stop::Failed(e.to_string()))?;
                }
                let sequence = self.emit(Kind::Resumed(pb::RunResumed {})).await?;
                self.last_was_turn = true;
                self.run.log.committed(sequence).await;
                self.run.lifecycle.send_replace(Lifecycle::Running);
                return Ok(());
            }
            wake.await;
        }
    }
}
