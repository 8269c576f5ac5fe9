//! Workspace operations and `runtime_prepare` transfers ("Workspace operations",
//! "Preparation and execution order").
//!
//! * `workspace_read` / `workspace_export`: the raw frame is bounded to 8 KiB and the
//!   correlation ID to 128 bytes *before* decoding the payload; a request whose Envelope
//!   decodes but whose payload, size or ID is bad gets a typed `rejected` result (an
//!   over-long ID is not echoed: the reply's `Envelope.id` is `""`).
//! * Checks, in order: frame size (`request_too_large`), ID (`id_too_long`, empty →
//!   `invalid_request`), payload (`invalid_request`), duplicate pending operation ID
//!   (`duplicate_operation`), pending-operation capacity (`busy`), target
//!   (`unknown_target`), Environment (`environment_mismatch`), owner stopped by an
//!   earlier ambiguous read (`owner_stopped`), export capability (`unsupported_operation`);
//!   then the daemon's own [`Workspace`](crate::core_runtime::workspace::Workspace):
//!   safe refusals → `refused` with the workspace's code, I/O ambiguity → `unavailable`
//!   (and, for reads, later reads of that owner are `rejected` `owner_stopped`).
//! * `workspace_write`: `begin` → `ready`, ordered `chunk` → `received`, `commit` →
//!   `committed` (digest verified, installed) or `rejected`; any error closes the
//!   transfer. The transfer excludes execution on its owner until it ends
//!   (`execution_start` → `workspace_write_in_progress`); a write to an owner whose Run is
//!   active is `busy`. An open transfer expires after `write_transfer_expiry` with a
//!   proactive `rejected` `expired`.
//! * `runtime_prepare`: `initialize` checks the Environment; one file/archive transfer
//!   per connection at a time.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::dispatcher::{Runtime, resolve_target};
use super::run::is_active;
use crate::core_runtime::transfer::ChunkedTransfer;
use crate::core_runtime::wire::limits::{
    CORRELATION_ID_MAX_BYTES, WORKSPACE_REQUEST_MAX_BYTES, WRITE_TRANSFER_MAX_BYTES,
};
use crate::core_runtime::wire::{
    Envelope, ExecutorId, Message, ReadOperation, RuntimePrepare, RuntimePrepareResult,
    TransferErrorCode, TransferKind, WirePath, WorkspaceErrorCode, WorkspaceExport,
    WorkspaceExportResult, WorkspaceRead, WorkspaceReadResult, WorkspaceStatus, WorkspaceWrite,
    WorkspaceWriteResult,
};
use crate::core_runtime::workspace::WorkspaceError;
use crate::wire::bounded::{Base64Bytes, BoundedString, BoundedVec};
use crate::wire::ids::validate_id;
use crate::wire::strict::from_value_strict;

/// Bound on pending `workspace_read` / `workspace_export` operations per connection.
pub const PENDING_WORKSPACE_OPS_MAX: usize = 64;

/// Bound on open `workspace_write` transfers per connection.
pub const OPEN_WRITES_MAX: usize = 8;

/// An open `workspace_write` transfer.
#[derive(Debug)]
pub struct WriteOp {
    /// The owner whose execution the write excludes.
    pub executor_id: ExecutorId,
    path: WirePath,
    transfer: Option<ChunkedTransfer>,
    committing: bool,
    opened: Instant,
}

/// The connection's open `runtime_prepare` transfer.
#[derive(Debug)]
pub struct PrepTransfer {
    id: String,
    kind: TransferKind,
    path: WirePath,
    transfer: Option<ChunkedTransfer>,
}

/// The reply ID: the request's ID, or `""` when it is over the correlation bound.
fn reply_id(id: &str) -> String {
    if id.len() > CORRELATION_ID_MAX_BYTES {
        String::new()
    } else {
        id.to_string()
    }
}

fn read_rejected(code: WorkspaceErrorCode) -> Message {
    read_result(WorkspaceStatus::Rejected, code)
}

fn read_result(status: WorkspaceStatus, code: WorkspaceErrorCode) -> Message {
    Message::WorkspaceReadResult(WorkspaceReadResult {
        status,
        entries: None,
        data: None,
        truncated: None,
        error_code: Some(code),
    })
}

fn export_result(status: WorkspaceStatus, code: WorkspaceErrorCode) -> Message {
    Message::WorkspaceExportResult(WorkspaceExportResult {
        status,
        data: None,
        sha256: None,
        error_code: Some(code),
    })
}

