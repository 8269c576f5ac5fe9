//! Unit tests of the command adapter (real processes, no Runtime).

use super::output::stderr_tail;
use super::*;
use crate::core_runtime::adapter::RUN_EVENT_QUEUE;
use crate::core_runtime::wire::{ExecutionConfiguration, InputRole, Text};
use crate::wire::bounded::{Base64Bytes, BoundedString, BoundedVec};
use nix::errno::Errno;
use nix::sys::signal::kill;
use tokio::sync::mpsc;

/// Bound of every test step, so a broken adapter fails instead of hanging.
const STEP: Duration = Duration::from_secs(20);

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(STEP, future)
        .await
        .expect("test step timed out")
}

struct Fixture {
    adapter: Arc<CommandAdapter>,
    dir: tempfile::TempDir,
}

fn fixture_with(script: &str, stdin: StdinMode, max_processes: usize) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CommandConfig::new("/bin/sh", dir.path());
    config.args = vec!["-c".into(), script.into()];
    config.stdin = stdin;
    config.max_processes = max_processes;
    config.kill_grace = Duration::from_millis(500);
    config.output_drain_grace = Duration::from_millis(200);
    Fixture {
        adapter: CommandAdapter::new(config).unwrap(),
        dir,
    }
}

fn fixture(script: &str) -> Fixture {
    fixture_with(script, StdinMode::Close, 4)
}

/// A `/bin/sh -c script` fixture speaking the `jsonl` protocol.
fn fixture_jsonl(script: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CommandConfig::new("/bin/sh", dir.path());
    config.args = vec!["-c".into(), script.into()];
    config.stdin = StdinMode::Open;
    config.protocol = ProgramProtocol::Jsonl;
    config.kill_grace = Duration::from_millis(500);
    config.output_drain_grace = Duration::from_millis(200);
    Fixture {
        adapter: CommandAdapter::new(config).unwrap(),
        dir,
    }
}

/// The `Error` event's message (panics on anything else).
fn error_message(event: &NativeEvent) -> &str {
    match event {
        NativeEvent::Error { message, .. } => message,
        other => panic!("expected an error, got {other:?}"),
    }
}

