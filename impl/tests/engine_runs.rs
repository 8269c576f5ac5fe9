//! The engine daemon's run operations over its real Unix socket, driven by the client
//! library (engine-protocol.md, "Operations", "Failure semantics", "Bounds and
//! backpressure"): start → follow, paging and `has_more`, replay → tail with events
//! appended during the switch, interactions, cancel, suspend/resume, signed snapshots
//! between two daemons sharing a key, fencing by epoch, a contained executor panic, a
//! slow reader, and SIGKILL with a restart.

mod engine_support;

use std::os::unix::fs::PermissionsExt;

use contract_impl::engine::client::{ClientError, Ownership};
use contract_impl::engine::proto::common::v1::Outcome;
use contract_impl::engine::proto::engine::v1 as pb;
use contract_impl::engine::session::{Session, SessionError, operation_id};
use engine_support::{Daemon, start, start_with};
use pb::run_event::Kind;
use tonic::Code;

fn scripted() -> pb::DefinitionRef {
    pb::DefinitionRef {
        id: "scripted".into(),
        revision: 1,
    }
}

/// Starts `program` of the scripted definition; its run ID.
async fn started(s: &mut Session, program: &str) -> String {
    s.start_run(scripted(), program, &operation_id())
        .await
        .unwrap()
        .run_id
}

/// The daemon's status a snapshot call ended with (not a refusal by the client).
fn status(e: SessionError) -> tonic::Status {
    match e {
        SessionError::Client(ClientError::Status(s)) => s,
        other => panic!("not the daemon's status: {other:?}"),
    }
}

async fn session(d: &Daemon) -> Session {
    Session::open(&d.socket, &d.token_file, &Ownership::New, &[])
        .await
        .unwrap()
}

async fn events(s: &mut Session, run: &str) -> Vec<pb::RunEvent> {
    let mut out = Vec::new();
    s.follow(run, 0, 512, true, |e| out.push(e.clone()))
        .await
        .unwrap();
    out
}

fn kinds(events: &[pb::RunEvent]) -> Vec<&'static str> {
    events
        .iter()
        .map(|e| match e.kind {
            Some(Kind::Started(_)) => "started",
            Some(Kind::Message(_)) => "message",
            Some(Kind::TurnCompleted(_)) => "turn",
            Some(Kind::ToolOutcome(_)) => "tool",
            Some(Kind::InteractionOpened(_)) => "opened",
            Some(Kind::InteractionClosed(_)) => "closed",
            Some(Kind::Suspended(_)) => "suspended",
            Some(Kind::Resumed(_)) => "resumed",
            Some(Kind::Terminal(_)) => "terminal",
            None => "none",
        })
        .collect()
}

fn outcome(events: &[pb::RunEvent]) -> (i32, String) {
    match events.last().and_then(|e| e.kind.clone()) {
        Some(Kind::Terminal(t)) => (
            t.outcome,
            t.uncertain.map(|u| u.sentinel).unwrap_or_default(),
        ),
        other => panic!("not terminal: {other:?}"),
    }
}

