//! The skill roots against real directories: what is offered, every refusal with its
//! reason, the root states, `skills.load` of a changed body, the revision (a digest
//! computed independently, with Python's hashlib, pins it), the set file and the reply
//! bound.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use serde_json::json;

use super::serve::{index_value, load_reply};
use super::set::{SET_FILE, materialize, set_bytes};
use super::*;
use crate::worker::wire::Reply;

const NOTES: &str = "# notes\nTake notes as you go.\n";
const REVIEW: &str = "# review\n\nRead the whole diff before you answer.\n";
/// SHA-256 of (u64BE 5, "notes", u64BE len, NOTES, u64BE 6, "review", u64BE len, REVIEW).
const REVISION: &str = "bf50c49ff7385932c06ffb0cf9bcd82bd6e61187112eb536312d916ea37c9166";

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Roots under a fresh directory: `builtin/` and `data/skills/` (prepared).
fn roots() -> (tempfile::TempDir, SkillRoots) {
    let dir = tempfile::tempdir().unwrap();
    let roots = SkillRoots {
        builtin: dir.path().join("builtin"),
        managed: dir.path().join("data").join(SKILLS_SUBDIR),
    };
    roots.prepare().unwrap();
    (dir, roots)
}

fn reasons(index: &SkillIndex) -> Vec<(String, RootKind, &'static str)> {
    index
        .refused
        .iter()
        .map(|r| (r.id.clone(), r.root, r.refusal.code()))
        .collect()
}

#[test]
fn both_roots_form_one_namespace_with_a_digest_per_body_and_one_revision() {
    let (_dir, roots) = roots();
    write(&roots.builtin, "review/SKILL.md", REVIEW.as_bytes());
    write(&roots.managed, "notes/SKILL.md", NOTES.as_bytes());
    // Not skills: a plain file, a hidden directory.
    write(&roots.builtin, "README.md", b"# readme\n");
    write(&roots.builtin, ".git/SKILL.md", b"# git\n");
    let index = SkillIndex::scan(&roots);
    let ids: Vec<_> = index
        .skills
        .iter()
        .map(|s| (s.id.as_str(), s.root))
        .collect();
    assert_eq!(
        ids,
        [("notes", RootKind::Managed), ("review", RootKind::Builtin)]
    );
    assert!(index.refused.is_empty(), "{:?}", index.refused);
    assert_eq!(
        index.get("notes").unwrap().digest,
        "2f86e674f876ae000e3bbf57a8d0f60bcb145ad26447e76cd2684a0cf3ef1687"
    );
    assert_eq!(index.revision(), REVISION);
    assert_eq!(index.loaded_revision().as_deref(), Some(REVISION));
    assert_eq!(
        (index.builtin, index.managed),
        (RootState::Present, RootState::Present)
    );
}

