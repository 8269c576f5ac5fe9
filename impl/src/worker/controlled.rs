//! The controlled host (`contract-impl worker host`, `docs/worker-host-control.md`): our
//! worker host driven over a control channel, so that a scripted peer (the conformance
//! harness) can make it start workers, run cells, call hooks and activate revisions, and
//! read what the host decided.
//!
//! * The host connects to `CONTRACT_HOST_CONTROL_SOCKET`, sends the hello line
//!   [`HELLO_LINE`], then answers one request per line (`{"seq", "op", ...}` →
//!   `{"seq", "ok", "result"|"error"}`), in any order.
//! * Every worker it starts runs `CONTRACT_WORKER_PROGRAM` (a JSON array: the program and
//!   its arguments; default our Python worker) under the supervisor, with the launch
//!   environment of `docs/worker-launch-contract.md`.
//! * Long operations (`start_workbench`, `execute`, `attention`, `review`, `activate`,
//!   `shutdown`) are accepted at once (`{}`); their outcome is read with `await`.
//!
//! This module owns the mapping of control operations onto [`super::host`],
//! [`super::policy`], [`super::activation`] and [`super::lane`]; it never speaks the
//! worker wire itself.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{Mutex, mpsc, watch};

use super::activation::Policies;
use super::host::{
    BasicServices, CellRecord, Choices, HostConfig, Interrupter, RequestHandler, SHUTDOWN_GRACE,
    Worker,
};
use super::lane::OperatorLane;
use super::policy::{INVOKE_BUDGET, Policy};
use super::wire::{HostRequest, Identifier, Reply};

/// The first line the host sends on the control channel.
pub const HELLO_LINE: &str = r#"{"hello":{"adapter":"worker-host","protocol":1}}"#;

/// The variable naming the control socket.
pub const CONTROL_ENV: &str = "CONTRACT_HOST_CONTROL_SOCKET";

/// The variable naming the worker program (a JSON array of strings).
pub const PROGRAM_ENV: &str = "CONTRACT_WORKER_PROGRAM";

/// Longest control line in either direction (bytes, without the `\n`).
pub const CONTROL_LINE_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Longest `await` (and default when no `timeout_ms` is given).
pub const AWAIT_MAX: Duration = Duration::from_secs(600);

/// A control operation failed (stable `code`).
#[derive(Debug, Clone)]
struct OpError {
    code: &'static str,
    message: String,
}

fn bad(message: impl Into<String>) -> OpError {
    OpError {
        code: "bad_request",
        message: message.into(),
    }
}

/// The outcome of a long operation, once known.
type Outcome = watch::Receiver<Option<Value>>;

/// The controlled host's state.
struct Host {
    program: Vec<OsString>,
    policies: Arc<Policies>,
    lane: Arc<OperatorLane>,
    workbench: Arc<Mutex<Option<Worker>>>,
    interrupter: std::sync::Mutex<Option<Interrupter>>,
    outcomes: std::sync::Mutex<HashMap<String, Outcome>>,
    interrupt_grace: std::sync::Mutex<Duration>,
    different: bool,
}

/// The session every connection of the controlled host carries.
fn session(different: bool) -> Identifier {
    Identifier::new(if different { "main-session" } else { "root" }).expect("a valid identifier")
}

/// Reads the worker program from [`PROGRAM_ENV`] (default: this binary's Python worker).
///
/// # Errors
/// The variable is not a JSON array of strings.
pub fn program_from_env() -> Result<Vec<OsString>, String> {
    match std::env::var(PROGRAM_ENV) {
        Ok(text) => {
            let argv: Vec<String> = serde_json::from_str(&text)
                .map_err(|e| format!("{PROGRAM_ENV} must be a JSON array of strings: {e}"))?;
            if argv.is_empty() {
                return Err(format!("{PROGRAM_ENV} names no program"));
            }
            Ok(argv.into_iter().map(OsString::from).collect())
        }
        Err(_) => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            Ok(vec![exe.into_os_string(), "worker".into(), "python".into()])
        }
    }
}

/// Runs the controlled host until the control channel ends or SIGTERM; stops every
/// worker before it returns. Returns the process exit code.
///
/// `different`: the host makes every choice the spec leaves free otherwise
/// ([`Choices::DIFFERENT`], another session and generation naming, other outcome codes,
/// another wake priority of its own plans), for the vendor-mode trial of the suite.
pub async fn run(data_dir: &Path, different: bool) -> i32 {
    match serve(data_dir, different).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("contract-impl worker host: {e}");
            2
        }
    }
}

