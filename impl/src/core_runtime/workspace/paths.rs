//! Path validation and resolution.

use super::*;

/// Splits a wire path into validated components (`""` → none).
pub(super) fn validate_relative(rel: &str) -> Result<Vec<&str>, WorkspaceError> {
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
pub(super) fn resolve_within(root: &Path, components: &[&str]) -> Result<PathBuf, WorkspaceError> {
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
pub(super) fn ensure_inside(root: &Path, dir: &Path) -> Result<(), WorkspaceError> {
    let canonical = fs::canonicalize(dir)?;
    if canonical.starts_with(root) {
        Ok(())
    } else {
        Err(WorkspaceError::invalid(
            "the destination directory leads outside the workspace",
        ))
    }
}
