//! The controlled host (`contract-impl worker host`, docs/worker-host-control.md) as a
//! control client meets it:
//!
//! * activation is durable across a SIGKILL of the host ("Source revisions and
//!   activation": the database epoch is the authority): it activates a hook snapshot
//!   with our Python worker, is killed, leaves no hook worker behind, and when started
//!   again on the same data directory reports the same epoch and revision and serves
//!   reviews from the recorded revision; a stale activation after the restart is
//!   refused;
//! * a `local.send` committed before a SIGKILL of the host and never answered is
//!   answered by its receipt when the same execution runs again in a new generation of a
//!   restarted host ("A retry with the same execution/request identity returns the
//!   existing receipt"), with one lane event; a new request sends the same text again;
//! * requests take effect in order (an `await` pipelined right behind its op finds it),
//!   unknown arguments and unreadable requests are refused typed, `diagnostics` answers
//!   while a cell runs, and SIGTERM stops the host while a cell runs.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_contract-impl");

const MANIFEST: &str = r#"{"version":1,"hooks":{"attention.plan":"policy:attention","delivery.review":"policy:delivery"}}"#;

const POLICY: &str = "from contract_hooks import Allow, Hold, Wake\n\n\ndef attention(request, context):\n    return Wake(priority=3)\n\n\ndef delivery(request, context):\n    return Hold(reason='held by the recorded policy')\n";

/// One running controlled host and its control connection.
struct Host {
    child: Child,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    seq: u64,
}

