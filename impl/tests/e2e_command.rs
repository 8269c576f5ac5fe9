//! End to end with real processes only (issue 3, item 6): `contract-impl core serve`,
//! `contract-impl runtime --adapter command --command-protocol jsonl` running the
//! shipped example program `tests/fixtures/echo_agent.py`, driven only through Core's
//! public API (`docs/core-api.md`).
//!
//! Each Turn gets its own Session: a second Turn of a Session needs
//! `native_session_recovery` (capability table), which the command adapter does not
//! declare — Core refuses such a Turn `unsupported_capability` instead of running it.
//!
//! Nothing sleeps to wait for an event: public-API state is polled by
//! [`common::Api::wait`] (bounded), the readiness line is awaited with a timeout, and
//! both processes' groups are SIGKILLed by [`Proc`]'s `Drop`.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{Api, text_input};
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};

/// The device the Runtime presents (provisioned by Core at start-up).
const DEVICE: &str = "e2e-device";
/// Its daemon credential.
const SECRET: &str = "rcd_0123456789abcdef0123456789abcdef";
/// The Runtime's default Environment binding (`docs/launch-contract.md`), registered in
/// Core through the public API.
const ENVIRONMENT_ID: &str = "00000000-0000-4000-8000-000000000001";
/// Bound on Core printing its readiness line.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Core configuration: a short heartbeat interval, so the Runtime's capabilities and
/// liveness are fresh; the spec's cancel budget.
const CORE_CONFIG: &str = r#"{"timers":{"heartbeat_interval_ms":500,"cancel_confirm_ms":15000}}"#;

/// A child process in its own process group; `Drop` SIGKILLs the whole group and
/// reaps the child.
struct Proc {
    child: Child,
    name: &'static str,
    /// Where its stderr goes (printed when a test fails).
    stderr: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, command: &mut Command, dir: &Path) -> Proc {
        let stderr = dir.join(format!("{name}.stderr"));
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc {
            child,
            name,
            stderr,
        }
    }

    fn pgid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = killpg(self.pgid(), Signal::SIGKILL);
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("--- {} stderr (last lines, newest first) ---", self.name);
            for line in tail {
                eprintln!("{line}");
            }
        }
    }
}

/// Starts Core on a fresh data directory; returns it and its base URL.
fn start_core(dir: &Path) -> (Proc, String) {
    let config = dir.join("core.json");
    std::fs::write(&config, CORE_CONFIG).unwrap();
    let mut core = Proc::spawn(
        "core",
        Command::new(env!("CARGO_BIN_EXE_contract-impl"))
            .args(["core", "serve"])
            .env("CONTRACT_LISTEN", "127.0.0.1:0")
            .env("CONTRACT_DATA_DIR", dir.join("data"))
            .env("CONTRACT_CORE_CONFIG", &config)
            .env("CONTRACT_DEVICE_ID", DEVICE)
            .env("CONTRACT_DAEMON_CREDENTIAL", SECRET)
            .stdout(Stdio::piped()),
        dir,
    );
    let stdout = core.child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(READY_TIMEOUT)
        .expect("Core printed no readiness line in time");
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let base = ready["ready"]["base_url"].as_str().unwrap().to_string();
    (core, base)
}

/// Starts the Runtime with the command adapter and the example program.
fn start_runtime(dir: &Path, base: &str) -> Proc {
    let workspace = dir.join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    // The Runtime's own temporary directory, so its scratch roots can be watched.
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let program = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/echo_agent.py");
    Proc::spawn(
        "runtime",
        Command::new(env!("CARGO_BIN_EXE_contract-impl"))
            .args([
                "runtime",
                "--adapter",
                "command",
                "--command-protocol",
                "jsonl",
            ])
            .arg("--command-program")
            .arg(&program)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("CONTRACT_CORE_URL", base)
            .env("CONTRACT_DEVICE_ID", DEVICE)
            .env("CONTRACT_DAEMON_CREDENTIAL", SECRET)
            .env("CONTRACT_WORKSPACE", &workspace)
            .env("TMPDIR", &tmp)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null()),
        dir,
    )
}

