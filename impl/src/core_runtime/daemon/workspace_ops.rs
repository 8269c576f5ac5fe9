//! Workspace operations and `runtime_prepare` transfers ("Workspace operations",
//! "Preparation and execution order").
//!
//! * `workspace_read` / `workspace_export`: the request **payload** is bounded to 8 KiB
//!   ([`request_payload_len`]) and the correlation ID to 128 bytes *before* the payload
//!   is decoded as a request; a request whose Envelope decodes but whose payload, size
//!   or ID is bad gets a typed `rejected` result (an over-long ID is not echoed: the
//!   reply's `Envelope.id` is `""`). The raw frame is bounded only by the transport
//!   bound (`TRANSPORT_FRAME_MAX_BYTES`, checked before the Envelope is parsed), so
//!   trace metadata never counts against the payload bound and never enters the reply.
//! * Checks, in order: payload size (`request_too_large`), ID (`id_too_long`, empty →
//!   `invalid_request`), payload (`invalid_request`), duplicate pending operation ID
//!   (`duplicate_operation`), pending-operation capacity (`busy`), target
//!   (`unknown_target`), Environment (`environment_mismatch`), owner stopped by an
//!   earlier ambiguous read (`owner_stopped`), export capability (`unsupported_operation`);
//!   then the daemon's own [`Workspace`](crate::core_runtime::workspace::Workspace):
//!   safe refusals → `refused` with the workspace's code, I/O ambiguity → `unavailable`
//!   with no error code (and, for reads, later reads of that owner are `rejected`
//!   `owner_stopped`).
//! * An admitted operation first reserves room for its result in the outbound queue
//!   ([`WORKSPACE_RESULT_FRAME_MAX_BYTES`]), then runs, then queues the result without
//!   waiting, in the same state-lock section that retires its operation ID. Results
//!   waiting for a Core that does not read therefore hold no data, and at most
//!   `OUTBOUND_QUEUE_BYTES / WORKSPACE_RESULT_FRAME_MAX_BYTES` results are in memory.
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

/// Upper bound on the encoded frame of one `workspace_read_result` or
/// `workspace_export_result` (2 MiB), reserved in the outbound queue before the
/// operation runs. The largest results are a 1 MiB read or archive (1,398,104 base64
/// bytes) and a listing of 1024 names of 255 bytes each, every byte a JSON `\u00XX`
/// escape (about 1.6 MB); with the envelope and a 128-byte ID both stay below this.
pub const WORKSPACE_RESULT_FRAME_MAX_BYTES: usize = 2 * 1024 * 1024;

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

/// The `workspace_read_result` of a failed read: `refused` with the refusal's code, or
/// `unavailable` with no code for an ambiguous failure ("an interrupted or ambiguous
/// read stays unknown").
fn read_failure(err: &WorkspaceError) -> Message {
    Message::WorkspaceReadResult(WorkspaceReadResult {
        status: failure_status(err),
        entries: None,
        data: None,
        truncated: None,
        error_code: err.refusal_code(),
    })
}

/// The `workspace_export_result` of a failed export (as [`read_failure`]).
fn export_failure(err: &WorkspaceError) -> Message {
    Message::WorkspaceExportResult(WorkspaceExportResult {
        status: failure_status(err),
        data: None,
        sha256: None,
        error_code: err.refusal_code(),
    })
}

/// The `rejected` code of a failed write phase. `workspace_write_result` has no
/// ambiguous outcome: an I/O failure is reported with the nearest bounded category,
/// `cleanup_unconfirmed` ("The native close could not be confirmed").
fn write_code(err: &WorkspaceError) -> WorkspaceErrorCode {
    err.refusal_code()
        .unwrap_or(WorkspaceErrorCode::CleanupUnconfirmed)
}

