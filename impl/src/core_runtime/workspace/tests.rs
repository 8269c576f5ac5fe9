//! Unit tests.

use super::*;

fn setup() -> (tempfile::TempDir, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::new(dir.path()).unwrap();
    (dir, ws)
}

fn write(ws: &Workspace, rel: &str, body: &[u8]) {
    let p = ws.root().join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, body).unwrap();
}

/// Names in the directory, excluding nothing (to spot leftover temp files).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn tar_of(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, data, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        // Raw name bytes: the builder would refuse `..` and absolute paths.
        let name = path.as_bytes();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        if let Some(link) = link {
            let l = link.as_bytes();
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l);
        }
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn untar(data: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>, Option<String>)> {
    let mut a = tar::Archive::new(data);
    a.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let kind = e.header().entry_type();
            let link = e
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned());
            let mut body = Vec::new();
            e.read_to_end(&mut body).unwrap();
            (path, kind, body, link)
        })
        .collect()
}

// -- paths ---------------------------------------------------------------

#[test]
fn path_validation_table() {
    let (_d, ws) = setup();
    write(&ws, "dir/file.txt", b"x");
    let long = "a/".repeat(PATH_MAX_BYTES / 2) + "b";
    // 16 components of 255 bytes + 15 slashes = 4095 bytes: valid.
    let max = vec!["a".repeat(255); 16].join("/");
    assert!(max.len() <= PATH_MAX_BYTES);
    // One component over the file system's name limit.
    let over_name = "a".repeat(PATH_MAX_BYTES);
    let cases: &[(&str, bool)] = &[
        ("", true),
        ("dir", true),
        ("dir/file.txt", true),
        ("dir/new/deeper.txt", true),
        ("missing", true),
        ("/etc/passwd", false),
        ("/", false),
        ("..", false),
        ("dir/../dir", false),
        (".", false),
        ("./dir", false),
        ("dir/", false),
        ("dir//file.txt", false),
        ("dir/fi\0le", false),
        ("dir\\file.txt", false),
        (&long, false),
        (&max, true),
        (&over_name, false),
    ];
    for (rel, ok) in cases {
        let got = ws.resolve(rel);
        assert_eq!(
            got.is_ok(),
            *ok,
            "{:?} → {got:?}",
            &rel[..rel.len().min(40)]
        );
        if let Ok(p) = got {
            assert!(p.starts_with(ws.root()));
        } else {
            let err = got.unwrap_err();
            assert_eq!(err.refusal_code(), Some(WorkspaceErrorCode::InvalidPath));
            assert!(err.is_safe_refusal());
        }
    }
    assert_eq!(ws.resolve("").unwrap(), ws.root());
}

#[cfg(unix)]
#[test]
fn symlinks_must_stay_inside_the_root() {
    use std::os::unix::fs::symlink;
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"s").unwrap();
    let (_d, ws) = setup();
    write(&ws, "real/inner.txt", b"in");
    symlink(outside.path(), ws.root().join("escape")).unwrap();
    symlink("/etc/passwd", ws.root().join("abs")).unwrap();
    symlink("real", ws.root().join("inside")).unwrap();
    symlink("nowhere", ws.root().join("dangling")).unwrap();
    symlink("..", ws.root().join("real/up")).unwrap();

    for rel in ["escape", "escape/secret", "escape/new", "abs", "real/up/.."] {
        assert!(
            matches!(ws.resolve(rel), Err(WorkspaceError::InvalidPath(_))),
            "{rel}"
        );
    }
    assert!(matches!(
        ws.resolve("dangling"),
        Err(WorkspaceError::InvalidPath(_))
    ));
    assert_eq!(
        ws.resolve("inside/inner.txt").unwrap(),
        ws.root().join("real/inner.txt")
    );
    // `real/up` → the root itself: still inside.
    assert_eq!(ws.resolve("real/up/real").unwrap(), ws.root().join("real"));
    // A path through a regular file does not exist.
    assert!(ws.resolve("real/inner.txt/x").is_ok());
}

