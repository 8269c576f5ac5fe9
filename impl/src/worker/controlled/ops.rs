//! The controlled host's operations (`docs/worker-host-control.md`, "Operations"):
//! argument checks, the outcomes of long operations, and what each op does to the
//! workbench, the hook generation and the activation epoch.
//!
//! Every op but `await` is applied when it is read (the shared [`crate::control`] calls
//! [`Ops::apply`]); a long op registers its outcome under its name first, so an `await`
//! sent right after it always finds it. Nothing here blocks on a running cell:
//! `interrupt`, `diagnostics` and the stop go through handles taken when the workbench
//! started.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::Mutex;

use super::instructions::{Instructions, Serving};
use super::record_json;
use super::services::Services;
use crate::control::{OpError, Ops, Outcomes, bad, bool_arg, ms_arg, required, str_arg, uint_arg};
use crate::worker::activation::Policies;
use crate::worker::host::{
    Choices, HANDSHAKE_TIMEOUT, HostConfig, INTERRUPT_GRACE, Interrupter, Killer, SEND_TIMEOUT,
    SHUTDOWN_GRACE, Tails, Worker,
};
use crate::worker::lane::OperatorLane;
use crate::worker::policy::Policy;
use crate::worker::skills::{SkillIndex, SkillRequests, SkillRoots};
use crate::worker::stores::HostStores;
use crate::worker::turns::TurnBoundary;
use crate::worker::wire::Identifier;
use crate::worker::workspace::Workspace;

/// Handles on the running workbench that never wait for its cell.
#[derive(Clone)]
struct WorkbenchHandles {
    interrupter: Interrupter,
    killer: Killer,
    tails: Tails,
}

/// Timers of generations started from now on (`configure`).
#[derive(Debug, Clone, Copy)]
struct Timers {
    interrupt_grace: Duration,
    handshake: Duration,
    send: Duration,
}

/// The controlled host's state.
pub(super) struct Host {
    program: Vec<OsString>,
    policies: Arc<Policies>,
    lane: Arc<OperatorLane>,
    /// The skill roots each workbench's index is scanned from when it starts.
    skills: SkillRoots,
    workspace: Arc<Workspace>,
    turns: Arc<TurnBoundary>,
    instructions: Arc<Instructions>,
    stores: Arc<HostStores>,
    workbench: Arc<Mutex<Option<Worker>>>,
    handles: std::sync::Mutex<Option<WorkbenchHandles>>,
    outcomes: Outcomes,
    timers: std::sync::Mutex<Timers>,
    /// `configure`'s test hook: die between the lane's commit of a send and its reply.
    crash_after_commit: AtomicBool,
    /// Held while the recorded revision starts ([`Host::restore`]): no op applies before.
    restoring: Arc<Mutex<()>>,
    different: bool,
}

/// At most this many of the lane's last events are listed by `lane`.
pub(super) const LANE_EVENTS_MAX: usize = 256;

/// The arguments each op takes (besides `as` for the long ones).
fn allowed(op: &str) -> Option<&'static [&'static str]> {
    Some(match op {
        "configure" => &[
            "invoke_budget_ms",
            "interrupt_grace_ms",
            "handshake_timeout_ms",
            "send_timeout_ms",
            "crash_after_commit",
        ],
        "start_workbench" | "shutdown" => &["as"],
        "execute" => &["code", "execution_id", "as"],
        "attention" | "review" => &["input", "as"],
        "activate" => &["path", "expected_epoch", "as"],
        "interrupt" | "epoch" | "diagnostics" | "lane" => &[],
        "input" => &["text", "source"],
        _ => return super::instructions::allowed(op),
    })
}

/// The session every connection of the controlled host carries.
pub(super) fn session(different: bool) -> Identifier {
    Identifier::new(if different { "main-session" } else { "root" }).expect("a valid identifier")
}

/// An outcome code as this host reports it: ours, or another name for it.
fn outcome_code(different: bool, ours: &str) -> String {
    if different {
        format!("host-{}", ours.replace('_', "-"))
    } else {
        ours.to_string()
    }
}

