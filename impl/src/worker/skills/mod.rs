//! Skills ("Skills"): the two skill roots, their validation into one index, the body a
//! `skills.load` request carries, and the validated set a local spawn materializes for
//! the worker.
//!
//! * A skill is a directory holding [`SKILL_FILE`] whose first non-empty line is
//!   `# <id>`, `<id>` equal to the directory name.
//! * Two roots form one namespace, and their order is not precedence
//!   ([`SkillRoots`]): builtin from [`SKILLS_DIR_ENV`] (default `<workspace>/skills`,
//!   allowed to be absent); managed from `<data>/skills`, created by the host (0700).
//! * Refused rather than resolved, each with its typed [`Refusal`]: an id defined in both
//!   roots, a title that disagrees with its directory, a non-UTF-8 or oversize file, a
//!   symlinked directory, and (our reading) a symlinked or missing `SKILL.md` and an id
//!   that is not a [skill id](is_skill_id).
//! * The [`SkillIndex`] is scanned once per workbench generation: the set it validated is
//!   what that generation was given (materialized at spawn, echoed in `hello`), and what
//!   `skills.index` answers for its whole life; `skills.load` re-reads one body and refuses
//!   it when its digest is no longer the indexed one ([`LoadError::Changed`]).
//!
//! This module owns reading the roots and what a skill is; it never writes into a root,
//! never follows a symlink inside one, and never reads more than [`SKILL_BODY_MAX_BYTES`]
//! of a file. What a reply looks like on the wire is [`serve`]'s; the materialized file is
//! [`set`]'s.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

mod scan;
pub mod serve;
pub mod set;
#[cfg(test)]
mod tests;

pub use serve::SkillRequests;

/// The file that makes a directory a skill ("Skills").
pub const SKILL_FILE: &str = "SKILL.md";

/// The variable naming the builtin root ("Skills": "Builtin skills come from
/// `KLBR_SKILLS_DIR`, defaulting to `<workspace>/skills`").
pub const SKILLS_DIR_ENV: &str = "KLBR_SKILLS_DIR";

/// The name of the default builtin root under the workspace and of the managed root under
/// the data directory ("Skills": `<workspace>/skills`, `<data>/skills`).
pub const SKILLS_SUBDIR: &str = "skills";

/// Largest `SKILL.md` offered, in bytes ("Skills" refuses an "oversize file" without a
/// number; our reading, `WK-SKILL-012`): 64 KiB, the spec's bound of returned text
/// ("Transport and bounds"), so that a body always fits one `host_reply` frame of
/// 1,048,576 bytes even when every byte is escaped as `\u00XX`.
pub const SKILL_BODY_MAX_BYTES: u64 = 65_536;

/// Most entries a root may hold (our reading, `WK-SKILL-012`: the spec bounds neither the
/// number of skills nor the index): a root with more is refused whole
/// ([`RootState::TooManyEntries`]), so an index reply stays far inside one frame and the
/// materialized set within 2 × 128 × 64 KiB.
pub const ROOT_ENTRIES_MAX: usize = 128;

/// Longest skill id in bytes: the wire's identifier bound ("Transport and bounds":
/// "Identifiers are 1..128 ASCII letters/digits/underscore/dot/hyphen"). A refused name
/// longer than this is reported cut to it.
pub const SKILL_ID_MAX_BYTES: usize = 128;

/// Python's keywords: no `import klbr.skills.<id>` statement can name them.
const PYTHON_KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Whether `id` is a skill id (our reading, `WK-SKILL-012`): it must be importable as
/// `klbr.skills.<id>` ("Skills"), so an ASCII Python identifier of 1..[`SKILL_ID_MAX_BYTES`]
/// bytes that is not a keyword and does not start with `_` (private and special names, the
/// synthetic package's own attributes among them). Every such id is also a wire identifier.
pub fn is_skill_id(id: &str) -> bool {
    let mut chars = id.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    id.len() <= SKILL_ID_MAX_BYTES
        && first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !PYTHON_KEYWORDS.contains(&id)
}

/// Which root a skill directory is in. Order is not precedence ("Skills").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RootKind {
    /// `KLBR_SKILLS_DIR`, default `<workspace>/skills`.
    Builtin,
    /// `<data>/skills`.
    Managed,
}

impl RootKind {
    /// The wire name (`builtin`, `managed`).
    pub fn as_str(self) -> &'static str {
        match self {
            RootKind::Builtin => "builtin",
            RootKind::Managed => "managed",
        }
    }
}

/// What the scan found at a root's path (our reading, `WK-SKILL-013`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RootState {
    /// A readable directory: its entries were read.
    Present,
    /// Nothing there ("allowed to be absent"): no skill from it.
    Absent,
    /// Something that is not a directory: no skill from it.
    NotADirectory,
    /// A directory that could not be read: no skill from it.
    Unreadable,
    /// More than [`ROOT_ENTRIES_MAX`] entries: no skill from it.
    TooManyEntries,
}