// -- listing ---------------------------------------------------------------

#[tokio::test]
async fn listing_reports_kinds_sizes_and_sorts() {
    let (_d, ws) = setup();
    write(&ws, "b.txt", b"12345");
    write(&ws, "a/nested.txt", b"x");
    write(&ws, "C", b"");
    #[cfg(unix)]
    std::os::unix::fs::symlink("b.txt", ws.root().join("link")).unwrap();
    let l = ws.list_directory("", None, None).await.unwrap();
    assert!(!l.truncated);
    let got: Vec<(&str, EntryKind, Option<u64>)> = l
        .entries
        .iter()
        .map(|e| (e.name.as_str(), e.kind, e.size))
        .collect();
    let mut want = vec![
        ("C", EntryKind::File, Some(0)),
        ("a", EntryKind::Directory, None),
        ("b.txt", EntryKind::File, Some(5)),
    ];
    #[cfg(unix)]
    want.push(("link", EntryKind::Symlink, None));
    assert_eq!(got, want);

    let sub = ws.list_directory("a", None, None).await.unwrap();
    assert_eq!(sub.entries.len(), 1);
    assert_eq!(
        ws.list_directory("b.txt", None, None).await,
        Err(WorkspaceError::WrongKind)
    );
    assert_eq!(
        ws.list_directory("nope", None, None).await,
        Err(WorkspaceError::NotFound)
    );
    assert_eq!(
        ws.list_directory("", Some(1), Some(1)).await,
        Err(WorkspaceError::ConflictingLimits)
    );
    assert_eq!(
        WorkspaceError::ConflictingLimits.refusal_code(),
        Some(WorkspaceErrorCode::ConflictingLimits)
    );
}

#[tokio::test]
async fn listing_is_bounded_at_1024_entries() {
    let (_d, ws) = setup();
    for i in 0..DIRECTORY_ENTRIES_MAX {
        write(&ws, &format!("f{i:05}"), b"");
    }
    let l = ws.list_directory("", None, None).await.unwrap();
    assert_eq!(l.entries.len(), DIRECTORY_ENTRIES_MAX);
    assert!(!l.truncated, "exactly at the bound is complete");
    let l = ws.list_directory("", Some(5000), None).await.unwrap();
    assert_eq!(l.entries.len(), DIRECTORY_ENTRIES_MAX);
    assert!(!l.truncated);

    write(&ws, &format!("f{:05}", DIRECTORY_ENTRIES_MAX), b"");
    let l = ws.list_directory("", None, None).await.unwrap();
    assert_eq!(l.entries.len(), DIRECTORY_ENTRIES_MAX);
    assert!(l.truncated);
    assert_eq!(l.entries.last().unwrap().name.as_str(), "f01023");
    let l = ws.list_directory("", Some(u64::MAX), None).await.unwrap();
    assert_eq!(l.entries.len(), DIRECTORY_ENTRIES_MAX);
    assert!(l.truncated);
}

#[tokio::test]
async fn listing_honours_max_entries_and_max_bytes() {
    let (_d, ws) = setup();
    for name in ["aa", "bbb", "c", "dddd"] {
        write(&ws, name, b"");
    }
    let l = ws.list_directory("", Some(2), None).await.unwrap();
    let n: Vec<&str> = l.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!((n, l.truncated), (vec!["aa", "bbb"], true));

    let l = ws.list_directory("", Some(4), None).await.unwrap();
    assert_eq!((l.entries.len(), l.truncated), (4, false));

    let l = ws.list_directory("", Some(0), None).await.unwrap();
    assert_eq!((l.entries.len(), l.truncated), (0, true));

    // "aa" + "bbb" = 5 bytes; "c" would make 6.
    let l = ws.list_directory("", None, Some(5)).await.unwrap();
    let n: Vec<&str> = l.entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!((n, l.truncated), (vec!["aa", "bbb"], true));

    let l = ws.list_directory("", None, Some(10)).await.unwrap();
    assert_eq!((l.entries.len(), l.truncated), (4, false));

    let empty = ws.list_directory("", None, Some(1)).await.unwrap();
    assert_eq!((empty.entries.len(), empty.truncated), (0, true));
}

