//! Files writes ("Workspace operations": `workspace_write`).
//!
//! Order of one write (`PUT /v1/sessions/{id}/files/content`, `docs/core-api.md`):
//!
//! 1. Public checks, before any durable record or Runtime work: the path is a
//!    workspace-relative wire path, the decoded body is at most
//!    [`PUBLIC_INLINE_WRITE_MAX_BYTES`] ("the 5 MiB decoded inline limit the public API
//!    checks before any Runtime work"), a declared digest matches the body.
//! 2. The Session scheduling reservation ([`Core::files_reserved`]) and then the
//!    **durable** write reservation under the Session lock
//!    ([`CoreStore::reserve_write`](crate::core_runtime::store::CoreStore::reserve_write)),
//!    before public admission: from here on no Turn can be created or claimed for the
//!    Session, across restarts, until the reservation is exactly settled.
//! 3. Admission: a device whose declaration admits the read-only preparation profile
//!    (the daemon accepts a read-only admission handle as a `workspace_write` owner;
//!    Core never writes through a Run's execution owner here), `runtime_prepare`
//!    `initialize` once per connection and Environment, `execution_prepare` with the
//!    read-only profile → `ready`.
//! 4. `workspace_write` `begin` → `ready`; the body in ordered chunks of
//!    [`WRITE_CHUNK_MAX_BYTES`], each acknowledged by `received` with the same offset
//!    and the running total ("acknowledged 64 KiB frames"); `commit` → `committed` or
//!    `rejected`.
//! 5. Settlement: an exact `committed` receipt (same path, size and digest) settles the
//!    reservation `committed`; an exact `rejected` receipt settles it `rejected`. When
//!    no `workspace_write` frame ever entered the send queue (no device, preparation
//!    refused, connection lost before `begin`), nothing can have changed and the
//!    reservation is settled `abandoned`. Anything else — a lost connection, a timeout,
//!    an unexpected receipt — keeps it `reserved`: the write is `unknown` and the
//!    Session stays blocked ("A missing or ambiguous receipt keeps the uncertainty").
//! 6. `execution_release` → `released`, bounded by [`WRITE_RELEASE_TIMEOUT`]; the
//!    answer follows the receipt, a failed release is logged and does not change it.
//!
//! Nothing is retried or replayed, in this process or after a restart: a reservation
//! found reserved after a restart stays `unknown` until an operator settles it
//! (`contract-impl core write settle`).

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::files::{FilesError, Op, Reservation, SessionTarget, select, session_target, wire_code};
use super::{Core, TURN_QUEUE_MAX, now_ms};
use crate::core_runtime::gateway::connection::RouteKind;
use crate::core_runtime::store::{StoreError, WriteReservation, WriteState};
use crate::core_runtime::wire::limits::{PUBLIC_INLINE_WRITE_MAX_BYTES, WRITE_CHUNK_MAX_BYTES};
use crate::core_runtime::wire::{
    Frame, Message, Uuid, WirePath, WorkspaceTarget, WorkspaceWrite, WorkspaceWriteResult,
};
use crate::wire::bounded::{Base64Bytes, BoundedString};

/// Bound on one write, from the durable reservation to the commit receipt (Core
/// policy; the spec requires the transfer to be bounded but names no timer). A write
/// that reaches it without a receipt is `unknown`.
pub const FILES_WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// Bound on the `execution_release` that follows a write's receipt (Core policy).
pub const WRITE_RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// Length of a SHA-256 digest in lower-case hex.
pub const SHA256_HEX_LEN: usize = 64;

