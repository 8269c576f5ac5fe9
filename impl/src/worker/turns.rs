//! The turn boundary of a session ("Scope, waiting and receipts"): "Wait seconds are null
//! or finite >0 and <=600. The host records the deadline/state and checks for
//! already-pending input in one transaction. No suspended Python continuation is
//! persisted."
//!
//! One SQLite database (`turns.db` in the host's data directory) holds the inputs
//! delivered to a session and not yet taken (`pending_inputs`) and the waits the host
//! accepted (`waits`). [`TurnBoundary::wait`] checks the pending inputs and records the
//! wait in one `IMMEDIATE` transaction, so an input delivered concurrently is either seen
//! by the check or arrives after the wait was recorded (and then wakes it); a wait is
//! never recorded over an input that was already there.
//!
//! A wait is keyed by its request identity (session, execution, request): a retry of the
//! same request returns the first outcome. This module never talks to a worker, never
//! decides scope (that is the host's) and never stores a Python continuation: a wait
//! records a deadline and a state, nothing the cell could resume from.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::Serialize;

/// The longest wait, in seconds ("Wait seconds are null or finite >0 and <=600").
pub const WAIT_SECONDS_MAX: f64 = 600.0;

/// Why a wait is not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WaitError {
    /// `seconds` is not null, or not finite, > 0 and <= [`WAIT_SECONDS_MAX`].
    #[error("wait seconds must be null or finite, > 0 and <= 600 (got {0})")]
    InvalidSeconds(f64),
    /// Input was already pending: the cell should read it rather than wait.
    #[error("{0} input(s) already pending for this session")]
    InputPending(u64),
    /// The durable store failed (nothing was recorded).
    #[error("the turn store failed: {0}")]
    Store(String),
}

impl WaitError {
    /// The stable reply code (`invalid_wait`, `input_pending`, `wait_failed`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidSeconds(_) => "invalid_wait",
            Self::InputPending(_) => "input_pending",
            Self::Store(_) => "wait_failed",
        }
    }
}

/// An accepted wait, as the host replies it (`{"state": "waiting", "wait_id",
/// "deadline_ms"}`; `deadline_ms` is `null` for a wait without deadline).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AcceptedWait {
    /// Always `waiting`: the wait is recorded; a wakeup starts a future cell.
    pub state: &'static str,
    /// The wait's durable ID.
    pub wait_id: u64,
    /// When it ends on its own, in ms since the Unix epoch; `None` for no deadline.
    pub deadline_ms: Option<u64>,
}

/// Checks `seconds` against "null or finite >0 and <=600".
///
/// # Errors
/// [`WaitError::InvalidSeconds`].
pub fn check_seconds(seconds: Option<f64>) -> Result<(), WaitError> {
    match seconds {
        Some(s) if !(s.is_finite() && s > 0.0 && s <= WAIT_SECONDS_MAX) => {
            Err(WaitError::InvalidSeconds(s))
        }
        _ => Ok(()),
    }
}

/// The turn boundary's database.
#[derive(Debug)]
pub struct TurnBoundary {
    conn: Mutex<Connection>,
}

