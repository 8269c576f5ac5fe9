//! Side `core` against a fake Core: this very test executable, re-run with only the
//! `fake_core` test selected (`CRH_FAKE_CORE` set). What the engine does with any peer is
//! tested in `crate::drive`; these cover the launch contract (readiness line), the
//! scripted Runtime's heartbeat and credential, and asynchronous `api:` calls.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::drive::DriveOutcome;
use crate::family::core_runtime::WS_LIMITS;
use crate::family::core_runtime::codec::schema_check;
use crate::scenario::model::{ApiCall, ApiStep, HttpResponseSpec, Side};
use crate::target::{LaunchSpec, RunDir, Target};
use contract_impl::core_runtime::wire::Direction;

#[test]
fn ready_lines_are_recognized() {
    assert_eq!(
        ready_base_url(br#"{"ready":{"base_url":"http://127.0.0.1:4000/"}}"#),
        Some("http://127.0.0.1:4000".into())
    );
    assert_eq!(ready_base_url(b"listening"), None);
    assert_eq!(ready_base_url(br#"{"ready":{"base_url":"ftp://x"}}"#), None);
    assert_eq!(ready_base_url(br#"{"ready":{}}"#), None);
}

#[test]
fn credentials_are_fresh_and_shaped() {
    let a = fresh_credential();
    let b = fresh_credential();
    assert_ne!(a, b);
    assert!(a.starts_with("rcd_") && a.len() == 36, "{a}");
    assert!(a[4..].chars().all(|c| c.is_ascii_hexdigit()));
}

#[test]
fn heartbeat_follows_the_launch_declarations() {
    let scenario = Scenario {
        pending: Default::default(),
        requires: Default::default(),
        edges: Default::default(),
        family: "core_runtime".into(),
        name: "x".into(),
        summary: String::new(),
        covers: vec![],
        sides: None,
        config: Default::default(),
        steps: vec![],
        path: "x.yaml".into(),
    };
    let hb = default_heartbeat(&scenario);
    schema_check(&hb, Direction::RuntimeToCore).unwrap();
    assert_eq!(hb["payload"]["runtime_version"], RUNTIME_VERSION);
    assert_eq!(
        hb["payload"]["supported_agent_kinds"][0]["agent_kind"],
        "controlled"
    );
    let mut custom = scenario.clone();
    custom.config.runtime = Some(json!({"agent_kinds": []}));
    assert_eq!(
        default_heartbeat(&custom)["payload"]["supported_agent_kinds"],
        json!([])
    );
}

// A fake Core for the driver tests: the same test binary, started by the driver as
// the target with `CRH_FAKE_CORE` set. It serves HTTP with the harness's own scripted
// server: `GET /v1/wait` is held until a `POST /v1/release` has arrived, then answered
// `200 {"path", "query"}`; the release itself gets `204`. Anything else: `404`.
async fn fake_core_main() {
    let mut server = crate::transport::http::ScriptedServer::start(WS_LIMITS)
        .await
        .unwrap();
    // libtest has printed `test … ` without a line end: start a fresh line.
    println!("\n{}", json!({"ready": {"base_url": server.base_url()}}));
    let mut held = Vec::new();
    // The held call may arrive after the release (its task races the next step).
    let mut released = false;
    while let Some(request) = server.next_request().await {
        match (request.method.as_str(), request.path.as_str()) {
            ("GET", "/v1/wait") => held.push(request),
            ("POST", "/v1/release") => {
                released = true;
                request.respond(204, None).unwrap();
            }
            _ => request
                .respond(404, Some(&json!({"error": "not_found"})))
                .unwrap(),
        }
        if released {
            for waiting in held.drain(..) {
                let body = json!({"path": waiting.path, "query": waiting.query});
                waiting.respond(200, Some(&body)).unwrap();
            }
        }
    }
}

/// The fake Core's entry point (a no-op in a normal test run).
#[test]
fn fake_core() {
    if std::env::var_os("CRH_FAKE_CORE").is_none() {
        return;
    }
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(fake_core_main());
}

async fn drive_fake_core(steps: Vec<Step>) -> DriveOutcome {
    let opts = super::super::self_as_target(
        "CRH_FAKE_CORE=1",
        "family::core_runtime::core_side::tests::fake_core",
    );
    let scenario = Scenario {
        pending: Default::default(),
        requires: Default::default(),
        edges: Default::default(),
        family: "core_runtime".into(),
        name: "driver_test".into(),
        summary: String::new(),
        covers: vec![],
        sides: Some(vec![Side::Core]),
        config: Default::default(),
        steps,
        path: "driver_test.yaml".into(),
    };
    super::super::drive(&scenario, Side::Core, &opts).await
}

fn call(method: &str, path: &str, query: Option<(&str, &str)>) -> ApiCall {
    ApiCall {
        method: method.into(),
        path: path.into(),
        query: query.map(|(k, v)| [(k.to_string(), v.to_string())].into()),
        body: None,
        scheme: None,
        credential: None,
    }
}

fn wait_step(id: Option<&str>, expect_body: Option<Value>) -> Step {
    Step::Api(ApiStep {
        call: call("GET", "/v1/wait", Some(("path", "a"))),
        expect: HttpResponseSpec {
            status: 200,
            body: expect_body,
        },
        poll: false,
        id: id.map(Into::into),
        wait: id.is_none(),
    })
}

fn release_step() -> Step {
    Step::Api(ApiStep {
        call: call("POST", "/v1/release", None),
        expect: HttpResponseSpec {
            status: 204,
            body: None,
        },
        poll: false,
        id: None,
        wait: true,
    })
}

fn failure_text(outcome: &DriveOutcome) -> String {
    outcome
        .failure
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default()
}

#[tokio::test]
async fn asynchronous_api_calls_run_while_later_steps_do() {
    // A first synchronous call, then one Core holds until a later step.
    let bind = Step::Api(ApiStep {
        call: call("GET", "/v1/unknown", None),
        expect: HttpResponseSpec {
            status: 404,
            body: Some(json!({"error": "$_"})),
        },
        poll: false,
        id: None,
        wait: true,
    });
    let outcome = drive_fake_core(vec![
        bind,
        Step::Api(ApiStep {
            call: call("GET", "/v1/wait", Some(("path", "src/a b.py"))),
            expect: HttpResponseSpec {
                status: 200,
                body: Some(json!({"path": "/v1/wait", "query": "$q"})),
            },
            poll: false,
            id: Some("files1".into()),
            wait: false,
        }),
        // The held call is answered only once this one arrives: a step that waited
        // for the first call's answer would never get here.
        release_step(),
        Step::ApiResult(crate::scenario::model::ApiResultStep {
            id: "files1".into(),
        }),
    ])
    .await;
    assert!(
        outcome.failure.is_none(),
        "{}\n{}",
        failure_text(&outcome),
        outcome.stderr_tail
    );
    assert_eq!(
        outcome.bindings.get("q"),
        Some(&json!("path=src%2Fa%20b.py"))
    );
    let steps: Vec<(usize, &str)> = outcome
        .recording
        .entries
        .iter()
        .map(|e| (e.step, e.label.as_str()))
        .collect();
    // The asynchronous answer is recorded at its `api_result` step.
    assert_eq!(
        steps,
        [
            (1, "api response"),
            (3, "api response"),
            (4, "api response")
        ]
    );
    assert_eq!(
        outcome.recording.entries[2].body["query"],
        json!({"path": "src/a b.py"})
    );
}

#[tokio::test]
async fn an_unanswered_asynchronous_call_fails_its_result_step() {
    let outcome = drive_fake_core(vec![
        wait_step(Some("files1"), None),
        Step::ApiResult(crate::scenario::model::ApiResultStep {
            id: "files1".into(),
        }),
    ])
    .await;
    let failure = outcome.failure.expect("the result step must time out");
    assert_eq!(failure.step(), Some(2));
    assert!(
        failure.message.contains("no answer within 1500ms"),
        "{}",
        failure.message
    );
    // A synchronous call that Core holds fails its own step.
    let outcome = drive_fake_core(vec![wait_step(None, None)]).await;
    let failure = outcome.failure.expect("the held call must time out");
    assert_eq!(failure.step(), Some(1));
    // An unknown ID (the loader refuses it; the driver still reports it).
    let outcome = drive_fake_core(vec![Step::ApiResult(
        crate::scenario::model::ApiResultStep { id: "nope".into() },
    )])
    .await;
    assert!(
        failure_text(&outcome).contains("no asynchronous api call `nope`"),
        "{}",
        failure_text(&outcome)
    );
}

#[tokio::test]
async fn readiness_skips_other_lines_and_bounds_them() {
    let run = RunDir::new().unwrap();
    let spec = |cmd: &str| LaunchSpec {
        command: cmd.into(),
        env: vec![],
        cwd: run.cwd(),
        secret: String::new(),
        capture_stdout: true,
        stdin_pipe: false,
    };
    let mut t = Target::spawn(&spec(
        "sh -c 'echo starting; echo {\\\"ready\\\":{\\\"base_url\\\":\\\"http://127.0.0.1:9\\\"}}; echo after; sleep 30'",
    ))
    .unwrap();
    let out = t.take_stdout_lines().unwrap();
    let url = t
        .await_ready(read_ready_line(out), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(url, "http://127.0.0.1:9");
    t.shutdown().await;
    let mut t = Target::spawn(&spec("sh -c 'echo nope; exit 0'")).unwrap();
    let out = t.take_stdout_lines().unwrap();
    let err = read_ready_line(out).await.unwrap_err();
    assert!(err.contains("stdout ended"), "{err}");
    t.shutdown().await;
}