fn run(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

fn executor(id: &str) -> ExecutorId {
    ExecutorId::new(id).unwrap()
}

const SESSION: &str = "6f1c2a8e-1b2c-4d3e-8f9a-0b1c2d3e4f5a";

fn message(parts: Vec<ContentPart>) -> MessageInput {
    MessageInput {
        role: InputRole::User,
        content: BoundedVec::new(parts).unwrap(),
    }
}

fn text(t: &str) -> ContentPart {
    ContentPart::Text {
        text: Text::new(t).unwrap(),
    }
}

fn image() -> ContentPart {
    ContentPart::Image {
        media_type: BoundedString::new("image/png").unwrap(),
        data: Base64Bytes::new(vec![0x89, b'P', b'N', b'G']).unwrap(),
    }
}

async fn prepare(adapter: &CommandAdapter, executor_id: &str) {
    within(adapter.prepare(NativePrepare {
        executor_id: executor(executor_id),
        session_id: Uuid::new(SESSION).unwrap(),
        agent_kind: AgentKind::new(AGENT_KIND).unwrap(),
        configuration: ExecutionConfiguration::default(),
    }))
    .await
    .unwrap();
}

/// Prepares `ex-<run_id>` and starts `run_id` on it with `input`.
async fn start(
    adapter: &CommandAdapter,
    run_id: &str,
    input: Vec<MessageInput>,
) -> mpsc::Receiver<NativeEvent> {
    let executor_id = format!("ex-{run_id}");
    prepare(adapter, &executor_id).await;
    let (tx, rx) = mpsc::channel(RUN_EVENT_QUEUE);
    within(adapter.start(
        NativeStart {
            executor_id: executor(&executor_id),
            run_id: run(run_id),
            input,
        },
        tx,
    ))
    .await
    .unwrap();
    rx
}

async fn next(rx: &mut mpsc::Receiver<NativeEvent>) -> NativeEvent {
    within(rx.recv()).await.expect("event stream ended")
}

/// Every event until (and including) `Settled`; the stream must then end.
async fn until_settled(rx: &mut mpsc::Receiver<NativeEvent>) -> Vec<NativeEvent> {
    let mut events = Vec::new();
    loop {
        let event = next(rx).await;
        let settled = matches!(event, NativeEvent::Settled { .. });
        events.push(event);
        if settled {
            assert!(within(rx.recv()).await.is_none(), "event after Settled");
            return events;
        }
    }
}

fn delta(t: &str) -> NativeEvent {
    NativeEvent::Delta {
        text: t.into(),
        item_id: None,
    }
}

fn settled(outcome: Outcome) -> NativeEvent {
    NativeEvent::Settled {
        outcome,
        native_session_id: None,
    }
}

fn pid_of(event: &NativeEvent) -> Pid {
    match event {
        NativeEvent::Delta { text, .. } => Pid::from_raw(text.trim().parse().unwrap()),
        other => panic!("expected a pid delta, got {other:?}"),
    }
}

fn assert_gone(pid: Pid) {
    assert_eq!(kill(pid, None), Err(Errno::ESRCH), "process {pid} survived");
}

#[tokio::test]
async fn stdout_lines_become_deltas_then_completed() {
    let f = fixture("echo one; printf 'two\\n'; printf 'three'");
    let mut rx = start(&f.adapter, "r1", vec![message(vec![text("hi")])]).await;
    assert_eq!(
        until_settled(&mut rx).await,
        vec![
            delta("one\n"),
            delta("two\n"),
            delta("three"),
            settled(Outcome::Completed)
        ]
    );
}

#[tokio::test]
async fn non_zero_exit_is_an_unclassified_error_then_failed() {
    let f = fixture(
        "echo partial; echo 'first problem' >&2; echo 'disk on fire' >&2; echo >&2; exit 3",
    );
    let mut rx = start(&f.adapter, "r1", vec![]).await;
    let events = until_settled(&mut rx).await;
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0], delta("partial\n"));
    assert_eq!(
        events[1],
        NativeEvent::Error {
            message: "program exited with status 3: disk on fire".into(),
            code: None,
            http_status: None,
        }
    );
    assert_eq!(events[2], settled(Outcome::Failed));
}

#[tokio::test]
async fn killed_by_a_foreign_signal_is_failed() {
    let f = fixture("kill -9 $$");
    let mut rx = start(&f.adapter, "r1", vec![]).await;
    let events = until_settled(&mut rx).await;
    assert!(
        matches!(&events[0], NativeEvent::Error { message, .. } if message == "program was terminated by signal 9"),
        "{events:?}"
    );
    assert_eq!(events[1], settled(Outcome::Failed));
}

#[tokio::test]
async fn stdin_receives_the_input_in_order_then_eof() {
    let f = fixture("cat; echo end");
    let input = vec![
        message(vec![text("a"), text("b")]),
        message(vec![text("c")]),
    ];
    let mut rx = start(&f.adapter, "r1", input).await;
    assert_eq!(
        until_settled(&mut rx).await,
        vec![
            delta("ab\n"),
            delta("c\n"),
            delta("end\n"),
            settled(Outcome::Completed)
        ]
    );
}

#[tokio::test]
async fn environment_is_cleared_and_cwd_is_the_configured_directory() {
    let f = fixture(
        "echo \"$CONTRACT_RUN_ID|$CONTRACT_SESSION_ID|${CARGO_MANIFEST_DIR-unset}|${PATH:+path}\"; pwd -P",
    );
    let mut rx = start(&f.adapter, "r-env", vec![]).await;
    let events = until_settled(&mut rx).await;
    assert_eq!(events[0], delta(&format!("r-env|{SESSION}|unset|path\n")));
    let cwd = std::fs::canonicalize(f.dir.path()).unwrap();
    assert_eq!(events[1], delta(&format!("{}\n", cwd.display())));
}

