//! The daemon's state, opened once from its data directory: the client store, the state
//! database (runs, the idempotency ledger, snapshot keys), the event log, and the
//! registry of runs — and the recovery that runs before the socket is bound ("SIGKILL of
//! the daemon loses nothing committed").
//!
//! This module owns opening and recovery; the handlers live in [`super::service`] and
//! [`super::operations`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use tonic::Status;

use super::executor::{self, Deps};
use super::ledger::Ledger;
use super::limits;
use super::log::{EventLog, RunLog};
use super::runs::{self, Lifecycle, Registry, Run};
use super::snapshot::Authority;
use super::store::{ClientStore, ENGINE_DB, Standing};
use crate::engine::proto::common::v1::{Outcome, UncertainDetail};
use crate::engine::proto::engine::v1 as pb;

/// What the operator may configure at launch (`engine serve` flags).
#[derive(Debug, Clone)]
pub struct Config {
    /// Events retained per run for replay.
    pub retained_events: u64,
    /// Most encoded event bytes in one StreamEvents page.
    pub page_bytes: u64,
    /// An operator-provided snapshot key (shared by daemons that trust each other).
    pub snapshot_key_file: Option<PathBuf>,
    /// How the free choices are made.
    pub profile: super::Profile,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            retained_events: limits::RETAINED_EVENTS_PER_RUN,
            page_bytes: limits::MAX_PAGE_BYTES,
            snapshot_key_file: None,
            profile: super::Profile::Reference,
        }
    }
}

/// The daemon's state.
#[derive(Debug)]
pub struct Daemon {
    /// Ownership epochs.
    pub clients: Arc<ClientStore>,
    /// The state database.
    pub db: Arc<Mutex<Connection>>,
    /// The event log.
    pub log: Arc<EventLog>,
    /// The idempotency ledger.
    pub ledger: Ledger,
    /// Snapshot authority.
    pub authority: Authority,
    /// The runs.
    pub runs: Registry,
    /// Most encoded event bytes in one StreamEvents page (advertised `max_page_bytes`).
    pub page_bytes: u64,
    /// How the free choices are made.
    pub profile: super::Profile,
    /// Raised at SIGTERM: open streams end.
    pub stopping: tokio::sync::watch::Sender<bool>,
}

impl Daemon {
    /// Opens the state in `data_dir` and recovers stored runs: running ones end
    /// `uncertain` ([`executor::SENTINEL_DAEMON_RESTARTED`]), suspended ones wait to be
    /// resumed, terminal ones keep their outcome. Must run inside the daemon's runtime.
    ///
    /// # Errors
    /// A store that cannot be opened or a stored row that does not parse.
    pub async fn open(data_dir: &Path, config: &Config) -> Result<Arc<Self>, String> {
        let path = data_dir.join(ENGINE_DB);
        let clients = Arc::new(ClientStore::open(data_dir)?);
        let conn = crate::durable::open(&path)?;
        runs::create_table(&conn).map_err(|e| e.to_string())?;
        let db = Arc::new(Mutex::new(conn));
        let ledger = Ledger::open(db.clone())?;
        let authority = Authority::open(db.clone(), config.snapshot_key_file.as_deref())?;
        let log = EventLog::open(&path, config.retained_events)?;
        let daemon = Arc::new(Self {
            clients,
            db,
            log,
            ledger,
            authority,
            runs: Registry::default(),
            page_bytes: config.page_bytes,
            profile: config.profile,
            stopping: tokio::sync::watch::channel(false).0,
        });
        daemon.recover().await?;
        Ok(daemon)
    }

    /// What executors need.
    pub fn deps(&self) -> Deps {
        Deps {
            log: self.log.clone(),
            db: self.db.clone(),
            profile: self.profile,
        }
    }

