//! Environment file installation through `runtime_prepare` transfers (spec
//! "Preparation and execution order"): `POST /v1/environments/{id}/files`
//! (`docs/core-api.md`).
//!
//! Order of one installation:
//!
//! 1. Public checks, before any Runtime work: the path is checked like a Files write
//!    ([`check_path`]; an archive may also name the workspace root with `""`), the
//!    decoded body is at most [`PUBLIC_INLINE_WRITE_MAX_BYTES`].
//! 2. The device bound to the Environment (as for suspension fencing: the first
//!    connected device, by ID, on whose connection the Environment is initialized,
//!    else the first connected device).
//! 3. The connection's transfer slot ("One transfer per connection at a time"): a
//!    second installation on the same connection while one runs is refused at once
//!    with [`TransferError::Busy`] (`409 transfer_in_progress`); Core does not queue it.
//! 4. `runtime_prepare` `initialize` (once per connection and Environment).
//! 5. `begin` (SHA-256 computed by Core) → `ready`; ordered chunks of
//!    [`WRITE_CHUNK_MAX_BYTES`], each awaiting the `received` with the same offset and
//!    the running total; `commit` → `completed` (same path, size and digest), which is
//!    the only confirmation of the installation.
//!
//! A `failed` answer at any phase is [`TransferError::Failed`] with the Runtime's code
//! (the Runtime closed the transfer). A lost connection, the [`ENV_FILES_TIMEOUT`] or an
//! unexpected answer is [`TransferError::Unavailable`]: the outcome is unknown. Nothing
//! is recorded, retried or replayed after a reconnect.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::connection::{DeviceConnection, RouteKind};
use super::files::{FilesError, Op, wire_code};
use super::files_write::check_path;
use super::suspension::bound_device;
use super::{Core, TURN_QUEUE_MAX};
use crate::core_runtime::store::{EnvironmentKind, StoreError};
use crate::core_runtime::wire::limits::{PUBLIC_INLINE_WRITE_MAX_BYTES, WRITE_CHUNK_MAX_BYTES};
use crate::core_runtime::wire::{
    Frame, Message, RuntimePrepare, RuntimePrepareResult, TransferKind, Uuid, WirePath,
};
use crate::wire::bounded::{Base64Bytes, BoundedString};

/// Bound on one installation, from the first frame to `completed` (Core policy; the
/// spec requires transfers to be bounded but names no timer).
pub const ENV_FILES_TIMEOUT: Duration = Duration::from_secs(60);

/// Connections (by [`DeviceConnection::conn_id`], unique in the process) with an
/// installation in progress.
static ACTIVE: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());

/// Why an installation was not confirmed; [`TransferError::code`] is the public code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// A store failure (`not_found` for an unknown Environment).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Environment is of type `none`: there is no workspace.
    #[error("an Environment of type none has no workspace")]
    NoWorkspace,
    /// The path is not a valid workspace-relative path.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// The decoded body exceeds [`PUBLIC_INLINE_WRITE_MAX_BYTES`].
    #[error(
        "the decoded body has {0} bytes, over the {PUBLIC_INLINE_WRITE_MAX_BYTES}-byte inline limit"
    )]
    TooLarge(u64),
    /// No device is connected.
    #[error("no connected device")]
    NoDevice,
    /// Another installation runs on the bound device's connection.
    #[error("another transfer is in progress on the device's connection")]
    Busy,
    /// The Runtime answered `failed` (the transfer is closed; nothing was installed).
    #[error("the Runtime failed the transfer: {0}")]
    Failed(String),
    /// Lost connection, timeout or unexpected answer: the outcome is unknown.
    #[error("the transfer is unavailable ({0}); its outcome is unknown")]
    Unavailable(String),
}

