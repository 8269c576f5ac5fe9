//! Files only their owner may read: tokens, keys, materialized sets. This module owns how
//! such a file is created (never over an existing path, mode 0600 from the first byte,
//! written whole and synced); it never chooses where one goes or what it holds.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Creates `path` with mode 0600 and writes `bytes` to it whole, synced. The path must not
/// exist: nothing placed there first (a symlink, another user's file) is followed or
/// overwritten, and no other user can open the file between its creation and its mode.
///
/// # Errors
/// The file-system error (the path exists, its directory is missing or not writable, the
/// disk is full).
pub fn create_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_private_file_is_0600_whole_and_never_replaces_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        create_private(&path, b"secret").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = create_private(&path, b"other").unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        // A symlink planted at the path is not followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
        assert!(create_private(&link, b"x").is_err());
        assert!(!dir.path().join("elsewhere").exists());
    }
}