#[tokio::test]
async fn long_lines_are_split_and_invalid_utf8_is_lossy() {
    let f = fixture("head -c 150000 /dev/zero | tr '\\000' a; echo; printf 'bad \\377 byte\\n'");
    let mut rx = start(&f.adapter, "r1", vec![]).await;
    let events = until_settled(&mut rx).await;
    let texts: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            NativeEvent::Delta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        texts.len(),
        4,
        "{:?}",
        texts.iter().map(|t| t.len()).collect::<Vec<_>>()
    );
    assert!(texts.iter().all(|t| t.len() <= STDOUT_LINE_MAX_BYTES));
    assert_eq!(texts[..3].concat(), format!("{}\n", "a".repeat(150_000)));
    assert_eq!(texts[3], "bad \u{FFFD} byte\n");
    assert_eq!(events.last(), Some(&settled(Outcome::Completed)));
}

#[test]
fn utf8_cut_moves_a_split_character_to_the_next_piece() {
    assert_eq!(utf8_cut(b"abcd"), 4);
    assert_eq!(utf8_cut("ab\u{e9}".as_bytes()), 4); // complete 2-byte char
    assert_eq!(utf8_cut(&"ab\u{20ac}".as_bytes()[..4]), 2); // 2 of 3 bytes
    assert_eq!(utf8_cut(&"a\u{1F600}".as_bytes()[..4]), 1); // 3 of 4 bytes
    assert_eq!(utf8_cut(&[b'a', 0xff, 0xff]), 3); // invalid bytes stay
}

#[test]
fn stderr_tail_is_bounded() {
    let mut tail = stderr_tail();
    for i in 0..1000 {
        tail.push(format!("line {i}\n").as_bytes());
    }
    assert_eq!(tail.lines().count(), STDERR_TAIL_LINES);
    assert_eq!(tail.last_line().as_deref(), Some("line 999"));
    let long = vec![b'x'; STDERR_LINE_MAX_BYTES];
    for _ in 0..10 {
        tail.push(&long);
        tail.push(b"\n");
    }
    assert!(tail.text().len() <= STDERR_TAIL_BYTES);
    // A line longer than the line bound is cut there.
    tail.push(&vec![b'y'; 3 * STDERR_LINE_MAX_BYTES]);
    tail.push(b"\n");
    let last = tail.lines().last().unwrap();
    assert_eq!(last.len(), STDERR_LINE_MAX_BYTES + '…'.len_utf8());
}

#[tokio::test]
async fn cancel_kills_the_whole_process_tree() {
    let f = fixture("sleep 1000 & echo \"$!\"; wait");
    let mut rx = start(&f.adapter, "r1", vec![message(vec![text("x")])]).await;
    let grandchild = pid_of(&next(&mut rx).await);
    assert_eq!(kill(grandchild, None), Ok(()));
    let settlement = within(f.adapter.cancel(&run("r1"))).await.unwrap();
    assert_eq!(settlement, CancelSettlement::StreamSettles);
    // Confirmed: the program was reaped and its group is empty.
    assert_gone(grandchild);
    assert_eq!(
        until_settled(&mut rx).await,
        vec![settled(Outcome::Cancelled)]
    );
    // Nothing is left to cancel.
    assert!(matches!(
        within(f.adapter.cancel(&run("r1"))).await,
        Err(AdapterError::Refused(_))
    ));
}

#[tokio::test]
async fn cancel_escalates_to_sigkill_when_sigterm_is_ignored() {
    let f = fixture("trap '' TERM; sleep 1000 & echo \"$!\"; while :; do wait; done");
    let mut rx = start(&f.adapter, "r1", vec![]).await;
    let grandchild = pid_of(&next(&mut rx).await);
    let settlement = within(f.adapter.cancel(&run("r1"))).await.unwrap();
    assert_eq!(settlement, CancelSettlement::StreamSettles);
    assert_gone(grandchild);
    assert_eq!(
        until_settled(&mut rx).await,
        vec![settled(Outcome::Cancelled)]
    );
}

