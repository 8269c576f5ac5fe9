//! Unit tests of [`super`] (appending, reading back, the rules applied in one
//! transaction).

use serde_json::json;

use super::*;
use crate::worker::instructions::records::{Change, PinReason};

const T: &str = "root";

fn host() -> Actor {
    Actor::Host {
        path: Some("AGENTS.md".into()),
        reason: None,
    }
}

fn request() -> Occasion {
    Occasion::Request { can_observe: true }
}

fn sources(text: &str) -> Vec<Source> {
    vec![Source::new("contract", text)]
}

fn revision_of(store: &InstructionStore, text: &str) -> HeaderRecord {
    let base = store.resolve(T).unwrap().newest;
    HeaderRecord::HeaderRevision(build_revision(&base, sources(text), host(), 9).unwrap())
}

#[test]
fn records_are_read_back_in_order_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let store = InstructionStore::open(dir.path()).unwrap();
    let pin = HeaderRecord::HeaderPin(HeaderPin::new("a\n", PinReason::SessionStart, 1));
    assert_eq!(store.append(T, &pin).unwrap(), Appended::Written(1));
    let first = revision_of(&store, "a\nb\n");
    assert_eq!(store.append(T, &first).unwrap(), Appended::Written(2));
    let second = revision_of(&store, "b\n");
    assert_eq!(store.append(T, &second).unwrap(), Appended::Written(3));
    assert_eq!(store.append("other", &pin).unwrap(), Appended::Written(1));
    drop(store);

    let store = InstructionStore::open(dir.path()).unwrap();
    assert_eq!(store.records(T).unwrap(), [pin.clone(), first, second]);
    assert_eq!(store.records("other").unwrap(), [pin]);
    assert!(store.records("none").unwrap().is_empty());
    assert_eq!(store.resolve(T).unwrap().newest.text, "b\n");
}

#[test]
fn a_revision_is_written_once_and_only_on_the_newest_record() {
    let dir = tempfile::tempdir().unwrap();
    let store = InstructionStore::open(dir.path()).unwrap();
    let revision = revision_of_fresh(&store);
    assert!(matches!(
        store.append(T, &revision),
        Err(StoreError::Chain(ChainError::NoPin))
    ));
    let pin = HeaderRecord::HeaderPin(HeaderPin::new("a", PinReason::SessionStart, 1));
    store.append(T, &pin).unwrap();
    assert_eq!(store.append(T, &pin).unwrap(), Appended::Existing(1));
    let to_b = revision_of(&store, "b");
    assert_eq!(store.append(T, &to_b).unwrap(), Appended::Written(2));
    assert_eq!(store.append(T, &to_b).unwrap(), Appended::Existing(2));
    // A text changed back and again is recorded each time.
    let to_a = revision_of(&store, "a");
    assert_eq!(store.append(T, &to_a).unwrap(), Appended::Written(3));
    assert_eq!(store.append(T, &to_b).unwrap(), Appended::Written(4));
    // A revision from a text that is not the newest does not extend the chain.
    assert!(matches!(
        store.append(T, &to_a_from_a()),
        Err(StoreError::StaleBase { .. })
    ));
    assert_eq!(store.records(T).unwrap().len(), 4);
}

/// A revision from "x" (before any pin of `T`).
fn revision_of_fresh(_store: &InstructionStore) -> HeaderRecord {
    let base = resolve(&[HeaderRecord::HeaderPin(HeaderPin::new(
        "x",
        PinReason::SessionStart,
        0,
    ))])
    .unwrap()
    .newest;
    HeaderRecord::HeaderRevision(build_revision(&base, sources("y"), host(), 0).unwrap())
}

/// A revision that claims the base "c".
fn to_a_from_a() -> HeaderRecord {
    let base = resolve(&[HeaderRecord::HeaderPin(HeaderPin::new(
        "c",
        PinReason::SessionStart,
        0,
    ))])
    .unwrap()
    .newest;
    HeaderRecord::HeaderRevision(build_revision(&base, sources("a"), host(), 0).unwrap())
}

