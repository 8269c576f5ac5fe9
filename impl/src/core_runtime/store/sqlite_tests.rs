//! Unit tests of the SQLite store (real database files, kill -9 of a child writer).

use super::*;
use serde_json::json;

fn seeded(dir: &Path) -> SqliteStore {
    let mut s = SqliteStore::open(dir).unwrap();
    s.insert_agent(&AgentRecord {
        agent_id: "a1".into(),
        definition: json!({"model": "m"}),
        created_at_ms: 1,
    })
    .unwrap();
    s.insert_environment(&EnvironmentRecord {
        environment_id: "e1".into(),
        kind: EnvironmentKind::SelfHosted,
        created_at_ms: 1,
    })
    .unwrap();
    s.insert_session(&SessionRecord {
        session_id: "s1".into(),
        agent_id: "a1".into(),
        environment_id: "e1".into(),
        frozen: json!({}),
        native_session_id: None,
        started_turns: 0,
        created_at_ms: 1,
    })
    .unwrap();
    s
}

#[test]
fn wal_full_and_versioned_schema() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(s.schema_version().unwrap() as usize, MIGRATIONS.len());
    let mode: String = s
        .conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let sync: i64 = s
        .conn
        .query_row("PRAGMA synchronous", [], |r| r.get(0))
        .unwrap();
    assert_eq!(sync, 2, "FULL");
    drop(s);
    // Reopening applies nothing twice.
    let s = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(s.schema_version().unwrap() as usize, MIGRATIONS.len());
}

#[test]
fn credentials_are_hashed_verified_and_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = SqliteStore::open(dir.path()).unwrap();
    let secret = super::super::credential::generate_secret();
    let id = s.add_credential("cred_1", "dev", &secret, 1).unwrap();
    assert_eq!(s.add_credential("cred_2", "dev", &secret, 2).unwrap(), id);
    // Only the hash is stored.
    let raw: Vec<u8> = s
        .conn
        .query_row("SELECT secret_sha256 FROM credentials", [], |r| r.get(0))
        .unwrap();
    assert_eq!(raw.len(), 32);
    let dump: String = s
        .conn
        .query_row("SELECT group_concat(prefix) FROM credentials", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(!dump.contains(&secret));
    assert_eq!(
        s.verify_credential("dev", &secret).unwrap(),
        Some(id.clone())
    );
    assert_eq!(s.verify_credential("other", &secret).unwrap(), None);
    assert_eq!(s.verify_credential("dev", "rcd_wrong").unwrap(), None);
    assert!(s.add_credential("c", "dev", "proj_abc", 1).is_err());
    assert!(s.add_credential("c", "dev", "core_abc", 1).is_err());
    assert_eq!(s.verify_credential("dev", "proj_abc").unwrap(), None);
    assert_eq!(s.list_credentials().unwrap().len(), 1);
    assert!(s.revoke_credential(&id, 5).unwrap());
    assert!(!s.revoke_credential(&id, 6).unwrap());
    assert_eq!(s.verify_credential("dev", &secret).unwrap(), None);
    // A revoked secret cannot be provisioned again (a restart with the same environment).
    assert!(matches!(
        s.add_credential("cred_3", "dev", &secret, 7),
        Err(StoreError::InvalidState(m)) if m.contains("revoked")
    ));
    assert_eq!(s.verify_credential("dev", &secret).unwrap(), None);
    // Too short to be a secret (a listing shows eight characters of it).
    assert!(s.add_credential("c", "dev", "abc", 1).is_err());
    assert!(s.add_credential("c", "dev", &"x".repeat(23), 1).is_err());
    assert!(s.add_credential("c24", "dev", &"x".repeat(24), 1).is_ok());
    assert_eq!(s.bump_owner_epoch("dev").unwrap(), 1);
    assert_eq!(s.bump_owner_epoch("dev").unwrap(), 2);
    assert!(s.bump_owner_epoch("nope").is_err());
}

#[test]
fn requeue_of_a_turn_with_a_cancel_request_cancels_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = seeded(dir.path());
    s.create_turn("t1", "s1", &json!([]), 10).unwrap();
    assert!(s.claim_turn("t1", "dev", 1, "run-1", 11).unwrap());
    s.request_cancel("t1", 12).unwrap();
    assert_eq!(s.requeue_turn("t1", 100, 13).unwrap(), TurnState::Cancelled);
    assert_eq!(s.turn("t1").unwrap().state, TurnState::Cancelled);
    assert!(s.claimable_turns(i64::MAX, 10).unwrap().is_empty());
    // The Session is free for a successor.
    s.create_turn("t2", "s1", &json!([]), 14).unwrap();
}

