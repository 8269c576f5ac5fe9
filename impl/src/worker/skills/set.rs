//! The materialized set ("Skills": "A local spawn also materializes the whole validated set
//! beside the control socket and passes it as `--skills <path>`"): the file a workbench
//! reads before it connects, and the argument that names it.
//!
//! Its format is ours (`WK-SKILL-017`, `docs/worker-launch-contract.md`): one JSON object
//! `{"version": 1, "revision": <the set's revision>, "skills": [{"id", "digest", "body"}]}`,
//! skills in id order, written once (mode 0600, never over an existing file) in the
//! worker's private directory beside its socket. This module writes it; it never reads a
//! root (the set is a [`SkillIndex`]'s) and never removes the file (the host does, once the
//! handshake is done).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::SkillIndex;

/// The argument that names the materialized set ("passes it as `--skills <path>`").
pub const SKILLS_ARG: &str = "--skills";

/// The file's name in the worker's private directory (ours).
pub const SET_FILE: &str = "skills.json";

/// The format's version (ours).
pub const SET_VERSION: u32 = 1;

/// One skill of the set.
#[derive(Debug, Serialize)]
struct SetSkill<'a> {
    id: &'a str,
    digest: &'a str,
    body: &'a str,
}

/// The whole file.
#[derive(Debug, Serialize)]
struct SetFile<'a> {
    version: u32,
    revision: String,
    skills: Vec<SetSkill<'a>>,
}

/// The file's bytes for `index`'s validated set.
pub fn set_bytes(index: &SkillIndex) -> Vec<u8> {
    let file = SetFile {
        version: SET_VERSION,
        revision: index.revision(),
        skills: index
            .skills
            .iter()
            .map(|s| SetSkill {
                id: &s.id,
                digest: &s.digest,
                body: &s.body,
            })
            .collect(),
    };
    // Strings and integers only: serializing cannot fail.
    serde_json::to_vec(&file).unwrap_or_default()
}

/// Writes `index`'s validated set to [`SET_FILE`] in `dir` (mode 0600; an existing file is
/// an error, never overwritten) and returns its path.
///
/// # Errors
/// The file cannot be created or written (the text names it).
pub fn materialize(index: &SkillIndex, dir: &Path) -> Result<PathBuf, String> {
    let path = dir.join(SET_FILE);
    crate::private_fs::create_private(&path, &set_bytes(index))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}
