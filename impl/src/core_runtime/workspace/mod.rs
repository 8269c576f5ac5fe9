//! The daemon's own workspace implementation: bounded reads, directory listing, file
//! creation, archive installation and output export.
//!
//! Spec ("Workspace operations"): "Every platform uses the daemon's own implementation
//! for bounded reads, directory listing, file creation and output export: no external
//! helper or staging directory." Every operation here runs in-process on a blocking
//! worker thread (`tokio::task::spawn_blocking`), never through a subprocess.
//!
//! # Paths
//! Every operation takes a workspace-relative path (the wire's `WirePath`): `/`-separated
//! components, no leading `/`, no `.`/`..`/empty components, no NUL, no backslash, at
//! most [`PATH_MAX_BYTES`]. The empty path selects the root. [`Workspace::resolve`] maps
//! it to a host path that stays inside the root even through symbolic links in existing
//! ancestors (the existing prefix is canonicalized and checked).
//!
//! **Residual race.** Resolution and the subsequent open are separate system calls: a
//! process running inside the workspace (the Harness) could swap a checked directory for
//! a symbolic link in between. Closing that window needs `openat2(RESOLVE_BENEATH)` or
//! per-component `openat(O_NOFOLLOW)`, which the crate's `unsafe_code = "forbid"` and
//! dependency set rule out today. Writers narrow it by re-checking the created parent.
//!
//! # Errors
//! [`WorkspaceError`]: every variant except [`WorkspaceError::Io`] is a safe refusal
//! (nothing was read or changed, the daemon reports `refused` with
//! [`WorkspaceError::refusal_code`]); `Io` is ambiguous (the daemon reports
//! `unavailable` with no error code, and for reads stops that owner's later reads: "an
//! interrupted or ambiguous read stays unknown and stops that owner's later reads").
//!
//! Operating-system errors are classified by [`WorkspaceError::from`]: an `errno` that
//! the kernel returns deterministically for the request itself, before any data moved
//! (`ENOENT`, `ENOTDIR`, `EACCES`/`EPERM`, `ENAMETOOLONG`, `ELOOP`, `EISDIR`, `EINVAL`),
//! is a safe refusal; anything else (`EIO`, `ENOMEM`, a failed close, …) is ambiguous.
//! A byte offset the kernel cannot seek to (past the largest file offset) is past the
//! end of the file: an empty read, not an error.

mod archive;
mod export;
mod install;
mod listing;
mod paths;
mod reads;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Component, Path, PathBuf};

use super::wire::limits::{
    DIRECTORY_ENTRIES_MAX, DIRECTORY_ENTRY_NAME_MAX_BYTES, PATH_MAX_BYTES,
    WORKSPACE_READ_RESULT_MAX_BYTES,
};
use super::wire::{DirectoryEntry, EntryKind, WorkspaceErrorCode};
use crate::wire::bounded::BoundedString;

/// Hard cap on names read from one directory before sorting.
///
/// A listing is sorted by name bytes for determinism, which needs every candidate name in
/// memory. Reading stops after this many names; any beyond it are left out and the
/// listing is marked `truncated` (so a directory larger than this cap returns the first
/// entries of an arbitrary subset, in sorted order, explicitly truncated). 65 536 names
/// of at most 255 bytes bound the memory of one listing to about 16 MiB.
pub const LISTING_SCAN_MAX: usize = 65_536;

/// Size of one tar block (header or data padding unit), in bytes.
const TAR_BLOCK: usize = 512;

/// The end-of-archive marker: two zero blocks.
const TAR_TRAILER: usize = 2 * TAR_BLOCK;

/// Maximum entries one export can hold: every entry costs at least one header block, and
/// the archive is bounded by [`WORKSPACE_READ_RESULT_MAX_BYTES`]. Also the cap on names
/// read from one directory while exporting (more names cannot fit).
const EXPORT_ENTRIES_MAX: usize = WORKSPACE_READ_RESULT_MAX_BYTES / TAR_BLOCK;

/// Name prefix of the daemon's hidden temporary files and unpack directories.
const TEMP_PREFIX: &str = ".contract-runtime-";