/// The size a workspace request is bounded by: the length of the compact JSON encoding
/// of its `payload` (the form [`Frame::encode`](crate::core_runtime::wire::Frame::encode)
/// produces), computed without building it.
///
/// "Before admission, request payloads are bounded to 8 KiB and correlation IDs to 128
/// bytes; an oversized ID is not echoed, and oversized trace metadata does not enter
/// the reply" ("Workspace operations"): the bound is on the payload, so neither the
/// Envelope's `id` (bounded on its own) nor its `trace` counts, and the sender's
/// whitespace does not either. The raw frame stays bounded by the transport bound.
pub fn request_payload_len(payload: &serde_json::Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(bytes.len());
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, payload) {
        Ok(()) => counter.0,
        // A `Value` always serializes; treat the impossible as over any bound.
        Err(_) => usize::MAX,
    }
}

enum Request {
    Read(WorkspaceRead),
    Export(WorkspaceExport),
}

/// Entry point for `workspace_read` and `workspace_export` frames whose Envelope
/// decoded (so the raw frame was within the transport bound).
///
/// No reply is queued while the state lock is held except through a
/// [`Reservation`](super::outbound::Reservation) taken beforehand: a full outbound queue
/// never wedges the lock.
pub async fn dispatch_read_or_export(rt: &Arc<Runtime>, generation: u64, envelope: Envelope) {
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
    if request_payload_len(&envelope.payload) > WORKSPACE_REQUEST_MAX_BYTES {
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
    let check = {
        let mut st = rt.state.lock().await;
        let resolved = resolve_target(&mut st, generation, target);
        let Some(conn) = st.conn_at(generation) else {
            return;
        };
        if conn.pending_ops.contains(&id) {
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
        }
    };
    let owner = match check {
        Ok(owner) => owner,
        Err(code) => {
            out.send(id, reject(code)).await;
            return;
        }
    };
    let rt = rt.clone();
    // The operation keeps a bounded waiter even when its owner is released meanwhile.
    tokio::spawn(async move {
        // Room for the result first: a result never waits for the queue with its data
        // in memory, and never while the state lock is held.
        let reservation = out.reserve(WORKSPACE_RESULT_FRAME_MAX_BYTES).await;
        let outcome = match reservation {
            Some(reservation) => {
                let (message, ambiguous) = match request {
                    Request::Read(read) => perform_read(&rt, read).await,
                    // An export's failure never stops its owner's later reads.
                    Request::Export(export) => (perform_export(&rt, export).await, false),
                };
                Some((reservation, message, ambiguous))
            }
            // The connection is gone: the operation is not performed.
            None => None,
        };
        let mut st = rt.state.lock().await;
        if let Some(conn) = st.conn_at(generation) {
            conn.pending_ops.remove(&id);
            if let Some((reservation, message, ambiguous)) = outcome {
                if ambiguous {
                    conn.stopped_owners.insert(owner.executor_id.clone());
                }
                reservation.send(id, message);
            }
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
        Err(err) => (read_failure(&err), !err.is_safe_refusal()),
    }
}

async fn perform_export(rt: &Runtime, export: WorkspaceExport) -> Message {
    match rt.workspace.export(&export.path).await {
        Ok(tar) => {
            let sha = hex::encode(Sha256::digest(&tar));
            match (Base64Bytes::new(tar), BoundedString::new(sha)) {
                (Ok(data), Ok(sha256)) => Message::WorkspaceExportResult(WorkspaceExportResult {
                    status: WorkspaceStatus::Ok,
                    data: Some(data),
                    sha256: Some(sha256),
                    error_code: None,
                }),
                _ => export_result(WorkspaceStatus::Refused, WorkspaceErrorCode::ResultTooLarge),
            }
        }
        Err(err) => export_failure(&err),
    }
}

/// Entry point for `workspace_write` frames whose Envelope decoded.
///
/// Every reply is queued with the non-waiting
/// [`Outbound::send_now`](super::outbound::Outbound::send_now) under the state lock, so
/// the replies of one transfer (including a proactive `expired`) leave in the order
/// their state changed; the receive loop's backpressure bounds them.
pub async fn dispatch_write(rt: &Arc<Runtime>, generation: u64, envelope: Envelope) {
    let id = reply_id(&envelope.id);
    let mut st = rt.state.lock().await;
    let Some(out) = st.conn_at(generation).map(|c| c.out.clone()) else {
        return;
    };
    if envelope.id.len() > CORRELATION_ID_MAX_BYTES {
        out.send_now(id, write_rejected(WorkspaceErrorCode::IdTooLong));
        return;
    }
    let request = match validate_id(&envelope.id, CORRELATION_ID_MAX_BYTES)
        .ok()
        .and_then(|()| from_value_strict::<WorkspaceWrite>(envelope.payload).ok())
    {
        Some(request) => request,
        None => {
            // A rejection receipt releases the mutation owner ("An exact commit or
            // rejection receipt releases the mutation owner"): a frame of an open
            // transfer that does not decode (a chunk over 64 KiB, say) ends that
            // transfer, unless its commit is already being applied.
            if let Some(conn) = st.conn_at(generation)
                && conn.writes.get(&id).is_some_and(|op| !op.committing)
            {
                conn.writes.remove(&id);
            }
            out.send_now(id, write_rejected(WorkspaceErrorCode::InvalidRequest));
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
                        Err(err) => Err(write_code(&err)),
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
                                    Err(err) => write_rejected(write_code(&err)),
                                }
                            }
                        };
                        let mut st = rt.state.lock().await;
                        if let Some(conn) = st.conn_at(generation) {
                            conn.writes.remove(&id);
                            conn.out.send_now(id, reply);
                        }
                    });
                    return;
                }
            }
        }
    };
    out.send_now(id, reply);
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
            if rt.config.profile.announce_write_expiry {
                conn.out
                    .send_now(id, write_rejected(WorkspaceErrorCode::Expired));
            }
        }
    });
}