async fn wait_for_interaction(s: &mut Session, run: &str) -> pb::InteractionSnapshot {
    for _ in 0..500 {
        let snap = s.interactions(run).await.unwrap();
        if !snap.pending.is_empty() {
            return snap;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("no interaction opened")
}

#[tokio::test]
async fn a_run_starts_once_per_operation_and_is_followed_to_its_end() {
    let d = start();
    let mut s = session(&d).await;
    let op = operation_id();
    let started = s.start_run(scripted(), "hello", &op).await.unwrap();
    assert_eq!(started.initial_sequence, 1);
    assert!(started.plan_id.starts_with("plan-"));
    let again = s.start_run(scripted(), "hello", &op).await.unwrap();
    assert_eq!(
        again, started,
        "the same operation returns the original result"
    );
    let conflict = s.start_run(scripted(), "other", &op).await.unwrap_err();
    assert_eq!(conflict.code(), Code::InvalidArgument);
    assert!(
        conflict.message().starts_with("operation_conflict"),
        "{conflict:?}"
    );
    let ev = events(&mut s, &started.run_id).await;
    assert_eq!(kinds(&ev), ["started", "message", "turn", "terminal"]);
    assert_eq!(outcome(&ev).0, Outcome::Succeeded as i32);
    let unknown = s
        .start_run(
            pb::DefinitionRef {
                id: "scripted".into(),
                revision: 2,
            },
            "x",
            &operation_id(),
        )
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().starts_with("unknown_definition"));
    let bad = s
        .start_run(scripted(), "#!script\nsing", &operation_id())
        .await
        .unwrap_err();
    assert!(
        bad.message().starts_with("invalid_program: line 2"),
        "{bad:?}"
    );
}

#[tokio::test]
async fn pages_are_bounded_and_has_more_is_exactly_page_last_below_latest() {
    let d = start();
    let mut s = session(&d).await;
    let run = started(&mut s, "#!script\nrepeat 1100 x").await;
    let all = events(&mut s, &run).await;
    assert_eq!(all.len(), 1102);
    // Page by hand at the bound, one under it, and refuse one over it.
    for (after, max, want_events) in [
        (0u64, 512u32, 512usize),
        (512, 511, 511),
        (1100, 512, 2),
        (1102, 512, 0),
    ] {
        let mut stream = s
            .client
            .stream_events(pb::StreamEventsRequest {
                run_id: run.clone(),
                after_sequence: after,
                cursor: Some(pb::PageCursor {
                    max_events: max,
                    tail: false,
                }),
            })
            .await
            .unwrap()
            .into_inner();
        let mut n = 0;
        let mut control = None;
        while let Some(m) = stream.message().await.unwrap() {
            match m.frame.unwrap() {
                pb::stream_events_response::Frame::Event(_) => n += 1,
                pb::stream_events_response::Frame::Control(c) => control = Some(c),
            }
        }
        let c = control.unwrap();
        assert_eq!(n, want_events);
        assert_eq!(c.page_last_sequence, Some(after + n as u64));
        assert_eq!(
            c.has_more,
            c.page_last_sequence.unwrap() < c.latest_sequence
        );
        assert_eq!(c.latest_sequence, 1102);
        assert!(!c.tailing);
    }
    let over = s
        .client
        .stream_events(pb::StreamEventsRequest {
            run_id: run.clone(),
            after_sequence: 0,
            cursor: Some(pb::PageCursor {
                max_events: 513,
                tail: false,
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(over.code(), Code::InvalidArgument);
    let ahead = s
        .client
        .stream_events(pb::StreamEventsRequest {
            run_id: run.clone(),
            after_sequence: 1103,
            cursor: Some(pb::PageCursor {
                max_events: 1,
                tail: false,
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(ahead.code(), Code::OutOfRange);
}

#[tokio::test]
async fn replay_switches_to_tail_without_gap_and_interactions_resolve_once() {
    let d = start();
    let mut s = session(&d).await;
    let run = s
        .start_run(
            scripted(),
            "#!script\nsay a\nask q1 Proceed?\nsay b\nturn",
            &operation_id(),
        )
        .await
        .unwrap()
        .run_id;
    let snap = wait_for_interaction(&mut s, &run).await;
    assert_eq!(snap.pending[0].interaction_id, "q1");
    assert_eq!(snap.revision, 1);
    // Follow from the start: the replay reaches the head, the tail takes over, and the
    // events the answer causes arrive through the tail.
    let mut follower = s.clone();
    let run2 = run.clone();
    let follow = tokio::spawn(async move {
        let mut out = Vec::new();
        follower
            .follow(&run2, 0, 1, true, |e| out.push(e.clone()))
            .await
            .unwrap();
        out
    });
    let op = operation_id();
    let first = s.respond(&run, "q1", "\"yes\"", &op).await.unwrap();
    assert!(!first.deduplicated);
    let dup = s.respond(&run, "q1", "\"yes\"", &op).await.unwrap();
    assert!(dup.deduplicated, "the same operation is deduplicated");
    let stale = s
        .respond(&run, "q1", "\"yes\"", &operation_id())
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    assert!(
        stale.message().starts_with("stale_interaction"),
        "{stale:?}"
    );
    let ev = follow.await.unwrap();
    assert_eq!(
        kinds(&ev),
        [
            "started", "message", "opened", "closed", "message", "turn", "terminal"
        ]
    );
    let seqs: Vec<u64> = ev.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=7).collect::<Vec<_>>());
    let after = s.interactions(&run).await.unwrap();
    assert!(after.pending.is_empty());
    assert_eq!(after.revision, 2);
    let bad = s
        .respond(&run, "q1", "{not json", &operation_id())
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn cancel_is_idempotent_and_says_when_the_run_was_already_terminal() {
    let d = start();
    let mut s = session(&d).await;
    let run = started(&mut s, "#!script\nsay a\nhold").await;
    let op = operation_id();
    let first = s.cancel(&run, &op).await.unwrap();
    assert!(!first.already_terminal);
    assert_eq!(first.outcome, Outcome::Canceled as i32);
    assert_eq!(
        s.cancel(&run, &op).await.unwrap(),
        first,
        "same operation, same answer"
    );
    let second = s.cancel(&run, &operation_id()).await.unwrap();
    assert!(second.already_terminal);
    assert_eq!(second.outcome, Outcome::Canceled as i32);
    let ev = events(&mut s, &run).await;
    assert_eq!(outcome(&ev).0, Outcome::Canceled as i32);
}

#[tokio::test]
async fn an_epoch_change_fences_new_operations_but_keeps_committed_outcomes() {
    let d = start();
    let mut old = session(&d).await;
    let op = operation_id();
    let started = old.start_run(scripted(), "hi", &op).await.unwrap();
    let newer = Session::open(
        &d.socket,
        &d.token_file,
        &Ownership::Reconnect {
            client_id: old.session.client_id.clone(),
            epoch: old.session.epoch,
        },
        &[],
    )
    .await
    .unwrap();
    assert_eq!(newer.session.epoch, old.session.epoch + 1);
    let fenced = old
        .start_run(scripted(), "hi", &operation_id())
        .await
        .unwrap_err();
    assert_eq!(fenced.code(), Code::FailedPrecondition);
    assert!(fenced.message().starts_with("fenced"), "{fenced:?}");
    assert_eq!(old.start_run(scripted(), "hi", &op).await.unwrap(), started);
    let mut newer = newer;
    assert_eq!(
        newer.start_run(scripted(), "hi", &op).await.unwrap(),
        started
    );
}

#[tokio::test]
async fn an_executor_panic_is_one_secret_safe_uncertain_outcome() {
    let d = start();
    let mut s = session(&d).await;
    let run = s
        .start_run(
            scripted(),
            "#!script\nsay a\ntool deploy uncertain\npanic",
            &operation_id(),
        )
        .await
        .unwrap()
        .run_id;
    let ev = events(&mut s, &run).await;
    assert_eq!(kinds(&ev), ["started", "message", "tool", "terminal"]);
    let (o, sentinel) = outcome(&ev);
    assert_eq!(o, Outcome::Uncertain as i32);
    assert_eq!(sentinel, "engine.executor_panic");
    let text = format!("{ev:?}");
    assert!(
        !text.contains("scripted executor panic"),
        "no panic text reaches a client"
    );
    let Some(Kind::ToolOutcome(t)) = &ev[2].kind else {
        panic!()
    };
    assert_eq!(t.outcome, Outcome::Uncertain as i32);
}

fn key_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("snapshot-key.json");
    std::fs::write(
        &path,
        format!(
            r#"{{"scope_id":"{}","generation":2,"key":"{}"}}"#,
            "5a".repeat(32),
            "c3".repeat(32)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

#[tokio::test]
async fn suspend_export_and_import_into_a_daemon_sharing_the_key_preserves_the_run() {
    let keys = tempfile::tempdir().unwrap();
    let key = key_file(keys.path());
    let key_arg = key.to_str().unwrap();
    let a = start_with(
        tempfile::tempdir().unwrap(),
        &["--snapshot-key-file", key_arg],
    );
    let b = start_with(
        tempfile::tempdir().unwrap(),
        &["--snapshot-key-file", key_arg],
    );
    let stranger = start();
    let mut sa = session(&a).await;
    let run = started(&mut sa, "#!script\nsay one\nturn\nhold").await;
    // Not suspended yet (running or holding): nothing to export at this boundary.
    let not_yet = status(sa.export(&run).await.unwrap_err());
    assert_eq!(not_yet.code(), Code::FailedPrecondition, "{not_yet:?}");
    let suspended = sa.suspend(&run, &operation_id()).await.unwrap();
    assert_eq!(
        suspended.boundary_sequence, 3,
        "the completed turn's sequence"
    );
    let snapshot = sa.export(&run).await.unwrap();
    assert_eq!(snapshot.format_version, "v1alpha2");
    assert!(snapshot.suspended);
    let authority = snapshot.authority.clone().unwrap();
    assert_eq!(authority.scope_id, vec![0x5a; 32]);
    assert_eq!(authority.key_generation, 2);
    let mut sb = session(&b).await;
    let mut tampered = snapshot.clone();
    let last = tampered.state.len() - 2;
    tampered.state[last] ^= 1;
    let e = status(sb.import(tampered, &operation_id()).await.unwrap_err());
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let mut skew = snapshot.clone();
    skew.format_version = "v1alpha3".into();
    assert_eq!(
        status(sb.import(skew, &operation_id()).await.unwrap_err()).code(),
        Code::PermissionDenied
    );
    let mut st = session(&stranger).await;
    let e = status(
        st.import(snapshot.clone(), &operation_id())
            .await
            .unwrap_err(),
    );
    assert!(e.message().starts_with("unknown_snapshot_key"), "{e:?}");
    let op = operation_id();
    let imported = sb.import(snapshot.clone(), &op).await.unwrap();
    assert_eq!(imported.run_id, run, "the run ID is preserved");
    assert!(!imported.deduplicated);
    assert!(sb.import(snapshot.clone(), &op).await.unwrap().deduplicated);
    let again = status(sb.import(snapshot, &operation_id()).await.unwrap_err());
    assert_eq!(again.code(), Code::AlreadyExists);
    // Resume in B: the same run continues after the boundary, from sequence 5.
    sb.resume(&run, &operation_id()).await.unwrap();
    sb.cancel(&run, &operation_id()).await.unwrap();
    let mut tail = Vec::new();
    sb.follow(&run, 4, 10, true, |e| tail.push(e.clone()))
        .await
        .unwrap();
    assert_eq!(kinds(&tail), ["resumed", "terminal"]);
    assert_eq!(tail[0].sequence, 5);
    // History is not part of a snapshot: after_sequence 0 reads from the first retained
    // event (the proto's "0: from the first retained one"), and a cursor into the history
    // before it is a gap.
    let mut from_start = Vec::new();
    sb.follow(&run, 0, 10, false, |e| from_start.push(e.sequence))
        .await
        .unwrap();
    assert_eq!(from_start, [5, 6]);
    let gap = sb.follow(&run, 1, 10, false, |_| {}).await.unwrap_err();
    assert_eq!(
        gap.code(),
        Code::OutOfRange,
        "history is not part of a snapshot"
    );
    // In A the run is still suspended; resume and follow it there too.
    sa.resume(&run, &operation_id()).await.unwrap();
    let not = sa.resume(&run, &operation_id()).await.unwrap_err();
    assert!(not.message().starts_with("run_not_suspended"));
    sa.cancel(&run, &operation_id()).await.unwrap();
    let ev = events(&mut sa, &run).await;
    assert_eq!(
        kinds(&ev),
        [
            "started",
            "message",
            "turn",
            "suspended",
            "resumed",
            "terminal"
        ]
    );
}

#[tokio::test]
async fn minor_zero_clients_cannot_export() {
    let d = start();
    let mut c = contract_impl::engine::client::connect(&d.socket, &d.token_file)
        .await
        .unwrap();
    let mut req = pb::InitializeRequest {
        protocol: Some(contract_impl::engine::proto::common::v1::ProtocolVersion {
            major: 1,
            minor: 0,
        }),
        claim: Some(pb::OwnershipClaim {
            claim: Some(pb::ownership_claim::Claim::NewOwner(pb::NewOwner {})),
        }),
        ..Default::default()
    };
    req.client_build = None;
    let Some(pb::initialize_response::Result::Initialized(i)) =
        c.initialize(req).await.unwrap().into_inner().result
    else {
        panic!()
    };
    let e = c
        .export_snapshot(pb::ExportSnapshotRequest {
            run_id: "run-x".into(),
            session: Some(pb::ClientSession {
                client_id: i.client_id,
                epoch: i.epoch,
            }),
        })
        .await
        .unwrap_err();
    assert!(
        e.message().starts_with("capability_not_negotiated"),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_slow_reader_is_cut_off_with_its_last_sequence_and_the_run_goes_on() {
    let d = start();
    let mut s = session(&d).await;
    let run = started(&mut s, "#!script\nhold").await;
    // Tail from the head, then stop reading.
    let mut stream = s
        .client
        .stream_events(pb::StreamEventsRequest {
            run_id: run.clone(),
            after_sequence: 0,
            cursor: Some(pb::PageCursor {
                max_events: 512,
                tail: true,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    let mut seen = 0;
    while seen < 2 {
        stream.message().await.unwrap().unwrap();
        seen += 1; // started, control
    }
    // A second run floods nothing into this tail; resume the held run through many events.
    let flood = s
        .start_run(
            scripted(),
            "#!script\nrepeat 200000 some output line",
            &operation_id(),
        )
        .await
        .unwrap()
        .run_id;
    // Following it may itself be cut off as slow, and the daemon retains only
    // RETAINED_EVENTS_PER_RUN events of a run: what was pruned before the follower came
    // back is reported as missed, never silently skipped.
    let (mut n, mut missed) = (0u64, 0u64);
    let followed = s
        .follow_across_gaps(&flood, 0, 512, true, |_| n += 1, |a, b| missed += b - a + 1)
        .await
        .unwrap();
    assert_eq!(n + missed, 200_002, "{n} delivered, {missed} missed");
    assert!(followed.terminal.is_some());
    s.cancel(&run, &operation_id()).await.unwrap();
    // The idle tail of the first run saw only its own events: nothing to cut off.
    let mut rest = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        rest.push(m);
    }
    assert_eq!(rest.len(), 1, "the terminal event");
    // Now a reader that never reads while its run emits 200,000 events.
    let loud = s
        .start_run(
            scripted(),
            "#!script\nask go now\nrepeat 200000 some output line",
            &operation_id(),
        )
        .await
        .unwrap()
        .run_id;
    wait_for_interaction(&mut s, &loud).await;
    let mut stalled = s
        .client
        .stream_events(pb::StreamEventsRequest {
            run_id: loud.clone(),
            after_sequence: 0,
            cursor: Some(pb::PageCursor {
                max_events: 512,
                tail: true,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    s.respond(&loud, "go", "\"ok\"", &operation_id())
        .await
        .unwrap();
    let mut done = Vec::new();
    let end = s
        .follow_across_gaps(&loud, 0, 512, true, |e| done.push(e.sequence), |_, _| {})
        .await
        .unwrap();
    assert_eq!(
        end.last_sequence, 200_004,
        "the run finished while a reader stalled"
    );
    let mut delivered = 0u64;
    let status = loop {
        match stalled.message().await {
            Ok(Some(pb::StreamEventsResponse {
                frame: Some(pb::stream_events_response::Frame::Event(e)),
            })) => delivered = e.sequence,
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stalled reader was never cut off"),
            Err(s) => break s,
        }
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().starts_with("slow_reader"));
    let trailer: u64 = status
        .metadata()
        .get("engine-last-delivered-sequence")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        trailer, delivered,
        "the trailer names the last event delivered"
    );
    assert!(delivered < 200_004);
}

#[tokio::test]
async fn sigkill_loses_nothing_committed_and_a_restart_ends_running_runs_uncertain() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let mut d = start_with(dir, &[]);
    let mut s = session(&d).await;
    let held = s
        .start_run(
            scripted(),
            "#!script\nsay before\nturn\nsay mid\nhold",
            &operation_id(),
        )
        .await
        .unwrap()
        .run_id;
    let parked = s
        .start_run(
            scripted(),
            "#!script\nsay one\nturn\nhold\nsay after",
            &operation_id(),
        )
        .await
        .unwrap()
        .run_id;
    s.suspend(&parked, &operation_id()).await.unwrap();
    let op = operation_id();
    let done = s.start_run(scripted(), "finished", &op).await.unwrap();
    let done_events = events(&mut s, &done.run_id).await;
    // Wait until the held run's events are all committed, then SIGKILL.
    let mut n = 0;
    while n < 4 {
        n = 0;
        s.follow(&held, 0, 512, false, |_| n += 1).await.unwrap();
    }
    let client = s.session.clone();
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let dir = std::mem::replace(&mut d.dir, tempfile::tempdir().unwrap());
    drop(d);
    assert!(path.exists());
    let d = start_with(dir, &[]);
    let mut s = Session::open(
        &d.socket,
        &d.token_file,
        &Ownership::Reconnect {
            client_id: client.client_id,
            epoch: client.epoch,
        },
        &[],
    )
    .await
    .unwrap();
    assert_eq!(
        events(&mut s, &done.run_id).await,
        done_events,
        "committed history intact"
    );
    assert_eq!(
        s.start_run(scripted(), "finished", &op).await.unwrap(),
        done,
        "ledger intact"
    );
    let ev = events(&mut s, &held).await;
    assert_eq!(
        kinds(&ev),
        ["started", "message", "turn", "message", "terminal"]
    );
    assert_eq!(
        outcome(&ev),
        (Outcome::Uncertain as i32, "engine.daemon_restarted".into())
    );
    s.resume(&parked, &operation_id()).await.unwrap();
    let ev = events(&mut s, &parked).await;
    // The suspension released the hold: the program goes on after a restart too.
    assert_eq!(
        kinds(&ev),
        [
            "started",
            "message",
            "turn",
            "suspended",
            "resumed",
            "message",
            "terminal"
        ]
    );
    assert_eq!(outcome(&ev).0, Outcome::Succeeded as i32);
}

#[tokio::test]
async fn message_bounds_hold_at_their_edge_and_one_past_it() {
    use contract_impl::engine::daemon::{limits, operations};
    let d = start();
    let mut s = session(&d).await;
    // The initial message: exactly at the bound is served, one byte more refused.
    let at = "x".repeat(operations::INITIAL_MESSAGE_MAX_BYTES);
    s.start_run(scripted(), &at, &operation_id()).await.unwrap();
    let over = s
        .start_run(scripted(), &format!("{at}x"), &operation_id())
        .await
        .unwrap_err();
    assert_eq!(over.code(), Code::InvalidArgument);
    assert!(over.message().starts_with("message_too_large"), "{over:?}");
    // Past the encoded-request limit the decoder refuses it as a resource, not Internal.
    let huge = "y".repeat(limits::MAX_REQUEST_BYTES + 1);
    let e = s
        .start_run(scripted(), &huge, &operation_id())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // The daemon keeps serving.
    s.client.health(pb::HealthRequest {}).await.unwrap();
}

#[tokio::test]
async fn a_follower_across_pruned_events_is_told_what_it_missed() {
    let d = start_with(tempfile::tempdir().unwrap(), &["--retained-events", "5"]);
    let mut s = session(&d).await;
    let run = started(&mut s, "#!script\nrepeat 20 x\nturn\nhold").await;
    s.suspend(&run, &operation_id()).await.unwrap();
    // 20 deltas, the turn and the suspension: 23 events, of which 19..=23 are retained.
    // After 0 is "from the first retained one"; a cursor after 1 has missed 2..=18.
    let mut first = Vec::new();
    s.follow(&run, 0, 10, false, |e| first.push(e.sequence))
        .await
        .unwrap();
    assert_eq!(first, (19..=23).collect::<Vec<_>>());
    let strict = s.follow(&run, 1, 10, false, |_| {}).await.unwrap_err();
    assert_eq!(strict.code(), Code::OutOfRange);
    let (mut seen, mut gaps) = (Vec::new(), Vec::new());
    let end = s
        .follow_across_gaps(
            &run,
            1,
            10,
            false,
            |e| seen.push(e.sequence),
            |a, b| gaps.push((a, b)),
        )
        .await
        .unwrap();
    assert_eq!(gaps, vec![(2, 18)]);
    assert_eq!(seen, (19..=23).collect::<Vec<_>>());
    assert_eq!(end.last_sequence, 23);
}
