//! Source identity of a hook snapshot ("Source revisions and activation"): the revision a
//! hook worker announces in `hello` and the host records in its activation epoch.
//!
//! "Source identity hashes sorted POSIX relative filenames and exact bytes. For each file
//! feed SHA-256: u64BE name-byte-length, UTF-8 name, u64BE content-length, content. Source
//! snapshots allow `.py`, `.json`, `.md`, maximum 128 files/2 MiB, no symlinks."
//!
//! This module reads a directory and hashes it; it never imports or runs the snapshot.
//! The Python worker computes the same digest independently (`source_identity` there);
//! the fixed-digest test below and the `hello_hooks` scenario pin both.

use std::path::{Path, PathBuf};

use std::io::Read;

use sha2::{Digest, Sha256};

use super::wire::limits::{SOURCE_BYTES_MAX, SOURCE_FILES_MAX};

/// The file name suffixes a snapshot may hold.
pub const SOURCE_SUFFIXES: [&str; 3] = [".py", ".json", ".md"];

/// The manifest at the snapshot's root (our launch contract, `WK-SRC-005`).
pub const MANIFEST_FILE: &str = "behavior.json";

/// Why a snapshot has no source identity. Every variant has a stable [`code`](Self::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The directory or a file could not be read.
    #[error("cannot read the snapshot at {path}: {reason}")]
    Unreadable {
        /// The path.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
    /// A symlink (file or directory).
    #[error("symlink {0:?} in the source snapshot")]
    Symlink(String),
    /// A file of another kind than the allowed suffixes, or a `__pycache__` directory.
    #[error("{0:?} is not a .py, .json or .md file")]
    Suffix(String),
    /// More than [`SOURCE_FILES_MAX`] files.
    #[error("{0} files exceed the {SOURCE_FILES_MAX}-file bound")]
    TooManyFiles(usize),
    /// More than [`SOURCE_BYTES_MAX`] bytes of content.
    #[error("the source snapshot exceeds {SOURCE_BYTES_MAX} bytes")]
    TooLarge,
    /// A name that is not UTF-8.
    #[error("a file name that is not UTF-8 in the source snapshot")]
    NotUtf8,
}

impl SourceError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            SourceError::Unreadable { .. } => "source_unreadable",
            SourceError::Symlink(_) => "source_symlink",
            SourceError::Suffix(_) => "source_suffix",
            SourceError::TooManyFiles(_) => "source_too_many_files",
            SourceError::TooLarge => "source_too_large",
            SourceError::NotUtf8 => "source_not_utf8",
        }
    }
}

