//! `maintenance.originate` and `maintenance.assess` (`WK-HOST-019`, our reference
//! choice): a durable work item per request identity, assessed once.
//!
//! * `maintenance.originate {purpose, reason, evidence_refs}` → `{work_item_id, state}`:
//!   a new item (`state: "open"`, its ID minted by the host, `wi-<n>`), or, for a retry of
//!   the same execution/request identity with the same content, the item it made (in its
//!   state now); the same identity with other content is refused `request_conflict`.
//! * `maintenance.assess {work_item_id, outcome}` → `{work_item_id, state: "assessed",
//!   outcome}`: the outcome is recorded once; the same outcome again answers the same,
//!   another is refused `already_assessed`, an unknown item `unknown_work_item`.

use rusqlite::{OptionalExtension, Transaction, params};
use serde_json::{Value, json};

use super::{HostStores, StoreError, bounded, count, encoded};

/// The table.
pub(super) const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS work_items (
    seq INTEGER PRIMARY KEY,
    work_item_id TEXT NOT NULL UNIQUE,
    identity TEXT NOT NULL UNIQUE,
    purpose TEXT NOT NULL,
    reason TEXT NOT NULL,
    evidence_refs TEXT NOT NULL,
    outcome TEXT
);\n";

fn state(outcome: &Option<String>) -> &'static str {
    if outcome.is_some() {
        "assessed"
    } else {
        "open"
    }
}

impl HostStores {
    /// `maintenance.originate` (see the module docs).
    pub(super) fn originate(
        &self,
        identity: &str,
        purpose: &str,
        reason: &str,
        evidence_refs: &[String],
    ) -> Result<Value, StoreError> {
        bounded("purpose", purpose)?;
        bounded("reason", reason)?;
        let refs = encoded("evidence_refs", &evidence_refs)?;
        let prefix = self.prefix("wi-", "work-item-");
        let cap = self.caps.work_items;
        self.write(|tx| {
            let existing = tx
                .query_row(
                    "SELECT work_item_id, purpose, reason, evidence_refs, outcome
                     FROM work_items WHERE identity = ?1",
                    params![identity],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, String>(2)?,
                            r.get::<_, String>(3)?,
                            r.get::<_, Option<String>>(4)?,
                        ))
                    },
                )
                .optional()?;
            if let Some((id, p, r, e, outcome)) = existing {
                if (p.as_str(), r.as_str(), super::decoded(&e))
                    != (purpose, reason, json!(evidence_refs))
                {
                    return Err(StoreError::Conflict {
                        code: "request_conflict",
                        message: format!(
                            "request {identity} originated work item {id:?} with other content"
                        ),
                    });
                }
                return Ok(json!({"work_item_id": id, "state": state(&outcome)}));
            }
            if count(tx, "work_items")? >= cap {
                return Err(StoreError::Full {
                    kind: "work items",
                    max: cap,
                });
            }
            let id = next_id(tx, prefix)?;
            tx.execute(
                "INSERT INTO work_items (work_item_id, identity, purpose, reason, evidence_refs)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![id, identity, purpose, reason, refs],
            )?;
            Ok(json!({"work_item_id": id, "state": "open"}))
        })
    }

    /// `maintenance.assess` (see the module docs).
    pub(super) fn assess(&self, work_item_id: &str, outcome: &str) -> Result<Value, StoreError> {
        bounded("outcome", outcome)?;
        self.write(|tx| {
            let recorded = tx
                .query_row(
                    "SELECT outcome FROM work_items WHERE work_item_id = ?1",
                    params![work_item_id],
                    |r| r.get::<_, Option<String>>(0),
                )
                .optional()?
                .ok_or_else(|| StoreError::Unknown {
                    kind: "work_item",
                    id: work_item_id.to_string(),
                })?;
            match recorded {
                Some(o) if o != outcome => {
                    return Err(StoreError::AlreadyAssessed(work_item_id.to_string()));
                }
                Some(_) => {}
                None => {
                    tx.execute(
                        "UPDATE work_items SET outcome = ?2 WHERE work_item_id = ?1",
                        params![work_item_id, outcome],
                    )?;
                }
            }
            Ok(json!({"work_item_id": work_item_id, "state": "assessed", "outcome": outcome}))
        })
    }
}

/// The next `<prefix><n>` of the table (`n` one past the last row's sequence number).
fn next_id(tx: &Transaction<'_>, prefix: &str) -> Result<String, StoreError> {
    let last: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM work_items", [], |r| {
        r.get(0)
    })?;
    Ok(format!("{prefix}{}", last + 1))
}