#[tokio::test]
async fn listing_carries_255_byte_names_and_skips_unrepresentable_ones() {
    let (_d, ws) = setup();
    let max_name = "n".repeat(DIRECTORY_ENTRY_NAME_MAX_BYTES);
    write(&ws, &max_name, b"");
    let l = ws.list_directory("", None, None).await.unwrap();
    assert_eq!(l.entries[0].name.as_str(), max_name);
    assert!(!l.truncated);

    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        // Not UTF-8: skipped, explicitly truncated.
        let bad = std::ffi::OsStr::from_bytes(b"bad\xff");
        fs::write(ws.root().join(bad), b"").unwrap();
        let l = ws.list_directory("", None, None).await.unwrap();
        assert_eq!(l.entries.len(), 1);
        assert!(l.truncated);
    }
}

// -- byte reads ------------------------------------------------------------

#[tokio::test]
async fn byte_reads_with_offset_and_limits() {
    let (_d, ws) = setup();
    write(&ws, "f", b"0123456789");
    let r = ws.read_bytes("f", 0, None).await.unwrap();
    assert_eq!(
        (r.data.as_slice(), r.truncated, r.size),
        (&b"0123456789"[..], false, 10)
    );
    let r = ws.read_bytes("f", 3, Some(4)).await.unwrap();
    assert_eq!((r.data.as_slice(), r.truncated), (&b"3456"[..], true));
    let r = ws.read_bytes("f", 6, Some(4)).await.unwrap();
    assert_eq!((r.data.as_slice(), r.truncated), (&b"6789"[..], false));
    let r = ws.read_bytes("f", 10, None).await.unwrap();
    assert_eq!((r.data.len(), r.truncated), (0, false));
    let r = ws.read_bytes("f", 1000, None).await.unwrap();
    assert_eq!((r.data.len(), r.truncated), (0, false));
    let r = ws.read_bytes("f", 0, Some(0)).await.unwrap();
    assert_eq!((r.data.len(), r.truncated), (0, true));

    write(&ws, "d/x", b"");
    assert_eq!(
        ws.read_bytes("d", 0, None).await,
        Err(WorkspaceError::WrongKind)
    );
    assert_eq!(
        ws.read_bytes("nope", 0, None).await,
        Err(WorkspaceError::NotFound)
    );
    assert_eq!(
        ws.read_bytes("f/x", 0, None).await,
        Err(WorkspaceError::NotFound)
    );
    assert_eq!(
        WorkspaceError::WrongKind.refusal_code(),
        Some(WorkspaceErrorCode::WrongKind)
    );
}

#[tokio::test]
async fn byte_reads_are_bounded_to_1_mib() {
    let (_d, ws) = setup();
    let cap = WORKSPACE_READ_RESULT_MAX_BYTES;
    write(&ws, "exact", &vec![1u8; cap]);
    write(&ws, "big", &vec![2u8; cap + 1]);
    let r = ws.read_bytes("exact", 0, None).await.unwrap();
    assert_eq!((r.data.len(), r.truncated), (cap, false));
    let r = ws.read_bytes("big", 0, Some(u64::MAX)).await.unwrap();
    assert_eq!(
        (r.data.len(), r.truncated, r.size),
        (cap, true, cap as u64 + 1)
    );
    let r = ws.read_bytes("big", 1, None).await.unwrap();
    assert_eq!((r.data.len(), r.truncated), (cap, false));
}

