//! What a client keeps between launches (engine-protocol.md, "Initialization"): its
//! stable client ID and the epoch it last held, so that its next `Initialize` is a
//! reconnect ("Reconnect supplies that client ID and its expected epoch; the daemon
//! performs a compare-and-swap and returns the same ID at exactly the next epoch").
//!
//! The client-state file is JSON `{"client_id", "epoch"}`, written whole (a temporary
//! file, synced, renamed over the old one, the directory synced) with mode 0600, so a
//! crash leaves the old state or the new one, never a torn one. Used by the client
//! subcommands' `--client-state` and by `engine controlled`.
//!
//! This module only reads and writes files; it never calls the daemon.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::client::Ownership;
use crate::engine::session::Session;

/// A file of client state could not be read or written (stable [`code`](Self::code)).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file exists and cannot be read, or is not client state.
    #[error("cannot read the client state at {path}: {reason}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file (or its directory) cannot be written durably.
    #[error("cannot write {path}: {reason}")]
    Unwritable {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl StateError {
    /// The stable code: `state_unreadable` or `state_unwritable`.
    pub fn code(&self) -> &'static str {
        match self {
            StateError::Unreadable { .. } => "state_unreadable",
            StateError::Unwritable { .. } => "state_unwritable",
        }
    }
}

/// Who the client was when it last won a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientState {
    /// The stable client ID.
    pub client_id: String,
    /// The epoch last held.
    pub epoch: u64,
}

impl ClientState {
    /// The identity `session` won.
    pub fn of(session: &Session) -> Self {
        Self {
            client_id: session.session.client_id.clone(),
            epoch: session.session.epoch,
        }
    }

    /// The state recorded at `path`; `None` when there is no file (a client that never
    /// won a claim).
    ///
    /// # Errors
    /// [`StateError::Unreadable`].
    pub fn load(path: &Path) -> Result<Option<Self>, StateError> {
        let unreadable = |reason: String| StateError::Unreadable {
            path: path.to_path_buf(),
            reason,
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(unreadable(e.to_string())),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| unreadable(e.to_string()))
    }

    /// The claim to make: a reconnect as `recorded`, or a new owner.
    pub fn ownership(recorded: Option<Self>) -> Ownership {
        recorded.map_or(Ownership::New, |s| Ownership::Reconnect {
            client_id: s.client_id,
            epoch: s.epoch,
        })
    }

    /// Records this state at `path` durably (0600).
    ///
    /// # Errors
    /// [`StateError::Unwritable`].
    pub fn store(&self, path: &Path) -> Result<(), StateError> {
        let bytes = serde_json::to_vec(self).map_err(|e| StateError::Unwritable {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        write_private(path, &bytes)
    }
}

/// Makes `dir` (and its parents) when it does not exist, the directory itself 0700; an
/// existing directory is left as it is.
///
/// # Errors
/// [`StateError::Unwritable`].
pub fn private_dir(dir: &Path) -> Result<(), StateError> {
    if dir.is_dir() {
        return Ok(());
    }
    let fail = |e: std::io::Error| StateError::Unwritable {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)
}

/// Writes `bytes` to `path` whole and durably with mode 0600: a temporary file beside it,
/// synced, renamed over `path`, then the directory synced.
///
/// # Errors
/// [`StateError::Unwritable`].
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let fail = |e: std::io::Error| StateError::Unwritable {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(fail)?;
    file.write_all(bytes).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_private_and_absent_state_is_a_new_owner() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("state");
        private_dir(&state_dir).unwrap();
        assert_eq!(
            std::fs::metadata(&state_dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let path = state_dir.join("client-state.json");
        assert_eq!(ClientState::load(&path).unwrap(), None);
        assert_eq!(ClientState::ownership(None), Ownership::New);
        let state = ClientState {
            client_id: "c-1".into(),
            epoch: 3,
        };
        state.store(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            r#"{"client_id":"c-1","epoch":3}"#
        );
        let loaded = ClientState::load(&path).unwrap();
        assert_eq!(loaded.as_ref(), Some(&state));
        assert_eq!(
            ClientState::ownership(loaded),
            Ownership::Reconnect {
                client_id: "c-1".into(),
                epoch: 3
            }
        );
        assert!(!path.with_extension("tmp").exists());
    }

    #[test]
    fn a_torn_or_foreign_state_file_is_refused_typed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client-state.json");
        std::fs::write(&path, "{\"client_id\":").unwrap();
        let e = ClientState::load(&path).unwrap_err();
        assert_eq!(e.code(), "state_unreadable");
        let e = ClientState {
            client_id: "c".into(),
            epoch: 1,
        }
        .store(&dir.path().join("missing").join("state.json"))
        .unwrap_err();
        assert_eq!(e.code(), "state_unwritable");
    }
}