/// Why a skill directory is not offered: the typed reason `skills.index` reports
/// ("Refused ids are reported with their reason by `skills.index`"). Every variant has a
/// stable [`code`](Self::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// "An id defined in both roots is refused rather than resolved."
    #[error("the id is defined in both the builtin and the managed root; neither is offered")]
    DuplicateId,
    /// "A title that disagrees with its directory": the first non-empty line names
    /// another id.
    #[error("the first non-empty line is `# {title}`, not `# {id}`")]
    TitleMismatch {
        /// The title as written, cut to [`SKILL_ID_MAX_BYTES`] bytes.
        title: String,
        /// The directory's name.
        id: String,
    },
    /// The first non-empty line is no `# <title>` heading (or there is none).
    #[error("the first non-empty line of SKILL.md is not `# {0}`")]
    MissingTitle(String),
    /// "A non-UTF-8 [...] file": the byte offset of the first invalid sequence.
    #[error("SKILL.md is not UTF-8 (byte {0})")]
    NotUtf8(usize),
    /// "An [...] oversize file": more than [`SKILL_BODY_MAX_BYTES`].
    #[error("SKILL.md is over the {SKILL_BODY_MAX_BYTES}-byte bound")]
    Oversize,
    /// "A symlinked directory": never followed.
    #[error("the skill directory is a symlink, which is never followed")]
    SymlinkedDirectory,
    /// `SKILL.md` is a symlink: never followed (our reading, `WK-SKILL-012`).
    #[error("SKILL.md is a symlink, which is never followed")]
    SymlinkedFile,
    /// `SKILL.md` is no regular file (a directory, a FIFO).
    #[error("SKILL.md is not a regular file")]
    NotAFile,
    /// The directory holds no `SKILL.md`.
    #[error("the directory holds no SKILL.md")]
    MissingSkillFile,
    /// The directory name is not a [skill id](is_skill_id).
    #[error(
        "the directory name is not a skill id (an ASCII Python identifier of 1..128 bytes, no keyword, not starting with `_`)"
    )]
    InvalidId,
    /// `SKILL.md` could not be read (the OS error's kind).
    #[error("SKILL.md cannot be read: {0}")]
    Unreadable(String),
}

impl Refusal {
    /// The stable code (the `reason` of a refused entry).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::DuplicateId => "duplicate_id",
            Refusal::TitleMismatch { .. } => "title_mismatch",
            Refusal::MissingTitle(_) => "missing_title",
            Refusal::NotUtf8(_) => "not_utf8",
            Refusal::Oversize => "oversize",
            Refusal::SymlinkedDirectory => "symlinked_directory",
            Refusal::SymlinkedFile => "symlinked_file",
            Refusal::NotAFile => "not_a_file",
            Refusal::MissingSkillFile => "missing_skill_file",
            Refusal::InvalidId => "invalid_id",
            Refusal::Unreadable(_) => "unreadable",
        }
    }
}

/// The two roots of one namespace ("Skills").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillRoots {
    /// `KLBR_SKILLS_DIR`, default `<workspace>/skills`; allowed to be absent.
    pub builtin: PathBuf,
    /// `<data>/skills`; [`SkillRoots::prepare`] creates it.
    pub managed: PathBuf,
}

impl SkillRoots {
    /// The roots of a host whose workspace is `workspace` and data directory `data`:
    /// builtin from [`SKILLS_DIR_ENV`] when it is set and not empty, else
    /// `<workspace>/skills`; managed `<data>/skills`.
    pub fn resolve(workspace: &Path, data: &Path) -> Self {
        Self::resolve_with(workspace, data, std::env::var_os(SKILLS_DIR_ENV))
    }

    /// [`SkillRoots::resolve`] with the value of [`SKILLS_DIR_ENV`] given (`None`: unset).
    pub fn resolve_with(workspace: &Path, data: &Path, skills_dir: Option<OsString>) -> Self {
        let builtin = skills_dir
            .filter(|v| !v.is_empty())
            .map_or_else(|| workspace.join(SKILLS_SUBDIR), PathBuf::from);
        Self {
            builtin,
            managed: data.join(SKILLS_SUBDIR),
        }
    }

    /// Creates the managed root (and the data directory above it) with mode 0700 when
    /// absent ("`<data>/skills`, which `init`/`serve` create so an agent can write one
    /// without inventing the directory"); an existing one is left as it is.
    ///
    /// # Errors
    /// The directory cannot be created (the text names it).
    pub fn prepare(&self) -> Result<(), String> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.managed)
            .map_err(|e| format!("{}: {e}", self.managed.display()))
    }

    /// The root of `kind`.
    pub fn path(&self, kind: RootKind) -> &Path {
        match kind {
            RootKind::Builtin => &self.builtin,
            RootKind::Managed => &self.managed,
        }
    }
}

