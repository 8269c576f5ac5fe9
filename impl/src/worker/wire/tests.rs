use serde_json::json;

use super::*;

fn frame(message: Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"version": 1, "session_id": "root", "generation": "g-1", "message": message}),
    )
    .unwrap()
}

const HOST: Expect<'static> = Expect {
    session_id: "root",
    generation: "g-1",
    direction: Direction::HostToWorker,
};

const WORKER: Expect<'static> = Expect {
    session_id: "root",
    generation: "g-1",
    direction: Direction::WorkerToHost,
};

fn code(payload: &[u8], expect: &Expect<'_>) -> &'static str {
    decode_envelope(payload, Some(expect)).unwrap_err().code()
}

#[test]
fn the_spec_example_decodes_and_encodes_back() {
    let text =
        br#"{"version":1,"session_id":"root","generation":"g-1","message":{"kind":"shutdown"}}"#;
    let env = decode_envelope(text, Some(&HOST)).unwrap();
    assert_eq!(env.message, Message::Shutdown {});
    assert_eq!(encode_envelope(&env).unwrap(), text.to_vec());
}

#[test]
fn hello_per_role() {
    let wb = frame(
        json!({"kind": "hello", "token": "t0k", "role": "workbench", "revision": null, "slots": []}),
    );
    assert!(decode_envelope(&wb, Some(&WORKER)).is_ok());
    // A workbench started with a skills set echoes its revision ("Skills").
    let skilled = frame(
        json!({"kind": "hello", "token": "t0k", "role": "workbench", "revision": "abc", "slots": []}),
    );
    assert!(decode_envelope(&skilled, Some(&WORKER)).is_ok());
    let hooks = frame(
        json!({"kind": "hello", "token": "t0k", "role": "hooks", "revision": "abc",
                              "slots": ["attention.plan", "delivery.review"]}),
    );
    assert!(decode_envelope(&hooks, Some(&WORKER)).is_ok());
    for bad in [
        json!({"kind": "hello", "token": "t0k", "role": "workbench", "revision": null, "slots": ["attention.plan"]}),
        json!({"kind": "hello", "token": "t0k", "role": "hooks", "revision": null, "slots": ["attention.plan", "delivery.review"]}),
        json!({"kind": "hello", "token": "t0k", "role": "hooks", "revision": "abc", "slots": ["delivery.review"]}),
    ] {
        assert_eq!(code(&frame(bad), &WORKER), "bound_exceeded");
    }
    // revision is required even when null.
    let missing = frame(json!({"kind": "hello", "token": "t0k", "role": "workbench", "slots": []}));
    assert_eq!(code(&missing, &WORKER), "missing_field");
}

#[test]
fn every_refusal_has_its_code() {
    let ok = frame(json!({"kind": "execute", "id": "c1", "code": "1"}));
    assert!(decode_envelope(&ok, Some(&HOST)).is_ok());
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"\xff\xfe".to_vec(), "not_utf8"),
        (b"{".to_vec(), "malformed_json"),
        (br#"{"version":1,"session_id":"root","generation":"g-1","message":{"kind":"execute","id":"c1","code":"1","code":"2"}}"#.to_vec(), "duplicate_key"),
        (br#"{"version":1,"session_id":"root","generation":"g-1","message":{"kind":"host_reply","id":"r","execution_id":"c1","reply":{"kind":"ok","value":{"a":1,"a":2}}}}"#.to_vec(), "duplicate_key"),
        (br#"{"version":1,"session_id":"root","generation":"g-1","message":{"kind":"host_reply","id":"r","execution_id":"c1","reply":{"kind":"ok","value":NaN}}}"#.to_vec(), "malformed_json"),
        (frame(json!({"kind": "execute", "id": "c1", "code": "1", "extra": 1})), "unknown_field"),
        (frame(json!({"kind": "execute", "id": "c1"})), "missing_field"),
        (frame(json!({"kind": "launch"})), "unknown_kind"),
        (frame(json!({"kind": "execute", "id": "c 1", "code": "1"})), "invalid_value"),
        (frame(json!({"kind": "execute", "id": "x".repeat(129), "code": "1"})), "invalid_value"),
        (frame(json!({"kind": "execute", "id": "c1", "code": "x".repeat(CELL_SOURCE_MAX_BYTES + 1)})), "bound_exceeded"),
        (frame(json!({"kind": "completed", "id": "c1", "result": {"kind": "failed", "error": "x"}})), "wrong_direction"),
        (serde_json::to_vec(&json!({"version": 2, "session_id": "root", "generation": "g-1", "message": {"kind": "shutdown"}})).unwrap(), "version_mismatch"),
        (serde_json::to_vec(&json!({"version": 1, "session_id": "other", "generation": "g-1", "message": {"kind": "shutdown"}})).unwrap(), "session_mismatch"),
        (serde_json::to_vec(&json!({"version": 1, "session_id": "root", "generation": "g-2", "message": {"kind": "shutdown"}})).unwrap(), "generation_mismatch"),
        (serde_json::to_vec(&json!({"version": 1, "session_id": "root", "generation": "g-1", "message": {"kind": "shutdown"}, "x": 1})).unwrap(), "unknown_field"),
        (serde_json::to_vec(&json!({"version": 1, "session_id": "root", "message": {"kind": "shutdown"}})).unwrap(), "missing_field"),
    ];
    for (payload, want) in cases {
        assert_eq!(
            code(&payload, &HOST),
            want,
            "{}",
            String::from_utf8_lossy(&payload)
        );
    }
    // The source bound itself is allowed.
    let at =
        frame(json!({"kind": "execute", "id": "c1", "code": "x".repeat(CELL_SOURCE_MAX_BYTES)}));
    assert!(decode_envelope(&at, Some(&HOST)).is_ok());
}

#[test]
fn output_bounds_at_and_one_past() {
    let cell = |records: usize, each: usize| {
        let output: Vec<Value> = (0..records)
            .map(|_| json!({"stream": "stdout", "text": "x".repeat(each)}))
            .collect();
        frame(
            json!({"kind": "completed", "id": "c1", "result": {"kind": "cell", "status": "ok", "output": output, "truncated_bytes": 0, "error": null}}),
        )
    };
    assert!(decode_envelope(&cell(OUTPUT_RECORDS_MAX, 256), Some(&WORKER)).is_ok());
    assert_eq!(
        code(&cell(OUTPUT_RECORDS_MAX + 1, 1), &WORKER),
        "bound_exceeded"
    );
    assert!(decode_envelope(&cell(1, RETURNED_TEXT_MAX_BYTES), Some(&WORKER)).is_ok());
    assert_eq!(
        code(&cell(1, RETURNED_TEXT_MAX_BYTES + 1), &WORKER),
        "bound_exceeded"
    );
    let err = |n: usize| {
        frame(
            json!({"kind": "completed", "id": "c1", "result": {"kind": "cell", "status": "error", "output": [], "truncated_bytes": 0, "error": "e".repeat(n)}}),
        )
    };
    assert!(decode_envelope(&err(ERROR_TEXT_MAX_BYTES), Some(&WORKER)).is_ok());
    assert_eq!(
        code(&err(ERROR_TEXT_MAX_BYTES + 1), &WORKER),
        "bound_exceeded"
    );
}

#[test]
fn every_listed_request_method_decodes() {
    let requests = [
        json!({"method":"local.send","text":"hello"}),
        json!({"method":"runtime.wait","seconds":null,"reason":"waiting for input"}),
        json!({"method":"hooks.list"}),
        json!({"method":"hooks.describe","slot":"delivery.review"}),
        json!({"method":"runtime.inspect"}),
        json!({"method":"runtime.instructions"}),
        json!({"method":"skills.index"}),
        json!({"method":"skills.load","id":"workspace"}),
        json!({"method":"workspace.info"}),
        json!({"method":"workspace.run","argv":["cargo","check"],"cwd":".","env":{},"timeout_ms":120000,"max_output_bytes":750000}),
        json!({"method":"evidence.resolve","refs":["event:42"]}),
        json!({"method":"behavior.activate","path":"/abs/releases/x","expected_epoch":3}),
        json!({"method":"maintenance.originate","purpose":"p","reason":"r","evidence_refs":[]}),
        json!({"method":"maintenance.assess","work_item_id":"w","outcome":"no-change"}),
        json!({"method":"orientation.stage","candidate_id":"c","text":"t","target":"x","scope":{"kind":"global"}}),
        json!({"method":"orientation.current","scope":{"kind":"global"}}),
        json!({"method":"orientation.adopt","candidate_id":"c","operation_id":"op-1"}),
        json!({"method":"frontier.select"}),
        json!({"method":"peer.open","mode":"independent","evidence":[]}),
        json!({"method":"agents.open","mode":"independent","evidence":[]}),
        json!({"method":"peer.send","peer_id":"p","request_id":"req-1","content":"c","evidence":[]}),
        json!({"method":"peer.message","peer_id":"p","request_id":"req-1","content":"c","evidence":[]}),
        json!({"method":"peer.result","request_id":"req-1","wait_ms":0}),
        json!({"method":"peer.submit_result","request_id":"req-1","result":{}}),
        json!({"method":"peer.cancel","request_id":"req-1"}),
        json!({"method":"peer.get","peer_id":"p"}),
        json!({"method":"peer.list"}),
        json!({"method":"peer.stop","peer_id":"p","drain":true}),
        json!({"method":"remote.ensure","target":"build-host"}),
        json!({"method":"remote.call","target":"b","namespace_id":"n","namespace_generation":"g","operation_id":"op","operation":"execute","payload":{}}),
        json!({"method":"remote.cancel","namespace_id":"n","namespace_generation":"g","operation_id":"op"}),
        json!({"method":"remote.close","namespace_id":"n","namespace_generation":"g"}),
    ];
    for request in requests {
        let payload = frame(
            json!({"kind": "host_request", "id": "r1", "execution_id": "c1", "request": request.clone()}),
        );
        decode_envelope(&payload, Some(&WORKER)).unwrap_or_else(|e| panic!("{request}: {e}"));
    }
    let bad = [
        (
            json!({"method":"runtime.wait","seconds":0,"reason":"r"}),
            "bound_exceeded",
        ),
        (
            json!({"method":"runtime.wait","seconds":600.5,"reason":"r"}),
            "bound_exceeded",
        ),
        (
            json!({"method":"runtime.wait","reason":"r"}),
            "missing_field",
        ),
        (
            json!({"method":"local.send","text":"x","extra":1}),
            "unknown_field",
        ),
        (json!({"method":"no.such"}), "invalid_value"),
    ];
    for (request, want) in bad {
        let payload = frame(
            json!({"kind": "host_request", "id": "r1", "execution_id": "c1", "request": request.clone()}),
        );
        assert_eq!(code(&payload, &WORKER), want, "{request}");
    }
    let at = frame(
        json!({"kind": "host_request", "id": "r1", "execution_id": "c1", "request": {"method":"runtime.wait","seconds":600,"reason":"r"}}),
    );
    assert!(decode_envelope(&at, Some(&WORKER)).is_ok());
}

#[test]
fn non_finite_numbers_are_refused_on_the_way_out() {
    let env = Envelope {
        version: 1,
        session_id: Identifier::new("root").unwrap(),
        generation: Identifier::new("g-1").unwrap(),
        message: Message::HostRequest {
            id: Identifier::new("r1").unwrap(),
            execution_id: Identifier::new("c1").unwrap(),
            request: HostRequest::RuntimeWait {
                seconds: Nullable::some(f64::NAN),
                reason: "r".into(),
            },
        },
    };
    assert!(encode_envelope(&env).is_err());
}

#[test]
fn the_schema_names_every_kind() {
    let schema = json_schema().to_string();
    for (kind, _) in KINDS {
        assert!(schema.contains(&format!("\"{kind}\"")), "{kind}");
    }
}
