//! `contract-impl core bench`: a burst Turn through Core, the Runtime and the command
//! adapter against its floors on this machine (`make bench`; never a test).
//!
//! The Turn runs a program that writes `lines` lines of 100 bytes at once (each a
//! `delta` record of the command adapter's JSONL protocol). Reported: the time from the Turn's submission to its
//! `completed` state, the events per second that makes, the peak resident set (`VmHWM`)
//! of the Core and Runtime processes, and that every delta and the `done` are readable
//! afterwards from the events API. Next to it, measured in the same run, the floors:
//!
//! * **program**: the same program with its output to `/dev/null`;
//! * **WebSocket**: the same number of delta frames over a bare tokio-tungstenite pair
//!   on loopback (no decoding, no routing);
//! * **SQLite**: the same rows into a bare SQLite table in WAL mode with
//!   `synchronous=FULL`, in transactions of [`EVENT_BATCH_MAX`] rows.
//!
//! This module starts its own Core and Runtime (this executable) in a private temporary
//! directory and stops them (SIGTERM, then the drop guard) before it returns.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};

use crate::core_runtime::gateway::EVENT_BATCH_MAX;

/// Lines the benchmark program writes by default.
pub const DEFAULT_LINES: usize = 100_000;

/// Bytes of each line, its newline included.
pub const LINE_BYTES: usize = 100;

/// Longest the benchmark waits for the burst Turn to end.
const TURN_DEADLINE: Duration = Duration::from_secs(600);

const DEVICE: &str = "bench-device";
const SECRET: &str = "rcd_benchbenchbenchbenchbenchbenchbe";
/// The Runtime's default Environment binding (no launch configuration is given).
const ENVIRONMENT_ID: &str = crate::core_runtime::daemon::config::DEFAULT_ENVIRONMENT_ID;

/// The Python program of the Turn (and of the program floor): `lines` lines at once,
/// each a `delta` record of the command adapter's JSONL protocol padded to
/// [`LINE_BYTES`] bytes with its newline.
fn program_source(lines: usize) -> String {
    format!(
        "import json, sys\n\
         empty = len(json.dumps({{'type': 'delta', 'text': '\\n'}}, separators=(',', ':'))) + 1\n\
         line = json.dumps({{'type': 'delta', 'text': 'x' * ({LINE_BYTES} - empty) + '\\n'}}, separators=(',', ':')) + '\\n'\n\
         sys.stdout.write(line * {lines})\n\
         sys.stdout.flush()\n"
    )
}

/// A child process killed (and reaped) on drop.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Guard {
    fn pid(&self) -> u32 {
        self.0.id()
    }
    /// SIGTERM, then a bounded wait (the drop guard kills what is left).
    fn terminate(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id().cast_signed()),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Peak resident set of `pid` in KiB (`VmHWM` of `/proc/<pid>/status`).
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The program floor: the program with its output to `/dev/null`.
fn program_floor(python: &Path, lines: usize) -> Result<Duration, String> {
    let start = Instant::now();
    let status = Command::new(python)
        .args(["-c", &program_source(lines)])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("{}: {e}", python.display()))?;
    if !status.success() {
        return Err(format!("the program failed: {status}"));
    }
    Ok(start.elapsed())
}

/// The WebSocket floor: `lines` delta frames over a bare tokio-tungstenite pair.
async fn websocket_floor(lines: usize) -> Result<Duration, String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut ws = tokio_tungstenite::accept_async(stream)
            .await
            .map_err(|e| e.to_string())?;
        let mut seen = 0usize;
        while let Some(message) = ws.next().await {
            match message.map_err(|e| e.to_string())? {
                tokio_tungstenite::tungstenite::Message::Text(_) => seen += 1,
                tokio_tungstenite::tungstenite::Message::Close(_) => break,
                _ => {}
            }
        }
        Ok::<usize, String>(seen)
    });
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/"))
        .await
        .map_err(|e| e.to_string())?;
    let text = json!({"type": "delta", "id": "run-1", "payload": {"text": "x".repeat(LINE_BYTES - 1) + "\n"}})
        .to_string();
    let start = Instant::now();
    for _ in 0..lines {
        ws.feed(tokio_tungstenite::tungstenite::Message::Text(
            text.clone().into(),
        ))
        .await
        .map_err(|e| e.to_string())?;
    }
    ws.close(None).await.map_err(|e| e.to_string())?;
    let seen = server.await.map_err(|e| e.to_string())??;
    if seen != lines {
        return Err(format!("the bare pair delivered {seen} of {lines} frames"));
    }
    Ok(start.elapsed())
}

