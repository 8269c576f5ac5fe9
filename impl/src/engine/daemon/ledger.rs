//! The bounded idempotency ledger ("Initialization", "Failure semantics"): "Mutating
//! RPC adapters will use the bounded idempotency ledger keyed by stable client identity
//! plus operation identity; an epoch change fences execution but does not erase
//! committed operation outcomes." "Transport failure never implies a mutating request
//! failed before commit. Operation IDs provide deduplication where defined." "A canceled
//! duplicate waiter never cancels or replaces the operation owner."
//!
//! [`Ledger::once`] runs an operation at most once per (client ID, operation ID):
//! * a committed outcome is answered again, byte for byte, whatever the caller's epoch
//!   (the request must be the same one: same method, same digest of the request without
//!   its session, or the retry is refused as `operation_conflict`);
//! * a concurrent duplicate waits for the owner's outcome; the owner runs in its own
//!   task, so neither its RPC nor a waiter being canceled cancels it;
//! * a new operation runs only for the client's current epoch (`fenced` otherwise).
//!
//! Entries are kept per client up to [`LEDGER_ENTRIES_PER_CLIENT`]; the oldest beyond
//! that is forgotten (a retry that old runs as a new operation). Failed operations are
//! not recorded: a retry evaluates them again.
//!
//! This module owns the ledger table; it never interprets a response.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::watch;
use tonic::Status;

/// Committed outcomes kept per client.
pub const LEDGER_ENTRIES_PER_CLIENT: u64 = 1_024;

/// Longest client operation ID, bytes.
pub const OPERATION_ID_MAX_BYTES: usize = 128;

/// A committed outcome: the encoded response.
pub type Outcome = Result<Vec<u8>, Status>;

/// Validates an operation ID: 1..=[`OPERATION_ID_MAX_BYTES`] bytes of printable ASCII.
///
/// # Errors
/// `INVALID_ARGUMENT` naming the rule.
pub fn check_operation_id(id: &str) -> Result<(), Status> {
    if id.is_empty()
        || id.len() > OPERATION_ID_MAX_BYTES
        || !id.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(Status::invalid_argument(format!(
            "invalid_operation_id: client_operation_id must be 1..={OPERATION_ID_MAX_BYTES} bytes of printable ASCII"
        )));
    }
    Ok(())
}

type Key = (String, String);

/// A stored entry: method, request digest, encoded response.
type Stored = (String, Vec<u8>, Vec<u8>);

/// The ledger.
#[derive(Debug, Clone)]
pub struct Ledger {
    db: Arc<Mutex<Connection>>,
    inflight: Arc<Mutex<HashMap<Key, watch::Receiver<Option<Outcome>>>>>,
}

/// What an operation's work may write in the same transaction as its effect.
#[derive(Debug)]
pub struct Entry {
    /// The client.
    pub client_id: String,
    /// The operation.
    pub operation_id: String,
    /// The method.
    pub method: &'static str,
    /// The request digest.
    pub digest: [u8; 32],
}

impl Entry {
    /// Records `response` for this entry inside `tx` (so the effect and its outcome
    /// commit together), trimming the client's entries to the bound.
    ///
    /// # Errors
    /// The SQLite error.
    pub fn record(&self, tx: &Connection, response: &[u8]) -> Result<(), rusqlite::Error> {
        tx.execute(
            "INSERT INTO ledger (client_id, operation_id, method, digest, response)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                self.client_id,
                self.operation_id,
                self.method,
                self.digest.as_slice(),
                response
            ],
        )?;
        tx.execute(
            "DELETE FROM ledger WHERE client_id = ?1 AND entry <= (
                 SELECT entry FROM ledger WHERE client_id = ?1
                 ORDER BY entry DESC LIMIT 1 OFFSET ?2)",
            params![self.client_id, LEDGER_ENTRIES_PER_CLIENT as i64],
        )?;
        Ok(())
    }
}

/// How an operation ended for this caller.
#[derive(Debug)]
pub struct Answer {
    /// The encoded response.
    pub response: Vec<u8>,
    /// Whether it is an earlier commit answered again.
    pub deduplicated: bool,
}

/// What the work returns: the encoded response, and whether it recorded its entry
/// itself (in its own transaction).
#[derive(Debug)]
pub struct Done {
    /// The encoded response.
    pub response: Vec<u8>,
    /// The work called [`Entry::record`] already.
    pub recorded: bool,
}

