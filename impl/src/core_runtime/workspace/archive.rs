//! Archive installation.

use super::*;

/// Removes the unpack directory on drop unless it was consumed by the commit.
pub(super) struct StagingDir {
    pub(super) path: PathBuf,
    pub(super) keep: bool,
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
pub(super) fn archive_path(raw: &Path) -> Result<Option<PathBuf>, WorkspaceError> {
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
pub(super) fn nearest_existing(root: &Path, dest: &Path) -> PathBuf {
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

pub(super) fn install_archive_blocking(
    root: &Path,
    dest: &Path,
    tar: &[u8],
) -> Result<(), WorkspaceError> {
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
pub(super) fn unpack_into(stage: &Path, tar: &[u8]) -> Result<(), WorkspaceError> {
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
pub(super) fn create_parent(stage: &Path, rel: &Path) -> Result<(), WorkspaceError> {
    match stage.join(rel).parent() {
        Some(parent) => fs::create_dir_all(parent).map_err(|e| entry_conflict(rel, e)),
        None => Ok(()),
    }
}

pub(super) fn entry_conflict(rel: &Path, e: io::Error) -> WorkspaceError {
    match e.kind() {
        io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => WorkspaceError::invalid(
            format!("archive entry {} conflicts with a file", rel.display()),
        ),
        _ => e.into(),
    }
}

#[cfg(unix)]
pub(super) fn make_symlink(target: &Path, at: &Path) -> Result<(), WorkspaceError> {
    std::os::unix::fs::symlink(target, at).map_err(Into::into)
}

#[cfg(not(unix))]
pub(super) fn make_symlink(_target: &Path, _at: &Path) -> Result<(), WorkspaceError> {
    Err(WorkspaceError::invalid(
        "symbolic links are not supported on this platform",
    ))
}

/// Whether `path` (a link's destination, possibly through further links or not yet
/// existing) resolves inside the canonical `stage`. The longest existing prefix is
/// canonicalized on the real file system; the non-existent rest must be normal
/// components. Conservative: a `..` after a non-existent component is refused.
pub(super) fn link_stays_inside(stage: &Path, path: &Path) -> bool {
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
pub(super) fn plan_merge(
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