impl Ops for Host {
    fn allowed(&self, op: &str) -> Option<&'static [&'static str]> {
        allowed(op)
    }

    fn outcomes(&self) -> &Outcomes {
        &self.outcomes
    }

    async fn apply(
        self: &Arc<Self>,
        op: &str,
        name: String,
        args: &Map<String, Value>,
    ) -> Result<Value, OpError> {
        // What the recorded revision's start left is what every op sees.
        drop(self.restoring.lock().await);
        let different = self.different;
        match op {
            "configure" => {
                let budget = ms_arg(args, "invoke_budget_ms")?;
                let grace = ms_arg(args, "interrupt_grace_ms")?;
                let handshake = ms_arg(args, "handshake_timeout_ms")?;
                let send = ms_arg(args, "send_timeout_ms")?;
                if let Some(crash) = bool_arg(args, "crash_after_commit")? {
                    self.crash_after_commit.store(crash, Ordering::SeqCst);
                }
                if let Some(budget) = budget {
                    self.policies.set_budget(budget);
                }
                if let Ok(mut t) = self.timers.lock() {
                    t.interrupt_grace = grace.unwrap_or(t.interrupt_grace);
                    t.handshake = handshake.unwrap_or(t.handshake);
                    t.send = send.unwrap_or(t.send);
                }
                Ok(json!({}))
            }
            "start_workbench" => {
                if self.workbench_running() {
                    return Err(OpError::new(
                        "workbench_running",
                        "a workbench is running; shut it down first",
                    ));
                }
                let host = self.clone();
                self.outcomes
                    .spawn(name, async move { host.start_workbench().await })
            }
            "input" => {
                let text = str_arg(args, "text")?;
                let source = match args.get("source") {
                    Some(_) => str_arg(args, "source")?,
                    None => "operator",
                };
                let now_ms = crate::worker::host::now_since_epoch().as_millis() as u64;
                let session = session(different);
                self.turns
                    .deliver(session.as_str(), source, text, now_ms)
                    .map(|input_id| json!({"input_id": input_id}))
                    .map_err(|e| OpError::new(e.code(), e.to_string()))
            }
            "execute" => {
                let code = str_arg(args, "code")?.to_string();
                let execution_id = match args.get("execution_id") {
                    Some(_) => Some(
                        Identifier::new(str_arg(args, "execution_id")?)
                            .map_err(|e| bad(format!("`execution_id`: {e}")))?,
                    ),
                    None => None,
                };
                let host = self.clone();
                self.outcomes
                    .spawn(name, async move { host.execute(code, execution_id).await })
            }
            "interrupt" => {
                let handles = self.handles.lock().ok().and_then(|h| h.clone());
                let interrupted = handles.and_then(|h| h.interrupter.interrupt());
                Ok(json!({"interrupted": interrupted.map(|id| id.as_str().to_string())}))
            }
            "attention" | "review" => {
                let input = args
                    .get("input")
                    .cloned()
                    .ok_or_else(|| bad("`input` is required"))?;
                let pinned = self.policies.pin();
                let review = op == "review";
                self.outcomes.spawn(name, async move {
                    let outcome = if review {
                        Policy::review(pinned.as_deref(), &input)
                            .await
                            .map(|r| serde_json::to_value(r).unwrap_or_default())
                    } else {
                        Policy::attention(pinned.as_deref(), &input, u32::from(different))
                            .await
                            .map(|p| serde_json::to_value(p).unwrap_or_default())
                    };
                    outcome.unwrap_or_else(|e| {
                        json!({"error": {"code": outcome_code(different, e.code()), "message": e.to_string()}})
                    })
                })
            }
            "activate" => {
                let path = PathBuf::from(str_arg(args, "path")?);
                let expected = required(
                    "expected_epoch",
                    uint_arg(args, "expected_epoch", u64::MAX)?,
                )?;
                let policies = self.policies.clone();
                self.outcomes.spawn(name, async move {
                    match policies.activate(&path, expected).await {
                        Ok(a) => {
                            json!({"status": "activated", "epoch": a.epoch, "revision": a.revision})
                        }
                        Err(e) => {
                            json!({"status": "refused", "code": outcome_code(different, e.code()), "message": e.to_string()})
                        }
                    }
                })
            }
            "instructions" | "assemble" | "fold" => {
                let handles = self.handles.lock().ok().and_then(|h| h.clone());
                let running = handles.and_then(|h| h.interrupter.running());
                self.instructions.apply(op, args, running)
            }
            "diagnostics" => {
                let handles = self.handles.lock().ok().and_then(|h| h.clone());
                let handles = handles
                    .ok_or_else(|| OpError::new("no_workbench", "no workbench was started"))?;
                // What the worker wrote before this request is in the tails.
                handles.tails.flush().await;
                Ok(handles.tails.diagnostics())
            }
            "epoch" => {
                let current = self
                    .policies
                    .current()
                    .map_err(|e| OpError::new("store_failed", e.to_string()))?;
                let serving = self.policies.pin().map(|p| p.revision().to_string());
                Ok(
                    json!({"epoch": current.epoch, "revision": current.revision, "serving": serving}),
                )
            }
            "lane" => {
                let events = self
                    .lane
                    .events(LANE_EVENTS_MAX)
                    .map_err(|e| OpError::new("store_failed", e))?;
                Ok(json!({"events": events}))
            }
            "shutdown" => {
                let host = self.clone();
                self.outcomes.spawn(name, async move {
                    let status = match host.workbench.lock().await.take() {
                        Some(mut w) => w.shutdown(SHUTDOWN_GRACE).await.and_then(|s| s.code()),
                        None => None,
                    };
                    json!({"exit_code": status})
                })
            }
            other => Err(OpError::new("unknown_op", format!("unknown op `{other}`"))),
        }
    }

    async fn stop(&self) {
        self.stop_all().await;
    }
}