impl Ledger {
    /// The ledger over `db` (the daemon's state connection).
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn open(db: Arc<Mutex<Connection>>) -> Result<Self, String> {
        db.lock()
            .map_err(|_| "poisoned".to_string())?
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS ledger (
                     entry INTEGER PRIMARY KEY AUTOINCREMENT,
                     client_id TEXT NOT NULL,
                     operation_id TEXT NOT NULL,
                     method TEXT NOT NULL,
                     digest BLOB NOT NULL,
                     response BLOB NOT NULL,
                     UNIQUE (client_id, operation_id)
                 );",
            )
            .map_err(|e| e.to_string())?;
        Ok(Self {
            db,
            inflight: Arc::default(),
        })
    }

    fn lookup(&self, key: &Key) -> Result<Option<Stored>, Status> {
        let conn = self.db.lock().map_err(|_| Status::internal("poisoned"))?;
        conn.query_row(
            "SELECT method, digest, response FROM ledger WHERE client_id = ?1 AND operation_id = ?2",
            params![key.0, key.1],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .optional()
        .map_err(|e| Status::unavailable(format!("ledger: {e}")))
    }

    /// Runs `work` at most once for `entry`; `fence` is checked only when the operation
    /// is new (it refuses a stale epoch).
    ///
    /// # Errors
    /// `operation_conflict` (`INVALID_ARGUMENT`) for a reused ID with another request;
    /// the fence's or the work's status otherwise.
    pub async fn once<W, F>(
        &self,
        entry: Entry,
        fence: impl FnOnce() -> Result<(), Status>,
        work: W,
    ) -> Result<Answer, Status>
    where
        W: FnOnce(Entry) -> F + Send + 'static,
        F: Future<Output = Result<Done, Status>> + Send + 'static,
    {
        let key = (entry.client_id.clone(), entry.operation_id.clone());
        let conflict = |method: &str| {
            Status::invalid_argument(format!(
                "operation_conflict: operation {} was already used for another request ({method})",
                key.1
            ))
        };
        let (want_method, want_digest) = (entry.method, entry.digest);
        let mut start = Some((entry, fence, work));
        loop {
            if let Some((method, digest, response)) = self.lookup(&key)? {
                if method != want_method || digest != want_digest {
                    return Err(conflict(&method));
                }
                return Ok(Answer {
                    response,
                    deduplicated: true,
                });
            }
            let waiting = {
                let mut inflight = self
                    .inflight
                    .lock()
                    .map_err(|_| Status::internal("poisoned"))?;
                match inflight.get(&key) {
                    Some(rx) => Ok(rx.clone()),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        inflight.insert(key.clone(), rx);
                        Err(tx)
                    }
                }
            };
            match waiting {
                Err(tx) => {
                    let Some((entry, fence, work)) = start.take() else {
                        self.forget(&key);
                        return Err(Status::internal("the operation was started twice"));
                    };
                    // An owner that finished between the lookup and the registration has
                    // committed: answer its outcome, never run the work a second time.
                    if let Some((method, digest, response)) = self.lookup(&key)? {
                        self.forget(&key);
                        if method != entry.method || digest != entry.digest {
                            return Err(conflict(&method));
                        }
                        return Ok(Answer {
                            response,
                            deduplicated: true,
                        });
                    }
                    if let Err(e) = fence() {
                        self.forget(&key);
                        return Err(e);
                    }
                    return self.own(key, entry, tx, work).await;
                }
                Ok(mut rx) => {
                    // A duplicate: wait for the owner. Dropping this wait cancels nothing.
                    let outcome = rx
                        .wait_for(Option::is_some)
                        .await
                        .ok()
                        .and_then(|o| o.clone());
                    if let Some(Err(status)) = outcome {
                        return Err(status);
                    }
                    // Committed (answered from the ledger next) or the owner vanished.
                }
            }
        }
    }

    fn forget(&self, key: &Key) {
        if let Ok(mut inflight) = self.inflight.lock() {
            inflight.remove(key);
        }
    }

    async fn own<W, F>(
        &self,
        key: Key,
        entry: Entry,
        tx: watch::Sender<Option<Outcome>>,
        work: W,
    ) -> Result<Answer, Status>
    where
        W: FnOnce(Entry) -> F + Send + 'static,
        F: Future<Output = Result<Done, Status>> + Send + 'static,
    {
        let ledger = self.clone();
        // The owner runs in its own task: the caller's RPC context never owns it.
        let task = tokio::spawn(async move {
            let record = Entry {
                client_id: entry.client_id.clone(),
                operation_id: entry.operation_id.clone(),
                method: entry.method,
                digest: entry.digest,
            };
            let outcome = match work(entry).await {
                Ok(done) => {
                    let recorded = if done.recorded {
                        Ok(())
                    } else {
                        ledger
                            .db
                            .lock()
                            .map_err(|_| Status::internal("poisoned"))
                            .and_then(|conn| {
                                record
                                    .record(&conn, &done.response)
                                    .map_err(|e| Status::unavailable(format!("ledger: {e}")))
                            })
                    };
                    recorded.map(|()| done.response)
                }
                Err(status) => Err(status),
            };
            ledger.forget(&key);
            tx.send_replace(Some(outcome.clone()));
            outcome
        });
        match task.await {
            Ok(outcome) => outcome.map(|response| Answer {
                response,
                deduplicated: false,
            }),
            Err(e) => Err(Status::internal(format!(
                "internal: the operation's task ended abnormally ({})",
                if e.is_panic() { "panic" } else { "canceled" }
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn ledger() -> (tempfile::TempDir, Ledger) {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::durable::open(&dir.path().join("l.db")).unwrap();
        (dir, Ledger::open(Arc::new(Mutex::new(conn))).unwrap())
    }

    fn entry(op: &str, digest: u8) -> Entry {
        Entry {
            client_id: "c1".into(),
            operation_id: op.into(),
            method: "StartRun",
            digest: [digest; 32],
        }
    }

    #[tokio::test]
    async fn once_per_operation_with_duplicates_waiting_and_conflicts_refused() {
        let (_dir, ledger) = ledger();
        let runs = Arc::new(AtomicUsize::new(0));
        let (go_tx, go_rx) = watch::channel(false);
        let work = |runs: Arc<AtomicUsize>, mut go: watch::Receiver<bool>| {
            move |_e: Entry| async move {
                let _ = go.wait_for(|g| *g).await;
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(Done {
                    response: b"r1".to_vec(),
                    recorded: false,
                })
            }
        };
        let owner = tokio::spawn({
            let (l, r, g) = (ledger.clone(), runs.clone(), go_rx.clone());
            async move { l.once(entry("op", 1), || Ok(()), work(r, g)).await }
        });
        tokio::task::yield_now().await;
        // A duplicate that gives up does not cancel the owner.
        let impatient = tokio::spawn({
            let (l, r, g) = (ledger.clone(), runs.clone(), go_rx.clone());
            async move { l.once(entry("op", 1), || Ok(()), work(r, g)).await }
        });
        tokio::task::yield_now().await;
        impatient.abort();
        go_tx.send_replace(true);
        let first = owner.await.unwrap().unwrap();
        assert!(!first.deduplicated);
        let again = ledger
            .once(
                entry("op", 1),
                || Err(Status::failed_precondition("fenced")),
                work(runs.clone(), go_rx.clone()),
            )
            .await
            .unwrap();
        assert!(
            again.deduplicated,
            "a committed outcome survives an epoch change"
        );
        assert_eq!(again.response, b"r1");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let conflict = ledger
            .once(entry("op", 2), || Ok(()), work(runs.clone(), go_rx.clone()))
            .await
            .unwrap_err();
        assert!(conflict.message().starts_with("operation_conflict"));
        let fenced = ledger
            .once(
                entry("new", 1),
                || Err(Status::failed_precondition("fenced")),
                work(runs.clone(), go_rx),
            )
            .await
            .unwrap_err();
        assert_eq!(fenced.message(), "fenced");
    }

    #[tokio::test]
    async fn entries_are_bounded_per_client() {
        let (_dir, ledger) = ledger();
        for i in 0..=LEDGER_ENTRIES_PER_CLIENT {
            ledger
                .once(
                    entry(&format!("op{i}"), 1),
                    || Ok(()),
                    |_e| async {
                        Ok(Done {
                            response: vec![1],
                            recorded: false,
                        })
                    },
                )
                .await
                .unwrap();
        }
        let count: i64 = ledger
            .db
            .lock()
            .unwrap()
            .query_row("SELECT COUNT(*) FROM ledger", [], |r| r.get(0))
            .unwrap();
        assert_eq!(count as u64, LEDGER_ENTRIES_PER_CLIENT);
        assert!(
            ledger
                .lookup(&("c1".into(), "op0".into()))
                .unwrap()
                .is_none()
        );
        assert!(
            ledger
                .lookup(&("c1".into(), "op1".into()))
                .unwrap()
                .is_some()
        );
        assert!(check_operation_id(&"a".repeat(OPERATION_ID_MAX_BYTES)).is_ok());
        assert!(check_operation_id(&"a".repeat(OPERATION_ID_MAX_BYTES + 1)).is_err());
        assert!(check_operation_id("").is_err());
        assert!(check_operation_id("a b").is_err());
    }
}
