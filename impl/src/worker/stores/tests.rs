use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;

fn id(s: &str) -> Identifier {
    Identifier::new(s).unwrap()
}

/// The reply to `request` as request `request_id` of execution `e1`.
fn ask(stores: &HostStores, request_id: &str, request: Value) -> Reply {
    let request: HostRequest = serde_json::from_value(request).unwrap();
    stores
        .handle("root", &id("e1"), &id(request_id), &request)
        .expect("a store request")
}

fn ok(reply: Reply) -> Value {
    match reply {
        Reply::Ok { value } => value,
        other => panic!("{other:?}"),
    }
}

fn code(reply: Reply) -> String {
    match reply {
        Reply::Error { code, .. } => code,
        other => panic!("{other:?}"),
    }
}

fn open(dir: &Path) -> HostStores {
    HostStores::open(dir, false).unwrap()
}

#[test]
fn a_work_item_is_originated_once_per_request_identity_and_outlives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let stores = open(dir.path());
    let request = json!({"method": "maintenance.originate", "purpose": "p", "reason": "r", "evidence_refs": ["event:1"]});
    let first = ok(ask(&stores, "r1", request.clone()));
    assert_eq!(first, json!({"work_item_id": "wi-1", "state": "open"}));
    assert_eq!(ok(ask(&stores, "r1", request.clone())), first);
    // The same identity with other content is refused; a new request is a new item.
    let other = json!({"method": "maintenance.originate", "purpose": "q", "reason": "r", "evidence_refs": ["event:1"]});
    assert_eq!(code(ask(&stores, "r1", other)), "request_conflict");
    assert_eq!(
        ok(ask(&stores, "r2", request.clone()))["work_item_id"],
        "wi-2"
    );
    drop(stores);
    let stores = open(dir.path());
    assert_eq!(ok(ask(&stores, "r1", request)), first);
}

#[test]
fn an_assessment_is_recorded_once() {
    let dir = tempfile::tempdir().unwrap();
    let stores = open(dir.path());
    let unknown =
        json!({"method": "maintenance.assess", "work_item_id": "wi-1", "outcome": "no-change"});
    assert_eq!(
        code(ask(&stores, "a0", unknown.clone())),
        "unknown_work_item"
    );
    ok(ask(
        &stores,
        "r1",
        json!({"method": "maintenance.originate", "purpose": "p", "reason": "r", "evidence_refs": []}),
    ));
    let assessed = ok(ask(&stores, "a1", unknown.clone()));
    assert_eq!(
        assessed,
        json!({"work_item_id": "wi-1", "state": "assessed", "outcome": "no-change"})
    );
    assert_eq!(ok(ask(&stores, "a2", unknown)), assessed);
    let other =
        json!({"method": "maintenance.assess", "work_item_id": "wi-1", "outcome": "changed"});
    assert_eq!(code(ask(&stores, "a3", other)), "already_assessed");
    // The retry of the originate now answers the item as it is.
    let again = ok(ask(
        &stores,
        "r1",
        json!({"method": "maintenance.originate", "purpose": "p", "reason": "r", "evidence_refs": []}),
    ));
    assert_eq!(again["state"], "assessed");
}

