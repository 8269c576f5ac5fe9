//! The controlled adapter against an in-test control peer over a real Unix socket.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;

use super::*;
use crate::core_runtime::adapter::RUN_EVENT_QUEUE;
use crate::core_runtime::wire::{
    AgentKind, AgentKindCapabilities, ContentPart, ExecutionConfiguration, InputRole, Outcome,
    Text, Uuid,
};
use crate::wire::bounded::BoundedVec;

/// Bound of every test step, so a broken adapter fails instead of hanging.
const STEP: Duration = Duration::from_secs(10);

async fn within<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, future)
        .await
        .expect("test step timed out")
}

/// The harness side of the control channel.
struct Peer {
    reader: BufReader<OwnedReadHalf>,
    writer: Option<OwnedWriteHalf>,
    next_seq: u64,
    /// Responses read while looking for another `seq`.
    parked: HashMap<u64, Value>,
    /// Responses without `seq`, in order.
    unsequenced: Vec<Value>,
}

impl Peer {
    async fn read_json_line(&mut self) -> Option<Value> {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).await.unwrap();
        (n > 0).then(|| serde_json::from_str(line.trim_end_matches('\n')).unwrap())
    }

    async fn send_raw(&mut self, line: &str) {
        let writer = self.writer.as_mut().unwrap();
        writer.write_all(line.as_bytes()).await.unwrap();
        writer.write_all(b"\n").await.unwrap();
        writer.flush().await.unwrap();
    }

    /// Sends `body` with the next `seq` and returns that `seq`.
    async fn request(&mut self, mut body: Value) -> u64 {
        self.next_seq += 1;
        body["seq"] = json!(self.next_seq);
        self.send_raw(&body.to_string()).await;
        self.next_seq
    }

    /// The response to `seq` (other responses are parked).
    async fn response(&mut self, seq: u64) -> Value {
        within(async {
            loop {
                if let Some(found) = self.parked.remove(&seq) {
                    return found;
                }
                let line = self.read_json_line().await.expect("channel closed");
                match line.get("seq").and_then(Value::as_u64) {
                    Some(s) => {
                        self.parked.insert(s, line);
                    }
                    None => self.unsequenced.push(line),
                }
            }
        })
        .await
    }

    /// The next response that carries no `seq`.
    async fn unsequenced(&mut self) -> Value {
        within(async {
            loop {
                if !self.unsequenced.is_empty() {
                    return self.unsequenced.remove(0);
                }
                let line = self.read_json_line().await.expect("channel closed");
                match line.get("seq").and_then(Value::as_u64) {
                    Some(s) => {
                        self.parked.insert(s, line);
                    }
                    None => self.unsequenced.push(line),
                }
            }
        })
        .await
    }

    /// Sends `body` and returns its `result`, asserting `ok: true`.
    async fn ok(&mut self, body: Value) -> Value {
        let seq = self.request(body).await;
        let response = self.response(seq).await;
        assert_eq!(response["ok"], json!(true), "{response}");
        response["result"].clone()
    }

    /// Sends `body` and returns its error code, asserting `ok: false`.
    async fn err(&mut self, body: Value) -> String {
        let seq = self.request(body).await;
        let response = self.response(seq).await;
        error_code(&response)
    }
}

fn error_code(response: &Value) -> String {
    assert_eq!(response["ok"], json!(false), "{response}");
    response["error"]["code"].as_str().unwrap().to_string()
}

