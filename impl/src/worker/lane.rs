//! The operator lane a reviewed `local.send` lands in ("Scope, waiting and receipts"):
//! "Local send receipt is `effect_id`, `status` (`confirmed` or `held`), `event_id`
//! (nullable), and `reason` (nullable). Confirmed means a durable operator-lane event
//! exists. [...] A retry with the same execution/request identity returns the existing
//! receipt; a deliberately new request can send identical text again."
//!
//! One SQLite table keyed by the effect ID ([`effect_id`]: the session, execution and
//! request identity, never the generation, so that the same execution run again in a
//! new generation after a host restart finds its receipt): a receipt is written once, in
//! the same transaction as its event, and read back on a retry; an event is read back by
//! its ID for `evidence.resolve` ([`OperatorLane::event`]). This module never reviews a
//! send (that is [`super::policy`]'s), never delivers one anywhere else and never changes
//! or deletes an event once written.
//!
//! The lane also mints the execution IDs of a host that does not name one
//! ([`OperatorLane::begin_execution`]): they are kept where the receipts are, so an ID
//! that names receipts in this data directory is never given to a new execution, across
//! generations and restarts alike.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

/// A local send receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Receipt {
    /// The effect.
    pub effect_id: String,
    /// `confirmed` or `held`.
    pub status: ReceiptStatus,
    /// The operator-lane event, when confirmed.
    pub event_id: Option<u64>,
    /// Why it was held, when held.
    pub reason: Option<String>,
}

/// A receipt's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptStatus {
    /// A durable operator-lane event exists.
    Confirmed,
    /// Not sent ("Held is not approval, queue-success or proof anyone received the
    /// message").
    Held,
}

/// The receipt identity of request `request_id` of execution `execution_id` in
/// `session`, as its effect ID: `<session>/<execution_id>/<request_id>`. The `/` is not
/// an identifier character ("1..128 ASCII letters/digits/underscore/dot/hyphen"), so two
/// different identities never share an effect ID.
pub fn effect_id(session: &str, execution_id: &str, request_id: &str) -> String {
    format!("{session}/{execution_id}/{request_id}")
}

/// One durable operator-lane event, as `evidence.resolve` reads it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LaneEvent {
    /// The event's ID (`event:<event_id>` names it).
    pub event_id: u64,
    /// The effect whose confirmed send wrote it.
    pub effect_id: String,
    /// The text sent, exactly as it arrived.
    pub text: String,
}

/// The lane's database (in the host's data directory, beside the activation epoch).
#[derive(Debug)]
pub struct OperatorLane {
    conn: Mutex<Connection>,
}