/// Attempts at finding an unused temporary name before giving up.
const TEMP_NAME_ATTEMPTS: usize = 16;

/// Why a workspace operation did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceError {
    /// The path is absolute, escapes the workspace, is malformed, or an archive entry is
    /// not installable (unsafe path, escaping link, unsupported entry type).
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// The path (or a parent of it) does not exist.
    #[error("not found")]
    NotFound,
    /// Directory read of a non-directory, byte read of a non-file, a file write onto a
    /// directory, a parent that is not a directory, or an archive entry whose kind
    /// conflicts with an existing entry.
    #[error("wrong kind of file-system entry")]
    WrongKind,
    /// The file system denied access (`EACCES`/`EPERM`).
    #[error("permission denied")]
    PermissionDenied,
    /// Both `max_entries` and `max_bytes` were given for a directory read.
    #[error("max_entries and max_bytes are mutually exclusive")]
    ConflictingLimits,
    /// The export exceeds [`WORKSPACE_READ_RESULT_MAX_BYTES`] (1 MiB).
    #[error("result exceeds the 1 MiB bound")]
    ResultTooLarge,
    /// Any other I/O failure (`EIO`, an interrupted transfer, a failed close, a failed
    /// blocking task). Ambiguous: the operation's effect is unknown.
    #[error("i/o error: {0}")]
    Io(String),
}

impl WorkspaceError {
    /// The bounded wire category of a safe refusal; `None` for [`WorkspaceError::Io`].
    ///
    /// `Io` is not a refusal: the daemon reports status `unavailable` for it ("an
    /// interrupted or ambiguous read stays unknown") and no error code — no bounded
    /// category names an unknown read outcome, and `cleanup_unconfirmed` ("The native
    /// close could not be confirmed") would misname it. `EACCES` never reaches `Io`; it
    /// is [`WorkspaceError::PermissionDenied`].
    pub fn refusal_code(&self) -> Option<WorkspaceErrorCode> {
        Some(match self {
            Self::InvalidPath(_) => WorkspaceErrorCode::InvalidPath,
            Self::NotFound => WorkspaceErrorCode::NotFound,
            Self::WrongKind => WorkspaceErrorCode::WrongKind,
            Self::PermissionDenied => WorkspaceErrorCode::PermissionDenied,
            Self::ConflictingLimits => WorkspaceErrorCode::ConflictingLimits,
            Self::ResultTooLarge => WorkspaceErrorCode::ResultTooLarge,
            Self::Io(_) => return None,
        })
    }

    /// True when nothing was read or changed ("A safe native refusal carries no bytes");
    /// false for [`WorkspaceError::Io`], whose effect is unknown ("an interrupted or
    /// ambiguous read stays unknown and stops that owner's later reads").
    pub fn is_safe_refusal(&self) -> bool {
        !matches!(self, Self::Io(_))
    }

    fn invalid(reason: impl Into<String>) -> Self {
        Self::InvalidPath(reason.into())
    }
}

/// Whether `e` is `ELOOP` (too many levels of symbolic links). `io::ErrorKind` has no
/// stable variant for it, so the raw `errno` decides.
fn is_symlink_loop(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32)
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

impl From<io::Error> for WorkspaceError {
    /// Classifies an operating-system error ("A safe native refusal carries no bytes;
    /// an interrupted or ambiguous read stays unknown", "Workspace operations").
    ///
    /// Deterministic refusals — the kernel rejected the request itself, nothing was
    /// transferred, and repeating it gives the same answer:
    /// * `ENOENT`, `ENOTDIR` → [`WorkspaceError::NotFound`] (the path, or a parent of
    ///   it, is not there as a directory);
    /// * `EACCES`, `EPERM` → [`WorkspaceError::PermissionDenied`];
    /// * `ENAMETOOLONG` (a component over the file system's name limit), `ELOOP` (a
    ///   symbolic-link loop), `EINVAL` (the file system refuses the name or argument) →
    ///   [`WorkspaceError::InvalidPath`];
    /// * `EISDIR` → [`WorkspaceError::WrongKind`].
    ///
    /// Everything else (`EIO`, `ENOMEM`, `ENOSPC`, `EBADF`, …) is
    /// [`WorkspaceError::Io`]: ambiguous.
    fn from(e: io::Error) -> Self {
        if is_symlink_loop(&e) {
            return Self::InvalidPath(format!("symbolic link loop: {e}"));
        }
        match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory => Self::NotFound,
            io::ErrorKind::PermissionDenied => Self::PermissionDenied,
            io::ErrorKind::InvalidFilename | io::ErrorKind::InvalidInput => {
                Self::InvalidPath(e.to_string())
            }
            io::ErrorKind::IsADirectory => Self::WrongKind,
            _ => Self::Io(e.to_string()),
        }
    }
}