fn write_rejected(code: WorkspaceErrorCode) -> Message {
    Message::WorkspaceWriteResult(WorkspaceWriteResult::Rejected { error_code: code })
}

/// Status of a workspace failure: safe refusals are `refused`, I/O ambiguity is
/// `unavailable`.
fn failure_status(err: &WorkspaceError) -> WorkspaceStatus {
    if err.is_safe_refusal() {
        WorkspaceStatus::Refused
    } else {
        WorkspaceStatus::Unavailable
    }
}

enum Request {
    Read(WorkspaceRead),
    Export(WorkspaceExport),
}

/// Entry point for `workspace_read` and `workspace_export` frames whose Envelope
/// decoded; `frame_len` is the raw frame size.
pub async fn dispatch_read_or_export(
    rt: &Arc<Runtime>,
    generation: u64,
    frame_len: usize,
    envelope: Envelope,
) {
    let is_read = envelope.kind == "workspace_read";
    let reject = |code| {
        if is_read {
            read_rejected(code)
        } else {
            export_result(WorkspaceStatus::Rejected, code)
        }
    };
    let id = reply_id(&envelope.id);
    let out = {
        let mut st = rt.state.lock().await;
        match st.conn_at(generation) {
            Some(conn) => conn.out.clone(),
            None => return,
        }
    };
    if frame_len > WORKSPACE_REQUEST_MAX_BYTES {
        out.send(id, reject(WorkspaceErrorCode::RequestTooLarge))
            .await;
        return;
    }
    if envelope.id.len() > CORRELATION_ID_MAX_BYTES {
        out.send(id, reject(WorkspaceErrorCode::IdTooLong)).await;
        return;
    }
    if validate_id(&envelope.id, CORRELATION_ID_MAX_BYTES).is_err() {
        out.send(id, reject(WorkspaceErrorCode::InvalidRequest))
            .await;
        return;
    }
    let request = if is_read {
        from_value_strict::<WorkspaceRead>(envelope.payload).map(Request::Read)
    } else {
        from_value_strict::<WorkspaceExport>(envelope.payload).map(Request::Export)
    };
    let request = match request {
        Ok(Request::Read(read))
            if (read.operation == ReadOperation::Bytes && read.max_entries.is_some())
                || (read.operation == ReadOperation::Directory && read.offset.is_some()) =>
        {
            out.send(id, reject(WorkspaceErrorCode::InvalidRequest))
                .await;
            return;
        }
        Ok(request) => request,
        Err(_) => {
            out.send(id, reject(WorkspaceErrorCode::InvalidRequest))
                .await;
            return;
        }
    };
    let (target, environment_id) = match &request {
        Request::Read(r) => (&r.target, &r.environment_id),
        Request::Export(e) => (&e.target, &e.environment_id),
    };
    let owner = {
        let mut st = rt.state.lock().await;
        let resolved = resolve_target(&mut st, generation, target);
        let Some(conn) = st.conn_at(generation) else {
            return;
        };
        let check = if conn.pending_ops.contains(&id) {
            Err(WorkspaceErrorCode::DuplicateOperation)
        } else if conn.pending_ops.len() >= PENDING_WORKSPACE_OPS_MAX {
            Err(WorkspaceErrorCode::Busy)
        } else {
            match resolved {
                None => Err(WorkspaceErrorCode::UnknownTarget),
                Some((owner, _)) if owner.environment_id.as_ref() != Some(environment_id) => {
                    Err(WorkspaceErrorCode::EnvironmentMismatch)
                }
                Some((owner, _)) if is_read && conn.stopped_owners.contains(&owner.executor_id) => {
                    Err(WorkspaceErrorCode::OwnerStopped)
                }
                Some((owner, _)) if !is_read && !owner.capabilities.workspace_output_export => {
                    Err(WorkspaceErrorCode::UnsupportedOperation)
                }
                Some((owner, _)) => {
                    conn.pending_ops.insert(id.clone());
                    Ok(owner)
                }
            }
        };
        match check {
            Ok(owner) => owner,
            Err(code) => {
                conn.out.send(id, reject(code)).await;
                return;
            }
        }
    };
    let rt = rt.clone();
    // The operation keeps a bounded waiter even when its owner is released meanwhile.
    tokio::spawn(async move {
        let (message, ambiguous) = match request {
            Request::Read(read) => perform_read(&rt, read).await,
            Request::Export(export) => perform_export(&rt, export).await,
        };
        let mut st = rt.state.lock().await;
        if let Some(conn) = st.conn_at(generation) {
            conn.pending_ops.remove(&id);
            if ambiguous && is_read {
                conn.stopped_owners.insert(owner.executor_id.clone());
            }
            conn.out.send(id, message).await;
        }
    });
}