#[test]
fn an_empty_set_loads_no_revision_and_an_absent_builtin_root_is_allowed() {
    let (_dir, roots) = roots();
    let index = SkillIndex::scan(&roots);
    assert_eq!(index.builtin, RootState::Absent);
    assert_eq!(index.managed, RootState::Present);
    assert_eq!(index.loaded_revision(), None);
    // SHA-256 of nothing.
    assert_eq!(
        index.revision(),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

#[test]
fn every_refusal_has_its_reason() {
    let (dir, roots) = roots();
    let (b, m) = (&roots.builtin, &roots.managed);
    write(b, "twice/SKILL.md", b"# twice\n");
    write(m, "twice/SKILL.md", b"# twice\n");
    write(b, "titled/SKILL.md", b"\n  \n# other\nbody\n");
    write(b, "untitled/SKILL.md", b"body first\n# untitled\n");
    write(b, "empty/SKILL.md", b"");
    write(b, "garbled/SKILL.md", b"# garbled\n\xff\xfe\n");
    write(b, "huge/SKILL.md", &vec![b'a'; 65_537]);
    write(dir.path(), "elsewhere/linked/SKILL.md", b"# linked\n");
    symlink(dir.path().join("elsewhere/linked"), b.join("linked")).unwrap();
    write(dir.path(), "elsewhere/SKILL.md", b"# pointed\n");
    std::fs::create_dir_all(m.join("pointed")).unwrap();
    symlink(
        dir.path().join("elsewhere/SKILL.md"),
        m.join("pointed/SKILL.md"),
    )
    .unwrap();
    std::fs::create_dir_all(m.join("bare")).unwrap();
    std::fs::create_dir_all(m.join("nested/SKILL.md")).unwrap();
    nix::unistd::mkfifo(&m.join("piped"), nix::sys::stat::Mode::S_IRWXU).unwrap_or(());
    std::fs::create_dir_all(m.join("fifo")).unwrap();
    nix::unistd::mkfifo(&m.join("fifo/SKILL.md"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    write(m, "code-review/SKILL.md", b"# code-review\n");
    write(m, "class/SKILL.md", b"# class\n");
    let index = SkillIndex::scan(&roots);
    assert!(index.skills.is_empty(), "{:?}", index.skills);
    use RootKind::{Builtin, Managed};
    let want = [
        ("bare", Managed, "missing_skill_file"),
        ("class", Managed, "invalid_id"),
        ("code-review", Managed, "invalid_id"),
        ("empty", Builtin, "missing_title"),
        ("fifo", Managed, "not_a_file"),
        ("garbled", Builtin, "not_utf8"),
        ("huge", Builtin, "oversize"),
        ("linked", Builtin, "symlinked_directory"),
        ("nested", Managed, "not_a_file"),
        ("pointed", Managed, "symlinked_file"),
        ("titled", Builtin, "title_mismatch"),
        ("twice", Builtin, "duplicate_id"),
        ("twice", Managed, "duplicate_id"),
        ("untitled", Builtin, "missing_title"),
    ];
    let got = reasons(&index);
    let want: Vec<_> = want
        .iter()
        .map(|(i, r, c)| (i.to_string(), *r, *c))
        .collect();
    assert_eq!(got, want);
    let titled = index.refused.iter().find(|r| r.id == "titled").unwrap();
    assert_eq!(
        titled.refusal,
        Refusal::TitleMismatch {
            title: "other".into(),
            id: "titled".into()
        }
    );
    assert_eq!(
        titled.refusal.to_string(),
        "the first non-empty line is `# other`, not `# titled`"
    );
    let garbled = index.refused.iter().find(|r| r.id == "garbled").unwrap();
    assert_eq!(garbled.refusal, Refusal::NotUtf8(10));
}

#[test]
fn the_title_line_reading() {
    for (body, ok) in [
        ("# x\n", true),
        ("\n \t\n# x\n", true),
        ("# x  \r\nbody\r\n", true),
        ("# x", true),
        ("#x\n", false),
        ("## x\n", false),
        ("  # x\n", false),
        ("# x y\n", false),
        ("#  x\n", false),
        ("# \n# x\n", false),
        ("", false),
    ] {
        assert_eq!(scan::check_title(body, "x").is_ok(), ok, "{body:?}");
    }
}

#[test]
fn skill_ids_are_importable_names() {
    for (id, ok) in [
        ("workspace", true),
        ("Review2", true),
        ("code_review", true),
        ("a", true),
        (&"a".repeat(128)[..], true),
        (&"a".repeat(129)[..], false),
        ("", false),
        ("_private", false),
        ("__init__", false),
        ("9lives", false),
        ("code-review", false),
        ("a.b", false),
        ("import", false),
        ("None", false),
        ("match", true),
        ("é", false),
    ] {
        assert_eq!(is_skill_id(id), ok, "{id:?}");
    }
}

#[test]
fn root_states() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "file", b"not a directory");
    let crowded = dir.path().join("crowded");
    for i in 0..=ROOT_ENTRIES_MAX {
        write(
            &crowded,
            &format!("s{i}/SKILL.md"),
            format!("# s{i}\n").as_bytes(),
        );
    }
    let index = SkillIndex::scan(&SkillRoots {
        builtin: dir.path().join("file"),
        managed: crowded,
    });
    assert_eq!(
        (index.builtin, index.managed),
        (RootState::NotADirectory, RootState::TooManyEntries)
    );
    assert!(index.skills.is_empty() && index.refused.is_empty());
}

#[test]
fn a_body_that_changed_since_it_was_indexed_is_refused() {
    let (_dir, roots) = roots();
    write(&roots.builtin, "review/SKILL.md", REVIEW.as_bytes());
    write(&roots.managed, "notes/SKILL.md", NOTES.as_bytes());
    write(&roots.managed, "Bad/SKILL.md", b"# bad\n");
    let index = SkillIndex::scan(&roots);
    assert_eq!(index.load("review").unwrap().body, REVIEW);
    write(
        &roots.builtin,
        "review/SKILL.md",
        b"# review\nsomething else\n",
    );
    assert_eq!(
        index.load("review"),
        Err(LoadError::Changed("review".into()))
    );
    // Written back as it was indexed, it loads again.
    write(&roots.builtin, "review/SKILL.md", REVIEW.as_bytes());
    assert!(index.load("review").is_ok());
    std::fs::remove_dir_all(roots.managed.join("notes")).unwrap();
    assert_eq!(index.load("notes").unwrap_err().code(), "skill_changed");
    assert_eq!(index.load("nope").unwrap_err().code(), "unknown_skill");
    let refused = index.load("Bad").unwrap_err();
    assert_eq!(refused.code(), "skill_refused");
    assert!(refused.to_string().contains("title_mismatch"), "{refused}");
    // A long unknown id is not echoed whole.
    let long = "x".repeat(10_000);
    assert!(index.load(&long).unwrap_err().to_string().len() < 300);
}

#[test]
fn the_replies() {
    let (_dir, roots) = roots();
    write(&roots.builtin, "review/SKILL.md", REVIEW.as_bytes());
    write(&roots.managed, "notes/SKILL.md", NOTES.as_bytes());
    write(&roots.managed, "review/SKILL.md", REVIEW.as_bytes());
    let index = SkillIndex::scan(&roots);
    assert_eq!(
        index_value(&index),
        json!({
            "revision": "f1edd55de9b058e02fe96f67ec720e40a22507e8f9febf16290ee92d8089fece",
            "ids": ["notes"],
            "digests": {"notes": "2f86e674f876ae000e3bbf57a8d0f60bcb145ad26447e76cd2684a0cf3ef1687"},
            "refused": [
                {"id": "review", "root": "builtin", "reason": "duplicate_id", "message": Refusal::DuplicateId.to_string()},
                {"id": "review", "root": "managed", "reason": "duplicate_id", "message": Refusal::DuplicateId.to_string()},
            ],
            "roots": {"builtin": "present", "managed": "present"},
        })
    );
    let Reply::Ok { value } = load_reply(&index, "notes") else {
        panic!("notes loads");
    };
    assert_eq!(value["body"], NOTES);
    let Reply::Error { code, .. } = load_reply(&index, "review") else {
        panic!("review is refused");
    };
    assert_eq!(code, "skill_refused");
}

#[test]
fn the_set_is_written_once_privately() {
    let (dir, roots) = roots();
    write(&roots.builtin, "review/SKILL.md", REVIEW.as_bytes());
    write(&roots.managed, "notes/SKILL.md", NOTES.as_bytes());
    let index = SkillIndex::scan(&roots);
    let path = materialize(&index, dir.path()).unwrap();
    assert_eq!(path, dir.path().join(SET_FILE));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        written,
        json!({"version": 1, "revision": REVISION, "skills": [
            {"id": "notes", "digest": index.skills[0].digest, "body": NOTES},
            {"id": "review", "digest": index.skills[1].digest, "body": REVIEW},
        ]})
    );
    assert!(
        materialize(&index, dir.path()).is_err(),
        "never overwritten"
    );
    assert_eq!(std::fs::read(&path).unwrap(), set_bytes(&index));
}

#[test]
fn the_largest_index_reply_fits_one_frame() {
    use crate::worker::wire::{Envelope, Message, encode_envelope, frame::encode_frame};
    // Every entry of both roots refused, each name the longest and worst to escape.
    let name: String = "\u{1}".repeat(SKILL_ID_MAX_BYTES);
    let title: String = "\u{1}".repeat(SKILL_ID_MAX_BYTES);
    let refused = (0..2 * ROOT_ENTRIES_MAX)
        .map(|i| RefusedSkill {
            id: name.clone(),
            root: if i % 2 == 0 {
                RootKind::Builtin
            } else {
                RootKind::Managed
            },
            refusal: Refusal::TitleMismatch {
                title: title.clone(),
                id: "a".repeat(SKILL_ID_MAX_BYTES),
            },
        })
        .collect();
    let index = SkillIndex {
        skills: Vec::new(),
        refused,
        builtin: RootState::Present,
        managed: RootState::Present,
        different: false,
    };
    let id = crate::worker::wire::Identifier::new("x".repeat(128)).unwrap();
    let envelope = Envelope {
        version: crate::worker::wire::limits::PROTOCOL_VERSION,
        session_id: id.clone(),
        generation: id.clone(),
        message: Message::HostReply {
            id: id.clone(),
            execution_id: id,
            reply: Reply::Ok {
                value: index_value(&index),
            },
        },
    };
    let payload = encode_envelope(&envelope).unwrap();
    encode_frame(&payload).expect("within the frame bound");
}

#[test]
fn the_builtin_root_defaults_to_the_workspace_s_skills_and_the_managed_root_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let (workspace, data) = (dir.path().join("ws"), dir.path().join("data"));
    // `KLBR_SKILLS_DIR` unset or empty: `<workspace>/skills`; set: that directory.
    for unset in [None, Some(std::ffi::OsString::new())] {
        let roots = SkillRoots::resolve_with(&workspace, &data, unset);
        assert_eq!(roots.builtin, workspace.join("skills"));
        assert_eq!(roots.managed, data.join("skills"));
    }
    let named = SkillRoots::resolve_with(&workspace, &data, Some(dir.path().join("b").into()));
    assert_eq!(named.builtin, dir.path().join("b"));
    // The host creates `<data>/skills` (0700); an absent builtin root is allowed.
    named.prepare().unwrap();
    let meta = std::fs::metadata(&named.managed).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    let index = SkillIndex::scan(&named);
    assert_eq!(
        (index.builtin, index.managed),
        (RootState::Absent, RootState::Present)
    );
}