/// The SQLite floor: `lines` event rows in transactions of [`EVENT_BATCH_MAX`].
fn sqlite_floor(dir: &Path, lines: usize) -> Result<Duration, String> {
    let conn = rusqlite::Connection::open(dir.join("floor.sqlite")).map_err(|e| e.to_string())?;
    let _: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    conn.execute_batch(
        "PRAGMA synchronous=FULL;
         CREATE TABLE events (turn_id TEXT, sequence INTEGER, kind TEXT, payload TEXT,
                              recorded_at_ms INTEGER, PRIMARY KEY (turn_id, sequence));",
    )
    .map_err(|e| e.to_string())?;
    let payload = json!({"text": "x".repeat(LINE_BYTES - 1) + "\n"}).to_string();
    let start = Instant::now();
    let mut sequence = 0i64;
    let mut conn = conn;
    while (sequence as usize) < lines {
        let tx = conn.transaction().map_err(|e| e.to_string())?;
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO events VALUES ('t', ?1, 'delta', ?2, 0)")
                .map_err(|e| e.to_string())?;
            for _ in 0..EVENT_BATCH_MAX.min(lines - sequence as usize) {
                sequence += 1;
                insert
                    .execute(rusqlite::params![sequence, payload])
                    .map_err(|e| e.to_string())?;
            }
        }
        tx.commit().map_err(|e| e.to_string())?;
    }
    Ok(start.elapsed())
}

/// Core's public API, with the Project API key.
struct Api {
    client: reqwest::Client,
    v1: String,
}

impl Api {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), String> {
        let mut request = self.client.request(method, format!("{}{path}", self.v1));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }
    async fn create(&self, path: &str, body: Value, key: &str) -> Result<String, String> {
        match self.call(reqwest::Method::POST, path, Some(body)).await? {
            (201, v) => v[key]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("POST {path}: no {key} in {v}")),
            (status, v) => Err(format!("POST {path}: {status} {v}")),
        }
    }
    async fn get(&self, path: &str) -> Result<Value, String> {
        match self.call(reqwest::Method::GET, path, None).await? {
            (200, v) => Ok(v),
            (status, v) => Err(format!("GET {path}: {status} {v}")),
        }
    }
}

/// What the burst Turn measured.
struct Burst {
    to_done: Duration,
    deltas: usize,
    /// Events past the Turn's bound, counted (`events_dropped`), not stored.
    dropped: u64,
    done: bool,
    core_rss_kib: Option<u64>,
    runtime_rss_kib: Option<u64>,
}

