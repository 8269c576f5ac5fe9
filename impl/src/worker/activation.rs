//! Activation ("Source revisions and activation"): "Database epoch is activation
//! authority; a path/symlink is not a second active pointer. Candidate handshake precedes
//! the compare-and-swap switch. Each executing cell pins its policy object, so later
//! hooks in that cell use the same revision even during activation. A hook-only change
//! does not replace the workbench."
//!
//! * [`ActivationStore`]: one SQLite database (WAL, `synchronous=FULL`, file 0600) with
//!   one row: the epoch, the active revision and its snapshot path. The only writer of
//!   the epoch is [`ActivationStore::compare_and_swap`].
//! * [`Policies`]: the active [`Policy`] generation of a host. [`Policies::activate`]
//!   hashes the candidate, checks the expected epoch, starts the candidate and completes
//!   its handshake, and only then swaps the epoch; a failed candidate never changes it.
//!   [`Policies::pin`] is what a cell holds for its whole run. A retired generation stops
//!   when its last pin is dropped (its supervisor's watch connection closes).
//! * [`Policies::open`] (or [`Policies::restore`] after [`Policies::open_idle`]) after a
//!   restart (SIGKILL included) starts the recorded revision again, after checking that
//!   the snapshot still hashes to it.
//!
//! This module never touches the workbench.

use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use super::host::HostConfig;
use super::policy::Policy;
use super::source::source_identity;

/// The database file in the host's data directory.
pub const ACTIVATION_DB: &str = "activation.db";

/// What the epoch row says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Active {
    /// The epoch: 0 before the first activation, one more per activation.
    pub epoch: u64,
    /// The active revision (source identity), `None` before the first activation.
    pub revision: Option<String>,
    /// The active snapshot's path.
    pub snapshot: Option<PathBuf>,
}

/// Why an activation was refused. Every variant has a stable [`code`](Self::code); none
/// changed the epoch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActivationError {
    /// The snapshot path is not absolute.
    #[error("the snapshot path {0} is not absolute")]
    NotAbsolute(PathBuf),
    /// The snapshot has no source identity.
    #[error("the snapshot is refused: {0}")]
    Source(String),
    /// The expected epoch is not the current one (before or at the swap).
    #[error("expected epoch {expected}, the current epoch is {current}")]
    StaleEpoch {
        /// What the caller expected.
        expected: u64,
        /// What the database holds.
        current: u64,
    },
    /// The candidate did not start or its handshake was refused.
    #[error("the candidate failed: {0}")]
    Candidate(String),
    /// The database failed.
    #[error("the activation database failed: {0}")]
    Store(String),
}

impl ActivationError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ActivationError::NotAbsolute(_) => "not_absolute",
            ActivationError::Source(_) => "source_refused",
            ActivationError::StaleEpoch { .. } => "stale_epoch",
            ActivationError::Candidate(_) => "candidate_failed",
            ActivationError::Store(_) => "store_failed",
        }
    }
}

fn store_err(e: rusqlite::Error) -> ActivationError {
    ActivationError::Store(e.to_string())
}

/// The epoch row in SQLite.
#[derive(Debug)]
pub struct ActivationStore {
    conn: Mutex<Connection>,
}