async fn perform_read(rt: &Runtime, read: WorkspaceRead) -> (Message, bool) {
    let outcome = match read.operation {
        ReadOperation::Directory => rt
            .workspace
            .list_directory(&read.path, read.max_entries, read.max_bytes)
            .await
            .and_then(|listing| {
                let entries = BoundedVec::new(listing.entries)
                    .map_err(|e| WorkspaceError::Io(format!("listing over its bound: {e}")))?;
                Ok(WorkspaceReadResult {
                    status: WorkspaceStatus::Ok,
                    entries: Some(entries),
                    data: None,
                    truncated: Some(listing.truncated),
                    error_code: None,
                })
            }),
        ReadOperation::Bytes => rt
            .workspace
            .read_bytes(&read.path, read.offset.unwrap_or(0), read.max_bytes)
            .await
            .and_then(|bytes| {
                let data = Base64Bytes::new(bytes.data)
                    .map_err(|e| WorkspaceError::Io(format!("read over its bound: {e}")))?;
                Ok(WorkspaceReadResult {
                    status: WorkspaceStatus::Ok,
                    entries: None,
                    data: Some(data),
                    truncated: Some(bytes.truncated),
                    error_code: None,
                })
            }),
    };
    match outcome {
        Ok(result) => (Message::WorkspaceReadResult(result), false),
        Err(err) => (
            read_result(failure_status(&err), err.code()),
            !err.is_safe_refusal(),
        ),
    }
}

async fn perform_export(rt: &Runtime, export: WorkspaceExport) -> (Message, bool) {
    match rt.workspace.export(&export.path).await {
        Ok(tar) => {
            let sha = hex::encode(Sha256::digest(&tar));
            match (Base64Bytes::new(tar), BoundedString::new(sha)) {
                (Ok(data), Ok(sha256)) => (
                    Message::WorkspaceExportResult(WorkspaceExportResult {
                        status: WorkspaceStatus::Ok,
                        data: Some(data),
                        sha256: Some(sha256),
                        error_code: None,
                    }),
                    false,
                ),
                _ => (
                    export_result(WorkspaceStatus::Refused, WorkspaceErrorCode::ResultTooLarge),
                    false,
                ),
            }
        }
        Err(err) => (
            export_result(failure_status(&err), err.code()),
            !err.is_safe_refusal(),
        ),
    }
}