impl Host {
    fn start(run: &Path, data: &Path) -> Self {
        let socket = run.join(format!("control-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        let child = Command::new(BIN)
            .args(["worker", "host", "--data-dir"])
            .arg(data)
            .env("CONTRACT_HOST_CONTROL_SOCKET", &socket)
            .env_remove("CONTRACT_WORKER_PROGRAM")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
            .unwrap();
        let (stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut hello = String::new();
        reader.read_line(&mut hello).unwrap();
        assert_eq!(
            hello.trim(),
            r#"{"hello":{"adapter":"worker-host","protocol":1}}"#
        );
        Self {
            child,
            reader,
            writer: stream,
            seq: 0,
        }
    }

    fn send_line(&mut self, line: &str) {
        writeln!(self.writer, "{line}").unwrap();
    }

    fn read_response(&mut self) -> Value {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    fn request(&mut self, op: &str, args: Value) -> Value {
        self.seq += 1;
        let mut request = args;
        request["seq"] = json!(self.seq);
        request["op"] = json!(op);
        writeln!(self.writer, "{request}").unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let response: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(response["seq"], json!(self.seq), "{response}");
        assert_eq!(response["ok"], json!(true), "{response}");
        response["result"].clone()
    }

    fn call(&mut self, op: &str, args: Value) -> Value {
        self.request(op, args);
        self.request("await", json!({"as": op}))
    }
}

fn alive(pid: i32) -> bool {
    // A zombie is not alive: it holds nothing.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .and_then(|rest| rest.split(' ').nth(1))
                .is_none_or(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// The PIDs of the children of `parent` whose command line names `needle`.
fn children_naming(parent: i32, needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let ppid = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit(')')
                    .next()
                    .and_then(|r| r.split(' ').nth(2))
                    .and_then(|p| p.parse::<i32>().ok())
            });
        if ppid == Some(parent)
            && let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(needle)
            && alive(pid)
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn activation_survives_a_sigkill_of_the_host() {
    let run = tempfile::tempdir().unwrap();
    let data = run.path().join("data");
    let snapshot = run.path().join("releases").join("one");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::write(snapshot.join("behavior.json"), MANIFEST).unwrap();
    std::fs::write(snapshot.join("policy.py"), POLICY).unwrap();

    let mut host = Host::start(run.path(), &data);
    assert_eq!(
        host.request("epoch", json!({})),
        json!({"epoch": 0, "revision": null, "serving": null})
    );
    let activated = host.call(
        "activate",
        json!({"path": snapshot.display().to_string(), "expected_epoch": 0}),
    );
    assert_eq!(activated["status"], "activated", "{activated}");
    assert_eq!(activated["epoch"], 1);
    let revision = activated["revision"].clone();
    let review = host.call(
        "review",
        json!({"input": {"effect_id": "e1", "destination": "operator", "text": "hi"}}),
    );
    assert_eq!(review["decided_by"], "hook", "{review}");

    // SIGKILL the host alone (not its group), as a crash would: the hook worker's
    // supervisor notices and stops the worker.
    let host_pid = i32::try_from(host.child.id()).unwrap();
    let before = children_naming(host_pid, "worker\0supervise");
    assert_eq!(before.len(), 1, "one hook worker's supervisor runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    host.child.wait().unwrap();
    let killed = Instant::now();
    while before.iter().any(|p| alive(*p)) {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the hook worker outlived its host: {:?}",
            before.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Started again on the same data: the same epoch and revision, and the recorded
    // revision serves reviews.
    let mut host = Host::start(run.path(), &data);
    assert_eq!(
        host.request("epoch", json!({})),
        json!({"epoch": 1, "revision": revision, "serving": revision})
    );
    let review = host.call(
        "review",
        json!({"input": {"effect_id": "e2", "destination": "operator", "text": "hi"}}),
    );
    assert_eq!(
        (
            review["action"].clone(),
            review["reason"].clone(),
            review["decided_by"].clone(),
            review["revision"].clone()
        ),
        (
            json!("hold"),
            json!("held by the recorded policy"),
            json!("hook"),
            revision
        ),
        "{review}"
    );
    // The epoch moved: an activation expecting 0 is stale, and changes nothing.
    let stale = host.call(
        "activate",
        json!({"path": snapshot.display().to_string(), "expected_epoch": 0}),
    );
    assert_eq!(stale["code"], "stale_epoch", "{stale}");
    assert_eq!(host.request("epoch", json!({}))["epoch"], 1);
    let _ = host.child.kill();
    let _ = host.child.wait();
}

#[test]
fn requests_take_effect_in_order_and_bad_ones_are_refused_typed() {
    let run = tempfile::tempdir().unwrap();
    let mut host = Host::start(run.path(), &run.path().join("data"));
    // Pipelined: the workbench start, then its await, without waiting in between.
    host.send_line(r#"{"seq": 1, "op": "start_workbench"}"#);
    host.send_line(r#"{"seq": 2, "op": "await", "as": "start_workbench"}"#);
    assert_eq!(
        host.read_response(),
        json!({"seq": 1, "ok": true, "result": {}})
    );
    assert_eq!(
        host.read_response(),
        json!({"seq": 2, "ok": true, "result": {"status": "ready"}})
    );
    host.seq = 2;
    // Unreadable requests: typed, with `seq: null` when there is none to read.
    host.send_line("not json");
    let r = host.read_response();
    assert_eq!(
        (r["seq"].clone(), r["error"]["code"].clone()),
        (Value::Null, json!("bad_request"))
    );
    host.send_line(r#"{"seq": 9, "op": "epoch", "bogus": 1}"#);
    let r = host.read_response();
    assert_eq!(
        (r["seq"].clone(), r["error"]["code"].clone()),
        (json!(9), json!("bad_request"))
    );
    host.send_line(r#"{"seq": 10, "op": "await", "as": "x", "timeout_ms": "10"}"#);
    let r = host.read_response();
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
    // A second workbench while one runs is refused.
    host.send_line(r#"{"seq": 11, "op": "start_workbench"}"#);
    assert_eq!(host.read_response()["error"]["code"], "workbench_running");
    // An interrupt with no cell running reaches no cell.
    host.send_line(r#"{"seq": 12, "op": "interrupt"}"#);
    assert_eq!(
        host.read_response(),
        json!({"seq": 12, "ok": true, "result": {"interrupted": null}})
    );
    // diagnostics answers while a cell runs.
    host.send_line(r#"{"seq": 13, "op": "execute", "code": "import time\nprint('working', flush=True)\ntime.sleep(600)"}"#);
    assert_eq!(host.read_response()["ok"], true);
    host.send_line(r#"{"seq": 14, "op": "diagnostics"}"#);
    let r = host.read_response();
    assert_eq!(r["seq"], 14, "{r}");
    assert!(r["result"]["stdout"].is_object(), "{r}");
    // SIGTERM while the cell runs: the host stops it and exits 0.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(host.child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = host.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
}

/// The first cell result of a cell record.
fn result_text(record: &Value) -> String {
    assert_eq!(record["status"], "ok", "{record}");
    record["output"]
        .as_array()
        .and_then(|o| o.iter().find(|r| r["stream"] == "result"))
        .and_then(|r| r["text"].as_str())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_send_committed_before_a_crash_is_answered_by_its_receipt_on_retry() {
    use std::os::unix::process::ExitStatusExt;
    let run = tempfile::tempdir().unwrap();
    let data = run.path().join("data");
    let snapshot = run.path().join("releases").join("allow");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::write(snapshot.join("behavior.json"), MANIFEST).unwrap();
    std::fs::write(
        snapshot.join("policy.py"),
        "from contract_hooks import Allow\n\n\ndef attention(request, context):\n    return Allow()\n\n\ndef delivery(request, context):\n    return Allow()\n",
    )
    .unwrap();

    let mut host = Host::start(run.path(), &data);
    let activated = host.call(
        "activate",
        json!({"path": snapshot.display().to_string(), "expected_epoch": 0}),
    );
    assert_eq!(activated["status"], "activated", "{activated}");
    assert_eq!(host.call("start_workbench", json!({}))["status"], "ready");
    // An execution ID that is not an identifier is refused.
    host.send_line(r#"{"seq": 100, "op": "execute", "code": "1", "execution_id": "e 1"}"#);
    let r = host.read_response();
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
    let host_pid = i32::try_from(host.child.id()).unwrap();
    let supervisors = children_naming(host_pid, "worker\0supervise");
    assert_eq!(supervisors.len(), 2, "a hook worker and a workbench run");
    host.request("configure", json!({"crash_after_commit": true}));
    host.request(
        "execute",
        json!({"code": "await runtime.send('hi')", "execution_id": "e1"}),
    );
    // The send is committed, and the host dies before its reply, as SIGKILL kills it.
    let status = host.child.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "{status}");
    let killed = Instant::now();
    while supervisors.iter().any(|p| alive(*p)) {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "a worker outlived its host"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut host = Host::start(run.path(), &data);
    let events = host.request("lane", json!({}))["events"].clone();
    assert_eq!(
        events,
        json!([{"event_id": 1, "effect_id": "root/e1/r-1", "text": "hi"}])
    );
    assert_eq!(host.call("start_workbench", json!({}))["status"], "ready");
    // The same execution again: its first request is the one committed before the crash.
    let retry = host.call(
        "execute",
        json!({"code": "r = await runtime.send('hi')\n(r['status'], r['event_id'], r['effect_id'])", "execution_id": "e1"}),
    );
    assert_eq!(result_text(&retry), "('confirmed', 1, 'root/e1/r-1')");
    // A new execution (the host names it) sends the same text again.
    let again = host.call(
        "execute",
        json!({"code": "r = await runtime.send('hi')\n(r['status'], r['event_id'])"}),
    );
    assert_eq!(result_text(&again), "('confirmed', 2)");
    let events = host.request("lane", json!({}))["events"].clone();
    assert_eq!(events.as_array().map(Vec::len), Some(2), "{events}");
    let _ = host.child.kill();
    let _ = host.child.wait();
}