struct Fixture {
    _dir: tempfile::TempDir,
    adapter: Arc<ControlledAdapter>,
    peer: Peer,
    hello: Value,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("control.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let declarations = vec![AgentKindDeclaration {
        agent_kind: AgentKind::new("controlled").unwrap(),
        available: true,
        capabilities: AgentKindCapabilities::all(true),
    }];
    let (adapter, accepted) = within(async {
        tokio::join!(
            ControlledAdapter::connect(&path, declarations),
            listener.accept()
        )
    })
    .await;
    let adapter = adapter.unwrap();
    let (stream, _) = accepted.unwrap();
    let (read, write) = stream.into_split();
    let mut peer = Peer {
        reader: BufReader::new(read),
        writer: Some(write),
        next_seq: 0,
        parked: HashMap::new(),
        unsequenced: Vec::new(),
    };
    let hello = within(peer.read_json_line()).await.unwrap();
    Fixture {
        _dir: dir,
        adapter,
        peer,
        hello,
    }
}

fn run(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

fn executor(id: &str) -> ExecutorId {
    ExecutorId::new(id).unwrap()
}

fn text_input(text: &str) -> Vec<MessageInput> {
    vec![MessageInput {
        role: InputRole::User,
        content: BoundedVec::new(vec![ContentPart::Text {
            text: Text::new(text).unwrap(),
        }])
        .unwrap(),
    }]
}

fn prepare_request(executor_id: &str) -> NativePrepare {
    NativePrepare {
        executor_id: executor(executor_id),
        session_id: Uuid::new("6f1c2a8e-1b2c-4d3e-8f9a-0b1c2d3e4f5a").unwrap(),
        agent_kind: AgentKind::new("controlled").unwrap(),
        configuration: ExecutionConfiguration::default(),
    }
}

/// Starts `run_id` natively and returns its event receiver.
async fn start_run(adapter: &ControlledAdapter, run_id: &str) -> mpsc::Receiver<NativeEvent> {
    let (tx, rx) = mpsc::channel(RUN_EVENT_QUEUE);
    let request = NativeStart {
        executor_id: executor("ex-1"),
        run_id: run(run_id),
        input: text_input("hello"),
    };
    within(adapter.start(request, tx)).await.unwrap();
    rx
}

#[tokio::test]
async fn hello_line_is_sent_first_and_declarations_are_kept() {
    let f = fixture().await;
    assert_eq!(f.hello.to_string(), HELLO_LINE);
    assert_eq!(
        f.hello,
        json!({"hello": {"adapter": "controlled", "protocol": 1}})
    );
    assert_eq!(f.adapter.declarations().len(), 1);
}

#[tokio::test]
async fn connect_refuses_an_over_long_socket_path() {
    let long = std::path::PathBuf::from(format!("/tmp/{}", "x".repeat(200)));
    let err = ControlledAdapter::connect(&long, Vec::new())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "socket_path_too_long");
}

#[tokio::test]
async fn emit_before_start_waits_then_is_delivered() {
    let mut f = fixture().await;
    let emit = f
        .peer
        .request(json!({"op": "emit", "run_id": "r1", "type": "delta", "payload": {"text": "hi"}}))
        .await;
    // A later request is answered while the emit still waits for the Run.
    let report = f.peer.request(json!({"op": "report"})).await;
    let report = f.peer.response(report).await;
    assert_eq!(report["result"], json!({"calls": []}));
    assert!(!f.peer.parked.contains_key(&emit));

    let mut events = start_run(&f.adapter, "r1").await;
    assert_eq!(f.peer.response(emit).await["result"], json!({}));
    assert_eq!(
        within(events.recv()).await.unwrap(),
        NativeEvent::Delta {
            text: "hi".into(),
            item_id: None
        }
    );
}

