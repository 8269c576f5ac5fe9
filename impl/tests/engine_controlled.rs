//! `contract-impl engine controlled` (docs/engine-client-control.md) against our real
//! daemon, driven over a control socket this test listens on, as the conformance
//! harness drives it:
//!
//! * `initialize` claims a new owner and keeps the identity (0600) before reporting it;
//!   `start_run` of the scripted definition and `follow` from 0 deliver every sequence
//!   once, in order, up to the terminal event; a second `initialize` is a reconnect at
//!   epoch 2; the token never appears on a control line; the end of the control channel
//!   ends the client with exit 0;
//! * a minor-0 session is refused `export` (`capability_not_negotiated`) by the client
//!   itself, with the daemon gone (so no call could have been made); a required
//!   capability the minor does not offer is the daemon's typed `missingCapability`;
//! * through a proxy playing a daemon that drops connections: a `StartRun` whose
//!   connection is dropped before an answer is sent again, on a new connection, with the
//!   same operation ID; a `follow` whose streams are dropped resumes and still delivers
//!   every sequence once; SIGTERM ends the client with exit 0.

mod engine_support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine_support::{BIN, Daemon, start};
use serde_json::{Value, json};

/// One running `engine controlled` and its control connection.
struct Controlled {
    child: Child,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    seq: u64,
    token: String,
    state_dir: PathBuf,
}