async fn serve(data_dir: &Path, different: bool) -> Result<(), String> {
    let socket = std::env::var(CONTROL_ENV).map_err(|_| format!("{CONTROL_ENV} is not set"))?;
    let program = program_from_env()?;
    let choices = if different {
        Choices::DIFFERENT
    } else {
        Choices::REFERENCE
    };
    let (policies, problem) = Policies::open(data_dir, program.clone(), INVOKE_BUDGET, choices)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(problem) = problem {
        eprintln!("contract-impl worker host: the recorded policy did not start: {problem}");
    }
    let lane = OperatorLane::open(data_dir)?;
    let host = Arc::new(Host {
        program,
        policies: Arc::new(policies),
        lane: Arc::new(lane),
        workbench: Arc::new(Mutex::new(None)),
        interrupter: std::sync::Mutex::new(None),
        outcomes: std::sync::Mutex::new(HashMap::new()),
        interrupt_grace: std::sync::Mutex::new(super::host::INTERRUPT_GRACE),
        different,
    });
    let stream = UnixStream::connect(&socket)
        .await
        .map_err(|e| format!("{socket}: {e}"))?;
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<String>(256);
    let writer = tokio::spawn(async move {
        let mut hello = HELLO_LINE.to_string();
        hello.push('\n');
        if write.write_all(hello.as_bytes()).await.is_err() {
            return;
        }
        while let Some(mut line) = rx.recv().await {
            line.push('\n');
            if write.write_all(line.as_bytes()).await.is_err() {
                return;
            }
        }
    });
    let mut reader = BufReader::new(read);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    loop {
        let mut line = Vec::new();
        let mut limited = (&mut reader).take(CONTROL_LINE_MAX_BYTES as u64 + 1);
        let read = tokio::select! {
            read = limited.read_until(b'\n', &mut line) => read,
            _ = term.recv() => break,
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(_) if line.last() != Some(&b'\n') => {
                let _ = tx
                    .send(error_line(None, &bad("an unterminated or over-long line")))
                    .await;
                break;
            }
            Ok(_) => {}
        }
        line.pop();
        let host = host.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let response = host.handle(&line).await;
            let _ = tx.send(response).await;
        });
    }
    drop(tx);
    host.stop().await;
    writer.abort();
    Ok(())
}

/// An outcome code as this host reports it: ours, or another name for it.
fn outcome_code(different: bool, ours: &str) -> String {
    if different {
        format!("host-{}", ours.replace('_', "-"))
    } else {
        ours.to_string()
    }
}

fn error_line(seq: Option<u64>, e: &OpError) -> String {
    json!({"seq": seq.unwrap_or(0), "ok": false, "error": {"code": e.code, "message": e.message}})
        .to_string()
}

fn str_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Result<&'a str, OpError> {
    args.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("`{key}` must be a string")))
}

impl Host {
    async fn handle(self: &Arc<Self>, line: &[u8]) -> String {
        let parsed = crate::wire::parse_strict_with_nulls(line);
        let Ok(Value::Object(mut args)) = parsed else {
            return error_line(None, &bad("a request must be one strict JSON object"));
        };
        let Some(seq) = args.remove("seq").and_then(|s| s.as_u64()) else {
            return error_line(None, &bad("a request needs an unsigned `seq`"));
        };
        let Some(op) = args
            .remove("op")
            .and_then(|o| o.as_str().map(str::to_string))
        else {
            return error_line(Some(seq), &bad("a request needs a string `op`"));
        };
        match self.op(&op, args).await {
            Ok(result) => json!({"seq": seq, "ok": true, "result": result}).to_string(),
            Err(e) => error_line(Some(seq), &e),
        }
    }

    /// Registers the outcome `name` of a long operation and runs it in the background.
    fn spawn_outcome<F>(self: &Arc<Self>, name: String, work: F) -> Result<Value, OpError>
    where
        F: std::future::Future<Output = Value> + Send + 'static,
    {
        let (tx, rx) = watch::channel(None);
        self.outcomes
            .lock()
            .map_err(|_| bad("poisoned"))?
            .insert(name, rx);
        tokio::spawn(async move {
            let value = work.await;
            let _ = tx.send(Some(value));
        });
        Ok(json!({}))
    }

