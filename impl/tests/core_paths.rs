//! Integration tests of the paths of `contract-impl core serve` beyond the happy path:
//! connection replacement, preparation retry, active input, cancel, interactions,
//! connection loss and SIGKILL restart. Core runs as a child process; a scripted
//! Runtime plays the daemon. Timers are shortened through `CONTRACT_CORE_CONFIG`.

mod common;

use common::{Api, Core, DEVICE, Runtime, Started, text_input};
use serde_json::{Value, json};

/// A running Turn on a fresh Core: (api, runtime, session, turn ID, run).
async fn running_turn(core: &Core) -> (Api, Runtime, common::Session, String, Started) {
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "none").await;
    let turn = api.turn(&session, "hello").await;
    let run = rt.run().await;
    api.wait_state(&turn, "running").await;
    (api, rt, session, turn, run)
}

#[tokio::test(flavor = "multi_thread")]
async fn replacement_connection_fences_the_old_owner() {
    let core = Core::start("");
    let (api, mut old, session, turn, run) = running_turn(&core).await;
    old.event(&run, "delta", json!({"text": "a"})).await;
    api.wait(&format!("/turns/{turn}/events"), |e| {
        e["events"].as_array().unwrap().len() == 1
    })
    .await;
    let epoch = core.owner_epoch(DEVICE);

    let mut new = Runtime::connect(&core.base).await;
    // The old socket is closed with 1000 `replaced`; its Turn lost its observation.
    assert_eq!(old.expect_close().await, (1000, "replaced".to_string()));
    assert_eq!(core.owner_epoch(DEVICE), epoch + 1);
    let t = api.wait_state(&turn, "failed").await;
    assert_eq!(t["outcome"]["error_code"], "event_stream_incomplete");

    // The old Run's routes are gone: its frames on the new connection change nothing.
    new.heartbeat(&["controlled"]).await;
    new.event(&run, "delta", json!({"text": "late"})).await;
    new.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    // A new Turn runs on the new connection; the old one is not replayed.
    let second = api.turn(&session, "again").await;
    let run2 = new.run().await;
    assert_ne!(run2.run_id, run.run_id);
    new.event(&run2, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&second, "completed").await;
    let t = api.get(&format!("/turns/{turn}")).await;
    assert_eq!(t["state"], "failed");
    assert_eq!(api.event_kinds(&turn).await, ["delta"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn preparation_capacity_requeues_and_other_rejections_fail_without_replay() {
    let core = Core::start(r#""preparation_retry_ms":200"#);
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let a = api.session("controlled", "none").await;
    let turn = api.turn(&a, "hello").await;

    let first = rt.expect("execution_prepare").await;
    rt.send(
        json!({"type": "preparation_status", "id": first["id"], "payload": {"status": "rejected",
        "operation": "prepare", "error_code": "preparation_capacity"}}),
    )
    .await;
    let t = api.wait_state(&turn, "queued").await;
    assert_eq!(t["run_id"], Value::Null);
    assert_eq!(t["outcome"]["error_code"], Value::Null);
    // The retry is a new preparation request for the same Session.
    let second = rt.expect("execution_prepare").await;
    assert_ne!(second["id"], first["id"]);
    assert_eq!(second["payload"], first["payload"]);
    rt.send(
        json!({"type": "preparation_status", "id": second["id"], "payload": {"status": "rejected",
        "operation": "prepare", "error_code": "unsupported_configuration"}}),
    )
    .await;
    let t = api.wait_state(&turn, "failed").await;
    assert_eq!(t["outcome"]["error_code"], "preparation_failed");
    assert_eq!(
        t["outcome"]["preparation_error_code"],
        "unsupported_configuration"
    );

    // Nothing is replayed: the next frame is the preparation of another Session's Turn.
    let b = api.session("controlled", "none").await;
    let other = api.turn(&b, "other").await;
    let next = rt.expect("execution_prepare").await;
    assert_eq!(next["payload"]["session_id"], json!(b.session_id));
    // A start rejection also fails the Turn without replay.
    rt.send(
        json!({"type": "preparation_status", "id": next["id"], "payload": {"status": "ready",
        "admission_handle": "hb1", "revision": 1, "executor_id": "exe1", "expires_in_ms": 300000}}),
    )
    .await;
    let start = rt.expect("execution_start").await;
    rt.send(
        json!({"type": "preparation_status", "id": start["id"], "payload": {"status": "rejected",
        "operation": "start", "error_code": "admission_expired", "admission_handle": "hb1"}}),
    )
    .await;
    let t = api.wait_state(&other, "failed").await;
    assert_eq!(t["outcome"]["preparation_error_code"], "admission_expired");
    assert_eq!(api.get(&format!("/turns/{turn}")).await["state"], "failed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_during_capacity_retry_cancels_instead_of_stranding_the_turn() {
    let core = Core::start(r#""preparation_retry_ms":100"#);
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let a = api.session("controlled", "none").await;
    let turn = api.turn(&a, "hello").await;
    let first = rt.expect("execution_prepare").await;
    // Cancel while claimed (preparing), then the Runtime reports no capacity.
    let (status, _) = api.post(&format!("/turns/{turn}/cancel"), json!({})).await;
    assert_eq!(status, 202);
    rt.send(
        json!({"type": "preparation_status", "id": first["id"], "payload": {"status": "rejected",
        "operation": "prepare", "error_code": "preparation_capacity"}}),
    )
    .await;
    api.wait_state(&turn, "cancelled").await;
    // The Session is free again.
    let next = api.turn(&a, "next").await;
    let run = rt.run().await;
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&next, "completed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn active_input_one_at_a_time_cursor_moves_only_on_accepted() {
    let core = Core::start(r#""written_receipt_ms":60000"#);
    let (api, mut rt, _s, turn, run) = running_turn(&core).await;
    let i1 = api.input(&turn, "one").await;
    let i2 = api.input(&turn, "two").await;
    let steer = rt.expect("prompt_steer").await;
    assert_eq!(steer["id"], run.run_id);
    assert_eq!(steer["payload"]["input_id"], json!(i1));
    assert_eq!(steer["payload"]["durable_receipt"], true);
    assert_eq!(steer["payload"]["input"], text_input("one"));
    rt.event(
        &run,
        "prompt_steer_ack",
        json!({"input_id": i1, "receipt": "written"}),
    )
    .await;
    let inputs = api
        .wait(&format!("/turns/{turn}/inputs"), |v| {
            v["inputs"][0]["state"] == "written"
        })
        .await;
    assert_eq!(inputs["input_cursor"], 0);
    assert_eq!(inputs["inputs"][1]["state"], "queued");
    // Input two is held back until one's receipt: the next frame Core sends is the
    // function result, not a second prompt_steer.
    rt.event(
        &run,
        "function_call",
        json!({"call_id": "c1", "name": "f", "arguments": {}}),
    )
    .await;
    api.wait(&format!("/turns/{turn}/interactions"), |v| {
        v["interactions"].as_array().unwrap().len() == 1
    })
    .await;
    let (status, _) = api
        .post(
            &format!("/turns/{turn}/function_results/c1"),
            json!({"output": "ok"}),
        )
        .await;
    assert_eq!(status, 202);
    rt.expect("function_result").await;
    // A receipt for another input ID is ignored.
    rt.event(
        &run,
        "prompt_steer_ack",
        json!({"input_id": i2, "receipt": "accepted"}),
    )
    .await;
    rt.event(
        &run,
        "prompt_steer_ack",
        json!({"input_id": i1, "receipt": "accepted"}),
    )
    .await;
    let steer2 = rt.expect("prompt_steer").await;
    assert_eq!(steer2["payload"]["input_id"], json!(i2));
    let inputs = api.inputs(&turn).await;
    assert_eq!(inputs["input_cursor"], 1);
    assert_eq!(inputs["inputs"][0]["state"], "accepted");
    // A failed receipt settles the input and leaves the cursor alone.
    rt.event(
        &run,
        "prompt_steer_ack",
        json!({"input_id": i2, "receipt": "failed",
        "error_code": "native_write_failed"}),
    )
    .await;
    let inputs = api
        .wait(&format!("/turns/{turn}/inputs"), |v| {
            v["inputs"][1]["state"] == "failed"
        })
        .await;
    assert_eq!(inputs["input_cursor"], 1);
    assert_eq!(inputs["inputs"][1]["error_code"], "native_write_failed");
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&turn, "completed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn active_input_without_written_in_budget_is_unknown_and_not_redelivered() {
    let core = Core::start(r#""written_receipt_ms":150"#);
    let (api, mut rt, _s, turn, run) = running_turn(&core).await;
    let i1 = api.input(&turn, "one").await;
    let i2 = api.input(&turn, "two").await;
    let steer = rt.expect("prompt_steer").await;
    assert_eq!(steer["payload"]["input_id"], json!(i1));
    let inputs = api
        .wait(&format!("/turns/{turn}/inputs"), |v| {
            v["inputs"][0]["state"] == "unknown"
        })
        .await;
    assert_eq!(inputs["input_cursor"], 0);
    assert_eq!(inputs["inputs"][1]["state"], "queued");
    // A late receipt does not move the cursor; nothing is redelivered.
    rt.event(
        &run,
        "prompt_steer_ack",
        json!({"input_id": i1, "receipt": "accepted"}),
    )
    .await;
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&turn, "completed").await;
    let inputs = api.inputs(&turn).await;
    assert_eq!(inputs["input_cursor"], 0);
    assert_eq!(inputs["inputs"][0]["state"], "unknown");
    assert_eq!(inputs["inputs"][1]["state"], "not_delivered");
    let _ = i2;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_receipt_owns_the_outcome_even_after_done() {
    let core = Core::start(r#""cancel_confirm_ms":60000"#);
    let (api, mut rt, _s, turn, run) = running_turn(&core).await;
    let (status, t) = api.post(&format!("/turns/{turn}/cancel"), json!({})).await;
    assert_eq!(status, 202, "{t}");
    assert_eq!(t["cancel_requested"], true);
    let cancel = rt.expect("prompt_cancel").await;
    assert_eq!(cancel["id"], run.run_id);
    let delivery = cancel["payload"]["delivery_id"].clone();
    // `done` does not settle a Turn whose cancel is pending.
    rt.event(
        &run,
        "done",
        json!({"outcome": "completed", "native_session_id": "ns-9"}),
    )
    .await;
    // A receipt with another delivery ID proves nothing.
    rt.event(
        &run,
        "interaction_decision_ack",
        json!({"operation": "prompt_cancel",
        "delivery_id": "cancel-other", "applied": true}),
    )
    .await;
    rt.event(
        &run,
        "interaction_decision_ack",
        json!({"operation": "prompt_cancel",
        "delivery_id": delivery, "applied": true, "snapshot": {"text": "partial"}}),
    )
    .await;
    let t = api.wait_state(&turn, "cancelled").await;
    assert_eq!(t["outcome"]["snapshot_text"], "partial");
    assert_eq!(t["outcome"]["error_code"], Value::Null);
    assert_eq!(api.event_kinds(&turn).await, ["done"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_without_receipt_is_unconfirmed() {
    let core = Core::start(r#""cancel_confirm_ms":150"#);
    let (api, mut rt, _s, turn, run) = running_turn(&core).await;
    api.post(&format!("/turns/{turn}/cancel"), json!({})).await;
    rt.expect("prompt_cancel").await;
    rt.event(&run, "done", json!({"outcome": "cancelled"}))
        .await;
    let t = api.wait_state(&turn, "failed").await;
    assert_eq!(t["outcome"]["error_code"], "cancel_unconfirmed");
    assert_eq!(t["outcome"]["native_outcome"], "cancelled");
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_requested_before_started_is_sent_once_started() {
    let core = Core::start(r#""cancel_confirm_ms":60000"#);
    let api = core.api();
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let session = api.session("controlled", "none").await;
    let turn = api.turn(&session, "hello").await;
    let run = rt.prepare_and_start().await;
    api.wait_state(&turn, "starting").await;
    api.post(&format!("/turns/{turn}/cancel"), json!({})).await;
    rt.started(&run).await;
    let cancel = rt.expect("prompt_cancel").await;
    rt.event(
        &run,
        "interaction_decision_ack",
        json!({"operation": "prompt_cancel",
        "delivery_id": cancel["payload"]["delivery_id"], "applied": true}),
    )
    .await;
    api.wait_state(&turn, "cancelled").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn answers_settle_only_on_an_ack_with_the_same_delivery_id() {
    let core = Core::start("");
    let (api, mut rt, _s, turn, run) = running_turn(&core).await;
    let path = format!("/turns/{turn}/interactions");

    // Permission.
    rt.event(
        &run,
        "permission_request",
        json!({"request_id": "perm-1", "tool_name": "shell",
        "description": "run ls"}),
    )
    .await;
    api.wait(&path, |v| v["interactions"].as_array().unwrap().len() == 1)
        .await;
    let (status, answer) = api
        .post(
            &format!("/turns/{turn}/permissions/perm-1"),
            json!({"decision": "allow"}),
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let (status, again) = api
        .post(
            &format!("/turns/{turn}/permissions/perm-1"),
            json!({"decision": "deny"}),
        )
        .await;
    assert_eq!(
        (status, again["error"].as_str()),
        (409, Some("already_answered"))
    );
    let decision = rt.expect("permission_decision").await;
    assert_eq!(decision["id"], "perm-1");
    assert_eq!(decision["payload"]["decision"], "allow");
    assert_eq!(decision["payload"]["delivery_id"], answer["delivery_id"]);
    rt.send(
        json!({"type": "interaction_decision_ack", "id": "perm-1", "payload": {
        "operation": "permission_decision", "delivery_id": "delivery-stale", "applied": true}}),
    )
    .await;

    // User choice (its ack, sent after the stale one, proves the stale one was handled).
    rt.event(&run, "prompt_for_user_choice", json!({"ask_id": "ask-1", "questions": [
        {"question_id": "q1", "header": "H", "question": "Pick", "options": [{"label": "a"}, {"label": "b"}],
         "multi_select": false}]}))
        .await;
    api.wait(&path, |v| v["interactions"].as_array().unwrap().len() == 2)
        .await;
    let (status, bad) = api
        .post(
            &format!("/turns/{turn}/user_choices/ask-1"),
            json!({"question_answers": [{"question_id": "q9", "answers": ["a"]}]}),
        )
        .await;
    assert_eq!(
        (status, bad["error"].as_str()),
        (400, Some("invalid_decision"))
    );
    let (status, choice) = api
        .post(
            &format!("/turns/{turn}/user_choices/ask-1"),
            json!({"question_answers": [{"question_id": "q1", "answers": ["b"]}]}),
        )
        .await;
    assert_eq!(status, 202, "{choice}");
    let decision = rt.expect("prompt_for_user_choice_decision").await;
    assert_eq!(decision["id"], "ask-1");
    assert_eq!(
        decision["payload"]["question_answers"],
        json!([{"question_id": "q1", "answers": ["b"]}])
    );
    rt.send(
        json!({"type": "interaction_decision_ack", "id": "ask-1", "payload": {
        "operation": "prompt_for_user_choice_decision", "delivery_id": choice["delivery_id"],
        "applied": false, "error_code": "invalid_decision"}}),
    )
    .await;
    let v = api
        .wait(&path, |v| v["interactions"][1]["state"] == "not_applied")
        .await;
    assert_eq!(v["interactions"][0]["state"], "delivering", "{v}");
    rt.send(json!({"type": "interaction_decision_ack", "id": "perm-1", "payload": {
        "operation": "permission_decision", "delivery_id": answer["delivery_id"], "applied": true}}))
        .await;
    api.wait(&path, |v| v["interactions"][0]["state"] == "applied")
        .await;

    // Function result: the ack names the Run and the call.
    rt.event(
        &run,
        "function_call",
        json!({"call_id": "call-1", "name": "f", "arguments": {"x": 1}}),
    )
    .await;
    api.wait(&path, |v| v["interactions"].as_array().unwrap().len() == 3)
        .await;
    let (status, result) = api
        .post(
            &format!("/turns/{turn}/function_results/call-1"),
            json!({"output": "42", "is_error": false}),
        )
        .await;
    assert_eq!(status, 202);
    let frame = rt.expect("function_result").await;
    assert_eq!(frame["id"], run.run_id);
    assert_eq!(
        frame["payload"],
        json!({"call_id": "call-1", "delivery_id": result["delivery_id"], "output": "42", "is_error": false})
    );
    rt.event(
        &run,
        "interaction_decision_ack",
        json!({"operation": "function_result",
        "delivery_id": "delivery-other", "applied": true, "call_id": "call-1"}),
    )
    .await;
    rt.event(
        &run,
        "interaction_decision_ack",
        json!({"operation": "function_result",
        "delivery_id": result["delivery_id"], "applied": true, "call_id": "call-1"}),
    )
    .await;
    let v = api
        .wait(&path, |v| v["interactions"][2]["state"] == "applied")
        .await;
    assert_eq!(v["interactions"][1]["state"], "not_applied");
    // A duplicate, conflicting ack after settlement changes nothing.
    rt.send(
        json!({"type": "interaction_decision_ack", "id": "ask-1", "payload": {
        "operation": "prompt_for_user_choice_decision", "delivery_id": choice["delivery_id"],
        "applied": true}}),
    )
    .await;
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&turn, "completed").await;
    let v = api.get(&path).await;
    assert_eq!(v["interactions"][1]["state"], "not_applied");
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnect_mid_run_fails_without_an_invented_terminal_event() {
    let core = Core::start("");
    let (api, mut rt, session, turn, run) = running_turn(&core).await;
    rt.event(&run, "delta", json!({"text": "par"})).await;
    rt.event(
        &run,
        "permission_request",
        json!({"request_id": "perm-1", "tool_name": "shell",
        "description": "d"}),
    )
    .await;
    api.wait(&format!("/turns/{turn}/interactions"), |v| {
        v["interactions"].as_array().unwrap().len() == 1
    })
    .await;
    rt.drop_transport();
    let t = api.wait_state(&turn, "failed").await;
    assert_eq!(t["outcome"]["error_code"], "event_stream_incomplete");
    assert_eq!(t["outcome"]["native_outcome"], Value::Null);
    assert_eq!(
        api.event_kinds(&turn).await,
        ["delta", "permission_request"]
    );
    let (status, err) = api
        .post(
            &format!("/turns/{turn}/permissions/perm-1"),
            json!({"decision": "allow"}),
        )
        .await;
    assert_eq!(
        (status, err["error"].as_str()),
        (409, Some("turn_not_active"))
    );

    // Lost before `started`: delivery unknown.
    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let second = api.turn(&session, "again").await;
    rt.prepare_and_start().await;
    api.wait_state(&second, "starting").await;
    rt.drop_transport();
    let t = api.wait_state(&second, "failed").await;
    assert_eq!(t["outcome"]["error_code"], "delivery_unknown");
    assert!(api.event_kinds(&second).await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_turn_loses_nothing_committed_and_replays_nothing() {
    let mut core = Core::start(r#""written_receipt_ms":60000"#);
    let (api, mut rt, _s, turn, run) = running_turn(&core).await;
    // A second Session's Turn stays queued: no connected device declares its kind.
    let other = api.session("other-kind", "none").await;
    let queued = api.turn(&other, "later").await;
    rt.event(&run, "delta", json!({"text": "Hi"})).await;
    let i1 = api.input(&turn, "one").await;
    let steer = rt.expect("prompt_steer").await;
    assert_eq!(steer["payload"]["input_id"], json!(i1));
    rt.event(
        &run,
        "prompt_steer_ack",
        json!({"input_id": i1, "receipt": "accepted"}),
    )
    .await;
    let i2 = api.input(&turn, "two").await;
    rt.expect("prompt_steer").await; // delivering, no receipt
    let i3 = api.input(&turn, "three").await;
    rt.event(
        &run,
        "permission_request",
        json!({"request_id": "perm-1", "tool_name": "shell",
        "description": "d"}),
    )
    .await;
    api.wait(&format!("/turns/{turn}/interactions"), |v| {
        v["interactions"].as_array().unwrap().len() == 1
    })
    .await;
    let (status, _) = api
        .post(
            &format!("/turns/{turn}/permissions/perm-1"),
            json!({"decision": "deny"}),
        )
        .await;
    assert_eq!(status, 202);
    rt.expect("permission_decision").await;
    api.wait(&format!("/turns/{turn}/inputs"), |v| {
        v["input_cursor"] == 1 && v["inputs"][1]["state"] == "delivering"
    })
    .await;

    core.restart();
    let api = core.api();
    let t = api.get(&format!("/turns/{turn}")).await;
    assert_eq!(t["state"], "failed");
    assert_eq!(t["outcome"]["error_code"], "event_stream_incomplete");
    assert_eq!(t["run_id"], run.run_id);
    assert_eq!(t["input"], text_input("hello"));
    assert_eq!(
        api.event_kinds(&turn).await,
        ["delta", "permission_request"]
    );
    let inputs = api.inputs(&turn).await;
    assert_eq!(inputs["input_cursor"], 1);
    let states: Vec<(&str, &str)> = inputs["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["input_id"].as_str().unwrap(),
                i["state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        states,
        [
            (i1.as_str(), "accepted"),
            (i2.as_str(), "unknown"),
            (i3.as_str(), "not_delivered")
        ]
    );
    let v = api.get(&format!("/turns/{turn}/interactions")).await;
    assert_eq!(v["interactions"][0]["state"], "unknown");
    assert_eq!(
        api.get(&format!("/turns/{queued}")).await["state"],
        "queued"
    );

    // A reconnecting Runtime gets the queued Turn, and nothing of the failed one.
    let mut rt = Runtime::connect_with(&core.base, &["controlled", "other-kind"]).await;
    let next = rt.run().await;
    assert_eq!(
        next.prepare["payload"]["session_id"],
        json!(other.session_id)
    );
    rt.event(&next, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&queued, "completed").await;
    assert_eq!(api.get(&format!("/turns/{turn}")).await["state"], "failed");
    // The failed Turn's old Run gets no route on the new process.
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    assert_eq!(
        api.event_kinds(&turn).await,
        ["delta", "permission_request"]
    );
}