impl OperatorLane {
    /// Opens (creating) `dir/lane.db` (0600, WAL, `synchronous=FULL`).
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn open(dir: &Path) -> Result<Self, String> {
        let conn = crate::durable::open(&dir.join("lane.db"))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS receipts (
                 effect_id TEXT PRIMARY KEY,
                 held_reason TEXT
             );
             CREATE TABLE IF NOT EXISTS operator_events (
                 event_id INTEGER PRIMARY KEY AUTOINCREMENT,
                 effect_id TEXT NOT NULL UNIQUE REFERENCES receipts(effect_id),
                 text TEXT NOT NULL
             );
             CREATE TABLE IF NOT EXISTS executions (
                 session TEXT NOT NULL,
                 execution_id TEXT NOT NULL,
                 PRIMARY KEY (session, execution_id)
             );
             CREATE TABLE IF NOT EXISTS execution_counter (
                 session TEXT PRIMARY KEY,
                 last INTEGER NOT NULL
             );",
        )
        .map_err(|e| e.to_string())?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    /// The receipt already written for `effect_id`, if any.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn existing(&self, effect_id: &str) -> Result<Option<Receipt>, String> {
        let conn = self.conn.lock().map_err(|_| "poisoned".to_string())?;
        conn.query_row(
            "SELECT r.held_reason, e.event_id FROM receipts r
             LEFT JOIN operator_events e ON e.effect_id = r.effect_id
             WHERE r.effect_id = ?1",
            params![effect_id],
            |row| {
                let reason: Option<String> = row.get(0)?;
                let event: Option<i64> = row.get(1)?;
                Ok(Receipt {
                    effect_id: effect_id.to_string(),
                    status: if reason.is_some() {
                        ReceiptStatus::Held
                    } else {
                        ReceiptStatus::Confirmed
                    },
                    event_id: event.map(|e| e as u64),
                    reason,
                })
            },
        )
        .optional()
        .map_err(|e| e.to_string())
    }

    /// The durable event `event_id`, if the lane holds one (an ID past `i64::MAX`, which
    /// SQLite cannot hold, is none).
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn event(&self, event_id: u64) -> Result<Option<LaneEvent>, String> {
        let Ok(key) = i64::try_from(event_id) else {
            return Ok(None);
        };
        let conn = self.conn.lock().map_err(|_| "poisoned".to_string())?;
        conn.query_row(
            "SELECT effect_id, text FROM operator_events WHERE event_id = ?1",
            params![key],
            |row| {
                Ok(LaneEvent {
                    event_id,
                    effect_id: row.get(0)?,
                    text: row.get(1)?,
                })
            },
        )
        .optional()
        .map_err(|e| e.to_string())
    }

    /// Records the outcome of a reviewed send: `held` with `reason`, or (`None`) a
    /// confirmed operator-lane event holding `text`, in one transaction. A second call
    /// for the same effect returns the first receipt.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn record(
        &self,
        effect_id: &str,
        text: &str,
        held: Option<&str>,
    ) -> Result<Receipt, String> {
        {
            let mut conn = self.conn.lock().map_err(|_| "poisoned".to_string())?;
            let tx = conn.transaction().map_err(|e| e.to_string())?;
            let inserted = tx
                .execute(
                    "INSERT OR IGNORE INTO receipts (effect_id, held_reason) VALUES (?1, ?2)",
                    params![effect_id, held],
                )
                .map_err(|e| e.to_string())?;
            if inserted == 1 && held.is_none() {
                tx.execute(
                    "INSERT INTO operator_events (effect_id, text) VALUES (?1, ?2)",
                    params![effect_id, text],
                )
                .map_err(|e| e.to_string())?;
            }
            tx.commit().map_err(|e| e.to_string())?;
        }
        self.existing(effect_id)?
            .ok_or_else(|| "the receipt vanished".to_string())
    }

    /// The last `limit` events of the lane, oldest first.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn events(&self, limit: usize) -> Result<Vec<LaneEvent>, String> {
        let conn = self.conn.lock().map_err(|_| "poisoned".to_string())?;
        let mut statement = conn
            .prepare(
                "SELECT event_id, effect_id, text FROM (
                     SELECT event_id, effect_id, text FROM operator_events
                     ORDER BY event_id DESC LIMIT ?1
                 ) ORDER BY event_id",
            )
            .map_err(|e| e.to_string())?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = statement
            .query_map(params![limit], |row| {
                Ok(LaneEvent {
                    event_id: row.get::<_, i64>(0)? as u64,
                    effect_id: row.get(1)?,
                    text: row.get(2)?,
                })
            })
            .map_err(|e| e.to_string())?;
        rows.collect::<Result<_, _>>().map_err(|e| e.to_string())
    }

    /// Records that an execution of `session` runs, and returns its ID: `given` as it is
    /// (the same execution run again keeps its identity, and with it its receipts), or
    /// else a new `<prefix><n>` from the session's durable counter that no execution of
    /// the session was ever given, in this generation, an earlier one or before a restart.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn begin_execution(
        &self,
        session: &str,
        given: Option<&str>,
        prefix: &str,
    ) -> Result<String, String> {
        let mut conn = self.conn.lock().map_err(|_| "poisoned".to_string())?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| e.to_string())?;
        let claim = |id: &str| {
            tx.execute(
                "INSERT OR IGNORE INTO executions (session, execution_id) VALUES (?1, ?2)",
                params![session, id],
            )
            .map_err(|e| e.to_string())
        };
        let id = match given {
            Some(id) => {
                claim(id)?;
                id.to_string()
            }
            None => loop {
                let last: i64 = tx
                    .query_row(
                        "INSERT INTO execution_counter (session, last) VALUES (?1, 1)
                         ON CONFLICT (session) DO UPDATE SET last = last + 1
                         RETURNING last",
                        params![session],
                        |row| row.get(0),
                    )
                    .map_err(|e| e.to_string())?;
                let id = format!("{prefix}{last}");
                // An ID a caller gave earlier is skipped, never shared.
                if claim(&id)? == 1 {
                    break id;
                }
            },
        };
        tx.commit().map_err(|e| e.to_string())?;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_returns_the_first_receipt_and_a_new_effect_sends_again() {
        let dir = tempfile::tempdir().unwrap();
        let lane = OperatorLane::open(dir.path()).unwrap();
        let first = lane.record("g.c1.r1", "hi", None).unwrap();
        assert_eq!(first.status, ReceiptStatus::Confirmed);
        assert_eq!(first.event_id, Some(1));
        assert_eq!(
            lane.record("g.c1.r1", "hi", Some("late hold")).unwrap(),
            first
        );
        let again = lane.record("g.c1.r2", "hi", None).unwrap();
        assert_eq!(again.event_id, Some(2));
        let held = lane.record("g.c1.r3", "secret", Some("policy")).unwrap();
        assert_eq!(
            (held.status, held.event_id, held.reason.as_deref()),
            (ReceiptStatus::Held, None, Some("policy"))
        );
    }

    #[test]
    fn events_are_read_back_by_id_and_a_held_send_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let lane = OperatorLane::open(dir.path()).unwrap();
        lane.record("g.c1.r1", "first", None).unwrap();
        lane.record("g.c1.r2", "held", Some("policy")).unwrap();
        lane.record("g.c1.r3", "second", None).unwrap();
        let event = lane.event(2).unwrap().unwrap();
        assert_eq!(
            (
                event.event_id,
                event.effect_id.as_str(),
                event.text.as_str()
            ),
            (2, "g.c1.r3", "second")
        );
        assert_eq!(lane.event(3).unwrap(), None);
        assert_eq!(lane.event(0).unwrap(), None);
        assert_eq!(lane.event(u64::MAX).unwrap(), None);
    }

    #[test]
    fn an_effect_id_names_one_identity() {
        assert_eq!(effect_id("root", "e1", "r1"), "root/e1/r1");
        // Identifiers may hold dots: the separator keeps these two apart.
        assert_ne!(effect_id("root", "e.1", "r"), effect_id("root", "e", "1.r"));
    }

    #[test]
    fn a_receipt_outlives_a_restart_and_events_list_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let id = effect_id("root", "e1", "r1");
        let first = OperatorLane::open(dir.path())
            .unwrap()
            .record(&id, "hi", None)
            .unwrap();
        let lane = OperatorLane::open(dir.path()).unwrap();
        assert_eq!(lane.existing(&id).unwrap(), Some(first.clone()));
        assert_eq!(lane.record(&id, "hi", None).unwrap(), first);
        lane.record(&effect_id("root", "e1", "r2"), "held", Some("policy"))
            .unwrap();
        let again = lane
            .record(&effect_id("root", "e1", "r3"), "hi", None)
            .unwrap();
        let events = lane.events(10).unwrap();
        assert_eq!(
            events
                .iter()
                .map(|e| (e.event_id, e.effect_id.as_str(), e.text.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (first.event_id.unwrap(), "root/e1/r1", "hi"),
                (again.event_id.unwrap(), "root/e1/r3", "hi"),
            ]
        );
        assert_eq!(lane.events(1).unwrap(), events[1..].to_vec());
    }

    #[test]
    fn minted_execution_ids_are_never_reused_across_restarts_or_given_ids() {
        let dir = tempfile::tempdir().unwrap();
        let lane = OperatorLane::open(dir.path()).unwrap();
        assert_eq!(lane.begin_execution("root", None, "c").unwrap(), "c1");
        // A caller's ID is kept as it is, again and again (a retry of that execution).
        assert_eq!(lane.begin_execution("root", Some("c2"), "c").unwrap(), "c2");
        assert_eq!(lane.begin_execution("root", Some("c2"), "c").unwrap(), "c2");
        drop(lane);
        let lane = OperatorLane::open(dir.path()).unwrap();
        // c2 was given: skipped.
        assert_eq!(lane.begin_execution("root", None, "c").unwrap(), "c3");
        // Another session counts on its own.
        assert_eq!(lane.begin_execution("other", None, "c").unwrap(), "c1");
    }
}
