//! The executable, verified and kept open ("Identity and launch": "The host opens the
//! verified file, detects path/digest drift as far as the operating system permits").
//!
//! The file is opened once, hashed through that descriptor and later executed through
//! the same descriptor (`/proc/self/fd/N`), so a path replaced after verification
//! (renamed over, relinked) never runs: the kernel executes the inode that was hashed.
//! What the operating system cannot prevent, a write into that same inode between the
//! hash and the exec, is detected from the inode's size and change times, checked again
//! right before the exec and after the handshake ([`Verified::drift`]).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// What identifies the verified inode's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Identity {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// Why verification failed (stable `code()`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// The file cannot be opened or read.
    #[error("executable_unreadable: {0}")]
    Unreadable(String),
    /// Not a regular file with an execute bit.
    #[error("not_executable: {0}")]
    NotExecutable(String),
    /// The digest is not the configured one.
    #[error("digest_mismatch: {path} has SHA-256 {actual}, the configuration expects {expected}")]
    DigestMismatch {
        /// The executable.
        path: PathBuf,
        /// The configured digest.
        expected: String,
        /// The file's digest.
        actual: String,
    },
    /// The file changed while it was hashed.
    #[error("content_drift: {0} changed while it was verified")]
    Drift(PathBuf),
}

impl VerifyError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            VerifyError::Unreadable(_) => "executable_unreadable",
            VerifyError::NotExecutable(_) => "not_executable",
            VerifyError::DigestMismatch { .. } => "digest_mismatch",
            VerifyError::Drift(_) => "content_drift",
        }
    }
}

/// Drift observed after verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// The configured path now names another file (the verified one still runs).
    PathReplaced,
    /// The verified inode itself was written to.
    ContentChanged,
    /// The configured path no longer exists.
    PathRemoved,
}

impl Drift {
    /// The stable code.
    pub fn code(self) -> &'static str {
        match self {
            Drift::PathReplaced => "path_replaced",
            Drift::ContentChanged => "content_changed",
            Drift::PathRemoved => "path_removed",
        }
    }
}

/// A verified executable, kept open.
#[derive(Debug)]
pub struct Verified {
    file: File,
    identity: Identity,
    /// The configured path.
    pub path: PathBuf,
    /// Its SHA-256 (lowercase hex).
    pub digest: String,
}

/// The SHA-256 (lowercase hex) of the file at `path`.
///
/// # Errors
/// The file cannot be read.
pub fn sha256_of(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    hash(&mut file)
}

fn hash(file: &mut File) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hex::encode(hasher.finalize()));
        }
        hasher.update(&buf[..n]);
    }
}

/// Opens `path` once and checks it is a regular executable file whose SHA-256 is
/// `expected`.
///
/// # Errors
/// [`VerifyError`].
pub fn verify(path: &Path, expected: &str) -> Result<Verified, VerifyError> {
    let unreadable =
        |e: std::io::Error| VerifyError::Unreadable(format!("{}: {e}", path.display()));
    let mut file = File::open(path).map_err(unreadable)?;
    let before = file.metadata().map_err(unreadable)?;
    if !before.is_file() || before.mode() & 0o111 == 0 {
        return Err(VerifyError::NotExecutable(format!(
            "{} is not a regular file with an execute bit",
            path.display()
        )));
    }
    let digest = hash(&mut file).map_err(unreadable)?;
    let after = file.metadata().map_err(unreadable)?;
    if Identity::of(&before) != Identity::of(&after) {
        return Err(VerifyError::Drift(path.to_path_buf()));
    }
    if digest != expected {
        return Err(VerifyError::DigestMismatch {
            path: path.to_path_buf(),
            expected: expected.to_string(),
            actual: digest,
        });
    }
    Ok(Verified {
        file,
        identity: Identity::of(&after),
        path: path.to_path_buf(),
        digest,
    })
}

impl Verified {
    /// Drift since verification, if any: the verified inode written to, or the path now
    /// naming another file or none.
    /// The path is checked first: replacing or removing it also changes the verified
    /// inode's change time (its link count), which is not a write to its content.
    pub fn drift(&self) -> Option<Drift> {
        match std::fs::metadata(&self.path) {
            Err(_) => return Some(Drift::PathRemoved),
            Ok(meta) if (meta.dev(), meta.ino()) != (self.identity.dev, self.identity.ino) => {
                return Some(Drift::PathReplaced);
            }
            Ok(_) => {}
        }
        match self.file.metadata() {
            Ok(meta) if Identity::of(&meta) == self.identity => None,
            _ => Some(Drift::ContentChanged),
        }
    }

    /// A descriptor of the verified file that a child inherits (no close-on-exec), and
    /// the path that executes it (`/proc/self/fd/N`). Drop the descriptor once the child
    /// is spawned.
    ///
    /// # Errors
    /// The descriptor cannot be duplicated.
    pub fn inheritable(&self) -> std::io::Result<(std::os::fd::OwnedFd, PathBuf)> {
        use std::os::fd::AsRawFd;
        let fd: std::os::fd::OwnedFd = self.file.try_clone()?.into();
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(std::io::Error::from)?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        Ok((fd, path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn exe(dir: &Path, name: &str, body: &[u8]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        path
    }

    #[test]
    fn digest_checked_and_drift_seen() {
        let dir = tempfile::tempdir().unwrap();
        let path = exe(dir.path(), "p", b"#!/bin/sh\n");
        let digest = sha256_of(&path).unwrap();
        let err = verify(&path, &"0".repeat(64)).unwrap_err();
        assert_eq!(err.code(), "digest_mismatch");
        let verified = verify(&path, &digest).unwrap();
        assert_eq!(verified.drift(), None);
        // Renamed over: the path names another inode; the verified one is still open.
        let other = exe(dir.path(), "q", b"#!/bin/sh\necho swapped\n");
        std::fs::rename(&other, &path).unwrap();
        assert_eq!(verified.drift(), Some(Drift::PathReplaced));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(verified.drift(), Some(Drift::PathRemoved));
    }

    #[test]
    fn a_write_into_the_verified_inode_is_content_drift() {
        let dir = tempfile::tempdir().unwrap();
        let path = exe(dir.path(), "p", b"#!/bin/sh\n");
        let verified = verify(&path, &sha256_of(&path).unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        std::fs::write(&path, b"#!/bin/sh\necho changed\n").unwrap();
        assert_eq!(verified.drift(), Some(Drift::ContentChanged));
    }

    #[test]
    fn not_executable_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plain");
        std::fs::write(&path, b"x").unwrap();
        assert_eq!(
            verify(&path, &"0".repeat(64)).unwrap_err().code(),
            "not_executable"
        );
    }
}