#[tokio::test]
async fn run_events_keep_their_order_and_settle_ends_the_stream() {
    let mut f = fixture().await;
    // Pipelined before the Run exists: applied in arrival order once it starts.
    let mut seqs = Vec::new();
    for text in ["a", "b", "c"] {
        seqs.push(
            f.peer
                .request(json!({"op": "emit", "run_id": "r1", "type": "thinking", "payload": {"text": text}}))
                .await,
        );
    }
    seqs.push(
        f.peer
            .request(json!({"op": "accept_input", "run_id": "r1", "input_id": "in-1"}))
            .await,
    );
    seqs.push(
        f.peer
            .request(json!({"op": "settle", "run_id": "r1", "outcome": "completed", "native_session_id": "ns-1"}))
            .await,
    );
    let mut events = start_run(&f.adapter, "r1").await;
    for seq in seqs {
        assert_eq!(f.peer.response(seq).await["ok"], json!(true));
    }
    let mut received = Vec::new();
    while let Some(event) = within(events.recv()).await {
        received.push(event);
    }
    assert_eq!(
        received,
        vec![
            NativeEvent::Thinking { text: "a".into() },
            NativeEvent::Thinking { text: "b".into() },
            NativeEvent::Thinking { text: "c".into() },
            NativeEvent::InputAccepted {
                input_id: InputId::new("in-1").unwrap()
            },
            NativeEvent::Settled {
                outcome: Outcome::Completed,
                native_session_id: Some(
                    crate::core_runtime::wire::NativeSessionId::new("ns-1").unwrap()
                ),
            },
        ]
    );
    // Nothing more is emitted for a settled Run.
    let code = f
        .peer
        .err(json!({"op": "emit", "run_id": "r1", "type": "delta", "payload": {"text": "late"}}))
        .await;
    assert_eq!(code, "unknown_run");
}

#[tokio::test]
async fn emit_payloads_are_decoded_strictly() {
    let mut f = fixture().await;
    let mut events = start_run(&f.adapter, "r1").await;
    // `error` keeps raw code/http_status values for the Runtime to classify.
    f.peer
        .ok(json!({"op": "emit", "run_id": "r1", "type": "error",
            "payload": {"message": "boom", "code": 42, "http_status": "x"}}))
        .await;
    assert_eq!(
        within(events.recv()).await.unwrap(),
        NativeEvent::Error {
            message: "boom".into(),
            code: Some(json!(42)),
            http_status: Some(json!("x")),
        }
    );
    f.peer
        .ok(
            json!({"op": "emit", "run_id": "r1", "type": "permission_cancel",
            "payload": {"request_id": "perm-1"}}),
        )
        .await;
    assert_eq!(
        within(events.recv()).await.unwrap(),
        NativeEvent::PermissionCancel {
            request_id: InteractionId::new("perm-1").unwrap()
        }
    );
    // Unknown payload field, wrong type, unknown event type: bad_request.
    for body in [
        json!({"op": "emit", "run_id": "r1", "type": "delta", "payload": {"text": "x", "extra": 1}}),
        json!({"op": "emit", "run_id": "r1", "type": "usage", "payload": {"input_tokens": "many"}}),
        json!({"op": "emit", "run_id": "r1", "type": "done", "payload": {}}),
    ] {
        assert_eq!(f.peer.err(body).await, "bad_request");
    }
}

#[tokio::test]
async fn emit_times_out_when_the_run_never_starts() {
    let mut f = fixture().await;
    let code = f
        .peer
        .err(json!({"op": "emit", "run_id": "never", "type": "delta",
            "payload": {"text": "x"}, "timeout_ms": 20}))
        .await;
    assert_eq!(code, "timeout");
}

#[tokio::test]
async fn fail_modes_apply_to_the_next_calls() {
    let mut f = fixture().await;
    f.peer
        .ok(json!({"op": "fail", "call": "prepare", "mode": "refuse", "times": 2}))
        .await;
    for _ in 0..2 {
        let err = within(f.adapter.prepare(prepare_request("ex-1")))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "refused");
    }
    within(f.adapter.prepare(prepare_request("ex-1")))
        .await
        .unwrap();

    f.peer
        .ok(json!({"op": "fail", "call": "write_input", "mode": "unknown"}))
        .await;
    let err = within(
        f.adapter
            .write_input(&run("r1"), &InputId::new("i").unwrap(), &[]),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "unknown");

    f.peer
        .ok(json!({"op": "fail", "call": "function_result", "mode": "unsupported"}))
        .await;
    let err = within(
        f.adapter
            .function_result(&run("r1"), &CallId::new("c").unwrap(), "o", false),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "unsupported");

    let report = f.peer.ok(json!({"op": "report"})).await;
    let calls: Vec<&str> = report["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["call"].as_str().unwrap())
        .collect();
    assert_eq!(
        calls,
        [
            "prepare",
            "prepare",
            "prepare",
            "write_input",
            "function_result"
        ]
    );

    assert_eq!(
        f.peer
            .err(json!({"op": "fail", "call": "prepare", "mode": "refuse", "times": 0}))
            .await,
        "bad_request"
    );
}