#[tokio::test]
async fn processes_left_behind_are_terminated_before_settling() {
    let f = fixture("sleep 1000 & echo \"$!\"");
    let mut rx = start(&f.adapter, "r1", vec![]).await;
    let events = until_settled(&mut rx).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1], settled(Outcome::Completed));
    assert_gone(pid_of(&events[0]));
    assert!(matches!(
        within(f.adapter.cancel(&run("r1"))).await,
        Err(AdapterError::Refused(_))
    ));
}

#[tokio::test]
async fn images_are_refused_before_anything_runs() {
    let f = fixture_with("read l; echo \"$l\"", StdinMode::Open, 4);
    prepare(&f.adapter, "ex-1").await;
    let (tx, mut rx) = mpsc::channel(RUN_EVENT_QUEUE);
    let err = within(f.adapter.start(
        NativeStart {
            executor_id: executor("ex-1"),
            run_id: run("r1"),
            input: vec![message(vec![text("look:"), image()])],
        },
        tx,
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, AdapterError::Refused(_)), "{err:?}");
    assert!(within(rx.recv()).await.is_none());
    // Active input with an image is refused too.
    let mut rx = start(&f.adapter, "r2", vec![message(vec![text("go")])]).await;
    let err = within(f.adapter.write_input(
        &run("r2"),
        &InputId::new("i1").unwrap(),
        &[message(vec![image()])],
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, AdapterError::Refused(_)), "{err:?}");
    assert_eq!(
        until_settled(&mut rx).await,
        vec![delta("go\n"), settled(Outcome::Completed)]
    );
}

#[tokio::test]
async fn write_input_reaches_the_running_program() {
    let f = fixture_with(
        "read first; echo \"first:$first\"; read second; echo \"second:$second\"",
        StdinMode::Open,
        4,
    );
    let mut rx = start(&f.adapter, "r1", vec![message(vec![text("one")])]).await;
    assert_eq!(next(&mut rx).await, delta("first:one\n"));
    within(f.adapter.write_input(
        &run("r1"),
        &InputId::new("i1").unwrap(),
        &[message(vec![text("two")])],
    ))
    .await
    .unwrap();
    assert_eq!(
        until_settled(&mut rx).await,
        vec![delta("second:two\n"), settled(Outcome::Completed)]
    );
    // No InputAccepted was emitted (consumption cannot be confirmed).
}

#[tokio::test]
async fn write_input_without_open_stdin_is_unsupported() {
    let f = fixture("cat >/dev/null; sleep 1000");
    let mut rx = start(&f.adapter, "r1", vec![]).await;
    let err = within(f.adapter.write_input(
        &run("r1"),
        &InputId::new("i1").unwrap(),
        &[message(vec![text("late")])],
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, AdapterError::Unsupported(_)), "{err:?}");
    within(f.adapter.cancel(&run("r1"))).await.unwrap();
    assert_eq!(
        until_settled(&mut rx).await,
        vec![settled(Outcome::Cancelled)]
    );
}

