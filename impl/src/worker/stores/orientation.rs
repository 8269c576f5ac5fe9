//! `orientation.stage`, `orientation.current` and `orientation.adopt` (`WK-HOST-020`, our
//! reference choice): staged candidates, each in one scope, and the adoptions that make
//! one the scope's current orientation.
//!
//! * `orientation.stage {candidate_id, text, target, scope}` → `{candidate_id, scope}`:
//!   the candidate is stored; staging it again with the same content answers the same,
//!   with other content (text, target or scope) it is refused `candidate_conflict`.
//!   `candidate_id` is an identifier (`invalid_identifier`).
//! * `orientation.current {scope}` → `{scope, adopted}`: `adopted` the scope's last
//!   adopted candidate `{candidate_id, text, target, operation_id}`, or `null`.
//! * `orientation.adopt {candidate_id, operation_id}` → `{operation_id, candidate_id,
//!   scope, previous}`: the candidate becomes its scope's current one (`previous` the
//!   one it replaced, or `null`); the same `operation_id` again answers the first
//!   adoption and adopts nothing (with another candidate it is refused
//!   `operation_conflict`); an unknown candidate is refused `unknown_candidate`.

use rusqlite::{OptionalExtension, params};
use serde_json::{Value, json};

use super::{HostStores, StoreError, bounded, count, decoded, encoded, identifier};
use crate::worker::wire::requests::Scope;

/// The tables. `scope` is the scope's JSON encoding.
pub(super) const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS candidates (
    candidate_id TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    target TEXT NOT NULL,
    scope TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS adoptions (
    seq INTEGER PRIMARY KEY,
    operation_id TEXT NOT NULL UNIQUE,
    candidate_id TEXT NOT NULL REFERENCES candidates(candidate_id),
    scope TEXT NOT NULL,
    previous TEXT
);\n";

impl HostStores {
    /// `orientation.stage` (see the module docs).
    pub(super) fn stage(
        &self,
        candidate_id: &str,
        text: &str,
        target: &str,
        scope: &Scope,
    ) -> Result<Value, StoreError> {
        identifier("candidate_id", candidate_id)?;
        bounded("text", text)?;
        bounded("target", target)?;
        let scope_text = encoded("scope", scope)?;
        let cap = self.caps.candidates;
        self.write(|tx| {
            let existing = tx
                .query_row(
                    "SELECT text, target, scope FROM candidates WHERE candidate_id = ?1",
                    params![candidate_id],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, String>(2)?,
                        ))
                    },
                )
                .optional()?;
            match existing {
                Some((t, g, s))
                    if (t.as_str(), g.as_str(), s.as_str())
                        != (text, target, scope_text.as_str()) =>
                {
                    return Err(StoreError::Conflict {
                        code: "candidate_conflict",
                        message: format!("candidate {candidate_id:?} is staged with other content"),
                    });
                }
                Some(_) => {}
                None => {
                    if count(tx, "candidates")? >= cap {
                        return Err(StoreError::Full {
                            kind: "orientation candidates",
                            max: cap,
                        });
                    }
                    tx.execute(
                        "INSERT INTO candidates (candidate_id, text, target, scope)
                         VALUES (?1, ?2, ?3, ?4)",
                        params![candidate_id, text, target, scope_text],
                    )?;
                }
            }
            Ok(json!({"candidate_id": candidate_id, "scope": scope}))
        })
    }

    /// `orientation.current` (see the module docs).
    pub(super) fn current(&self, scope: &Scope) -> Result<Value, StoreError> {
        let scope_text = encoded("scope", scope)?;
        self.write(|tx| {
            let adopted = tx
                .query_row(
                    "SELECT a.candidate_id, c.text, c.target, a.operation_id
                     FROM adoptions a JOIN candidates c ON c.candidate_id = a.candidate_id
                     WHERE a.scope = ?1 ORDER BY a.seq DESC LIMIT 1",
                    params![scope_text],
                    |r| {
                        Ok(json!({
                            "candidate_id": r.get::<_, String>(0)?,
                            "text": r.get::<_, String>(1)?,
                            "target": r.get::<_, String>(2)?,
                            "operation_id": r.get::<_, String>(3)?,
                        }))
                    },
                )
                .optional()?;
            Ok(json!({"scope": scope, "adopted": adopted}))
        })
    }

    /// `orientation.adopt` (see the module docs).
    pub(super) fn adopt(
        &self,
        candidate_id: &str,
        operation_id: &str,
    ) -> Result<Value, StoreError> {
        identifier("candidate_id", candidate_id)?;
        identifier("operation_id", operation_id)?;
        let cap = self.caps.adoptions;
        self.write(|tx| {
            let answer = |candidate: String, scope: String, previous: Option<String>| {
                json!({
                    "operation_id": operation_id,
                    "candidate_id": candidate,
                    "scope": decoded(&scope),
                    "previous": previous,
                })
            };
            let done = tx
                .query_row(
                    "SELECT candidate_id, scope, previous FROM adoptions WHERE operation_id = ?1",
                    params![operation_id],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, Option<String>>(2)?,
                        ))
                    },
                )
                .optional()?;
            if let Some((candidate, scope, previous)) = done {
                if candidate != candidate_id {
                    return Err(StoreError::Conflict {
                        code: "operation_conflict",
                        message: format!(
                            "operation {operation_id:?} adopted candidate {candidate:?}, not {candidate_id:?}"
                        ),
                    });
                }
                return Ok(answer(candidate, scope, previous));
            }
            let scope = tx
                .query_row(
                    "SELECT scope FROM candidates WHERE candidate_id = ?1",
                    params![candidate_id],
                    |r| r.get::<_, String>(0),
                )
                .optional()?
                .ok_or_else(|| StoreError::Unknown {
                    kind: "candidate",
                    id: candidate_id.to_string(),
                })?;
            if count(tx, "adoptions")? >= cap {
                return Err(StoreError::Full {
                    kind: "orientation adoptions",
                    max: cap,
                });
            }
            let previous = tx
                .query_row(
                    "SELECT candidate_id FROM adoptions WHERE scope = ?1 ORDER BY seq DESC LIMIT 1",
                    params![scope],
                    |r| r.get::<_, String>(0),
                )
                .optional()?;
            tx.execute(
                "INSERT INTO adoptions (operation_id, candidate_id, scope, previous)
                 VALUES (?1, ?2, ?3, ?4)",
                params![operation_id, candidate_id, scope, previous],
            )?;
            Ok(answer(candidate_id.to_string(), scope, previous))
        })
    }
}
