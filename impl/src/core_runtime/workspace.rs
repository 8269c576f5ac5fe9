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

// ---------------------------------------------------------------------------
// Path validation and resolution
// ---------------------------------------------------------------------------

/// Splits a wire path into validated components (`""` → none).
fn validate_relative(rel: &str) -> Result<Vec<&str>, WorkspaceError> {
    if rel.len() > PATH_MAX_BYTES {
        return Err(WorkspaceError::invalid(format!(
            "path of {} bytes exceeds {PATH_MAX_BYTES}",
            rel.len()
        )));
    }
    if rel.is_empty() {
        return Ok(Vec::new());
    }
    if rel.contains('\0') {
        return Err(WorkspaceError::invalid("path contains NUL"));
    }
    if rel.contains('\\') {
        return Err(WorkspaceError::invalid("path contains a backslash"));
    }
    if rel.starts_with('/') {
        return Err(WorkspaceError::invalid("path is absolute"));
    }
    let components: Vec<&str> = rel.split('/').collect();
    for c in &components {
        match *c {
            "" => return Err(WorkspaceError::invalid("path has an empty component")),
            "." | ".." => {
                return Err(WorkspaceError::invalid(format!(
                    "path has a `{c}` component"
                )));
            }
            _ => {}
        }
    }
    Ok(components)
}

