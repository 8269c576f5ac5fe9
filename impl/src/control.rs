//! The control channel through which a conformance harness drives one of our targets
//! (`docs/worker-host-control.md`, `docs/engine-client-control.md`): the worker host
//! ([`crate::worker::controlled`]) and the engine client ([`crate::engine::controlled`]).
//!
//! * The target connects to the harness's Unix socket, sends its hello line, then answers
//!   one request per line (`{"seq", "op", ...arguments}` → `{"seq", "ok": true, "result"}`
//!   or `{"seq", "ok": false, "error": {"code", "message"}}`); a request whose `seq`
//!   cannot be read is answered with `"seq": null`. Lines are strict JSON objects
//!   (duplicate keys refused, `null` a value) of at most [`CONTROL_LINE_MAX_BYTES`], in
//!   both directions.
//! * Requests take effect in the order they were sent: every op but `await` is applied
//!   before the next line is read. A long operation registers its outcome under its `as`
//!   argument (1..[`NAME_MAX_BYTES`] bytes; default: the op's name) in [`Outcomes`],
//!   answers `{}` and runs on; `await` returns that outcome once, bounded by its
//!   `timeout_ms`. At most [`AWAITS_MAX`] `await`s wait at once (past it the target reads
//!   no further request until one ends: backpressure, never unbounded memory) and at
//!   most [`OUTCOMES_MAX`] outcomes wait to be awaited (past it a long operation is
//!   refused `too_many_operations`).
//! * An argument an op does not take is refused `bad_request`; every `*_ms` argument is
//!   an integer of at most [`AWAIT_MAX`].
//! * SIGTERM or the end of the control channel ends [`serve`] (after [`Ops::stop`]).
//!
//! This module owns the framing, the request checks every op shares, the outcome
//! registry and `await`. It never knows what an op does (that is the [`Ops`] of each
//! target) and never prints.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{Semaphore, mpsc, watch};

/// Longest control line in either direction (bytes, without the `\n`). A longer request
/// ends the control session (the framing is lost); a longer response is replaced by a
/// `response_too_large` error.
pub const CONTROL_LINE_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Longest `await`, and the bound of every `*_ms` argument.
pub const AWAIT_MAX: Duration = Duration::from_secs(600);

/// `await`s waiting at once; past it the target reads no further request until one ends.
pub const AWAITS_MAX: usize = 256;

/// Outcomes kept and not yet awaited; past it a long operation is refused
/// `too_many_operations` (an outcome is dropped once it was awaited).
pub const OUTCOMES_MAX: usize = 1024;

/// Longest `as` name, bytes.
pub const NAME_MAX_BYTES: usize = 128;

/// Responses queued for the control client; past it the target waits for the client to
/// read.
const RESPONSES_MAX: usize = 256;

/// A request refused (a stable `code` and a message for people).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpError {
    /// The stable code (`bad_request`, `unknown_op`, …).
    pub code: &'static str,
    /// What was wrong.
    pub message: String,
}

impl OpError {
    /// An error with `code`.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// A `bad_request` error.
pub fn bad(message: impl Into<String>) -> OpError {
    OpError::new("bad_request", message)
}

/// What a target does with the ops of its control channel.
pub trait Ops: Send + Sync + 'static {
    /// The arguments `op` takes (`as` included for a long one), or `None` for an op the
    /// target does not know. `await` is the channel's own and never asked.
    fn allowed(&self, op: &str) -> Option<&'static [&'static str]>;

    /// The registry of its long operations' outcomes.
    fn outcomes(&self) -> &Outcomes;

    /// Applies `op` (never `await`) with `args` (only keys [`Ops::allowed`] lists;
    /// `name` is its `as`, or the op's name). A long op registers its outcome under
    /// `name` before it returns (so an `await` read next finds it) and answers `{}`.
    fn apply(
        self: &Arc<Self>,
        op: &str,
        name: String,
        args: &Map<String, Value>,
    ) -> impl Future<Output = Result<Value, OpError>> + Send;

    /// Stops what the target runs, before the process ends.
    fn stop(&self) -> impl Future<Output = ()> + Send;
}