impl TurnBoundary {
    /// Opens (creating) `dir/turns.db` (0600, WAL, `synchronous=FULL`).
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn open(dir: &Path) -> Result<Self, String> {
        let conn = crate::durable::open(&dir.join("turns.db"))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS pending_inputs (
                 input_id INTEGER PRIMARY KEY AUTOINCREMENT,
                 session_id TEXT NOT NULL,
                 source TEXT NOT NULL,
                 text TEXT NOT NULL,
                 received_ms INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS waits (
                 wait_id INTEGER PRIMARY KEY AUTOINCREMENT,
                 identity TEXT NOT NULL UNIQUE,
                 session_id TEXT NOT NULL,
                 reason TEXT NOT NULL,
                 deadline_ms INTEGER,
                 state TEXT NOT NULL
             );",
        )
        .map_err(|e| e.to_string())?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Connection>, WaitError> {
        self.conn
            .lock()
            .map_err(|_| WaitError::Store("poisoned".into()))
    }

    /// Delivers an input to `session_id` (pending until taken); returns its ID.
    ///
    /// # Errors
    /// The SQLite error.
    pub fn deliver(
        &self,
        session_id: &str,
        source: &str,
        text: &str,
        now_ms: u64,
    ) -> Result<u64, WaitError> {
        let conn = self.lock()?;
        conn.execute(
            "INSERT INTO pending_inputs (session_id, source, text, received_ms)
             VALUES (?1, ?2, ?3, ?4)",
            params![session_id, source, text, now_ms as i64],
        )
        .map_err(|e| WaitError::Store(e.to_string()))?;
        Ok(conn.last_insert_rowid() as u64)
    }

    /// Accepts a wait of request `identity` in `session_id`: in one transaction, refuses
    /// it when input is already pending for the session, else records its deadline
    /// (`now_ms` + `seconds`, none for `None`) and state `waiting`. A retry of the same
    /// identity returns the first accepted wait.
    ///
    /// # Errors
    /// [`WaitError::InvalidSeconds`], [`WaitError::InputPending`] (nothing recorded),
    /// [`WaitError::Store`].
    pub fn wait(
        &self,
        session_id: &str,
        identity: &str,
        seconds: Option<f64>,
        reason: &str,
        now_ms: u64,
    ) -> Result<AcceptedWait, WaitError> {
        check_seconds(seconds)?;
        let store = |e: rusqlite::Error| WaitError::Store(e.to_string());
        let mut conn = self.lock()?;
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(store)?;
        let existing = tx
            .query_row(
                "SELECT wait_id, deadline_ms FROM waits WHERE identity = ?1",
                params![identity],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, Option<i64>>(1)?)),
            )
            .optional()
            .map_err(store)?;
        if let Some((wait_id, deadline)) = existing {
            return Ok(AcceptedWait {
                state: "waiting",
                wait_id: wait_id as u64,
                deadline_ms: deadline.map(|d| d as u64),
            });
        }
        let pending: i64 = tx
            .query_row(
                "SELECT COUNT(*) FROM pending_inputs WHERE session_id = ?1",
                params![session_id],
                |row| row.get(0),
            )
            .map_err(store)?;
        if pending > 0 {
            return Err(WaitError::InputPending(pending as u64));
        }
        let deadline = seconds.map(|s| now_ms + (s * 1000.0).ceil() as u64);
        tx.execute(
            "INSERT INTO waits (identity, session_id, reason, deadline_ms, state)
             VALUES (?1, ?2, ?3, ?4, 'waiting')",
            params![identity, session_id, reason, deadline.map(|d| d as i64)],
        )
        .map_err(store)?;
        let wait_id = tx.last_insert_rowid() as u64;
        tx.commit().map_err(store)?;
        Ok(AcceptedWait {
            state: "waiting",
            wait_id,
            deadline_ms: deadline,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_null_or_finite_positive_and_at_most_600() {
        for ok in [None, Some(0.001), Some(1.0), Some(600.0)] {
            assert_eq!(check_seconds(ok), Ok(()), "{ok:?}");
        }
        for bad in [
            0.0,
            -0.0,
            -1.0,
            600.000_001,
            601.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ] {
            let err = check_seconds(Some(bad)).unwrap_err();
            assert_eq!(err.code(), "invalid_wait", "{bad}");
        }
    }

    #[test]
    fn a_wait_is_refused_over_pending_input_and_recorded_once_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let turns = TurnBoundary::open(dir.path()).unwrap();
        let first = turns
            .wait("root", "root.c1.r1", Some(2.5), "idle", 1_000)
            .unwrap();
        assert_eq!(first.deadline_ms, Some(3_500));
        // A retry of the same request returns the first wait, even with other values.
        assert_eq!(
            turns.wait("root", "root.c1.r1", None, "x", 9_000).unwrap(),
            first
        );
        let open = turns
            .wait("root", "root.c2.r1", None, "idle", 1_000)
            .unwrap();
        assert_eq!(open.deadline_ms, None);
        assert_ne!(open.wait_id, first.wait_id);
        // Input pending for the session: the wait is refused and nothing is recorded.
        turns.deliver("root", "operator", "hello", 2_000).unwrap();
        let err = turns
            .wait("root", "root.c3.r1", Some(1.0), "idle", 2_000)
            .unwrap_err();
        assert_eq!(err, WaitError::InputPending(1));
        // Another session's input is not this session's.
        assert!(
            turns
                .wait("other", "other.c1.r1", None, "idle", 2_000)
                .is_ok()
        );
        // Invalid seconds are refused before anything is read or written.
        assert_eq!(
            turns
                .wait("root", "root.c4.r1", Some(0.0), "idle", 0)
                .unwrap_err()
                .code(),
            "invalid_wait"
        );
    }

    #[test]
    fn waits_and_inputs_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let first = {
            let turns = TurnBoundary::open(dir.path()).unwrap();
            turns
                .wait("root", "root.c1.r1", Some(600.0), "idle", 0)
                .unwrap()
        };
        let turns = TurnBoundary::open(dir.path()).unwrap();
        assert_eq!(
            turns.wait("root", "root.c1.r1", None, "idle", 5).unwrap(),
            first
        );
        assert_eq!(first.deadline_ms, Some(600_000));
    }
}