#[tokio::test]
async fn process_bound_and_close_executor() {
    let f = fixture_with("echo started; sleep 1000", StdinMode::Close, 1);
    let mut rx = start(&f.adapter, "r1", vec![]).await;
    assert_eq!(next(&mut rx).await, delta("started\n"));
    prepare(&f.adapter, "ex-2").await;
    let (tx, _rx2) = mpsc::channel(RUN_EVENT_QUEUE);
    let err = within(f.adapter.start(
        NativeStart {
            executor_id: executor("ex-2"),
            run_id: run("r2"),
            input: vec![],
        },
        tx,
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, AdapterError::Refused(_)), "{err:?}");
    // Closing the Executor stops its program.
    within(f.adapter.close_executor(&executor("ex-r1")))
        .await
        .unwrap();
    let events = until_settled(&mut rx).await;
    assert!(matches!(events[0], NativeEvent::Error { .. }), "{events:?}");
    assert_eq!(events[1], settled(Outcome::Failed));
    // The slot is free again.
    let mut rx = start(&f.adapter, "r3", vec![]).await;
    assert_eq!(next(&mut rx).await, delta("started\n"));
    within(f.adapter.cancel(&run("r3"))).await.unwrap();
    // Closing an unknown (or read-only, never natively prepared) Executor is a no-op.
    within(f.adapter.close_executor(&executor("never")))
        .await
        .unwrap();
}

#[tokio::test]
async fn start_requires_a_prepared_executor() {
    let f = fixture("true");
    let (tx, _rx) = mpsc::channel(RUN_EVENT_QUEUE);
    let err = within(f.adapter.start(
        NativeStart {
            executor_id: executor("missing"),
            run_id: run("r1"),
            input: vec![],
        },
        tx,
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, AdapterError::Refused(_)), "{err:?}");
}

#[tokio::test]
async fn environment_none_runs_in_a_private_empty_directory() {
    let f = fixture("ls -A | wc -l; pwd -P");
    std::fs::write(f.dir.path().join("workspace-file"), b"x").unwrap();
    let configuration = ExecutionConfiguration {
        disable_execution_environment: Some(true),
        ..ExecutionConfiguration::default()
    };
    within(f.adapter.prepare(NativePrepare {
        executor_id: executor("ex-none"),
        session_id: Uuid::new(SESSION).unwrap(),
        agent_kind: AgentKind::new(AGENT_KIND).unwrap(),
        configuration,
    }))
    .await
    .unwrap();
    let (tx, mut rx) = mpsc::channel(RUN_EVENT_QUEUE);
    within(f.adapter.start(
        NativeStart {
            executor_id: executor("ex-none"),
            run_id: run("r1"),
            input: vec![],
        },
        tx,
    ))
    .await
    .unwrap();
    let events = until_settled(&mut rx).await;
    assert_eq!(events[0], delta("0\n"), "{events:?}");
    let NativeEvent::Delta { text: dir, .. } = &events[1] else {
        panic!("{events:?}")
    };
    let dir = PathBuf::from(dir.trim_end());
    assert!(dir.is_dir());
    within(f.adapter.close_executor(&executor("ex-none")))
        .await
        .unwrap();
    assert!(!dir.exists());
}

#[tokio::test]
async fn prepare_refuses_a_program_that_vanished_or_is_not_executable() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("prog");
    std::fs::write(&program, "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let adapter = CommandAdapter::new(CommandConfig::new(&program, dir.path())).unwrap();
    prepare(&adapter, "ex-1").await;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o644)).unwrap();
    let request = NativePrepare {
        executor_id: executor("ex-2"),
        session_id: Uuid::new(SESSION).unwrap(),
        agent_kind: AgentKind::new(AGENT_KIND).unwrap(),
        configuration: ExecutionConfiguration::default(),
    };
    assert!(matches!(
        within(adapter.prepare(request.clone())).await,
        Err(AdapterError::Refused(_))
    ));
    std::fs::remove_file(&program).unwrap();
    assert!(matches!(
        within(adapter.prepare(request)).await,
        Err(AdapterError::Refused(_))
    ));
}