#[test]
fn orientation_stages_adopts_once_per_operation_and_answers_the_current_one() {
    let dir = tempfile::tempdir().unwrap();
    let stores = open(dir.path());
    let global = json!({"kind": "global"});
    assert_eq!(
        ok(ask(
            &stores,
            "q0",
            json!({"method": "orientation.current", "scope": global})
        )),
        json!({"scope": global, "adopted": null})
    );
    let stage = json!({"method": "orientation.stage", "candidate_id": "c", "text": "t", "target": "g", "scope": global});
    assert_eq!(
        ok(ask(&stores, "s1", stage.clone())),
        json!({"candidate_id": "c", "scope": global})
    );
    assert_eq!(
        ok(ask(&stores, "s2", stage)),
        json!({"candidate_id": "c", "scope": global})
    );
    let changed = json!({"method": "orientation.stage", "candidate_id": "c", "text": "u", "target": "g", "scope": global});
    assert_eq!(code(ask(&stores, "s3", changed)), "candidate_conflict");
    let bad = json!({"method": "orientation.stage", "candidate_id": "c c", "text": "t", "target": "g", "scope": global});
    assert_eq!(code(ask(&stores, "s4", bad)), "invalid_identifier");
    let adopt = json!({"method": "orientation.adopt", "candidate_id": "c", "operation_id": "op-1"});
    let first = ok(ask(&stores, "a1", adopt.clone()));
    assert_eq!(
        first,
        json!({"operation_id": "op-1", "candidate_id": "c", "scope": global, "previous": null})
    );
    assert_eq!(ok(ask(&stores, "a2", adopt)), first);
    assert_eq!(
        code(ask(
            &stores,
            "a3",
            json!({"method": "orientation.adopt", "candidate_id": "x", "operation_id": "op-2"})
        )),
        "unknown_candidate"
    );
    ok(ask(
        &stores,
        "s5",
        json!({"method": "orientation.stage", "candidate_id": "d", "text": "t2", "target": "g", "scope": global}),
    ));
    assert_eq!(
        code(ask(
            &stores,
            "a4",
            json!({"method": "orientation.adopt", "candidate_id": "d", "operation_id": "op-1"})
        )),
        "operation_conflict"
    );
    let second = ok(ask(
        &stores,
        "a5",
        json!({"method": "orientation.adopt", "candidate_id": "d", "operation_id": "op-2"}),
    ));
    assert_eq!(second["previous"], "c");
    drop(stores);
    let stores = open(dir.path());
    assert_eq!(
        ok(ask(
            &stores,
            "q1",
            json!({"method": "orientation.current", "scope": global})
        )),
        json!({"scope": global, "adopted": {"candidate_id": "d", "text": "t2", "target": "g", "operation_id": "op-2"}})
    );
}

#[test]
fn peers_take_requests_results_cancels_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let stores = open(dir.path());
    let peer = ok(ask(
        &stores,
        "o1",
        json!({"method": "agents.open", "mode": "independent", "evidence": ["e"]}),
    ));
    assert_eq!(
        peer,
        json!({"peer_id": "p-1", "mode": "independent", "state": "open", "requests": {"pending": 0, "resolved": 0, "cancelled": 0}, "evidence": ["e"]})
    );
    // The alias and the name are one request: a retry answers the same peer.
    assert_eq!(
        ok(ask(
            &stores,
            "o1",
            json!({"method": "peer.open", "mode": "independent", "evidence": ["e"]})
        )),
        peer
    );
    assert_eq!(
        code(ask(
            &stores,
            "o1",
            json!({"method": "peer.open", "mode": "other", "evidence": ["e"]})
        )),
        "request_conflict"
    );
    let send = json!({"method": "peer.message", "peer_id": "p-1", "request_id": "req-1", "content": "hi", "evidence": []});
    let sent = ok(ask(&stores, "s1", send.clone()));
    assert_eq!(
        sent,
        json!({"request_id": "req-1", "peer_id": "p-1", "state": "pending"})
    );
    assert_eq!(ok(ask(&stores, "s2", send)), sent);
    assert_eq!(
        code(ask(
            &stores,
            "s3",
            json!({"method": "peer.send", "peer_id": "p-1", "request_id": "req-1", "content": "other", "evidence": []})
        )),
        "request_conflict"
    );
    assert_eq!(
        code(ask(
            &stores,
            "s4",
            json!({"method": "peer.send", "peer_id": "p-9", "request_id": "req-9", "content": "hi", "evidence": []})
        )),
        "unknown_peer"
    );
    let result = json!({"method": "peer.result", "request_id": "req-1", "wait_ms": 0});
    assert_eq!(ok(ask(&stores, "w1", result.clone())), sent);
    let submit =
        json!({"method": "peer.submit_result", "request_id": "req-1", "result": {"answer": 42}});
    let resolved = json!({"request_id": "req-1", "peer_id": "p-1", "state": "resolved"});
    assert_eq!(ok(ask(&stores, "r1", submit.clone())), resolved);
    assert_eq!(ok(ask(&stores, "r2", submit)), resolved);
    assert_eq!(
        code(ask(
            &stores,
            "r3",
            json!({"method": "peer.submit_result", "request_id": "req-1", "result": {"answer": 41}})
        )),
        "result_conflict"
    );
    assert_eq!(
        ok(ask(&stores, "w2", result)),
        json!({"request_id": "req-1", "peer_id": "p-1", "state": "resolved", "result": {"answer": 42}})
    );
    assert_eq!(
        code(ask(
            &stores,
            "c1",
            json!({"method": "peer.cancel", "request_id": "req-1"})
        )),
        "request_resolved"
    );
    // A cancelled request takes no result.
    ok(ask(
        &stores,
        "s5",
        json!({"method": "peer.send", "peer_id": "p-1", "request_id": "req-2", "content": "hi", "evidence": []}),
    ));
    let cancelled = json!({"request_id": "req-2", "peer_id": "p-1", "state": "cancelled"});
    assert_eq!(
        ok(ask(
            &stores,
            "c2",
            json!({"method": "peer.cancel", "request_id": "req-2"})
        )),
        cancelled
    );
    assert_eq!(
        ok(ask(
            &stores,
            "c3",
            json!({"method": "peer.cancel", "request_id": "req-2"})
        )),
        cancelled
    );
    assert_eq!(
        code(ask(
            &stores,
            "r4",
            json!({"method": "peer.submit_result", "request_id": "req-2", "result": null})
        )),
        "request_cancelled"
    );
    assert_eq!(
        code(ask(
            &stores,
            "c4",
            json!({"method": "peer.cancel", "request_id": "nope"})
        )),
        "unknown_request"
    );
    assert_eq!(
        ok(ask(&stores, "l1", json!({"method": "peer.list"}))),
        json!({"peers": [{"peer_id": "p-1", "mode": "independent", "state": "open", "requests": {"pending": 0, "resolved": 1, "cancelled": 1}}]})
    );
    assert_eq!(
        code(ask(
            &stores,
            "g1",
            json!({"method": "peer.get", "peer_id": "p-2"})
        )),
        "unknown_peer"
    );
}

