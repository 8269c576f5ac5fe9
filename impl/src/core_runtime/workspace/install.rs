//! File installation.

use super::*;

/// Maps errors of creating parent directories: a component that exists as a file is the
/// wrong kind, not a missing path.
pub(super) fn parent_error(e: io::Error) -> WorkspaceError {
    match e.kind() {
        io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => WorkspaceError::WrongKind,
        _ => e.into(),
    }
}

pub(super) fn install_file_blocking(
    root: &Path,
    target: &Path,
    body: &[u8],
) -> Result<(), WorkspaceError> {
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
pub(super) fn create_temp_file(dir: &Path) -> Result<(PathBuf, File), WorkspaceError> {
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
pub(super) fn temp_name(suffix: &str) -> String {
    format!(
        "{TEMP_PREFIX}{}-{:016x}.{suffix}",
        std::process::id(),
        rand::random::<u64>()
    )
}

/// Temp file + fsync + rename + directory fsync. Removes the temp file on any failure
/// before the rename.
pub(super) fn write_atomically(
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
pub(super) fn sync_dir(dir: &Path) -> Result<(), WorkspaceError> {
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