#[test]
fn construction_validates_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let err = CommandAdapter::new(CommandConfig::new("/no/such/program", dir.path())).unwrap_err();
    assert_eq!(err.code(), "program_not_found");
    let err = CommandAdapter::new(CommandConfig::new("definitely-not-on-path-xyz", dir.path()))
        .unwrap_err();
    assert_eq!(err.code(), "program_not_found");
    let err = CommandAdapter::new(CommandConfig::new(dir.path(), dir.path())).unwrap_err();
    assert_eq!(err.code(), "program_not_executable");
    let err =
        CommandAdapter::new(CommandConfig::new("/bin/sh", dir.path().join("missing"))).unwrap_err();
    assert_eq!(err.code(), "invalid_working_directory");
    let mut config = CommandConfig::new("/bin/sh", dir.path());
    config.max_processes = 0;
    assert_eq!(
        CommandAdapter::new(config).unwrap_err().code(),
        "invalid_limit"
    );
    // A bare name is looked up in PATH.
    let adapter = CommandAdapter::new(CommandConfig::new("sh", dir.path())).unwrap();
    assert!(adapter.config().program.is_absolute());
}

#[test]
fn declaration_is_honest_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let adapter = CommandAdapter::new(CommandConfig::new("/bin/sh", dir.path())).unwrap();
    let declarations = adapter.declarations();
    assert_eq!(declarations.len(), 1);
    let d = &declarations[0];
    assert_eq!(d.agent_kind.as_str(), AGENT_KIND);
    assert!(d.available);
    let expected_true = [
        "streaming",
        "preparation",
        "execution_controls",
        "programmatic_tool_calling_disable",
        "subagent_control",
        "environment_none",
        "local_environment",
        "workspace_read_preparation",
        "workspace_output_export",
    ];
    for field in AgentKindCapabilities::FIELDS {
        assert_eq!(
            d.capabilities.get(field),
            Some(expected_true.contains(&field)),
            "{field}"
        );
    }
    assert!(CommandAdapter::capabilities(ProgramProtocol::Plain, StdinMode::Open).steering);
    assert!(
        !CommandAdapter::capabilities(ProgramProtocol::Plain, StdinMode::Open)
            .durable_input_receipts
    );
}