impl TransferError {
    /// Stable public code.
    pub fn code(&self) -> &'static str {
        match self {
            TransferError::Store(e) => e.code(),
            TransferError::NoWorkspace => "no_workspace",
            TransferError::InvalidPath(_) => "invalid_path",
            TransferError::TooLarge(_) => "content_too_large",
            TransferError::NoDevice => "no_device",
            TransferError::Busy => "transfer_in_progress",
            TransferError::Failed(_) => "transfer_failed",
            TransferError::Unavailable(_) => "unavailable",
        }
    }
}

impl From<FilesError> for TransferError {
    fn from(err: FilesError) -> Self {
        match err {
            FilesError::Store(e) => TransferError::Store(e),
            FilesError::Unavailable(reason) => TransferError::Unavailable(reason),
            other => TransferError::Unavailable(other.code().into()),
        }
    }
}

/// The confirmed installation: the Runtime's `completed`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Installed {
    /// Installed workspace-relative path.
    pub path: String,
    /// Installed body size in bytes.
    pub size: u64,
    /// Verified SHA-256 (lower-case hex).
    pub sha256: String,
}

/// Holds the connection's transfer slot and the operation's routes; releases both on
/// every exit path.
struct Slot {
    core: Arc<Core>,
    key: String,
    conn: Arc<DeviceConnection>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.conn.unroute_turn(&self.key);
        if let Ok(mut turns) = self.core.turns.lock() {
            turns.remove(&self.key);
        }
        if let Ok(mut active) = ACTIVE.lock() {
            active.remove(&self.conn.conn_id);
        }
    }
}

/// Step 1: the public checks; returns the wire path.
///
/// # Errors
/// [`TransferError::InvalidPath`], [`TransferError::TooLarge`].
pub fn check_request(
    path: &str,
    kind: TransferKind,
    body: &[u8],
) -> Result<WirePath, TransferError> {
    if !(kind == TransferKind::Archive && path.is_empty()) {
        check_path(path).map_err(|why| TransferError::InvalidPath(why.into()))?;
    }
    let wire_path = WirePath::new(path).map_err(|e| TransferError::InvalidPath(e.to_string()))?;
    if body.len() as u64 > PUBLIC_INLINE_WRITE_MAX_BYTES {
        return Err(TransferError::TooLarge(body.len() as u64));
    }
    Ok(wire_path)
}