/// Why a write did not commit; [`WriteError::code`] is the public error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// A failure before any `workspace_write` frame was queued (the reservation, if
    /// one was made, is settled `abandoned`): the codes of [`FilesError`].
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The decoded body exceeds [`PUBLIC_INLINE_WRITE_MAX_BYTES`].
    #[error(
        "the decoded body has {0} bytes, over the {PUBLIC_INLINE_WRITE_MAX_BYTES}-byte inline limit"
    )]
    TooLarge(u64),
    /// The declared `sha256` is not 64 lower-case hex digits.
    #[error("sha256 must be {SHA256_HEX_LEN} lower-case hex digits")]
    InvalidDigest,
    /// The declared `sha256` does not match the body.
    #[error("the declared sha256 does not match the body")]
    DigestMismatch,
    /// The Runtime's exact rejection receipt: nothing was installed; settled `rejected`.
    /// (The message leaves the generated ID out: the answer's `write_id` member carries it.)
    #[error("the Runtime rejected the write: {code}")]
    Rejected {
        /// The reservation ID.
        write_id: String,
        /// The wire `error_code`.
        code: String,
    },
    /// No exact receipt: the reservation stays `reserved` (`unknown`) and blocks the
    /// Session until settled. (The message leaves the generated ID out: the answer's
    /// `write_id` member carries it.)
    #[error("the write's outcome is unknown ({reason}); the Session stays reserved")]
    Unknown {
        /// The reservation ID.
        write_id: String,
        /// What made it ambiguous (`connection_lost`, `timeout`, `unexpected_receipt`…).
        reason: String,
    },
}

impl WriteError {
    /// Stable public code.
    pub fn code(&self) -> &'static str {
        match self {
            WriteError::Files(e) => e.code(),
            WriteError::TooLarge(_) => "write_too_large",
            WriteError::InvalidDigest => "invalid_request",
            WriteError::DigestMismatch => "digest_mismatch",
            WriteError::Rejected { .. } => "write_rejected",
            WriteError::Unknown { .. } => "write_unknown",
        }
    }

    /// The reservation the error concerns, when one was made and not abandoned.
    pub fn write_id(&self) -> Option<&str> {
        match self {
            WriteError::Rejected { write_id, .. } | WriteError::Unknown { write_id, .. } => {
                Some(write_id)
            }
            _ => None,
        }
    }
}

impl From<StoreError> for WriteError {
    fn from(err: StoreError) -> Self {
        WriteError::Files(FilesError::Store(err))
    }
}

/// The committed write: the Runtime's exact receipt.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Committed {
    /// The reservation ID (also the `workspace_write` operation ID).
    pub write_id: String,
    /// The installed workspace-relative path.
    pub path: String,
    /// Installed size in bytes.
    pub size: u64,
    /// Verified SHA-256 (lower-case hex).
    pub sha256: String,
}

/// Public view of a durable write reservation (`GET …/files/writes/{write_id}`).
///
/// `state` is the stored state, except that a `reserved` reservation whose task does
/// not run in this process ([`Core::writes_in_flight`]) is shown as `unknown`.
pub fn public_state(core: &Core, reservation: &WriteReservation) -> &'static str {
    match reservation.state {
        WriteState::Reserved => {
            let running = core
                .writes_in_flight
                .lock()
                .map(|s| s.contains(&reservation.reservation_id))
                .unwrap_or(false);
            if running { "in_progress" } else { "unknown" }
        }
        state => state.as_str(),
    }
}

/// Removes the write from [`Core::writes_in_flight`] on every exit path.
struct InFlight {
    core: Arc<Core>,
    write_id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut set) = self.core.writes_in_flight.lock() {
            set.remove(&self.write_id);
        }
    }
}

/// How the dispatch phase ended.
enum Dispatch {
    /// An exact `committed` receipt matching the request.
    Committed,
    /// An exact `rejected` receipt.
    Rejected(String),
    /// No `workspace_write` frame entered the send queue.
    NotSent(FilesError),
    /// Anything else: the outcome is unknown.
    Unknown(String),
}

/// Core's public path check of a write: a non-empty workspace-relative file path of
/// single `/`-separated components, none empty, `.` or `..`, without NUL or backslash
/// (the Runtime applies the same rules and resolves symbolic links; the wire bound is
/// checked by [`WirePath`]).
///
/// # Errors
/// Why the path is refused.
pub fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("a file path is required");
    }
    if path.contains('\0') || path.contains('\\') {
        return Err("the path contains NUL or a backslash");
    }
    if path.starts_with('/') {
        return Err("the path is absolute");
    }
    if path
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err("the path has an empty, `.` or `..` component");
    }
    Ok(())
}

