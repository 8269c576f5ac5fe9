//! The daemon's runs: the registry, each run's published state (lifecycle, pending
//! interactions) and the durable `runs` table ("Operations", "Failure semantics").
//!
//! A run is owned by the daemon, never by the RPC that created it ("The commit receives a
//! daemon-owned run-root context; the setup or RPC context never becomes the execution
//! lifetime"): its executor ([`super::executor`]) is a task of the daemon's runtime.
//! Clients steer it through flags and a wake-up ([`Run::signal`]); they never call into
//! the executor.
//!
//! Durable: the `runs` row (owner, definition, plan, program, and — at a suspension — the
//! position to continue from). After a restart, a run that was running is ended
//! `uncertain` (its effects since the last durable point are unknown and "never replayed
//! automatically"); a suspended run stays suspended and can be resumed; a terminal run
//! keeps its outcome.
//!
//! This module owns run state; it never decides what a program does (the executor does).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{Notify, mpsc, watch};

use super::log::RunLog;
use crate::engine::kernel::script::Directive;
use crate::engine::proto::common::v1::Outcome;
use crate::engine::proto::engine::v1 as pb;

/// Interaction frames a live interaction stream may hold before it is cut off as slow.
pub const INTERACTION_QUEUE_MAX: usize = 256;

/// Longest run ID, bytes.
pub const RUN_ID_MAX_BYTES: usize = 128;

/// A run's lifecycle as clients observe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifecycle {
    /// Executing (or waiting on an interaction or a hold).
    Running,
    /// Paused at the completed turn whose event has sequence `boundary`.
    Suspended {
        /// The `TurnCompleted` event's sequence.
        boundary: u64,
    },
    /// Ended.
    Terminal {
        /// Its outcome.
        outcome: Outcome,
    },
}

/// A steering request for the executor.
#[derive(Debug, Default)]
pub struct Signals {
    /// Cancel ("Cancellation is cooperative and terminal events remain authoritative").
    pub cancel: AtomicBool,
    /// Suspend at the next completed-turn boundary.
    pub suspend: AtomicBool,
    /// Resume a suspended run.
    pub resume: AtomicBool,
    /// Wakes the executor.
    pub wake: Notify,
}

/// One frame of an interaction stream after its snapshot.
#[derive(Debug, Clone)]
pub enum InteractionFrame {
    /// A revision-contiguous change.
    Delta(pb::InteractionDelta),
    /// The final control (the run ended).
    Control(pb::InteractionControl),
}

/// A live interaction subscription: its frames and whether it was cut off as slow.
pub type Subscription = (mpsc::Receiver<InteractionFrame>, Arc<AtomicBool>);

/// A run's pending interactions.
#[derive(Debug, Default)]
pub struct Interactions {
    /// The revision: one more per opened or closed interaction.
    pub revision: u64,
    /// The pending prompts, in opening order.
    pub pending: Vec<pb::PendingInteraction>,
    /// Interactions answered but not closed yet (a second answer is stale).
    pub answered: Vec<String>,
    /// The run ended: no more deltas.
    pub closed: bool,
    subscribers: Vec<(mpsc::Sender<InteractionFrame>, Arc<AtomicBool>)>,
}

impl Interactions {
    /// The atomic snapshot and, unless the run ended, a subscription to what follows.
    pub fn subscribe(&mut self) -> (pb::InteractionSnapshot, Option<Subscription>) {
        let snapshot = pb::InteractionSnapshot {
            revision: self.revision,
            pending: self.pending.clone(),
        };
        if self.closed {
            return (snapshot, None);
        }
        let (tx, rx) = mpsc::channel(INTERACTION_QUEUE_MAX);
        let lagged = Arc::new(AtomicBool::new(false));
        self.subscribers.push((tx, lagged.clone()));
        (snapshot, Some((rx, lagged)))
    }

