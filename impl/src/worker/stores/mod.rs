//! The host's own durable stores behind the request variants the spec lists with a shape
//! and no further behaviour ("Message vocabulary": `maintenance.*`, `orientation.*`,
//! `peer.*`, with the aliases `agents.open` and `peer.message`). Every reply shape and
//! error code here is our reference choice (catalog `WK-HOST-019` onwards,
//! `docs/worker-host-control.md`, "Source work and the slots"); the spec fixes the request
//! shapes, the idempotency of a retry by its execution/request identity ("Scope, waiting
//! and receipts") and that host effects need the live execution (the host's routing sees
//! to that: a request reaches [`HostStores::handle`] only from the running execution).
//!
//! * [`maintenance`]: work items, originated once per request identity, assessed once.
//! * [`orientation`]: staged candidates per scope, adoptions idempotent by operation ID.
//! * [`peers`]: a registry of peers and their requests within this host: results, waits
//!   bounded by [`PEER_RESULT_WAIT_MS_MAX`], cancels and stops (with or without drain).
//!
//! One SQLite database (`stores.db` in the host's data directory, 0600, WAL,
//! `synchronous=FULL`); every write is one `IMMEDIATE` transaction, so a retry racing its
//! first attempt finds it. Rows per kind are capped ([`Caps`]) and every text a reply
//! echoes is bounded ([`TEXT_MAX_BYTES`]), so no reply outgrows a frame. `frontier.select`
//! and `remote.*` are not served here ([`unsupported_reason`] says why). This module never
//! speaks the worker wire and never decides scope.

pub mod maintenance;
pub mod orientation;
pub mod peers;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, Transaction, TransactionBehavior};
use serde_json::Value;
use tokio::sync::Notify;

use crate::worker::host::PendingReply;
use crate::worker::wire::{HostRequest, Identifier, Reply};

/// The most bytes of one text a store keeps and echoes (`purpose`, `reason`, `outcome`,
/// `text`, `target`, `content`) and of one JSON value's encoding (`evidence`,
/// `evidence_refs`, `result`): our reference choice, the spec's bound of text a cell
/// returns ("returned text <=65,536 bytes", "Transport and bounds"), so that a reply
/// echoing a few of them stays far below the 1,048,576-byte frame.
pub const TEXT_MAX_BYTES: usize = 65_536;

/// The longest `peer.result` wait, in milliseconds: our reference choice (the spec shows
/// `wait_ms` and no bound). Past it the request is refused `wait_out_of_range`.
pub const PEER_RESULT_WAIT_MS_MAX: u64 = 30_000;

/// The most work items the store holds (our reference choice; past it `store_full`).
pub const WORK_ITEMS_MAX: u64 = 4096;
/// The most staged orientation candidates (our reference choice; past it `store_full`).
pub const CANDIDATES_MAX: u64 = 1024;
/// The most orientation adoptions (our reference choice; past it `store_full`).
pub const ADOPTIONS_MAX: u64 = 4096;
/// The most peers, so that `peer.list` answers them all in one frame (our reference
/// choice; past it `store_full`).
pub const PEERS_MAX: u64 = 256;
/// The most peer requests, of all peers (our reference choice; past it `store_full`).
pub const PEER_REQUESTS_MAX: u64 = 4096;

/// How many rows of each kind a store takes (the `*_MAX` constants; tests use less).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// [`WORK_ITEMS_MAX`].
    pub work_items: u64,
    /// [`CANDIDATES_MAX`].
    pub candidates: u64,
    /// [`ADOPTIONS_MAX`].
    pub adoptions: u64,
    /// [`PEERS_MAX`].
    pub peers: u64,
    /// [`PEER_REQUESTS_MAX`].
    pub peer_requests: u64,
}

impl Caps {
    /// The reference caps.
    pub const REFERENCE: Self = Self {
        work_items: WORK_ITEMS_MAX,
        candidates: CANDIDATES_MAX,
        adoptions: ADOPTIONS_MAX,
        peers: PEERS_MAX,
        peer_requests: PEER_REQUESTS_MAX,
    };
}