#[tokio::test]
async fn hang_resolves_as_unknown_when_the_channel_closes() {
    let mut f = fixture().await;
    f.peer
        .ok(json!({"op": "fail", "call": "close_executor", "mode": "hang"}))
        .await;
    let adapter = f.adapter.clone();
    let hanging = tokio::spawn(async move { adapter.close_executor(&executor("ex-1")).await });
    f.peer
        .ok(json!({"op": "await", "call": "close_executor", "match": {"executor_id": "ex-1"}}))
        .await;
    assert!(!hanging.is_finished());

    // The harness goes away: the hanging call resolves, later calls fail fast.
    drop(f.peer);
    let err = within(hanging).await.unwrap().unwrap_err();
    assert_eq!(err, AdapterError::Unknown("control channel closed".into()));
    let err = within(f.adapter.prepare(prepare_request("ex-2")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "unavailable");
}

#[tokio::test]
async fn hold_blocks_the_next_call_until_release() {
    let mut f = fixture().await;
    f.peer.ok(json!({"op": "hold", "call": "start"})).await;
    let adapter = f.adapter.clone();
    let (tx, mut events) = mpsc::channel(RUN_EVENT_QUEUE);
    let started = tokio::spawn(async move {
        let request = NativeStart {
            executor_id: executor("ex-1"),
            run_id: run("r1"),
            input: text_input("hello"),
        };
        adapter.start(request, tx).await
    });
    let record = f
        .peer
        .ok(json!({"op": "await", "call": "start", "match": {"run_id": "r1"}}))
        .await;
    assert_eq!(
        record,
        json!({"call": "start", "executor_id": "ex-1", "run_id": "r1",
            "input": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]})
    );
    assert!(!started.is_finished());

    f.peer.ok(json!({"op": "release", "call": "start"})).await;
    within(started).await.unwrap().unwrap();
    f.peer
        .ok(json!({"op": "emit", "run_id": "r1", "type": "delta", "payload": {"text": "x"}}))
        .await;
    assert!(matches!(
        within(events.recv()).await,
        Some(NativeEvent::Delta { .. })
    ));

    // The hold was consumed: the next call passes straight through.
    let (tx, _events) = mpsc::channel(RUN_EVENT_QUEUE);
    let request = NativeStart {
        executor_id: executor("ex-1"),
        run_id: run("r2"),
        input: text_input("again"),
    };
    within(f.adapter.start(request, tx)).await.unwrap();
}

#[tokio::test]
async fn await_matches_fields_and_counts() {
    let mut f = fixture().await;
    let waiting = f
        .peer
        .request(
            json!({"op": "await", "call": "write_input", "match": {"run_id": "r2"}, "count": 2}),
        )
        .await;
    for (run_id, input_id) in [("r1", "i1"), ("r2", "i2"), ("r1", "i3"), ("r2", "i4")] {
        within(f.adapter.write_input(
            &run(run_id),
            &InputId::new(input_id).unwrap(),
            &text_input(input_id),
        ))
        .await
        .unwrap();
    }
    let response = f.peer.response(waiting).await;
    assert_eq!(
        response["result"],
        json!({"call": "write_input", "run_id": "r2", "input_id": "i4",
            "input": [{"role": "user", "content": [{"type": "text", "text": "i4"}]}]})
    );
    // Already satisfied: answers at once. Unsatisfiable: bounded by timeout_ms.
    let first = f
        .peer
        .ok(json!({"op": "await", "call": "write_input"}))
        .await;
    assert_eq!(first["input_id"], json!("i1"));
    let code = f
        .peer
        .err(json!({"op": "await", "call": "write_input", "count": 5, "timeout_ms": 20}))
        .await;
    assert_eq!(code, "timeout");
    let code = f
        .peer
        .err(json!({"op": "await", "call": "write_input", "count": 0}))
        .await;
    assert_eq!(code, "bad_request");
}