/// The durable stores and roots a host answers its cells' requests from.
pub(super) struct Stores {
    /// The operator lane (`local.send` receipts, `evidence.resolve`).
    pub(super) lane: Arc<OperatorLane>,
    /// The skill roots each workbench's index is scanned from when it starts.
    pub(super) skills: SkillRoots,
    /// The workspace of the cells' source work.
    pub(super) workspace: Arc<Workspace>,
    /// The turn boundary (`runtime.wait`, pending input).
    pub(super) turns: Arc<TurnBoundary>,
    /// The session's instruction header.
    pub(super) instructions: Arc<Instructions>,
    /// The stores of `maintenance.*`, `orientation.*` and `peer.*`.
    pub(super) stores: Arc<HostStores>,
}

impl Host {
    pub(super) fn new(
        program: Vec<OsString>,
        policies: Arc<Policies>,
        stores: Stores,
        different: bool,
    ) -> Self {
        let Stores {
            lane,
            skills,
            workspace,
            turns,
            instructions,
            stores,
        } = stores;
        Self {
            program,
            policies,
            lane,
            skills,
            workspace,
            turns,
            instructions,
            stores,
            workbench: Arc::new(Mutex::new(None)),
            handles: std::sync::Mutex::new(None),
            outcomes: Outcomes::new(),
            timers: std::sync::Mutex::new(Timers {
                interrupt_grace: INTERRUPT_GRACE,
                handshake: HANDSHAKE_TIMEOUT,
                send: SEND_TIMEOUT,
            }),
            crash_after_commit: AtomicBool::new(false),
            restoring: Arc::new(Mutex::new(())),
            different,
        }
    }

    /// Starts the recorded revision (a restart) in the background; ops apply once it is
    /// up or failed (the problem is told on stderr; reviews then hold).
    pub(super) async fn restore(self: &Arc<Self>) {
        let guard = self.restoring.clone().lock_owned().await;
        let policies = self.policies.clone();
        tokio::spawn(async move {
            if let Some(problem) = policies.restore().await {
                eprintln!(
                    "contract-impl worker host: the recorded policy did not start: {problem}"
                );
            }
            drop(guard);
        });
    }

    fn workbench_running(&self) -> bool {
        match self.workbench.try_lock() {
            // Busy: a cell (or a start) holds it.
            Err(_) => true,
            Ok(guard) => guard.as_ref().is_some_and(Worker::is_valid),
        }
    }