fn unreadable(path: &Path, e: &std::io::Error) -> SourceError {
    SourceError::Unreadable {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Collects the POSIX relative names of every file under `root`.
fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<(), SourceError> {
    let entries = std::fs::read_dir(dir).map_err(|e| unreadable(dir, &e))?;
    for entry in entries {
        let entry = entry.map_err(|e| unreadable(dir, &e))?;
        let name = entry
            .file_name()
            .into_string()
            .map_err(|_| SourceError::NotUtf8)?;
        let rel = format!("{prefix}{name}");
        let kind = entry
            .file_type()
            .map_err(|e| unreadable(&entry.path(), &e))?;
        if kind.is_symlink() {
            return Err(SourceError::Symlink(rel));
        }
        if kind.is_dir() {
            if name == "__pycache__" {
                return Err(SourceError::Suffix(rel));
            }
            walk(&entry.path(), &format!("{rel}/"), out)?;
        } else if !kind.is_file() || !SOURCE_SUFFIXES.iter().any(|s| rel.ends_with(s)) {
            return Err(SourceError::Suffix(rel));
        } else {
            out.push(rel);
        }
        if out.len() > SOURCE_FILES_MAX {
            return Err(SourceError::TooManyFiles(out.len()));
        }
    }
    Ok(())
}

/// The source identity of the snapshot at `root`: lowercase hex SHA-256.
///
/// # Errors
/// [`SourceError`]: a symlink, a disallowed file, a bound, an unreadable file.
pub fn source_identity(root: &Path) -> Result<String, SourceError> {
    let meta = std::fs::symlink_metadata(root).map_err(|e| unreadable(root, &e))?;
    if meta.file_type().is_symlink() {
        return Err(SourceError::Symlink(root.display().to_string()));
    }
    let mut files = Vec::new();
    walk(root, "", &mut files)?;
    files.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    let mut digest = Sha256::new();
    let mut total: u64 = 0;
    // The bound is checked on the files' sizes before anything is read, so a huge (or
    // sparse) file is refused without reading it.
    for rel in &files {
        let path = root.join(rel);
        let len = std::fs::symlink_metadata(&path)
            .map_err(|e| unreadable(&path, &e))?
            .len();
        total = total.saturating_add(len);
        if total > SOURCE_BYTES_MAX {
            return Err(SourceError::TooLarge);
        }
    }
    total = 0;
    for rel in &files {
        let path = root.join(rel);
        let mut content = Vec::new();
        let file = std::fs::File::open(&path).map_err(|e| unreadable(&path, &e))?;
        // A file that grew since: read no more than the bound allows.
        std::io::Read::take(file, SOURCE_BYTES_MAX - total + 1)
            .read_to_end(&mut content)
            .map_err(|e| unreadable(&path, &e))?;
        total += content.len() as u64;
        if total > SOURCE_BYTES_MAX {
            return Err(SourceError::TooLarge);
        }
        digest.update((rel.len() as u64).to_be_bytes());
        digest.update(rel.as_bytes());
        digest.update((content.len() as u64).to_be_bytes());
        digest.update(&content);
    }
    Ok(hex::encode(digest.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in files {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }
        dir
    }

    #[test]
    fn the_digest_is_the_specified_one() {
        // Computed by hand from the definition: one file `a.md` holding `x`.
        let dir = snapshot(&[("a.md", b"x")]);
        let mut expected = Sha256::new();
        expected.update(4u64.to_be_bytes());
        expected.update(b"a.md");
        expected.update(1u64.to_be_bytes());
        expected.update(b"x");
        assert_eq!(
            source_identity(dir.path()).unwrap(),
            hex::encode(expected.finalize())
        );
        // The empty snapshot hashes nothing.
        let empty = snapshot(&[]);
        assert_eq!(
            source_identity(empty.path()).unwrap(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn names_sort_by_bytes_and_nest_with_slashes() {
        let a = snapshot(&[("b.py", b"1"), ("a/z.py", b"2"), ("B.md", b"3")]);
        let mut expected = Sha256::new();
        for (name, content) in [("B.md", "3"), ("a/z.py", "2"), ("b.py", "1")] {
            expected.update((name.len() as u64).to_be_bytes());
            expected.update(name.as_bytes());
            expected.update((content.len() as u64).to_be_bytes());
            expected.update(content.as_bytes());
        }
        assert_eq!(
            source_identity(a.path()).unwrap(),
            hex::encode(expected.finalize())
        );
    }

    #[test]
    fn the_hello_hooks_fixture_has_its_committed_digest() {
        let manifest = "{\"version\":1,\"hooks\":{\"attention.plan\":\"policy:attention\",\"delivery.review\":\"policy:delivery\"}}\n";
        let scenario = include_str!("../../../scenarios/worker/hello_hooks.yaml");
        let policy = scenario
            .lines()
            .find_map(|l| l.trim().strip_prefix("policy.py: "))
            .unwrap();
        let policy: String = serde_json::from_str(policy).unwrap();
        let dir = snapshot(&[
            ("behavior.json", manifest.as_bytes()),
            ("policy.py", policy.as_bytes()),
        ]);
        assert_eq!(
            source_identity(dir.path()).unwrap(),
            "7a9e2d9784fd05390cfbbd2fffbd87c3b8defbbcd694b406dcdb2f16bc7421b0"
        );
    }

    #[test]
    fn refused_snapshots_name_why() {
        let dir = snapshot(&[("a.txt", b"x")]);
        assert_eq!(
            source_identity(dir.path()).unwrap_err().code(),
            "source_suffix"
        );
        let dir = snapshot(&[("__pycache__/a.py", b"x")]);
        assert_eq!(
            source_identity(dir.path()).unwrap_err().code(),
            "source_suffix"
        );
        let dir = snapshot(&[("a.py", b"x")]);
        std::os::unix::fs::symlink(dir.path().join("a.py"), dir.path().join("b.py")).unwrap();
        assert_eq!(
            source_identity(dir.path()).unwrap_err().code(),
            "source_symlink"
        );
        let names: Vec<String> = (0..=SOURCE_FILES_MAX).map(|i| format!("f{i}.py")).collect();
        let at = snapshot(
            &names[..SOURCE_FILES_MAX]
                .iter()
                .map(|n| (n.as_str(), &b""[..]))
                .collect::<Vec<_>>(),
        );
        assert!(source_identity(at.path()).is_ok(), "128 files are allowed");
        let over = snapshot(
            &names
                .iter()
                .map(|n| (n.as_str(), &b""[..]))
                .collect::<Vec<_>>(),
        );
        assert_eq!(
            source_identity(over.path()).unwrap_err().code(),
            "source_too_many_files"
        );
        let big = vec![b'x'; SOURCE_BYTES_MAX as usize];
        let at = snapshot(&[("a.py", &big)]);
        assert!(source_identity(at.path()).is_ok(), "2 MiB is allowed");
        let at = snapshot(&[("a.py", &big), ("b.py", b"x")]);
        assert_eq!(
            source_identity(at.path()).unwrap_err().code(),
            "source_too_large"
        );
        // A huge sparse file is refused from its size, unread (reading 64 GiB would not
        // end in any reasonable time, nor fit in memory).
        let sparse = snapshot(&[("behavior.json", b"{}")]);
        std::fs::File::create(sparse.path().join("huge.md"))
            .unwrap()
            .set_len(64 << 30)
            .unwrap();
        assert_eq!(
            source_identity(sparse.path()).unwrap_err().code(),
            "source_too_large"
        );
    }
}
