//! An in-memory fake peer and process, so the engine's step semantics (deadlines,
//! `any_order`, `silence`, trailing frames, placeholders across reconnects, exits,
//! crashes, secret scanning) are unit-tested without sockets or processes. Time is
//! tokio's paused clock: a scripted delay of an hour costs nothing.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::*;
use crate::scenario::model::{ExitCodeSpec, Party, RawMessage, Scenario, ScenarioConfig, Step};

/// The fake family's own event (an "HTTP request" stand-in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeRequest(pub String);

impl Describe for FakeRequest {
    fn describe(&self) -> String {
        format!("request {}", self.0)
    }
}

/// A codec of JSON objects with a string `type`; `tick` frames may trail.
struct FakeCodec;

fn typed(frame: &Value) -> Result<(), WireFault> {
    match frame.get("type") {
        Some(Value::String(_)) => Ok(()),
        _ => Err(WireFault {
            code: "missing_field".into(),
            message: "type".into(),
        }),
    }
}

impl Codec for FakeCodec {
    fn decode(&self, text: &str) -> Result<Value, WireFault> {
        contract_impl::wire::parse_strict(text.as_bytes()).map_err(|e| WireFault {
            code: e.code().into(),
            message: e.to_string(),
        })
    }
    fn check_emitted(&self, frame: &Value) -> Result<(), WireFault> {
        typed(frame)
    }
    fn check_outgoing(&self, frame: &Value) -> Result<(), WireFault> {
        typed(frame)
    }
    fn encode(&self, frame: &Value) -> Result<String, WireFault> {
        Ok(frame.to_string())
    }
    fn may_trail(&self, frame: &Value) -> bool {
        frame["type"] == "tick"
    }
    fn trailing_rule(&self) -> &'static str {
        "only ticks may follow the last step"
    }
}

/// What the fake peer sent, shared with the test.
type SentLog = Arc<Mutex<Vec<String>>>;

/// One scripted event: delivered `after` the previous one was.
struct Scripted {
    after: Duration,
    event: Event<FakeRequest>,
}

/// The fake connection: the script of what the target does, and what was sent.
struct FakeLink {
    script: VecDeque<Scripted>,
    connected: bool,
    /// Answer a Close the harness sends with a Close (after what is already queued).
    echo_close: bool,
    sent: SentLog,
}

struct FakePeer {
    link: FakeLink,
}

#[async_trait]
impl Connection for FakeLink {
    fn is_open(&self) -> bool {
        self.connected
    }
    fn abort(&mut self) -> bool {
        std::mem::replace(&mut self.connected, false)
    }
    async fn send(&mut self, message: Outgoing, _timeout: Duration) -> StepResult {
        if !self.connected {
            return Err(fail::not_connected("no connection"));
        }
        let text = match message {
            Outgoing::Text(text) => text,
            Outgoing::Binary(bytes) => format!("binary:{}", bytes.len()),
            Outgoing::TextBytes(bytes) => format!("text-bytes:{}", bytes.len()),
        };
        self.sent.lock().unwrap().push(text);
        Ok(())
    }
    async fn send_close(&mut self, code: u16, reason: &str, _timeout: Duration) -> StepResult {
        if !self.connected {
            return Err(fail::not_connected("no connection"));
        }
        self.sent
            .lock()
            .unwrap()
            .push(format!("close:{code}:{reason}"));
        if self.echo_close {
            self.script.push_back(Scripted {
                after: Duration::ZERO,
                event: Event::Close {
                    code: Some(code),
                    reason: String::new(),
                },
            });
        }
        Ok(())
    }
    async fn end(&mut self, _timeout: Duration) {
        self.connected = false;
    }
}

static ROLE: Role = Role {
    codec: &FakeCodec,
    target: Party::Runtime,
    plays: &[Party::Core],
    emitted_label: "runtime frame",
    target_name: "the target",
    refuses: &[],
};

#[async_trait]
impl Peer for FakePeer {
    type Other = FakeRequest;

    const ROLE: &'static Role = &ROLE;

    async fn recv(&mut self, timeout: Duration) -> StepResult<Option<Event<FakeRequest>>> {
        let link = &mut self.link;
        let Some(next) = link.script.front_mut() else {
            tokio::time::sleep(timeout).await;
            return Ok(None);
        };
        if next.after > timeout {
            next.after -= timeout;
            tokio::time::sleep(timeout).await;
            return Ok(None);
        }
        tokio::time::sleep(next.after).await;
        let event = link.script.pop_front().map(|s| s.event);
        if matches!(event, Some(Event::Eof)) {
            link.connected = false;
        }
        Ok(event)
    }
    fn leak_in_other(&self, other: &FakeRequest, secret: &str) -> Option<String> {
        other.0.contains(secret).then(|| "a fake request".into())
    }
    fn connection(&mut self) -> &mut dyn Connection {
        &mut self.link
    }
    fn trailing_other(&mut self, _other: FakeRequest) -> StepResult {
        Ok(())
    }
    async fn family_step(&mut self, _run: &mut Run, step: &Step) -> StepResult {
        match step {
            Step::Reconnect { .. } => {
                self.link.connected = true;
                self.link.sent.lock().unwrap().push("reconnect".into());
                Ok(())
            }
            other => Err(fail::unsupported(format!("fake: {}", other.keyword()))),
        }
    }
    fn crashed(&mut self) {
        self.link.connected = false;
    }
    async fn relaunch(&mut self, _startup: Duration) -> Result<Box<dyn Process>, String> {
        self.link.sent.lock().unwrap().push("relaunch".into());
        Ok(Box::new(FakeProcess::default()))
    }
    fn release(&mut self) {
        self.link.connected = false;
    }
}

