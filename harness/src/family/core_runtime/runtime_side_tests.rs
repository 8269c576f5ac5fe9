//! Side `runtime` against a fake Runtime: this very test executable, re-run with only
//! the `fake_runtime` test selected. That test is a no-op unless the launch contract's
//! environment is present, in which case it plays a (deliberately simple, optionally
//! misbehaving) Runtime; `CRH_FAKE` picks the behaviour. What the engine does with any
//! peer is tested in `crate::drive` without processes; these cases cover what only this
//! side has: the launch contract, the bootstrap/connect exchange, the controlled adapter,
//! the Envelope codec and the credential checks of HTTP requests and output.

use std::time::Duration;

use serde_json::{Value, json};

use super::super::FAMILY;
use super::super::all_capabilities;
use crate::drive::{DriveOutcome, FailureCode, Phase};
use crate::golden::EntryKind;
use crate::scenario::model::{ExitCodeSpec, HttpResponseSpec, Party, Scenario, Side, Step};

use crate::scenario::model::ScenarioConfig;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

fn heartbeat(mode: &str) -> String {
    let kinds = if mode == "undeclare" {
        json!([])
    } else if mode == "lacking" {
        let mut caps = all_capabilities();
        caps["message_items"] = json!(false);
        json!([{"agent_kind": "controlled", "available": true, "capabilities": caps}])
    } else {
        json!([{"agent_kind": "controlled", "available": true, "capabilities": all_capabilities()}])
    };
    json!({"type": "heartbeat", "id": "hb-1", "payload": {
        "runtime_version": "fake-1",
        "supported_agent_kinds": kinds
    }})
    .to_string()
}

async fn fake_main(mode: &str) {
    let env = |k: &str| std::env::var(k).unwrap();
    if mode == "exit" {
        eprintln!("fake runtime: refusing to start");
        std::process::exit(4);
    }
    let credential = env("CONTRACT_DAEMON_CREDENTIAL");
    if mode == "stdout_leak" {
        println!("fake runtime: debug credential={credential}");
    }
    let core = env("CONTRACT_CORE_URL");
    let device = env("CONTRACT_DEVICE_ID");
    let control = tokio::net::UnixStream::connect(env("CONTRACT_CONTROL_SOCKET"))
        .await
        .unwrap();
    let (control_read, mut control_write) = control.into_split();
    control_write
        .write_all(b"{\"hello\": {\"adapter\": \"controlled\", \"protocol\": 1}}\n")
        .await
        .unwrap();
    // Answer every control request with its seq and echo the op.
    tokio::spawn(async move {
        let mut lines = BufReader::new(control_read).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let req: Value = serde_json::from_str(&line).unwrap();
            let reply = json!({"seq": req["seq"], "ok": true, "result": {"op": req["op"]}});
            let _ = control_write
                .write_all(format!("{reply}\n").as_bytes())
                .await;
        }
    });
    let addr = core.trim_start_matches("http://").to_string();
    let body = json!({"device_id": device}).to_string();
    let mut auth = if mode == "noauth" {
        String::new()
    } else {
        format!("Authorization: Bearer {credential}\r\n")
    };
    if mode == "header_leak" {
        auth.push_str(&format!("X-Debug-Token: {credential}\r\n"));
    }
    let bootstrap_path = if mode == "path_leak" {
        // Percent-encode every byte of the credential into the path.
        let encoded: String = credential.bytes().map(|b| format!("%{b:02X}")).collect();
        format!("/api/v1/agent-daemon/bootstrap/{encoded}")
    } else {
        "/api/v1/agent-daemon/bootstrap".to_string()
    };
    let mut http = tokio::net::TcpStream::connect(&addr).await.unwrap();
    http.write_all(
        format!(
            "POST {bootstrap_path} HTTP/1.1\r\nHost: {addr}\r\n{auth}\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = String::new();
    http.read_to_string(&mut response).await.unwrap();
    let json_start = response.find("\r\n\r\n").unwrap() + 4;
    let answer: Value = serde_json::from_str(&response[json_start..]).unwrap();
    let mut url = format!(
        "{}?device_id={device}&version=1.0.0",
        answer["connection_url"].as_str().unwrap()
    );
    if mode == "leak" {
        url.push_str(&format!("&token={credential}"));
    }
    let mut request = url.into_client_request().unwrap();
    if mode == "protocol_leak" {
        request.headers_mut().insert(
            "sec-websocket-protocol",
            format!("v1, {credential}").parse().unwrap(),
        );
    }
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {credential}").parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    match mode {
        "badframe" => {
            let mut hb: Value = serde_json::from_str(&heartbeat(mode)).unwrap();
            hb["payload"]
                .as_object_mut()
                .unwrap()
                .remove("runtime_version");
            ws.send(Message::text(hb.to_string())).await.unwrap();
        }
        _ => ws.send(Message::text(heartbeat(mode))).await.unwrap(),
    }
    // Echo every text frame's id back as a delta; close when asked.
    while let Some(Ok(message)) = ws.next().await {
        if let Message::Text(text) = message {
            let frame: Value = serde_json::from_str(text.as_str()).unwrap_or_default();
            if frame["type"] == "prompt_cancel" {
                let delta =
                    json!({"type": "delta", "id": frame["id"], "payload": {"text": "echo"}});
                ws.send(Message::text(delta.to_string())).await.unwrap();
                // Frames after the last one a scenario expects.
                match mode {
                    "trailing" => {
                        let extra = json!({"type": "delta", "id": frame["id"], "payload": {"text": "late"}});
                        ws.send(Message::text(extra.to_string())).await.unwrap();
                    }
                    "trailing_heartbeat" => {
                        ws.send(Message::text(heartbeat(mode))).await.unwrap();
                    }
                    "trailing_leak" => {
                        let extra = json!({"type": "delta", "id": frame["id"], "payload": {"text": credential}});
                        ws.send(Message::text(extra.to_string())).await.unwrap();
                    }
                    _ => {}
                }
            }
        }
    }
}