/// Installs `body` at `path` of the Environment (see the module docs).
///
/// # Errors
/// Any [`TransferError`]; success is returned only on the Runtime's matching `completed`.
pub async fn install(
    core: &Arc<Core>,
    environment_id: &str,
    path: &str,
    kind: TransferKind,
    body: Vec<u8>,
) -> Result<Installed, TransferError> {
    let wire_path = check_request(path, kind, &body)?;
    let eid = environment_id.to_string();
    let environment = core.store.call(move |s| s.environment(&eid)).await?;
    if environment.kind == EnvironmentKind::None {
        return Err(TransferError::NoWorkspace);
    }
    let environment_id =
        Uuid::new(environment.environment_id.clone()).map_err(StoreError::Corrupt)?;
    let conn = bound_device(core, environment_id.as_str()).ok_or(TransferError::NoDevice)?;
    if !ACTIVE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(conn.conn_id)
    {
        return Err(TransferError::Busy);
    }
    let key = format!("envfiles-{}", Uuid::random());
    let (tx, mut rx) = mpsc::channel(TURN_QUEUE_MAX);
    if let Ok(mut turns) = core.turns.lock() {
        turns.insert(key.clone(), tx);
    }
    let _slot = Slot {
        core: core.clone(),
        key: key.clone(),
        conn: conn.clone(),
    };
    let mut op = Op {
        conn: &conn,
        key: &key,
        rx: &mut rx,
        deadline: Instant::now() + ENV_FILES_TIMEOUT,
    };
    if !conn.initialized(environment_id.as_str()) {
        let init = format!("init-{}", Uuid::random());
        op.route(RouteKind::Transfer, &init)?;
        op.send(Frame::new(
            init.clone(),
            Message::RuntimePrepare(RuntimePrepare::Initialize {
                environment_id: environment_id.clone(),
            }),
        ))
        .await?;
        match next_result(&mut op, &init).await? {
            RuntimePrepareResult::Initialized { .. } => {
                conn.mark_initialized(environment_id.as_str());
            }
            RuntimePrepareResult::Failed { code } => {
                return Err(TransferError::Failed(wire_code(code)));
            }
            _ => return Err(TransferError::Unavailable("unexpected_answer".into())),
        }
    }
    let digest = hex::encode(Sha256::digest(&body));
    let sha256 = BoundedString::new(digest.clone())
        .map_err(|e| TransferError::Unavailable(e.to_string()))?;
    let size = body.len() as u64;
    let id = format!("transfer-{}", Uuid::random());
    op.route(RouteKind::Transfer, &id)?;
    let begin = RuntimePrepare::Begin {
        environment_id,
        kind,
        path: wire_path.clone(),
        size,
        sha256: sha256.clone(),
    };
    op.send(Frame::new(id.clone(), Message::RuntimePrepare(begin)))
        .await?;
    expect(&mut op, &id, |r| {
        matches!(r, RuntimePrepareResult::Ready {})
    })
    .await?;
    let mut offset = 0u64;
    for chunk in body.chunks(WRITE_CHUNK_MAX_BYTES) {
        let data = Base64Bytes::new(chunk.to_vec())
            .map_err(|e| TransferError::Unavailable(format!("chunk_encoding: {e}")))?;
        op.send(Frame::new(
            id.clone(),
            Message::RuntimePrepare(RuntimePrepare::Chunk { offset, data }),
        ))
        .await?;
        let end = offset + chunk.len() as u64;
        expect(&mut op, &id, |r| {
            matches!(r, RuntimePrepareResult::Received { offset: o, received }
                if *o == offset && *received == end)
        })
        .await?;
        offset = end;
    }
    op.send(Frame::new(
        id.clone(),
        Message::RuntimePrepare(RuntimePrepare::Commit {}),
    ))
    .await?;
    expect(&mut op, &id, |r| {
        matches!(r, RuntimePrepareResult::Completed { path: p, size: s, sha256: d }
            if *p == wire_path && *s == size && *d == sha256)
    })
    .await?;
    Ok(Installed {
        path: wire_path.as_str().to_string(),
        size,
        sha256: digest,
    })
}

/// The next `runtime_prepare_result` with Envelope ID `id`.
async fn next_result(op: &mut Op<'_>, id: &str) -> Result<RuntimePrepareResult, TransferError> {
    loop {
        let frame = op.next().await?;
        if frame.id != id {
            continue;
        }
        if let Message::RuntimePrepareResult(r) = frame.message {
            return Ok(r);
        }
    }
}

/// Waits for the answer `ok` accepts; `failed` is [`TransferError::Failed`], any
/// other answer [`TransferError::Unavailable`].
async fn expect(
    op: &mut Op<'_>,
    id: &str,
    ok: impl Fn(&RuntimePrepareResult) -> bool,
) -> Result<(), TransferError> {
    match next_result(op, id).await? {
        r if ok(&r) => Ok(()),
        RuntimePrepareResult::Failed { code } => Err(TransferError::Failed(wire_code(code))),
        _ => Err(TransferError::Unavailable("unexpected_answer".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_checks_refuse_bad_paths_and_sizes() {
        for bad in ["", "/a", "a//b", "./a", "a/../b", "a\\b"] {
            assert_eq!(
                check_request(bad, TransferKind::File, b"x")
                    .unwrap_err()
                    .code(),
                "invalid_path",
                "{bad:?}"
            );
        }
        assert!(check_request("", TransferKind::Archive, b"x").is_ok());
        let over = vec![0u8; PUBLIC_INLINE_WRITE_MAX_BYTES as usize + 1];
        assert_eq!(
            check_request("a", TransferKind::File, &over).unwrap_err(),
            TransferError::TooLarge(PUBLIC_INLINE_WRITE_MAX_BYTES + 1)
        );
    }
}