#[test]
fn the_rules_pin_observe_once_and_move_the_head_at_a_fold() {
    let dir = tempfile::tempdir().unwrap();
    let store = InstructionStore::open(dir.path()).unwrap();
    let record = |text: &str, occasion| store.record(T, sources(text), occasion, host(), 5);

    let Recorded::Pinned(pin) = record("a\n", request()).unwrap() else {
        panic!("rule 1 pins")
    };
    assert_eq!(
        (pin.reason, pin.text.as_str()),
        (PinReason::SessionStart, "a\n")
    );
    assert_eq!(record("a\n", request()).unwrap(), Recorded::Kept);
    let busy = Occasion::Request { can_observe: false };
    assert_eq!(record("a\nb\n", busy).unwrap(), Recorded::Kept);
    let Recorded::Revised(revision) = record("a\nb\n", request()).unwrap() else {
        panic!("rule 2 revises")
    };
    assert!(matches!(revision.change, Change::Diff { .. }));
    assert_eq!(revision.actor, host());
    assert_eq!(record("a\nb\n", request()).unwrap(), Recorded::Kept);
    assert_eq!(store.resolve(T).unwrap().newest.text, "a\nb\n");

    let covering = Occasion::Fold {
        covers_a_revision: true,
    };
    let Recorded::Pinned(moved) = record("a\nb\n", covering).unwrap() else {
        panic!("rule 3 moves the head")
    };
    assert_eq!(moved.reason, PinReason::FoldCoveredRevision);
    let resolution = store.resolve(T).unwrap();
    assert_eq!(
        (resolution.pinned, resolution.applied),
        (Digest::of("a\nb\n"), 0)
    );
    assert_eq!(store.records(T).unwrap().len(), 3);

    let refused = store.record(T, vec![Source::new("", "")], request(), host(), 5);
    assert!(matches!(refused, Err(StoreError::Sources(_))));
}

#[test]
fn a_stopped_chain_is_answered_as_far_as_it_reaches_and_takes_no_revision() {
    let dir = tempfile::tempdir().unwrap();
    let store = InstructionStore::open(dir.path()).unwrap();
    store
        .record(T, sources("a\n"), request(), host(), 1)
        .unwrap();
    store
        .record(T, sources("b\n"), request(), host(), 2)
        .unwrap();
    {
        let conn = store.lock().unwrap();
        let json: String = conn
            .query_row("SELECT record FROM header_records WHERE seq = 2", [], |r| {
                r.get(0)
            })
            .unwrap();
        let forged = json.replace(r#""new_lines":["b\n"]"#, r#""new_lines":["c\n"]"#);
        assert_ne!(forged, json);
        conn.execute(
            "UPDATE header_records SET record = ?1 WHERE seq = 2",
            [forged],
        )
        .unwrap();
    }
    let resolution = store.resolve(T).unwrap();
    assert_eq!(resolution.newest.text, "a\n");
    let reply = serde_json::to_value(resolution.reply()).unwrap();
    assert_eq!(
        reply,
        json!({
            "digest": Digest::of("a\n"),
            "text": "a\n",
            "sources": null,
            "pin": {"digest": Digest::of("a\n"), "reason": "session_start", "pinned_at_ms": 1},
            "applied": 0,
            "stopped": {
                "index": 0,
                "claimed_digest": Digest::of("b\n"),
                "code": "result_mismatch",
                "message": reply["stopped"]["message"],
                "unapplied": 1
            }
        })
    );
    assert!(matches!(
        store.record(T, sources("d\n"), request(), host(), 3),
        Err(StoreError::ChainStopped {
            index: 0,
            code: "result_mismatch"
        })
    ));
    let fold = Occasion::Fold {
        covers_a_revision: false,
    };
    assert!(matches!(
        store.record(T, sources("d\n"), fold, host(), 4),
        Ok(Recorded::Pinned(_))
    ));
}

#[test]
fn a_record_that_does_not_decode_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = InstructionStore::open(dir.path()).unwrap();
    store.record(T, sources("a"), request(), host(), 1).unwrap();
    store
        .lock()
        .unwrap()
        .execute("UPDATE header_records SET record = '{}'", [])
        .unwrap();
    assert!(matches!(
        store.records(T),
        Err(StoreError::Decode { seq: 1, .. })
    ));
}