/// How a request is answered.
pub enum Dispatch {
    /// Applied; this is the response line.
    Now(String),
    /// An `await`: the response line once the outcome is known.
    Later(Pin<Box<dyn Future<Output = String> + Send>>),
}

/// The response line to the request `seq` (`None`: a request whose `seq` could not be
/// read). A line over [`CONTROL_LINE_MAX_BYTES`] is replaced by a `response_too_large`
/// error.
pub fn response_line(seq: Option<u64>, result: Result<Value, OpError>) -> String {
    let line = match &result {
        Ok(result) => json!({"seq": seq, "ok": true, "result": result}).to_string(),
        Err(e) => error_line(seq, e),
    };
    if line.len() > CONTROL_LINE_MAX_BYTES {
        return error_line(
            seq,
            &OpError::new(
                "response_too_large",
                format!(
                    "the response has {} bytes, over the line bound of {CONTROL_LINE_MAX_BYTES}",
                    line.len()
                ),
            ),
        );
    }
    line
}

fn error_line(seq: Option<u64>, e: &OpError) -> String {
    json!({"seq": seq, "ok": false, "error": {"code": e.code, "message": e.message}}).to_string()
}

/// Decodes one request line (without its `\n`) and applies it with `ops`, or, for
/// `await`, returns the wait.
pub async fn dispatch<O: Ops>(ops: &Arc<O>, line: &[u8]) -> Dispatch {
    let parsed = crate::wire::parse_strict_with_nulls(line);
    let Ok(Value::Object(mut args)) = parsed else {
        return Dispatch::Now(response_line(
            None,
            Err(bad("a request must be one strict JSON object")),
        ));
    };
    let Some(seq) = args.remove("seq").and_then(|s| s.as_u64()) else {
        return Dispatch::Now(response_line(
            None,
            Err(bad("a request needs an unsigned integer `seq`")),
        ));
    };
    let respond = move |result: Result<Value, OpError>| response_line(Some(seq), result);
    let Some(op) = args
        .remove("op")
        .and_then(|o| o.as_str().map(str::to_string))
    else {
        return Dispatch::Now(respond(Err(bad("a request needs a string `op`"))));
    };
    let keys: &[&str] = if op == "await" {
        &["as", "timeout_ms"]
    } else {
        match ops.allowed(&op) {
            Some(keys) => keys,
            None => {
                return Dispatch::Now(respond(Err(OpError::new(
                    "unknown_op",
                    format!("unknown op `{op}`"),
                ))));
            }
        }
    };
    if let Some(key) = args.keys().find(|k| !keys.contains(&k.as_str())) {
        return Dispatch::Now(respond(Err(bad(format!(
            "`{op}` takes no argument `{key}` (it takes: {})",
            keys.join(", ")
        )))));
    }
    let name = match args.get("as") {
        None => op.clone(),
        Some(Value::String(name)) if !name.is_empty() && name.len() <= NAME_MAX_BYTES => {
            name.clone()
        }
        Some(_) => {
            return Dispatch::Now(respond(Err(bad(format!(
                "`as` must be a name of 1..{NAME_MAX_BYTES} bytes"
            )))));
        }
    };
    if op == "await" {
        let wait = ms_arg(&args, "timeout_ms")
            .map(|bound| ops.outcomes().wait(name, bound.unwrap_or(AWAIT_MAX)));
        return Dispatch::Later(Box::pin(async move {
            match wait {
                Ok(wait) => respond(wait.await),
                Err(e) => respond(Err(e)),
            }
        }));
    }
    Dispatch::Now(respond(ops.apply(&op, name, &args).await))
}

/// The outcome of a long operation, once known.
type Outcome = watch::Receiver<Option<Value>>;

/// The outcomes of long operations, kept by name until awaited once.
#[derive(Clone, Default)]
pub struct Outcomes {
    kept: Arc<std::sync::Mutex<HashMap<String, Outcome>>>,
}

/// A registered outcome, not yet produced; dropping it unproduced makes its `await`
/// answer `bad_request` ("the operation was dropped").
pub struct Pending {
    tx: watch::Sender<Option<Value>>,
}

