//! Workspace operations.

use super::*;

/// The owner a workspace operation runs against: an existing preparation handle or
/// the Run it was transferred to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspaceTarget {
    /// A preparation handle on this connection.
    AdmissionHandle(AdmissionHandle),
    /// A Run on this connection.
    RunId(RunId),
}

/// Kind of a `workspace_read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReadOperation {
    /// List one directory.
    Directory,
    /// Read a file's bytes.
    Bytes,
}

/// `workspace_read` (Core → Runtime). `Envelope.id`: operation ID (≤ 128 bytes).
/// The payload (its compact JSON encoding; not the Envelope's `id` or `trace`) is
/// bounded to [`WORKSPACE_REQUEST_MAX_BYTES`] ("request payloads are bounded to 8 KiB").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceRead {
    /// Owner of the read.
    pub target: WorkspaceTarget,
    /// The exact frozen Environment identity.
    pub environment_id: Uuid,
    /// Directory listing or byte read.
    pub operation: ReadOperation,
    /// Workspace-relative path; empty selects the root (directory reads).
    pub path: WirePath,
    /// Byte limit (bytes reads; for directories mutually exclusive with `max_entries`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Entry limit (directory reads only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
    /// Starting byte offset (bytes reads only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else.
    Other,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DirectoryEntry {
    /// Single path component, at most 255 bytes of UTF-8.
    pub name: BoundedString<DIRECTORY_ENTRY_NAME_MAX_BYTES>,
    /// Entry kind.
    pub kind: EntryKind,
    /// Size in bytes (regular files only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// Status of a workspace operation result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceStatus {
    /// Complete (or explicitly truncated) and the native close is confirmed.
    Ok,
    /// A safe native refusal; carries no bytes.
    Refused,
    /// Interrupted, ambiguous or cleanup uncertain; carries no data.
    Unavailable,
    /// Refused before admission (bounds, identity, target checks).
    Rejected,
}

/// Bounded error categories of workspace operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceErrorCode {
    /// The request payload exceeds 8 KiB.
    RequestTooLarge,
    /// The correlation ID exceeds 128 bytes (and is not echoed).
    IdTooLong,
    /// The frame does not decode as this operation.
    InvalidRequest,
    /// No such handle or Run on this connection.
    UnknownTarget,
    /// The Environment is not the owner's frozen Environment.
    EnvironmentMismatch,
    /// The path is absolute, escapes the workspace or is malformed.
    InvalidPath,
    /// Both byte and entry limits were given for a directory read.
    ConflictingLimits,
    /// The path does not exist.
    NotFound,
    /// The path is not a directory (directory reads) or not a file (byte reads).
    WrongKind,
    /// Permission denied by the file system.
    PermissionDenied,
    /// An operation with this ID is already pending.
    DuplicateOperation,
    /// An earlier read of this owner was interrupted; later reads are stopped.
    OwnerStopped,
    /// A write transfer is already open for the owner, or execution is running.
    Busy,
    /// A write chunk's offset is not the next expected offset.
    UnexpectedOffset,
    /// The write exceeds its declared size or 50 MiB.
    SizeExceeded,
    /// Commit before all declared bytes.
    Incomplete,
    /// The SHA-256 of the written body differs.
    DigestMismatch,
    /// The transfer expired before commit.
    Expired,
    /// The native close could not be confirmed.
    CleanupUnconfirmed,
    /// The export exceeds the 1 MiB result bound.
    ResultTooLarge,
    /// The owner lacks the capability the operation needs.
    UnsupportedOperation,
}

/// `workspace_read_result` (Runtime → Core). `Envelope.id`: the operation ID, or `""`
/// when the request's ID was over 128 bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceReadResult {
    /// Outcome.
    pub status: WorkspaceStatus,
    /// Directory entries (directory reads with `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<BoundedVec<DirectoryEntry, DIRECTORY_ENTRIES_MAX>>,
    /// File bytes (byte reads with `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Base64Bytes<WORKSPACE_READ_RESULT_MAX_BYTES>>,
    /// Explicit truncation (with `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// Why not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<WorkspaceErrorCode>,
}

/// `workspace_write` (Core → Runtime). `Envelope.id`: the operation ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspaceWrite {
    /// Typed header; no file data.
    Begin {
        /// Owner of the write.
        target: WorkspaceTarget,
        /// The exact frozen Environment identity.
        environment_id: Uuid,
        /// Workspace-relative file path.
        path: WirePath,
        /// Total size, at most 50 MiB.
        size: u64,
        /// SHA-256 of the complete body.
        sha256: Sha256Hex,
    },
    /// One acknowledged chunk of at most 64 KiB.
    Chunk {
        /// Offset; must equal the bytes received so far.
        offset: u64,
        /// The bytes.
        data: Base64Bytes<WRITE_CHUNK_MAX_BYTES>,
    },
    /// Verify the digest and run the installer.
    Commit {},
}

/// `workspace_write_result` (Runtime → Core). `Envelope.id`: the operation ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum WorkspaceWriteResult {
    /// The transfer is open.
    Ready {},
    /// A chunk was staged.
    Received {
        /// Offset of the staged chunk.
        offset: u64,
        /// Bytes staged so far.
        received: u64,
    },
    /// The exact commit receipt: the file is installed.
    Committed {
        /// Installed path.
        path: WirePath,
        /// Size.
        size: u64,
        /// Verified digest.
        sha256: Sha256Hex,
    },
    /// The exact rejection receipt: nothing was installed.
    Rejected {
        /// Why.
        error_code: WorkspaceErrorCode,
    },
}

/// `workspace_export` (Core → Runtime). `Envelope.id`: the operation ID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceExport {
    /// Owner of the export.
    pub target: WorkspaceTarget,
    /// The exact frozen Environment identity.
    pub environment_id: Uuid,
    /// Workspace-relative file or directory to export.
    pub path: WirePath,
}

/// `workspace_export_result` (Runtime → Core). `Envelope.id`: the operation ID.
/// `data` is a POSIX tar archive of the exported path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceExportResult {
    /// Outcome.
    pub status: WorkspaceStatus,
    /// Tar archive bytes (with `ok`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Base64Bytes<WORKSPACE_READ_RESULT_MAX_BYTES>>,
    /// SHA-256 of `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<Sha256Hex>,
    /// Why not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<WorkspaceErrorCode>,
}