/// Why a store request is refused. Every variant has a stable [`code`](Self::code).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    /// A field that must be an identifier ("Identifiers are 1..128 ASCII
    /// letters/digits/underscore/dot/hyphen") is not one.
    #[error("`{field}` is not an identifier: {reason}")]
    InvalidIdentifier {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A text or value over [`TEXT_MAX_BYTES`].
    #[error("`{field}` is {len} bytes, over the {TEXT_MAX_BYTES}-byte bound")]
    TooLarge {
        /// The field.
        field: &'static str,
        /// Its length (a value's: its JSON encoding's).
        len: usize,
    },
    /// The store holds as many rows of that kind as it takes.
    #[error("the store holds {max} {kind}, as many as it takes")]
    Full {
        /// The kind (`work items`, `peers`, …).
        kind: &'static str,
        /// The cap.
        max: u64,
    },
    /// The same identity (a request identity, a candidate, operation or request ID) with
    /// other content: `request_conflict`, `candidate_conflict`, `operation_conflict`,
    /// `result_conflict`.
    #[error("{message}")]
    Conflict {
        /// The code.
        code: &'static str,
        /// What differs.
        message: String,
    },
    /// An ID the store never minted or recorded.
    #[error("unknown {kind} {id:?}")]
    Unknown {
        /// `work_item`, `candidate`, `peer`, `request`.
        kind: &'static str,
        /// The ID.
        id: String,
    },
    /// A work item already assessed with another outcome.
    #[error("work item {0:?} was already assessed with another outcome")]
    AlreadyAssessed(String),
    /// A send to a peer that is stopped or draining.
    #[error("peer {peer_id:?} is {state}: it takes no new request")]
    PeerNotOpen {
        /// The peer.
        peer_id: String,
        /// `stopped` or `draining`.
        state: String,
    },
    /// A result for, or a cancel of, a request in a state that does not take it.
    #[error("request {request_id:?} is {state}")]
    RequestSettled {
        /// The request.
        request_id: String,
        /// `cancelled` (no result is taken) or `resolved` (it cannot be cancelled).
        state: &'static str,
    },
    /// `wait_ms` over [`PEER_RESULT_WAIT_MS_MAX`].
    #[error("wait_ms must be at most {PEER_RESULT_WAIT_MS_MAX}, got {0}")]
    WaitOutOfRange(u64),
    /// The database failed (nothing was recorded).
    #[error("the store failed: {0}")]
    Store(String),
}

impl StoreError {
    /// The stable reply code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidIdentifier { .. } => "invalid_identifier",
            Self::TooLarge { .. } => "too_large",
            Self::Full { .. } => "store_full",
            Self::Conflict { code, .. } => code,
            Self::Unknown { kind, .. } => match *kind {
                "work_item" => "unknown_work_item",
                "candidate" => "unknown_candidate",
                "peer" => "unknown_peer",
                _ => "unknown_request",
            },
            Self::AlreadyAssessed(_) => "already_assessed",
            Self::PeerNotOpen { .. } => "peer_not_open",
            Self::RequestSettled { state, .. } => {
                if *state == "cancelled" {
                    "request_cancelled"
                } else {
                    "request_resolved"
                }
            }
            Self::WaitOutOfRange(_) => "wait_out_of_range",
            Self::Store(_) => "store_failed",
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Store(e.to_string())
    }
}

/// Why the host answers `method` `unsupported_method` although the spec lists it, or
/// `None` for a method it serves.
pub fn unsupported_reason(request: &HostRequest) -> Option<&'static str> {
    Some(match request {
        HostRequest::FrontierSelect {} => {
            "the spec gives frontier.select a request shape and no selection rule"
        }
        HostRequest::RemoteEnsure { .. }
        | HostRequest::RemoteCall { .. }
        | HostRequest::RemoteCancel { .. }
        | HostRequest::RemoteClose { .. } => {
            "this host has no remote transport, and the spec gives remote.* request shapes only"
        }
        _ => return None,
    })
}

/// Checks that `value` is an identifier.
pub(crate) fn identifier(field: &'static str, value: &str) -> Result<(), StoreError> {
    crate::worker::wire::ids::check_identifier(value)
        .map_err(|reason| StoreError::InvalidIdentifier { field, reason })
}

/// Checks that `text` is at most [`TEXT_MAX_BYTES`].
pub(crate) fn bounded(field: &'static str, text: &str) -> Result<(), StoreError> {
    if text.len() > TEXT_MAX_BYTES {
        return Err(StoreError::TooLarge {
            field,
            len: text.len(),
        });
    }
    Ok(())
}

/// The JSON encoding of `value`, at most [`TEXT_MAX_BYTES`].
pub(crate) fn encoded(
    field: &'static str,
    value: &impl serde::Serialize,
) -> Result<String, StoreError> {
    let text = serde_json::to_string(value).map_err(|e| StoreError::Store(e.to_string()))?;
    bounded(field, &text)?;
    Ok(text)
}