/// Entry point for `workspace_write` frames whose Envelope decoded.
pub async fn dispatch_write(rt: &Arc<Runtime>, generation: u64, envelope: Envelope) {
    let id = reply_id(&envelope.id);
    let mut st = rt.state.lock().await;
    let Some(out) = st.conn_at(generation).map(|c| c.out.clone()) else {
        return;
    };
    if envelope.id.len() > CORRELATION_ID_MAX_BYTES {
        out.send(id, write_rejected(WorkspaceErrorCode::IdTooLong))
            .await;
        return;
    }
    let request = match validate_id(&envelope.id, CORRELATION_ID_MAX_BYTES)
        .ok()
        .and_then(|()| from_value_strict::<WorkspaceWrite>(envelope.payload).ok())
    {
        Some(request) => request,
        None => {
            out.send(id, write_rejected(WorkspaceErrorCode::InvalidRequest))
                .await;
            return;
        }
    };
    let reply = match request {
        WorkspaceWrite::Begin {
            target,
            environment_id,
            path,
            size,
            sha256,
        } => {
            let resolved = resolve_target(&mut st, generation, &target);
            let Some(conn) = st.conn_at(generation) else {
                return;
            };
            let check = if conn.writes.contains_key(&id) {
                Err(WorkspaceErrorCode::DuplicateOperation)
            } else if conn.writes.len() >= OPEN_WRITES_MAX {
                Err(WorkspaceErrorCode::Busy)
            } else {
                match resolved {
                    None => Err(WorkspaceErrorCode::UnknownTarget),
                    Some((owner, _)) if owner.environment_id.as_ref() != Some(&environment_id) => {
                        Err(WorkspaceErrorCode::EnvironmentMismatch)
                    }
                    Some((_, Some(run))) if is_active(&run) => Err(WorkspaceErrorCode::Busy),
                    Some((owner, _))
                        if conn
                            .writes
                            .values()
                            .any(|w| w.executor_id == owner.executor_id) =>
                    {
                        Err(WorkspaceErrorCode::Busy)
                    }
                    Some((owner, _)) => match rt.workspace.resolve(&path) {
                        Err(err) => Err(err.code()),
                        Ok(_) if path.is_empty() => Err(WorkspaceErrorCode::InvalidPath),
                        Ok(_) => ChunkedTransfer::begin(size, &sha256, WRITE_TRANSFER_MAX_BYTES)
                            .map_err(|e| e.workspace_code())
                            .map(|transfer| (owner, transfer)),
                    },
                }
            };
            match check {
                Err(code) => write_rejected(code),
                Ok((owner, transfer)) => {
                    let opened = Instant::now();
                    conn.writes.insert(
                        id.clone(),
                        WriteOp {
                            executor_id: owner.executor_id,
                            path,
                            transfer: Some(transfer),
                            committing: false,
                            opened,
                        },
                    );
                    arm_write_expiry(rt, generation, id.clone(), opened);
                    Message::WorkspaceWriteResult(WorkspaceWriteResult::Ready {})
                }
            }
        }
        WorkspaceWrite::Chunk { offset, data } => {
            let Some(conn) = st.conn_at(generation) else {
                return;
            };
            match conn.writes.get_mut(&id) {
                Some(op) if !op.committing => {
                    match op.transfer.as_mut().map(|t| t.chunk(offset, data.bytes())) {
                        Some(Ok(received)) => {
                            Message::WorkspaceWriteResult(WorkspaceWriteResult::Received {
                                offset,
                                received,
                            })
                        }
                        Some(Err(err)) => {
                            conn.writes.remove(&id);
                            write_rejected(err.workspace_code())
                        }
                        None => write_rejected(WorkspaceErrorCode::InvalidRequest),
                    }
                }
                _ => write_rejected(WorkspaceErrorCode::InvalidRequest),
            }
        }
        WorkspaceWrite::Commit {} => {
            let Some(conn) = st.conn_at(generation) else {
                return;
            };
            let taken = match conn.writes.get_mut(&id) {
                Some(op) if !op.committing => {
                    op.committing = true;
                    op.transfer.take().map(|t| (t, op.path.clone()))
                }
                _ => None,
            };
            match taken {
                None => write_rejected(WorkspaceErrorCode::InvalidRequest),
                Some((transfer, path)) => {
                    let rt = rt.clone();
                    tokio::spawn(async move {
                        let declared = transfer.declared_sha256_hex();
                        let reply = match transfer.commit() {
                            Err(err) => write_rejected(err.workspace_code()),
                            Ok(body) => {
                                let size = body.len() as u64;
                                match rt.workspace.install_file_owned(&path, body).await {
                                    Ok(()) => match BoundedString::new(declared) {
                                        Ok(sha256) => Message::WorkspaceWriteResult(
                                            WorkspaceWriteResult::Committed { path, size, sha256 },
                                        ),
                                        Err(_) => {
                                            write_rejected(WorkspaceErrorCode::InvalidRequest)
                                        }
                                    },
                                    Err(err) => write_rejected(err.code()),
                                }
                            }
                        };
                        let mut st = rt.state.lock().await;
                        if let Some(conn) = st.conn_at(generation) {
                            conn.writes.remove(&id);
                            conn.out.send(id, reply).await;
                        }
                    });
                    return;
                }
            }
        }
    };
    out.send(id, reply).await;
}

fn arm_write_expiry(rt: &Arc<Runtime>, generation: u64, id: String, opened: Instant) {
    let rt = rt.clone();
    let deadline = opened + rt.config.timers.write_transfer_expiry;
    tokio::spawn(async move {
        tokio::time::sleep_until(deadline).await;
        let mut st = rt.state.lock().await;
        let Some(conn) = st.conn_at(generation) else {
            return;
        };
        let expired = conn
            .writes
            .get(&id)
            .is_some_and(|op| op.opened == opened && !op.committing);
        if expired {
            conn.writes.remove(&id);
            conn.out
                .send(id, write_rejected(WorkspaceErrorCode::Expired))
                .await;
        }
    });
}

