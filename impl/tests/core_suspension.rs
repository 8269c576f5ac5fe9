//! Integration tests of the suspension API of `contract-impl core serve`
//! (`POST /v1/environments/{id}/quiesce|resume`), against a scripted Runtime.

mod common;

use common::{Core, Runtime};
use serde_json::{Value, json};

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}/v1{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn quiesce_and_resume_forward_the_runtime_result() {
    let core = Core::start("");
    let api = core.api();
    let session = api.session("controlled", "self_hosted").await;
    let env = session.environment_id.clone();

    // No device connected.
    let (status, body) = post(
        &core.base,
        &format!("/environments/{env}/quiesce"),
        json!({}),
    )
    .await;
    assert_eq!((status, body["error"].as_str()), (503, Some("no_device")));

    let mut rt = Runtime::connect_with(&core.base, &["controlled"]).await;
    let base = core.base.clone();
    let e = env.clone();
    let call =
        tokio::spawn(
            async move { post(&base, &format!("/environments/{e}/quiesce"), json!({})).await },
        );
    // The Environment is initialized on the connection first, once.
    rt.initialize(&env).await;
    let quiesce = rt.expect("environment_quiesce").await;
    assert_eq!(quiesce["payload"], json!({"environment_id": env}));
    let sus = quiesce["id"].as_str().unwrap().to_string();
    assert!(!call.is_finished());
    rt.send(json!({"type": "environment_quiesced", "id": sus,
        "payload": {"environment_id": env, "status": "applied"}}))
        .await;
    let (status, body) = call.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"suspension_id": sus, "environment_id": env, "status": "applied"})
    );

    // Resume with another suspension ID: the Runtime's rejection is forwarded.
    let base = core.base.clone();
    let e = env.clone();
    let call = tokio::spawn(async move {
        post(
            &base,
            &format!("/environments/{e}/resume"),
            json!({"suspension_id": "sus-other"}),
        )
        .await
    });
    let resume = rt.expect("environment_resume").await;
    assert_eq!(resume["id"], "sus-other");
    rt.send(json!({"type": "environment_resumed", "id": "sus-other",
        "payload": {"environment_id": env, "status": "rejected", "error_code": "stale_suspension"}}))
        .await;
    let (status, body) = call.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"suspension_id": "sus-other", "environment_id": env, "status": "rejected",
               "error_code": "stale_suspension"})
    );

    // Bad requests before any frame.
    let (status, body) = post(
        &core.base,
        &format!("/environments/{env}/resume"),
        json!({}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, body) = post(
        &core.base,
        &format!("/environments/{env}/resume"),
        json!({"suspension_id": ""}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_request"))
    );
    let (status, _) = post(&core.base, "/environments/nope/quiesce", json!({})).await;
    assert_eq!(status, 404);
    let none = api.session("controlled", "none").await;
    let (status, body) = post(
        &core.base,
        &format!("/environments/{}/quiesce", none.environment_id),
        json!({}),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("no_workspace"))
    );

    // A lost connection before the answer: unavailable (the outcome is unknown).
    let base = core.base.clone();
    let e = env.clone();
    let call =
        tokio::spawn(
            async move { post(&base, &format!("/environments/{e}/quiesce"), json!({})).await },
        );
    rt.expect("environment_quiesce").await;
    rt.drop_transport();
    let (status, body) = call.await.unwrap();
    assert_eq!((status, body["error"].as_str()), (503, Some("unavailable")));
}