    async fn recover(&self) -> Result<(), String> {
        let rows = {
            let conn = self.db.lock().map_err(|_| "poisoned".to_string())?;
            runs::load(&conn)?
        };
        for row in rows {
            let (latest, oldest) = match self.log.stored_bounds(&row.run_id)? {
                Some((max, min)) => (max.max(row.base_sequence), min),
                None => (row.base_sequence, row.base_sequence + 1),
            };
            // A run whose terminal event committed before the daemon stopped, but whose
            // row was not updated yet, ended: it never gets a second terminal event.
            let logged_end = match row.state.as_str() {
                "terminal" => None,
                _ => match self.log.last_event(&row.run_id)?.and_then(|e| e.kind) {
                    Some(pb::run_event::Kind::Terminal(t)) => {
                        let conn = self.db.lock().map_err(|_| "poisoned".to_string())?;
                        runs::update(&conn, &row.run_id, "terminal", None, 0, t.outcome)
                            .map_err(|e| e.to_string())?;
                        Some(t.outcome)
                    }
                    _ => None,
                },
            };
            let lifecycle = match row.state.as_str() {
                _ if logged_end.is_some() => Lifecycle::Terminal {
                    outcome: Outcome::try_from(logged_end.unwrap_or_default())
                        .unwrap_or(Outcome::Unspecified),
                },
                "terminal" => Lifecycle::Terminal {
                    outcome: Outcome::try_from(row.outcome).unwrap_or(Outcome::Unspecified),
                },
                "suspended" => Lifecycle::Suspended {
                    boundary: row.boundary,
                },
                _ => Lifecycle::Running,
            };
            let closed = matches!(lifecycle, Lifecycle::Terminal { .. });
            let log = RunLog::new(&row.run_id, latest, oldest, closed);
            let run = Run::new(
                row.run_id.clone(),
                row.definition.clone(),
                row.plan_id.clone(),
                log,
                lifecycle.clone(),
            );
            run.interactions().revision = self.profile.interaction_revision_origin();
            self.runs.insert(run.clone());
            match lifecycle {
                Lifecycle::Terminal { .. } => {}
                Lifecycle::Suspended { .. } => {
                    executor::spawn(self.deps(), run, row.progress, false);
                }
                Lifecycle::Running => {
                    let detail = UncertainDetail {
                        sentinel: self.profile.sentinel_restarted().into(),
                        summary: "the daemon stopped while the run was executing; its effects since then are unknown".into(),
                    };
                    executor::end(&self.deps(), &run, Outcome::Uncertain, Some(detail)).await?;
                }
            }
        }
        Ok(())
    }

    /// The caller's standing, checked for a new operation: a known client at its
    /// current epoch ("an epoch change fences execution").
    ///
    /// # Errors
    /// `session_required` (`INVALID_ARGUMENT`), `unknown_client` and `fenced`
    /// (`FAILED_PRECONDITION`).
    pub fn fence(&self, session: Option<&pb::ClientSession>) -> Result<Standing, Status> {
        let session = session_of(session)?;
        let standing = self
            .clients
            .standing(&session.client_id)
            .map_err(|e| Status::unavailable(format!("client store: {e}")))?
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "unknown_client: {} has not initialized with this daemon",
                    session.client_id
                ))
            })?;
        if standing.epoch != session.epoch {
            return Err(Status::failed_precondition(format!(
                "fenced: epoch {} of {} is not the current epoch {}",
                session.epoch, session.client_id, standing.epoch
            )));
        }
        Ok(standing)
    }

    /// The run `id`.
    ///
    /// # Errors
    /// `unknown_run` (`NOT_FOUND`), `invalid_run_id` (`INVALID_ARGUMENT`).
    pub fn run(&self, id: &str) -> Result<Arc<Run>, Status> {
        if id.is_empty() || id.len() > runs::RUN_ID_MAX_BYTES {
            return Err(Status::invalid_argument(format!(
                "invalid_run_id: run_id must be 1..={} bytes",
                runs::RUN_ID_MAX_BYTES
            )));
        }
        self.runs
            .get(id)
            .ok_or_else(|| Status::not_found(format!("unknown_run: no run {id}")))
    }
}

/// The session of a mutating request, present and well-formed.
///
/// # Errors
/// `session_required` (`INVALID_ARGUMENT`).
pub fn session_of(session: Option<&pb::ClientSession>) -> Result<&pb::ClientSession, Status> {
    match session {
        None => Err(Status::invalid_argument(
            "session_required: a mutating request carries session { client_id, epoch ≥ 1 }",
        )),
        Some(s) if s.client_id.is_empty() || s.client_id.len() > 128 => Err(
            Status::invalid_argument("invalid_client_id: session.client_id must be 1..=128 bytes"),
        ),
        Some(s) if s.epoch == 0 => Err(Status::invalid_argument(
            "invalid_epoch: session.epoch must be at least 1",
        )),
        Some(s) => Ok(s),
    }
}