#[cfg(unix)]
#[tokio::test]
async fn byte_reads_follow_only_inside_symlinks() {
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret"), b"s").unwrap();
    let (_d, ws) = setup();
    write(&ws, "real.txt", b"inside");
    std::os::unix::fs::symlink("real.txt", ws.root().join("ok")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), ws.root().join("bad")).unwrap();
    assert_eq!(ws.read_bytes("ok", 0, None).await.unwrap().data, b"inside");
    assert!(matches!(
        ws.read_bytes("bad", 0, None).await,
        Err(WorkspaceError::InvalidPath(_))
    ));
}

// -- install_file ----------------------------------------------------------

#[tokio::test]
async fn install_file_creates_parents_and_replaces_atomically() {
    let (_d, ws) = setup();
    ws.install_file("a/b/c.txt", b"one").await.unwrap();
    assert_eq!(fs::read(ws.root().join("a/b/c.txt")).unwrap(), b"one");
    ws.install_file("a/b/c.txt", b"two").await.unwrap();
    assert_eq!(fs::read(ws.root().join("a/b/c.txt")).unwrap(), b"two");
    assert_eq!(names(&ws.root().join("a/b")), vec!["c.txt"]);
    ws.install_file("empty", b"").await.unwrap();
    assert_eq!(fs::read(ws.root().join("empty")).unwrap(), b"");
}

#[tokio::test]
async fn install_file_refusals_leave_nothing_behind() {
    let (_d, ws) = setup();
    write(&ws, "dir/keep", b"k");
    write(&ws, "file", b"f");
    assert_eq!(
        ws.install_file("dir", b"x").await,
        Err(WorkspaceError::WrongKind)
    );
    assert_eq!(
        ws.install_file("file/x", b"x").await,
        Err(WorkspaceError::WrongKind)
    );
    assert!(matches!(
        ws.install_file("", b"x").await,
        Err(WorkspaceError::InvalidPath(_))
    ));
    assert!(matches!(
        ws.install_file("../x", b"x").await,
        Err(WorkspaceError::InvalidPath(_))
    ));
    assert_eq!(names(ws.root()), vec!["dir", "file"]);
    assert_eq!(names(&ws.root().join("dir")), vec!["keep"]);
    assert_eq!(fs::read(ws.root().join("file")).unwrap(), b"f");
}

#[test]
fn failed_rename_removes_the_temp_file() {
    // The rename onto a non-empty directory fails after the body was written and
    // flushed: the temporary file must be gone and the directory untouched.
    let (_d, ws) = setup();
    write(&ws, "target/inner", b"i");
    let err = write_atomically(ws.root(), &ws.root().join("target"), b"body", None).unwrap_err();
    assert!(err.is_safe_refusal(), "{err:?}");
    assert_eq!(names(ws.root()), vec!["target"]);
    assert_eq!(names(&ws.root().join("target")), vec!["inner"]);
}

#[cfg(unix)]
#[tokio::test]
async fn install_file_keeps_existing_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let (_d, ws) = setup();
    write(&ws, "script", b"old");
    fs::set_permissions(ws.root().join("script"), fs::Permissions::from_mode(0o750)).unwrap();
    ws.install_file("script", b"new").await.unwrap();
    let mode = fs::metadata(ws.root().join("script"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);
}

// -- install_archive -------------------------------------------------------