    fn publish(&mut self, frame: &InteractionFrame) {
        self.subscribers
            .retain(|(tx, lagged)| match tx.try_send(frame.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    lagged.store(true, Ordering::Release);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }

    /// Opens `pending`.
    pub fn open(&mut self, pending: pb::PendingInteraction) {
        self.revision += 1;
        self.pending.push(pending.clone());
        let delta = pb::InteractionDelta {
            revision: self.revision,
            change: Some(pb::interaction_delta::Change::Opened(pending)),
        };
        self.publish(&InteractionFrame::Delta(delta));
    }

    /// Closes `id` when pending.
    pub fn close(&mut self, id: &str) {
        let before = self.pending.len();
        self.pending.retain(|p| p.interaction_id != id);
        self.answered.retain(|a| a != id);
        if self.pending.len() == before {
            return;
        }
        self.revision += 1;
        let delta = pb::InteractionDelta {
            revision: self.revision,
            change: Some(pb::interaction_delta::Change::ClosedInteractionId(
                id.to_string(),
            )),
        };
        self.publish(&InteractionFrame::Delta(delta));
    }

    /// The run ended: the final control, then no subscribers.
    pub fn finish(&mut self) {
        self.closed = true;
        let control = pb::InteractionControl {
            revision: self.revision,
            run_terminal: true,
        };
        self.publish(&InteractionFrame::Control(control));
        self.subscribers.clear();
    }
}

/// Where a run's program stands (persisted at suspension and in snapshots).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Progress {
    /// The program.
    pub program: Vec<Directive>,
    /// The next directive to run.
    pub position: usize,
    /// Turns completed.
    pub turns: u32,
}

/// One run.
#[derive(Debug)]
pub struct Run {
    /// The stable run ID.
    pub id: String,
    /// The definition it runs.
    pub definition: pb::DefinitionRef,
    /// Its immutable plan.
    pub plan_id: String,
    /// Its event log.
    pub log: Arc<RunLog>,
    /// Steering.
    pub signals: Signals,
    /// Its lifecycle.
    pub lifecycle: watch::Sender<Lifecycle>,
    /// Its pending interactions.
    pub interactions: Mutex<Interactions>,
}

impl Run {
    /// A run in `lifecycle`.
    pub fn new(
        id: String,
        definition: pb::DefinitionRef,
        plan_id: String,
        log: Arc<RunLog>,
        lifecycle: Lifecycle,
    ) -> Arc<Self> {
        let closed = matches!(lifecycle, Lifecycle::Terminal { .. });
        Arc::new(Self {
            id,
            definition,
            plan_id,
            log,
            signals: Signals::default(),
            lifecycle: watch::channel(lifecycle).0,
            interactions: Mutex::new(Interactions {
                closed,
                ..Interactions::default()
            }),
        })
    }

    /// The lifecycle now.
    pub fn lifecycle(&self) -> Lifecycle {
        self.lifecycle.borrow().clone()
    }

    /// Raises `flag` and wakes the executor.
    pub fn signal(&self, flag: &AtomicBool) {
        flag.store(true, Ordering::Release);
        self.signals.wake.notify_one();
    }

    /// The interactions, locked.
    pub fn interactions(&self) -> std::sync::MutexGuard<'_, Interactions> {
        self.interactions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until the lifecycle satisfies `done` (or the run ends), and returns it.
    pub async fn until(&self, done: impl Fn(&Lifecycle) -> bool) -> Lifecycle {
        let mut rx = self.lifecycle.subscribe();
        rx.wait_for(|l| matches!(l, Lifecycle::Terminal { .. }) || done(l))
            .await
            .map(|l| l.clone())
            .unwrap_or(Lifecycle::Running)
    }
}

/// A stored run row.
#[derive(Debug, Clone)]
pub struct RunRow {
    /// The run ID.
    pub run_id: String,
    /// The owner's client ID.
    pub client_id: String,
    /// The definition.
    pub definition: pb::DefinitionRef,
    /// The plan.
    pub plan_id: String,
    /// The progress (position meaningful when suspended).
    pub progress: Progress,
    /// `running`, `suspended` or `terminal`.
    pub state: String,
    /// The suspension boundary (when suspended).
    pub boundary: u64,
    /// The terminal outcome (when terminal).
    pub outcome: i32,
    /// The sequence before the first event stored here (0, or an import's head).
    pub base_sequence: u64,
}

/// The `runs` table.
///
/// # Errors
/// The SQLite error.
pub fn create_table(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS runs (
             run_id TEXT PRIMARY KEY,
             client_id TEXT NOT NULL,
             definition_id TEXT NOT NULL,
             definition_revision INTEGER NOT NULL,
             plan_id TEXT NOT NULL,
             progress TEXT NOT NULL,
             state TEXT NOT NULL CHECK (state IN ('running', 'suspended', 'terminal')),
             boundary INTEGER NOT NULL DEFAULT 0,
             outcome INTEGER NOT NULL DEFAULT 0,
             base_sequence INTEGER NOT NULL DEFAULT 0
         );",
    )
}

