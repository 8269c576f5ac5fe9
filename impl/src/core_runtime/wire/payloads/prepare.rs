//! runtime_prepare: initialization and file/archive transfer.

use super::*;

/// Kind of a `runtime_prepare` transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransferKind {
    /// One file installed at `path`.
    File,
    /// A POSIX tar archive unpacked under directory `path`.
    Archive,
}

/// `runtime_prepare` (Core → Runtime). `Envelope.id`: the transfer ID (for
/// `initialize`, a request ID). Phases follow "Preparation and execution order":
/// `begin` → `ready`, ordered `chunk` → matching `received`, `commit` → `completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum RuntimePrepare {
    /// Initialize the connection's Environment binding.
    Initialize {
        /// Environment the Runtime must be bound to.
        environment_id: Uuid,
    },
    /// Typed header opening a transfer; carries no file data.
    Begin {
        /// Environment the transfer installs into.
        environment_id: Uuid,
        /// File or archive.
        kind: TransferKind,
        /// Workspace-relative destination.
        path: WirePath,
        /// Total bytes that will follow, at most [`WRITE_TRANSFER_MAX_BYTES`].
        size: u64,
        /// SHA-256 of the complete body.
        sha256: Sha256Hex,
    },
    /// One ordered chunk of at most [`WRITE_CHUNK_MAX_BYTES`].
    Chunk {
        /// Byte offset of `data` in the body; must equal the bytes received so far.
        offset: u64,
        /// The chunk bytes.
        data: Base64Bytes<WRITE_CHUNK_MAX_BYTES>,
    },
    /// Typed trailer: verify and install.
    Commit {},
}

/// Bounded error codes of `runtime_prepare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransferErrorCode {
    /// Another transfer is open on this connection ("One transfer per connection at a time").
    TransferInProgress,
    /// No open transfer has this ID.
    UnknownTransfer,
    /// A chunk's offset is not the next expected offset.
    UnexpectedOffset,
    /// The body exceeds its declared size or the transfer bound.
    SizeExceeded,
    /// Commit arrived before all declared bytes.
    Incomplete,
    /// The SHA-256 of the received body differs from the declared one.
    DigestMismatch,
    /// The destination path is not a valid workspace-relative path.
    InvalidPath,
    /// The environment is not the one this Runtime is bound to.
    EnvironmentMismatch,
    /// Installing the verified body failed.
    InstallFailed,
}

/// `runtime_prepare_result` (Runtime → Core). `Envelope.id`: as the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum RuntimePrepareResult {
    /// The Environment binding is initialized.
    Initialized {
        /// The bound Environment.
        environment_id: Uuid,
    },
    /// The transfer is open; send chunks.
    Ready {},
    /// A chunk was staged (not installed).
    Received {
        /// Offset of the staged chunk.
        offset: u64,
        /// Bytes staged so far.
        received: u64,
    },
    /// The commit was verified and installed.
    Completed {
        /// Installed workspace-relative path.
        path: WirePath,
        /// Installed body size.
        size: u64,
        /// Verified SHA-256.
        sha256: Sha256Hex,
    },
    /// The transfer (or initialization) failed and is closed.
    Failed {
        /// Bounded error category.
        code: TransferErrorCode,
    },
}