/// Core and the Runtime running, the Runtime's Environment registered, an Agent of
/// kind `command` created.
struct Started {
    _core: Proc,
    runtime: Proc,
    api: Api,
    agent_id: String,
}

async fn started(dir: &Path) -> Started {
    let (core, base) = start_core(dir);
    let runtime = start_runtime(dir, &base);
    // As docs/end-to-end.md says: Core minted the Project API key into its data directory.
    let key = std::fs::read_to_string(dir.join("data").join("api-key")).unwrap();
    let api = Api::with_key(&base, key.trim());
    register_environment(&api).await;
    let agent_id = agent(&api).await;
    Started {
        _core: core,
        runtime,
        api,
        agent_id,
    }
}

/// Creates an Agent of kind `command` and returns its ID.
async fn agent(api: &Api) -> String {
    let (status, agent) = api
        .post(
            "/agents",
            json!({"agent_kind": "command", "model": "echo", "system_prompt": "Echo."}),
        )
        .await;
    assert_eq!(status, 201, "{agent}");
    agent["agent_id"].as_str().unwrap().into()
}

/// Creates a Session of `agent_id` on the Runtime's Environment.
async fn session(api: &Api, agent_id: &str) -> String {
    let (status, session) = api
        .post(
            "/sessions",
            json!({"agent_id": agent_id, "environment_id": ENVIRONMENT_ID}),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    session["session_id"].as_str().unwrap().into()
}

/// Starts a Turn with one text message; returns the Turn ID.
async fn turn(api: &Api, session_id: &str, text: &str) -> String {
    let (status, turn) = api
        .post(
            &format!("/sessions/{session_id}/turns"),
            json!({"input": text_input(text)}),
        )
        .await;
    assert_eq!(status, 201, "{turn}");
    turn["turn_id"].as_str().unwrap().into()
}

/// A Turn's events (`GET /v1/turns/{id}/events`).
async fn events(api: &Api, turn_id: &str) -> Vec<Value> {
    api.get(&format!("/turns/{turn_id}/events")).await["events"]
        .as_array()
        .unwrap()
        .clone()
}

/// Registers the Runtime's own Environment binding through the public API.
async fn register_environment(api: &Api) {
    let (status, env) = api
        .post(
            "/environments",
            json!({"type": "self_hosted", "environment_id": ENVIRONMENT_ID}),
        )
        .await;
    assert_eq!(status, 201, "{env}");
}

/// Starts a `/sleep` Turn in a new Session of `agent_id` and waits until the program
/// reported its `sleep` child: the Turn ID, its events so far and the child's PID
/// (checked alive).
async fn sleeping_turn(api: &Api, agent_id: &str) -> (String, Vec<Value>, i32) {
    sleeping_turn_with(api, agent_id, "/sleep").await
}

/// [`sleeping_turn`] with the fixture's `command` (`/sleep` or `/setsid`).
async fn sleeping_turn_with(api: &Api, agent_id: &str, command: &str) -> (String, Vec<Value>, i32) {
    let session_id = session(api, agent_id).await;
    let sleeper = turn(api, &session_id, command).await;
    let evs = api
        .wait(&format!("/turns/{sleeper}/events"), |v| {
            delta_text(v["events"].as_array().unwrap()).contains("sleeping (pid ")
        })
        .await;
    let evs = evs["events"].as_array().unwrap().clone();
    let text = delta_text(&evs);
    let pid: i32 = text
        .split("sleeping (pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {text:?}"));
    assert_eq!(kill(Pid::from_raw(pid), None), Ok(()), "the child runs");
    (sleeper, evs, pid)
}