impl Controlled {
    /// Starts the client against `socket` (the daemon's, or a proxy's).
    fn start(dir: &Path, socket: &Path, daemon: &Daemon) -> Self {
        let control = dir.join("control.sock");
        let state_dir = dir.join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        std::fs::set_permissions(&state_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let listener = UnixListener::bind(&control).unwrap();
        let child = Command::new(BIN)
            .args(["engine", "controlled"])
            .env("CONTRACT_ENGINE_SOCKET", socket)
            .env("CONTRACT_ENGINE_TOKEN_FILE", &daemon.token_file)
            .env("CONTRACT_ENGINE_CONTROL_SOCKET", &control)
            .env("CONTRACT_ENGINE_STATE_DIR", &state_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut hello = String::new();
        reader.read_line(&mut hello).unwrap();
        assert_eq!(
            hello,
            "{\"hello\":{\"adapter\":\"engine-client\",\"protocol\":1}}\n"
        );
        Self {
            child,
            reader,
            writer: stream,
            seq: 0,
            token: daemon.token.trim().to_string(),
            state_dir,
        }
    }

    /// Sends `{"seq", "op", ...args}` and returns its response.
    fn request(&mut self, op: &str, args: Value) -> Value {
        self.seq += 1;
        let mut request = json!({"seq": self.seq, "op": op});
        for (k, v) in args.as_object().unwrap() {
            request[k] = v.clone();
        }
        writeln!(self.writer, "{request}").unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        assert!(
            !line.contains(&self.token),
            "the token on a control line: {line}"
        );
        let response: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(response["seq"], self.seq, "{response}");
        response
    }

    /// Starts `op` (it answers `{}` at once) and awaits its outcome.
    fn run(&mut self, op: &str, args: Value) -> Value {
        let started = self.request(op, args);
        assert_eq!(started["result"], json!({}), "{op}: {started}");
        self.outcome(op)
    }

    /// The outcome of the operation named `name`.
    fn outcome(&mut self, name: &str) -> Value {
        let r = self.request("await", json!({"as": name, "timeout_ms": 60_000}));
        assert_eq!(r["ok"], true, "await {name}: {r}");
        r["result"].clone()
    }

    fn state(&self) -> Value {
        let path = self.state_dir.join("client-state.json");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }
}

impl Drop for Controlled {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scripted(message: &str) -> Value {
    json!({"definition": {"id": "scripted", "revision": "1"}, "message": message})
}

/// Asserts a follow outcome delivered 1..=n once each, in order, to a terminal event
/// `outcome`; returns n.
fn followed_to_the_end(f: &Value, outcome: &str) -> u64 {
    let n = f["last_sequence"].as_u64().unwrap_or_else(|| panic!("{f}"));
    let want: Vec<u64> = (1..=n).collect();
    assert_eq!(f["sequences"], json!(want), "{f}");
    assert_eq!(f["terminal"]["outcome"], outcome, "{f}");
    assert_eq!(f["missed"], json!([]), "{f}");
    n
}

#[test]
fn a_run_is_started_followed_to_its_end_and_the_client_reconnects() {
    let daemon = start();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Controlled::start(dir.path(), &daemon.socket, &daemon);
    assert!(
        !c.state_dir.join("client-state.json").exists(),
        "no identity before a claim"
    );
    let first = c.run("initialize", json!({}));
    let won = &first["initialized"];
    let client_id = won["clientId"].as_str().unwrap().to_string();
    assert_eq!(won["epoch"], "1", "{first}");
    assert_eq!(
        won["negotiated"],
        json!({"major": 1, "minor": 1}),
        "{first}"
    );
    assert_eq!(c.state(), json!({"client_id": client_id, "epoch": 1}));

    let started = c.run(
        "start_run",
        scripted("#!script\nsay a\nturn\ntool search succeeded\nsay b\nturn"),
    );
    let run_id = started["response"]["runId"].as_str().unwrap().to_string();
    let f = c.run("follow", json!({"run_id": run_id, "after_sequence": 0}));
    let n = followed_to_the_end(&f, "OUTCOME_SUCCEEDED");
    assert!(n >= 6, "started, 2 messages, 2 turns, a tool, the end: {f}");
    // From the middle, one page at a time, without tailing: the rest, once each.
    let rest = c.run(
        "follow",
        json!({"run_id": run_id, "after_sequence": 2, "page": 1, "tail": false}),
    );
    assert_eq!(
        rest["sequences"],
        json!((3..=n).collect::<Vec<_>>()),
        "{rest}"
    );

    // A second initialize is a reconnect: the same ID at exactly the next epoch.
    let second = c.run("initialize", json!({}));
    assert_eq!(second["initialized"]["clientId"], client_id.as_str());
    assert_eq!(second["initialized"]["epoch"], "2", "{second}");
    assert_eq!(c.state(), json!({"client_id": client_id, "epoch": 2}));
    // The new session steers runs: a cancel of the ended run says so.
    let cancel = c.run("cancel", json!({"run_id": run_id}));
    assert_eq!(
        cancel,
        json!({"response": {"alreadyTerminal": true, "outcome": "OUTCOME_SUCCEEDED"}})
    );
    // The daemon's statuses come back by canonical name.
    let missing = c.run("cancel", json!({"run_id": "no-such-run"}));
    assert_eq!(missing["error"]["code"], "NOT_FOUND", "{missing}");
    let none = c.run("interactions", json!({"run_id": run_id}));
    assert!(none["snapshot"].is_object(), "{none}");
    // Arguments an op does not take.
    let r = c.request("follow", json!({"run_id": run_id, "after": 0}));
    assert_eq!(r["error"]["code"], "bad_request", "{r}");

    // The end of the control channel ends the client, exit 0.
    c.writer.shutdown(Shutdown::Both).unwrap();
    let status = c.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
}

#[test]
fn export_on_a_minor_0_session_is_refused_by_the_client_itself() {
    let mut daemon = start();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Controlled::start(dir.path(), &daemon.socket, &daemon);
    // Requiring what minor 0 does not offer: the daemon's typed refusal, nothing kept.
    let refused = c.run(
        "initialize",
        json!({"minor": 0, "require": ["snapshot-authority-v1"]}),
    );
    assert_eq!(
        refused["missingCapability"]["missing"],
        json!(["snapshot-authority-v1"]),
        "{refused}"
    );
    assert!(!c.state_dir.join("client-state.json").exists());
    let r = c.run("export", json!({"run_id": "r"}));
    assert_eq!(r["error"]["code"], "not_initialized", "{r}");

    let won = c.run("initialize", json!({"minor": 0}));
    assert_eq!(
        won["initialized"]["negotiated"],
        json!({"major": 1}),
        "{won}"
    );
    assert_eq!(won["initialized"]["epoch"], "1", "{won}");
    let started = c.run("start_run", scripted("#!script\nsay a\nturn\nhold"));
    let run_id = started["response"]["runId"].as_str().unwrap().to_string();
    let suspended = c.run("suspend", json!({"run_id": run_id}));
    assert!(suspended["response"].is_object(), "{suspended}");
    // The daemon is gone: a call would end UNAVAILABLE; the client refuses first.
    daemon.child.kill().unwrap();
    daemon.child.wait().unwrap();
    let r = c.run("export", json!({"run_id": run_id}));
    assert_eq!(r["error"]["code"], "capability_not_negotiated", "{r}");
    let r = c.run("resume", json!({"run_id": run_id}));
    assert_eq!(r["error"]["code"], "UNAVAILABLE", "{r}");
}

/// What the proxy saw and does.
#[derive(Default)]
struct ProxyState {
    /// Every connection's client side, to drop them all.
    open: Vec<UnixStream>,
    /// Connections accepted.
    connections: usize,
    /// Per connection that carried the marked request: its operation IDs, and whether
    /// the proxy dropped it.
    marked: Vec<(Vec<String>, bool)>,
}

/// A proxy in front of the daemon playing a daemon that drops connections: the first
/// connection carrying `marker` (with its operation ID) is dropped before the request is
/// forwarded; [`Proxy::drop_all`] drops every open connection.
struct Proxy {
    socket: PathBuf,
    state: Arc<Mutex<ProxyState>>,
}

fn operation_ids(bytes: &[u8]) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..bytes.len().saturating_sub(35) {
        let candidate = &bytes[i..i + 35];
        if candidate.starts_with(b"op-")
            && candidate[3..]
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            ids.push(String::from_utf8(candidate.to_vec()).unwrap());
        }
    }
    ids
}

impl Proxy {
    fn start(dir: &Path, upstream: &Path, marker: &'static [u8]) -> Self {
        let socket = dir.join("proxy.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let upstream = upstream.to_path_buf();
        let shared = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = UnixStream::connect(&upstream) else {
                    return;
                };
                {
                    let mut s = shared.lock().unwrap();
                    s.connections += 1;
                    s.open.push(client.try_clone().unwrap());
                }
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                // Daemon → client.
                std::thread::spawn(move || {
                    let (mut from, mut to) = (s2, c2);
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(Shutdown::Both);
                });
                // Client → daemon, watching for the marked request.
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let (mut from, mut to) = (client, server);
                    let mut seen = Vec::new();
                    let mut marked = false;
                    let mut buf = [0u8; 16 * 1024];
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        seen.extend_from_slice(&buf[..n]);
                        let ids = operation_ids(&seen);
                        if !marked
                            && !ids.is_empty()
                            && seen.windows(marker.len()).any(|w| w == marker)
                        {
                            marked = true;
                            let mut s = shared.lock().unwrap();
                            let drop_it = s.marked.is_empty();
                            s.marked.push((ids, drop_it));
                            if drop_it {
                                let _ = from.shutdown(Shutdown::Both);
                                let _ = to.shutdown(Shutdown::Both);
                                return;
                            }
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Both);
                });
            }
        });
        Self { socket, state }
    }

    fn drop_all(&self) {
        for s in self.state.lock().unwrap().open.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[test]
fn calls_cut_off_in_transport_are_sent_again_on_a_new_connection() {
    let daemon = start();
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(dir.path(), &daemon.socket, b"say drop-me");
    let mut c = Controlled::start(dir.path(), &proxy.socket, &daemon);
    assert_eq!(
        proxy.state.lock().unwrap().connections,
        0,
        "no connection before an op asks for a call"
    );
    let won = c.run("initialize", json!({}));
    assert_eq!(won["initialized"]["epoch"], "1", "{won}");

    // The StartRun's connection is dropped before it reaches the daemon: the client
    // sends the same request again on a new connection.
    let started = c.run("start_run", scripted("#!script\nsay drop-me\nturn\nhold"));
    let run_id = started["response"]["runId"]
        .as_str()
        .unwrap_or_else(|| panic!("{started}"))
        .to_string();
    {
        let s = proxy.state.lock().unwrap();
        assert_eq!(s.marked.len(), 2, "sent twice: {:?}", s.marked);
        assert!(s.marked[0].1 && !s.marked[1].1);
        assert_eq!(s.marked[0].0.len(), 1, "{:?}", s.marked);
        assert_eq!(s.marked[0].0, s.marked[1].0, "the same operation ID");
        assert!(s.connections >= 2, "a new connection");
    }

    // A tailing follow whose streams are dropped resumes from the last sequence it
    // delivered; a cancel on a new connection ends the run.
    c.request(
        "follow",
        json!({"run_id": run_id, "after_sequence": 0, "as": "tail"}),
    );
    std::thread::sleep(Duration::from_millis(300));
    proxy.drop_all();
    std::thread::sleep(Duration::from_millis(100));
    let cancel = c.run("cancel", json!({"run_id": run_id}));
    assert_eq!(
        cancel["response"]["outcome"], "OUTCOME_CANCELED",
        "{cancel}"
    );
    let f = c.outcome("tail");
    followed_to_the_end(&f, "OUTCOME_CANCELED");

    // SIGTERM ends the client, exit 0.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(c.child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = c.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
}