impl Pending {
    /// Runs `work` in the background; its value is the outcome.
    pub fn spawn<F>(self, work: F)
    where
        F: Future<Output = Value> + Send + 'static,
    {
        tokio::spawn(async move {
            let value = work.await;
            let _ = self.tx.send(Some(value));
        });
    }
}

impl Outcomes {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the outcome `name` (replacing one of that name not yet awaited).
    ///
    /// # Errors
    /// `too_many_operations` when [`OUTCOMES_MAX`] outcomes wait to be awaited.
    pub fn register(&self, name: String) -> Result<Pending, OpError> {
        let (tx, rx) = watch::channel(None);
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() >= OUTCOMES_MAX && !kept.contains_key(&name) {
            return Err(OpError::new(
                "too_many_operations",
                format!("{OUTCOMES_MAX} outcomes are waiting to be awaited; await some first"),
            ));
        }
        kept.insert(name, rx);
        Ok(Pending { tx })
    }

    /// Registers the outcome `name` and runs `work` in the background; answers `{}`.
    ///
    /// # Errors
    /// As [`Outcomes::register`].
    pub fn spawn<F>(&self, name: String, work: F) -> Result<Value, OpError>
    where
        F: Future<Output = Value> + Send + 'static,
    {
        self.register(name)?.spawn(work);
        Ok(json!({}))
    }

    /// The outcome `name` once known, within `bound` (then forgotten).
    ///
    /// The registered outcome is looked up now (so an op applied before this call is
    /// found); the returned future only waits.
    pub fn wait(
        &self,
        name: String,
        bound: Duration,
    ) -> impl Future<Output = Result<Value, OpError>> + Send + 'static {
        let kept = self.kept.clone();
        let found = kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&name)
            .cloned();
        async move {
            let mut rx = found.ok_or_else(|| {
                OpError::new(
                    "unknown_operation",
                    format!("no operation `{name}` was started (or it was awaited already)"),
                )
            })?;
            let value = tokio::time::timeout(bound, rx.wait_for(Option::is_some))
                .await
                .map_err(|_| {
                    OpError::new("timeout", format!("`{name}` did not end within {bound:?}"))
                })?
                .map_err(|_| bad("the operation was dropped"))?
                .clone();
            let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
            if kept.get(&name).is_some_and(|r| r.same_channel(&rx)) {
                kept.remove(&name);
            }
            Ok(value.unwrap_or(Value::Null))
        }
    }
}

/// A required argument.
///
/// # Errors
/// `bad_request` naming `key` when it is absent.
pub fn required<T>(key: &str, value: Option<T>) -> Result<T, OpError> {
    value.ok_or_else(|| bad(format!("`{key}` is required")))
}

/// A string argument `key` (required).
///
/// # Errors
/// `bad_request` when it is absent or not a string.
pub fn str_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Result<&'a str, OpError> {
    args.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("`{key}` must be a string")))
}

/// An optional unsigned integer argument `key` of at most `max`.
///
/// # Errors
/// `bad_request` when it is present and not such an integer.
pub fn uint_arg(args: &Map<String, Value>, key: &str, max: u64) -> Result<Option<u64>, OpError> {
    match args.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= max => Ok(Some(n)),
            _ => Err(bad(format!("`{key}` must be an integer of 0..={max}"))),
        },
    }
}

/// An optional boolean argument `key`.
///
/// # Errors
/// `bad_request` when it is present and not a boolean.
pub fn bool_arg(args: &Map<String, Value>, key: &str) -> Result<Option<bool>, OpError> {
    match args.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(format!("`{key}` must be a boolean"))),
    }
}

/// An optional argument `key` that is an array of strings.
///
/// # Errors
/// `bad_request` when it is present and not an array of strings.
pub fn strings_arg(args: &Map<String, Value>, key: &str) -> Result<Option<Vec<String>>, OpError> {
    let Some(v) = args.get(key) else {
        return Ok(None);
    };
    v.as_array()
        .and_then(|items| {
            items
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
        })
        .map(Some)
        .ok_or_else(|| bad(format!("`{key}` must be an array of strings")))
}

