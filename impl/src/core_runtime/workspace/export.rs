//! Export.

use super::*;

/// A `Vec` that refuses any write that would pass `cap` bytes.
pub(super) struct BoundedBuf {
    pub(super) buf: Vec<u8>,
    pub(super) cap: usize,
    pub(super) overflowed: bool,
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

pub(super) struct Exporter {
    pub(super) builder: tar::Builder<BoundedBuf>,
}

impl Exporter {
    pub(super) fn new() -> Self {
        Self {
            builder: tar::Builder::new(BoundedBuf {
                buf: Vec::new(),
                cap: WORKSPACE_READ_RESULT_MAX_BYTES,
                overflowed: false,
            }),
        }
    }

    /// Maps a write error: the bound (→ `ResultTooLarge`) or another failure.
    pub(super) fn error(&self, e: io::Error) -> WorkspaceError {
        if self.builder.get_ref().overflowed {
            WorkspaceError::ResultTooLarge
        } else {
            WorkspaceError::Io(e.to_string())
        }
    }

    /// Bytes still available for an entry's data: the bound minus what is written, one
    /// header and the end-of-archive blocks.
    pub(super) fn data_budget(&self) -> usize {
        WORKSPACE_READ_RESULT_MAX_BYTES
            .saturating_sub(self.builder.get_ref().buf.len())
            .saturating_sub(TAR_BLOCK + TAR_TRAILER)
    }

    pub(super) fn append(
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

    pub(super) fn finish(self) -> Result<Vec<u8>, WorkspaceError> {
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
pub(super) fn set_truncated_name(header: &mut tar::Header, name: &[u8]) {
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
pub(super) fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
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
pub(super) fn bytes_path(bytes: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(bytes))
}

#[cfg(not(unix))]
pub(super) fn bytes_path(bytes: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(bytes).into_owned())
}

#[cfg(unix)]
pub(super) fn os_bytes(s: &std::ffi::OsStr) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    s.as_bytes().to_vec()
}

#[cfg(not(unix))]
pub(super) fn os_bytes(s: &std::ffi::OsStr) -> Vec<u8> {
    s.to_string_lossy().into_owned().into_bytes()
}

#[cfg(unix)]
pub(super) fn file_mode(meta: &fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
pub(super) fn file_mode(meta: &fs::Metadata) -> u32 {
    if meta.is_dir() { 0o755 } else { 0o644 }
}

pub(super) fn export_blocking(path: &Path, name: &str) -> Result<Vec<u8>, WorkspaceError> {
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

pub(super) fn export_file(
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
pub(super) fn export_dir(out: &mut Exporter, root: &Path) -> Result<(), WorkspaceError> {
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

pub(super) fn push_children(
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