/// Walks `components` below the canonical `root`, resolving every existing symbolic link
/// and refusing any that leaves the root.
fn resolve_within(root: &Path, components: &[&str]) -> Result<PathBuf, WorkspaceError> {
    let mut current = root.to_path_buf();
    let mut rest = components.iter();
    for c in rest.by_ref() {
        let candidate = current.join(c);
        match fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() => match fs::canonicalize(&candidate) {
                Ok(target) if target.starts_with(root) => current = target,
                Ok(_) => {
                    return Err(WorkspaceError::invalid(
                        "a symbolic link in the path leads outside the workspace",
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(WorkspaceError::invalid(
                        "a symbolic link in the path is dangling",
                    ));
                }
                Err(e) => return Err(e.into()),
            },
            Ok(_) => current = candidate,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                // This and every later component do not exist: nothing to resolve.
                current = candidate;
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    for c in rest {
        current.push(c);
    }
    Ok(current)
}

/// Re-checks, after creating directories, that `dir` still resolves inside `root`.
fn ensure_inside(root: &Path, dir: &Path) -> Result<(), WorkspaceError> {
    let canonical = fs::canonicalize(dir)?;
    if canonical.starts_with(root) {
        Ok(())
    } else {
        Err(WorkspaceError::invalid(
            "the destination directory leads outside the workspace",
        ))
    }
}

// ---------------------------------------------------------------------------
// Directory listing
// ---------------------------------------------------------------------------

fn list_blocking(
    dir: &Path,
    max_entries: Option<u64>,
    max_bytes: Option<u64>,
) -> Result<DirectoryListing, WorkspaceError> {
    if !fs::metadata(dir)?.is_dir() {
        return Err(WorkspaceError::WrongKind);
    }
    let mut truncated = false;
    let mut names: Vec<String> = Vec::new();
    {
        // The handle is dropped at the end of this block, before any entry is inspected.
        let reader = fs::read_dir(dir)?;
        for entry in reader {
            let entry = entry?;
            if names.len() == LISTING_SCAN_MAX {
                truncated = true;
                break;
            }
            match entry.file_name().into_string() {
                Ok(name) if name.len() <= DIRECTORY_ENTRY_NAME_MAX_BYTES => names.push(name),
                // Not representable on the wire: left out, explicitly.
                _ => truncated = true,
            }
        }
    }
    // `String` orders by UTF-8 bytes.
    names.sort_unstable();

    let entry_bound = max_entries.map_or(DIRECTORY_ENTRIES_MAX, |m| {
        usize::try_from(m).map_or(DIRECTORY_ENTRIES_MAX, |m| m.min(DIRECTORY_ENTRIES_MAX))
    });
    let mut name_bytes: u64 = 0;
    let mut entries = Vec::new();
    for name in names {
        if entries.len() >= entry_bound {
            truncated = true;
            break;
        }
        let len = name.len() as u64;
        if max_bytes.is_some_and(|max| name_bytes.saturating_add(len) > max) {
            truncated = true;
            break;
        }
        let meta = match fs::symlink_metadata(dir.join(&name)) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        let ft = meta.file_type();
        let (kind, size) = if ft.is_symlink() {
            (EntryKind::Symlink, None)
        } else if ft.is_file() {
            (EntryKind::File, Some(meta.len()))
        } else if ft.is_dir() {
            (EntryKind::Directory, None)
        } else {
            (EntryKind::Other, None)
        };
        let name = BoundedString::new(name).map_err(WorkspaceError::Io)?;
        name_bytes += len;
        entries.push(DirectoryEntry { name, kind, size });
    }
    Ok(DirectoryListing { entries, truncated })
}

// ---------------------------------------------------------------------------
// Byte reads
// ---------------------------------------------------------------------------

fn read_blocking(
    path: &Path,
    offset: u64,
    max_bytes: Option<u64>,
) -> Result<ByteRead, WorkspaceError> {
    // Checked before opening: opening a FIFO would block.
    if !fs::metadata(path)?.is_file() {
        return Err(WorkspaceError::WrongKind);
    }
    let mut file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(WorkspaceError::WrongKind);
    }
    let size = meta.len();
    let cap = WORKSPACE_READ_RESULT_MAX_BYTES as u64;
    let limit = max_bytes.map_or(cap, |m| m.min(cap));
    if let Err(e) = file.seek(SeekFrom::Start(offset)) {
        if e.kind() == io::ErrorKind::InvalidInput && offset >= size {
            // `lseek` refuses (`EINVAL`) offsets above `i64::MAX` and past the largest
            // file size the file system supports: past the end of this file whatever
            // it does meanwhile. A deterministic empty read, not an ambiguous one.
            close_confirmed(file)?;
            return Ok(ByteRead {
                data: Vec::new(),
                truncated: false,
                size,
            });
        }
        return Err(e.into());
    }
    let expected = size.saturating_sub(offset).min(limit);
    let mut data = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
    (&mut file).take(limit).read_to_end(&mut data)?;
    let truncated = if data.len() as u64 == limit {
        // Probe one more byte: the file (not its earlier size) decides.
        let mut probe = [0u8; 1];
        loop {
            match file.read(&mut probe) {
                Ok(n) => break n > 0,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    } else {
        false
    };
    close_confirmed(file)?;
    Ok(ByteRead {
        data,
        truncated,
        size,
    })
}

/// Closes `file` and reports the outcome ("A successful read requires … a confirmed
/// native close", "Workspace operations"); dropping a `File` ignores close errors. A
/// failed close is ambiguous ([`WorkspaceError::Io`]) whatever its `errno`.
fn close_confirmed(file: File) -> Result<(), WorkspaceError> {
    #[cfg(unix)]
    {
        nix::unistd::close(file)
            .map_err(|e| WorkspaceError::Io(format!("closing the file failed: {e}")))
    }
    #[cfg(not(unix))]
    {
        drop(file);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// File installation
// ---------------------------------------------------------------------------

/// Maps errors of creating parent directories: a component that exists as a file is the
/// wrong kind, not a missing path.
fn parent_error(e: io::Error) -> WorkspaceError {
    match e.kind() {
        io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => WorkspaceError::WrongKind,
        _ => e.into(),
    }
}

fn install_file_blocking(root: &Path, target: &Path, body: &[u8]) -> Result<(), WorkspaceError> {
    let parent = target
        .parent()
        .ok_or_else(|| WorkspaceError::invalid("the destination has no parent"))?;
    fs::create_dir_all(parent).map_err(parent_error)?;
    ensure_inside(root, parent)?;
    if !fs::metadata(parent)?.is_dir() {
        return Err(WorkspaceError::WrongKind);
    }
    let existing = match fs::metadata(target) {
        Ok(meta) if meta.is_dir() => return Err(WorkspaceError::WrongKind),
        Ok(meta) if meta.is_file() => Some(meta.permissions()),
        Ok(_) => return Err(WorkspaceError::WrongKind),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    write_atomically(parent, target, body, existing)
}

/// Creates a new, uniquely named hidden file in `dir`.
fn create_temp_file(dir: &Path) -> Result<(PathBuf, File), WorkspaceError> {
    for _ in 0..TEMP_NAME_ATTEMPTS {
        let path = dir.join(temp_name("tmp"));
        match File::options().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(WorkspaceError::Io("no free temporary file name".into()))
}

/// `.contract-runtime-<pid>-<random>.<suffix>`.
fn temp_name(suffix: &str) -> String {
    format!(
        "{TEMP_PREFIX}{}-{:016x}.{suffix}",
        std::process::id(),
        rand::random::<u64>()
    )
}

/// Temp file + fsync + rename + directory fsync. Removes the temp file on any failure
/// before the rename.
fn write_atomically(
    dir: &Path,
    target: &Path,
    body: &[u8],
    permissions: Option<fs::Permissions>,
) -> Result<(), WorkspaceError> {
    let (tmp, mut file) = create_temp_file(dir)?;
    let staged = (|| -> io::Result<()> {
        file.write_all(body)?;
        if let Some(p) = permissions {
            file.set_permissions(p)?;
        }
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, target)
    })();
    if let Err(e) = staged {
        // Best effort: the temp name is hidden and unique; nothing is visible at `target`.
        let _ = fs::remove_file(&tmp);
        return Err(match e.kind() {
            io::ErrorKind::IsADirectory | io::ErrorKind::DirectoryNotEmpty => {
                WorkspaceError::WrongKind
            }
            _ => e.into(),
        });
    }
    sync_dir(dir)
}

/// Flushes a directory's entries (after a rename). A failure is ambiguous: the rename
/// happened but its durability is not confirmed.
fn sync_dir(dir: &Path) -> Result<(), WorkspaceError> {
    #[cfg(unix)]
    {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| WorkspaceError::Io(format!("flushing {}: {e}", dir.display())))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Archive installation
// ---------------------------------------------------------------------------

/// Removes the unpack directory on drop unless it was consumed by the commit.
struct StagingDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        if !self.keep {
            // `remove_dir_all` does not follow symbolic links.
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Validates an archive entry path: relative, normal components only (`.` ignored),
/// within [`PATH_MAX_BYTES`]. Returns `None` for the archive root itself (`./`).
fn archive_path(raw: &Path) -> Result<Option<PathBuf>, WorkspaceError> {
    if raw.as_os_str().len() > PATH_MAX_BYTES {
        return Err(WorkspaceError::invalid("archive entry path is too long"));
    }
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(WorkspaceError::invalid(format!(
                    "archive entry {} has a `..` component",
                    raw.display()
                )));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(WorkspaceError::invalid(format!(
                    "archive entry {} is absolute",
                    raw.display()
                )));
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Nearest existing ancestor of `dest` (itself included), which is inside `root`.
fn nearest_existing(root: &Path, dest: &Path) -> PathBuf {
    let mut p = dest;
    loop {
        if p == root || fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
            return p.to_path_buf();
        }
        match p.parent() {
            Some(parent) if parent.starts_with(root) => p = parent,
            _ => return root.to_path_buf(),
        }
    }
}

fn install_archive_blocking(root: &Path, dest: &Path, tar: &[u8]) -> Result<(), WorkspaceError> {
    let dest_meta = match fs::symlink_metadata(dest) {
        Ok(meta) if meta.is_dir() => Some(meta),
        Ok(_) => return Err(WorkspaceError::WrongKind),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
            return Err(WorkspaceError::WrongKind);
        }
        Err(e) => return Err(e.into()),
    };
    // Unpack next to the destination (its parent when it exists; the root when the
    // destination is the root), or in its nearest existing ancestor.
    let stage_parent = if dest == root {
        root.to_path_buf()
    } else {
        match dest.parent() {
            Some(parent) => nearest_existing(root, parent),
            None => root.to_path_buf(),
        }
    };
    ensure_inside(root, &stage_parent)?;
    let stage_path = stage_parent.join(temp_name("unpack"));
    fs::create_dir(&stage_path)?;
    let mut stage = StagingDir {
        path: fs::canonicalize(&stage_path)?,
        keep: false,
    };
    let staged = stage.path.clone();

    unpack_into(&staged, tar)?;

    match dest_meta {
        None => {
            if let Some(parent) = dest.parent() {
                fs::create_dir_all(parent).map_err(parent_error)?;
                ensure_inside(root, parent)?;
            }
            fs::rename(&staged, dest).map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists | io::ErrorKind::DirectoryNotEmpty => {
                    WorkspaceError::WrongKind
                }
                _ => e.into(),
            })?;
            stage.keep = true;
            if let Some(parent) = dest.parent() {
                sync_dir(parent)?;
            }
        }
        Some(_) => {
            let mut moves = Vec::new();
            plan_merge(&staged, dest, &mut moves)?;
            for (from, to) in &moves {
                fs::rename(from, to).map_err(|e| {
                    WorkspaceError::Io(format!("merging {}: {e} (partially applied)", to.display()))
                })?;
            }
            sync_dir(dest)?;
            // `stage` now holds only the shells of merged directories; dropped below.
        }
    }
    Ok(())
}

/// Extracts every entry of `tar` into the empty directory `stage` (see
/// [`Workspace::install_archive`] for the rules).
fn unpack_into(stage: &Path, tar: &[u8]) -> Result<(), WorkspaceError> {
    let malformed = |e: io::Error| WorkspaceError::invalid(format!("malformed archive: {e}"));
    let mut archive = tar::Archive::new(tar);
    let mut regular: HashSet<PathBuf> = HashSet::new();
    let mut links: Vec<(PathBuf, PathBuf)> = Vec::new();
    let mut symlink_paths: HashSet<PathBuf> = HashSet::new();

    for entry in archive.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            continue;
        }
        let raw = entry.path().map_err(malformed)?.into_owned();
        let Some(rel) = archive_path(&raw)? else {
            if kind.is_dir() {
                continue;
            }
            return Err(WorkspaceError::invalid("archive entry has an empty path"));
        };
        let target = stage.join(&rel);
        if kind.is_dir() {
            fs::create_dir_all(&target).map_err(|e| entry_conflict(&rel, e))?;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            create_parent(stage, &rel)?;
            let mut file = match fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => {
                    return Err(WorkspaceError::invalid(format!(
                        "archive entry {} replaces a directory",
                        rel.display()
                    )));
                }
                // A duplicate entry replaces the earlier one (tar semantics).
                Ok(_) => {
                    fs::remove_file(&target)?;
                    File::create(&target)?
                }
                Err(_) => File::create(&target)?,
            };
            io::copy(&mut entry, &mut file).map_err(malformed)?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = entry.header().mode().map_err(malformed)? & 0o777;
                file.set_permissions(fs::Permissions::from_mode(mode))?;
            }
            file.sync_all()?;
            regular.insert(rel);
        } else if kind.is_symlink() {
            let link = entry
                .link_name()
                .map_err(malformed)?
                .ok_or_else(|| WorkspaceError::invalid("symbolic link without a target"))?
                .into_owned();
            if link.as_os_str().is_empty() || link.has_root() || link.is_absolute() {
                return Err(WorkspaceError::invalid(format!(
                    "symbolic link {} has an absolute or empty target",
                    rel.display()
                )));
            }
            symlink_paths.insert(rel.clone());
            links.push((rel, link));
        } else if kind.is_hard_link() {
            let raw_link = entry
                .link_name()
                .map_err(malformed)?
                .ok_or_else(|| WorkspaceError::invalid("hard link without a target"))?
                .into_owned();
            let Some(link) = archive_path(&raw_link)? else {
                return Err(WorkspaceError::invalid("hard link with an empty target"));
            };
            if !regular.contains(&link) {
                return Err(WorkspaceError::invalid(format!(
                    "hard link {} does not name an earlier regular file of the archive",
                    rel.display()
                )));
            }
            create_parent(stage, &rel)?;
            match fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => {
                    return Err(WorkspaceError::invalid(format!(
                        "archive entry {} replaces a directory",
                        rel.display()
                    )));
                }
                Ok(_) => fs::remove_file(&target)?,
                Err(_) => {}
            }
            fs::hard_link(stage.join(&link), &target)?;
            regular.insert(rel);
        } else {
            return Err(WorkspaceError::invalid(format!(
                "archive entry {} has an unsupported type ({:?})",
                rel.display(),
                kind
            )));
        }
    }

    // Links last: nothing above was written through one.
    for (rel, link) in &links {
        if rel.ancestors().skip(1).any(|a| symlink_paths.contains(a)) {
            return Err(WorkspaceError::invalid(format!(
                "archive entry {} passes through a symbolic link",
                rel.display()
            )));
        }
        create_parent(stage, rel)?;
        let at = stage.join(rel);
        if fs::symlink_metadata(&at).is_ok() {
            return Err(WorkspaceError::invalid(format!(
                "symbolic link {} conflicts with another archive entry",
                rel.display()
            )));
        }
        make_symlink(link, &at)?;
    }
    for (rel, link) in &links {
        let parent = stage.join(rel).parent().map(Path::to_path_buf);
        let inside = parent.is_some_and(|p| link_stays_inside(stage, &p.join(link)));
        if !inside {
            return Err(WorkspaceError::invalid(format!(
                "symbolic link {} leads outside the archive",
                rel.display()
            )));
        }
    }
    Ok(())
}

/// Creates the parent directories of a staged entry; a file in the way is a malformed
/// archive (the staging tree has no links at this point).
fn create_parent(stage: &Path, rel: &Path) -> Result<(), WorkspaceError> {
    match stage.join(rel).parent() {
        Some(parent) => fs::create_dir_all(parent).map_err(|e| entry_conflict(rel, e)),
        None => Ok(()),
    }
}

fn entry_conflict(rel: &Path, e: io::Error) -> WorkspaceError {
    match e.kind() {
        io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => WorkspaceError::invalid(
            format!("archive entry {} conflicts with a file", rel.display()),
        ),
        _ => e.into(),
    }
}

#[cfg(unix)]
fn make_symlink(target: &Path, at: &Path) -> Result<(), WorkspaceError> {
    std::os::unix::fs::symlink(target, at).map_err(Into::into)
}

#[cfg(not(unix))]
fn make_symlink(_target: &Path, _at: &Path) -> Result<(), WorkspaceError> {
    Err(WorkspaceError::invalid(
        "symbolic links are not supported on this platform",
    ))
}

/// Whether `path` (a link's destination, possibly through further links or not yet
/// existing) resolves inside the canonical `stage`. The longest existing prefix is
/// canonicalized on the real file system; the non-existent rest must be normal
/// components. Conservative: a `..` after a non-existent component is refused.
fn link_stays_inside(stage: &Path, path: &Path) -> bool {
    let mut prefix = path.to_path_buf();
    loop {
        if let Ok(real) = fs::canonicalize(&prefix) {
            return real.starts_with(stage);
        }
        // `file_name` is `None` for a path ending in `..`: refuse.
        if prefix.file_name().is_none() || !prefix.pop() {
            return false;
        }
        if !prefix.starts_with(stage) {
            return false;
        }
    }
}

/// Plans the renames that merge the staged tree `from` into the existing directory `to`,
/// failing on the first conflict before anything moves.
fn plan_merge(
    from: &Path,
    to: &Path,
    moves: &mut Vec<(PathBuf, PathBuf)>,
) -> Result<(), WorkspaceError> {
    let mut names: Vec<OsString> = fs::read_dir(from)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    for name in names {
        let src = from.join(&name);
        let dst = to.join(&name);
        let staged_is_dir = fs::symlink_metadata(&src)?.is_dir();
        match fs::symlink_metadata(&dst) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => moves.push((src, dst)),
            Err(e) => return Err(e.into()),
            Ok(existing) => match (staged_is_dir, existing.is_dir()) {
                (true, true) => plan_merge(&src, &dst, moves)?,
                (false, false) => moves.push((src, dst)),
                _ => return Err(WorkspaceError::WrongKind),
            },
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Export
// ---------------------------------------------------------------------------

/// A `Vec` that refuses any write that would pass `cap` bytes.
struct BoundedBuf {
    buf: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl Write for BoundedBuf {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.cap {
            self.overflowed = true;
            return Err(io::Error::other("export result bound reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Exporter {
    builder: tar::Builder<BoundedBuf>,
}

impl Exporter {
    fn new() -> Self {
        Self {
            builder: tar::Builder::new(BoundedBuf {
                buf: Vec::new(),
                cap: WORKSPACE_READ_RESULT_MAX_BYTES,
                overflowed: false,
            }),
        }
    }

    /// Maps a write error: the bound (→ `ResultTooLarge`) or another failure.
    fn error(&self, e: io::Error) -> WorkspaceError {
        if self.builder.get_ref().overflowed {
            WorkspaceError::ResultTooLarge
        } else {
            WorkspaceError::Io(e.to_string())
        }
    }

    /// Bytes still available for an entry's data: the bound minus what is written, one
    /// header and the end-of-archive blocks.
    fn data_budget(&self) -> usize {
        WORKSPACE_READ_RESULT_MAX_BYTES
            .saturating_sub(self.builder.get_ref().buf.len())
            .saturating_sub(TAR_BLOCK + TAR_TRAILER)
    }

    fn append(
        &mut self,
        name: &[u8],
        kind: tar::EntryType,
        mode: u32,
        link: Option<&[u8]>,
        data: &[u8],
    ) -> Result<(), WorkspaceError> {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        header.set_size(data.len() as u64);
        let mut pax = Vec::new();
        if header.set_path(bytes_path(name)).is_err() {
            pax.extend(pax_record("path", name));
            set_truncated_name(&mut header, name);
        }
        if let Some(link) = link
            && header.set_link_name(bytes_path(link)).is_err()
        {
            pax.extend(pax_record("linkpath", link));
            let mut field = [0u8; 100];
            let n = link.len().min(field.len());
            field[..n].copy_from_slice(&link[..n]);
            header.as_old_mut().linkname = field;
        }
        if !pax.is_empty() {
            let mut ext = tar::Header::new_ustar();
            ext.set_entry_type(tar::EntryType::XHeader);
            ext.set_mode(0o644);
            ext.set_uid(0);
            ext.set_gid(0);
            ext.set_mtime(0);
            ext.set_size(pax.len() as u64);
            set_truncated_name(&mut ext, b"PaxHeader");
            ext.set_cksum();
            self.builder
                .append(&ext, pax.as_slice())
                .map_err(|e| self.error(e))?;
        }
        header.set_cksum();
        self.builder
            .append(&header, data)
            .map_err(|e| self.error(e))
    }

    fn finish(self) -> Result<Vec<u8>, WorkspaceError> {
        let mut builder = self.builder;
        if let Err(e) = builder.finish() {
            return Err(if builder.get_ref().overflowed {
                WorkspaceError::ResultTooLarge
            } else {
                WorkspaceError::Io(e.to_string())
            });
        }
        builder
            .into_inner()
            .map(|b| b.buf)
            .map_err(|e| WorkspaceError::Io(e.to_string()))
    }
}

/// Writes the last component of `name` (at most 100 bytes) into the ustar name field;
/// the full name travels in a PAX `path` record.
fn set_truncated_name(header: &mut tar::Header, name: &[u8]) {
    let last = name
        .split(|b| *b == b'/')
        .rfind(|c| !c.is_empty())
        .unwrap_or(b"PaxEntry");
    let mut field = [0u8; 100];
    let n = last.len().min(field.len());
    field[..n].copy_from_slice(&last[..n]);
    header.as_old_mut().name = field;
}

/// One PAX extended-header record: `"<len> <key>=<value>\n"`, where `<len>` counts the
/// whole record including its own digits.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let base = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = base + 1;
    loop {
        let next = base + len.to_string().len();
        if next == len {
            break;
        }
        len = next;
    }
    let mut record = format!("{len} {key}=").into_bytes();
    record.extend_from_slice(value);
    record.push(b'\n');
    record
}

#[cfg(unix)]
fn bytes_path(bytes: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
}

#[cfg(not(unix))]
fn bytes_path(bytes: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(bytes).into_owned())
}

#[cfg(unix)]
fn os_bytes(s: &std::ffi::OsStr) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    s.as_bytes().to_vec()
}

#[cfg(not(unix))]
fn os_bytes(s: &std::ffi::OsStr) -> Vec<u8> {
    s.to_string_lossy().into_owned().into_bytes()
}

#[cfg(unix)]
fn file_mode(meta: &fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn file_mode(meta: &fs::Metadata) -> u32 {
    if meta.is_dir() { 0o755 } else { 0o644 }
}

fn export_blocking(path: &Path, name: &str) -> Result<Vec<u8>, WorkspaceError> {
    let meta = fs::metadata(path)?;
    let mut out = Exporter::new();
    if meta.is_file() {
        export_file(&mut out, path, name.as_bytes(), &meta)?;
    } else if meta.is_dir() {
        export_dir(&mut out, path)?;
    } else {
        return Err(WorkspaceError::WrongKind);
    }
    out.finish()
}

fn export_file(
    out: &mut Exporter,
    path: &Path,
    name: &[u8],
    meta: &fs::Metadata,
) -> Result<(), WorkspaceError> {
    let budget = out.data_budget();
    if meta.len() > budget as u64 {
        return Err(WorkspaceError::ResultTooLarge);
    }
    let file = File::open(path)?;
    if !file.metadata()?.is_file() {
        return Err(WorkspaceError::WrongKind);
    }
    // Read what is there now (the file may have changed), bounded by the budget.
    let mut data = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(budget as u64 + 1).read_to_end(&mut data)?;
    if data.len() > budget {
        return Err(WorkspaceError::ResultTooLarge);
    }
    out.append(name, tar::EntryType::Regular, file_mode(meta), None, &data)
}

/// Pre-order walk of `root`'s contents, siblings sorted by name bytes.
fn export_dir(out: &mut Exporter, root: &Path) -> Result<(), WorkspaceError> {
    // (host path, archive name without trailing slash); pushed in reverse order.
    let mut stack: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    push_children(root, &[], &mut stack)?;
    while let Some((path, name)) = stack.pop() {
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            // Removed while exporting: it is not part of the tree any more.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e.into()),
        };
        let ft = meta.file_type();
        if ft.is_symlink() {
            let target = os_bytes(fs::read_link(&path)?.as_os_str());
            out.append(
                &name,
                tar::EntryType::Symlink,
                file_mode(&meta),
                Some(&target),
                &[],
            )?;
        } else if ft.is_dir() {
            let mut dir_name = name.clone();
            dir_name.push(b'/');
            out.append(
                &dir_name,
                tar::EntryType::Directory,
                file_mode(&meta),
                None,
                &[],
            )?;
            push_children(&path, &name, &mut stack)?;
        } else if ft.is_file() {
            export_file(out, &path, &name, &meta)?;
        }
        // FIFOs, sockets and devices are skipped.
    }
    Ok(())
}

fn push_children(
    dir: &Path,
    prefix: &[u8],
    stack: &mut Vec<(PathBuf, Vec<u8>)>,
) -> Result<(), WorkspaceError> {
    // (name bytes, name): sorted by the bytes, which is also the archive order.
    let mut names: Vec<(Vec<u8>, OsString)> = Vec::new();
    for entry in fs::read_dir(dir)? {
        if names.len() == EXPORT_ENTRIES_MAX {
            // More entries than can fit in the bound.
            return Err(WorkspaceError::ResultTooLarge);
        }
        let name = entry?.file_name();
        names.push((os_bytes(&name), name));
    }
    names.sort_unstable();
    for (bytes, name) in names.into_iter().rev() {
        let mut archive_name = prefix.to_vec();
        if !archive_name.is_empty() {
            archive_name.push(b'/');
        }
        archive_name.extend(bytes);
        if archive_name.len() > PATH_MAX_BYTES {
            return Err(WorkspaceError::invalid("exported path is too long"));
        }
        stack.push((dir.join(&name), archive_name));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::new(dir.path()).unwrap();
        (dir, ws)
    }

    fn write(ws: &Workspace, rel: &str, body: &[u8]) {
        let p = ws.root().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, body).unwrap();
    }

    /// Names in the directory, excluding nothing (to spot leftover temp files).
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            // Raw name bytes: the builder would refuse `..` and absolute paths.
            let name = path.as_bytes();
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            if let Some(link) = link {
                let l = link.as_bytes();
                h.as_old_mut().linkname[..l.len()].copy_from_slice(l);
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn untar(data: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>, Option<String>)> {
        let mut a = tar::Archive::new(data);
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let kind = e.header().entry_type();
                let link = e
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned());
                let mut body = Vec::new();
                e.read_to_end(&mut body).unwrap();
                (path, kind, body, link)
            })
            .collect()
    }

    // -- paths ---------------------------------------------------------------

    #[test]
    fn path_validation_table() {
        let (_d, ws) = setup();
        write(&ws, "dir/file.txt", b"x");
        let long = "a/".repeat(PATH_MAX_BYTES / 2) + "b";
        // 16 components of 255 bytes + 15 slashes = 4095 bytes: valid.
        let max = vec!["a".repeat(255); 16].join("/");
        assert!(max.len() <= PATH_MAX_BYTES);
        // One component over the file system's name limit.
        let over_name = "a".repeat(PATH_MAX_BYTES);
        let cases: &[(&str, bool)] = &[
            ("", true),
            ("dir", true),
            ("dir/file.txt", true),
            ("dir/new/deeper.txt", true),
            ("missing", true),
            ("/etc/passwd", false),
            ("/", false),
            ("..", false),
            ("dir/../dir", false),
            (".", false),
            ("./dir", false),
            ("dir/", false),
            ("dir//file.txt", false),
            ("dir/fi\0le", false),
            ("dir\\file.txt", false),
            (&long, false),
            (&max, true),
            (&over_name, false),
        ];
        for (rel, ok) in cases {
            let got = ws.resolve(rel);
            assert_eq!(
                got.is_ok(),
                *ok,
                "{:?} → {got:?}",
                &rel[..rel.len().min(40)]
            );
            if let Ok(p) = got {
                assert!(p.starts_with(ws.root()));
            } else {
                let err = got.unwrap_err();
                assert_eq!(err.refusal_code(), Some(WorkspaceErrorCode::InvalidPath));
                assert!(err.is_safe_refusal());
            }
        }
        assert_eq!(ws.resolve("").unwrap(), ws.root());
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_must_stay_inside_the_root() {
        use std::os::unix::fs::symlink;
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), b"s").unwrap();
        let (_d, ws) = setup();
        write(&ws, "real/inner.txt", b"in");
        symlink(outside.path(), ws.root().join("escape")).unwrap();
        symlink("/etc/passwd", ws.root().join("abs")).unwrap();
        symlink("real", ws.root().join("inside")).unwrap();
        symlink("nowhere", ws.root().join("dangling")).unwrap();
        symlink("..", ws.root().join("real/up")).unwrap();

        for rel in ["escape", "escape/secret", "escape/new", "abs", "real/up/.."] {
            assert!(
                matches!(ws.resolve(rel), Err(WorkspaceError::InvalidPath(_))),
                "{rel}"
            );
        }
        assert!(matches!(
            ws.resolve("dangling"),
            Err(WorkspaceError::InvalidPath(_))
        ));
        assert_eq!(
            ws.resolve("inside/inner.txt").unwrap(),
            ws.root().join("real/inner.txt")
        );
        // `real/up` → the root itself: still inside.
        assert_eq!(ws.resolve("real/up/real").unwrap(), ws.root().join("real"));
        // A path through a regular file does not exist.
        assert!(ws.resolve("real/inner.txt/x").is_ok());
    }

    // -- listing ---------------------------------------------------------------

    #[tokio::test]
    async fn listing_reports_kinds_sizes_and_sorts() {
        let (_d, ws) = setup();
        write(&ws, "b.txt", b"12345");
        write(&ws, "a/nested.txt", b"x");
        write(&ws, "C", b"");
        #[cfg(unix)]
        std::os::unix::fs::symlink("b.txt", ws.root().join("link")).unwrap();
        let l = ws.list_directory("", None, None).await.unwrap();
        assert!(!l.truncated);
        let got: Vec<(&str, EntryKind, Option<u64>)> = l
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind, e.size))
            .collect();
        let mut want = vec![
            ("C", EntryKind::File, Some(0)),
            ("a", EntryKind::Directory, None),
            ("b.txt", EntryKind::File, Some(5)),
        ];
        #[cfg(unix)]
        want.push(("link", EntryKind::Symlink, None));
        assert_eq!(got, want);

        let sub = ws.list_directory("a", None, None).await.unwrap();
        assert_eq!(sub.entries.len(), 1);
        assert_eq!(
            ws.list_directory("b.txt", None, None).await,
            Err(WorkspaceError::WrongKind)
        );
        assert_eq!(
            ws.list_directory("nope", None, None).await,
            Err(WorkspaceError::NotFound)
        );
        assert_eq!(
            ws.list_directory("", Some(1), Some(1)).await,
            Err(WorkspaceError::ConflictingLimits)
        );
        assert_eq!(
            WorkspaceError::ConflictingLimits.refusal_code(),
            Some(WorkspaceErrorCode::ConflictingLimits)
        );
    }

    #[tokio::test]
    async fn listing_is_bounded_at_1024_entries() {
        let (_d, ws) = setup();
        for i in 0..DIRECTORY_ENTRIES_MAX {
            write(&ws, &format!("f{i:05}"), b"");
        }
        let l = ws.list_directory("", None, None).await.unwrap();
        assert_eq!(l.entries.len(), DIRECTORY_ENTRIES_MAX);
        assert!(!l.truncated, "exactly at the bound is complete");
        let l = ws.list_directory("", Some(5000), None).await.unwrap();
        assert_eq!(l.entries.len(), DIRECTORY_ENTRIES_MAX);
        assert!(!l.truncated);

        write(&ws, &format!("f{:05}", DIRECTORY_ENTRIES_MAX), b"");
        let l = ws.list_directory("", None, None).await.unwrap();
        assert_eq!(l.entries.len(), DIRECTORY_ENTRIES_MAX);
        assert!(l.truncated);
        assert_eq!(l.entries.last().unwrap().name.as_str(), "f01023");
        let l = ws.list_directory("", Some(u64::MAX), None).await.unwrap();
        assert_eq!(l.entries.len(), DIRECTORY_ENTRIES_MAX);
        assert!(l.truncated);
    }

    #[tokio::test]
    async fn listing_honours_max_entries_and_max_bytes() {
        let (_d, ws) = setup();
        for name in ["aa", "bbb", "c", "dddd"] {
            write(&ws, name, b"");
        }
        let l = ws.list_directory("", Some(2), None).await.unwrap();
        let n: Vec<&str> = l.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!((n, l.truncated), (vec!["aa", "bbb"], true));

        let l = ws.list_directory("", Some(4), None).await.unwrap();
        assert_eq!((l.entries.len(), l.truncated), (4, false));

        let l = ws.list_directory("", Some(0), None).await.unwrap();
        assert_eq!((l.entries.len(), l.truncated), (0, true));

        // "aa" + "bbb" = 5 bytes; "c" would make 6.
        let l = ws.list_directory("", None, Some(5)).await.unwrap();
        let n: Vec<&str> = l.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!((n, l.truncated), (vec!["aa", "bbb"], true));

        let l = ws.list_directory("", None, Some(10)).await.unwrap();
        assert_eq!((l.entries.len(), l.truncated), (4, false));

        let empty = ws.list_directory("", None, Some(1)).await.unwrap();
        assert_eq!((empty.entries.len(), empty.truncated), (0, true));
    }

    #[tokio::test]
    async fn listing_carries_255_byte_names_and_skips_unrepresentable_ones() {
        let (_d, ws) = setup();
        let max_name = "n".repeat(DIRECTORY_ENTRY_NAME_MAX_BYTES);
        write(&ws, &max_name, b"");
        let l = ws.list_directory("", None, None).await.unwrap();
        assert_eq!(l.entries[0].name.as_str(), max_name);
        assert!(!l.truncated);

        #[cfg(target_os = "linux")]
        {
            use std::os::unix::ffi::OsStrExt;
            // Not UTF-8: skipped, explicitly truncated.
            let bad = std::ffi::OsStr::from_bytes(b"bad\xff");
            fs::write(ws.root().join(bad), b"").unwrap();
            let l = ws.list_directory("", None, None).await.unwrap();
            assert_eq!(l.entries.len(), 1);
            assert!(l.truncated);
        }
    }

    // -- byte reads ------------------------------------------------------------

    #[tokio::test]
    async fn byte_reads_with_offset_and_limits() {
        let (_d, ws) = setup();
        write(&ws, "f", b"0123456789");
        let r = ws.read_bytes("f", 0, None).await.unwrap();
        assert_eq!(
            (r.data.as_slice(), r.truncated, r.size),
            (&b"0123456789"[..], false, 10)
        );
        let r = ws.read_bytes("f", 3, Some(4)).await.unwrap();
        assert_eq!((r.data.as_slice(), r.truncated), (&b"3456"[..], true));
        let r = ws.read_bytes("f", 6, Some(4)).await.unwrap();
        assert_eq!((r.data.as_slice(), r.truncated), (&b"6789"[..], false));
        let r = ws.read_bytes("f", 10, None).await.unwrap();
        assert_eq!((r.data.len(), r.truncated), (0, false));
        let r = ws.read_bytes("f", 1000, None).await.unwrap();
        assert_eq!((r.data.len(), r.truncated), (0, false));
        let r = ws.read_bytes("f", 0, Some(0)).await.unwrap();
        assert_eq!((r.data.len(), r.truncated), (0, true));

        write(&ws, "d/x", b"");
        assert_eq!(
            ws.read_bytes("d", 0, None).await,
            Err(WorkspaceError::WrongKind)
        );
        assert_eq!(
            ws.read_bytes("nope", 0, None).await,
            Err(WorkspaceError::NotFound)
        );
        assert_eq!(
            ws.read_bytes("f/x", 0, None).await,
            Err(WorkspaceError::NotFound)
        );
        assert_eq!(
            WorkspaceError::WrongKind.refusal_code(),
            Some(WorkspaceErrorCode::WrongKind)
        );
    }

    #[tokio::test]
    async fn byte_reads_are_bounded_to_1_mib() {
        let (_d, ws) = setup();
        let cap = WORKSPACE_READ_RESULT_MAX_BYTES;
        write(&ws, "exact", &vec![1u8; cap]);
        write(&ws, "big", &vec![2u8; cap + 1]);
        let r = ws.read_bytes("exact", 0, None).await.unwrap();
        assert_eq!((r.data.len(), r.truncated), (cap, false));
        let r = ws.read_bytes("big", 0, Some(u64::MAX)).await.unwrap();
        assert_eq!(
            (r.data.len(), r.truncated, r.size),
            (cap, true, cap as u64 + 1)
        );
        let r = ws.read_bytes("big", 1, None).await.unwrap();
        assert_eq!((r.data.len(), r.truncated), (cap, false));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn byte_reads_follow_only_inside_symlinks() {
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), b"s").unwrap();
        let (_d, ws) = setup();
        write(&ws, "real.txt", b"inside");
        std::os::unix::fs::symlink("real.txt", ws.root().join("ok")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.root().join("bad")).unwrap();
        assert_eq!(ws.read_bytes("ok", 0, None).await.unwrap().data, b"inside");
        assert!(matches!(
            ws.read_bytes("bad", 0, None).await,
            Err(WorkspaceError::InvalidPath(_))
        ));
    }

    // -- install_file ----------------------------------------------------------

    #[tokio::test]
    async fn install_file_creates_parents_and_replaces_atomically() {
        let (_d, ws) = setup();
        ws.install_file("a/b/c.txt", b"one").await.unwrap();
        assert_eq!(fs::read(ws.root().join("a/b/c.txt")).unwrap(), b"one");
        ws.install_file("a/b/c.txt", b"two").await.unwrap();
        assert_eq!(fs::read(ws.root().join("a/b/c.txt")).unwrap(), b"two");
        assert_eq!(names(&ws.root().join("a/b")), vec!["c.txt"]);
        ws.install_file("empty", b"").await.unwrap();
        assert_eq!(fs::read(ws.root().join("empty")).unwrap(), b"");
    }

    #[tokio::test]
    async fn install_file_refusals_leave_nothing_behind() {
        let (_d, ws) = setup();
        write(&ws, "dir/keep", b"k");
        write(&ws, "file", b"f");
        assert_eq!(
            ws.install_file("dir", b"x").await,
            Err(WorkspaceError::WrongKind)
        );
        assert_eq!(
            ws.install_file("file/x", b"x").await,
            Err(WorkspaceError::WrongKind)
        );
        assert!(matches!(
            ws.install_file("", b"x").await,
            Err(WorkspaceError::InvalidPath(_))
        ));
        assert!(matches!(
            ws.install_file("../x", b"x").await,
            Err(WorkspaceError::InvalidPath(_))
        ));
        assert_eq!(names(ws.root()), vec!["dir", "file"]);
        assert_eq!(names(&ws.root().join("dir")), vec!["keep"]);
        assert_eq!(fs::read(ws.root().join("file")).unwrap(), b"f");
    }

    #[test]
    fn failed_rename_removes_the_temp_file() {
        // The rename onto a non-empty directory fails after the body was written and
        // flushed: the temporary file must be gone and the directory untouched.
        let (_d, ws) = setup();
        write(&ws, "target/inner", b"i");
        let err =
            write_atomically(ws.root(), &ws.root().join("target"), b"body", None).unwrap_err();
        assert!(err.is_safe_refusal(), "{err:?}");
        assert_eq!(names(ws.root()), vec!["target"]);
        assert_eq!(names(&ws.root().join("target")), vec!["inner"]);
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn install_file_keeps_existing_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let (_d, ws) = setup();
        write(&ws, "script", b"old");
        fs::set_permissions(ws.root().join("script"), fs::Permissions::from_mode(0o750)).unwrap();
        ws.install_file("script", b"new").await.unwrap();
        let mode = fs::metadata(ws.root().join("script"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o750);
    }

    // -- install_archive -------------------------------------------------------

    #[tokio::test]
    async fn archive_unpacks_into_new_and_existing_directories() {
        let (_d, ws) = setup();
        let tar = tar_of(&[
            ("./", tar::EntryType::Directory, b"", None),
            ("./src/", tar::EntryType::Directory, b"", None),
            (
                "./src/main.rs",
                tar::EntryType::Regular,
                b"fn main() {}",
                None,
            ),
            ("README", tar::EntryType::Regular, b"readme", None),
            ("README.hard", tar::EntryType::Link, b"", Some("README")),
            (
                "src/link",
                tar::EntryType::Symlink,
                b"main.rs",
                Some("main.rs"),
            ),
            ("up", tar::EntryType::Symlink, b"", Some("src/../README")),
        ]);
        ws.install_archive("new/place", &tar).await.unwrap();
        let base = ws.root().join("new/place");
        assert_eq!(fs::read(base.join("src/main.rs")).unwrap(), b"fn main() {}");
        assert_eq!(fs::read(base.join("README.hard")).unwrap(), b"readme");
        #[cfg(unix)]
        {
            assert_eq!(fs::read(base.join("src/link")).unwrap(), b"fn main() {}");
            assert_eq!(fs::read(base.join("up")).unwrap(), b"readme");
        }
        assert_eq!(names(&ws.root().join("new")), vec!["place"]);

        // Merge into the root, which already has content.
        write(&ws, "README", b"old");
        write(&ws, "keep.txt", b"k");
        ws.install_archive("", &tar).await.unwrap();
        assert_eq!(fs::read(ws.root().join("README")).unwrap(), b"readme");
        assert_eq!(fs::read(ws.root().join("keep.txt")).unwrap(), b"k");
        assert_eq!(
            fs::read(ws.root().join("src/main.rs")).unwrap(),
            b"fn main() {}"
        );
        assert!(
            names(ws.root()).iter().all(|n| !n.starts_with(TEMP_PREFIX)),
            "{:?}",
            names(ws.root())
        );
    }

    #[tokio::test]
    async fn archive_rejects_traversal_and_unsafe_entries_all_or_nothing() {
        let (_d, ws) = setup();
        write(&ws, "existing", b"e");
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "dotdot",
                tar_of(&[
                    ("ok.txt", tar::EntryType::Regular, b"ok", None),
                    ("../evil", tar::EntryType::Regular, b"x", None),
                ]),
            ),
            (
                "nested dotdot",
                tar_of(&[
                    ("ok.txt", tar::EntryType::Regular, b"ok", None),
                    ("a/../../evil", tar::EntryType::Regular, b"x", None),
                ]),
            ),
            (
                "absolute",
                tar_of(&[
                    ("ok.txt", tar::EntryType::Regular, b"ok", None),
                    ("/tmp/evil", tar::EntryType::Regular, b"x", None),
                ]),
            ),
            (
                "absolute symlink",
                tar_of(&[
                    ("ok.txt", tar::EntryType::Regular, b"ok", None),
                    ("l", tar::EntryType::Symlink, b"", Some("/etc")),
                ]),
            ),
            (
                "escaping symlink",
                tar_of(&[
                    ("ok.txt", tar::EntryType::Regular, b"ok", None),
                    ("l", tar::EntryType::Symlink, b"", Some("../../..")),
                ]),
            ),
            (
                "symlink chain escape",
                tar_of(&[
                    ("ok.txt", tar::EntryType::Regular, b"ok", None),
                    ("x", tar::EntryType::Symlink, b"", Some(".")),
                    ("l", tar::EntryType::Symlink, b"", Some("x/../outside")),
                ]),
            ),
            (
                "write through own symlink",
                tar_of(&[
                    ("sub/", tar::EntryType::Directory, b"", None),
                    ("l", tar::EntryType::Symlink, b"", Some("sub")),
                    ("l/file", tar::EntryType::Regular, b"x", None),
                ]),
            ),
            (
                "escaping hard link",
                tar_of(&[
                    ("ok.txt", tar::EntryType::Regular, b"ok", None),
                    ("h", tar::EntryType::Link, b"", Some("../existing")),
                ]),
            ),
            (
                "hard link to a non-entry",
                tar_of(&[("h", tar::EntryType::Link, b"", Some("existing"))]),
            ),
            (
                "device",
                tar_of(&[
                    ("ok.txt", tar::EntryType::Regular, b"ok", None),
                    ("dev", tar::EntryType::Char, b"", None),
                ]),
            ),
            ("fifo", tar_of(&[("fifo", tar::EntryType::Fifo, b"", None)])),
        ];
        for (what, tar) in cases {
            for dest in ["", "fresh"] {
                let err = ws.install_archive(dest, &tar).await.unwrap_err();
                assert!(
                    matches!(err, WorkspaceError::InvalidPath(_)),
                    "{what} into {dest:?}: {err:?}"
                );
                assert!(err.is_safe_refusal());
                assert_eq!(names(ws.root()), vec!["existing"], "{what} into {dest:?}");
            }
        }
        assert!(matches!(
            ws.install_archive("", b"not a tar archive at all, just text")
                .await,
            Err(WorkspaceError::InvalidPath(_))
        ));
        assert_eq!(names(ws.root()), vec!["existing"]);
    }

    #[tokio::test]
    async fn archive_merge_conflicts_change_nothing() {
        let (_d, ws) = setup();
        write(&ws, "a/file", b"old");
        write(&ws, "b", b"b");
        // "a/new" would be fine, but "a/file" as a directory conflicts.
        let tar = tar_of(&[
            ("a/new", tar::EntryType::Regular, b"n", None),
            ("a/file/inner", tar::EntryType::Regular, b"i", None),
        ]);
        assert_eq!(
            ws.install_archive("", &tar).await,
            Err(WorkspaceError::WrongKind)
        );
        assert_eq!(names(ws.root()), vec!["a", "b"]);
        assert_eq!(names(&ws.root().join("a")), vec!["file"]);
        assert_eq!(
            ws.install_archive("b", &tar).await,
            Err(WorkspaceError::WrongKind)
        );
    }

    // -- export ----------------------------------------------------------------

    #[tokio::test]
    async fn export_is_deterministic_and_complete() {
        let (_d, ws) = setup();
        write(&ws, "out/b.txt", b"bee");
        write(&ws, "out/a/z.txt", b"zed");
        write(&ws, "out/a/y.txt", b"why");
        #[cfg(unix)]
        std::os::unix::fs::symlink("b.txt", ws.root().join("out/link")).unwrap();
        let deep = format!("out/{}/{}", "d".repeat(120), "e".repeat(120));
        write(&ws, &format!("{deep}/f.txt"), b"deep");

        let first = ws.export("out").await.unwrap();
        assert_eq!(first.len() % TAR_BLOCK, 0);
        // Touch times: the archive must not change.
        fs::write(ws.root().join("out/b.txt"), b"bee").unwrap();
        let second = ws.export("out").await.unwrap();
        assert_eq!(first, second);

        let entries = untar(&first);
        let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        let d = "d".repeat(120);
        let e = "e".repeat(120);
        let mut want = vec![
            "a/".to_owned(),
            "a/y.txt".into(),
            "a/z.txt".into(),
            "b.txt".into(),
            format!("{d}/"),
            format!("{d}/{e}/"),
            format!("{d}/{e}/f.txt"),
        ];
        #[cfg(unix)]
        want.push("link".into());
        assert_eq!(paths, want);
        assert_eq!(entries[1].2, b"why");
        #[cfg(unix)]
        assert_eq!(entries.last().unwrap().3.as_deref(), Some("b.txt"));

        let mut a = tar::Archive::new(first.as_slice());
        for entry in a.entries().unwrap() {
            let h = entry.unwrap().header().clone();
            assert_eq!(h.mtime().unwrap(), 0);
            assert_eq!(h.uid().unwrap(), 0);
            assert_eq!(h.gid().unwrap(), 0);
        }

        let single = untar(&ws.export("out/b.txt").await.unwrap());
        assert_eq!(single.len(), 1);
        assert_eq!(
            (single[0].0.as_str(), single[0].2.as_slice()),
            ("b.txt", &b"bee"[..])
        );

        assert_eq!(ws.export("nope").await, Err(WorkspaceError::NotFound));
    }

    #[tokio::test]
    async fn export_round_trips_through_install_archive() {
        let (_d, ws) = setup();
        write(&ws, "src/x/1.txt", b"one");
        write(&ws, "src/2.txt", b"two");
        let tar = ws.export("src").await.unwrap();
        ws.install_archive("copy", &tar).await.unwrap();
        assert_eq!(fs::read(ws.root().join("copy/x/1.txt")).unwrap(), b"one");
        assert_eq!(fs::read(ws.root().join("copy/2.txt")).unwrap(), b"two");
    }

    #[tokio::test]
    async fn export_is_bounded_to_1_mib() {
        let (_d, ws) = setup();
        let cap = WORKSPACE_READ_RESULT_MAX_BYTES;
        // Largest single file that fits: bound − header − end-of-archive blocks.
        let fits = cap - TAR_BLOCK - TAR_TRAILER;
        write(&ws, "fits", &vec![7u8; fits]);
        let tar = ws.export("fits").await.unwrap();
        assert_eq!(tar.len(), cap);
        write(&ws, "too_big", &vec![7u8; fits + 1]);
        assert_eq!(
            ws.export("too_big").await,
            Err(WorkspaceError::ResultTooLarge)
        );
        assert_eq!(
            WorkspaceError::ResultTooLarge.refusal_code(),
            Some(WorkspaceErrorCode::ResultTooLarge)
        );

        // Many small files: the bound is hit while building, not after.
        for i in 0..(EXPORT_ENTRIES_MAX / 2) {
            write(&ws, &format!("many/{i:05}"), b"x");
        }
        assert_eq!(ws.export("many").await, Err(WorkspaceError::ResultTooLarge));
        // Too many names in one directory to ever fit.
        for i in 0..=EXPORT_ENTRIES_MAX {
            write(&ws, &format!("huge/{i:05}"), b"");
        }
        assert_eq!(ws.export("huge").await, Err(WorkspaceError::ResultTooLarge));
    }

    #[test]
    fn pax_record_length_counts_itself() {
        for value_len in [0usize, 1, 5, 90, 95, 96, 995, 996, 5000] {
            let value = vec![b'v'; value_len];
            let record = pax_record("path", &value);
            let text = String::from_utf8(record.clone()).unwrap();
            let (len, _) = text.split_once(' ').unwrap();
            assert_eq!(len.parse::<usize>().unwrap(), record.len(), "{value_len}");
        }
    }

    #[test]
    fn io_errors_are_ambiguous_except_access() {
        let denied = WorkspaceError::from(io::Error::from(io::ErrorKind::PermissionDenied));
        assert_eq!(denied, WorkspaceError::PermissionDenied);
        assert_eq!(
            denied.refusal_code(),
            Some(WorkspaceErrorCode::PermissionDenied)
        );
        assert!(denied.is_safe_refusal());
        let other = WorkspaceError::from(io::Error::other("disk on fire"));
        assert!(matches!(other, WorkspaceError::Io(_)));
        assert!(!other.is_safe_refusal());
        assert_eq!(other.refusal_code(), None);
    }

    /// Raw `errno` values and how they are classified: deterministic refusals are safe,
    /// only genuinely ambiguous failures are `Io`.
    #[cfg(unix)]
    #[test]
    fn deterministic_errno_values_are_safe_refusals() {
        use nix::errno::Errno;
        let classify =
            |errno: Errno| WorkspaceError::from(io::Error::from_raw_os_error(errno as i32));
        for errno in [Errno::ENAMETOOLONG, Errno::ELOOP, Errno::EINVAL] {
            let err = classify(errno);
            assert!(
                matches!(err, WorkspaceError::InvalidPath(_)),
                "{errno}: {err:?}"
            );
            assert_eq!(err.refusal_code(), Some(WorkspaceErrorCode::InvalidPath));
        }
        assert_eq!(classify(Errno::ENOENT), WorkspaceError::NotFound);
        assert_eq!(classify(Errno::ENOTDIR), WorkspaceError::NotFound);
        assert_eq!(classify(Errno::EISDIR), WorkspaceError::WrongKind);
        assert_eq!(classify(Errno::EACCES), WorkspaceError::PermissionDenied);
        assert_eq!(classify(Errno::EPERM), WorkspaceError::PermissionDenied);
        for errno in [Errno::EIO, Errno::ENOMEM, Errno::EBADF, Errno::ENOSPC] {
            let err = classify(errno);
            assert!(matches!(err, WorkspaceError::Io(_)), "{errno}: {err:?}");
            assert!(!err.is_safe_refusal());
        }
    }

    /// Regression: an offset above `i64::MAX` (or past the file system's largest file)
    /// made `lseek` fail with `EINVAL`, which was reported as an ambiguous read. It is
    /// past the end of the file: no bytes, not truncated.
    #[tokio::test]
    async fn offsets_past_the_largest_file_offset_read_nothing() {
        let (_d, ws) = setup();
        write(&ws, "small", b"0123456789");
        let i64_max = i64::MAX as u64;
        for offset in [10, 11, 1 << 62, i64_max, i64_max + 1, u64::MAX] {
            let r = ws.read_bytes("small", offset, None).await.unwrap();
            assert_eq!(
                (r.data.as_slice(), r.truncated, r.size),
                (&b""[..], false, 10),
                "offset {offset}"
            );
            let r = ws.read_bytes("small", offset, Some(0)).await.unwrap();
            assert_eq!((r.data.len(), r.truncated), (0, false), "offset {offset}");
        }
    }

    /// Regression: a symbolic-link loop (`ELOOP` from canonicalizing) stopped the
    /// owner's reads as an ambiguous failure; it is a safe `invalid_path` refusal for
    /// byte reads, directory reads, exports and writes, also as a path prefix.
    #[cfg(unix)]
    #[tokio::test]
    async fn symlink_loops_are_safe_refusals() {
        let (_d, ws) = setup();
        std::os::unix::fs::symlink("self", ws.root().join("self")).unwrap();
        std::os::unix::fs::symlink("pong", ws.root().join("ping")).unwrap();
        std::os::unix::fs::symlink("ping", ws.root().join("pong")).unwrap();
        for path in ["self", "ping", "self/inner", "pong/inner/deeper"] {
            let errors = [
                ws.read_bytes(path, 0, None).await.unwrap_err(),
                ws.list_directory(path, None, None).await.unwrap_err(),
                ws.export(path).await.unwrap_err(),
                ws.install_file(path, b"x").await.unwrap_err(),
            ];
            for err in errors {
                assert!(
                    matches!(err, WorkspaceError::InvalidPath(_)),
                    "{path}: {err:?}"
                );
                assert!(err.is_safe_refusal());
            }
        }
        // The root still lists the links themselves (not followed).
        let listing = ws.list_directory("", None, None).await.unwrap();
        assert!(listing.entries.iter().all(|e| e.kind == EntryKind::Symlink));
    }

    /// `ENAMETOOLONG` (a component over the file system's 255-byte limit) and a path
    /// through a regular file (`ENOTDIR`) are safe refusals for reads.
    #[tokio::test]
    async fn over_long_components_and_file_parents_are_safe_refusals() {
        let (_d, ws) = setup();
        write(&ws, "file", b"f");
        let long = "n".repeat(300);
        let err = ws.read_bytes(&long, 0, None).await.unwrap_err();
        assert!(matches!(err, WorkspaceError::InvalidPath(_)), "{err:?}");
        let err = ws
            .list_directory(&format!("{long}/x"), None, None)
            .await
            .unwrap_err();
        assert!(matches!(err, WorkspaceError::InvalidPath(_)), "{err:?}");
        assert_eq!(
            ws.read_bytes("file/x", 0, None).await,
            Err(WorkspaceError::NotFound)
        );
        assert_eq!(
            ws.list_directory("file/x", None, None).await,
            Err(WorkspaceError::NotFound)
        );
    }
}