impl ActivationStore {
    /// Opens (creating) `dir/activation.db`; `dir` is made 0700 and the file 0600.
    ///
    /// # Errors
    /// [`ActivationError::Store`].
    pub fn open(dir: &Path) -> Result<Self, ActivationError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| ActivationError::Store(format!("{}: {e}", dir.display())))?;
        let conn =
            crate::durable::open(&dir.join(ACTIVATION_DB)).map_err(ActivationError::Store)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS activation (
                 id INTEGER PRIMARY KEY CHECK (id = 1),
                 epoch INTEGER NOT NULL,
                 revision TEXT,
                 snapshot TEXT
             );
             INSERT OR IGNORE INTO activation (id, epoch) VALUES (1, 0);",
        )
        .map_err(store_err)?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    /// The current row.
    ///
    /// # Errors
    /// [`ActivationError::Store`].
    pub fn current(&self) -> Result<Active, ActivationError> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| ActivationError::Store("poisoned".into()))?;
        conn.query_row(
            "SELECT epoch, revision, snapshot FROM activation WHERE id = 1",
            [],
            |row| {
                Ok(Active {
                    epoch: row.get::<_, i64>(0)? as u64,
                    revision: row.get(1)?,
                    snapshot: row.get::<_, Option<String>>(2)?.map(PathBuf::from),
                })
            },
        )
        .optional()
        .map_err(store_err)?
        .ok_or_else(|| ActivationError::Store("the epoch row is missing".into()))
    }

    /// Sets `revision`/`snapshot` and epoch `expected + 1` if the epoch is still
    /// `expected`, in one statement; returns the new epoch.
    ///
    /// # Errors
    /// [`ActivationError::StaleEpoch`] (nothing changed); [`ActivationError::Store`].
    pub fn compare_and_swap(
        &self,
        expected: u64,
        revision: &str,
        snapshot: &Path,
    ) -> Result<u64, ActivationError> {
        let changed = {
            let conn = self
                .conn
                .lock()
                .map_err(|_| ActivationError::Store("poisoned".into()))?;
            conn.execute(
                "UPDATE activation SET epoch = epoch + 1, revision = ?1, snapshot = ?2
                 WHERE id = 1 AND epoch = ?3",
                params![
                    revision,
                    snapshot.to_string_lossy(),
                    i64::try_from(expected).unwrap_or(i64::MAX)
                ],
            )
            .map_err(store_err)?
        };
        if changed == 1 {
            Ok(expected + 1)
        } else {
            Err(ActivationError::StaleEpoch {
                expected,
                current: self.current()?.epoch,
            })
        }
    }
}

/// An accepted activation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Activated {
    /// The new epoch.
    pub epoch: u64,
    /// The new active revision.
    pub revision: String,
}

/// The active hook generation of one host.
#[derive(Debug)]
pub struct Policies {
    store: ActivationStore,
    program: Vec<OsString>,
    budget_ms: std::sync::atomic::AtomicU64,
    active: Mutex<Option<Arc<Policy>>>,
    /// Serialises activations of this host (the database still arbitrates between hosts).
    activating: tokio::sync::Mutex<()>,
    /// The host's free choices for the hook generations it starts.
    choices: super::host::Choices,
}

impl Policies {
    /// Opens the store in `data_dir` and starts the recorded revision, if any, with
    /// `program` as the hook worker ([`Policies::open_idle`], then
    /// [`Policies::restore`]).
    ///
    /// # Errors
    /// [`ActivationError::Store`].
    pub async fn open(
        data_dir: &Path,
        program: Vec<OsString>,
        budget: Duration,
        choices: super::host::Choices,
    ) -> Result<(Self, Option<String>), ActivationError> {
        let policies = Self::open_idle(data_dir, program, budget, choices)?;
        let problem = policies.restore().await;
        Ok((policies, problem))
    }

    /// Opens the store in `data_dir` with no policy running yet: the recorded revision
    /// is started by [`Policies::restore`] (a host that must be reachable while its
    /// recorded hook worker starts).
    ///
    /// # Errors
    /// [`ActivationError::Store`].
    pub fn open_idle(
        data_dir: &Path,
        program: Vec<OsString>,
        budget: Duration,
        choices: super::host::Choices,
    ) -> Result<Self, ActivationError> {
        let store = ActivationStore::open(data_dir)?;
        Ok(Self {
            store,
            program,
            budget_ms: std::sync::atomic::AtomicU64::new(
                u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
            ),
            active: Mutex::new(None),
            activating: tokio::sync::Mutex::new(()),
            choices,
        })
    }

    /// Starts the recorded revision, if any (after a restart, SIGKILL included). A
    /// recorded snapshot that no longer hashes to its revision, or whose worker does not
    /// start, leaves no active policy (every review then holds) and is returned as the
    /// problem; the epoch is unchanged.
    pub async fn restore(&self) -> Option<String> {
        let current = match self.store.current() {
            Ok(current) => current,
            Err(e) => return Some(e.to_string()),
        };
        let (Some(revision), Some(snapshot)) = (&current.revision, &current.snapshot) else {
            return None;
        };
        let _activating = self.activating.lock().await;
        match source_identity(snapshot) {
            Ok(digest) if &digest == revision => match self.candidate(snapshot).await {
                Ok(policy) => {
                    self.set(Some(policy));
                    None
                }
                Err(e) => Some(e.to_string()),
            },
            Ok(digest) => Some(format!(
                "the active snapshot {} now hashes to {digest}, not {revision}",
                snapshot.display()
            )),
            Err(e) => Some(e.to_string()),
        }
    }