    async fn start_workbench(self: &Arc<Self>) -> Value {
        let mut config = HostConfig::workbench(self.program.clone());
        config.session_id = session(self.different);
        if self.different {
            config.choices = Choices::DIFFERENT;
        }
        // A generation identifier of its own per start, so that effects of different
        // generations never share an identity in the durable lane.
        let prefix = if self.different { "generation-" } else { "g-" };
        config.generation = Identifier::new(format!(
            "{prefix}{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ))
        .expect("a valid identifier");
        if let Ok(t) = self.timers.lock() {
            config.interrupt_grace = t.interrupt_grace;
            config.handshake_timeout = t.handshake;
            config.send_timeout = t.send;
        }
        // The index of this generation: what it is given, and what `skills.index` and
        // `skills.load` answer for its whole life.
        let roots = self.skills.clone();
        let different = self.different;
        config.skills = tokio::task::spawn_blocking(move || SkillIndex::scan(&roots))
            .await
            .ok()
            .map(|index| Arc::new(SkillIndex { different, ..index }));
        let mut slot = self.workbench.lock().await;
        match Worker::spawn(config).await {
            Ok(worker) => {
                if let Ok(mut h) = self.handles.lock() {
                    *h = Some(WorkbenchHandles {
                        interrupter: worker.interrupter(),
                        killer: worker.killer(),
                        tails: worker.tails(),
                    });
                }
                *slot = Some(worker);
                json!({"status": "ready"})
            }
            Err(e) => {
                json!({"status": "refused", "code": outcome_code(self.different, e.code()), "message": e.to_string()})
            }
        }
    }

    /// Runs a cell as execution `execution_id` (the caller's: the same execution run
    /// again, after a restart say, keeps its receipts), or one the lane mints.
    async fn execute(self: &Arc<Self>, code: String, execution_id: Option<Identifier>) -> Value {
        // "Each executing cell pins its policy object."
        let policy = self.policies.pin();
        let mut guard = self.workbench.lock().await;
        let Some(worker) = guard.as_mut() else {
            return json!({"error": {"code": outcome_code(self.different, "no_workbench"), "message": "no workbench is running"}});
        };
        let session = session(self.different);
        let prefix = if self.different {
            Choices::DIFFERENT.cell_prefix
        } else {
            Choices::REFERENCE.cell_prefix
        };
        let id = self
            .lane
            .begin_execution(
                session.as_str(),
                execution_id.as_ref().map(Identifier::as_str),
                prefix,
            )
            .and_then(|id| Identifier::new(id).map_err(|e| e.to_string()));
        let id = match id {
            Ok(id) => id,
            Err(e) => {
                return json!({"error": {"code": outcome_code(self.different, "store_failed"), "message": e}});
            }
        };
        let services = Services {
            policy,
            policies: self.policies.clone(),
            lane: self.lane.clone(),
            crash_after_commit: self.crash_after_commit.load(Ordering::SeqCst),
            turns: self.turns.clone(),
            session: session.as_str().to_string(),
            workspace: self.workspace.clone(),
            host_priority: u32::from(self.different),
            stores: self.stores.clone(),
            different: self.different,
        };
        let mut rest = SkillRequests::new(worker.skills(), services);
        let mut services = Serving {
            instructions: self.instructions.clone(),
            rest: &mut rest,
        };
        match worker.execute_as(Some(id), &code, &mut services).await {
            Ok(record) => record_json(&record),
            Err(e) => {
                json!({"error": {"code": outcome_code(self.different, e.code()), "message": e.to_string()}})
            }
        }
    }

    /// Stops everything: every workspace run and a running cell's generation hard (it
    /// does not wait for the cell), then the workbench and the hook generation.
    async fn stop_all(&self) {
        self.workspace.stop_runs();
        let handles = self.handles.lock().ok().and_then(|h| h.clone());
        let graceful =
            tokio::time::timeout(Duration::from_millis(200), self.workbench.lock()).await;
        match graceful {
            Ok(mut slot) => {
                if let Some(mut w) = slot.take() {
                    w.shutdown(SHUTDOWN_GRACE).await;
                }
            }
            Err(_) => {
                if let Some(h) = handles {
                    h.killer.kill();
                }
                if let Some(mut w) = self.workbench.lock().await.take() {
                    w.hard_stop().await;
                }
            }
        }
        self.policies.shutdown().await;
    }
}
