//! The scenarios, requirement catalogs and reference goldens of this harness version,
//! embedded at build time (`harness/build.rs`), so an installed `contract-harness` needs
//! no checkout: when the default `scenarios/` or `golden/` is not in the working
//! directory, [`materialize`] writes the embedded copy once under the system's cache
//! or temporary directory and the harness reads it there. `--scenarios` and
//! `--golden-dir` always win.
//!
//! This module owns the embedded files and their one copy on disk; it never overwrites a
//! directory the user named.

use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/embedded.rs"));

/// The embedded copy's directory: `<cache>/contract-harness-<version>-<digest>` (the
/// digest of the embedded contents, so two builds of one version never share a copy).
fn copy_dir() -> PathBuf {
    use sha2::Digest as _;
    let mut digest = sha2::Sha256::new();
    for (path, bytes) in FILES {
        digest.update(path.as_bytes());
        digest.update(bytes);
    }
    let digest = hex::encode(&digest.finalize()[..8]);
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!(
        "contract-harness-{}-{digest}",
        env!("CARGO_PKG_VERSION")
    ))
}

/// The root holding `scenarios/` and `golden/` as embedded, written on first use.
///
/// # Errors
/// The copy cannot be written.
pub fn materialize() -> Result<PathBuf, String> {
    let dir = copy_dir();
    let done = dir.join(".complete");
    if done.exists() {
        // Trusted only while every file still holds the embedded bytes: a copy changed
        // on disk (by hand, or by another tool) is written again.
        if FILES
            .iter()
            .all(|(path, bytes)| std::fs::read(dir.join(path)).is_ok_and(|b| b == *bytes))
        {
            return Ok(dir);
        }
        let _ = std::fs::remove_file(&done);
    }
    // Written whole under a private name, then renamed: a concurrent harness never reads
    // half a copy.
    let partial = dir.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    for (path, bytes) in FILES {
        let target = partial.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&target, bytes).map_err(|e| format!("{}: {e}", target.display()))?;
    }
    std::fs::write(partial.join(".complete"), b"").map_err(|e| e.to_string())?;
    if dir.exists() && !done.exists() {
        // A stale or altered copy: replaced whole.
        let _ = std::fs::remove_dir_all(&dir);
    }
    match std::fs::rename(&partial, &dir) {
        Ok(()) => Ok(dir),
        // Another harness won the race: its copy is the same.
        Err(_) if done.exists() => {
            let _ = std::fs::remove_dir_all(&partial);
            Ok(dir)
        }
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

/// Whether `path` lies inside the embedded copy (which no command may write into: it is
/// the reference of this harness version).
pub fn is_embedded_copy(path: &Path) -> bool {
    path.starts_with(copy_dir())
}

/// `path` as given when it exists (or is not the default `default`), else the embedded
/// copy's `default` directory.
///
/// # Errors
/// The embedded copy cannot be written.
pub fn resolve(path: &Path, default: &str) -> Result<PathBuf, String> {
    if path != Path::new(default) || path.exists() {
        return Ok(path.to_path_buf());
    }
    Ok(materialize()?.join(default))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_s_scenarios_catalog_and_goldens_are_embedded() {
        for family in ["core_runtime", "worker", "engine"] {
            let prefix = format!("scenarios/{family}/");
            assert!(
                FILES.iter().any(|(p, _)| p.starts_with(&prefix)),
                "{family}"
            );
            let catalog = format!("scenarios/requirements/{family}.yaml");
            assert!(FILES.iter().any(|(p, _)| *p == catalog), "{catalog}");
            let golden = format!("golden/{family}/");
            assert!(
                FILES.iter().any(|(p, _)| p.starts_with(&golden)),
                "{family}"
            );
        }
        let on_disk = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios/engine/client_tolerates_unknown_fields.yaml");
        let embedded = FILES
            .iter()
            .find(|(p, _)| *p == "scenarios/engine/client_tolerates_unknown_fields.yaml")
            .unwrap();
        assert_eq!(embedded.1, std::fs::read(on_disk).unwrap().as_slice());
    }

    #[test]
    fn a_named_or_present_directory_wins_over_the_embedded_copy() {
        let dir = tempfile::tempdir().unwrap();
        let mine = dir.path().join("my-scenarios");
        assert_eq!(resolve(&mine, "scenarios").unwrap(), mine);
        let root = materialize().unwrap();
        assert!(root.join("scenarios/requirements/engine.yaml").exists());
        assert!(root.join("golden/engine").is_dir());
    }
}