/// Checks and normalises the public request (step 1); returns the wire path and the
/// body's digest.
///
/// # Errors
/// [`FilesError::InvalidPath`], [`WriteError::TooLarge`], [`WriteError::InvalidDigest`],
/// [`WriteError::DigestMismatch`].
pub fn check_request(
    path: &str,
    body: &[u8],
    declared_sha256: Option<&str>,
) -> Result<(WirePath, String), WriteError> {
    check_path(path).map_err(|why| FilesError::InvalidPath(why.into()))?;
    let wire_path = WirePath::new(path).map_err(|e| FilesError::InvalidPath(e.to_string()))?;
    if body.len() as u64 > PUBLIC_INLINE_WRITE_MAX_BYTES {
        return Err(WriteError::TooLarge(body.len() as u64));
    }
    let digest = hex::encode(Sha256::digest(body));
    if let Some(declared) = declared_sha256 {
        if declared.len() != SHA256_HEX_LEN
            || !declared
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(WriteError::InvalidDigest);
        }
        if declared != digest {
            return Err(WriteError::DigestMismatch);
        }
    }
    Ok((wire_path, digest))
}

/// Writes `body` to `path` in the Session's workspace (see the module docs).
///
/// # Errors
/// Any [`WriteError`]; success is returned only on the Runtime's exact commit receipt.
pub async fn write(
    core: &Arc<Core>,
    session_id: &str,
    path: &str,
    body: Vec<u8>,
    declared_sha256: Option<&str>,
) -> Result<Committed, WriteError> {
    let (wire_path, digest) = check_request(path, &body, declared_sha256)?;
    let SessionTarget {
        session,
        agent_kind,
        session_uuid,
        environment_id,
        environment_type,
    } = session_target(core, session_id).await?;
    // The Session scheduling reservation (excludes Files reads and Turn claims).
    {
        let mut set = core
            .files_reserved
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !set.insert(session.session_id.clone()) {
            return Err(FilesError::SessionBusy.into());
        }
    }
    let key = format!("files-{}", Uuid::random());
    let mut reservation = Reservation {
        core: core.clone(),
        session_id: session.session_id.clone(),
        key: key.clone(),
        conn: None,
    };
    if core.turns.lock().map(|t| t.len()).unwrap_or(usize::MAX) >= super::ACTIVE_TURNS_MAX {
        return Err(FilesError::SessionBusy.into());
    }
    // The durable reservation, under the Session lock, before admission.
    let write_id = format!("write-{}", Uuid::random());
    let record = WriteReservation {
        reservation_id: write_id.clone(),
        session_id: session.session_id.clone(),
        path: wire_path.as_str().to_string(),
        size: body.len() as u64,
        sha256: digest.clone(),
        state: WriteState::Reserved,
        created_at_ms: now_ms(),
    };
    if let Ok(mut set) = core.writes_in_flight.lock() {
        set.insert(write_id.clone());
    }
    let _in_flight = InFlight {
        core: core.clone(),
        write_id: write_id.clone(),
    };
    core.store.call(move |s| s.reserve_write(&record)).await?;

    // `settled`: the prepared branch settles before its release.
    let mut settled = false;
    let dispatch = match select(core, &agent_kind) {
        Err(e) => Dispatch::NotSent(e),
        Ok((conn, decl)) => {
            let (tx, mut rx) = mpsc::channel(TURN_QUEUE_MAX);
            if let Ok(mut turns) = core.turns.lock() {
                turns.insert(key.clone(), tx);
            }
            reservation.conn = Some(conn.clone());
            let mut op = Op {
                conn: &conn,
                key: &key,
                rx: &mut rx,
                deadline: Instant::now() + FILES_WRITE_TIMEOUT,
            };
            match op
                .prepare_read_only(&decl, session_uuid, &environment_id, environment_type)
                .await
            {
                Err(e) => Dispatch::NotSent(e),
                Ok((prep_id, handle)) => {
                    let dispatch = transfer(
                        &mut op,
                        &write_id,
                        WorkspaceTarget::AdmissionHandle(handle.clone()),
                        environment_id,
                        &wire_path,
                        &body,
                        &digest,
                    )
                    .await;
                    // Settle first: the receipt, not the release, decides the write.
                    let settlement = settle(core, &write_id, &dispatch).await;
                    settled = true;
                    op.deadline = Instant::now() + WRITE_RELEASE_TIMEOUT;
                    if let Err(err) = op.release(prep_id, &handle).await {
                        tracing::warn!(
                            write_id,
                            code = err.code(),
                            "write owner release not confirmed: {err}"
                        );
                    }
                    settlement?;
                    dispatch
                }
            }
        }
    };
    if !settled {
        settle(core, &write_id, &dispatch).await?;
    }
    drop(reservation);
    match dispatch {
        Dispatch::Committed => Ok(Committed {
            write_id,
            path: wire_path.as_str().to_string(),
            size: body.len() as u64,
            sha256: digest,
        }),
        Dispatch::Rejected(code) => Err(WriteError::Rejected { write_id, code }),
        Dispatch::NotSent(e) => Err(e.into()),
        Dispatch::Unknown(reason) => {
            tracing::warn!(
                write_id,
                reason,
                "write receipt missing: the reservation stays unknown"
            );
            Err(WriteError::Unknown { write_id, reason })
        }
    }
}