async fn burst(exe: &Path, python: &Path, dir: &Path, lines: usize) -> Result<Burst, String> {
    let data = dir.join("data");
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).map_err(|e| e.to_string())?;
    let config = dir.join("core.json");
    std::fs::write(&config, r#"{"timers":{"heartbeat_interval_ms":1000}}"#)
        .map_err(|e| e.to_string())?;
    let mut core = Guard(
        Command::new(exe)
            .args(["core", "serve"])
            .env("CONTRACT_LISTEN", "127.0.0.1:0")
            .env("CONTRACT_DATA_DIR", &data)
            .env("CONTRACT_CORE_CONFIG", &config)
            .env("CONTRACT_DEVICE_ID", DEVICE)
            .env("CONTRACT_DAEMON_CREDENTIAL", SECRET)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", exe.display()))?,
    );
    let mut line = String::new();
    let stdout = core.0.stdout.take().ok_or("no stdout")?;
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let ready: Value = serde_json::from_str(&line).map_err(|e| format!("{e}: {line:?}"))?;
    let base = ready["ready"]["base_url"]
        .as_str()
        .ok_or_else(|| format!("no base URL in {line:?}"))?
        .to_string();
    let key = std::fs::read_to_string(data.join("api-key")).map_err(|e| e.to_string())?;
    let mut runtime = Guard(
        Command::new(exe)
            .args([
                "runtime",
                "--adapter",
                "command",
                "--command-protocol",
                "jsonl",
            ])
            .arg("--command-program")
            .arg(python)
            .args([
                "--command-arg",
                "-c",
                "--command-arg",
                &program_source(lines),
            ])
            .env("CONTRACT_CORE_URL", &base)
            .env("CONTRACT_DEVICE_ID", DEVICE)
            .env("CONTRACT_DAEMON_CREDENTIAL", SECRET)
            .env("CONTRACT_WORKSPACE", &workspace)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", exe.display()))?,
    );
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        reqwest::header::HeaderValue::from_str(&format!("Bearer {}", key.trim()))
            .map_err(|e| e.to_string())?,
    );
    let api = Api {
        client: reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .map_err(|e| e.to_string())?,
        v1: format!("{base}/v1"),
    };
    api.call(
        reqwest::Method::POST,
        "/environments",
        Some(json!({"type": "self_hosted", "environment_id": ENVIRONMENT_ID})),
    )
    .await?;
    let agent = api
        .create(
            "/agents",
            json!({"agent_kind": "command", "model": "bench", "system_prompt": "Bench."}),
            "agent_id",
        )
        .await?;
    let session = api
        .create(
            "/sessions",
            json!({"agent_id": agent, "environment_id": ENVIRONMENT_ID}),
            "session_id",
        )
        .await?;
    // The Turn waits queued until the Runtime's first heartbeat: the clock starts at the
    // submission, as a user's would.
    let start = Instant::now();
    let turn = api
        .create(
            &format!("/sessions/{session}/turns"),
            json!({"input": [{"role": "user", "content": [{"type": "text", "text": "go"}]}]}),
            "turn_id",
        )
        .await?;
    let to_done = loop {
        let t = api.get(&format!("/turns/{turn}")).await?;
        match t["state"].as_str() {
            Some("completed") => break start.elapsed(),
            Some("queued" | "claimed" | "starting" | "running") => {}
            _ => return Err(format!("the burst Turn ended otherwise: {t}")),
        }
        if start.elapsed() > TURN_DEADLINE {
            return Err(format!(
                "the burst Turn did not end within {TURN_DEADLINE:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let core_rss_kib = peak_rss_kib(core.pid());
    let runtime_rss_kib = peak_rss_kib(runtime.pid());
    let (mut after, mut deltas, mut done) = (0u64, 0usize, false);
    loop {
        let page = api
            .get(&format!(
                "/turns/{turn}/events?after_sequence={after}&limit=1000"
            ))
            .await?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() {
            break;
        }
        for e in events {
            after = e["sequence"].as_u64().unwrap_or(after);
            match e["type"].as_str() {
                Some("delta") => deltas += 1,
                Some("done") => done = true,
                _ => {}
            }
        }
    }
    let dropped = api.get(&format!("/turns/{turn}")).await?["outcome"]["events_dropped"]
        .as_u64()
        .unwrap_or(0);
    runtime.terminate();
    core.terminate();
    Ok(Burst {
        to_done,
        deltas,
        dropped,
        done,
        core_rss_kib,
        runtime_rss_kib,
    })
}

/// Runs the benchmark and prints its figures; `Err` says what could not be measured.
///
/// # Errors
/// A process could not be started, the Turn did not complete, or a floor failed.
pub async fn run(lines: usize) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let python = PathBuf::from(crate::worker::python::interpreter());
    let dir = tempfile::Builder::new()
        .prefix("core-bench-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let program = program_floor(&python, lines)?;
    let websocket = websocket_floor(lines).await?;
    let sqlite = sqlite_floor(dir.path(), lines)?;
    let b = burst(&exe, &python, dir.path(), lines).await?;
    let events = lines + 1;
    let rate = |d: Duration| events as f64 / d.as_secs_f64().max(1e-9);
    println!(
        "core_runtime burst Turn: {lines} lines of {LINE_BYTES} bytes through Core, the Runtime and the command adapter"
    );
    println!(
        "  time to done      {:>10.1} ms   {:>12.0} events/s",
        b.to_done.as_secs_f64() * 1e3,
        rate(b.to_done)
    );
    let kib = |v: Option<u64>| {
        v.map_or("unknown".to_string(), |k| {
            format!("{:.1} MiB", k as f64 / 1024.0)
        })
    };
    println!(
        "  peak RSS          Core {}, Runtime {}",
        kib(b.core_rss_kib),
        kib(b.runtime_rss_kib)
    );
    println!(
        "  readable after    {} of {lines} deltas, done {}{}",
        b.deltas,
        if b.done { "present" } else { "MISSING" },
        if b.dropped > 0 {
            format!(
                ", {} past the Turn's event bound counted as dropped",
                b.dropped
            )
        } else {
            String::new()
        }
    );
    for (name, floor) in [
        ("floor: program to /dev/null", program),
        ("floor: bare WebSocket pair", websocket),
        ("floor: SQLite, batched", sqlite),
    ] {
        println!(
            "  {name:<29} {:>10.1} ms   {:>12.0} events/s   (burst / floor: {:.1}x)",
            floor.as_secs_f64() * 1e3,
            rate(floor),
            b.to_done.as_secs_f64() / floor.as_secs_f64().max(1e-9)
        );
    }
    if b.deltas as u64 + b.dropped != lines as u64 || !b.done {
        return Err("events were lost".into());
    }
    Ok(())
}
