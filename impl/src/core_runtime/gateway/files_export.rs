//! Idle Files export ("Workspace operations", `workspace_export`): a POSIX tar archive
//! of a file or directory of a Session's workspace, built by the Runtime's own
//! implementation, while no Turn runs.
//!
//! The flow is the idle read's ([`super::files`]): the Session scheduling reservation,
//! a device admitting the read-only profile, `runtime_prepare` `initialize` once per
//! connection and Environment, `execution_prepare` (read-only profile) → `ready`, one
//! `workspace_export` against the admission handle with the exact frozen Environment,
//! then `execution_release` → `released`. The archive is returned only when the export
//! was `ok`, its SHA-256 matches the bytes, *and* the close was confirmed. The path
//! passes the public check of writes ([`super::files_write::check_path`]: relative, no
//! empty, `.` or `..` component) before any Runtime work.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::Core;
use super::connection::RouteKind;
use super::files::{FilesError, IdleOp, wire_code};
use crate::core_runtime::wire::{
    Frame, Message, Uuid, WirePath, WorkspaceErrorCode, WorkspaceExport, WorkspaceStatus,
    WorkspaceTarget,
};

/// A confirmed export: the tar archive and its verified SHA-256 (lower-case hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// The tar archive bytes.
    pub archive: Vec<u8>,
    /// SHA-256 of `archive`, lower-case hex.
    pub sha256: String,
}

/// Why an export returned no archive: a [`FilesError`], or the Runtime's
/// `result_too_large` refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    /// As for reads.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The archive would exceed the 1 MiB result bound (the Runtime's
    /// `result_too_large`).
    #[error("the export exceeds the 1 MiB result bound")]
    TooLarge,
}

impl ExportError {
    /// Stable public code.
    pub fn code(&self) -> &'static str {
        match self {
            ExportError::Files(e) => e.code(),
            ExportError::TooLarge => "export_too_large",
        }
    }
}

/// Runs one idle export of `path` (see the module docs).
///
/// # Errors
/// Any [`ExportError`]; no archive is returned unless the close was confirmed.
pub async fn idle_export(
    core: &Arc<Core>,
    session_id: &str,
    path: &str,
) -> Result<Export, ExportError> {
    super::files_write::check_path(path).map_err(|e| FilesError::InvalidPath(e.into()))?;
    let path = WirePath::new(path).map_err(|e| FilesError::InvalidPath(e.to_string()))?;
    let mut idle = IdleOp::begin(core, session_id).await?;
    let (session_uuid, environment_id, environment_type) = idle.target();
    let (mut op, decl) = idle.op();
    let (prep_id, handle) = op
        .prepare_read_only(decl, session_uuid, &environment_id, environment_type)
        .await?;
    let op_id = format!("export-{}", Uuid::random());
    op.route(RouteKind::Operation, &op_id)?;
    op.send(Frame::new(
        op_id,
        Message::WorkspaceExport(WorkspaceExport {
            target: WorkspaceTarget::AdmissionHandle(handle.clone()),
            environment_id,
            path,
        }),
    ))
    .await?;
    let result = loop {
        if let Message::WorkspaceExportResult(r) = op.next().await?.message {
            break r;
        }
    };
    // Release, and wait for the confirmed close before delivering anything.
    op.release(prep_id, &handle).await?;
    drop(idle);
    match result.status {
        WorkspaceStatus::Ok => {
            let (Some(data), Some(declared)) = (result.data, result.sha256) else {
                return Err(FilesError::Unavailable("incomplete".into()).into());
            };
            let archive = data.bytes().to_vec();
            let sha256 = hex::encode(Sha256::digest(&archive));
            if sha256 != declared.as_str() {
                return Err(FilesError::Unavailable("digest_mismatch".into()).into());
            }
            Ok(Export { archive, sha256 })
        }
        WorkspaceStatus::Unavailable => Err(FilesError::Unavailable(
            result.error_code.map_or("unavailable".into(), wire_code),
        )
        .into()),
        WorkspaceStatus::Refused | WorkspaceStatus::Rejected => Err(match result.error_code {
            Some(WorkspaceErrorCode::ResultTooLarge) => ExportError::TooLarge,
            Some(WorkspaceErrorCode::NotFound) => FilesError::NotFound.into(),
            Some(WorkspaceErrorCode::InvalidPath) => {
                FilesError::InvalidPath("refused by the Runtime".into()).into()
            }
            code => FilesError::Refused(code.map_or("refused".into(), wire_code)).into(),
        }),
    }
}