#[test]
fn a_stop_cancels_pending_requests_and_a_drain_waits_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let stores = open(dir.path());
    for (r, mode) in [("o1", "a"), ("o2", "b")] {
        ok(ask(
            &stores,
            r,
            json!({"method": "peer.open", "mode": mode, "evidence": []}),
        ));
    }
    for (peer, request) in [("p-1", "x1"), ("p-1", "x2"), ("p-2", "y1")] {
        ok(ask(
            &stores,
            request,
            json!({"method": "peer.send", "peer_id": peer, "request_id": request, "content": "c", "evidence": []}),
        ));
    }
    // Without drain: stopped at once, pending requests cancelled.
    let stopped = ok(ask(
        &stores,
        "t1",
        json!({"method": "peer.stop", "peer_id": "p-2", "drain": false}),
    ));
    assert_eq!(
        (
            stopped["state"].clone(),
            stopped["requests"]["cancelled"].clone()
        ),
        (json!("stopped"), json!(1))
    );
    assert_eq!(
        code(ask(
            &stores,
            "y2",
            json!({"method": "peer.send", "peer_id": "p-2", "request_id": "y2", "content": "c", "evidence": []})
        )),
        "peer_not_open"
    );
    // With drain: draining until the last pending request settles.
    let draining = ok(ask(
        &stores,
        "t2",
        json!({"method": "peer.stop", "peer_id": "p-1", "drain": true}),
    ));
    assert_eq!(
        (
            draining["state"].clone(),
            draining["requests"]["pending"].clone()
        ),
        (json!("draining"), json!(2))
    );
    assert_eq!(
        code(ask(
            &stores,
            "x3",
            json!({"method": "peer.send", "peer_id": "p-1", "request_id": "x3", "content": "c", "evidence": []})
        )),
        "peer_not_open"
    );
    // A retry of a request sent before the stop still answers it.
    assert_eq!(
        ok(ask(
            &stores,
            "x1",
            json!({"method": "peer.send", "peer_id": "p-1", "request_id": "x1", "content": "c", "evidence": []})
        ))["state"],
        "pending"
    );
    ok(ask(
        &stores,
        "r1",
        json!({"method": "peer.submit_result", "request_id": "x1", "result": 1}),
    ));
    assert_eq!(
        ok(ask(
            &stores,
            "g1",
            json!({"method": "peer.get", "peer_id": "p-1"})
        ))["state"],
        "draining"
    );
    ok(ask(
        &stores,
        "c1",
        json!({"method": "peer.cancel", "request_id": "x2"}),
    ));
    drop(stores);
    let stores = open(dir.path());
    let peer = ok(ask(
        &stores,
        "g2",
        json!({"method": "peer.get", "peer_id": "p-1"}),
    ));
    assert_eq!(peer["state"], "stopped");
    assert_eq!(
        peer["requests"],
        json!({"pending": 0, "resolved": 1, "cancelled": 1})
    );
    assert_eq!(
        ok(ask(
            &stores,
            "t3",
            json!({"method": "peer.stop", "peer_id": "p-1", "drain": false})
        )),
        peer
    );
}