/// The fake Runtime's entry point (a no-op in a normal test run).
#[test]
fn fake_runtime() {
    let Ok(mode) = std::env::var("CRH_FAKE") else {
        return;
    };
    if std::env::var_os("CONTRACT_CORE_URL").is_none() {
        return;
    }
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(fake_main(&mode));
}

fn scenario(steps: Vec<Step>) -> Scenario {
    Scenario {
        pending: Default::default(),
        requires: Default::default(),
        edges: Default::default(),
        family: FAMILY.into(),
        name: "driver_test".into(),
        summary: String::new(),
        covers: vec![],
        sides: None,
        config: ScenarioConfig::default(),
        steps,
        path: "driver_test.yaml".into(),
    }
}

async fn drive_fake(mode: &str, steps: Vec<Step>) -> DriveOutcome {
    let opts = super::super::self_as_target(
        &format!("CRH_FAKE={mode}"),
        "family::core_runtime::runtime_side::tests::fake_runtime",
    );
    super::super::drive(&scenario(steps), Side::Runtime, &opts).await
}

fn handshake() -> Step {
    Step::Handshake {
        heartbeat_interval_ms: None,
    }
}

/// The steps of a scenario that ends right after the echoed delta.
fn echo_steps() -> Vec<Step> {
    vec![
        handshake(),
        Step::Frame {
            party: Party::Core,
            frame: json!({"type": "prompt_cancel", "id": "$run", "payload": {"delivery_id": "d-1"}}),
        },
        Step::Frame {
            party: Party::Runtime,
            frame: json!({"type": "delta", "id": "$run", "payload": {"text": "echo"}}),
        },
    ]
}