/// A stored JSON encoding, read back (`null` if it is not JSON, which the store never
/// writes).
pub(crate) fn decoded(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// How many rows `table` holds.
pub(crate) fn count(tx: &Transaction<'_>, table: &str) -> Result<u64, StoreError> {
    let n: i64 = tx.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The host's stores (see the module docs).
#[derive(Debug)]
pub struct HostStores {
    conn: Mutex<Connection>,
    caps: Caps,
    different: bool,
    /// Woken whenever a peer request is resolved or cancelled, for `peer.result` waits.
    changed: Notify,
}

impl HostStores {
    /// Opens (creating) `dir/stores.db` with the [`Caps::REFERENCE`] caps. `different`:
    /// every code is reported under another name (`host-unknown-peer`) and minted IDs take
    /// other prefixes, for the vendor-mode trial of the suite.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn open(dir: &Path, different: bool) -> Result<Self, String> {
        Self::open_with(dir, different, Caps::REFERENCE)
    }

    /// [`HostStores::open`] with other caps.
    ///
    /// # Errors
    /// The SQLite error, as text.
    pub fn open_with(dir: &Path, different: bool, caps: Caps) -> Result<Self, String> {
        let conn = crate::durable::open(&dir.join("stores.db"))?;
        conn.execute_batch(&format!(
            "{}{}{}",
            maintenance::SCHEMA,
            orientation::SCHEMA,
            peers::SCHEMA
        ))
        .map_err(|e| e.to_string())?;
        Ok(Self {
            conn: Mutex::new(conn),
            caps,
            different,
            changed: Notify::new(),
        })
    }

    /// Runs `f` in one `IMMEDIATE` transaction, committed when it succeeds.
    fn write<T>(
        &self,
        f: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::Store("poisoned".into()))?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let value = f(&tx)?;
        tx.commit()?;
        Ok(value)
    }

    /// The prefix of the IDs this store mints of `kind` (`wi-`, `p-`).
    fn prefix(&self, reference: &'static str, different: &'static str) -> &'static str {
        if self.different { different } else { reference }
    }

    /// A code as this host reports it: ours, or (`different`) another name for it.
    fn code(&self, ours: &str) -> String {
        if self.different {
            format!("host-{}", ours.replace('_', "-"))
        } else {
            ours.to_string()
        }
    }

    fn reply(&self, outcome: Result<Value, StoreError>) -> Reply {
        match outcome {
            Ok(value) => Reply::Ok { value },
            Err(e) => Reply::Error {
                code: self.code(e.code()),
                message: e.to_string(),
            },
        }
    }

    /// The reply to `request` of execution `execution_id` of `session`, or `None` when the
    /// method is not one of these stores'. The host calls it only for the live execution.
    pub fn handle(
        &self,
        session: &str,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Option<Reply> {
        // The identity of a retry ("Scope, waiting and receipts"), as local.send's.
        let identity =
            || crate::worker::lane::effect_id(session, execution_id.as_str(), request_id.as_str());
        let outcome = match request {
            HostRequest::MaintenanceOriginate {
                purpose,
                reason,
                evidence_refs,
            } => self.originate(&identity(), purpose, reason, evidence_refs),
            HostRequest::MaintenanceAssess {
                work_item_id,
                outcome,
            } => self.assess(work_item_id, outcome),
            HostRequest::OrientationStage {
                candidate_id,
                text,
                target,
                scope,
            } => self.stage(candidate_id, text, target, scope),
            HostRequest::OrientationCurrent { scope } => self.current(scope),
            HostRequest::OrientationAdopt {
                candidate_id,
                operation_id,
            } => self.adopt(candidate_id, operation_id),
            HostRequest::PeerOpen { mode, evidence } => self.open_peer(&identity(), mode, evidence),
            HostRequest::PeerSend {
                peer_id,
                request_id,
                content,
                evidence,
            } => self.send(peer_id, request_id, content, evidence),
            HostRequest::PeerResult {
                request_id,
                wait_ms,
            } => peers::check_wait(*wait_ms).and_then(|()| self.result(request_id)),
            HostRequest::PeerSubmitResult { request_id, result } => {
                self.submit_result(request_id, result)
            }
            HostRequest::PeerCancel { request_id } => self.cancel(request_id),
            HostRequest::PeerGet { peer_id } => self.get_peer(peer_id),
            HostRequest::PeerList {} => self.list_peers(),
            HostRequest::PeerStop { peer_id, drain } => self.stop_peer(peer_id, *drain),
            _ => return None,
        };
        Some(self.reply(outcome))
    }

    /// A `peer.result` that waits (`wait_ms` > 0 and in range, the request pending) as a
    /// reply the cell makes beside its exchange, so that the cell's other requests (a
    /// `peer.submit_result` among them) are answered meanwhile; `None` for any other
    /// request, which [`HostStores::handle`] answers at once.
    pub fn start(self: &Arc<Self>, request: &HostRequest) -> Option<PendingReply> {
        let HostRequest::PeerResult {
            request_id,
            wait_ms,
        } = request
        else {
            return None;
        };
        if *wait_ms == 0 || peers::check_wait(*wait_ms).is_err() {
            return None;
        }
        let stores = self.clone();
        let (request_id, wait_ms) = (request_id.clone(), *wait_ms);
        Some(Box::pin(async move {
            let outcome = stores.wait_result(&request_id, wait_ms).await;
            stores.reply(outcome)
        }))
    }
}