#[test]
fn turn_lifecycle_cursor_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = seeded(dir.path());
    let t = s.create_turn("t1", "s1", &json!([]), 10).unwrap();
    assert_eq!(t.state, TurnState::Queued);
    assert_eq!(
        s.create_turn("t2", "s1", &json!([]), 10)
            .unwrap_err()
            .code(),
        "session_busy"
    );
    assert_eq!(s.claimable_turns(10, 10).unwrap().len(), 1);
    assert!(s.claim_turn("t1", "dev", 1, "run-1", 11).unwrap());
    assert!(!s.claim_turn("t1", "dev", 1, "run-2", 11).unwrap());
    assert_eq!(s.session("s1").unwrap().started_turns, 1);
    assert_eq!(s.requeue_turn("t1", 100, 12).unwrap(), TurnState::Queued);
    assert!(s.claimable_turns(50, 10).unwrap().is_empty());
    assert_eq!(s.session("s1").unwrap().started_turns, 0);
    assert!(s.claim_turn("t1", "dev", 1, "run-1", 101).unwrap());
    assert!(s.advance_turn("t1", TurnState::Running, 102).is_err());
    s.advance_turn("t1", TurnState::Starting, 102).unwrap();
    s.advance_turn("t1", TurnState::Running, 103).unwrap();
    for i in 0..3 {
        assert_eq!(
            s.append_event("t1", "delta", &json!({"text": i}), 104)
                .unwrap(),
            i + 1
        );
    }
    let page = s.events("t1", 1, 10).unwrap();
    assert_eq!(page.iter().map(|e| e.sequence).collect::<Vec<_>>(), [2, 3]);
    let a = s.enqueue_input("t1", "in-a", &json!([]), 105).unwrap();
    let b = s.enqueue_input("t1", "in-b", &json!([]), 105).unwrap();
    assert_eq!((a.position, b.position), (0, 1));
    s.set_input_state("in-a", InputState::Delivering, None)
        .unwrap();
    s.set_input_state("in-a", InputState::Written, None)
        .unwrap();
    // `written` does not move the cursor; `accepted` does.
    assert_eq!(s.turn("t1").unwrap().input_cursor, 0);
    s.set_input_state("in-a", InputState::Accepted, None)
        .unwrap();
    assert_eq!(s.turn("t1").unwrap().input_cursor, 1);
    assert!(
        s.set_input_state("in-a", InputState::Unknown, None)
            .is_err()
    );
    let outcome = TurnOutcome {
        native_outcome: Some(crate::core_runtime::wire::Outcome::Completed),
        native_session_id: Some("ns-1".into()),
        ..TurnOutcome::default()
    };
    s.finish_turn("t1", TurnState::Completed, &outcome, 106)
        .unwrap();
    assert!(
        s.finish_turn("t1", TurnState::Failed, &outcome, 107)
            .is_err()
    );
    assert_eq!(s.inputs("t1").unwrap()[1].state, InputState::NotDelivered);
    assert_eq!(
        s.session("s1").unwrap().native_session_id.as_deref(),
        Some("ns-1")
    );
    assert!(s.enqueue_input("t1", "in-c", &json!([]), 108).is_err());
}

#[test]
fn write_reservation_blocks_successors_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut s = seeded(dir.path());
        s.reserve_write(&WriteReservation {
            reservation_id: "w1".into(),
            session_id: "s1".into(),
            path: "a.txt".into(),
            size: 3,
            sha256: "00".into(),
            state: WriteState::Reserved,
            created_at_ms: 1,
        })
        .unwrap();
    }
    let mut s = SqliteStore::open(dir.path()).unwrap();
    s.recover(2).unwrap();
    assert_eq!(s.open_write("s1").unwrap().unwrap().reservation_id, "w1");
    assert_eq!(
        s.create_turn("t1", "s1", &json!([]), 3).unwrap_err().code(),
        "write_reserved"
    );
    s.settle_write("w1", WriteState::Committed).unwrap();
    assert!(s.settle_write("w1", WriteState::Rejected).is_err());
    assert_eq!(
        s.write_reservation("s1", "w1").unwrap().state,
        WriteState::Committed
    );
    assert_eq!(
        s.write_reservation("other", "w1").unwrap_err().code(),
        "not_found"
    );
    s.create_turn("t1", "s1", &json!([]), 4).unwrap();
}