#[tokio::test]
async fn settle_cancel_done_true_then_settle_is_the_terminal_event() {
    let mut f = fixture().await;
    let mut events = start_run(&f.adapter, "r1").await;
    let adapter = f.adapter.clone();
    let cancel = tokio::spawn(async move { adapter.cancel(&run("r1")).await });
    f.peer
        .ok(json!({"op": "await", "call": "cancel", "match": {"run_id": "r1"}}))
        .await;
    assert!(!cancel.is_finished());
    f.peer
        .ok(json!({"op": "settle_cancel", "run_id": "r1", "done": true}))
        .await;
    assert_eq!(
        within(cancel).await.unwrap().unwrap(),
        CancelSettlement::StreamSettles
    );
    f.peer
        .ok(json!({"op": "settle", "run_id": "r1", "outcome": "cancelled"}))
        .await;
    assert_eq!(
        within(events.recv()).await.unwrap(),
        NativeEvent::Settled {
            outcome: Outcome::Cancelled,
            native_session_id: None
        }
    );
    assert!(within(events.recv()).await.is_none());
}

#[tokio::test]
async fn settle_cancel_done_false_stops_the_turn() {
    let mut f = fixture().await;
    let _events = start_run(&f.adapter, "r1").await;
    assert_eq!(
        f.peer
            .err(json!({"op": "settle_cancel", "run_id": "r1", "done": false}))
            .await,
        "no_pending_cancel"
    );
    assert_eq!(
        f.peer
            .err(json!({"op": "settle_cancel", "run_id": "nope", "done": false}))
            .await,
        "unknown_run"
    );
    let adapter = f.adapter.clone();
    let cancel = tokio::spawn(async move { adapter.cancel(&run("r1")).await });
    f.peer.ok(json!({"op": "await", "call": "cancel"})).await;
    f.peer
        .ok(json!({"op": "settle_cancel", "run_id": "r1", "done": false}))
        .await;
    assert_eq!(
        within(cancel).await.unwrap().unwrap(),
        CancelSettlement::Stopped
    );
}

#[tokio::test]
async fn a_pending_cancel_resolves_as_unknown_when_the_channel_closes() {
    let mut f = fixture().await;
    let _events = start_run(&f.adapter, "r1").await;
    let adapter = f.adapter.clone();
    let cancel = tokio::spawn(async move { adapter.cancel(&run("r1")).await });
    f.peer.ok(json!({"op": "await", "call": "cancel"})).await;
    drop(f.peer);
    assert_eq!(
        within(cancel).await.unwrap().unwrap_err(),
        AdapterError::Unknown("control channel closed".into())
    );
}