#[derive(Default)]
struct FakeProcess {
    /// Exits with this code after this delay (`None`: runs until stopped).
    exit: Option<(Duration, i32)>,
    stderr: String,
    leak: Option<&'static str>,
}

#[async_trait]
impl Process for FakeProcess {
    async fn wait_exit(&mut self) -> Result<ExitStatus, String> {
        match self.exit {
            Some((after, code)) => {
                tokio::time::sleep(after).await;
                Ok(ExitStatus::from_raw(code << 8))
            }
            None => std::future::pending().await,
        }
    }
    async fn kill_now(&mut self) -> Result<ExitStatus, String> {
        Ok(ExitStatus::from_raw(9))
    }
    async fn shutdown(&mut self) -> Option<ExitStatus> {
        Some(ExitStatus::from_raw(0))
    }
    fn terminate(&self) {}
    fn leak_channel(&self) -> Option<&'static str> {
        self.leak
    }
    fn stderr_tail(&self) -> String {
        self.stderr.clone()
    }
    fn stdout_tail(&self) -> String {
        String::new()
    }
}

const SECRET: &str = "s3cr3t-credential";
const STEP: Duration = Duration::from_millis(500);

fn text(v: Value) -> Event<FakeRequest> {
    Event::Text(v.to_string())
}

fn now(event: Event<FakeRequest>) -> Scripted {
    Scripted {
        after: Duration::ZERO,
        event,
    }
}

fn later(ms: u64, event: Event<FakeRequest>) -> Scripted {
    Scripted {
        after: Duration::from_millis(ms),
        event,
    }
}

fn expect(frame: Value) -> Step {
    Step::Frame {
        party: Party::Runtime,
        frame,
    }
}

fn send(frame: Value) -> Step {
    Step::Frame {
        party: Party::Core,
        frame,
    }
}

/// `optional:` around a frame step.
fn maybe(step: Step) -> Step {
    Step::Optional(Box::new(step))
}

/// A 1 ms `silence`, so that a following `expect_exit` is not the first step.
fn pause() -> Step {
    Step::Silence(Duration::from_millis(1))
}

fn scenario(steps: Vec<Step>) -> Scenario {
    Scenario {
        pending: Default::default(),
        requires: Default::default(),
        edges: Default::default(),
        family: "fake".into(),
        name: "engine".into(),
        summary: String::new(),
        covers: vec![],
        sides: None,
        config: ScenarioConfig::default(),
        steps,
        path: "engine.yaml".into(),
    }
}