#[tokio::test]
async fn archive_unpacks_into_new_and_existing_directories() {
    let (_d, ws) = setup();
    let tar = tar_of(&[
        ("./", tar::EntryType::Directory, b"", None),
        ("./src/", tar::EntryType::Directory, b"", None),
        (
            "./src/main.rs",
            tar::EntryType::Regular,
            b"fn main() {}",
            None,
        ),
        ("README", tar::EntryType::Regular, b"readme", None),
        ("README.hard", tar::EntryType::Link, b"", Some("README")),
        (
            "src/link",
            tar::EntryType::Symlink,
            b"main.rs",
            Some("main.rs"),
        ),
        ("up", tar::EntryType::Symlink, b"", Some("src/../README")),
    ]);
    ws.install_archive("new/place", &tar).await.unwrap();
    let base = ws.root().join("new/place");
    assert_eq!(fs::read(base.join("src/main.rs")).unwrap(), b"fn main() {}");
    assert_eq!(fs::read(base.join("README.hard")).unwrap(), b"readme");
    #[cfg(unix)]
    {
        assert_eq!(fs::read(base.join("src/link")).unwrap(), b"fn main() {}");
        assert_eq!(fs::read(base.join("up")).unwrap(), b"readme");
    }
    assert_eq!(names(&ws.root().join("new")), vec!["place"]);

    // Merge into the root, which already has content.
    write(&ws, "README", b"old");
    write(&ws, "keep.txt", b"k");
    ws.install_archive("", &tar).await.unwrap();
    assert_eq!(fs::read(ws.root().join("README")).unwrap(), b"readme");
    assert_eq!(fs::read(ws.root().join("keep.txt")).unwrap(), b"k");
    assert_eq!(
        fs::read(ws.root().join("src/main.rs")).unwrap(),
        b"fn main() {}"
    );
    assert!(
        names(ws.root()).iter().all(|n| !n.starts_with(TEMP_PREFIX)),
        "{:?}",
        names(ws.root())
    );
}

#[tokio::test]
async fn archive_rejects_traversal_and_unsafe_entries_all_or_nothing() {
    let (_d, ws) = setup();
    write(&ws, "existing", b"e");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "dotdot",
            tar_of(&[
                ("ok.txt", tar::EntryType::Regular, b"ok", None),
                ("../evil", tar::EntryType::Regular, b"x", None),
            ]),
        ),
        (
            "nested dotdot",
            tar_of(&[
                ("ok.txt", tar::EntryType::Regular, b"ok", None),
                ("a/../../evil", tar::EntryType::Regular, b"x", None),
            ]),
        ),
        (
            "absolute",
            tar_of(&[
                ("ok.txt", tar::EntryType::Regular, b"ok", None),
                ("/tmp/evil", tar::EntryType::Regular, b"x", None),
            ]),
        ),
        (
            "absolute symlink",
            tar_of(&[
                ("ok.txt", tar::EntryType::Regular, b"ok", None),
                ("l", tar::EntryType::Symlink, b"", Some("/etc")),
            ]),
        ),
        (
            "escaping symlink",
            tar_of(&[
                ("ok.txt", tar::EntryType::Regular, b"ok", None),
                ("l", tar::EntryType::Symlink, b"", Some("../../..")),
            ]),
        ),
        (
            "symlink chain escape",
            tar_of(&[
                ("ok.txt", tar::EntryType::Regular, b"ok", None),
                ("x", tar::EntryType::Symlink, b"", Some(".")),
                ("l", tar::EntryType::Symlink, b"", Some("x/../outside")),
            ]),
        ),
        (
            "write through own symlink",
            tar_of(&[
                ("sub/", tar::EntryType::Directory, b"", None),
                ("l", tar::EntryType::Symlink, b"", Some("sub")),
                ("l/file", tar::EntryType::Regular, b"x", None),
            ]),
        ),
        (
            "escaping hard link",
            tar_of(&[
                ("ok.txt", tar::EntryType::Regular, b"ok", None),
                ("h", tar::EntryType::Link, b"", Some("../existing")),
            ]),
        ),
        (
            "hard link to a non-entry",
            tar_of(&[("h", tar::EntryType::Link, b"", Some("existing"))]),
        ),
        (
            "device",
            tar_of(&[
                ("ok.txt", tar::EntryType::Regular, b"ok", None),
                ("dev", tar::EntryType::Char, b"", None),
            ]),
        ),
        ("fifo", tar_of(&[("fifo", tar::EntryType::Fifo, b"", None)])),
    ];
    for (what, tar) in cases {
        for dest in ["", "fresh"] {
            let err = ws.install_archive(dest, &tar).await.unwrap_err();
            assert!(
                matches!(err, WorkspaceError::InvalidPath(_)),
                "{what} into {dest:?}: {err:?}"
            );
            assert!(err.is_safe_refusal());
            assert_eq!(names(ws.root()), vec!["existing"], "{what} into {dest:?}");
        }
    }
    assert!(matches!(
        ws.install_archive("", b"not a tar archive at all, just text")
            .await,
        Err(WorkspaceError::InvalidPath(_))
    ));
    assert_eq!(names(ws.root()), vec!["existing"]);
}