/// Waits until `pid` no longer exists; fails with `what` after `within` (a bound against
/// a hang, not a timing assertion).
async fn await_gone(pid: i32, within: Duration, what: &str) {
    let deadline = std::time::Instant::now() + within;
    while kill(Pid::from_raw(pid), None) != Err(Errno::ESRCH) {
        assert!(std::time::Instant::now() < deadline, "{what} by {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The concatenated text of a Turn's `delta` events.
fn delta_text(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "delta")
        .map(|e| e["payload"]["text"].as_str().unwrap())
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_runtime_and_a_command_harness_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let (_core, base) = start_core(dir.path());
    let _runtime = start_runtime(dir.path(), &base);
    // As docs/end-to-end.md says: Core minted the Project API key into its data directory.
    let key = std::fs::read_to_string(dir.path().join("data").join("api-key")).unwrap();
    let api = Api::with_key(&base, key.trim());

    // The Runtime's own Environment binding, registered through the public API.
    register_environment(&api).await;
    let agent_id = agent(&api).await;

    // 1. A Turn runs the program and completes with its echo and usage. (Started before
    //    the Runtime's first heartbeat may have arrived: Core keeps it queued until then.)
    let session_id = session(&api, &agent_id).await;
    let echo = turn(&api, &session_id, "hello world").await;
    let done = api.wait_state(&echo, "completed").await;
    assert_eq!(done["device_id"], DEVICE);
    assert_eq!(done["outcome"]["native_outcome"], "completed");
    assert_eq!(
        done["outcome"]["usage"],
        json!({"input_tokens": 2, "output_tokens": 3})
    );
    let evs = events(&api, &echo).await;
    assert_eq!(types(&evs), ["delta", "usage", "done"], "{evs:?}");
    assert_eq!(delta_text(&evs), "echo: hello world\n");

    // 2. Active input on a running Turn: written to the program's stdin, `accepted`
    //    by the program itself, and the cursor advances.
    let session_id = session(&api, &agent_id).await;
    let steer = turn(&api, &session_id, "/steer wait for more").await;
    let input_id = api.input(&steer, "and this too").await;
    let inputs = api
        .wait(&format!("/turns/{steer}/inputs"), |v| {
            v["inputs"][0]["state"] == "accepted"
        })
        .await;
    assert_eq!(inputs["inputs"][0]["input_id"], input_id.as_str());
    assert_eq!(inputs["input_cursor"], 1);
    api.wait_state(&steer, "completed").await;
    assert_eq!(
        delta_text(&events(&api, &steer).await),
        "echo: /steer wait for more\necho: and this too\n"
    );

    // 3. A program's own error record keeps its raw metadata; the Runtime classifies it.
    let session_id = session(&api, &agent_id).await;
    let fail = turn(&api, &session_id, "/fail now").await;
    let failed = api.wait_state(&fail, "failed").await;
    assert_eq!(failed["outcome"]["error_code"], "engine_failed", "{failed}");
    assert_eq!(failed["outcome"]["engine_error_code"], "server_error");
    assert_eq!(types(&events(&api, &fail).await), ["error", "done"]);

    // 4. Cancel a long-running Turn: it ends `cancelled` and the program's whole
    //    process tree (the program and its `sleep` child) is gone.
    let (sleeper, evs, pid) = sleeping_turn(&api, &agent_id).await;
    assert!(
        evs.iter().any(|e| e["type"] == "tool_call"
            && e["payload"]["state"] == "started"
            && e["payload"]["observation"]["kind"] == "command"),
        "{evs:?}"
    );
    let (status, body) = api
        .post(&format!("/turns/{sleeper}/cancel"), json!({}))
        .await;
    assert_eq!(status, 202, "{body}");
    let cancelled = api.wait_state(&sleeper, "cancelled").await;
    assert_eq!(cancelled["cancel_requested"], true);
    // The cancel receipt is sent only once the group was confirmed empty.
    assert_eq!(
        kill(Pid::from_raw(pid), None),
        Err(Errno::ESRCH),
        "the program's child survived the cancel"
    );
}

/// SIGTERM to the Runtime (docs/end-to-end.md, step 6: it "closes its Executors on SIGTERM"): the
/// running program's whole process group, its `sleep` child included, is gone before
/// the Runtime exits, and the Runtime exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_the_runtimes_executors_before_it_exits() {
    let dir = tempfile::tempdir().unwrap();
    let Started {
        _core,
        mut runtime,
        api,
        agent_id,
    } = started(dir.path()).await;
    let (_, _, pid) = sleeping_turn(&api, &agent_id).await;
    kill(runtime.pgid(), Signal::SIGTERM).unwrap();
    // Bounded wait for the exit (SIGNAL_SHUTDOWN_BOUND is 10 s; the close is the
    // adapter's SIGTERM, grace, SIGKILL of the Run's group).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = runtime.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the Runtime did not exit within 20 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(0), "{status}");
    assert_eq!(
        kill(Pid::from_raw(pid), None),
        Err(Errno::ESRCH),
        "the program's child outlived the Runtime's SIGTERM"
    );
}

/// SIGKILL of the Runtime (it can handle nothing) leaves no process of a Run behind: the
/// program's supervisor notices the end of its watch and kills the program's group and
/// every descendant, here a `sleep` that moved to a session of its own.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_the_runtime_leaves_no_process_of_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let Started {
        _core,
        mut runtime,
        api,
        agent_id,
    } = started(dir.path()).await;
    let (_, _, pid) = sleeping_turn_with(&api, &agent_id, "/setsid").await;
    kill(
        Pid::from_raw(runtime.child.id().try_into().unwrap()),
        Signal::SIGKILL,
    )
    .unwrap();
    let _ = runtime.child.wait();
    // Bounded wait (the supervisor's sweep is bounded by SWEEP_BOUND, 3 s).
    await_gone(
        pid,
        Duration::from_secs(20),
        "the setsid child of the program outlived the Runtime's SIGKILL",
    )
    .await;
}