/// One engine case: the target's scripted behaviour, the steps, and what must come out.
struct Case {
    name: &'static str,
    script: Vec<Scripted>,
    process: FakeProcess,
    /// The target became ready (else it exited before readiness).
    ready: bool,
    steps: Vec<Step>,
    /// `None`: the run passes; else the failure's code, phase and a message substring.
    failure: Option<(FailureCode, Phase, &'static str)>,
    /// What the harness sent (in order), when checked.
    sent: Option<Vec<&'static str>>,
    /// Recorded labels, when checked.
    recorded: Option<Vec<&'static str>>,
    /// Vendor mode (else strict).
    vendor: bool,
}

impl Case {
    fn new(name: &'static str, script: Vec<Scripted>, steps: Vec<Step>) -> Self {
        Self {
            name,
            script,
            process: FakeProcess::default(),
            ready: true,
            steps,
            failure: None,
            sent: None,
            recorded: None,
            vendor: false,
        }
    }
    fn fails(mut self, code: FailureCode, phase: Phase, text: &'static str) -> Self {
        self.failure = Some((code, phase, text));
        self
    }
    fn sends(mut self, sent: Vec<&'static str>) -> Self {
        self.sent = Some(sent);
        self
    }
    fn records(mut self, labels: Vec<&'static str>) -> Self {
        self.recorded = Some(labels);
        self
    }
    fn process(mut self, process: FakeProcess) -> Self {
        self.process = process;
        self
    }
    fn not_ready(mut self) -> Self {
        self.ready = false;
        self
    }
}

fn cases() -> Vec<Case> {
    use FailureCode as C;
    let hello = || json!({"type": "hello", "id": "r-1"});
    vec![
        Case::new(
            "a matching frame binds its placeholder; a sent frame uses it",
            vec![now(text(hello()))],
            vec![
                expect(json!({"type": "hello", "id": "$run"})),
                send(json!({"type": "ack", "id": "$run", "mine": "$fresh"})),
            ],
        )
        .records(vec!["runtime frame"])
        .sends(vec![
            r#"{"type":"ack","id":"r-1","mine":"fresh-1"}"#,
            "close:1000:scenario complete",
        ]),
        Case::new(
            "a frame that does not match fails with mismatch",
            vec![now(text(json!({"type": "hello", "id": "r-2"})))],
            vec![expect(json!({"type": "hello", "id": "r-1"}))],
        )
        .fails(C::Mismatch, Phase::Step(1), "emitted frame does not match"),
        Case::new(
            "nothing within the step deadline is a timeout naming it",
            vec![later(600, text(hello()))],
            vec![expect(json!({"type": "hello"}))],
        )
        .fails(C::Timeout, Phase::Step(1), "got nothing within 500ms"),
        Case::new(
            "a frame just inside the deadline arrives",
            vec![later(499, text(hello()))],
            vec![expect(json!({"type": "hello"}))],
        ),
        Case::new(
            "an undecodable frame is invalid_frame",
            vec![now(Event::Text("{\"type\":\"a\",\"type\":\"b\"}".into()))],
            vec![expect(json!({"type": "a"}))],
        )
        .fails(C::InvalidFrame, Phase::Step(1), "duplicate_key"),
        Case::new(
            "a frame outside the schema is schema_violation",
            vec![now(text(json!({"id": "x"})))],
            vec![expect(json!({"id": "x"}))],
        )
        .fails(
            C::SchemaViolation,
            Phase::Step(1),
            "violates the wire schema",
        ),
        Case::new(
            "a close where a frame is expected is unexpected_event",
            vec![now(Event::Close {
                code: Some(1011),
                reason: "bye".into(),
            })],
            vec![expect(json!({"type": "hello"}))],
        )
        .fails(C::UnexpectedEvent, Phase::Step(1), "got close 1011"),
        Case::new(
            "an invalid frame of the harness's own is refused before sending",
            vec![],
            vec![send(json!({"no": "type"}))],
        )
        .fails(C::ScenarioInvalid, Phase::Step(1), "use send_bytes")
        .sends(vec![]),
        Case::new(
            "silence passes when nothing comes within the window (the frame after it trails)",
            vec![later(1000, text(hello()))],
            vec![Step::Silence(Duration::from_millis(999))],
        )
        .fails(
            C::TrailingOutput,
            Phase::AfterLastStep,
            "unexpected frame after the last step",
        ),
        Case::new(
            "silence fails on a frame inside the window and records it",
            vec![later(100, text(hello()))],
            vec![Step::Silence(Duration::from_millis(200))],
        )
        .fails(
            C::UnexpectedEvent,
            Phase::Step(1),
            "expected silence for 200ms",
        )
        .records(vec!["runtime frame"]),
        Case::new(
            "any_order matches frames in either order",
            vec![
                now(text(json!({"type": "b", "id": "2"}))),
                now(text(json!({"type": "a", "id": "1"}))),
            ],
            vec![
                Step::AnyOrder(vec![
                    expect(json!({"type": "a", "id": "$first"})),
                    expect(json!({"type": "b", "id": "$second"})),
                ]),
                send(json!({"type": "ack", "a": "$first", "b": "$second"})),
            ],
        )
        .sends(vec![
            r#"{"type":"ack","a":"1","b":"2"}"#,
            "close:1000:scenario complete",
        ]),
        Case::new(
            "any_order fails on a frame matching no remaining expectation",
            vec![
                now(text(json!({"type": "a"}))),
                now(text(json!({"type": "a"}))),
            ],
            vec![Step::AnyOrder(vec![
                expect(json!({"type": "a"})),
                expect(json!({"type": "b"})),
            ])],
        )
        .fails(C::Mismatch, Phase::Step(1), "matches none of the remaining"),
        Case::new(
            "any_order holds only frames the target emits",
            vec![],
            vec![Step::AnyOrder(vec![send(json!({"type": "a"}))])],
        )
        .fails(
            C::ScenarioInvalid,
            Phase::Step(1),
            "any_order may only hold",
        ),
        Case::new(
            "repeat sends and expects its steps each pass, placeholders bound once",
            vec![
                now(text(json!({"type": "e", "id": "r1"}))),
                now(text(json!({"type": "e", "id": "r1"}))),
                now(text(json!({"type": "e", "id": "r1"}))),
            ],
            vec![Step::Repeat {
                times: 3,
                steps: vec![
                    expect(json!({"type": "e", "id": "$run"})),
                    send(json!({"type": "ack", "id": "$run"})),
                ],
            }],
        )
        .sends(vec![
            r#"{"type":"ack","id":"r1"}"#,
            r#"{"type":"ack","id":"r1"}"#,
            r#"{"type":"ack","id":"r1"}"#,
            "close:1000:scenario complete",
        ]),
        Case::new(
            "repeat names the pass that failed",
            vec![
                now(text(json!({"type": "e", "id": "r1"}))),
                now(text(json!({"type": "e", "id": "r2"}))),
            ],
            vec![Step::Repeat {
                times: 2,
                steps: vec![expect(json!({"type": "e", "id": "$run"}))],
            }],
        )
        .fails(C::Mismatch, Phase::Step(1), "pass 2 of 2"),
        Case::new(
            "placeholders survive a disconnect and a reconnect",
            vec![now(text(hello()))],
            vec![
                expect(json!({"type": "hello", "id": "$run"})),
                Step::Disconnect,
                Step::Reconnect { within: None },
                send(json!({"type": "again", "id": "$run"})),
            ],
        )
        .sends(vec![
            "reconnect",
            r#"{"type":"again","id":"r-1"}"#,
            "close:1000:scenario complete",
        ]),
        Case::new(
            "disconnect without a connection fails",
            vec![],
            vec![Step::Disconnect, Step::Disconnect],
        )
        .fails(C::NotConnected, Phase::Step(2), "no connection to drop"),
        Case::new(
            "half_close records the target's Close reply",
            vec![],
            vec![Step::HalfClose {
                code: Some(4000),
                reason: Some("done".into()),
            }],
        )
        .sends(vec!["close:4000:done"])
        .records(vec!["close"]),
        Case::new(
            "half_close fails on a frame instead of the Close reply",
            vec![now(text(hello()))],
            vec![Step::HalfClose {
                code: None,
                reason: None,
            }],
        )
        .fails(
            C::UnexpectedEvent,
            Phase::Step(1),
            "expected the target's Close reply",
        ),
        Case::new(
            "send_bytes sends raw text and binary without a schema check",
            vec![],
            vec![
                Step::SendBytes(RawMessage::Text("{not json".into())),
                Step::SendBytes(RawMessage::Binary(vec![1, 2, 3])),
            ],
        )
        .sends(vec![
            "{not json",
            "binary:3",
            "close:1000:scenario complete",
        ]),
        Case::new(
            "expect_close checks code and reason",
            vec![now(Event::Close {
                code: Some(1008),
                reason: "policy".into(),
            })],
            vec![Step::ExpectClose {
                code: Some(json!(1008)),
                reason: Some(json!("policy")),
            }],
        )
        .records(vec!["close"]),
        Case::new(
            "expect_close with another code is a mismatch",
            vec![now(Event::Close {
                code: Some(1011),
                reason: String::new(),
            })],
            vec![Step::ExpectClose {
                code: Some(json!(1008)),
                reason: None,
            }],
        )
        .fails(C::Mismatch, Phase::Step(1), r#"{"code":1008}"#),
        Case::new(
            "expect_close without code accepts a dropped connection",
            vec![now(Event::Eof)],
            vec![Step::ExpectClose {
                code: None,
                reason: None,
            }],
        )
        .records(vec!["close"]),
        Case::new(
            "expect_close with a code refuses a dropped connection",
            vec![now(Event::Eof)],
            vec![Step::ExpectClose {
                code: Some(json!(1000)),
                reason: None,
            }],
        )
        .fails(C::Mismatch, Phase::Step(1), "got a dropped connection"),
        Case::new(
            "expect_exit records the exit and checks code and stderr",
            vec![later(10, Event::Eof)],
            vec![
                pause(),
                Step::ExpectExit {
                    code: Some(ExitCodeSpec::Exact(3)),
                    stderr: vec!["bad config".into()],
                },
            ],
        )
        .process(FakeProcess {
            exit: Some((Duration::from_millis(20), 3)),
            stderr: "error: bad config".into(),
            leak: None,
        })
        .records(vec!["target exit"]),
        Case::new(
            "a typical frame may still arrive before the exit",
            vec![
                later(5, text(json!({"type": "status"}))),
                later(5, Event::Eof),
            ],
            vec![
                pause(),
                maybe(expect(json!({"type": "status"}))),
                Step::ExpectExit {
                    code: Some(ExitCodeSpec::Exact(0)),
                    stderr: vec![],
                },
            ],
        )
        .process(FakeProcess {
            exit: Some((Duration::from_millis(20), 0)),
            stderr: String::new(),
            leak: None,
        })
        .records(vec!["runtime frame", "target exit"]),
        Case::new(
            "expect_exit with another code is target_exit",
            vec![],
            vec![
                pause(),
                Step::ExpectExit {
                    code: Some(ExitCodeSpec::NonZero),
                    stderr: vec![],
                },
            ],
        )
        .process(FakeProcess {
            exit: Some((Duration::from_millis(20), 0)),
            ..FakeProcess::default()
        })
        .fails(C::TargetExit, Phase::Step(2), "a non-zero code"),
        Case::new(
            "expect_exit on a target that keeps running is a timeout",
            vec![],
            vec![
                pause(),
                Step::ExpectExit {
                    code: None,
                    stderr: vec![],
                },
            ],
        )
        .fails(C::Timeout, Phase::Step(2), "it is still running"),
        Case::new(
            "expect_exit first: a target that became ready fails it",
            vec![],
            vec![Step::ExpectExit {
                code: None,
                stderr: vec![],
            }],
        )
        .fails(C::TargetExit, Phase::Step(1), "became ready instead"),
        Case::new(
            "expect_exit first: an exit before readiness passes",
            vec![],
            vec![Step::ExpectExit {
                code: Some(ExitCodeSpec::Exact(4)),
                stderr: vec![],
            }],
        )
        .not_ready()
        .process(FakeProcess {
            exit: Some((Duration::ZERO, 4)),
            ..FakeProcess::default()
        }),
        Case::new(
            "expect_exit fails on a frame emitted before the exit",
            vec![later(5, text(hello()))],
            vec![
                pause(),
                Step::ExpectExit {
                    code: None,
                    stderr: vec![],
                },
            ],
        )
        .process(FakeProcess {
            exit: Some((Duration::from_millis(10), 0)),
            ..FakeProcess::default()
        })
        .fails(C::UnexpectedEvent, Phase::Step(2), "got text frame")
        .records(vec!["runtime frame"]),
        Case::new(
            "crash kills and relaunches the target; the run goes on",
            vec![],
            vec![
                Step::Crash { fresh_state: false },
                Step::Reconnect { within: None },
                send(json!({"type": "after"})),
            ],
        )
        .sends(vec![
            "relaunch",
            "reconnect",
            r#"{"type":"after"}"#,
            "close:1000:scenario complete",
        ]),
        Case::new(
            "the secret in a frame is a credential leak, never printed",
            vec![now(text(json!({"type": "hello", "token": SECRET})))],
            vec![expect(json!({"type": "hello"}))],
        )
        .fails(
            C::CredentialLeak,
            Phase::Step(1),
            "credential leaked in a text frame",
        ),
        Case::new(
            "the secret escaped on the wire is still a leak",
            vec![now(Event::Text(format!(
                "{{\"type\":\"hello\",\"token\":\"\\u0073{}\"}}",
                &SECRET[1..]
            )))],
            vec![expect(json!({"type": "hello"}))],
        )
        .fails(
            C::CredentialLeak,
            Phase::Step(1),
            "credential leaked in a text frame",
        )
        .records(vec![]),
        Case::new(
            "a frame the transport refuses is an invalid frame",
            vec![now(Event::Error {
                code: "invalid_utf8",
                detail: "bad byte".into(),
            })],
            vec![expect(json!({"type": "hello"}))],
        )
        .fails(C::InvalidFrame, Phase::Step(1), "invalid_utf8"),
        Case::new(
            "the secret in a family event is a leak where the family says",
            vec![now(Event::Other(FakeRequest(format!("GET /?t={SECRET}"))))],
            vec![Step::Silence(Duration::from_millis(50))],
        )
        .fails(
            C::CredentialLeak,
            Phase::Step(1),
            "credential leaked in a fake request",
        ),
        Case::new(
            "the secret in a close reason is a leak",
            vec![now(Event::Close {
                code: Some(1000),
                reason: SECRET.into(),
            })],
            vec![Step::ExpectClose {
                code: None,
                reason: None,
            }],
        )
        .fails(C::CredentialLeak, Phase::Step(1), "close reason"),
        Case::new(
            "the secret on the target's output fails the end of the run",
            vec![],
            vec![Step::Silence(Duration::from_millis(1))],
        )
        .process(FakeProcess {
            leak: Some("stderr"),
            ..FakeProcess::default()
        })
        .fails(C::CredentialLeak, Phase::EndOfRun, "the target's stderr"),
        Case::new(
            "a frame the codec allows may trail the last step and is not recorded",
            vec![now(text(hello())), later(5, text(json!({"type": "tick"})))],
            vec![expect(json!({"type": "hello"}))],
        )
        .records(vec!["runtime frame"]),
        Case::new(
            "a trailing family event is the family's call",
            vec![now(Event::Other(FakeRequest("POST /late".into())))],
            vec![],
        ),
        Case::new(
            "a binary message after the last step fails",
            vec![now(Event::Binary(vec![0]))],
            vec![],
        )
        .fails(C::TrailingOutput, Phase::AfterLastStep, "binary message"),
        Case::new(
            "an optional frame that comes is matched, bound and recorded",
            vec![
                now(text(json!({"type": "preparing", "id": "h-9"}))),
                now(text(hello())),
            ],
            vec![
                maybe(expect(json!({"type": "preparing", "id": "$h"}))),
                expect(json!({"type": "hello"})),
                send(json!({"type": "ack", "id": "$h"})),
            ],
        )
        .records(vec!["runtime frame", "runtime frame"])
        .sends(vec![
            r#"{"type":"ack","id":"h-9"}"#,
            "close:1000:scenario complete",
        ]),
        Case::new(
            "an optional frame that does not come is no failure",
            vec![now(text(hello()))],
            vec![
                maybe(expect(json!({"type": "preparing"}))),
                expect(json!({"type": "hello"})),
            ],
        )
        .records(vec!["runtime frame"]),
        Case::new(
            "an optional frame may come while the harness sends, before the next expectation",
            vec![
                later(10, text(json!({"type": "preparing"}))),
                later(10, text(hello())),
            ],
            vec![
                maybe(expect(json!({"type": "preparing"}))),
                send(json!({"type": "go"})),
                expect(json!({"type": "hello"})),
            ],
        )
        .records(vec!["runtime frame", "runtime frame"]),
        Case::new(
            "an optional frame after the frame that follows it is out of order",
            vec![now(text(hello())), now(text(json!({"type": "preparing"})))],
            vec![
                maybe(expect(json!({"type": "preparing"}))),
                expect(json!({"type": "hello"})),
            ],
        )
        .fails(C::TrailingOutput, Phase::AfterLastStep, "preparing"),
        Case::new(
            "an optional frame does not breach silence, and may trail the last step",
            vec![
                later(10, text(json!({"type": "preparing"}))),
                later(300, text(json!({"type": "starting"}))),
            ],
            vec![
                maybe(expect(json!({"type": "preparing"}))),
                maybe(expect(json!({"type": "starting"}))),
                Step::Silence(Duration::from_millis(100)),
            ],
        )
        .records(vec!["runtime frame"]),
        Case::new(
            "an optional frame may come before the target's Close",
            vec![
                now(text(json!({"type": "preparing", "id": "p-1"}))),
                now(Event::Close {
                    code: Some(1000),
                    reason: String::new(),
                }),
            ],
            vec![
                maybe(expect(json!({"type": "preparing", "id": "$p"}))),
                Step::ExpectClose {
                    code: Some(json!(1000)),
                    reason: None,
                },
            ],
        )
        .records(vec!["runtime frame", "close"]),
        Case::new(
            "an optional frame of a party the harness plays is sent",
            vec![],
            vec![maybe(send(json!({"type": "typical"})))],
        )
        .sends(vec![
            r#"{"type":"typical"}"#,
            "close:1000:scenario complete",
        ]),
        Case::new(
            "a value the spec orders but does not fix is compared, not fixed",
            vec![
                now(text(json!({"type": "s", "revision": 100}))),
                now(text(json!({"type": "s", "revision": 107}))),
                now(text(json!({"type": "s", "revision": 107}))),
            ],
            vec![
                expect(json!({"type": "s", "revision": "$r1"})),
                expect(json!({"type": "s", "revision": {"$gt": "$r1", "$as": "$r2"}})),
                expect(json!({"type": "s", "revision": {"$gt": "$r2"}})),
            ],
        )
        .fails(C::Mismatch, Phase::Step(3), "expected a number > 107"),
        Case::new(
            "an unsupported family step names itself",
            vec![],
            vec![Step::Bootstrap(Default::default())],
        )
        .fails(C::UnsupportedStep, Phase::Step(1), "fake: bootstrap"),
        Case::new(
            "a party the harness does not play cannot send frames",
            vec![],
            vec![Step::Frame {
                party: Party::Native,
                frame: json!({"type": "x"}),
            }],
        )
        .fails(
            C::UnsupportedStep,
            Phase::Step(1),
            "`native` cannot send frames",
        ),
    ]
}

/// Drive options of the engine tests (every deadline [`STEP`]).
fn opts() -> DriveOptions {
    DriveOptions {
        target_cmd: String::new(),
        step_timeout: STEP,
        startup_timeout: STEP,
        vendor: false,
        peer_exe: None,
        features: Default::default(),
    }
}

/// A run of a target that never answers the harness's Close, following `script`.
async fn drive_silent_closer(script: Vec<Scripted>) -> DriveOutcome {
    let peer = FakePeer {
        link: FakeLink {
            script: script.into(),
            connected: true,
            echo_close: false,
            sent: Arc::default(),
        },
    };
    let started = Started {
        peer,
        process: Box::new(FakeProcess::default()),
        secret: String::new(),
        ready: true,
        normalize: Value::clone,
        prebound: Vec::new(),
    };
    drive(&scenario(vec![]), &opts(), async { Ok(started) }).await
}

async fn run_case(case: Case) -> (DriveOutcome, Vec<String>) {
    let sent: SentLog = Arc::default();
    let peer = FakePeer {
        link: FakeLink {
            script: case.script.into(),
            connected: true,
            echo_close: true,
            sent: sent.clone(),
        },
    };
    let process: Box<dyn Process> = Box::new(case.process);
    let started = Started {
        peer,
        process,
        secret: SECRET.to_string(),
        ready: case.ready,
        normalize: Value::clone,
        prebound: Vec::new(),
    };
    let opts = DriveOptions {
        vendor: case.vendor,
        ..opts()
    };
    let outcome = drive(&scenario(case.steps), &opts, async { Ok(started) }).await;
    let sent = sent.lock().unwrap().clone();
    (outcome, sent)
}

#[tokio::test(start_paused = true)]
async fn every_generic_step_kind_behaves_as_documented() {
    let mut problems = Vec::new();
    for case in cases() {
        let name = case.name;
        let want_failure = case.failure;
        let want_sent = case.sent.clone();
        let want_recorded = case.recorded.clone();
        let (outcome, sent) = run_case(case).await;
        let got = outcome.failure.as_ref();
        match (want_failure, got) {
            (None, None) => {}
            (Some((code, phase, text)), Some(f))
                if f.code == code && f.phase == phase && f.message.contains(text) => {}
            (want, got) => problems.push(format!(
                "{name}: wanted {want:?}, got {:?}",
                got.map(|f| (f.code, f.phase, f.to_string()))
            )),
        }
        if let Some(f) = got
            && f.to_string().contains(SECRET)
        {
            problems.push(format!("{name}: the failure prints the secret: {f}"));
        }
        if let Some(want) = want_sent
            && sent != want
        {
            problems.push(format!("{name}: sent {sent:?}, wanted {want:?}"));
        }
        if let Some(want) = want_recorded {
            let labels: Vec<&str> = outcome
                .recording
                .entries
                .iter()
                .map(|e| e.label.as_str())
                .collect();
            if labels != want {
                problems.push(format!("{name}: recorded {labels:?}, wanted {want:?}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[tokio::test(start_paused = true)]
async fn a_failure_inside_a_reference_step_names_its_requirement() {
    let case = Case::new(
        "reference",
        vec![now(text(json!({"type": "s", "revision": 100})))],
        vec![Step::Reference {
            requirement: "CR-PREP-018".into(),
            steps: vec![expect(json!({"type": "s", "revision": 1}))],
            sides: None,
        }],
    );
    let (outcome, _) = run_case(case).await;
    let failure = outcome.failure.unwrap();
    assert_eq!(failure.reference.as_deref(), Some("CR-PREP-018"));
    assert_eq!(failure.code, FailureCode::Mismatch);
    assert_eq!(failure.phase, Phase::Step(1));
    // Passing reference steps are ordinary steps.
    let case = Case::new(
        "reference",
        vec![now(text(json!({"type": "s", "revision": 1})))],
        vec![Step::Reference {
            requirement: "CR-PREP-018".into(),
            steps: vec![expect(json!({"type": "s", "revision": 1}))],
            sides: None,
        }],
    );
    let (outcome, _) = run_case(case).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    // A required failure outside names none.
    let case = Case::new("required", vec![], vec![expect(json!({"type": "s"}))]);
    let (outcome, _) = run_case(case).await;
    assert_eq!(outcome.failure.unwrap().reference, None);
}

/// A run of `steps` against `script` in vendor mode (`vendor`) or strict mode.
async fn run_in_mode(script: Vec<Scripted>, steps: Vec<Step>, vendor: bool) -> DriveOutcome {
    let mut case = Case::new("mode", script, steps);
    case.vendor = vendor;
    run_case(case).await.0
}

#[tokio::test(start_paused = true)]
async fn a_typical_frame_of_the_reference_is_required_for_us_and_optional_for_vendors() {
    // preparing (typical, our reference sends it) → ready → started, ordered by revision.
    let steps = || {
        vec![
            Step::Reference {
                requirement: "CR-PREP-014".into(),
                steps: vec![maybe(expect(
                    json!({"type": "preparing", "revision": "$r1"}),
                ))],
                sides: None,
            },
            expect(json!({"type": "ready", "revision": {"$gt": "$r1", "$as": "$r2"}})),
            Step::Reference {
                requirement: "CR-PREP-014".into(),
                steps: vec![maybe(expect(
                    json!({"type": "starting", "revision": {"$gt": "$r2", "$as": "$r3"}}),
                ))],
                sides: None,
            },
            expect(json!({"type": "started", "revision": {"$gt": "$r3"}})),
        ]
    };
    let frame = |t: &str, r: u64| now(text(json!({"type": t, "revision": r})));
    let full = || {
        vec![
            frame("preparing", 1),
            frame("ready", 2),
            frame("starting", 3),
            frame("started", 4),
        ]
    };
    let lean = |started: u64| vec![frame("ready", 100), frame("started", started)];
    // Ours sends every typical frame: both modes pass, nothing differs.
    for vendor in [false, true] {
        let outcome = run_in_mode(full(), steps(), vendor).await;
        assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
        assert!(outcome.bindings.differences.is_empty());
    }
    // Strict: a missing typical frame fails, naming the reference requirement.
    let outcome = run_in_mode(lean(107), steps(), false).await;
    let failure = outcome.failure.unwrap();
    assert_eq!(failure.reference.as_deref(), Some("CR-PREP-014"));
    assert_eq!(failure.phase, Phase::Step(1));
    // Vendor: the run passes; each missing frame is a difference; the order chain passes
    // through the skipped frames (no `$r1`: no lower bound; `$r3` takes `$r2`).
    let outcome = run_in_mode(lean(107), steps(), true).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    let missing: Vec<_> = outcome
        .bindings
        .differences
        .iter()
        .map(|d| (d.requirement.as_str(), d.path.as_str(), d.actual.is_none()))
        .collect();
    assert_eq!(
        missing,
        [
            ("CR-PREP-014", "step 1 (typical frame, not sent)", true),
            ("CR-PREP-014", "step 3 (typical frame, not sent)", true)
        ]
    );
    assert_eq!(outcome.bindings.get("r3"), Some(&json!(100)));
    // ... so a started revision that does not follow ready still fails.
    let outcome = run_in_mode(lean(100), steps(), true).await;
    let failure = outcome.failure.unwrap();
    assert_eq!(failure.code, FailureCode::Mismatch);
    assert!(failure.message.contains("> 100"), "{failure}");
    // A typical frame still pending when the steps end is a difference too.
    let outcome = run_in_mode(vec![], steps()[..1].to_vec(), true).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    assert_eq!(outcome.bindings.differences.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_frame_to_send_awaits_the_typical_frame_that_carries_its_value() {
    let steps = || {
        vec![
            Step::Reference {
                requirement: "CR-PREP-014".into(),
                steps: vec![maybe(expect(json!({"type": "preparing", "handle": "$h1"})))],
                sides: None,
            },
            send(json!({"type": "release", "handle": "$h1"})),
            expect(json!({"type": "released", "handle": "$h1"})),
        ]
    };
    // It comes late: the harness waits for it and sends the handle it carries.
    let script = vec![
        later(300, text(json!({"type": "preparing", "handle": "h-9"}))),
        later(1, text(json!({"type": "released", "handle": "h-9"}))),
    ];
    let outcome = run_in_mode(script, steps(), true).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    assert!(outcome.bindings.differences.is_empty());
    // Another frame comes first: it is kept for the next step, and the send cannot be
    // built; in vendor mode that is a difference from the reference, naming it.
    let script = vec![now(text(json!({"type": "released", "handle": "h-9"})))];
    let outcome = run_in_mode(script, steps(), true).await;
    let failure = outcome.failure.unwrap();
    assert_eq!(failure.phase, Phase::Step(2));
    assert_eq!(failure.reference.as_deref(), Some("CR-PREP-014"));
    assert!(failure.message.contains("`$h1`"), "{failure}");
    // Nothing comes: the wait ends at the step deadline, with the same outcome.
    let outcome = run_in_mode(vec![], steps(), true).await;
    assert_eq!(
        outcome.failure.unwrap().reference.as_deref(),
        Some("CR-PREP-014")
    );
}

#[tokio::test(start_paused = true)]
async fn a_close_code_of_the_reference_differs_in_vendor_mode() {
    let close = |code: u16, reason: &str| {
        vec![now(Event::Close {
            code: Some(code),
            reason: reason.into(),
        })]
    };
    let step = || {
        vec![Step::ExpectClose {
            code: Some(json!({"$reference": 1007, "$requirement": "CR-FAM-006"})),
            reason: Some(json!({"$reference": "missing_field", "$requirement": "CR-FAM-006"})),
        }]
    };
    let outcome = run_in_mode(close(1007, "missing_field"), step(), false).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    let outcome = run_in_mode(close(1002, "bad frame"), step(), false).await;
    assert_eq!(
        outcome.failure.unwrap().reference.as_deref(),
        Some("CR-FAM-006")
    );
    let outcome = run_in_mode(close(1002, "bad frame"), step(), true).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    let paths: Vec<_> = outcome
        .bindings
        .differences
        .iter()
        .map(|d| d.path.as_str())
        .collect();
    assert_eq!(paths, ["$.code", "$.reason"]);
    // A dropped connection also closes the transport: a difference, not a failure.
    let outcome = run_in_mode(vec![now(Event::Eof)], step(), true).await;
    assert!(outcome.failure.is_none(), "{:?}", outcome.failure);
    assert_eq!(outcome.bindings.differences.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_allowed_frames_does_not_outlast_the_final_deadline() {
    let ticks = (0..10_000)
        .map(|_| later(1, text(json!({"type": "tick"}))))
        .collect::<Vec<_>>();
    let begun = tokio::time::Instant::now();
    let outcome = drive_silent_closer(ticks).await;
    assert!(
        begun.elapsed() <= STEP + Duration::from_millis(5),
        "{:?}",
        begun.elapsed()
    );
    let failure = outcome.failure.unwrap();
    assert_eq!(failure.code, FailureCode::Timeout);
    assert_eq!(failure.phase, Phase::AfterLastStep);
}

#[tokio::test(start_paused = true)]
async fn a_launch_failure_is_typed() {
    let outcome = drive::<FakePeer, _>(&scenario(vec![]), &opts(), async {
        Err("no such program".to_string())
    })
    .await;
    let failure = outcome.failure.unwrap();
    assert_eq!(failure.code, FailureCode::LaunchFailed);
    assert_eq!(failure.phase, Phase::Launch);
    assert_eq!(
        failure.to_string(),
        "scenario fake/engine (launch): no such program"
    );
}

#[tokio::test(start_paused = true)]
async fn a_target_that_never_answers_the_final_close_times_out() {
    let outcome = drive_silent_closer(Vec::new()).await;
    let failure = outcome.failure.unwrap();
    assert_eq!(failure.code, FailureCode::Timeout);
    assert_eq!(failure.phase, Phase::AfterLastStep);
    assert!(
        failure.message.contains("neither with its Close"),
        "{failure}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_normal_close_answered_with_an_error_code_fails_the_run() {
    let reply = |code: u16| {
        vec![now(Event::Close {
            code: Some(code),
            reason: String::new(),
        })]
    };
    let failure = drive_silent_closer(reply(1011)).await.failure.unwrap();
    assert_eq!(failure.code, FailureCode::UnexpectedEvent);
    assert!(
        failure.message.contains("with Close 1011"),
        "{}",
        failure.message
    );
    assert!(drive_silent_closer(reply(1000)).await.failure.is_none());
}

#[tokio::test(start_paused = true)]
async fn the_wire_log_holds_every_frame_both_ways_in_order() {
    let case = Case::new(
        "wire",
        vec![now(text(json!({"type": "hello", "id": "r-1"})))],
        vec![
            expect(json!({"type": "hello", "id": "$run"})),
            send(json!({"type": "ack", "id": "$run"})),
        ],
    );
    let (outcome, _) = run_case(case).await;
    let wire = &outcome.recording.wire;
    let dirs: Vec<&str> = wire.iter().filter_map(|e| e["dir"].as_str()).collect();
    assert_eq!(dirs[..2], ["from target", "to target"], "{wire:?}");
    assert_eq!(wire[1]["body"], json!({"type": "ack", "id": "r-1"}));
    assert_eq!(wire[1]["step"], json!(2));
    // The end-of-run Close and what answered it are in the log too.
    let labels: Vec<&str> = wire.iter().filter_map(|e| e["label"].as_str()).collect();
    assert!(labels.contains(&"end-of-run close"), "{labels:?}");
    // The golden still records only what the target emitted.
    assert_eq!(outcome.recording.entries.len(), 1);
}