#[tokio::test]
async fn unknown_ops_and_wrong_arguments_are_bad_requests() {
    let mut f = fixture().await;
    assert_eq!(f.peer.err(json!({"op": "explode"})).await, "bad_request");
    assert_eq!(
        f.peer
            .err(json!({"op": "hold", "call": "prepare", "extra": true}))
            .await,
        "bad_request"
    );
    assert_eq!(
        f.peer.err(json!({"op": "hold", "call": "teleport"})).await,
        "bad_request"
    );
    assert_eq!(
        f.peer
            .err(json!({"op": "report", "timeout_ms": 600_001}))
            .await,
        "bad_request"
    );
    // No readable `seq`: answered without one.
    f.peer.send_raw(r#"{"op": "report"}"#).await;
    let response = f.peer.unsequenced().await;
    assert_eq!(error_code(&response), "bad_request");
    assert!(response.get("seq").is_none());
}

#[tokio::test]
async fn strict_json_duplicate_keys_and_nulls_are_bad_requests() {
    let mut f = fixture().await;
    f.peer
        .send_raw(r#"{"seq": 7, "op": "hold", "call": "prepare", "call": "start"}"#)
        .await;
    let response = f.peer.response(7).await;
    assert_eq!(error_code(&response), "bad_request");
    assert!(
        response["error"]["message"]
            .as_str()
            .unwrap()
            .contains("duplicate key")
    );

    f.peer
        .send_raw(r#"{"seq": 8, "op": "await", "call": "start", "match": null}"#)
        .await;
    assert_eq!(error_code(&f.peer.response(8).await), "bad_request");

    // A duplicated `seq` has no single value to echo.
    f.peer
        .send_raw(r#"{"seq": 9, "seq": 10, "op": "report"}"#)
        .await;
    let response = f.peer.unsequenced().await;
    assert_eq!(error_code(&response), "bad_request");

    // Nothing was applied: the next prepare is neither held nor failed.
    within(f.adapter.prepare(prepare_request("ex-1")))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_over_long_line_is_refused_and_the_channel_continues() {
    let mut f = fixture().await;
    let long = format!(
        r#"{{"seq": 1, "op": "report", "pad": "{}"}}"#,
        "x".repeat(MAX_LINE_BYTES)
    );
    f.peer.send_raw(&long).await;
    let response = f.peer.unsequenced().await;
    assert_eq!(error_code(&response), "bad_request");
    f.peer.next_seq = 1;
    assert_eq!(
        f.peer.ok(json!({"op": "report"})).await,
        json!({"calls": []})
    );
}

#[tokio::test]
async fn call_records_have_the_documented_fields() {
    let mut f = fixture().await;
    let adapter = &f.adapter;
    within(adapter.prepare(prepare_request("ex-1")))
        .await
        .unwrap();
    let _events = start_run(adapter, "r1").await;
    within(adapter.resolve_permission(
        &run("r1"),
        &InteractionId::new("p1").unwrap(),
        PermissionVerdict::Allow,
    ))
    .await
    .unwrap();
    let decision = PromptForUserChoiceDecision {
        delivery_id: crate::core_runtime::wire::DeliveryId::new("d1").unwrap(),
        question_answers: None,
        cancelled: Some(true),
    };
    within(adapter.resolve_user_choice(&run("r1"), &InteractionId::new("a1").unwrap(), &decision))
        .await
        .unwrap();
    within(adapter.function_result(&run("r1"), &CallId::new("c1").unwrap(), "out", true))
        .await
        .unwrap();
    within(adapter.close_executor(&executor("ex-1")))
        .await
        .unwrap();

    let report = f.peer.ok(json!({"op": "report"})).await;
    assert_eq!(
        report["calls"],
        json!([
            {"call": "prepare", "executor_id": "ex-1",
             "session_id": "6f1c2a8e-1b2c-4d3e-8f9a-0b1c2d3e4f5a",
             "agent_kind": "controlled", "configuration": {}},
            {"call": "start", "executor_id": "ex-1", "run_id": "r1",
             "input": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]},
            {"call": "resolve_permission", "run_id": "r1", "request_id": "p1", "decision": "allow"},
            {"call": "resolve_user_choice", "run_id": "r1", "ask_id": "a1",
             "decision": {"delivery_id": "d1", "cancelled": true}},
            {"call": "function_result", "run_id": "r1", "call_id": "c1", "output": "out", "is_error": true},
            {"call": "close_executor", "executor_id": "ex-1"},
        ])
    );
}