/// Inserts `row` (ownership: the run exists once this commits).
///
/// # Errors
/// The SQLite error (a duplicate run ID is a constraint error).
pub fn insert(conn: &Connection, row: &RunRow) -> Result<(), rusqlite::Error> {
    conn.execute(
        "INSERT INTO runs (run_id, client_id, definition_id, definition_revision, plan_id,
                           progress, state, boundary, outcome, base_sequence)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            row.run_id,
            row.client_id,
            row.definition.id,
            row.definition.revision as i64,
            row.plan_id,
            serde_json::to_string(&row.progress).unwrap_or_default(),
            row.state,
            row.boundary as i64,
            row.outcome,
            row.base_sequence as i64,
        ],
    )
    .map(|_| ())
}

/// Records a suspension (with the progress to continue from), a resumption or an end.
///
/// # Errors
/// The SQLite error.
pub fn update(
    conn: &Connection,
    run_id: &str,
    state: &str,
    progress: Option<&Progress>,
    boundary: u64,
    outcome: i32,
) -> Result<(), rusqlite::Error> {
    match progress {
        Some(p) => conn.execute(
            "UPDATE runs SET state = ?2, progress = ?3, boundary = ?4, outcome = ?5 WHERE run_id = ?1",
            params![
                run_id,
                state,
                serde_json::to_string(p).unwrap_or_default(),
                boundary as i64,
                outcome
            ],
        ),
        None => conn.execute(
            "UPDATE runs SET state = ?2, boundary = ?3, outcome = ?4 WHERE run_id = ?1",
            params![run_id, state, boundary as i64, outcome],
        ),
    }
    .map(|_| ())
}

/// Every stored run.
///
/// # Errors
/// The SQLite error, or a row whose progress does not parse.
pub fn load(conn: &Connection) -> Result<Vec<RunRow>, String> {
    let mut stmt = conn
        .prepare(
            "SELECT run_id, client_id, definition_id, definition_revision, plan_id, progress,
                    state, boundary, outcome, base_sequence FROM runs",
        )
        .map_err(|e| e.to_string())?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, String>(6)?,
                r.get::<_, i64>(7)?,
                r.get::<_, i32>(8)?,
                r.get::<_, i64>(9)?,
            ))
        })
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for row in rows {
        let (run_id, client_id, def, rev, plan_id, progress, state, boundary, outcome, base) =
            row.map_err(|e| e.to_string())?;
        out.push(RunRow {
            progress: serde_json::from_str(&progress)
                .map_err(|e| format!("run {run_id}: stored progress: {e}"))?,
            run_id,
            client_id,
            definition: pb::DefinitionRef {
                id: def,
                revision: rev as u64,
            },
            plan_id,
            state,
            boundary: boundary as u64,
            outcome,
            base_sequence: base as u64,
        });
    }
    Ok(out)
}

/// The stored progress of `run_id` (`None`: no such run).
///
/// # Errors
/// The SQLite error, or progress that does not parse.
pub fn progress(conn: &Connection, run_id: &str) -> Result<Option<Progress>, String> {
    let text: Option<String> = conn
        .query_row(
            "SELECT progress FROM runs WHERE run_id = ?1",
            params![run_id],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| e.to_string())?;
    text.map(|t| {
        serde_json::from_str(&t).map_err(|e| format!("run {run_id}: stored progress: {e}"))
    })
    .transpose()
}

/// Whether `run_id` is stored.
///
/// # Errors
/// The SQLite error.
pub fn exists(conn: &Connection, run_id: &str) -> Result<bool, rusqlite::Error> {
    conn.query_row(
        "SELECT 1 FROM runs WHERE run_id = ?1",
        params![run_id],
        |_| Ok(()),
    )
    .optional()
    .map(|o| o.is_some())
}

/// The registry of live and finished runs.
#[derive(Debug, Default)]
pub struct Registry {
    runs: Mutex<HashMap<String, Arc<Run>>>,
}

impl Registry {
    /// Adds `run`.
    pub fn insert(&self, run: Arc<Run>) {
        self.lock().insert(run.id.clone(), run);
    }

    /// The run `id`.
    pub fn get(&self, id: &str) -> Option<Arc<Run>> {
        self.lock().get(id).cloned()
    }

    /// Runs not terminal.
    pub fn active(&self) -> usize {
        self.lock()
            .values()
            .filter(|r| !matches!(r.lifecycle(), Lifecycle::Terminal { .. }))
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Run>>> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