fn prep_failed(code: TransferErrorCode) -> Message {
    Message::RuntimePrepareResult(RuntimePrepareResult::Failed { code })
}

/// `runtime_prepare` (`Envelope.id` = transfer ID, or a request ID for `initialize`).
/// Replies are queued under the state lock without waiting, as for `workspace_write`.
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
                            conn.out.send_now(id, reply);
                        }
                    });
                    return;
                }
            }
        }
    };
    conn.out.send_now(id, reply);
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::core_runtime::daemon::config::DEFAULT_ENVIRONMENT_ID;
    use crate::core_runtime::daemon::test_support::Harness;
    use crate::core_runtime::wire::limits::{
        DIRECTORY_ENTRIES_MAX, DIRECTORY_ENTRY_NAME_MAX_BYTES, TRACESTATE_MAX_BYTES,
        WORKSPACE_READ_RESULT_MAX_BYTES,
    };
    use crate::core_runtime::wire::{AdmissionHandle, DirectoryEntry, EntryKind, Frame};

    const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn payload(frame: &Value) -> &Value {
        &frame["payload"]
    }

    /// Regression: `offset` above `i64::MAX` was an ambiguous read (`unavailable`) that
    /// stopped the owner. It is past the end: `ok`, no bytes, not truncated, and the
    /// owner keeps reading.
    #[tokio::test]
    async fn an_offset_past_every_file_reads_nothing_and_keeps_the_owner() {
        let mut h = Harness::start(OUTBOUND_QUEUE_BYTES_FOR_TESTS).await;
        std::fs::write(h.dir.path().join("notes.txt"), b"0123456789").unwrap();
        let handle = h.ready_handle("prep-1").await;
        h.core(Harness::read(
            "op-far",
            &handle,
            json!({ "operation": "bytes", "path": "notes.txt", "offset": u64::MAX }),
        ))
        .await;
        let far = h.next().await;
        assert_eq!(far["id"], "op-far");
        assert_eq!(
            payload(&far),
            &json!({ "status": "ok", "data": "", "truncated": false })
        );
        h.core(Harness::read(
            "op-next",
            &handle,
            json!({ "operation": "bytes", "path": "notes.txt", "offset": 8 }),
        ))
        .await;
        // base64("89")
        assert_eq!(
            payload(&h.next().await),
            &json!({ "status": "ok", "data": "ODk=", "truncated": false })
        );
    }

    /// "an interrupted or ambiguous read stays unknown and stops that owner's later
    /// reads" ("Workspace operations"): once an owner is stopped, a byte read and a
    /// directory read are refused `owner_stopped` and nothing is read, while an export
    /// (not a read) is still served. No file can make a read fail ambiguously on
    /// demand (that needs `EIO` and the like), so the test stops the owner as a failed
    /// read does.
    #[tokio::test]
    async fn a_stopped_owner_refuses_reads_but_not_exports() {
        let mut h = Harness::start(OUTBOUND_QUEUE_BYTES_FOR_TESTS).await;
        std::fs::write(h.dir.path().join("notes.txt"), b"0123").unwrap();
        let handle = h.ready_handle("prep-1").await;
        {
            let mut st = h.rt.state.lock().await;
            let owner = st
                .admission
                .handle_owner(&AdmissionHandle::new(handle.clone()).unwrap())
                .unwrap();
            let conn = st.conn_at(h.generation).unwrap();
            conn.stopped_owners.insert(owner.executor_id);
        }
        for (id, operation) in [("op-bytes", "bytes"), ("op-dir", "directory")] {
            h.core(Harness::read(
                id,
                &handle,
                json!({ "operation": operation, "path": if operation == "bytes" { "notes.txt" } else { "" } }),
            ))
            .await;
            let result = h.next().await;
            assert_eq!(result["id"], id);
            assert_eq!(
                payload(&result),
                &json!({ "status": "rejected", "error_code": "owner_stopped" }),
                "{operation}"
            );
        }
        h.core(json!({
            "type": "workspace_export",
            "id": "op-export",
            "payload": {
                "target": { "admission_handle": handle },
                "environment_id": DEFAULT_ENVIRONMENT_ID,
                "path": "notes.txt",
            },
        }))
        .await;
        let result = h.next().await;
        assert_eq!(result["id"], "op-export");
        assert_eq!(payload(&result)["status"], "ok", "{result}");
    }

    /// Regression: a symbolic-link loop (`ELOOP`) stopped the owner's reads; it is a
    /// safe `invalid_path` refusal for byte and directory reads.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_symlink_loop_is_refused_and_keeps_the_owner() {
        let mut h = Harness::start(OUTBOUND_QUEUE_BYTES_FOR_TESTS).await;
        std::os::unix::fs::symlink("self", h.dir.path().join("self")).unwrap();
        let handle = h.ready_handle("prep-1").await;
        for (id, operation) in [("op-bytes", "bytes"), ("op-dir", "directory")] {
            h.core(Harness::read(
                id,
                &handle,
                json!({ "operation": operation, "path": "self" }),
            ))
            .await;
            let result = h.next().await;
            assert_eq!(result["id"], id);
            assert_eq!(
                payload(&result),
                &json!({ "status": "refused", "error_code": "invalid_path" })
            );
        }
        h.core(Harness::read(
            "op-root",
            &handle,
            json!({ "operation": "directory", "path": "" }),
        ))
        .await;
        assert_eq!(payload(&h.next().await)["status"], "ok");
    }

    /// An ambiguous failure is `unavailable` with no error code (not
    /// `cleanup_unconfirmed`); writes, which have no ambiguous receipt, keep the nearest
    /// bounded category.
    #[test]
    fn ambiguous_failures_are_unavailable_without_a_code() {
        let io = WorkspaceError::Io("EIO".into());
        let Message::WorkspaceReadResult(read) = read_failure(&io) else {
            panic!("not a read result");
        };
        assert_eq!(
            (read.status, read.error_code),
            (WorkspaceStatus::Unavailable, None)
        );
        let Message::WorkspaceExportResult(export) = export_failure(&io) else {
            panic!("not an export result");
        };
        assert_eq!(
            (export.status, export.error_code),
            (WorkspaceStatus::Unavailable, None)
        );
        assert_eq!(write_code(&io), WorkspaceErrorCode::CleanupUnconfirmed);
        let Message::WorkspaceReadResult(refused) = read_failure(&WorkspaceError::NotFound) else {
            panic!("not a read result");
        };
        assert_eq!(
            (refused.status, refused.error_code),
            (WorkspaceStatus::Refused, Some(WorkspaceErrorCode::NotFound))
        );
    }

    #[test]
    fn the_payload_length_is_its_compact_encoding() {
        let value = json!({ "path": "a\"b\u{1}é", "n": [1, 2] });
        assert_eq!(
            request_payload_len(&value),
            serde_json::to_string(&value).unwrap().len()
        );
    }

    /// A workspace_read whose compact `payload` encoding is exactly `len` bytes, for a
    /// path that does not exist: components of 200 quotes (each encodes as two bytes).
    fn read_of_payload_len(id: &str, handle: &str, len: usize) -> Value {
        const RUN: usize = 200;
        let mut frame = Harness::read(id, handle, json!({ "operation": "bytes", "path": "" }));
        let mut left = len - request_payload_len(&frame["payload"]);
        let (mut path, mut run) = (String::new(), 0);
        while left >= 2 {
            if run == RUN && left >= 3 {
                path.push('/');
                (left, run) = (left - 1, 0);
            } else {
                path.push('"');
                (left, run) = (left - 2, run + 1);
            }
        }
        if left == 1 {
            path.push('q');
        }
        frame["payload"]["path"] = Value::String(path);
        assert_eq!(request_payload_len(&frame["payload"]), len);
        frame
    }

    /// Regression: the 8 KiB bound counted the whole frame, trace included. "request
    /// payloads are bounded to 8 KiB … oversized trace metadata does not enter the
    /// reply": a 7,777-byte payload with a 500-byte `tracestate` is admitted, a payload
    /// one byte over 8 KiB is `request_too_large`, and an oversized trace neither
    /// counts nor enters the reply.
    #[tokio::test]
    async fn the_request_bound_measures_the_payload_not_the_trace() {
        let mut h = Harness::start(OUTBOUND_QUEUE_BYTES_FOR_TESTS).await;
        std::fs::write(h.dir.path().join("notes.txt"), b"0123").unwrap();
        let handle = h.ready_handle("prep-1").await;

        let mut admitted = read_of_payload_len("op-7777", &handle, 7777);
        admitted["trace"] = json!({ "traceparent": TRACEPARENT, "tracestate": "k=".to_string() + &"v".repeat(498) });
        assert!(serde_json::to_vec(&admitted).unwrap().len() > WORKSPACE_REQUEST_MAX_BYTES);
        h.core(admitted).await;
        let result = h.next().await;
        assert_eq!(result["id"], "op-7777");
        // Admitted and served by the workspace: the path does not exist.
        assert_eq!(
            payload(&result),
            &json!({ "status": "refused", "error_code": "not_found" })
        );
        assert!(result.get("trace").is_none());

        let too_large = read_of_payload_len("op-big", &handle, WORKSPACE_REQUEST_MAX_BYTES + 1);
        h.core(too_large).await;
        let result = h.next().await;
        assert_eq!(
            payload(&result),
            &json!({ "status": "rejected", "error_code": "request_too_large" })
        );
        let at_bound = read_of_payload_len("op-bound", &handle, WORKSPACE_REQUEST_MAX_BYTES);
        h.core(at_bound).await;
        assert_eq!(payload(&h.next().await)["error_code"], "not_found");

        // An oversized (dropped) trace does not count and is not echoed.
        let mut traced = Harness::read(
            "op-traced",
            &handle,
            json!({ "operation": "bytes", "path": "notes.txt" }),
        );
        traced["trace"] = json!({
            "traceparent": TRACEPARENT,
            "tracestate": "x".repeat(2 * WORKSPACE_REQUEST_MAX_BYTES + TRACESTATE_MAX_BYTES),
        });
        h.core(traced).await;
        let result = h.next().await;
        assert_eq!(
            payload(&result),
            &json!({ "status": "ok", "data": "MDEyMw==", "truncated": false })
        );
        assert!(result.get("trace").is_none());
    }

    /// [`WORKSPACE_RESULT_FRAME_MAX_BYTES`] covers the largest encoded results.
    #[test]
    fn the_largest_results_fit_their_reservation() {
        let id = "i".repeat(CORRELATION_ID_MAX_BYTES);
        let data = Base64Bytes::new(vec![0xffu8; WORKSPACE_READ_RESULT_MAX_BYTES]).unwrap();
        let read = Frame::new(
            id.clone(),
            Message::WorkspaceReadResult(WorkspaceReadResult {
                status: WorkspaceStatus::Ok,
                entries: None,
                data: Some(data.clone()),
                truncated: Some(true),
                error_code: None,
            }),
        );
        let export = Frame::new(
            id.clone(),
            Message::WorkspaceExportResult(WorkspaceExportResult {
                status: WorkspaceStatus::Ok,
                data: Some(data),
                sha256: Some(BoundedString::new("f".repeat(64)).unwrap()),
                error_code: None,
            }),
        );
        // Every name byte a `\u00XX` escape.
        let name = "\u{1}".repeat(DIRECTORY_ENTRY_NAME_MAX_BYTES);
        let entries = (0..DIRECTORY_ENTRIES_MAX)
            .map(|_| DirectoryEntry {
                name: BoundedString::new(name.clone()).unwrap(),
                kind: EntryKind::File,
                size: Some(u64::MAX),
            })
            .collect();
        let listing = Frame::new(
            id,
            Message::WorkspaceReadResult(WorkspaceReadResult {
                status: WorkspaceStatus::Ok,
                entries: Some(BoundedVec::new(entries).unwrap()),
                data: None,
                truncated: Some(true),
                error_code: None,
            }),
        );
        for frame in [read, export, listing] {
            let len = frame.encode().unwrap().len();
            assert!(len <= WORKSPACE_RESULT_FRAME_MAX_BYTES, "{len}");
        }
    }

    /// Regression (memory and lock wedging): a read result waits for outbound room
    /// before it is produced and never while holding the state lock, so a full queue
    /// neither grows memory nor blocks dispatch of other frames.
    #[tokio::test]
    async fn read_results_wait_for_room_outside_the_state_lock() {
        let mut h = Harness::start(WORKSPACE_RESULT_FRAME_MAX_BYTES).await;
        std::fs::write(
            h.dir.path().join("big.bin"),
            vec![7u8; WORKSPACE_READ_RESULT_MAX_BYTES],
        )
        .unwrap();
        let handle = h.ready_handle("prep-1").await;
        let big = json!({ "operation": "bytes", "path": "big.bin" });
        h.core(Harness::read("op-1", &handle, big.clone())).await;
        // Held (not yet written): its bytes stay charged.
        let first = h.rx.recv().await.unwrap();
        h.core(Harness::read("op-2", &handle, big)).await;
        // The second read waits for room; dispatch and the state lock stay free.
        h.core(json!({
            "type": "environment_quiesce",
            "id": "susp-1",
            "payload": { "environment_id": DEFAULT_ENVIRONMENT_ID },
        }))
        .await;
        assert!(h.rt.state.try_lock().is_ok());
        let quiesced = h.next().await;
        assert_eq!(quiesced["type"], "environment_quiesced");
        assert!(h.rx.try_recv().is_none(), "op-2 must wait for room");
        assert!(h.out.queued_bytes() <= WORKSPACE_RESULT_FRAME_MAX_BYTES);
        drop(first);
        let second = h.next().await;
        assert_eq!(second["id"], "op-2");
        assert_eq!(payload(&second)["truncated"], false);
    }

    /// Budget of the test queues: the production budget.
    const OUTBOUND_QUEUE_BYTES_FOR_TESTS: usize =
        crate::core_runtime::daemon::outbound::OUTBOUND_QUEUE_BYTES;
}
