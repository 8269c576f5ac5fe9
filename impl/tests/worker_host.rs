//! The worker host against real processes: our Python worker (and scripted misbehaving
//! workers), the supervisor, and the host itself killed with SIGKILL.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use contract_impl::worker::host::{BasicServices, HostConfig, Worker};
use contract_impl::worker::wire::{CellStatus, Stream};

const BIN: &str = env!("CARGO_BIN_EXE_contract-impl");

fn python_worker() -> HostConfig {
    let mut config = HostConfig::workbench(vec![BIN.into(), "worker".into(), "python".into()]);
    config.supervisor = Some(BIN.into());
    config
}

fn result_text(record: &contract_impl::worker::host::CellRecord) -> String {
    record
        .output
        .iter()
        .filter(|o| o.stream == Stream::Result)
        .map(|o| o.text.clone())
        .collect()
}

#[tokio::test]
async fn cells_run_in_a_private_directory_and_the_worker_exits_cleanly() {
    let mut worker = Worker::spawn(python_worker()).await.unwrap();
    let dir = worker.dir().to_path_buf();
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let socket = std::fs::metadata(dir.join("worker.sock")).unwrap();
    assert_eq!(socket.permissions().mode() & 0o777, 0o600);
    let mut services = BasicServices;
    let r = worker.execute("x = 6\nx * 7", &mut services).await.unwrap();
    assert_eq!(
        (r.status, result_text(&r)),
        (Some(CellStatus::Ok), "42".to_string())
    );
    let r = worker
        .execute(
            "v = await runtime.inspect()\nv['now'].endswith('Z')",
            &mut services,
        )
        .await
        .unwrap();
    assert_eq!(result_text(&r), "True");
    let status = worker.shutdown(Duration::from_secs(5)).await.unwrap();
    assert!(status.success(), "{status}");
    drop(worker);
    assert!(!dir.exists(), "the private directory is removed");
}

/// A cell reads what its worker was given, not the host's environment: the host's own
/// variables (here those cargo sets for this test, as the control socket would be set
/// for a host) do not reach it; the allow-list's (`PATH`) and the launch ones do.
#[tokio::test]
async fn the_worker_does_not_inherit_the_hosts_environment() {
    assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
    let mut worker = Worker::spawn(python_worker()).await.unwrap();
    let mut services = BasicServices;
    let r = worker
        .execute(
            "import os\n[k in os.environ for k in ('CARGO_PKG_NAME', 'CARGO_MANIFEST_DIR', 'PATH', 'CONTRACT_WORKER_TOKEN')]",
            &mut services,
        )
        .await
        .unwrap();
    assert_eq!(result_text(&r), "[False, False, True, True]");
}

#[tokio::test]
async fn the_129th_request_of_a_cell_is_refused() {
    let mut worker = Worker::spawn(python_worker()).await.unwrap();
    let code = "codes = []\nfor i in range(130):\n    try:\n        await runtime.inspect()\n        codes.append('ok')\n    except Exception as e:\n        codes.append(e.code)\n(codes.count('ok'), codes[128:])";
    let r = worker.execute(code, &mut BasicServices).await.unwrap();
    assert_eq!(result_text(&r), "(128, ['request_limit', 'request_limit'])");
    worker.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_worker_that_dies_mid_cell_gets_a_host_observed_record() {
    let mut worker = Worker::spawn(python_worker()).await.unwrap();
    let r = worker
        .execute("import os\nprint('bye')\nos._exit(5)", &mut BasicServices)
        .await
        .unwrap();
    assert!(r.observed_by_host, "{r:?}");
    assert_eq!(r.status, None);
    assert!(r.output.is_empty(), "no invented output");
    assert!(
        r.error.as_deref().unwrap_or_default().contains("eof"),
        "{r:?}"
    );
    // The generation is gone for good.
    let again = worker.execute("1", &mut BasicServices).await;
    assert_eq!(again.unwrap_err().code(), "invalidated");
}

/// A worker that says hello with another token.
#[tokio::test]
async fn a_hello_with_another_token_is_refused() {
    let script = r#"
import json, os, socket, struct
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["CONTRACT_WORKER_SOCKET"])
m = {"version": 1, "session_id": os.environ["CONTRACT_WORKER_SESSION_ID"], "generation": os.environ["CONTRACT_WORKER_GENERATION"],
     "message": {"kind": "hello", "token": "tok-forged", "role": "workbench", "revision": None, "slots": []}}
b = json.dumps(m).encode(); s.sendall(struct.pack(">I", len(b)) + b); s.recv(1)
"#;
    let mut config = python_worker();
    config.program = vec!["python3".into(), "-c".into(), OsString::from(script)];
    let err = Worker::spawn(config).await.err().unwrap();
    assert_eq!(err.code(), "handshake_refused", "{err}");
}