#[test]
fn jsonl_records_decode_strictly() {
    assert_eq!(decode_record(b"  \n"), Ok(None));
    assert_eq!(
        decode_record(b"{\"type\":\"delta\",\"text\":\"hi\"}\n"),
        Ok(Some(ProgramRecord::Delta { text: "hi".into() }))
    );
    let call = decode_record(
        br#"{"type":"tool_call","call_id":"c1","tool_name":"ls","state":"completed","observation":{"kind":"command","summary":"ls -l"}}"#,
    )
    .unwrap()
    .unwrap();
    assert!(matches!(call, ProgramRecord::ToolCall(ref c) if c.call_id.as_str() == "c1"));
    assert_eq!(
        decode_record(br#"{"type":"usage","output_tokens":7}"#),
        Ok(Some(ProgramRecord::Usage(Usage {
            output_tokens: Some(7),
            ..Usage::default()
        })))
    );
    assert_eq!(
        decode_record(br#"{"type":"error","message":"m","http_status":"x"}"#),
        Ok(Some(ProgramRecord::Error {
            message: "m".into(),
            code: None,
            http_status: Some(Value::from("x")),
        }))
    );
    for bad in [
        &br#"{"type":"delta","text":"hi","extra":1}"#[..],
        br#"{"type":"delta"}"#,
        br#"{"type":"shout","text":"hi"}"#,
        br#"{"text":"hi"}"#,
        br#"{"type":"usage","output_tokens":-1}"#,
        br#"{"type":"tool_call","call_id":"c1","tool_name":"ls","state":"running","observation":{"kind":"k","summary":"s"}}"#,
        b"[1,2]",
        b"delta hi",
    ] {
        let err = decode_record(bad).unwrap_err();
        assert_eq!(err.code(), "invalid_record", "{}", String::from_utf8_lossy(bad));
    }
    assert_eq!(decode_record(b"{\xff}\n"), Err(RecordError::NotUtf8));
    // The bound counts the `\n`, present or missing.
    let mut long = vec![b' '; JSONL_RECORD_MAX_BYTES - 1];
    long.push(b'\n');
    assert_eq!(decode_record(&long), Ok(None));
    long.pop();
    long.push(b' ');
    assert_eq!(
        decode_record(&long),
        Err(RecordError::TooLong {
            max: JSONL_RECORD_MAX_BYTES
        })
    );
}

#[test]
fn jsonl_input_lines_carry_the_content_parts() {
    let line = jsonl_input_line(
        INITIAL_INPUT_ID,
        &[message(vec![text("a")]), message(vec![text("b\nc")])],
    )
    .unwrap();
    assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
    let record: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        record,
        serde_json::json!({"type": "input", "input_id": "initial", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b\nc"}]})
    );
    assert!(matches!(
        jsonl_input_line("i1", &[message(vec![image()])]),
        Err(AdapterError::Refused(_))
    ));
}

#[tokio::test]
async fn jsonl_run_streams_typed_events_and_confirms_written_inputs() {
    let f = fixture_jsonl(concat!(
        "read first; printf '%s\\n' \"$first\" > initial.jsonl; ",
        r#"echo '{"type":"delta","text":"one"}'; "#,
        r#"echo '{"type":"tool_call","call_id":"c1","tool_name":"t","state":"started","observation":{"kind":"command","summary":"s"}}'; "#,
        "read second; printf '%s\\n' \"$second\" > active.jsonl; ",
        r#"echo '{"type":"accepted","input_id":"initial"}'; "#,
        r#"echo '{"type":"accepted","input_id":"i1"}'; "#,
        r#"echo '{"type":"usage","input_tokens":3}'"#,
    ));
    let mut rx = start(&f.adapter, "r1", vec![message(vec![text("hello")])]).await;
    assert_eq!(next(&mut rx).await, delta("one"));
    assert!(matches!(next(&mut rx).await, NativeEvent::ToolCall(_)));
    // The Turn's own ID is reserved; a real input is written as one record.
    let reserved = within(f.adapter.write_input(
        &run("r1"),
        &InputId::new(INITIAL_INPUT_ID).unwrap(),
        &[message(vec![text("x")])],
    ))
    .await;
    assert!(
        matches!(reserved, Err(AdapterError::Refused(_))),
        "{reserved:?}"
    );
    within(f.adapter.write_input(
        &run("r1"),
        &InputId::new("i1").unwrap(),
        &[message(vec![text("more")])],
    ))
    .await
    .unwrap();
    assert_eq!(
        until_settled(&mut rx).await,
        vec![
            NativeEvent::InputAccepted {
                input_id: InputId::new("i1").unwrap()
            },
            NativeEvent::Usage(Usage {
                input_tokens: Some(3),
                ..Usage::default()
            }),
            settled(Outcome::Completed)
        ]
    );
    let initial = std::fs::read_to_string(f.dir.path().join("initial.jsonl")).unwrap();
    assert_eq!(
        initial,
        jsonl_input_line(INITIAL_INPUT_ID, &[message(vec![text("hello")])]).unwrap()
    );
    let active = std::fs::read_to_string(f.dir.path().join("active.jsonl")).unwrap();
    assert_eq!(
        active,
        jsonl_input_line("i1", &[message(vec![text("more")])]).unwrap()
    );
}

/// Runs `script` (jsonl) to its end; returns every event.
async fn jsonl_events(script: &str) -> Vec<NativeEvent> {
    let f = fixture_jsonl(script);
    let mut rx = start(&f.adapter, "r1", vec![message(vec![text("go")])]).await;
    let events = until_settled(&mut rx).await;
    // The Run's process group is gone once it settled.
    assert!(f.adapter.shared.lock().runs.is_empty());
    events
}

#[tokio::test]
async fn malformed_records_fail_the_run_and_stop_the_program() {
    let cases = [
        (
            r#"echo '{"type":"delta","text":"ok"}'; echo 'not json'; echo '{"type":"delta","text":"late"}'; sleep 1000"#,
            "stdout record 2: not a valid record",
        ),
        (
            r#"echo '{"type":"accepted","input_id":"never"}'; sleep 1000"#,
            "(unknown_input)",
        ),
        (
            "head -c 1100000 /dev/zero | tr '\\0' a; echo; sleep 1000",
            "(record_too_long)",
        ),
        // A violation fails the Run even when the program then exits 0.
        (
            r#"echo '{"type":"delta","txt":"x"}'"#,
            "unknown field `txt`",
        ),
    ];
    for (script, expected) in cases {
        let events = jsonl_events(script).await;
        let n = events.len();
        assert!(n >= 2, "{events:?}");
        let message = error_message(&events[n - 2]);
        assert!(
            message.starts_with("program protocol violation: stdout record ")
                && message.contains(expected),
            "{script}: {message}"
        );
        assert_eq!(events[n - 1], settled(Outcome::Failed));
        assert!(!events.contains(&delta("late")), "{events:?}");
    }
}

#[tokio::test]
async fn a_reported_error_is_the_failure_of_a_non_zero_exit() {
    let events = jsonl_events(
        r#"echo '{"type":"error","message":"quota","code":"usage_limit_exceeded","http_status":429}'; exit 3"#,
    )
    .await;
    assert_eq!(
        events,
        vec![
            NativeEvent::Error {
                message: "quota".into(),
                code: Some(Value::from("usage_limit_exceeded")),
                http_status: Some(Value::from(429)),
            },
            settled(Outcome::Failed)
        ]
    );
    // Without an error record, the exit status is reported as in plain mode.
    let events = jsonl_events("exit 4").await;
    assert!(error_message(&events[0]).contains("status 4"), "{events:?}");
}

#[tokio::test]
async fn jsonl_cancel_kills_the_whole_tree() {
    let f = fixture_jsonl(r#"sleep 1000 & echo "{\"type\":\"delta\",\"text\":\"$!\"}"; wait"#);
    let mut rx = start(&f.adapter, "r1", vec![message(vec![text("go")])]).await;
    let child = pid_of(&next(&mut rx).await);
    assert_eq!(
        within(f.adapter.cancel(&run("r1"))).await,
        Ok(CancelSettlement::StreamSettles)
    );
    assert_eq!(
        until_settled(&mut rx).await,
        vec![settled(Outcome::Cancelled)]
    );
    assert_gone(child);
}

#[test]
fn jsonl_requires_open_stdin_and_declares_its_receipts() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CommandConfig::new("/bin/sh", dir.path());
    config.protocol = ProgramProtocol::Jsonl;
    let err = CommandAdapter::new(config.clone()).unwrap_err();
    assert_eq!(err.code(), "incompatible_options");
    config.stdin = StdinMode::Open;
    let adapter = CommandAdapter::new(config).unwrap();
    let caps = &adapter.declarations()[0].capabilities;
    let expected_true = [
        "streaming",
        "steering",
        "durable_turns",
        "durable_input_receipts",
        "preparation",
        "execution_controls",
        "tool_observations",
        "usage",
        "programmatic_tool_calling_disable",
        "subagent_control",
        "environment_none",
        "local_environment",
        "workspace_read_preparation",
        "workspace_output_export",
    ];
    for field in AgentKindCapabilities::FIELDS {
        assert_eq!(
            caps.get(field),
            Some(expected_true.contains(&field)),
            "{field}"
        );
    }
}

#[tokio::test]
async fn interactions_and_function_results_are_unsupported() {
    let f = fixture("true");
    let r = run("r1");
    let id = InteractionId::new("q1").unwrap();
    assert!(matches!(
        f.adapter
            .resolve_permission(&r, &id, PermissionVerdict::Allow)
            .await,
        Err(AdapterError::Unsupported(_))
    ));
    assert!(matches!(
        f.adapter
            .function_result(&r, &CallId::new("c1").unwrap(), "out", false)
            .await,
        Err(AdapterError::Unsupported(_))
    ));
}
