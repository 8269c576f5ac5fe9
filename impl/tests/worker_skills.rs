//! Skills end to end ("Skills"): our host scans the roots, materializes the set beside the
//! socket, our Python worker reads it before it connects, echoes its revision in `hello`
//! and makes each id importable; the host removes the file once the handshake is done and
//! answers `skills.index`/`skills.load` from the index the generation was given.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use contract_impl::worker::host::{BasicServices, CellRecord, HostConfig, Worker};
use contract_impl::worker::skills::set::SET_FILE;
use contract_impl::worker::skills::{SkillIndex, SkillRequests, SkillRoots};
use contract_impl::worker::wire::{CellStatus, Stream};

const BIN: &str = env!("CARGO_BIN_EXE_contract-impl");
const NOTES: &str = "# notes\nTake notes as you go.\n";
const REVIEW: &str = "# review\n\nRead the whole diff before you answer.\n";
/// The set's revision, computed independently (Python's hashlib).
const REVISION: &str = "bf50c49ff7385932c06ffb0cf9bcd82bd6e61187112eb536312d916ea37c9166";

fn write(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn workbench(skills: Option<Arc<SkillIndex>>) -> HostConfig {
    let mut config = HostConfig::workbench(vec![BIN.into(), "worker".into(), "python".into()]);
    config.supervisor = Some(BIN.into());
    config.skills = skills;
    config
}

fn result(record: &CellRecord) -> String {
    assert_eq!(record.status, Some(CellStatus::Ok), "{record:?}");
    record
        .output
        .iter()
        .filter(|o| o.stream == Stream::Result)
        .map(|o| o.text.clone())
        .collect()
}

#[tokio::test]
async fn a_workbench_loads_the_set_it_was_given_and_the_file_does_not_outlive_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let roots = SkillRoots::resolve(dir.path(), &dir.path().join("data"));
    roots.prepare().unwrap();
    write(&roots.builtin, "review/SKILL.md", REVIEW);
    write(&roots.managed, "notes/SKILL.md", NOTES);
    write(&roots.managed, "draft/SKILL.md", "# draught\n");
    let index = Arc::new(SkillIndex::scan(&roots));
    let mut worker = Worker::spawn(workbench(Some(index.clone()))).await.unwrap();
    assert_eq!(worker.revision.as_deref(), Some(REVISION));
    assert!(
        !worker.dir().join(SET_FILE).exists(),
        "the set is removed once the handshake is done"
    );
    let mut services = SkillRequests::new(worker.skills(), BasicServices);
    let r = worker
        .execute(
            "import klbr.skills.review\nfrom klbr.skills import notes\n(klbr.skills.review.__doc__, notes.__doc__)",
            &mut services,
        )
        .await
        .unwrap();
    assert_eq!(
        result(&r),
        format!("({REVIEW:?}, {NOTES:?})").replace('"', "'")
    );
    let r = worker
        .execute(
            "try:\n    import klbr.skills.draft\nexcept ModuleNotFoundError as e:\n    missing = e.name\nmissing",
            &mut services,
        )
        .await
        .unwrap();
    assert_eq!(result(&r), "'klbr.skills.draft'");
    let r = worker
        .execute(
            "i = await runtime.request('skills.index')\n(i['revision'], i['ids'], [(r['id'], r['reason']) for r in i['refused']])",
            &mut services,
        )
        .await
        .unwrap();
    assert_eq!(
        result(&r),
        format!("('{REVISION}', ['notes', 'review'], [('draft', 'title_mismatch')])")
    );
    // Written during the turn: refused rather than half-read, offered on the next one.
    write(&roots.managed, "notes/SKILL.md", "# notes\nchanged\n");
    let r = worker
        .execute(
            "try:\n    await runtime.request('skills.load', id='notes')\nexcept Exception as e:\n    code = e.code\ncode",
            &mut services,
        )
        .await
        .unwrap();
    assert_eq!(result(&r), "'skill_changed'");
    let r = worker
        .execute(
            "(await runtime.request('skills.load', id='review'))['body']",
            &mut services,
        )
        .await
        .unwrap();
    assert_eq!(result(&r), format!("{REVIEW:?}").replace('"', "'"));
    worker.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn without_skills_the_hello_revision_stays_null_and_nothing_is_importable() {
    let dir = tempfile::tempdir().unwrap();
    let roots = SkillRoots::resolve(dir.path(), &dir.path().join("data"));
    roots.prepare().unwrap();
    let index = Arc::new(SkillIndex::scan(&roots));
    let mut worker = Worker::spawn(workbench(Some(index))).await.unwrap();
    assert_eq!(worker.revision, None);
    let r = worker
        .execute(
            "try:\n    import klbr.skills\nexcept ModuleNotFoundError as e:\n    missing = e.name\nmissing",
            &mut BasicServices,
        )
        .await
        .unwrap();
    assert_eq!(result(&r), "'klbr'");
    worker.shutdown(Duration::from_secs(5)).await;
}