/// Records the settlement an exact outcome allows; an unknown one changes nothing.
async fn settle(core: &Core, write_id: &str, dispatch: &Dispatch) -> Result<(), StoreError> {
    let state = match dispatch {
        Dispatch::Committed => WriteState::Committed,
        Dispatch::Rejected(_) => WriteState::Rejected,
        Dispatch::NotSent(_) => WriteState::Abandoned,
        Dispatch::Unknown(_) => return Ok(()),
    };
    let id = write_id.to_string();
    core.store.call(move |s| s.settle_write(&id, state)).await
}

/// The next `workspace_write_result`, other frames of the operation skipped; `Err` with
/// the ambiguity reason on connection loss or timeout.
async fn next_result(op: &mut Op<'_>) -> Result<WorkspaceWriteResult, String> {
    loop {
        match op.next().await {
            Ok(frame) => {
                if let Message::WorkspaceWriteResult(r) = frame.message {
                    return Ok(r);
                }
            }
            Err(FilesError::Unavailable(reason)) => return Err(reason),
            Err(other) => return Err(other.code().to_string()),
        }
    }
}

/// Step 4: `begin`, acknowledged chunks, `commit`.
async fn transfer(
    op: &mut Op<'_>,
    write_id: &str,
    target: WorkspaceTarget,
    environment_id: Uuid,
    path: &WirePath,
    body: &[u8],
    digest: &str,
) -> Dispatch {
    let sha256 = match BoundedString::new(digest.to_string()) {
        Ok(s) => s,
        Err(e) => return Dispatch::NotSent(FilesError::Unavailable(e.to_string())),
    };
    if let Err(e) = op.route(RouteKind::Operation, write_id) {
        return Dispatch::NotSent(e);
    }
    let begin = Frame::new(
        write_id,
        Message::WorkspaceWrite(WorkspaceWrite::Begin {
            target,
            environment_id,
            path: path.clone(),
            size: body.len() as u64,
            sha256: sha256.clone(),
        }),
    );
    if let Err(e) = op.send(begin).await {
        return Dispatch::NotSent(e);
    }
    // From here on, only an exact receipt settles the write.
    match next_result(op).await {
        Ok(WorkspaceWriteResult::Ready {}) => {}
        Ok(WorkspaceWriteResult::Rejected { error_code }) => {
            return Dispatch::Rejected(wire_code(error_code));
        }
        Ok(_) => return Dispatch::Unknown("unexpected_receipt".into()),
        Err(reason) => return Dispatch::Unknown(reason),
    }
    let mut offset = 0u64;
    for chunk in body.chunks(WRITE_CHUNK_MAX_BYTES) {
        let data = match Base64Bytes::new(chunk.to_vec()) {
            Ok(d) => d,
            Err(e) => return Dispatch::Unknown(format!("chunk_encoding: {e}")),
        };
        let frame = Frame::new(
            write_id,
            Message::WorkspaceWrite(WorkspaceWrite::Chunk { offset, data }),
        );
        if op.send(frame).await.is_err() {
            return Dispatch::Unknown("connection_lost".into());
        }
        let end = offset + chunk.len() as u64;
        match next_result(op).await {
            Ok(WorkspaceWriteResult::Received {
                offset: acked,
                received,
            }) if acked == offset && received == end => {}
            Ok(WorkspaceWriteResult::Rejected { error_code }) => {
                return Dispatch::Rejected(wire_code(error_code));
            }
            Ok(_) => return Dispatch::Unknown("unexpected_receipt".into()),
            Err(reason) => return Dispatch::Unknown(reason),
        }
        offset = end;
    }
    let commit = Frame::new(write_id, Message::WorkspaceWrite(WorkspaceWrite::Commit {}));
    if op.send(commit).await.is_err() {
        return Dispatch::Unknown("connection_lost".into());
    }
    match next_result(op).await {
        Ok(WorkspaceWriteResult::Committed {
            path: p,
            size,
            sha256: s,
        }) if p == *path && size == body.len() as u64 && s == sha256 => Dispatch::Committed,
        Ok(WorkspaceWriteResult::Rejected { error_code }) => {
            Dispatch::Rejected(wire_code(error_code))
        }
        Ok(_) => Dispatch::Unknown("unexpected_receipt".into()),
        Err(reason) => Dispatch::Unknown(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settlement_messages_leave_the_write_id_to_its_member() {
        let unknown = WriteError::Unknown {
            write_id: "write-1".into(),
            reason: "connection_lost".into(),
        };
        assert_eq!(unknown.write_id(), Some("write-1"));
        assert_eq!(
            unknown.to_string(),
            "the write's outcome is unknown (connection_lost); the Session stays reserved"
        );
        let rejected = WriteError::Rejected {
            write_id: "write-1".into(),
            code: "permission_denied".into(),
        };
        assert_eq!(rejected.write_id(), Some("write-1"));
        assert_eq!(
            rejected.to_string(),
            "the Runtime rejected the write: permission_denied"
        );
    }

    #[test]
    fn public_checks_refuse_bad_paths_sizes_and_digests() {
        for bad in ["", "/a", "a//b", "a/", "./a", "a/../b", "a\\b", "a\0b"] {
            assert_eq!(
                check_request(bad, b"x", None).unwrap_err().code(),
                "invalid_path",
                "{bad:?}"
            );
        }
        let over = vec![0u8; PUBLIC_INLINE_WRITE_MAX_BYTES as usize + 1];
        assert_eq!(
            check_request("a", &over, None).unwrap_err(),
            WriteError::TooLarge(PUBLIC_INLINE_WRITE_MAX_BYTES + 1)
        );
        let digest = hex::encode(Sha256::digest(b"x"));
        let (path, got) = check_request("dir/a.txt", b"x", Some(&digest)).unwrap();
        assert_eq!(
            (path.as_str(), got.as_str()),
            ("dir/a.txt", digest.as_str())
        );
        assert_eq!(
            check_request("a", b"x", Some(&digest.to_uppercase())).unwrap_err(),
            WriteError::InvalidDigest
        );
        let other = hex::encode(Sha256::digest(b"y"));
        assert_eq!(
            check_request("a", b"x", Some(&other)).unwrap_err(),
            WriteError::DigestMismatch
        );
    }
}