#[test]
fn wait_ms_is_bounded_and_a_wait_ends_when_the_result_comes() {
    let dir = tempfile::tempdir().unwrap();
    let stores = Arc::new(open(dir.path()));
    ok(ask(
        &stores,
        "o1",
        json!({"method": "peer.open", "mode": "m", "evidence": []}),
    ));
    ok(ask(
        &stores,
        "s1",
        json!({"method": "peer.send", "peer_id": "p-1", "request_id": "q", "content": "c", "evidence": []}),
    ));
    let at =
        json!({"method": "peer.result", "request_id": "q", "wait_ms": PEER_RESULT_WAIT_MS_MAX});
    let past =
        json!({"method": "peer.result", "request_id": "q", "wait_ms": PEER_RESULT_WAIT_MS_MAX + 1});
    assert_eq!(code(ask(&stores, "w0", past.clone())), "wait_out_of_range");
    let past: HostRequest = serde_json::from_value(past).unwrap();
    assert!(stores.start(&past).is_none());
    let at: HostRequest = serde_json::from_value(at).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let waiting = tokio::spawn(stores.start(&at).expect("a wait"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        ok(ask(&stores, "r1", json!({"method": "peer.submit_result", "request_id": "q", "result": "done"})));
        let reply = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert_eq!(ok(reply)["result"], "done");
        // A short wait on a pending request ends pending.
        ok(ask(&stores, "s2", json!({"method": "peer.send", "peer_id": "p-1", "request_id": "q2", "content": "c", "evidence": []})));
        let short: HostRequest = serde_json::from_value(json!({"method": "peer.result", "request_id": "q2", "wait_ms": 20})).unwrap();
        let reply = stores.start(&short).expect("a wait").await;
        assert_eq!(ok(reply)["state"], "pending");
        let unknown: HostRequest = serde_json::from_value(json!({"method": "peer.result", "request_id": "nope", "wait_ms": 20})).unwrap();
        assert_eq!(code(stores.start(&unknown).expect("a wait").await), "unknown_request");
    });
}