/// A `*_ms` argument: an integer of at most [`AWAIT_MAX`].
///
/// # Errors
/// `bad_request` when it is present and not such an integer.
pub fn ms_arg(args: &Map<String, Value>, key: &str) -> Result<Option<Duration>, OpError> {
    match args.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(ms) if u128::from(ms) <= AWAIT_MAX.as_millis() => {
                Ok(Some(Duration::from_millis(ms)))
            }
            _ => Err(bad(format!(
                "`{key}` must be an integer of milliseconds, at most {}",
                AWAIT_MAX.as_millis()
            ))),
        },
    }
}

/// Connects to the control socket, sends `hello`, and serves requests with `ops` until
/// the channel ends or SIGTERM; then [`Ops::stop`].
///
/// # Errors
/// The SIGTERM handler cannot be installed, or the socket cannot be connected.
pub async fn serve<O: Ops>(socket: &Path, hello: &str, ops: Arc<O>) -> Result<(), String> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    let stream = tokio::select! {
        stream = UnixStream::connect(socket) => {
            stream.map_err(|e| format!("{}: {e}", socket.display()))?
        }
        _ = term.recv() => {
            ops.stop().await;
            return Ok(());
        }
    };
    let (read, mut write) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<String>(RESPONSES_MAX);
    let mut hello = hello.to_string();
    let writer = tokio::spawn(async move {
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
    let awaits = Arc::new(Semaphore::new(AWAITS_MAX));
    let mut reader = BufReader::new(read);
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
                let e = bad("an unterminated or over-long line ends the control session");
                let _ = tx.send(response_line(None, Err(e))).await;
                break;
            }
            Ok(_) => {}
        }
        line.pop();
        match dispatch(&ops, &line).await {
            Dispatch::Now(response) => {
                let sent = tokio::select! {
                    sent = tx.send(response) => sent.is_ok(),
                    _ = term.recv() => false,
                };
                if !sent {
                    break;
                }
            }
            Dispatch::Later(wait) => {
                let permit = tokio::select! {
                    permit = awaits.clone().acquire_owned() => permit,
                    _ = term.recv() => break,
                };
                let Ok(permit) = permit else { break };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let response = wait.await;
                    let _ = tx.send(response).await;
                    drop(permit);
                });
            }
        }
    }
    drop(tx);
    ops.stop().await;
    writer.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target with one long op (`sleep`, which ends after `ms`) and one short op
    /// (`echo`).
    struct Toy {
        outcomes: Outcomes,
    }

    impl Ops for Toy {
        fn allowed(&self, op: &str) -> Option<&'static [&'static str]> {
            match op {
                "sleep" => Some(&["ms", "as"]),
                "echo" => Some(&["text", "n", "flag", "list"]),
                _ => None,
            }
        }

        fn outcomes(&self) -> &Outcomes {
            &self.outcomes
        }

        async fn apply(
            self: &Arc<Self>,
            op: &str,
            name: String,
            args: &Map<String, Value>,
        ) -> Result<Value, OpError> {
            match op {
                "sleep" => {
                    let ms = ms_arg(args, "ms")?.unwrap_or_default();
                    self.outcomes.spawn(name, async move {
                        tokio::time::sleep(ms).await;
                        json!({"slept_ms": ms.as_millis()})
                    })
                }
                _ => Ok(json!({
                    "text": str_arg(args, "text")?,
                    "n": uint_arg(args, "n", 10)?,
                    "flag": bool_arg(args, "flag")?,
                    "list": strings_arg(args, "list")?,
                })),
            }
        }

        async fn stop(&self) {}
    }

    fn toy() -> Arc<Toy> {
        Arc::new(Toy {
            outcomes: Outcomes::new(),
        })
    }

    async fn now(ops: &Arc<Toy>, line: &str) -> Value {
        match dispatch(ops, line.as_bytes()).await {
            Dispatch::Now(line) => serde_json::from_str(&line).unwrap(),
            Dispatch::Later(_) => panic!("{line} waited"),
        }
    }

    async fn later(ops: &Arc<Toy>, line: &str) -> Value {
        match dispatch(ops, line.as_bytes()).await {
            Dispatch::Later(wait) => serde_json::from_str(&wait.await).unwrap(),
            Dispatch::Now(line) => panic!("{line} did not wait"),
        }
    }

    #[tokio::test]
    async fn unreadable_requests_are_refused_with_a_null_seq() {
        let ops = toy();
        for line in [
            "not json",
            "[1]",
            r#"{"op":"echo"}"#,
            r#"{"seq":-1,"op":"echo"}"#,
            r#"{"seq":null,"op":"echo"}"#,
            r#"{"seq":1,"seq":2,"op":"echo"}"#,
        ] {
            let r = now(&ops, line).await;
            assert_eq!(
                (&r["seq"], &r["ok"], &r["error"]["code"]),
                (&Value::Null, &json!(false), &json!("bad_request")),
                "{line}"
            );
        }
    }

    #[tokio::test]
    async fn requests_are_checked_before_an_op_sees_them() {
        let ops = toy();
        let cases = [
            (r#"{"seq":1}"#, "bad_request"),
            (r#"{"seq":2,"op":7}"#, "bad_request"),
            (r#"{"seq":3,"op":"nope"}"#, "unknown_op"),
            (
                r#"{"seq":4,"op":"echo","text":"a","bogus":1}"#,
                "bad_request",
            ),
            (r#"{"seq":5,"op":"sleep","as":""}"#, "bad_request"),
            (r#"{"seq":6,"op":"echo","as":"x"}"#, "bad_request"),
            (r#"{"seq":7,"op":"echo","text":"a","n":11}"#, "bad_request"),
            (r#"{"seq":8,"op":"echo","text":"a","n":"1"}"#, "bad_request"),
            (
                r#"{"seq":9,"op":"echo","text":"a","flag":1}"#,
                "bad_request",
            ),
            (
                r#"{"seq":10,"op":"echo","text":"a","list":["a",1]}"#,
                "bad_request",
            ),
            (r#"{"seq":11,"op":"echo","text":null}"#, "bad_request"),
            (r#"{"seq":12,"op":"sleep","ms":600001}"#, "bad_request"),
        ];
        for (line, code) in cases {
            let r = now(&ops, line).await;
            let seq = serde_json::from_str::<Value>(line).unwrap()["seq"].clone();
            assert_eq!(
                (&r["seq"], &r["error"]["code"]),
                (&seq, &json!(code)),
                "{line}"
            );
        }
        // Each bound at its edge is accepted, one past it refused.
        let long = format!(
            r#"{{"seq":13,"op":"sleep","as":"{}"}}"#,
            "a".repeat(NAME_MAX_BYTES + 1)
        );
        assert_eq!(now(&ops, &long).await["error"]["code"], "bad_request");
        let at = format!(
            r#"{{"seq":13,"op":"sleep","as":"{}","ms":0}}"#,
            "a".repeat(NAME_MAX_BYTES)
        );
        assert_eq!(now(&ops, &at).await["ok"], json!(true), "{at}");
        let at = format!(
            r#"{{"seq":13,"op":"sleep","as":"b","ms":{}}}"#,
            AWAIT_MAX.as_millis()
        );
        assert_eq!(now(&ops, &at).await["ok"], json!(true), "{at}");
        let r = now(
            &ops,
            r#"{"seq":14,"op":"echo","text":"a","n":10,"flag":true,"list":["x"]}"#,
        )
        .await;
        assert_eq!(
            r,
            json!({"seq":14,"ok":true,"result":{"text":"a","n":10,"flag":true,"list":["x"]}})
        );
    }

    #[tokio::test]
    async fn a_long_operation_is_awaited_once_under_its_name() {
        let ops = toy();
        assert_eq!(
            now(&ops, r#"{"seq":1,"op":"sleep","ms":5,"as":"s1"}"#).await,
            json!({"seq":1,"ok":true,"result":{}})
        );
        assert_eq!(
            later(&ops, r#"{"seq":2,"op":"await","as":"s1"}"#).await,
            json!({"seq":2,"ok":true,"result":{"slept_ms":5}})
        );
        let again = later(&ops, r#"{"seq":3,"op":"await","as":"s1"}"#).await;
        assert_eq!(again["error"]["code"], "unknown_operation");
        // Default name: the op's.
        now(&ops, r#"{"seq":4,"op":"sleep","ms":600000}"#).await;
        let r = later(
            &ops,
            r#"{"seq":5,"op":"await","as":"sleep","timeout_ms":10}"#,
        )
        .await;
        assert_eq!(r["error"]["code"], "timeout", "{r}");
        let r = later(
            &ops,
            r#"{"seq":6,"op":"await","as":"sleep","timeout_ms":"10"}"#,
        )
        .await;
        assert_eq!(
            (&r["seq"], &r["error"]["code"]),
            (&json!(6), &json!("bad_request"))
        );
        let r = now(&ops, r#"{"seq":7,"op":"await","as":"sleep","bogus":1}"#).await;
        assert_eq!(r["error"]["code"], "bad_request");
    }

    #[tokio::test]
    async fn outcomes_past_the_bound_are_refused_until_awaited() {
        let ops = toy();
        for n in 0..OUTCOMES_MAX {
            let r = now(&ops, &format!(r#"{{"seq":{n},"op":"sleep","as":"s{n}"}}"#)).await;
            assert_eq!(r["ok"], true, "{r}");
        }
        let r = now(&ops, r#"{"seq":5000,"op":"sleep","as":"one-more"}"#).await;
        assert_eq!(r["error"]["code"], "too_many_operations");
        // The same name replaces its outcome: not one more.
        let r = now(&ops, r#"{"seq":5001,"op":"sleep","as":"s0"}"#).await;
        assert_eq!(r["ok"], true, "{r}");
        let r = later(&ops, r#"{"seq":5002,"op":"await","as":"s1"}"#).await;
        assert_eq!(r["ok"], true, "{r}");
        let r = now(&ops, r#"{"seq":5003,"op":"sleep","as":"one-more"}"#).await;
        assert_eq!(r["ok"], true, "{r}");
    }

    #[test]
    fn a_response_over_the_line_bound_is_replaced_by_an_error() {
        let big = "x".repeat(CONTROL_LINE_MAX_BYTES);
        let line = response_line(Some(3), Ok(json!({"text": big})));
        let r: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            (&r["seq"], &r["error"]["code"]),
            (&json!(3), &json!("response_too_large"))
        );
        let fits = "x".repeat(CONTROL_LINE_MAX_BYTES - 100);
        let line = response_line(Some(3), Ok(json!({"text": fits})));
        assert!(line.len() <= CONTROL_LINE_MAX_BYTES);
        assert_eq!(serde_json::from_str::<Value>(&line).unwrap()["ok"], true);
    }

    #[tokio::test]
    async fn serve_says_hello_answers_in_order_and_ends_with_the_channel() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("control.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let served = tokio::spawn({
            let socket = socket.clone();
            async move {
                serve(
                    &socket,
                    r#"{"hello":{"adapter":"toy","protocol":1}}"#,
                    toy(),
                )
                .await
            }
        });
        let (stream, _) = listener.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        assert_eq!(
            lines.next_line().await.unwrap().unwrap(),
            r#"{"hello":{"adapter":"toy","protocol":1}}"#
        );
        // Pipelined: the op, its await, and a short op behind them.
        write
            .write_all(
                concat!(
                    r#"{"seq":1,"op":"sleep","ms":50}"#,
                    "\n",
                    r#"{"seq":2,"op":"await","as":"sleep"}"#,
                    "\n",
                    r#"{"seq":3,"op":"echo","text":"t"}"#,
                    "\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            let line = lines.next_line().await.unwrap().unwrap();
            got.push(serde_json::from_str::<Value>(&line).unwrap());
        }
        assert_eq!(got[0], json!({"seq":1,"ok":true,"result":{}}));
        assert_eq!(got[1]["seq"], 3, "the await does not hold up a later op");
        assert_eq!(got[2], json!({"seq":2,"ok":true,"result":{"slept_ms":50}}));
        drop(write);
        served.await.unwrap().unwrap();
    }
}