#[test]
fn interactions_are_routed_by_identity() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = seeded(dir.path());
    s.create_turn("t1", "s1", &json!([]), 1).unwrap();
    let rec = InteractionRecord {
        turn_id: "t1".into(),
        interaction_id: "perm-1".into(),
        kind: InteractionKind::Permission,
        request: json!({"tool_name": "shell"}),
        state: InteractionState::Pending,
        answer: None,
        delivery_id: None,
    };
    s.record_interaction(&rec).unwrap();
    s.record_interaction(&rec).unwrap();
    assert!(
        s.interaction("t1", "perm-1", InteractionKind::UserChoice)
            .is_err()
    );
    s.answer_interaction(
        "t1",
        "perm-1",
        InteractionKind::Permission,
        &json!({"decision": "allow"}),
        "d1",
    )
    .unwrap();
    assert!(
        s.answer_interaction(
            "t1",
            "perm-1",
            InteractionKind::Permission,
            &json!({}),
            "d2"
        )
        .is_err()
    );
    s.settle_interaction(
        "t1",
        "perm-1",
        InteractionKind::Permission,
        InteractionState::Applied,
    )
    .unwrap();
    assert_eq!(
        s.interactions("t1").unwrap()[0].state,
        InteractionState::Applied
    );
    // A duplicate, conflicting acknowledgement cannot re-settle it.
    assert!(matches!(
        s.settle_interaction(
            "t1",
            "perm-1",
            InteractionKind::Permission,
            InteractionState::NotApplied,
        ),
        Err(StoreError::InvalidState(_))
    ));
    assert_eq!(
        s.interactions("t1").unwrap()[0].state,
        InteractionState::Applied
    );
}

#[test]
fn reopen_after_drop_keeps_everything_and_recovers_without_replay() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut s = seeded(dir.path());
        s.create_turn("t1", "s1", &json!([{"role": "user"}]), 1)
            .unwrap();
        assert!(s.claim_turn("t1", "dev", 1, "run-1", 2).unwrap());
        s.advance_turn("t1", TurnState::Starting, 3).unwrap();
        s.advance_turn("t1", TurnState::Running, 4).unwrap();
        s.append_event("t1", "delta", &json!({"text": "hi"}), 5)
            .unwrap();
        s.enqueue_input("t1", "in-1", &json!([]), 6).unwrap();
        s.set_input_state("in-1", InputState::Delivering, None)
            .unwrap();
        s.insert_session(&SessionRecord {
            session_id: "s2".into(),
            agent_id: "a1".into(),
            environment_id: "e1".into(),
            frozen: json!({}),
            native_session_id: None,
            started_turns: 0,
            created_at_ms: 1,
        })
        .unwrap();
        s.create_turn("t2", "s2", &json!([]), 7).unwrap();
    }
    let mut s = SqliteStore::open(dir.path()).unwrap();
    let report = s.recover(10).unwrap();
    assert_eq!(report.stream_incomplete, vec!["t1".to_string()]);
    assert_eq!(report.inputs_unknown, 1);
    let t1 = s.turn("t1").unwrap();
    assert_eq!(t1.state, TurnState::Failed);
    assert_eq!(
        t1.outcome.error_code,
        Some(CoreErrorCode::EventStreamIncomplete)
    );
    assert_eq!(s.events("t1", 0, 10).unwrap().len(), 1);
    assert_eq!(s.inputs("t1").unwrap()[0].state, InputState::Unknown);
    // The never-dispatched Turn stays queued; nothing is re-sent.
    assert_eq!(s.turn("t2").unwrap().state, TurnState::Queued);
}

#[test]
fn recovery_drains_the_journal_for_the_classification() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut s = seeded(dir.path());
        s.create_turn("t1", "s1", &json!([]), 1).unwrap();
        assert!(s.claim_turn("t1", "dev", 1, "run-1", 2).unwrap());
        s.advance_turn("t1", TurnState::Starting, 3).unwrap();
        s.advance_turn("t1", TurnState::Running, 3).unwrap();
        // The error event is committed; the crash comes before its outcome update.
        s.append_event(
            "t1",
            "error",
            &json!({"message": "upstream refused", "code": "connection_failed", "http_status": 502}),
            4,
        )
        .unwrap();
    }
    let mut s = SqliteStore::open(dir.path()).unwrap();
    s.recover(10).unwrap();
    let outcome = s.turn("t1").unwrap().outcome;
    assert_eq!(
        outcome.error_code,
        Some(CoreErrorCode::EventStreamIncomplete)
    );
    assert_eq!(outcome.error_message.as_deref(), Some("upstream refused"));
    assert_eq!(outcome.engine_http_status, Some(502));
}

