//! Private scratch directories that do not outlive their process, SIGKILL included.
//!
//! Every directory is created (mode 0700) under this process's **scratch root**,
//! `<temp>/contract-scratch-<uuid>/`, which holds an `.owner` file locked with `flock`
//! for the life of the process (the root is made under another name and renamed only
//! once its lock is held, so no sweep ever sees a live root unlocked). The kernel drops the lock however the process ends, so
//! a root whose `.owner` can be locked belongs to a dead process: [`sweep_stale`]
//! removes such roots. It runs when this process creates its root, when a Runtime's
//! command adapter starts, and in a program's supervisor once its host is gone, so a
//! SIGKILLed Runtime's scratch directories are removed by the supervisor of a Run that
//! was going (right after the Runtime's death) or at the next start at the latest.
//!
//! This module owns creating, locking and sweeping roots. It never removes a directory
//! that is not a root of this naming whose lock it holds or could take, and never follows
//! a symbolic link.

use std::fs::File;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};

/// Name prefix of a scratch root in the temporary directory.
pub const ROOT_PREFIX: &str = "contract-scratch-";

/// The lock file of a root.
const OWNER_FILE: &str = ".owner";

/// A root being made, or one without an `.owner` file, is a creation cut short only
/// once it is this old; a younger one may be a live process's.
pub const UNLOCKED_ROOT_GRACE: Duration = Duration::from_secs(60);

/// This process's root and the lock that marks it alive.
struct Root {
    path: PathBuf,
    _owner: Flock<File>,
}

/// This process's root, made on first use and again should it disappear (a temporary
/// directory cleaner).
static ROOT: Mutex<Option<Root>> = Mutex::new(None);

/// Name prefix of a root being made: not yet locked, so never swept as a root; renamed to
/// its [`ROOT_PREFIX`] name once its lock is held.
const MAKING_PREFIX: &str = ".contract-scratch-making-";

fn create_root(base: &Path) -> Result<Root, String> {
    sweep_stale(base);
    let id = uuid::Uuid::new_v4();
    let making = base.join(format!("{MAKING_PREFIX}{id}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&making)
        .map_err(|e| format!("cannot create {}: {e}", making.display()))?;
    let owner = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(making.join(OWNER_FILE))
        .map_err(|e| format!("cannot create the scratch root's lock: {e}"))?;
    let owner = Flock::lock(owner, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| format!("cannot lock the scratch root: {e}"))?;
    // Only a locked root ever carries the root name: a concurrent sweep cannot take it.
    let path = base.join(format!("{ROOT_PREFIX}{id}"));
    std::fs::rename(&making, &path)
        .map_err(|e| format!("cannot name the scratch root {}: {e}", path.display()))?;
    Ok(Root {
        path,
        _owner: owner,
    })
}

/// Creates a new private empty directory (mode 0700) under this process's scratch root
/// (created on first use, in [`std::env::temp_dir`], and again if it was removed).
pub fn create_dir(prefix: &str) -> io::Result<PathBuf> {
    let mut root = ROOT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if root.as_ref().is_none_or(|r| !r.path.is_dir()) {
        *root = Some(create_root(&std::env::temp_dir()).map_err(io::Error::other)?);
    }
    let base = &root.as_ref().expect("just made").path;
    let dir = base.join(format!("{prefix}{}", uuid::Uuid::new_v4()));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

/// Removes every scratch root in `base` whose owner is gone (its `.owner` lock can be
/// taken, or it has none and is older than [`UNLOCKED_ROOT_GRACE`]); only directories of
/// this user, never through a symbolic link. Returns how many were removed.
pub fn sweep_stale(base: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let uid = nix::unistd::geteuid().as_raw();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(MAKING_PREFIX) {
            // A root whose making was cut short (the process died before the rename).
            let path = entry.path();
            let old = std::fs::symlink_metadata(&path).is_ok_and(|m| {
                m.is_dir()
                    && m.uid() == uid
                    && m.modified()
                        .ok()
                        .and_then(|t| SystemTime::now().duration_since(t).ok())
                        .is_some_and(|age| age >= UNLOCKED_ROOT_GRACE)
            });
            if old && std::fs::remove_dir_all(&path).is_ok() {
                removed += 1;
            }
            continue;
        }
        if !name.starts_with(ROOT_PREFIX) {
            continue;
        }
        let path = entry.path();
        // symlink_metadata: a link named like a root is left alone.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != uid {
            continue;
        }
        let stale = match File::open(path.join(OWNER_FILE)) {
            // Taken: nobody holds it. Held only while the directory is removed.
            Ok(file) => match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    let gone = std::fs::remove_dir_all(&path).is_ok();
                    drop(lock);
                    removed += usize::from(gone);
                    continue;
                }
                Err(_) => false,
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => meta
                .modified()
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age >= UNLOCKED_ROOT_GRACE),
            Err(_) => false,
        };
        if stale && std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_whose_lock_is_free_is_swept_and_a_held_one_is_kept() {
        let base = tempfile::tempdir().unwrap();
        let live = create_root(base.path()).unwrap();
        std::fs::write(live.path.join("file"), b"x").unwrap();
        // A dead owner's root: the same layout, nobody holds the lock.
        let dead = base.path().join(format!("{ROOT_PREFIX}dead"));
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(OWNER_FILE), b"").unwrap();
        std::fs::create_dir(dead.join("run-1")).unwrap();
        // Not a root: left alone whatever its state.
        let other = base.path().join("contract-other");
        std::fs::create_dir(&other).unwrap();

        assert_eq!(sweep_stale(base.path()), 1);
        assert!(!dead.exists());
        assert!(live.path.join("file").exists(), "a live root was swept");
        assert!(other.exists());

        let path = live.path.clone();
        drop(live);
        assert_eq!(sweep_stale(base.path()), 1);
        assert!(!path.exists(), "a released root was kept");
    }

    #[test]
    fn a_young_root_without_a_lock_file_is_kept() {
        let base = tempfile::tempdir().unwrap();
        let young = base.path().join(format!("{ROOT_PREFIX}young"));
        std::fs::create_dir(&young).unwrap();
        assert_eq!(sweep_stale(base.path()), 0);
        assert!(young.exists());
    }

    #[test]
    fn a_symlink_named_like_a_root_is_not_followed() {
        let base = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        std::fs::write(target.path().join(OWNER_FILE), b"").unwrap();
        std::os::unix::fs::symlink(
            target.path(),
            base.path().join(format!("{ROOT_PREFIX}link")),
        )
        .unwrap();
        assert_eq!(sweep_stale(base.path()), 0);
        assert!(target.path().join(OWNER_FILE).exists());
    }
}
