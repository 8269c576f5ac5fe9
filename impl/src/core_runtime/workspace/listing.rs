//! Directory listing.

use super::*;

pub(super) fn list_blocking(
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