#[tokio::test]
async fn archive_merge_conflicts_change_nothing() {
    let (_d, ws) = setup();
    write(&ws, "a/file", b"old");
    write(&ws, "b", b"b");
    // "a/new" would be fine, but "a/file" as a directory conflicts.
    let tar = tar_of(&[
        ("a/new", tar::EntryType::Regular, b"n", None),
        ("a/file/inner", tar::EntryType::Regular, b"i", None),
    ]);
    assert_eq!(
        ws.install_archive("", &tar).await,
        Err(WorkspaceError::WrongKind)
    );
    assert_eq!(names(ws.root()), vec!["a", "b"]);
    assert_eq!(names(&ws.root().join("a")), vec!["file"]);
    assert_eq!(
        ws.install_archive("b", &tar).await,
        Err(WorkspaceError::WrongKind)
    );
}

// -- export ----------------------------------------------------------------

#[tokio::test]
async fn export_is_deterministic_and_complete() {
    let (_d, ws) = setup();
    write(&ws, "out/b.txt", b"bee");
    write(&ws, "out/a/z.txt", b"zed");
    write(&ws, "out/a/y.txt", b"why");
    #[cfg(unix)]
    std::os::unix::fs::symlink("b.txt", ws.root().join("out/link")).unwrap();
    let deep = format!("out/{}/{}", "d".repeat(120), "e".repeat(120));
    write(&ws, &format!("{deep}/f.txt"), b"deep");

    let first = ws.export("out").await.unwrap();
    assert_eq!(first.len() % TAR_BLOCK, 0);
    // Touch times: the archive must not change.
    fs::write(ws.root().join("out/b.txt"), b"bee").unwrap();
    let second = ws.export("out").await.unwrap();
    assert_eq!(first, second);

    let entries = untar(&first);
    let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    let d = "d".repeat(120);
    let e = "e".repeat(120);
    let mut want = vec![
        "a/".to_owned(),
        "a/y.txt".into(),
        "a/z.txt".into(),
        "b.txt".into(),
        format!("{d}/"),
        format!("{d}/{e}/"),
        format!("{d}/{e}/f.txt"),
    ];
    #[cfg(unix)]
    want.push("link".into());
    assert_eq!(paths, want);
    assert_eq!(entries[1].2, b"why");
    #[cfg(unix)]
    assert_eq!(entries.last().unwrap().3.as_deref(), Some("b.txt"));

    let mut a = tar::Archive::new(first.as_slice());
    for entry in a.entries().unwrap() {
        let h = entry.unwrap().header().clone();
        assert_eq!(h.mtime().unwrap(), 0);
        assert_eq!(h.uid().unwrap(), 0);
        assert_eq!(h.gid().unwrap(), 0);
    }

    let single = untar(&ws.export("out/b.txt").await.unwrap());
    assert_eq!(single.len(), 1);
    assert_eq!(
        (single[0].0.as_str(), single[0].2.as_slice()),
        ("b.txt", &b"bee"[..])
    );

    assert_eq!(ws.export("nope").await, Err(WorkspaceError::NotFound));
}

