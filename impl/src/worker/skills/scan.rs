//! Reading the two roots into a [`SkillIndex`], and one `SKILL.md` into a checked body.
//!
//! Nothing here follows a symlink inside a root (the root itself may be one), opens a file
//! that is not regular (a FIFO would block), or reads more than [`SKILL_BODY_MAX_BYTES`]
//! + 1 bytes of a file. It never writes.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::{
    ROOT_ENTRIES_MAX, Refusal, RefusedSkill, RootKind, RootState, SKILL_BODY_MAX_BYTES, SKILL_FILE,
    SKILL_ID_MAX_BYTES, Skill, SkillIndex, SkillRoots, digest, is_skill_id,
};

/// A candidate entry of a root: a directory, or a symlink that resolves to one.
struct Candidate {
    dir: PathBuf,
    symlinked: bool,
}

/// `text` cut to at most `max` bytes at a character boundary.
pub(super) fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The candidates of one root by name, or why the root gives none. Entries whose name
/// starts with `.` are not candidates (hidden, e.g. a checkout's `.git`); plain files and
/// other kinds are not skills and are passed over silently.
fn list(root: &Path) -> Result<BTreeMap<OsString, Candidate>, RootState> {
    match std::fs::metadata(root) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(RootState::NotADirectory),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(RootState::Absent),
        Err(_) => return Err(RootState::Unreadable),
    }
    let entries = std::fs::read_dir(root).map_err(|_| RootState::Unreadable)?;
    let mut out = BTreeMap::new();
    for (n, entry) in entries.enumerate() {
        if n >= ROOT_ENTRIES_MAX {
            return Err(RootState::TooManyEntries);
        }
        let entry = entry.map_err(|_| RootState::Unreadable)?;
        let name = entry.file_name();
        if name.as_encoded_bytes().starts_with(b".") {
            continue;
        }
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let dir = entry.path();
        let symlinked = kind.is_symlink();
        let is_dir = if symlinked {
            std::fs::metadata(&dir).is_ok_and(|m| m.is_dir())
        } else {
            kind.is_dir()
        };
        if is_dir {
            out.insert(name, Candidate { dir, symlinked });
        }
    }
    Ok(out)
}

/// Scans both roots: duplicates first (an id in both roots is refused in both, whatever
/// else is wrong with either), then each candidate on its own.
pub(super) fn scan(roots: &SkillRoots) -> SkillIndex {
    let mut found = Vec::new();
    let mut states = Vec::new();
    for kind in [RootKind::Builtin, RootKind::Managed] {
        match list(roots.path(kind)) {
            Ok(candidates) => {
                states.push(RootState::Present);
                found.push((kind, candidates));
            }
            Err(state) => {
                states.push(state);
                found.push((kind, BTreeMap::new()));
            }
        }
    }
    let mut skills = Vec::new();
    let mut refused = Vec::new();
    for (i, (kind, candidates)) in found.iter().enumerate() {
        let (_, others) = &found[1 - i];
        for (name, candidate) in candidates {
            let shown = cut(&name.to_string_lossy(), SKILL_ID_MAX_BYTES);
            let refuse = |refusal| RefusedSkill {
                id: shown.clone(),
                root: *kind,
                refusal,
            };
            if others.contains_key(name) {
                refused.push(refuse(Refusal::DuplicateId));
                continue;
            }
            let id = match name.to_str() {
                Some(id) if is_skill_id(id) => id,
                _ => {
                    refused.push(refuse(Refusal::InvalidId));
                    continue;
                }
            };
            if candidate.symlinked {
                refused.push(refuse(Refusal::SymlinkedDirectory));
                continue;
            }
            match read_body(&candidate.dir, id) {
                Ok(body) => skills.push(Skill {
                    id: id.to_string(),
                    root: *kind,
                    dir: candidate.dir.clone(),
                    digest: digest(body.as_bytes()),
                    body,
                }),
                Err(refusal) => refused.push(refuse(refusal)),
            }
        }
    }
    skills.sort_by(|a, b| a.id.cmp(&b.id));
    refused.sort_by(|a, b| (&a.id, a.root).cmp(&(&b.id, b.root)));
    SkillIndex {
        skills,
        refused,
        builtin: states[0],
        managed: states[1],
        different: false,
    }
}

/// The body of the skill directory `dir` whose id is `id`: a regular `SKILL.md`, not a
/// symlink, at most [`SKILL_BODY_MAX_BYTES`], UTF-8, its first non-empty line `# <id>`.
pub(super) fn read_body(dir: &Path, id: &str) -> Result<String, Refusal> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => return Err(Refusal::SymlinkedDirectory),
        Ok(_) => {}
        Err(e) => return Err(Refusal::Unreadable(e.kind().to_string())),
    }
    let path = dir.join(SKILL_FILE);
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Refusal::MissingSkillFile);
        }
        Err(e) => return Err(Refusal::Unreadable(e.kind().to_string())),
    };
    if meta.file_type().is_symlink() {
        return Err(Refusal::SymlinkedFile);
    }
    if !meta.is_file() {
        return Err(Refusal::NotAFile);
    }
    if meta.len() > SKILL_BODY_MAX_BYTES {
        return Err(Refusal::Oversize);
    }
    // No-follow and non-blocking: a file swapped for a symlink or a FIFO since the check
    // above is refused, never followed or waited on.
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(&path)
        .map_err(|e| Refusal::Unreadable(e.kind().to_string()))?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(Refusal::NotAFile);
    }
    let mut bytes = Vec::new();
    file.take(SKILL_BODY_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Refusal::Unreadable(e.kind().to_string()))?;
    if bytes.len() as u64 > SKILL_BODY_MAX_BYTES {
        return Err(Refusal::Oversize);
    }
    let body =
        String::from_utf8(bytes).map_err(|e| Refusal::NotUtf8(e.utf8_error().valid_up_to()))?;
    check_title(&body, id)?;
    Ok(body)
}

/// "Whose first non-empty line is `# <id>`" (our reading, `WK-SKILL-012`): a line of only
/// whitespace is empty; the title line is `# ` and the title, trailing whitespace (a CRLF's
/// `\r` included) ignored.
pub(super) fn check_title(body: &str, id: &str) -> Result<(), Refusal> {
    let first = body
        .lines()
        .map(str::trim_end)
        .find(|line| !line.is_empty());
    match first.and_then(|line| line.strip_prefix("# ")) {
        Some(title) if title == id => Ok(()),
        Some(title) if !title.trim().is_empty() => Err(Refusal::TitleMismatch {
            title: cut(title, SKILL_ID_MAX_BYTES),
            id: id.to_string(),
        }),
        _ => Err(Refusal::MissingTitle(id.to_string())),
    }
}