#[test]
fn every_kind_is_capped_and_texts_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let caps = Caps {
        work_items: 1,
        candidates: 1,
        adoptions: 1,
        peers: 1,
        peer_requests: 1,
    };
    let stores = HostStores::open_with(dir.path(), false, caps).unwrap();
    let global = json!({"kind": "global"});
    ok(ask(
        &stores,
        "m1",
        json!({"method": "maintenance.originate", "purpose": "p", "reason": "r", "evidence_refs": []}),
    ));
    assert_eq!(
        code(ask(
            &stores,
            "m2",
            json!({"method": "maintenance.originate", "purpose": "p", "reason": "r", "evidence_refs": []})
        )),
        "store_full"
    );
    ok(ask(
        &stores,
        "s1",
        json!({"method": "orientation.stage", "candidate_id": "a", "text": "t", "target": "g", "scope": global}),
    ));
    assert_eq!(
        code(ask(
            &stores,
            "s2",
            json!({"method": "orientation.stage", "candidate_id": "b", "text": "t", "target": "g", "scope": global})
        )),
        "store_full"
    );
    ok(ask(
        &stores,
        "a1",
        json!({"method": "orientation.adopt", "candidate_id": "a", "operation_id": "o1"}),
    ));
    assert_eq!(
        code(ask(
            &stores,
            "a2",
            json!({"method": "orientation.adopt", "candidate_id": "a", "operation_id": "o2"})
        )),
        "store_full"
    );
    ok(ask(
        &stores,
        "p1",
        json!({"method": "peer.open", "mode": "m", "evidence": []}),
    ));
    assert_eq!(
        code(ask(
            &stores,
            "p2",
            json!({"method": "peer.open", "mode": "m", "evidence": []})
        )),
        "store_full"
    );
    ok(ask(
        &stores,
        "q1",
        json!({"method": "peer.send", "peer_id": "p-1", "request_id": "q1", "content": "c", "evidence": []}),
    ));
    assert_eq!(
        code(ask(
            &stores,
            "q2",
            json!({"method": "peer.send", "peer_id": "p-1", "request_id": "q2", "content": "c", "evidence": []})
        )),
        "store_full"
    );
    // Bounded texts, at the bound and one past.
    let at = "x".repeat(TEXT_MAX_BYTES);
    let past = "x".repeat(TEXT_MAX_BYTES + 1);
    assert_eq!(
        code(ask(
            &stores,
            "q3",
            json!({"method": "peer.send", "peer_id": "p-1", "request_id": "q3", "content": past, "evidence": []})
        )),
        "too_large"
    );
    assert_eq!(
        code(ask(
            &stores,
            "r1",
            json!({"method": "peer.submit_result", "request_id": "q1", "result": past})
        )),
        "too_large"
    );
    // The JSON encoding of a string adds its two quotes.
    let result_at = "x".repeat(TEXT_MAX_BYTES - 2);
    ok(ask(
        &stores,
        "r2",
        json!({"method": "peer.submit_result", "request_id": "q1", "result": result_at}),
    ));
    assert_eq!(
        code(ask(
            &stores,
            "m3",
            json!({"method": "maintenance.originate", "purpose": past, "reason": "r", "evidence_refs": []})
        )),
        "too_large"
    );
    assert_eq!(
        ok(ask(
            &stores,
            "m4",
            json!({"method": "maintenance.assess", "work_item_id": "wi-1", "outcome": at})
        ))["state"],
        "assessed"
    );
}

#[test]
fn the_different_profile_names_codes_and_ids_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let stores = HostStores::open(dir.path(), true).unwrap();
    assert_eq!(
        ok(ask(
            &stores,
            "p1",
            json!({"method": "peer.open", "mode": "m", "evidence": []})
        ))["peer_id"],
        "peer-1"
    );
    assert_eq!(
        ok(ask(
            &stores,
            "m1",
            json!({"method": "maintenance.originate", "purpose": "p", "reason": "r", "evidence_refs": []})
        ))["work_item_id"],
        "work-item-1"
    );
    assert_eq!(
        code(ask(
            &stores,
            "g1",
            json!({"method": "peer.get", "peer_id": "nope"})
        )),
        "host-unknown-peer"
    );
}

#[test]
fn frontier_and_remote_are_not_store_requests_and_have_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let stores = open(dir.path());
    for request in [
        json!({"method": "frontier.select"}),
        json!({"method": "remote.ensure", "target": "t"}),
        json!({"method": "remote.call", "target": "t", "namespace_id": "n", "namespace_generation": "g", "operation_id": "o", "operation": "execute", "payload": {}}),
        json!({"method": "remote.cancel", "namespace_id": "n", "namespace_generation": "g", "operation_id": "o"}),
        json!({"method": "remote.close", "namespace_id": "n", "namespace_generation": "g"}),
    ] {
        let request: HostRequest = serde_json::from_value(request).unwrap();
        assert!(
            stores
                .handle("root", &id("e1"), &id("r"), &request)
                .is_none()
        );
        assert!(unsupported_reason(&request).is_some());
    }
}