/// Result of [`Workspace::list_directory`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryListing {
    /// Entries sorted by name bytes; at most [`DIRECTORY_ENTRIES_MAX`] (1024).
    pub entries: Vec<DirectoryEntry>,
    /// True whenever any entry of the directory was left out (bound reached, name not
    /// representable, or more than [`LISTING_SCAN_MAX`] names).
    pub truncated: bool,
}

/// Result of [`Workspace::read_bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByteRead {
    /// The bytes read from `offset`; at most [`WORKSPACE_READ_RESULT_MAX_BYTES`] (1 MiB).
    pub data: Vec<u8>,
    /// True when the file had more bytes after the returned ones.
    pub truncated: bool,
    /// File size in bytes when the file was opened.
    pub size: u64,
}

/// One bound workspace root.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: PathBuf,
}

impl Workspace {
    /// Binds the workspace at `root`, which must exist and is canonicalized (symbolic
    /// links in it resolved) once here.
    ///
    /// # Errors
    /// The error of canonicalizing `root`, or `NotADirectory` when it is not a directory.
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root = fs::canonicalize(root.into())?;
        if !fs::metadata(&root)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("workspace root {} is not a directory", root.display()),
            ));
        }
        Ok(Self { root })
    }

    /// The canonical workspace root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Maps a workspace-relative path to a host path inside the root.
    ///
    /// `""` is the root. The existing prefix of the path is resolved through symbolic
    /// links and must stay inside the root; the non-existent rest is appended as is. An
    /// existing final symbolic link is followed (the result names its target).
    ///
    /// # Errors
    /// * [`WorkspaceError::InvalidPath`]: over [`PATH_MAX_BYTES`], absolute, a `.`, `..`
    ///   or empty component (including a trailing `/`), NUL, backslash, a symbolic link
    ///   that leads outside the root, a dangling symbolic link in the path (its
    ///   destination cannot be checked), or a component over the file system's name
    ///   limit (`ENAMETOOLONG`).
    /// * [`WorkspaceError::PermissionDenied`] / [`WorkspaceError::Io`] from inspecting
    ///   the existing prefix.
    pub fn resolve(&self, rel: &str) -> Result<PathBuf, WorkspaceError> {
        let components = validate_relative(rel)?;
        resolve_within(&self.root, &components)
    }

    /// Lists one directory ("Workspace operations": "`operation: directory` lists one
    /// workspace-relative directory (an empty path selects the root); byte and entry
    /// limits are mutually exclusive").
    ///
    /// * No recursion, snapshot or paging.
    /// * At most `min(max_entries, 1024)` entries; with `max_bytes`, the sum of the
    ///   returned names' UTF-8 bytes is at most `max_bytes` (and at most 1024 entries).
    /// * Entries are sorted by name bytes and returned as a prefix of that order: the
    ///   first entry that does not fit ends the listing.
    /// * `kind` comes from the entry itself (symbolic links are not followed); `size` is
    ///   present for regular files only.
    /// * Names that are not valid UTF-8 or longer than 255 bytes cannot be carried on the
    ///   wire: they are skipped and the listing is marked `truncated`.
    /// * At most [`LISTING_SCAN_MAX`] names are read; a larger directory is `truncated`.
    /// * An entry that disappears between reading the directory and inspecting it is
    ///   omitted (it no longer exists; nothing was left out).
    ///
    /// The directory handle is closed before this returns ("it returns only after
    /// directory access and handle cleanup have settled").
    ///
    /// # Errors
    /// [`WorkspaceError::ConflictingLimits`] when both limits are given; path errors as
    /// [`Self::resolve`]; [`WorkspaceError::NotFound`]; [`WorkspaceError::WrongKind`]
    /// when the path is not a directory; [`WorkspaceError::PermissionDenied`];
    /// [`WorkspaceError::Io`].
    pub async fn list_directory(
        &self,
        rel: &str,
        max_entries: Option<u64>,
        max_bytes: Option<u64>,
    ) -> Result<DirectoryListing, WorkspaceError> {
        if max_entries.is_some() && max_bytes.is_some() {
            return Err(WorkspaceError::ConflictingLimits);
        }
        let dir = self.resolve(rel)?;
        blocking(move || list_blocking(&dir, max_entries, max_bytes)).await
    }

    /// Reads at most `min(max_bytes, 1 MiB)` bytes of a regular file from `offset`
    /// ("A raw read result is bounded to 1 MiB"). `truncated` is true when the file has
    /// more bytes after the returned ones ("A successful read requires the complete bytes
    /// or an explicit truncation"). An offset at or past the end returns no bytes, not
    /// truncated. The file is read through a bounded reader; it is never loaded whole.
    ///
    /// A symbolic link is followed only when [`Self::resolve`] keeps its destination
    /// inside the root.
    ///
    /// # Errors
    /// Path errors as [`Self::resolve`]; [`WorkspaceError::NotFound`];
    /// [`WorkspaceError::WrongKind`] when the path is not a regular file (checked before
    /// opening, so a FIFO is never opened); [`WorkspaceError::PermissionDenied`];
    /// [`WorkspaceError::Io`].
    pub async fn read_bytes(
        &self,
        rel: &str,
        offset: u64,
        max_bytes: Option<u64>,
    ) -> Result<ByteRead, WorkspaceError> {
        let path = self.resolve(rel)?;
        blocking(move || read_blocking(&path, offset, max_bytes)).await
    }

    /// Installs `body` as the file `rel`, creating missing parent directories.
    ///
    /// Atomic: the body is written to a hidden temporary file in the destination's
    /// directory, flushed (`fsync`), renamed over the destination, and the directory is
    /// flushed. A failure before the rename removes the temporary file, so no partial
    /// file is ever visible at `rel`. Replacing an existing regular file keeps its
    /// permissions; an existing symbolic link inside the root is followed (its
    /// destination is replaced). The body is copied once to move it to the blocking
    /// worker; [`Self::install_file_owned`] avoids that copy.
    ///
    /// # Errors
    /// [`WorkspaceError::InvalidPath`] for the empty path (the root is not a file) and
    /// as [`Self::resolve`]; [`WorkspaceError::WrongKind`] when the destination is a
    /// directory or a parent is not a directory; [`WorkspaceError::PermissionDenied`];
    /// [`WorkspaceError::Io`] (ambiguous: a failure after the rename — flushing the
    /// directory — leaves the new file installed).
    pub async fn install_file(&self, rel: &str, body: &[u8]) -> Result<(), WorkspaceError> {
        self.install_file_owned(rel, body.to_vec()).await
    }

    /// [`Self::install_file`] taking the body by value (no copy).
    ///
    /// # Errors
    /// As [`Self::install_file`].
    pub async fn install_file_owned(&self, rel: &str, body: Vec<u8>) -> Result<(), WorkspaceError> {
        if rel.is_empty() {
            return Err(WorkspaceError::invalid("the workspace root is not a file"));
        }
        let target = self.resolve(rel)?;
        let root = self.root.clone();
        blocking(move || install_file_blocking(&root, &target, &body)).await
    }

    /// Unpacks the POSIX tar archive `tar` under the directory `rel_dir` (`""` = root),
    /// all or nothing.
    ///
    /// 1. Every entry is extracted into a fresh hidden directory inside the root (next to
    ///    the destination, so the final renames stay on one file system). Accepted
    ///    entries: regular files (mode bits `& 0o777` kept; owner, times and special
    ///    bits are not), directories, symbolic links and hard links. Entry paths must be
    ///    relative with only normal components (`./` prefixes are ignored); `..`,
    ///    absolute paths, devices, FIFOs and sparse files are refused.
    /// 2. Symbolic links are created after all other entries, so no entry is ever written
    ///    through a link; an entry path that passes through a link of the same archive is
    ///    refused. Every link must resolve inside the unpacked tree (checked on the real
    ///    file system, so chains of links are covered); absolute targets are refused.
    ///    Hard links may only name an earlier regular-file entry of the same archive.
    /// 3. Commit: when `rel_dir` does not exist, its missing parents are created and the
    ///    unpacked directory is renamed onto it (atomic). When it is an existing directory, the archive is merged: every
    ///    conflict (a file over a directory, a directory over a file or a link) is
    ///    checked before anything moves, then entries are renamed into place (files
    ///    replace files and links; directories not yet present move whole).
    ///
    /// Any failure in steps 1–2, or a conflict, removes the unpacked directory and
    /// changes nothing in the workspace. Only an I/O failure during the final renames of
    /// a merge can leave it partially applied; that is reported as
    /// [`WorkspaceError::Io`] (ambiguous).
    ///
    /// # Errors
    /// [`WorkspaceError::InvalidPath`] for unsafe or unsupported entries and malformed
    /// archives and as [`Self::resolve`]; [`WorkspaceError::WrongKind`] when `rel_dir`
    /// is not a directory or an entry conflicts with an existing one;
    /// [`WorkspaceError::PermissionDenied`]; [`WorkspaceError::Io`].
    pub async fn install_archive(&self, rel_dir: &str, tar: &[u8]) -> Result<(), WorkspaceError> {
        self.install_archive_owned(rel_dir, tar.to_vec()).await
    }

    /// [`Self::install_archive`] taking the archive by value (no copy).
    ///
    /// # Errors
    /// As [`Self::install_archive`].
    pub async fn install_archive_owned(
        &self,
        rel_dir: &str,
        tar: Vec<u8>,
    ) -> Result<(), WorkspaceError> {
        let dest = self.resolve(rel_dir)?;
        let root = self.root.clone();
        blocking(move || install_archive_blocking(&root, &dest, &tar)).await
    }

    /// Exports a file or directory as a POSIX (ustar, with PAX extended headers for
    /// names over the ustar limits) tar archive, bounded by
    /// [`WORKSPACE_READ_RESULT_MAX_BYTES`] (1 MiB, end-of-archive blocks included).
    ///
    /// * A file exports as one entry named by the last component of `rel`.
    /// * A directory exports its contents recursively, entry names relative to it
    ///   (directories carry a trailing `/`); the directory itself is not an entry.
    /// * Deterministic: pre-order, siblings sorted by name bytes; mtime 0, uid/gid 0,
    ///   empty user/group names; mode bits from the file (`& 0o7777`).
    /// * Symbolic links are recorded as links (never followed); other kinds (FIFOs,
    ///   sockets, devices) cannot be exported safely and are skipped.
    /// * Building stops as soon as the next write would pass the bound; no unbounded
    ///   buffer is ever built.
    ///
    /// # Errors
    /// [`WorkspaceError::ResultTooLarge`] past the bound; path errors as
    /// [`Self::resolve`]; [`WorkspaceError::NotFound`]; [`WorkspaceError::WrongKind`]
    /// when the path is neither a file nor a directory;
    /// [`WorkspaceError::PermissionDenied`]; [`WorkspaceError::Io`].
    pub async fn export(&self, rel: &str) -> Result<Vec<u8>, WorkspaceError> {
        let path = self.resolve(rel)?;
        let name = rel.rsplit('/').next().unwrap_or_default().to_owned();
        blocking(move || export_blocking(&path, &name)).await
    }
}

/// Runs `f` on the blocking pool; a failed (panicked or cancelled) task is ambiguous.
async fn blocking<T, F>(f: F) -> Result<T, WorkspaceError>
where
    F: FnOnce() -> Result<T, WorkspaceError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| WorkspaceError::Io(format!("workspace task failed: {e}")))?
}

use archive::*;
use export::*;
use install::*;
use listing::*;
use paths::*;
use reads::*;