    fn set(&self, policy: Option<Arc<Policy>>) {
        if let Ok(mut active) = self.active.lock() {
            *active = policy;
        }
    }

    async fn candidate(&self, snapshot: &Path) -> Result<Arc<Policy>, ActivationError> {
        let mut config = HostConfig::hooks(self.program.clone(), snapshot.to_path_buf());
        config.choices = self.choices;
        Policy::start(config, self.budget())
            .await
            .map_err(|e| ActivationError::Candidate(format!("{e} ({})", e.code())))
    }

    /// The invocation budget of generations started from now on.
    pub fn budget(&self) -> Duration {
        Duration::from_millis(self.budget_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Sets the invocation budget of generations started from now on (scenario timers).
    pub fn set_budget(&self, budget: Duration) {
        self.budget_ms.store(
            u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The epoch row.
    ///
    /// # Errors
    /// [`ActivationError::Store`].
    pub fn current(&self) -> Result<Active, ActivationError> {
        self.store.current()
    }

    /// The active generation, for a cell to hold for its whole run.
    pub fn pin(&self) -> Option<Arc<Policy>> {
        self.active.lock().ok().and_then(|a| a.clone())
    }

    /// Activates the snapshot at `path` if the epoch is `expected_epoch`: source
    /// identity, epoch check, candidate launch and handshake, then the compare-and-swap.
    ///
    /// # Errors
    /// [`ActivationError`]; the epoch and the active generation are then unchanged (a
    /// started candidate is stopped).
    pub async fn activate(
        &self,
        path: &Path,
        expected_epoch: u64,
    ) -> Result<Activated, ActivationError> {
        if !path.is_absolute() {
            return Err(ActivationError::NotAbsolute(path.to_path_buf()));
        }
        let _one = self.activating.lock().await;
        let revision = source_identity(path).map_err(|e| ActivationError::Source(e.to_string()))?;
        let current = self.store.current()?.epoch;
        if current != expected_epoch {
            return Err(ActivationError::StaleEpoch {
                expected: expected_epoch,
                current,
            });
        }
        let candidate = self.candidate(path).await?;
        if candidate.revision() != revision {
            candidate.shutdown().await;
            return Err(ActivationError::Candidate(format!(
                "the candidate announced {}, the snapshot hashes to {revision}",
                candidate.revision()
            )));
        }
        match self.store.compare_and_swap(expected_epoch, &revision, path) {
            Ok(epoch) => {
                self.set(Some(candidate));
                Ok(Activated { epoch, revision })
            }
            Err(e) => {
                candidate.shutdown().await;
                Err(e)
            }
        }
    }

    /// Stops the active generation (the host is shutting down).
    pub async fn shutdown(&self) {
        let active = self.active.lock().ok().and_then(|mut a| a.take());
        if let Some(policy) = active {
            policy.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_moves_only_by_compare_and_swap() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = ActivationStore::open(dir.path()).unwrap();
        assert_eq!(store.current().unwrap().epoch, 0);
        let snap = Path::new("/abs/releases/a");
        assert_eq!(store.compare_and_swap(0, "aa", snap).unwrap(), 1);
        let stale = store.compare_and_swap(0, "bb", snap).unwrap_err();
        assert_eq!(stale.code(), "stale_epoch");
        assert_eq!(
            stale,
            ActivationError::StaleEpoch {
                expected: 0,
                current: 1
            }
        );
        let now = store.current().unwrap();
        assert_eq!(
            (now.epoch, now.revision.as_deref()),
            (1, Some("aa")),
            "a stale swap changes nothing"
        );
        drop(store);
        // Durable: a new connection sees the committed epoch.
        let again = ActivationStore::open(dir.path()).unwrap();
        assert_eq!(again.current().unwrap().epoch, 1);
        let mode = std::fs::metadata(dir.path().join(ACTIVATION_DB))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