fn alive(pid: i32) -> bool {
    // A zombie is gone for our purpose only once reaped; /proc/PID/stat shows `Z`.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 2..].chars().next();
            state != Some('Z')
        }
        Err(_) => false,
    }
}

#[test]
fn no_process_of_the_worker_survives_a_sigkill_of_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let pids = dir.path().join("pids");
    let cells = dir.path().join("cells.py");
    std::fs::write(
        &cells,
        format!(
            "import os, subprocess, time\nchild = subprocess.Popen(['sleep', '600'])\nescaped = subprocess.Popen(['sleep', '601'], start_new_session=True)\nopen({:?}, 'w').write(f'{{os.getpid()}} {{child.pid}} {{escaped.pid}}')\ntime.sleep(600)\n",
            pids.display().to_string()
        ),
    )
    .unwrap();
    let mut host = std::process::Command::new(BIN)
        .args(["worker", "run", "--file"])
        .arg(&cells)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let text = loop {
        if let Ok(text) = std::fs::read_to_string(&pids)
            && text.split(' ').count() == 3
        {
            break text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the cell never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let pids: Vec<i32> = text.split(' ').map(|p| p.parse().unwrap()).collect();
    assert!(pids.iter().all(|p| alive(*p)));
    host.kill().unwrap();
    host.wait().unwrap();
    let killed = Instant::now();
    while pids.iter().any(|p| alive(*p)) {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "processes of the worker outlived the host: {:?}",
            pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_independent_host_drives_our_worker() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/independent_worker_host.py"
    );
    let out = std::process::Command::new("python3")
        .args([script, BIN, "worker", "python"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn our_host_drives_an_independent_worker() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/independent_worker.py"
    );
    let mut config = python_worker();
    config.program = vec!["python3".into(), script.into()];
    let mut worker = Worker::spawn(config).await.unwrap();
    for (code, want) in [("6 * 7", "42"), ("'ab' * 2", "'abab'")] {
        let r = worker.execute(code, &mut BasicServices).await.unwrap();
        assert_eq!(r.status, Some(CellStatus::Ok), "{r:?}");
        assert_eq!(result_text(&r), want);
        // runtime.inspect answered ok, hooks.list refused: each reply reached its request.
        assert_eq!(r.output[0].text, "ok error\n");
    }
    let r = worker.execute("1 / 0", &mut BasicServices).await.unwrap();
    assert_eq!(r.status, Some(CellStatus::Error));
    assert!(
        worker
            .shutdown(Duration::from_secs(5))
            .await
            .unwrap()
            .success()
    );
}

/// A worker that says hello and then never reads its socket: the host's write of a big
/// cell does not go through within its bound, so the exchange is abandoned and the
/// generation invalidated (instead of the host hanging on the write).
#[tokio::test]
async fn a_worker_that_stops_reading_cannot_wedge_the_host() {
    let script = r#"
import json, os, socket, struct, time
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["CONTRACT_WORKER_SOCKET"])
m = {"version": 1, "session_id": os.environ["CONTRACT_WORKER_SESSION_ID"], "generation": os.environ["CONTRACT_WORKER_GENERATION"],
     "message": {"kind": "hello", "token": os.environ["CONTRACT_WORKER_TOKEN"], "role": "workbench", "revision": None, "slots": []}}
b = json.dumps(m).encode(); s.sendall(struct.pack(">I", len(b)) + b)
time.sleep(600)
"#;
    let mut config = python_worker();
    config.program = vec!["python3".into(), "-c".into(), OsString::from(script)];
    config.send_timeout = Duration::from_millis(300);
    let mut worker = Worker::spawn(config).await.unwrap();
    let code = format!("#{}", "a".repeat(262_000));
    let r = worker.execute(&code, &mut BasicServices).await.unwrap();
    assert!(r.observed_by_host, "{r:?}");
    assert!(
        r.error.as_deref().unwrap_or_default().contains("(timeout)"),
        "{r:?}"
    );
    assert!(!worker.is_valid());
}

/// "`interrupt` targets one operation ID": an interrupt while no cell runs reaches no
/// cell, not the next one.
#[tokio::test]
async fn an_interrupt_between_cells_reaches_no_cell() {
    let mut worker = Worker::spawn(python_worker()).await.unwrap();
    let interrupter = worker.interrupter();
    assert_eq!(interrupter.interrupt(), None, "no cell runs");
    let r = worker
        .execute(
            "import asyncio\nawait asyncio.sleep(0.2)\n'done'",
            &mut BasicServices,
        )
        .await
        .unwrap();
    assert_eq!(
        (r.status, result_text(&r)),
        (Some(CellStatus::Ok), "'done'".to_string())
    );
    worker.shutdown(Duration::from_secs(5)).await;
}

/// A cell that kills its own supervisor does not leave its worker running unsupervised:
/// the host notices the supervisor's end and kills the worker's process group, and the
/// cell is the host's record (not the `ok` the cell would otherwise reach).
#[tokio::test]
async fn killing_the_supervisor_stops_the_worker() {
    let mut worker = Worker::spawn(python_worker()).await.unwrap();
    let r = worker
        .execute(
            "import os, time\nos.kill(os.getppid(), 9)\ntime.sleep(60)\n'survived'",
            &mut BasicServices,
        )
        .await
        .unwrap();
    assert!(r.observed_by_host, "{r:?}");
    assert_eq!(r.status, None);
}

/// Answers `workspace.info` beside the exchange (`RequestHandler::start`): after a pause,
/// or never (a future that only records that it was dropped); everything else as
/// [`BasicServices`].
struct Detached {
    pause: Option<Duration>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

struct OnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl contract_impl::worker::host::RequestHandler for Detached {
    async fn handle(
        &mut self,
        execution_id: &contract_impl::worker::wire::Identifier,
        request_id: &contract_impl::worker::wire::Identifier,
        request: &contract_impl::worker::wire::HostRequest,
    ) -> contract_impl::worker::wire::Reply {
        BasicServices
            .handle(execution_id, request_id, request)
            .await
    }

    fn start(
        &mut self,
        _execution_id: &contract_impl::worker::wire::Identifier,
        _request_id: &contract_impl::worker::wire::Identifier,
        request: &contract_impl::worker::wire::HostRequest,
    ) -> Option<contract_impl::worker::host::PendingReply> {
        if !matches!(
            request,
            contract_impl::worker::wire::HostRequest::WorkspaceInfo {}
        ) {
            return None;
        }
        let pause = self.pause;
        let guard = OnDrop(self.dropped.clone());
        Some(Box::pin(async move {
            let _guard = guard;
            match pause {
                Some(pause) => tokio::time::sleep(pause).await,
                None => std::future::pending::<()>().await,
            }
            contract_impl::worker::wire::Reply::Ok {
                value: serde_json::json!({"slow": true}),
            }
        }))
    }
}

#[tokio::test]
async fn a_reply_made_beside_the_exchange_lets_later_requests_pass_and_dies_with_the_cell() {
    use contract_impl::worker::host::RequestHandler as _;
    let mut worker = Worker::spawn(python_worker()).await.unwrap();
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut slow = Detached {
        pause: Some(Duration::from_millis(500)),
        dropped: dropped.clone(),
    };
    // The slow request is sent first; the inspect behind it is answered first.
    let code = "import asyncio\norder = []\nasync def slow():\n    v = await runtime.workspace_info()\n    order.append(('slow', v['slow']))\nasync def fast():\n    await runtime.inspect()\n    order.append('fast')\nawait asyncio.gather(slow(), fast())\norder";
    let r = worker.execute(code, &mut slow).await.unwrap();
    assert_eq!(result_text(&r), "['fast', ('slow', True)]", "{r:?}");
    // A reply never made: the cell completes with it pending (a background task's), and
    // the host drops it.
    dropped.store(false, std::sync::atomic::Ordering::SeqCst);
    let mut never = Detached {
        pause: None,
        dropped: dropped.clone(),
    };
    let code =
        "t = asyncio.create_task(runtime.workspace_info())\nawait asyncio.sleep(0.2)\n'done'";
    let r = worker.execute(code, &mut never).await.unwrap();
    assert_eq!(result_text(&r), "'done'", "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dropped.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the pending reply outlived its cell"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The same request answered in line by `handle` when no `start` takes it.
    let reply = never
        .handle(
            &contract_impl::worker::wire::Identifier::new("c").unwrap(),
            &contract_impl::worker::wire::Identifier::new("r").unwrap(),
            &contract_impl::worker::wire::HostRequest::RuntimeInspect {},
        )
        .await;
    assert!(matches!(
        reply,
        contract_impl::worker::wire::Reply::Ok { .. }
    ));
    worker.shutdown(Duration::from_secs(5)).await;
}