#[tokio::test]
async fn export_round_trips_through_install_archive() {
    let (_d, ws) = setup();
    write(&ws, "src/x/1.txt", b"one");
    write(&ws, "src/2.txt", b"two");
    let tar = ws.export("src").await.unwrap();
    ws.install_archive("copy", &tar).await.unwrap();
    assert_eq!(fs::read(ws.root().join("copy/x/1.txt")).unwrap(), b"one");
    assert_eq!(fs::read(ws.root().join("copy/2.txt")).unwrap(), b"two");
}

#[tokio::test]
async fn export_is_bounded_to_1_mib() {
    let (_d, ws) = setup();
    let cap = WORKSPACE_READ_RESULT_MAX_BYTES;
    // Largest single file that fits: bound − header − end-of-archive blocks.
    let fits = cap - TAR_BLOCK - TAR_TRAILER;
    write(&ws, "fits", &vec![7u8; fits]);
    let tar = ws.export("fits").await.unwrap();
    assert_eq!(tar.len(), cap);
    write(&ws, "too_big", &vec![7u8; fits + 1]);
    assert_eq!(
        ws.export("too_big").await,
        Err(WorkspaceError::ResultTooLarge)
    );
    assert_eq!(
        WorkspaceError::ResultTooLarge.refusal_code(),
        Some(WorkspaceErrorCode::ResultTooLarge)
    );

    // Many small files: the bound is hit while building, not after.
    for i in 0..(EXPORT_ENTRIES_MAX / 2) {
        write(&ws, &format!("many/{i:05}"), b"x");
    }
    assert_eq!(ws.export("many").await, Err(WorkspaceError::ResultTooLarge));
    // Too many names in one directory to ever fit.
    for i in 0..=EXPORT_ENTRIES_MAX {
        write(&ws, &format!("huge/{i:05}"), b"");
    }
    assert_eq!(ws.export("huge").await, Err(WorkspaceError::ResultTooLarge));
}

#[test]
fn pax_record_length_counts_itself() {
    for value_len in [0usize, 1, 5, 90, 95, 96, 995, 996, 5000] {
        let value = vec![b'v'; value_len];
        let record = pax_record("path", &value);
        let text = String::from_utf8(record.clone()).unwrap();
        let (len, _) = text.split_once(' ').unwrap();
        assert_eq!(len.parse::<usize>().unwrap(), record.len(), "{value_len}");
    }
}

#[test]
fn io_errors_are_ambiguous_except_access() {
    let denied = WorkspaceError::from(io::Error::from(io::ErrorKind::PermissionDenied));
    assert_eq!(denied, WorkspaceError::PermissionDenied);
    assert_eq!(
        denied.refusal_code(),
        Some(WorkspaceErrorCode::PermissionDenied)
    );
    assert!(denied.is_safe_refusal());
    let other = WorkspaceError::from(io::Error::other("disk on fire"));
    assert!(matches!(other, WorkspaceError::Io(_)));
    assert!(!other.is_safe_refusal());
    assert_eq!(other.refusal_code(), None);
}

/// Raw `errno` values and how they are classified: deterministic refusals are safe,
/// only genuinely ambiguous failures are `Io`.
#[cfg(unix)]
#[test]
fn deterministic_errno_values_are_safe_refusals() {
    use nix::errno::Errno;
    let classify = |errno: Errno| WorkspaceError::from(io::Error::from_raw_os_error(errno as i32));
    for errno in [Errno::ENAMETOOLONG, Errno::ELOOP, Errno::EINVAL] {
        let err = classify(errno);
        assert!(
            matches!(err, WorkspaceError::InvalidPath(_)),
            "{errno}: {err:?}"
        );
        assert_eq!(err.refusal_code(), Some(WorkspaceErrorCode::InvalidPath));
    }
    assert_eq!(classify(Errno::ENOENT), WorkspaceError::NotFound);
    assert_eq!(classify(Errno::ENOTDIR), WorkspaceError::NotFound);
    assert_eq!(classify(Errno::EISDIR), WorkspaceError::WrongKind);
    assert_eq!(classify(Errno::EACCES), WorkspaceError::PermissionDenied);
    assert_eq!(classify(Errno::EPERM), WorkspaceError::PermissionDenied);
    for errno in [Errno::EIO, Errno::ENOMEM, Errno::EBADF, Errno::ENOSPC] {
        let err = classify(errno);
        assert!(matches!(err, WorkspaceError::Io(_)), "{errno}: {err:?}");
        assert!(!err.is_safe_refusal());
    }
}

