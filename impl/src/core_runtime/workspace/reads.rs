//! Byte reads.

use super::*;

pub(super) fn read_blocking(
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
pub(super) fn close_confirmed(file: File) -> Result<(), WorkspaceError> {
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
