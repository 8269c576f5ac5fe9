//! The daemon's durable client store ("Initialization"): "A new owner receives a stable
//! client ID at epoch one. Reconnect supplies that client ID and its expected epoch; the
//! daemon performs a compare-and-swap and returns the same ID at exactly the next epoch.
//! A stale claim fails without changing ownership."
//!
//! One SQLite database (WAL, `synchronous=FULL`, file 0600) in the data directory; the
//! epoch moves only by one `UPDATE … WHERE epoch = expected`, so of two racing
//! reconnects exactly one wins. This module never decides negotiation.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, params};

/// The database file in the data directory.
pub const ENGINE_DB: &str = "engine.db";

/// A claim's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The claim won: the client's ID and the epoch it now holds.
    Won {
        /// The stable client ID.
        client_id: String,
        /// The epoch.
        epoch: u64,
    },
    /// The reconnect expected another epoch (or an unknown client): nothing changed.
    Stale {
        /// The epoch the daemon holds (0: no such client).
        current: u64,
    },
}

/// The client store.
#[derive(Debug)]
pub struct ClientStore {
    conn: Mutex<Connection>,
}

impl ClientStore {
    /// Opens (creating) `dir/engine.db`.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn open(dir: &Path) -> Result<Self, String> {
        let conn = crate::durable::open(&dir.join(ENGINE_DB))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS clients (
                 client_id TEXT PRIMARY KEY,
                 epoch INTEGER NOT NULL CHECK (epoch >= 1),
                 minor INTEGER NOT NULL DEFAULT 0
             );",
        )
        .map_err(|e| e.to_string())?;
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    /// A new owner negotiated at `minor`: a fresh stable ID at epoch 1.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn new_owner(&self, minor: u32) -> Result<Claim, String> {
        let client_id = format!("client-{}", uuid::Uuid::new_v4().simple());
        let conn = self.conn.lock().map_err(|_| "poisoned".to_string())?;
        conn.execute(
            "INSERT INTO clients (client_id, epoch, minor) VALUES (?1, 1, ?2)",
            params![client_id, minor],
        )
        .map_err(|e| e.to_string())?;
        Ok(Claim::Won {
            client_id,
            epoch: 1,
        })
    }

    /// A reconnect negotiated at `minor`: the compare-and-swap from `expected` to
    /// `expected + 1` (the minor is recorded only when it wins).
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn reconnect(&self, client_id: &str, expected: u64, minor: u32) -> Result<Claim, String> {
        let conn = self.conn.lock().map_err(|_| "poisoned".to_string())?;
        let expected_sql = i64::try_from(expected).unwrap_or(i64::MAX);
        let changed = conn
            .execute(
                "UPDATE clients SET epoch = epoch + 1, minor = ?3 WHERE client_id = ?1 AND epoch = ?2",
                params![client_id, expected_sql, minor],
            )
            .map_err(|e| e.to_string())?;
        if changed == 1 {
            return Ok(Claim::Won {
                client_id: client_id.to_string(),
                epoch: expected + 1,
            });
        }
        let current: Option<i64> = conn
            .query_row(
                "SELECT epoch FROM clients WHERE client_id = ?1",
                params![client_id],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| e.to_string())?;
        Ok(Claim::Stale {
            current: current.map_or(0, |c| c as u64),
        })
    }
}

/// A client's standing: the epoch it holds and the minor it negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// The current epoch.
    pub epoch: u64,
    /// The negotiated minor version.
    pub minor: u32,
}

impl ClientStore {
    /// The standing of `client_id`, `None` for an unknown client.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn standing(&self, client_id: &str) -> Result<Option<Standing>, String> {
        let conn = self.conn.lock().map_err(|_| "poisoned".to_string())?;
        conn.query_row(
            "SELECT epoch, minor FROM clients WHERE client_id = ?1",
            params![client_id],
            |row| {
                Ok(Standing {
                    epoch: row.get::<_, i64>(0)? as u64,
                    minor: row.get(1)?,
                })
            },
        )
        .optional()
        .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_winner_per_epoch_and_stale_claims_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = ClientStore::open(dir.path()).unwrap();
        let Claim::Won { client_id, epoch } = store.new_owner(1).unwrap() else {
            panic!("a new owner always wins")
        };
        assert_eq!(epoch, 1);
        assert_eq!(
            store.reconnect(&client_id, 1, 1).unwrap(),
            Claim::Won {
                client_id: client_id.clone(),
                epoch: 2
            }
        );
        assert_eq!(
            store.reconnect(&client_id, 1, 1).unwrap(),
            Claim::Stale { current: 2 }
        );
        assert_eq!(
            store.reconnect("client-unknown", 1, 1).unwrap(),
            Claim::Stale { current: 0 }
        );
        // Racing reconnects from epoch 2: exactly one wins.
        let store = std::sync::Arc::new(store);
        let wins: usize = (0..8)
            .map(|_| {
                let store = store.clone();
                let id = client_id.clone();
                std::thread::spawn(move || store.reconnect(&id, 2, 1).unwrap())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| usize::from(matches!(t.join().unwrap(), Claim::Won { .. })))
            .sum();
        assert_eq!(wins, 1);
        drop(store);
        // Durable.
        let again = ClientStore::open(dir.path()).unwrap();
        assert_eq!(
            again.reconnect(&client_id, 3, 1).unwrap(),
            Claim::Won {
                client_id,
                epoch: 4
            }
        );
    }
}