/// The scratch roots (`contract-scratch-*`) in the Runtime's temporary directory.
fn scratch_roots(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir.join("tmp"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("contract-scratch-")
        })
        .map(|e| e.path())
        .collect()
}

/// A Run without an execution environment works in a private scratch directory; a
/// SIGKILLed Runtime cannot remove it, so the Run's supervisor, once it has killed the
/// program, removes the scratch root whose owner is gone.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_the_runtime_leaves_no_scratch_directory() {
    let dir = tempfile::tempdir().unwrap();
    let Started {
        _core,
        mut runtime,
        api,
        agent_id,
    } = started(dir.path()).await;
    let (status, env) = api.post("/environments", json!({"type": "none"})).await;
    assert_eq!(status, 201, "{env}");
    let (status, session) = api
        .post(
            "/sessions",
            json!({"agent_id": agent_id, "environment_id": env["environment_id"]}),
        )
        .await;
    assert_eq!(status, 201, "{session}");
    let sleeper = turn(&api, session["session_id"].as_str().unwrap(), "/sleep").await;
    api.wait(&format!("/turns/{sleeper}/events"), |v| {
        delta_text(v["events"].as_array().unwrap()).contains("sleeping (pid ")
    })
    .await;
    let roots = scratch_roots(dir.path());
    assert_eq!(
        roots.len(),
        1,
        "one scratch root while the Run works: {roots:?}"
    );
    kill(
        Pid::from_raw(runtime.child.id().try_into().unwrap()),
        Signal::SIGKILL,
    )
    .unwrap();
    let _ = runtime.child.wait();
    // Bounded wait (the supervisor's sweep is bounded by SWEEP_BOUND, 3 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while roots[0].exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the SIGKILLed Runtime's scratch root survived: {:?}",
            roots[0]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A program that writes 10,000 lines at once (a build log, `cat`) loses nothing: Core