/// Regression: an offset above `i64::MAX` (or past the file system's largest file)
/// made `lseek` fail with `EINVAL`, which was reported as an ambiguous read. It is
/// past the end of the file: no bytes, not truncated.
#[tokio::test]
async fn offsets_past_the_largest_file_offset_read_nothing() {
    let (_d, ws) = setup();
    write(&ws, "small", b"0123456789");
    let i64_max = i64::MAX as u64;
    for offset in [10, 11, 1 << 62, i64_max, i64_max + 1, u64::MAX] {
        let r = ws.read_bytes("small", offset, None).await.unwrap();
        assert_eq!(
            (r.data.as_slice(), r.truncated, r.size),
            (&b""[..], false, 10),
            "offset {offset}"
        );
        let r = ws.read_bytes("small", offset, Some(0)).await.unwrap();
        assert_eq!((r.data.len(), r.truncated), (0, false), "offset {offset}");
    }
}

/// Regression: a symbolic-link loop (`ELOOP` from canonicalizing) stopped the
/// owner's reads as an ambiguous failure; it is a safe `invalid_path` refusal for
/// byte reads, directory reads, exports and writes, also as a path prefix.
#[cfg(unix)]
#[tokio::test]
async fn symlink_loops_are_safe_refusals() {
    let (_d, ws) = setup();
    std::os::unix::fs::symlink("self", ws.root().join("self")).unwrap();
    std::os::unix::fs::symlink("pong", ws.root().join("ping")).unwrap();
    std::os::unix::fs::symlink("ping", ws.root().join("pong")).unwrap();
    for path in ["self", "ping", "self/inner", "pong/inner/deeper"] {
        let errors = [
            ws.read_bytes(path, 0, None).await.unwrap_err(),
            ws.list_directory(path, None, None).await.unwrap_err(),
            ws.export(path).await.unwrap_err(),
            ws.install_file(path, b"x").await.unwrap_err(),
        ];
        for err in errors {
            assert!(
                matches!(err, WorkspaceError::InvalidPath(_)),
                "{path}: {err:?}"
            );
            assert!(err.is_safe_refusal());
        }
    }
    // The root still lists the links themselves (not followed).
    let listing = ws.list_directory("", None, None).await.unwrap();
    assert!(listing.entries.iter().all(|e| e.kind == EntryKind::Symlink));
}

/// `ENAMETOOLONG` (a component over the file system's 255-byte limit) and a path
/// through a regular file (`ENOTDIR`) are safe refusals for reads.
#[tokio::test]
async fn over_long_components_and_file_parents_are_safe_refusals() {
    let (_d, ws) = setup();
    write(&ws, "file", b"f");
    let long = "n".repeat(300);
    let err = ws.read_bytes(&long, 0, None).await.unwrap_err();
    assert!(matches!(err, WorkspaceError::InvalidPath(_)), "{err:?}");
    let err = ws
        .list_directory(&format!("{long}/x"), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, WorkspaceError::InvalidPath(_)), "{err:?}");
    assert_eq!(
        ws.read_bytes("file/x", 0, None).await,
        Err(WorkspaceError::NotFound)
    );
    assert_eq!(
        ws.list_directory("file/x", None, None).await,
        Err(WorkspaceError::NotFound)
    );
}
