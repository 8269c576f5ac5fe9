//! The harness side of a target's control channel: the core_runtime family's controlled
//! Harness adapter (`docs/control-channel.md`) and the worker family's controlled host
//! (`docs/worker-host-control.md`) speak the same line protocol.
//!
//! [`ControlListener::bind`] listens on the socket the target is told about;
//! [`ControlListener::accept`] takes the target's one connection and checks its hello
//! line (`{"hello": {"adapter": <the flavor's name>, "protocol": 1}}`), which is the
//! target's readiness signal. [`ControlChannel::request`] sends `{"seq", "op", ...args}` and
//! awaits the response with that `seq`; a reader task routes responses (they may come in
//! any order), so a request that timed out never confuses a later one.
//!
//! Framing: one strict JSON object per `\n`-terminated line, at most
//! [`CONTROL_LINE_MAX_BYTES`]; duplicate keys are protocol errors, and so is `null`
//! unless the [`Flavor`] allows it.
//!
//! This module never interprets results (matching `expect:` is the driver's job) and
//! never panics on what the adapter sends: every violation becomes a
//! [`ControlError::Protocol`] that also fails every later request.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::target::check_socket_path;
use contract_impl::wire::{parse_strict, parse_strict_with_nulls};

/// Which control channel: the adapter name of its hello and whether `null` is a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flavor {
    /// The `adapter` of the hello line.
    pub adapter: &'static str,
    /// Whether results may hold `null` (the worker wire has `revision: null`).
    pub nulls: bool,
}

/// The core_runtime family's controlled Harness adapter (`docs/control-channel.md`).
pub const CONTROLLED_ADAPTER: Flavor = Flavor {
    adapter: "controlled",
    nulls: false,
};

/// The worker family's controlled host (`docs/worker-host-control.md`).
pub const WORKER_HOST: Flavor = Flavor {
    adapter: "worker-host",
    nulls: true,
};

fn parse(line: &[u8], nulls: bool) -> Result<Value, contract_impl::wire::WireError> {
    if nulls {
        parse_strict_with_nulls(line)
    } else {
        parse_strict(line)
    }
}

/// Longest control line in either direction (bytes, without the `\n`).
pub const CONTROL_LINE_MAX_BYTES: usize = 4 * 1024 * 1024;

/// The control-channel protocol version the harness speaks.
pub const CONTROL_PROTOCOL: u64 = 1;

/// Failure on the control channel. Every variant has a stable [`code`](Self::code).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControlError {
    /// The socket path does not fit a Unix socket address.
    #[error("{0}")]
    SocketPath(String),
    /// Binding the control socket failed.
    #[error("cannot listen on control socket {path}: {reason}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
    /// Accepting the adapter's connection failed.
    #[error("accepting the control connection failed: {0}")]
    Accept(String),
    /// The first line was not the expected hello.
    #[error("bad hello line from the controlled adapter: {0}")]
    BadHello(String),
    /// The adapter violated the control-channel framing or response shape.
    #[error("control channel protocol violation: {0}")]
    Protocol(String),
    /// The adapter closed the connection.
    #[error("the controlled adapter closed the control connection")]
    Closed,
    /// No response within the harness's deadline.
    #[error("no response to control op `{op}` within {}ms", .after.as_millis())]
    Timeout {
        /// The op.
        op: String,
        /// The deadline.
        after: Duration,
    },
    /// The adapter answered `ok: false`.
    #[error("control op `{op}` failed: {code}: {message}")]
    Adapter {
        /// The op.
        op: String,
        /// The adapter's error code (`bad_request`, `unknown_run`, `timeout`, …).
        code: String,
        /// The adapter's message.
        message: String,
    },
    /// The scenario's arguments cannot form a request (not an object, or `seq`/`op` set).
    #[error("bad arguments for control op `{op}`: {reason}")]
    BadArguments {
        /// The op.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// Writing the request failed.
    #[error("writing to the control socket failed: {0}")]
    Io(String),
}

