//! The peer registry of this host (`WK-HOST-021`, `WK-HOST-022`, our reference choice):
//! peers, the requests sent to them and their results. No peer process is started here:
//! a peer is a durable record, its requests are answered by a `peer.submit_result`.
//!
//! * `peer.open {mode, evidence}` (alias `agents.open`) → the peer's record `{peer_id,
//!   mode, state: "open", evidence, requests: {pending, resolved, cancelled}}`; the
//!   `peer_id` is minted by the host (`p-<n>`); a retry of the same execution/request
//!   identity answers the same peer (with other content: `request_conflict`). `mode` is
//!   an identifier.
//! * `peer.send {peer_id, request_id, content, evidence}` (alias `peer.message`) →
//!   `{request_id, peer_id, state}`: a new request is `pending`; the same `request_id`
//!   again with the same content answers it as it is now (with other content:
//!   `request_conflict`); a peer that is not `open` takes no new request
//!   (`peer_not_open`), an unknown one `unknown_peer`.
//! * `peer.submit_result {request_id, result}` → `{request_id, peer_id, state:
//!   "resolved"}`: recorded once (the same result again answers the same, another is
//!   `result_conflict`); a cancelled request takes none (`request_cancelled`).
//! * `peer.result {request_id, wait_ms}` → `{request_id, peer_id, state, result}` when
//!   resolved, else `{request_id, peer_id, state}` (`pending` or `cancelled`), once the
//!   request is settled or `wait_ms` passed; `wait_ms` at most
//!   [`super::PEER_RESULT_WAIT_MS_MAX`] (`wait_out_of_range`).
//! * `peer.cancel {request_id}` → `{request_id, peer_id, state: "cancelled"}` for a
//!   pending or cancelled request; a resolved one is `request_resolved`.
//! * `peer.get {peer_id}` → the record; `peer.list` → `{peers: [...]}`, oldest first,
//!   each record without its `evidence`.
//! * `peer.stop {peer_id, drain}` → the record: without drain every pending request is
//!   cancelled and the peer is `stopped`; with drain a peer with pending requests is
//!   `draining` (no new request, the pending ones still resolve or cancel) and becomes
//!   `stopped` when the last one settles. Stopping a stopped peer answers its record.
//!
//! Unknown IDs are `unknown_peer`, `unknown_request`.

use std::time::Duration;

use rusqlite::{OptionalExtension, Transaction, params};
use serde_json::{Value, json};

use super::{
    HostStores, PEER_RESULT_WAIT_MS_MAX, StoreError, bounded, count, decoded, encoded, identifier,
};

/// The tables.
pub(super) const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS peers (
    seq INTEGER PRIMARY KEY,
    peer_id TEXT NOT NULL UNIQUE,
    identity TEXT NOT NULL UNIQUE,
    mode TEXT NOT NULL,
    evidence TEXT NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS peer_requests (
    seq INTEGER PRIMARY KEY,
    request_id TEXT NOT NULL UNIQUE,
    peer_id TEXT NOT NULL REFERENCES peers(peer_id),
    content TEXT NOT NULL,
    evidence TEXT NOT NULL,
    state TEXT NOT NULL,
    result TEXT
);\n";

/// Checks `wait_ms` against [`PEER_RESULT_WAIT_MS_MAX`].
///
/// # Errors
/// [`StoreError::WaitOutOfRange`].
pub fn check_wait(wait_ms: u64) -> Result<(), StoreError> {
    if wait_ms > PEER_RESULT_WAIT_MS_MAX {
        return Err(StoreError::WaitOutOfRange(wait_ms));
    }
    Ok(())
}

/// The state of peer `peer_id` (`unknown_peer` when there is none).
fn peer_state(tx: &Transaction<'_>, peer_id: &str) -> Result<String, StoreError> {
    tx.query_row(
        "SELECT state FROM peers WHERE peer_id = ?1",
        params![peer_id],
        |r| r.get::<_, String>(0),
    )
    .optional()?
    .ok_or_else(|| unknown_peer(peer_id))
}

fn unknown_peer(peer_id: &str) -> StoreError {
    StoreError::Unknown {
        kind: "peer",
        id: peer_id.to_string(),
    }
}

fn unknown_request(request_id: &str) -> StoreError {
    StoreError::Unknown {
        kind: "request",
        id: request_id.to_string(),
    }
}

/// A peer's record (`with_evidence`: as `peer.get` answers it; else as `peer.list`).
fn record(tx: &Transaction<'_>, peer_id: &str, with_evidence: bool) -> Result<Value, StoreError> {
    let (mode, evidence, state) = tx
        .query_row(
            "SELECT mode, evidence, state FROM peers WHERE peer_id = ?1",
            params![peer_id],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            },
        )
        .optional()?
        .ok_or_else(|| unknown_peer(peer_id))?;
    let counted = |state: &str| -> Result<i64, StoreError> {
        Ok(tx.query_row(
            "SELECT COUNT(*) FROM peer_requests WHERE peer_id = ?1 AND state = ?2",
            params![peer_id, state],
            |r| r.get(0),
        )?)
    };
    let mut value = json!({
        "peer_id": peer_id,
        "mode": mode,
        "state": state,
        "requests": {
            "pending": counted("pending")?,
            "resolved": counted("resolved")?,
            "cancelled": counted("cancelled")?,
        },
    });
    if with_evidence {
        value["evidence"] = decoded(&evidence);
    }
    Ok(value)
}