/// One offered skill: a validated body and its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// The id (its directory name).
    pub id: String,
    /// The root it is in.
    pub root: RootKind,
    /// The skill directory.
    pub dir: PathBuf,
    /// The whole `SKILL.md`, title line included.
    pub body: String,
    /// SHA-256 of the body's bytes, lowercase hex.
    pub digest: String,
}

/// One refused skill directory and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedSkill {
    /// The directory name (a name that is not UTF-8 shown with U+FFFD, cut to
    /// [`SKILL_ID_MAX_BYTES`] bytes).
    pub id: String,
    /// The root it is in.
    pub root: RootKind,
    /// Why.
    pub refusal: Refusal,
}

/// The validated set and the refusals of one scan of both roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillIndex {
    /// Offered skills, sorted by id.
    pub skills: Vec<Skill>,
    /// Refused directories, sorted by id then root.
    pub refused: Vec<RefusedSkill>,
    /// What was at the builtin root.
    pub builtin: RootState,
    /// What was at the managed root.
    pub managed: RootState,
    /// The host's profile: `false` ours; `true` another conformant host's choices where
    /// the spec leaves them free (the vendor-mode trial): an empty set is materialized
    /// too, and the replies of `skills.index` and `skills.load` have another shape and
    /// other codes ([`serve`]).
    pub different: bool,
}

/// Why `skills.load` gives no body. Every variant has a stable [`code`](Self::code)
/// (our reading, `WK-SKILL-014`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// No skill directory of that name was indexed.
    #[error("no skill `{0}` was indexed for this generation")]
    Unknown(String),
    /// The id was indexed as refused.
    #[error("skill `{id}` is refused ({}): {refusal}", refusal.code())]
    Refused {
        /// The id.
        id: String,
        /// Why it was refused.
        refusal: Refusal,
    },
    /// The body on disk is no longer the one indexed (changed, grown past the bound,
    /// replaced by a symlink or removed): refused rather than half-read.
    #[error(
        "skill `{0}` changed since it was indexed; a body written during a turn is offered on the next generation"
    )]
    Changed(String),
}

impl LoadError {
    /// The stable code (a `host_reply` error's `code`).
    pub fn code(&self) -> &'static str {
        match self {
            LoadError::Unknown(_) => "unknown_skill",
            LoadError::Refused { .. } => "skill_refused",
            LoadError::Changed(_) => "skill_changed",
        }
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl SkillIndex {
    /// Scans both roots (blocking file-system reads, bounded by [`ROOT_ENTRIES_MAX`] and
    /// [`SKILL_BODY_MAX_BYTES`]).
    pub fn scan(roots: &SkillRoots) -> Self {
        scan::scan(roots)
    }

    /// The set's revision (our definition, `WK-SKILL-015`): SHA-256 fed, for each offered
    /// skill in id order, the u64BE id length, the id, the u64BE body length and the body
    /// (the construction of "Source revisions and activation", ids for file names).
    pub fn revision(&self) -> String {
        let mut hash = Sha256::new();
        for skill in &self.skills {
            for part in [skill.id.as_bytes(), skill.body.as_bytes()] {
                hash.update((part.len() as u64).to_be_bytes());
                hash.update(part);
            }
        }
        hex::encode(hash.finalize())
    }

    /// The revision a workbench given this index loads and echoes in `hello`: the set's
    /// [revision](Self::revision) when the set holds a skill, `None` when it is empty (no
    /// set is materialized, and the hello `revision` stays null, `WK-SKILL-016`). The
    /// different profile materializes an empty set too ("the whole validated set"), so
    /// its workbench echoes that set's revision.
    pub fn loaded_revision(&self) -> Option<String> {
        self.materialized().then(|| self.revision())
    }

    /// Whether a workbench given this index is given a set (`--skills <path>`).
    pub fn materialized(&self) -> bool {
        self.different || !self.skills.is_empty()
    }

    /// The offered skill `id`.
    pub fn get(&self, id: &str) -> Option<&Skill> {
        self.skills.iter().find(|s| s.id == id)
    }

    /// The body of `id`, re-read and checked against the digest indexed.
    ///
    /// # Errors
    /// [`LoadError`]: not indexed, refused, or changed since.
    pub fn load(&self, id: &str) -> Result<&Skill, LoadError> {
        let Some(skill) = self.get(id) else {
            return Err(match self.refused.iter().find(|r| r.id == id) {
                Some(r) => LoadError::Refused {
                    id: id.to_string(),
                    refusal: r.refusal.clone(),
                },
                None => LoadError::Unknown(scan::cut(id, SKILL_ID_MAX_BYTES)),
            });
        };
        match scan::read_body(&skill.dir, id) {
            Ok(body) if digest(body.as_bytes()) == skill.digest => Ok(skill),
            _ => Err(LoadError::Changed(id.to_string())),
        }
    }
}