impl ControlError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ControlError::SocketPath(_) => "socket_path_too_long",
            ControlError::Bind { .. } => "control_bind_failed",
            ControlError::Accept(_) => "control_accept_failed",
            ControlError::BadHello(_) => "bad_hello",
            ControlError::Protocol(_) => "control_protocol_error",
            ControlError::Closed => "control_closed",
            ControlError::Timeout { .. } => "control_timeout",
            ControlError::Adapter { .. } => "adapter_error",
            ControlError::BadArguments { .. } => "bad_arguments",
            ControlError::Io(_) => "control_io_error",
        }
    }
}

/// The listening control socket (before the adapter connected). The socket file is
/// removed when this is dropped.
#[derive(Debug)]
pub struct ControlListener {
    listener: UnixListener,
    path: PathBuf,
}

impl ControlListener {
    /// Binds `path` (after checking its length).
    ///
    /// # Errors
    /// [`ControlError::SocketPath`], [`ControlError::Bind`].
    pub fn bind(path: &Path) -> Result<Self, ControlError> {
        check_socket_path(path).map_err(|e| ControlError::SocketPath(e.to_string()))?;
        let listener = UnixListener::bind(path).map_err(|e| ControlError::Bind {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            listener,
            path: path.to_path_buf(),
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts the adapter's connection and reads its hello line (waits as long as it
    /// takes: the caller races it against the target's exit and the start-up deadline).
    ///
    /// # Errors
    /// [`ControlError::Accept`], [`ControlError::BadHello`], [`ControlError::Closed`].
    pub async fn accept(self, flavor: Flavor) -> Result<ControlChannel, ControlError> {
        let (stream, _) = self
            .listener
            .accept()
            .await
            .map_err(|e| ControlError::Accept(e.to_string()))?;
        let (read, write) = stream.into_split();
        let mut reader = BufReader::new(read);
        let line = match read_line(&mut reader).await {
            Ok(Some(line)) => line,
            Ok(None) => return Err(ControlError::Closed),
            Err(e) => return Err(ControlError::BadHello(e)),
        };
        let hello = parse_strict(&line).map_err(|e| ControlError::BadHello(e.to_string()))?;
        let expected = json!({"hello": {"adapter": flavor.adapter, "protocol": CONTROL_PROTOCOL}});
        if hello != expected {
            return Err(ControlError::BadHello(format!(
                "expected {expected}, got {}",
                crate::transport::ws::truncate(&hello.to_string(), 200)
            )));
        }
        Ok(ControlChannel::start(reader, write, flavor.nulls))
    }
}

impl Drop for ControlListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

type Pending = HashMap<u64, oneshot::Sender<Result<Value, ControlError>>>;

#[derive(Debug, Default)]
struct Shared {
    pending: Pending,
    /// Set once the channel is unusable; every later request fails with it.
    broken: Option<ControlError>,
}

/// An established control channel (after the hello).
#[derive(Debug)]
pub struct ControlChannel {
    writer: OwnedWriteHalf,
    shared: Arc<Mutex<Shared>>,
    next_seq: u64,
    reader: JoinHandle<()>,
}

impl ControlChannel {
    fn start(reader: BufReader<OwnedReadHalf>, writer: OwnedWriteHalf, nulls: bool) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let reader = tokio::spawn(route_responses(reader, shared.clone(), nulls));
        Self {
            writer,
            shared,
            next_seq: 1,
            reader,
        }
    }

    /// Sends `{"seq": n, "op": op, ...args}` and waits at most `timeout` for its
    /// response; returns `result` of an `ok: true` response.
    ///
    /// # Errors
    /// [`ControlError::BadArguments`] when `args` is not an object or sets `seq`/`op`;
    /// [`ControlError::Adapter`] for `ok: false`; [`ControlError::Timeout`];
    /// [`ControlError::Closed`], [`ControlError::Protocol`], [`ControlError::Io`] when the
    /// channel is broken (then every later request fails the same way).
    pub async fn request(
        &mut self,
        op: &str,
        args: &Value,
        timeout: Duration,
    ) -> Result<Value, ControlError> {
        let bad = |reason: &str| ControlError::BadArguments {
            op: op.to_string(),
            reason: reason.to_string(),
        };
        let args = match args {
            Value::Object(map) => map.clone(),
            Value::Null => Map::new(),
            _ => return Err(bad("arguments must be an object")),
        };
        if args.contains_key("seq") || args.contains_key("op") {
            return Err(bad("arguments may not set `seq` or `op`"));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut request = Map::new();
        request.insert("seq".into(), Value::from(seq));
        request.insert("op".into(), Value::from(op));
        request.extend(args);
        let mut line = contract_impl::wire::encode_strict(&Value::Object(request))
            .map_err(|e| bad(&e.to_string()))?;
        if line.len() > CONTROL_LINE_MAX_BYTES {
            return Err(bad(&format!(
                "request of {} bytes exceeds the {CONTROL_LINE_MAX_BYTES}-byte line bound",
                line.len()
            )));
        }
        line.push('\n');

        let (tx, rx) = oneshot::channel();
        {
            let mut shared = self.shared.lock().map_err(|_| ControlError::Closed)?;
            if let Some(err) = &shared.broken {
                return Err(err.clone());
            }
            shared.pending.insert(seq, tx);
        }
        let outcome = tokio::time::timeout(timeout, async {
            self.writer
                .write_all(line.as_bytes())
                .await
                .map_err(|e| ControlError::Io(e.to_string()))?;
            rx.await.unwrap_or(Err(ControlError::Closed))
        })
        .await;
        let result = match outcome {
            Ok(result) => result,
            Err(_) => Err(ControlError::Timeout {
                op: op.to_string(),
                after: timeout,
            }),
        };
        if let Ok(mut shared) = self.shared.lock() {
            shared.pending.remove(&seq);
        }
        result.map_err(|e| match e {
            ControlError::Adapter { code, message, .. } => ControlError::Adapter {
                op: op.to_string(),
                code,
                message,
            },
            other => other,
        })
    }
}

impl Drop for ControlChannel {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Reads one line of at most [`CONTROL_LINE_MAX_BYTES`] (without its `\n`). `Ok(None)` at
/// end of input; an unterminated last line is an error.
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
) -> Result<Option<Vec<u8>>, String> {
    let mut buf = Vec::new();
    let limit = (CONTROL_LINE_MAX_BYTES + 1) as u64;
    let n = (&mut *reader)
        .take(limit)
        .read_until(b'\n', &mut buf)
        .await
        .map_err(|e| e.to_string())?;
    if n == 0 {
        return Ok(None);
    }
    match buf.last() {
        Some(b'\n') => {
            buf.pop();
            Ok(Some(buf))
        }
        _ if buf.len() > CONTROL_LINE_MAX_BYTES => Err(format!(
            "line exceeds the {CONTROL_LINE_MAX_BYTES}-byte bound"
        )),
        _ => Err("connection closed in the middle of a line".into()),
    }
}

/// Reader task: routes each response to the waiting request; any violation breaks the
/// channel for good.
async fn route_responses(
    mut reader: BufReader<OwnedReadHalf>,
    shared: Arc<Mutex<Shared>>,
    nulls: bool,
) {
    let failure = loop {
        let line = match read_line(&mut reader).await {
            Ok(Some(line)) => line,
            Ok(None) => break ControlError::Closed,
            Err(e) => break ControlError::Protocol(e),
        };
        let (seq, result) = match parse_response(&line, nulls) {
            Ok(parsed) => parsed,
            Err(e) => break ControlError::Protocol(e),
        };
        let Ok(mut guard) = shared.lock() else { return };
        // A response for a request that already timed out is dropped; only a seq the
        // harness never sent is a violation.
        if let Some(tx) = guard.pending.remove(&seq) {
            let _ = tx.send(result);
        }
    };
    if let Ok(mut guard) = shared.lock() {
        for (_, tx) in guard.pending.drain() {
            let _ = tx.send(Err(failure.clone()));
        }
        guard.broken = Some(failure);
    }
}

/// Parses one response line into its `seq` and outcome.
fn parse_response(line: &[u8], nulls: bool) -> Result<(u64, Result<Value, ControlError>), String> {
    let value = parse(line, nulls).map_err(|e| format!("invalid response line: {e}"))?;
    let Value::Object(mut map) = value else {
        return Err("a response must be a JSON object".into());
    };
    let seq = map
        .remove("seq")
        .and_then(|s| s.as_u64())
        .ok_or("response lacks an unsigned integer `seq`")?;
    let ok = map
        .remove("ok")
        .and_then(|v| v.as_bool())
        .ok_or_else(|| format!("response {seq} lacks a boolean `ok`"))?;
    let outcome = if ok {
        let result = map
            .remove("result")
            .ok_or_else(|| format!("response {seq} has `ok: true` but no `result`"))?;
        Ok(result)
    } else {
        let error = map
            .remove("error")
            .ok_or_else(|| format!("response {seq} has `ok: false` but no `error`"))?;
        let code = error.get("code").and_then(Value::as_str);
        let message = error.get("message").and_then(Value::as_str).unwrap_or("");
        let Some(code) = code else {
            return Err(format!("response {seq}: `error` lacks a string `code`"));
        };
        Err(ControlError::Adapter {
            op: String::new(),
            code: code.to_string(),
            message: message.to_string(),
        })
    };
    if let Some(key) = map.keys().next() {
        return Err(format!("response {seq} has unknown field `{key}`"));
    }
    Ok((seq, outcome))
}

/// Starts `spec` with a fresh control listener at `control_socket` (a restart's last
/// listener is gone with its socket file) and waits, within `timeout`, for the target to
/// connect and send `flavor`'s hello line. A target that does not is stopped.
///
/// # Errors
/// The listener, spawn or readiness failure, as text.
pub async fn launch_controlled(
    spec: &crate::target::LaunchSpec,
    control_socket: &Path,
    flavor: Flavor,
    timeout: Duration,
) -> Result<(crate::target::Target, ControlChannel), String> {
    let _ = std::fs::remove_file(control_socket);
    let control = ControlListener::bind(control_socket).map_err(|e| e.to_string())?;
    let mut target = crate::target::Target::spawn(spec).map_err(|e| e.to_string())?;
    match target.await_ready(control.accept(flavor), timeout).await {
        Ok(channel) => Ok((target, channel)),
        Err(e) => {
            target.shutdown().await;
            Err(e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::RunDir;
    use tokio::net::UnixStream;

    async fn pair() -> (RunDir, ControlListener, UnixStream) {
        let run = RunDir::new().unwrap();
        let listener = ControlListener::bind(&run.control_socket()).unwrap();
        let client = UnixStream::connect(run.control_socket()).await.unwrap();
        (run, listener, client)
    }

    #[tokio::test]
    async fn hello_then_requests() {
        let (_run, listener, client) = pair().await;
        let (read, mut write) = client.into_split();
        write
            .write_all(b"{\"hello\": {\"adapter\": \"controlled\", \"protocol\": 1}}\n")
            .await
            .unwrap();
        let mut channel = listener.accept(CONTROLLED_ADAPTER).await.unwrap();
        let adapter = tokio::spawn(async move {
            let mut reader = BufReader::new(read);
            let first: Value =
                serde_json::from_slice(&read_line(&mut reader).await.unwrap().unwrap()).unwrap();
            assert_eq!(first, json!({"seq": 1, "op": "report"}));
            write
                .write_all(b"{\"seq\": 1, \"ok\": true, \"result\": {\"calls\": []}}\n")
                .await
                .unwrap();
            let second: Value =
                serde_json::from_slice(&read_line(&mut reader).await.unwrap().unwrap()).unwrap();
            assert_eq!(second, json!({"seq": 2, "op": "settle", "run_id": "r"}));
            write
                .write_all(b"{\"seq\": 2, \"ok\": false, \"error\": {\"code\": \"unknown_run\", \"message\": \"no run\"}}\n")
                .await
                .unwrap();
            // Keep the connection open until the harness is done.
            let _ = read_line(&mut reader).await;
        });
        let a = channel
            .request("report", &Value::Null, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(a, json!({"calls": []}));
        let b = channel
            .request("settle", &json!({"run_id": "r"}), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(b.code(), "adapter_error");
        assert!(b.to_string().contains("settle"));
        assert!(b.to_string().contains("unknown_run"));
        drop(channel);
        adapter.await.unwrap();
    }

    #[tokio::test]
    async fn bad_hello_is_rejected() {
        let (_run, listener, mut client) = pair().await;
        client
            .write_all(b"{\"hello\": {\"adapter\": \"other\", \"protocol\": 1}}\n")
            .await
            .unwrap();
        let err = listener.accept(CONTROLLED_ADAPTER).await.unwrap_err();
        assert_eq!(err.code(), "bad_hello");
        let (_run, listener, mut client) = pair().await;
        client
            .write_all(b"{\"hello\": 1, \"hello\": 2}\n")
            .await
            .unwrap();
        assert_eq!(
            listener
                .accept(CONTROLLED_ADAPTER)
                .await
                .unwrap_err()
                .code(),
            "bad_hello"
        );
    }

    #[tokio::test]
    async fn protocol_violation_breaks_the_channel() {
        let (_run, listener, client) = pair().await;
        let (read, mut write) = client.into_split();
        write
            .write_all(b"{\"hello\": {\"adapter\": \"controlled\", \"protocol\": 1}}\n")
            .await
            .unwrap();
        let mut channel = listener.accept(CONTROLLED_ADAPTER).await.unwrap();
        let adapter = tokio::spawn(async move {
            let mut reader = BufReader::new(read);
            let _ = read_line(&mut reader).await;
            write
                .write_all(b"{\"seq\": 1, \"ok\": null}\n")
                .await
                .unwrap();
            let _ = read_line(&mut reader).await;
        });
        let err = channel
            .request("report", &json!({}), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(err.code(), "control_protocol_error");
        let again = channel
            .request("report", &json!({}), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(again.code(), "control_protocol_error");
        drop(channel);
        adapter.await.unwrap();
    }

    #[tokio::test]
    async fn timeout_then_late_response_is_ignored() {
        let (_run, listener, client) = pair().await;
        let (read, mut write) = client.into_split();
        write
            .write_all(b"{\"hello\": {\"adapter\": \"controlled\", \"protocol\": 1}}\n")
            .await
            .unwrap();
        let mut channel = listener.accept(CONTROLLED_ADAPTER).await.unwrap();
        let (go_tx, go_rx) = oneshot::channel::<()>();
        let adapter = tokio::spawn(async move {
            let mut reader = BufReader::new(read);
            let _ = read_line(&mut reader).await; // seq 1: answered late
            go_rx.await.unwrap();
            write
                .write_all(b"{\"seq\": 1, \"ok\": true, \"result\": {}}\n")
                .await
                .unwrap();
            let _ = read_line(&mut reader).await; // seq 2
            write
                .write_all(b"{\"seq\": 2, \"ok\": true, \"result\": {\"n\": 2}}\n")
                .await
                .unwrap();
            let _ = read_line(&mut reader).await;
        });
        let err = channel
            .request(
                "await",
                &json!({"call": "start"}),
                Duration::from_millis(50),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), "control_timeout");
        go_tx.send(()).unwrap();
        let ok = channel
            .request("report", &json!({}), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(ok, json!({"n": 2}));
        let bad = channel
            .request("x", &json!({"seq": 3}), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(bad.code(), "bad_arguments");
        drop(channel);
        adapter.await.unwrap();
    }
}