/// A request as it is: `(peer_id, content, evidence, state, result)`.
type Request = (String, String, String, String, Option<String>);

fn request(tx: &Transaction<'_>, request_id: &str) -> Result<Option<Request>, StoreError> {
    Ok(tx
        .query_row(
            "SELECT peer_id, content, evidence, state, result FROM peer_requests
             WHERE request_id = ?1",
            params![request_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .optional()?)
}

/// A request's answer: with its result when `with_result` and it is resolved.
fn view(request_id: &str, request: &Request, with_result: bool) -> Value {
    let (peer_id, _, _, state, result) = request;
    let mut value = json!({"request_id": request_id, "peer_id": peer_id, "state": state});
    if with_result && let Some(result) = result {
        value["result"] = decoded(result);
    }
    value
}

/// A draining peer with no pending request left is stopped.
fn settle_peer(tx: &Transaction<'_>, peer_id: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE peers SET state = 'stopped' WHERE peer_id = ?1 AND state = 'draining'
         AND NOT EXISTS (SELECT 1 FROM peer_requests WHERE peer_id = ?1 AND state = 'pending')",
        params![peer_id],
    )?;
    Ok(())
}

impl HostStores {
    /// `peer.open` (see the module docs).
    pub(super) fn open_peer(
        &self,
        identity: &str,
        mode: &str,
        evidence: &[Value],
    ) -> Result<Value, StoreError> {
        identifier("mode", mode)?;
        let evidence_text = encoded("evidence", &evidence)?;
        let prefix = self.prefix("p-", "peer-");
        let cap = self.caps.peers;
        self.write(|tx| {
            let existing = tx
                .query_row(
                    "SELECT peer_id, mode, evidence FROM peers WHERE identity = ?1",
                    params![identity],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            r.get::<_, String>(1)?,
                            r.get::<_, String>(2)?,
                        ))
                    },
                )
                .optional()?;
            if let Some((peer_id, m, e)) = existing {
                if m != mode || decoded(&e) != json!(evidence) {
                    return Err(StoreError::Conflict {
                        code: "request_conflict",
                        message: format!(
                            "request {identity} opened peer {peer_id:?} with other content"
                        ),
                    });
                }
                return record(tx, &peer_id, true);
            }
            if count(tx, "peers")? >= cap {
                return Err(StoreError::Full {
                    kind: "peers",
                    max: cap,
                });
            }
            let last: i64 =
                tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM peers", [], |r| r.get(0))?;
            let peer_id = format!("{prefix}{}", last + 1);
            tx.execute(
                "INSERT INTO peers (peer_id, identity, mode, evidence, state)
                 VALUES (?1, ?2, ?3, ?4, 'open')",
                params![peer_id, identity, mode, evidence_text],
            )?;
            record(tx, &peer_id, true)
        })
    }

    /// `peer.send` (see the module docs).
    pub(super) fn send(
        &self,
        peer_id: &str,
        request_id: &str,
        content: &str,
        evidence: &[Value],
    ) -> Result<Value, StoreError> {
        identifier("request_id", request_id)?;
        bounded("content", content)?;
        let evidence_text = encoded("evidence", &evidence)?;
        let cap = self.caps.peer_requests;
        self.write(|tx| {
            if let Some(existing) = request(tx, request_id)? {
                let (p, c, e, _, _) = &existing;
                if p != peer_id || c != content || decoded(e) != json!(evidence) {
                    return Err(StoreError::Conflict {
                        code: "request_conflict",
                        message: format!("request {request_id:?} was sent with other content"),
                    });
                }
                return Ok(view(request_id, &existing, false));
            }
            let state = peer_state(tx, peer_id)?;
            if state != "open" {
                return Err(StoreError::PeerNotOpen {
                    peer_id: peer_id.to_string(),
                    state,
                });
            }
            if count(tx, "peer_requests")? >= cap {
                return Err(StoreError::Full {
                    kind: "peer requests",
                    max: cap,
                });
            }
            tx.execute(
                "INSERT INTO peer_requests (request_id, peer_id, content, evidence, state)
                 VALUES (?1, ?2, ?3, ?4, 'pending')",
                params![request_id, peer_id, content, evidence_text],
            )?;
            Ok(json!({"request_id": request_id, "peer_id": peer_id, "state": "pending"}))
        })
    }

    /// `peer.submit_result` (see the module docs).
    pub(super) fn submit_result(
        &self,
        request_id: &str,
        result: &Value,
    ) -> Result<Value, StoreError> {
        let result_text = encoded("result", result)?;
        let outcome = self.write(|tx| {
            let existing = request(tx, request_id)?.ok_or_else(|| unknown_request(request_id))?;
            let (peer_id, _, _, state, recorded) = &existing;
            match state.as_str() {
                "cancelled" => {
                    return Err(StoreError::RequestSettled {
                        request_id: request_id.to_string(),
                        state: "cancelled",
                    });
                }
                "resolved" => {
                    if recorded.as_deref().map(decoded).as_ref() != Some(result) {
                        return Err(StoreError::Conflict {
                            code: "result_conflict",
                            message: format!(
                                "request {request_id:?} was resolved with another result"
                            ),
                        });
                    }
                }
                _ => {
                    tx.execute(
                        "UPDATE peer_requests SET state = 'resolved', result = ?2
                         WHERE request_id = ?1",
                        params![request_id, result_text],
                    )?;
                    settle_peer(tx, peer_id)?;
                }
            }
            Ok(json!({"request_id": request_id, "peer_id": peer_id, "state": "resolved"}))
        });
        self.changed.notify_waiters();
        outcome
    }

    /// `peer.result` without waiting (see the module docs).
    pub(super) fn result(&self, request_id: &str) -> Result<Value, StoreError> {
        self.write(|tx| {
            let existing = request(tx, request_id)?.ok_or_else(|| unknown_request(request_id))?;
            Ok(view(request_id, &existing, true))
        })
    }

    /// `peer.result` waiting at most `wait_ms` for the request to settle.
    pub(super) async fn wait_result(
        &self,
        request_id: &str,
        wait_ms: u64,
    ) -> Result<Value, StoreError> {
        check_wait(wait_ms)?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        loop {
            // Registered before the read: a change committed after it wakes this wait.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let value = self.result(request_id)?;
            if value["state"] != "pending" || tokio::time::Instant::now() >= deadline {
                return Ok(value);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.result(request_id);
            }
        }
    }

    /// `peer.cancel` (see the module docs).
    pub(super) fn cancel(&self, request_id: &str) -> Result<Value, StoreError> {
        let outcome = self.write(|tx| {
            let existing = request(tx, request_id)?.ok_or_else(|| unknown_request(request_id))?;
            let (peer_id, _, _, state, _) = &existing;
            match state.as_str() {
                "resolved" => {
                    return Err(StoreError::RequestSettled {
                        request_id: request_id.to_string(),
                        state: "resolved",
                    });
                }
                "pending" => {
                    tx.execute(
                        "UPDATE peer_requests SET state = 'cancelled' WHERE request_id = ?1",
                        params![request_id],
                    )?;
                    settle_peer(tx, peer_id)?;
                }
                _ => {}
            }
            Ok(json!({"request_id": request_id, "peer_id": peer_id, "state": "cancelled"}))
        });
        self.changed.notify_waiters();
        outcome
    }

    /// `peer.get` (see the module docs).
    pub(super) fn get_peer(&self, peer_id: &str) -> Result<Value, StoreError> {
        self.write(|tx| record(tx, peer_id, true))
    }

    /// `peer.list` (see the module docs).
    pub(super) fn list_peers(&self) -> Result<Value, StoreError> {
        self.write(|tx| {
            let ids: Vec<String> = {
                let mut statement = tx.prepare("SELECT peer_id FROM peers ORDER BY seq")?;
                let rows = statement.query_map([], |r| r.get::<_, String>(0))?;
                rows.collect::<Result<_, _>>()?
            };
            let peers = ids
                .iter()
                .map(|id| record(tx, id, false))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(json!({"peers": peers}))
        })
    }

    /// `peer.stop` (see the module docs).
    pub(super) fn stop_peer(&self, peer_id: &str, drain: bool) -> Result<Value, StoreError> {
        let outcome = self.write(|tx| {
            let state = peer_state(tx, peer_id)?;
            if state != "stopped" {
                if !drain {
                    tx.execute(
                        "UPDATE peer_requests SET state = 'cancelled'
                         WHERE peer_id = ?1 AND state = 'pending'",
                        params![peer_id],
                    )?;
                }
                tx.execute(
                    "UPDATE peers SET state = 'draining' WHERE peer_id = ?1",
                    params![peer_id],
                )?;
                settle_peer(tx, peer_id)?;
            }
            record(tx, peer_id, true)
        });
        self.changed.notify_waiters();
        outcome
    }
}