/// Environment variable that turns the test binary into the child of the kill -9 test.
const CHILD_ENV: &str = "CONTRACT_STORE_KILL_CHILD_DIR";

/// The child half of [`kill_9_loses_no_committed_record`]: commits records, reports
/// each commit on stdout, then keeps committing until it is SIGKILLed.
#[test]
fn kill_9_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    use std::io::Write;
    let mut s = seeded(Path::new(&dir));
    s.create_turn("t1", "s1", &json!([]), 1).unwrap();
    let mut out = std::io::stdout();
    for i in 0u64.. {
        let seq = s.append_event("t1", "delta", &json!({"i": i}), 2).unwrap();
        writeln!(out, "committed {seq}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn kill_9_loses_no_committed_record() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "core_runtime::store::sqlite::tests::kill_9_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut last = 0u64;
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("committed ") {
            last = n.parse().unwrap();
            if last >= 50 {
                break;
            }
        }
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(last >= 50, "child reported {last} commits");
    let mut s = SqliteStore::open(dir.path()).unwrap();
    let events = s.events("t1", 0, EVENTS_PAGE_MAX).unwrap();
    // Every commit the child reported is there, in order, without gaps.
    assert!(events.len() as u64 >= last);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.sequence, i as u64 + 1);
    }
    assert_eq!(s.turn("t1").unwrap().state, TurnState::Queued);
}

#[test]
fn the_data_directory_and_database_files_are_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let store = seeded(&dir);
    assert_eq!(mode(&dir), DATA_DIR_MODE);
    for file in ["core.sqlite3", "core.sqlite3-wal", "core.sqlite3-shm"] {
        assert_eq!(mode(&dir.join(file)), DATABASE_FILE_MODE, "{file}");
    }
    drop(store);
    // Existing files made readable by others are taken back on the next open.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        dir.join("core.sqlite3"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let _store = SqliteStore::open(&dir).unwrap();
    assert_eq!(mode(&dir), DATA_DIR_MODE);
    assert_eq!(mode(&dir.join("core.sqlite3")), DATABASE_FILE_MODE);
}

#[test]
fn the_event_bound_keeps_the_last_place_for_the_terminal_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = seeded(dir.path()).with_events_max(3);
    s.create_turn("t1", "s1", &json!([]), 10).unwrap();
    // Bound 3: two events, and the third place is the terminal event's.
    for i in 0..2 {
        s.append_event("t1", "delta", &json!({"text": i}), 11)
            .unwrap();
    }
    assert!(matches!(
        s.append_event("t1", "delta", &json!({"text": 2}), 11),
        Err(StoreError::LimitReached(_))
    ));
    assert_eq!(
        s.append_event("t1", "done", &json!({"outcome": "completed"}), 12)
            .unwrap(),
        3
    );
    // Past the bound nothing more, not even a second terminal event.
    assert!(matches!(
        s.append_event("t1", "done", &json!({"outcome": "completed"}), 12),
        Err(StoreError::LimitReached(_))
    ));
    let kinds: Vec<String> = s
        .events("t1", 0, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["delta", "delta", "done"]);
}

#[test]
fn a_batch_of_events_is_one_transaction_with_the_same_bound() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = seeded(dir.path()).with_events_max(4);
    s.create_turn("t1", "s1", &json!([]), 10).unwrap();
    s.append_event("t1", "delta", &json!({"text": "a"}), 11)
        .unwrap();
    let batch: Vec<(String, serde_json::Value)> = ["b", "c", "d"]
        .iter()
        .map(|t| ("delta".to_string(), json!({"text": t})))
        .chain([("done".to_string(), json!({"outcome": "completed"}))])
        .collect();
    // Bound 4: "a", then "b" and "c" (the fourth place is the terminal event's), "d"
    // dropped, and the terminal event kept.
    let appended = s.append_events("t1", &batch, 12).unwrap();
    assert_eq!(
        (appended.stored, appended.dropped, appended.last_sequence),
        (3, 1, 4)
    );
    let events = s.events("t1", 0, 10).unwrap();
    let seen: Vec<(u64, String)> = events
        .iter()
        .map(|e| (e.sequence, e.kind.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (1, "delta".to_string()),
            (2, "delta".to_string()),
            (3, "delta".to_string()),
            (4, "done".to_string())
        ]
    );
    assert_eq!(events[2].payload, json!({"text": "c"}));
    assert!(matches!(
        s.append_events("nope", &batch, 12),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(s.append_events("t1", &[], 12).unwrap().stored, 0);
}
