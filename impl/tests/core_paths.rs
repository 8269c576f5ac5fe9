//! Integration test of connection replacement in `contract-impl core serve`, against a
//! scripted Runtime. The other paths beyond the happy path (preparation retry, active
//! input, cancel, interactions, connection loss, SIGKILL restart) are side-core
//! scenarios in `scenarios/core_runtime/`.

mod common;

use common::{Api, Core, DEVICE, Runtime, Started};
use serde_json::json;

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

// Stays a Rust test: it reads the owner epoch from the database and the replaced socket's Close (1000 `replaced`), which the harness leaves unread.
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