fn prep_failed(code: TransferErrorCode) -> Message {
    Message::RuntimePrepareResult(RuntimePrepareResult::Failed { code })
}

/// `runtime_prepare` (`Envelope.id` = transfer ID, or a request ID for `initialize`).
pub async fn runtime_prepare(
    rt: &Arc<Runtime>,
    generation: u64,
    id: String,
    request: RuntimePrepare,
) {
    let binding = rt.config.environment.environment_id.clone();
    let mut st = rt.state.lock().await;
    let Some(conn) = st.conn_at(generation) else {
        return;
    };
    let reply = match request {
        RuntimePrepare::Initialize { environment_id } => {
            if environment_id == binding {
                Message::RuntimePrepareResult(RuntimePrepareResult::Initialized { environment_id })
            } else {
                prep_failed(TransferErrorCode::EnvironmentMismatch)
            }
        }
        RuntimePrepare::Begin {
            environment_id,
            kind,
            path,
            size,
            sha256,
        } => {
            if conn.prep_transfer.is_some() {
                prep_failed(TransferErrorCode::TransferInProgress)
            } else if environment_id != binding {
                prep_failed(TransferErrorCode::EnvironmentMismatch)
            } else if rt.workspace.resolve(&path).is_err()
                || (kind == TransferKind::File && path.is_empty())
            {
                prep_failed(TransferErrorCode::InvalidPath)
            } else {
                match ChunkedTransfer::begin(size, &sha256, WRITE_TRANSFER_MAX_BYTES) {
                    Err(err) => prep_failed(err.transfer_code()),
                    Ok(transfer) => {
                        conn.prep_transfer = Some(PrepTransfer {
                            id: id.clone(),
                            kind,
                            path,
                            transfer: Some(transfer),
                        });
                        Message::RuntimePrepareResult(RuntimePrepareResult::Ready {})
                    }
                }
            }
        }
        RuntimePrepare::Chunk { offset, data } => match conn.prep_transfer.as_mut() {
            Some(open) if open.id == id => match open
                .transfer
                .as_mut()
                .map(|t| t.chunk(offset, data.bytes()))
            {
                Some(Ok(received)) => {
                    Message::RuntimePrepareResult(RuntimePrepareResult::Received {
                        offset,
                        received,
                    })
                }
                Some(Err(err)) => {
                    conn.prep_transfer = None;
                    prep_failed(err.transfer_code())
                }
                // Committing: no more chunks.
                None => prep_failed(TransferErrorCode::UnknownTransfer),
            },
            _ => prep_failed(TransferErrorCode::UnknownTransfer),
        },
        RuntimePrepare::Commit {} => {
            let taken = match conn.prep_transfer.as_mut() {
                Some(open) if open.id == id => open
                    .transfer
                    .take()
                    .map(|t| (t, open.kind, open.path.clone())),
                _ => None,
            };
            match taken {
                None => prep_failed(TransferErrorCode::UnknownTransfer),
                Some((transfer, kind, path)) => {
                    let rt = rt.clone();
                    tokio::spawn(async move {
                        let declared = transfer.declared_sha256_hex();
                        let reply = match transfer.commit() {
                            Err(err) => prep_failed(err.transfer_code()),
                            Ok(body) => {
                                let size = body.len() as u64;
                                let installed = match kind {
                                    TransferKind::File => {
                                        rt.workspace.install_file_owned(&path, body).await
                                    }
                                    TransferKind::Archive => {
                                        rt.workspace.install_archive_owned(&path, body).await
                                    }
                                };
                                match (installed, BoundedString::new(declared)) {
                                    (Ok(()), Ok(sha256)) => Message::RuntimePrepareResult(
                                        RuntimePrepareResult::Completed { path, size, sha256 },
                                    ),
                                    (Err(WorkspaceError::InvalidPath(_)), _) => {
                                        prep_failed(TransferErrorCode::InvalidPath)
                                    }
                                    _ => prep_failed(TransferErrorCode::InstallFailed),
                                }
                            }
                        };
                        let mut st = rt.state.lock().await;
                        if let Some(conn) = st.conn_at(generation) {
                            conn.prep_transfer = None;
                            conn.out.send(id, reply).await;
                        }
                    });
                    return;
                }
            }
        }
    };
    conn.out.send(id, reply).await;
}