    async fn op(self: &Arc<Self>, op: &str, args: Map<String, Value>) -> Result<Value, OpError> {
        let name = match args.get("as") {
            Some(Value::String(name)) => name.clone(),
            Some(_) => return Err(bad("`as` must be a string")),
            None => op.to_string(),
        };
        match op {
            "configure" => {
                if let Some(ms) = args.get("invoke_budget_ms") {
                    let ms = ms
                        .as_u64()
                        .ok_or_else(|| bad("`invoke_budget_ms` must be an integer"))?;
                    self.policies.set_budget(Duration::from_millis(ms));
                }
                if let Some(ms) = args.get("interrupt_grace_ms") {
                    let ms = ms
                        .as_u64()
                        .ok_or_else(|| bad("`interrupt_grace_ms` must be an integer"))?;
                    if let Ok(mut g) = self.interrupt_grace.lock() {
                        *g = Duration::from_millis(ms);
                    }
                }
                Ok(json!({}))
            }
            "start_workbench" => {
                let host = self.clone();
                self.spawn_outcome(name, async move { host.start_workbench().await })
            }
            "execute" => {
                let code = str_arg(&args, "code")?.to_string();
                let host = self.clone();
                self.spawn_outcome(name, async move { host.execute(code).await })
            }
            "interrupt" => {
                if let Some(i) = self.interrupter.lock().ok().and_then(|i| i.clone()) {
                    i.interrupt();
                }
                Ok(json!({}))
            }
            "attention" | "review" => {
                let input = args
                    .get("input")
                    .cloned()
                    .ok_or_else(|| bad("`input` is required"))?;
                let pinned = self.policies.pin();
                let review = op == "review";
                let different = self.different;
                self.spawn_outcome(name, async move {
                    let outcome = if review {
                        Policy::review(pinned.as_deref(), &input)
                            .await
                            .map(|r| serde_json::to_value(r).unwrap_or_default())
                    } else {
                        Policy::attention(pinned.as_deref(), &input, u32::from(different))
                            .await
                            .map(|p| serde_json::to_value(p).unwrap_or_default())
                    };
                    outcome.unwrap_or_else(
                        |e| json!({"error": {"code": outcome_code(different, e.code()), "message": e.to_string()}}),
                    )
                })
            }
            "activate" => {
                let path = PathBuf::from(str_arg(&args, "path")?);
                let expected = args
                    .get("expected_epoch")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| bad("`expected_epoch` must be an unsigned integer"))?;
                let policies = self.policies.clone();
                let different = self.different;
                self.spawn_outcome(name, async move {
                    match policies.activate(&path, expected).await {
                        Ok(a) => {
                            json!({"status": "activated", "epoch": a.epoch, "revision": a.revision})
                        }
                        Err(e) => {
                            json!({"status": "refused", "code": outcome_code(different, e.code()), "message": e.to_string()})
                        }
                    }
                })
            }
            "diagnostics" => {
                let guard = self.workbench.lock().await;
                let worker = guard.as_ref().ok_or_else(|| OpError {
                    code: "no_workbench",
                    message: "no workbench is running".into(),
                })?;
                Ok(worker.diagnostics())
            }
            "epoch" => {
                let current = self.policies.current().map_err(|e| OpError {
                    code: "store_failed",
                    message: e.to_string(),
                })?;
                Ok(json!({"epoch": current.epoch, "revision": current.revision}))
            }
            "shutdown" => {
                let host = self.clone();
                self.spawn_outcome(name, async move {
                    let status = match host.workbench.lock().await.take() {
                        Some(mut w) => w.shutdown(SHUTDOWN_GRACE).await.and_then(|s| s.code()),
                        None => None,
                    };
                    json!({"exit_code": status})
                })
            }
            "await" => {
                let mut rx = self
                    .outcomes
                    .lock()
                    .map_err(|_| bad("poisoned"))?
                    .get(&name)
                    .cloned()
                    .ok_or_else(|| OpError {
                        code: "unknown_operation",
                        message: format!("no operation `{name}` was started"),
                    })?;
                let bound = args
                    .get("timeout_ms")
                    .and_then(Value::as_u64)
                    .map_or(AWAIT_MAX, Duration::from_millis)
                    .min(AWAIT_MAX);
                let value = tokio::time::timeout(bound, rx.wait_for(Option::is_some))
                    .await
                    .map_err(|_| OpError {
                        code: "timeout",
                        message: format!("`{name}` did not end within {bound:?}"),
                    })?
                    .map_err(|_| bad("the operation was dropped"))?
                    .clone();
                Ok(value.unwrap_or(Value::Null))
            }
            other => Err(OpError {
                code: "unknown_op",
                message: format!("unknown op `{other}`"),
            }),
        }
    }

    async fn start_workbench(self: &Arc<Self>) -> Value {
        let mut config = HostConfig::workbench(self.program.clone());
        config.session_id = session(self.different);
        if self.different {
            config.choices = Choices::DIFFERENT;
        }
        // A generation identifier of its own per start, so that effects of different
        // generations never share an identity in the durable lane.
        let prefix = if self.different { "generation-" } else { "g-" };
        config.generation = Identifier::new(format!(
            "{prefix}{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ))
        .expect("a valid identifier");
        config.interrupt_grace = self
            .interrupt_grace
            .lock()
            .map(|g| *g)
            .unwrap_or(super::host::INTERRUPT_GRACE);
        match Worker::spawn(config).await {
            Ok(worker) => {
                if let Ok(mut i) = self.interrupter.lock() {
                    *i = Some(worker.interrupter());
                }
                *self.workbench.lock().await = Some(worker);
                json!({"status": "ready"})
            }
            Err(e) => {
                json!({"status": "refused", "code": outcome_code(self.different, e.code()), "message": e.to_string()})
            }
        }
    }

    async fn execute(self: &Arc<Self>, code: String) -> Value {
        // "Each executing cell pins its policy object."
        let policy = self.policies.pin();
        let mut guard = self.workbench.lock().await;
        let Some(worker) = guard.as_mut() else {
            return json!({"error": {"code": "no_workbench", "message": "no workbench is running"}});
        };
        let mut services = Services {
            policy,
            lane: self.lane.clone(),
            generation: worker.generation().as_str().to_string(),
        };
        match worker.execute(&code, &mut services).await {
            Ok(record) => record_json(&record),
            Err(e) => {
                json!({"error": {"code": outcome_code(self.different, e.code()), "message": e.to_string()}})
            }
        }
    }

    async fn stop(&self) {
        if let Some(mut w) = self.workbench.lock().await.take() {
            w.shutdown(SHUTDOWN_GRACE).await;
        }
        self.policies.shutdown().await;
    }
}

/// A cell record as the control channel reports it.
pub fn record_json(record: &CellRecord) -> Value {
    json!({
        "status": record.status,
        "output": record.output,
        "truncated_bytes": record.truncated_bytes,
        "error": record.error,
        "observed_by_host": record.observed_by_host,
    })
}

/// What a cell of the controlled host may ask: `runtime.inspect`, and `local.send`
/// reviewed by the cell's pinned policy into the operator lane.
struct Services {
    policy: Option<Arc<Policy>>,
    lane: Arc<OperatorLane>,
    generation: String,
}

#[async_trait]
impl RequestHandler for Services {
    async fn handle(
        &mut self,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Reply {
        let HostRequest::LocalSend { text } = request else {
            return BasicServices
                .handle(execution_id, request_id, request)
                .await;
        };
        // The effect is the request's identity: a retry of it returns its receipt.
        let effect_id = format!(
            "{}.{}.{}",
            self.generation,
            execution_id.as_str(),
            request_id.as_str()
        );
        let lane_error = |e: String| Reply::Error {
            code: "lane_failed".into(),
            message: e,
        };
        match self.lane.existing(&effect_id) {
            Ok(Some(receipt)) => {
                return Reply::Ok {
                    value: serde_json::to_value(receipt).unwrap_or_default(),
                };
            }
            Ok(None) => {}
            Err(e) => return lane_error(e),
        }
        let input = json!({"effect_id": effect_id, "destination": "operator", "text": text});
        let held = match Policy::review(self.policy.as_deref(), &input).await {
            Ok(review) => match review.decision {
                super::wire::hooks::DeliveryDecision::Allow => None,
                super::wire::hooks::DeliveryDecision::Hold { reason } => Some(reason),
            },
            Err(e) => Some(format!("review unavailable: {}", e.code())),
        };
        match self.lane.record(&effect_id, text, held.as_deref()) {
            Ok(receipt) => Reply::Ok {
                value: serde_json::to_value(receipt).unwrap_or_default(),
            },
            Err(e) => lane_error(e),
        }
    }
}