/// One case: the fake's mode, the steps, and the failure (code, phase, substrings) or
/// `None` for a pass.
struct Case {
    mode: &'static str,
    steps: Vec<Step>,
    failure: Option<(FailureCode, Phase, Vec<&'static str>)>,
}

fn pass(mode: &'static str, steps: Vec<Step>) -> Case {
    Case {
        mode,
        steps,
        failure: None,
    }
}

fn fails(
    mode: &'static str,
    steps: Vec<Step>,
    code: FailureCode,
    phase: Phase,
    text: Vec<&'static str>,
) -> Case {
    Case {
        mode,
        steps,
        failure: Some((code, phase, text)),
    }
}

fn cases() -> Vec<Case> {
    use FailureCode as C;
    let exit = |code: Option<ExitCodeSpec>, stderr: Vec<&str>| Step::ExpectExit {
        code,
        stderr: stderr.into_iter().map(String::from).collect(),
    };
    vec![
        pass("ok", echo_steps()),
        fails(
            "ok",
            vec![
                handshake(),
                Step::Frame {
                    party: Party::Runtime,
                    frame: json!({"type": "delta"}),
                },
            ],
            C::Timeout,
            Phase::Step(2),
            vec![
                "scenario core_runtime/driver_test step 2 (runtime frame delta): expected {\"type\":\"delta\"}, got nothing within 1500ms",
            ],
        ),
        fails(
            "leak",
            vec![handshake()],
            C::CredentialLeak,
            Phase::Step(1),
            vec!["credential leaked in the URL"],
        ),
        fails(
            "noauth",
            vec![handshake()],
            C::Mismatch,
            Phase::Step(1),
            vec!["step 1 (handshake)", "no Authorization header"],
        ),
        fails(
            "undeclare",
            vec![handshake()],
            C::Mismatch,
            Phase::Step(1),
            vec![
                "the heartbeat's declaration is not the launch configuration's",
                "kind `controlled` is launched but not declared",
            ],
        ),
        fails(
            "badframe",
            vec![handshake()],
            C::SchemaViolation,
            Phase::Step(1),
            vec!["violates the wire schema (missing_field", "runtime_version"],
        ),
        fails(
            "exit",
            vec![handshake()],
            C::LaunchFailed,
            Phase::Launch,
            vec![
                "(launch)",
                "exited before it was ready",
                "fake runtime: refusing to start",
            ],
        ),
        pass(
            "exit",
            vec![exit(
                Some(ExitCodeSpec::Exact(4)),
                vec!["refusing", "to start"],
            )],
        ),
        pass("exit", vec![exit(Some(ExitCodeSpec::NonZero), vec![])]),
        fails(
            "exit",
            vec![exit(Some(ExitCodeSpec::Exact(3)), vec![])],
            C::TargetExit,
            Phase::Step(1),
            vec![
                "step 1 (expect_exit): expected the target to exit with code 3, it ended with exit status: 4",
            ],
        ),
        fails(
            "exit",
            vec![exit(
                None,
                vec!["refusing", "invalid_capability_declaration"],
            )],
            C::TargetExit,
            Phase::Step(1),
            vec!["expected the target's stderr to contain \"invalid_capability_declaration\""],
        ),
        fails(
            "ok",
            vec![exit(Some(ExitCodeSpec::NonZero), vec![])],
            C::TargetExit,
            Phase::Step(1),
            vec!["step 1 (expect_exit)", "became ready instead"],
        ),
        fails(
            "ok",
            vec![handshake(), exit(Some(ExitCodeSpec::Exact(0)), vec![])],
            C::Timeout,
            Phase::Step(2),
            vec![
                "step 2 (expect_exit): expected the target to exit with code 0 within 1500ms, it is still running",
            ],
        ),
        fails(
            "ok",
            vec![
                handshake(),
                Step::Frame {
                    party: Party::Core,
                    frame: json!({"type": "delta", "id": "x", "payload": {"text": "t"}}),
                },
            ],
            C::ScenarioInvalid,
            Phase::Step(2),
            vec!["step 2 (core frame delta)", "wrong_direction"],
        ),
        fails(
            "trailing",
            echo_steps(),
            C::TrailingOutput,
            Phase::AfterLastStep,
            vec![
                "scenario core_runtime/driver_test (after the last step): unexpected frame after the last step:",
                "late",
            ],
        ),
        pass("trailing_heartbeat", echo_steps()),
        fails(
            "trailing_leak",
            echo_steps(),
            C::CredentialLeak,
            Phase::AfterLastStep,
            vec!["credential leaked in a text frame"],
        ),
        fails(
            "header_leak",
            echo_steps(),
            C::CredentialLeak,
            Phase::Step(1),
            vec!["credential leaked in the x-debug-token header"],
        ),
        fails(
            "protocol_leak",
            echo_steps(),
            C::CredentialLeak,
            Phase::Step(1),
            vec!["credential leaked in the sec-websocket-protocol header"],
        ),
        fails(
            "path_leak",
            echo_steps(),
            C::CredentialLeak,
            Phase::Step(1),
            vec!["credential leaked in the URL of an HTTP POST request"],
        ),
        fails(
            "stdout_leak",
            echo_steps(),
            C::CredentialLeak,
            Phase::EndOfRun,
            vec!["credential leaked in the target's stdout"],
        ),
    ]
}

#[tokio::test]
async fn side_runtime_against_a_fake_runtime() {
    let mut problems = Vec::new();
    for (i, case) in cases().into_iter().enumerate() {
        let outcome = drive_fake(case.mode, case.steps).await;
        let text = outcome
            .failure
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let label = format!("case {i} ({})", case.mode);
        match (&case.failure, &outcome.failure) {
            (None, None) => {}
            (Some((code, phase, needles)), Some(f)) if f.code == *code && f.phase == *phase => {
                for needle in needles {
                    if !text.contains(needle) {
                        problems.push(format!("{label}: {needle:?} not in {text}"));
                    }
                }
            }
            (want, _) => problems.push(format!(
                "{label}: wanted {:?}, got {:?}: {text}\n{}",
                want.as_ref().map(|w| (w.0, w.1)),
                outcome.failure.as_ref().map(|f| (f.code, f.phase)),
                outcome.stderr_tail
            )),
        }
        for place in [&text, &outcome.stdout_tail, &outcome.stderr_tail] {
            if place.contains("crh-credential-") || place.contains("%63%72%68") {
                problems.push(format!("{label}: the credential is printed: {place}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[tokio::test]
async fn handshake_frames_and_native_are_recorded() {
    let mut steps = echo_steps();
    steps.extend([
        Step::Native {
            op: "report".into(),
            args: json!({}),
            expect: Some(json!({"op": "report"})),
        },
        Step::Silence(Duration::from_millis(50)),
        Step::Api(crate::scenario::model::ApiStep {
            call: crate::scenario::model::ApiCall {
                method: "GET".into(),
                path: "/v1/turns/$t".into(),
                query: None,
                body: None,
                scheme: None,
                credential: None,
            },
            expect: HttpResponseSpec {
                status: 200,
                body: None,
            },
            poll: false,
            id: None,
            wait: true,
        }),
        Step::ApiResult(crate::scenario::model::ApiResultStep {
            id: "files1".into(),
        }),
        Step::HalfClose {
            code: None,
            reason: None,
        },
    ]);
    let outcome = drive_fake("ok", steps).await;
    assert!(
        outcome.failure.is_none(),
        "{:?}\n{}",
        outcome.failure,
        outcome.stderr_tail
    );
    let labels: Vec<(&str, EntryKind)> = outcome
        .recording
        .entries
        .iter()
        .map(|e| (e.label.as_str(), e.kind))
        .collect();
    assert_eq!(
        labels,
        [
            ("bootstrap request", EntryKind::HttpRequest),
            ("connect request", EntryKind::HttpRequest),
            ("runtime frame", EntryKind::Frame),
            ("runtime frame", EntryKind::Frame),
            ("close", EntryKind::Close)
        ]
    );
    assert_eq!(
        outcome.recording.entries[0].body["authorization"],
        "Bearer <credential>"
    );
    assert_eq!(outcome.bindings.get("run"), Some(&json!("run-1")));
}

/// Without `--features`, the target is asked once: its first heartbeat's declaration of
/// kind `controlled` is what it supports, even where it declares less than the launch
/// configuration asked for (a Runtime's declaration says what it can do).
#[tokio::test]
async fn the_feature_probe_reads_the_heartbeat() {
    let probe = |mode: &str| {
        let opts = super::super::self_as_target(
            &format!("CRH_FAKE={mode}"),
            "family::core_runtime::runtime_side::tests::fake_runtime",
        );
        async move { crate::family::probe_features(FAMILY, Side::Runtime, &opts).await }
    };
    let all = probe("echo").await.expect("side runtime declares").unwrap();
    assert_eq!(
        all.len(),
        crate::scenario::families::CORE_RUNTIME_FEATURES.len()
    );
    assert!(all.values().all(|v| *v), "{all:?}");
    let lacking = probe("lacking")
        .await
        .expect("side runtime declares")
        .unwrap();
    assert_eq!(lacking.get("message_items"), Some(&false));
    assert_eq!(lacking.values().filter(|v| !**v).count(), 1);
    let opts = super::super::self_as_target("CRH_FAKE=echo", "none");
    assert!(
        crate::family::probe_features(FAMILY, Side::Core, &opts)
            .await
            .is_none()
    );
}

#[test]
fn declaration_differences_name_the_kind_and_field() {
    use super::super::runtime_side::declaration_difference;
    let caps = all_capabilities();
    let kind = |name: &str, available: bool, caps: Value| json!({"agent_kind": name, "available": available, "capabilities": caps});
    let launched = json!([
        kind("a", true, caps.clone()),
        kind("b", false, caps.clone())
    ]);
    // Any order is the same declaration.
    let swapped = json!([
        kind("b", false, caps.clone()),
        kind("a", true, caps.clone())
    ]);
    assert_eq!(declaration_difference(&launched, &swapped), None);
    let one = json!([kind("a", true, caps.clone())]);
    assert_eq!(
        declaration_difference(&launched, &one).unwrap(),
        "kind `b` is launched but not declared"
    );
    let mut fewer = caps.clone();
    fewer["usage"] = json!(false);
    let changed = json!([kind("a", true, fewer), kind("b", false, caps.clone())]);
    assert_eq!(
        declaration_difference(&launched, &changed).unwrap(),
        "kind `a` capabilities.usage: launched true, declared false"
    );
    let unavailable = json!([kind("a", false, caps.clone()), kind("b", false, caps)]);
    assert_eq!(
        declaration_difference(&launched, &unavailable).unwrap(),
        "kind `a` available: launched true, declared false"
    );
}