/// stops reading the connection while the Turn's queue is full instead of failing the
/// Turn, stores the queued events in batches, and every delta and the `done` are
/// readable from the events API, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_ten_thousand_lines_is_stored_whole() {
    const LINES: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let Started {
        _core,
        runtime: _runtime,
        api,
        agent_id,
    } = started(dir.path()).await;
    let session_id = session(&api, &agent_id).await;
    let burst = turn(&api, &session_id, &format!("/burst {LINES}")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let state = loop {
        let t = api.get(&format!("/turns/{burst}")).await;
        let state = t["state"].as_str().unwrap().to_string();
        if ["completed", "failed", "cancelled"].contains(&state.as_str()) {
            break t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the burst Turn did not end: {t}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(state["state"], "completed", "{state}");
    let mut after = 0u64;
    let mut deltas = 0usize;
    let mut last = None;
    loop {
        let page = api
            .get(&format!(
                "/turns/{burst}/events?after_sequence={after}&limit=1000"
            ))
            .await;
        let events = page["events"].as_array().unwrap();
        if events.is_empty() {
            break;
        }
        for e in events {
            let sequence = e["sequence"].as_u64().unwrap();
            assert_eq!(sequence, after + 1, "sequences are dense and ordered");
            after = sequence;
            if e["type"] == "delta" {
                assert_eq!(e["payload"]["text"], format!("line {deltas}\n"));
                deltas += 1;
            }
            last = Some(e["type"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(deltas, LINES);
    assert_eq!(last.as_deref(), Some("done"));
}

/// A Runtime whose credential is revoked is closed out by Core (1008), is refused on
/// reconnect (401: permanent) and then stops its programs: nothing a Run produces could
/// reach Core any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_runtime_stops_its_programs() {
    let dir = tempfile::tempdir().unwrap();
    let Started {
        _core,
        runtime: _runtime,
        api,
        agent_id,
    } = started(dir.path()).await;
    let (_, _, pid) = sleeping_turn(&api, &agent_id).await;
    let listed = api.get(&format!("/devices/{DEVICE}/credentials")).await;
    let id = listed["credentials"][0]["credential_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, body) = api
        .post(
            &format!("/devices/{DEVICE}/credentials/{id}/revoke"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Bounded wait: the reconnect delay, the refusal, then the Executor's close.
    await_gone(
        pid,
        Duration::from_secs(30),
        "the program's child outlived the revocation",
    )
    .await;
}

/// A program that dies by a signal the supervisor cannot re-raise itself (SIGSEGV: Rust's
/// runtime handles it in the supervisor) is still reported as terminated by that signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_killed_by_sigsegv_is_reported_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let Started {
        _core,
        runtime: _runtime,
        api,
        agent_id,
    } = started(dir.path()).await;
    let session_id = session(&api, &agent_id).await;
    let died = turn(&api, &session_id, "/die SEGV").await;
    let failed = api.wait_state(&died, "failed").await;
    let evs = events(&api, &died).await;
    let error = evs
        .iter()
        .find(|e| e["type"] == "error")
        .unwrap_or_else(|| panic!("no error event: {evs:?} ({failed})"));
    let message = error["payload"]["message"].as_str().unwrap();
    assert!(message.contains("terminated by signal 11"), "{message}");
}

/// The PIDs whose parent is `parent`, with their `/proc` state letter.
fn children_of(parent: i32) -> Vec<(i32, char)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
            let state = rest.next()?.chars().next()?;
            let ppid: i32 = rest.next()?.parse().ok()?;
            (ppid == parent).then_some((pid, state))
        })
        .collect()
}

/// A program's supervisor killed outright (it cannot sweep) leaves nothing behind
/// either: the program's group is killed by the Runtime, and the descendant that moved
/// to a session of its own, re-parented to the Runtime, is killed and reaped (no
/// process and no zombie stays under the Runtime).
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_a_supervisor_leaves_no_process_and_no_zombie() {
    let dir = tempfile::tempdir().unwrap();
    let Started {
        _core,
        runtime,
        api,
        agent_id,
    } = started(dir.path()).await;
    let (turn_id, _, pid) = sleeping_turn_with(&api, &agent_id, "/setsid").await;
    let runtime_pid: i32 = runtime.child.id().try_into().unwrap();
    let supervisors = children_of(runtime_pid);
    assert_eq!(supervisors.len(), 1, "one supervisor: {supervisors:?}");
    kill(Pid::from_raw(supervisors[0].0), Signal::SIGKILL).unwrap();
    api.wait_state(&turn_id, "failed").await;
    await_gone(
        pid,
        Duration::from_secs(20),
        "the setsid child outlived its supervisor's SIGKILL",
    )
    .await;
    // Bounded wait for the reaping (a bound against a hang, not a measurement).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = children_of(runtime_pid);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "processes left under the Runtime: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
