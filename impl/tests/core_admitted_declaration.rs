//! Integration test of "Each admitted Executor and Turn keeps the declaration it was
//! admitted under. Later heartbeats cannot add operations to an existing owner."
//! against a scripted Runtime.

mod common;

use common::{Core, Runtime, caps};
use serde_json::{Value, json};

/// A heartbeat declaring `controlled` with every capability except those in `off`.
fn heartbeat(off: &[&str]) -> Value {
    let mut c = caps();
    for f in off {
        c[*f] = json!(false);
    }
    json!({"type": "heartbeat", "id": "hb", "payload": {"runtime_version": "test",
        "supported_agent_kinds": [{"agent_kind": "controlled", "available": true, "capabilities": c}]}})
}

/// The Turn is claimed under `message_items: false`; a heartbeat widening it to
/// `true` arrives after the claim but before Core builds `execution_prepare` (while
/// the Environment initialization is pending). The Turn's `execution_prepare` must
/// follow the admitted declaration (no `observe_messages`); the next Turn, admitted
/// under the widened snapshot, gets `observe_messages: true` (so the heartbeat was
/// accepted, and the absence comes from the admission). If the Turn re-read the
/// connection snapshot instead of its admitted declaration, the first assertion fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_later_heartbeat_does_not_widen_an_admitted_turn() {
    let core = Core::start("");
    let api = core.api();
    let session = api.session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();
    let mut rt = Runtime::connect(&core.base).await;
    rt.send(heartbeat(&["message_items"])).await;

    let first = api.turn(&session, "one").await;
    let init = rt.expect("runtime_prepare").await;
    // Frames of one connection are dispatched in order: the widening heartbeat is
    // applied to the snapshot before the initialization result reaches the Turn.
    rt.send(heartbeat(&[])).await;
    rt.send(json!({"type": "runtime_prepare_result", "id": init["id"],
        "payload": {"phase": "initialized", "environment_id": env}}))
        .await;
    let run = rt.run().await;
    let config = &run.prepare["payload"]["configuration"];
    assert!(
        config.get("observe_messages").is_none(),
        "admitted under message_items=false, yet widened: {config}"
    );
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&first, "completed").await;

    // Control: a Turn admitted after the widening heartbeat observes messages.
    let second = api.turn(&session, "two").await;
    let run = rt.run().await;
    assert_eq!(
        run.prepare["payload"]["configuration"]["observe_messages"],
        json!(true),
        "{}",
        run.prepare
    );
    rt.event(&run, "done", json!({"outcome": "completed"}))
        .await;
    api.wait_state(&second, "completed").await;
}
