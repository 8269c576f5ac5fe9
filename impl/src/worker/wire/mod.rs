//! The worker protocol's wire, defined once ("Runtime control protocol v1",
//! `worker-protocol.md`): the envelope, the typed messages, their bounds and the strict
//! decoder both the host and the harness use.
//!
//! A frame is a 4-byte big-endian length of 1..=[`limits::FRAME_MAX_BYTES`] and that
//! many bytes of UTF-8 JSON ([`frame`]). The JSON is parsed refusing duplicate keys at
//! every depth (free-form payload maps included) and NaN/Infinity; the envelope and every
//! typed message refuse unknown fields and require every field (`null` where the spec
//! allows it: [`ids::Nullable`]). [`decode_envelope`] then checks version, session and
//! generation against what the connection expects. Every refusal is a typed
//! [`WorkerWireError`] with a stable [`code`](WorkerWireError::code).
//!
//! This module does no I/O and never panics on input.

pub mod frame;
pub mod hooks;
pub mod ids;
pub mod limits;
pub mod requests;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wire::strict::{WireError, from_value_with_nulls, parse_strict_with_nulls};
pub use hooks::Slot;
pub use ids::{Identifier, Nullable};
use limits::{
    CELL_SOURCE_MAX_BYTES, ERROR_TEXT_MAX_BYTES, OUTPUT_RECORDS_MAX, PROTOCOL_VERSION,
    RETURNED_TEXT_MAX_BYTES,
};
pub use requests::HostRequest;

/// One frame's JSON ("All outer fields are required":
/// `{"version":1,"session_id":"root","generation":"g-1","message":{"kind":"shutdown"}}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Protocol version, always [`PROTOCOL_VERSION`].
    pub version: u64,
    /// The worker's session.
    pub session_id: Identifier,
    /// The worker's generation (one connection, one process).
    pub generation: Identifier,
    /// The message.
    pub message: Message,
}

/// The role a worker announces in `hello`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Runs cells (`execute`).
    Workbench,
    /// Runs decision hooks (`invoke`).
    Hooks,
}

/// The messages ("Message vocabulary"), tagged by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Message {
    /// Worker → host, first and once: "token, role (`workbench` or `hooks`), revision
    /// (null for workbench), and slots (empty for workbench; exactly `attention.plan`,
    /// `delivery.review` for this hook worker)".
    Hello {
        /// The startup token the host gave this subprocess.
        token: Identifier,
        /// The worker's role.
        role: Role,
        /// The hook source revision (SHA-256 hex); for a workbench, the revision of the
        /// skills set it was started with ("Skills": it "echoes the set's revision in
        /// `hello`"), `null` when it was started without one (our reading of "null for
        /// workbench", `WK-SKILL-016`).
        revision: Nullable<String>,
        /// The slots the worker implements.
        slots: Vec<Slot>,
    },
    /// Host → workbench: run one cell.
    Execute {
        /// Operation ID.
        id: Identifier,
        /// Python source, at most [`CELL_SOURCE_MAX_BYTES`].
        code: String,
    },
    /// Host → hook worker: one decision.
    Invoke {
        /// Operation ID.
        id: Identifier,
        /// The slot.
        slot: Slot,
        /// The slot's typed input ([`hooks::AttentionInput`], [`hooks::DeliveryInput`]).
        input: Value,
    },
    /// Worker → host: a request on behalf of an execution.
    HostRequest {
        /// Request ID.
        id: Identifier,
        /// The execution (operation) the request belongs to.
        execution_id: Identifier,
        /// The request.
        request: HostRequest,
    },
    /// Host → worker: the answer to one request ("repeats request/execution identity").
    HostReply {
        /// The request ID.
        id: Identifier,
        /// The execution ID.
        execution_id: Identifier,
        /// `ok` with a value or `error` with a code and message.
        reply: Reply,
    },
    /// Worker → host: an operation ended ("repeats the operation `id`").
    Completed {
        /// Operation ID.
        id: Identifier,
        /// How it ended.
        result: Completion,
    },
    /// Host → worker: interrupt one operation.
    Interrupt {
        /// Operation ID.
        id: Identifier,
    },
    /// Host → worker: exit cleanly.
    Shutdown {},
}

impl Message {
    /// The `kind` on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Execute { .. } => "execute",
            Message::Invoke { .. } => "invoke",
            Message::HostRequest { .. } => "host_request",
            Message::HostReply { .. } => "host_reply",
            Message::Completed { .. } => "completed",
            Message::Interrupt { .. } => "interrupt",
            Message::Shutdown {} => "shutdown",
        }
    }

    /// Who sends it.
    pub fn direction(&self) -> Direction {
        match self {
            Message::Hello { .. } | Message::HostRequest { .. } | Message::Completed { .. } => {
                Direction::WorkerToHost
            }
            _ => Direction::HostToWorker,
        }
    }
}

/// Which way a message travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Sent by the host.
    HostToWorker,
    /// Sent by the worker.
    WorkerToHost,
}

/// Every message kind and its direction.
pub const KINDS: &[(&str, Direction)] = &[
    ("hello", Direction::WorkerToHost),
    ("execute", Direction::HostToWorker),
    ("invoke", Direction::HostToWorker),
    ("host_request", Direction::WorkerToHost),
    ("host_reply", Direction::HostToWorker),
    ("completed", Direction::WorkerToHost),
    ("interrupt", Direction::HostToWorker),
    ("shutdown", Direction::HostToWorker),
];

/// A `host_reply`'s outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// The request succeeded.
    Ok {
        /// Its value.
        value: Value,
    },
    /// The request failed.
    Error {
        /// Stable error code.
        code: String,
        /// For people.
        message: String,
    },
}

/// How an operation ended (`completed.result`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Completion {
    /// A cell ended.
    Cell {
        /// `ok`, `error`, `yielded` or `interrupted`.
        status: CellStatus,
        /// Output records, at most [`OUTPUT_RECORDS_MAX`] holding at most
        /// [`RETURNED_TEXT_MAX_BYTES`] of text in all.
        output: Vec<OutputRecord>,
        /// Bytes of output counted and discarded past the bounds.
        truncated_bytes: u64,
        /// The error text (at most [`ERROR_TEXT_MAX_BYTES`]), `null` when none.
        error: Nullable<String>,
    },
    /// A hook decided.
    Hook {
        /// The decision ([`hooks::AttentionDecision`], [`hooks::DeliveryDecision`]).
        value: Value,
    },
    /// The worker could not run the operation.
    Failed {
        /// What failed (at most [`ERROR_TEXT_MAX_BYTES`]).
        error: String,
    },
}

/// A cell's status ("Cell statuses: `ok`, `error`, `yielded`, `interrupted`").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    /// Ran to its end.
    Ok,
    /// Raised.
    Error,
    /// Ended at an accepted wait.
    Yielded,
    /// Interrupted.
    Interrupted,
}

/// One output record ("Output streams: `stdout`, `stderr`, `result`").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputRecord {
    /// Which stream.
    pub stream: Stream,
    /// Its text.
    pub text: String,
}

/// An output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Printed to stdout.
    Stdout,
    /// Printed to stderr.
    Stderr,
    /// The final expression's repr.
    Result,
}

/// A refused frame. [`code`](Self::code) is stable: the host, the Python worker and the
/// harness classify a frame with the same code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerWireError {
    /// The framing itself is wrong (length 0, over the bound, cut short at EOF).
    #[error(transparent)]
    Frame(#[from] frame::FrameError),
    /// The payload is not UTF-8.
    #[error("the payload is not UTF-8 (byte {0})")]
    NotUtf8(usize),
    /// The JSON or its typed decoding failed.
    #[error(transparent)]
    Json(#[from] WireError),
    /// `message.kind` names no message of the protocol.
    #[error("unknown message kind `{0}`")]
    UnknownKind(String),
    /// A message of the other direction.
    #[error("`{0}` is not sent in this direction")]
    WrongDirection(String),
    /// `version` is not [`PROTOCOL_VERSION`].
    #[error("version {0} is not {PROTOCOL_VERSION}")]
    VersionMismatch(u64),
    /// `session_id` is not the connection's.
    #[error("session_id `{got}` is not `{expected}`")]
    SessionMismatch {
        /// The connection's session.
        expected: String,
        /// The frame's.
        got: String,
    },
    /// `generation` is not the connection's.
    #[error("generation `{got}` is not `{expected}`")]
    GenerationMismatch {
        /// The connection's generation.
        expected: String,
        /// The frame's.
        got: String,
    },
    /// A bound of the spec is exceeded (source, output, error text, hello slots).
    #[error("{0}")]
    Bound(String),
}

impl WorkerWireError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            WorkerWireError::Frame(e) => e.code(),
            WorkerWireError::NotUtf8(_) => "not_utf8",
            WorkerWireError::Json(e) => e.code(),
            WorkerWireError::UnknownKind(_) => "unknown_kind",
            WorkerWireError::WrongDirection(_) => "wrong_direction",
            WorkerWireError::VersionMismatch(_) => "version_mismatch",
            WorkerWireError::SessionMismatch { .. } => "session_mismatch",
            WorkerWireError::GenerationMismatch { .. } => "generation_mismatch",
            WorkerWireError::Bound(_) => "bound_exceeded",
        }
    }
}

/// What a connection expects of every frame it reads: the session and generation it
/// was started with, and the direction the peer sends in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect<'a> {
    /// The session.
    pub session_id: &'a str,
    /// The generation.
    pub generation: &'a str,
    /// The direction of the frames read.
    pub direction: Direction,
}

/// Decodes one payload (without its length prefix) strictly: UTF-8, JSON without
/// duplicate keys or non-finite numbers, the envelope and message types, the version,
/// then (with `expect`) session, generation and direction, then the spec's bounds.
///
/// # Errors
/// The first [`WorkerWireError`], in that order.
pub fn decode_envelope(
    payload: &[u8],
    expect: Option<&Expect<'_>>,
) -> Result<Envelope, WorkerWireError> {
    if let Err(e) = std::str::from_utf8(payload) {
        return Err(WorkerWireError::NotUtf8(e.valid_up_to()));
    }
    let value = parse_strict_with_nulls(payload)?;
    decode_value(value, expect)
}

/// [`decode_envelope`] for an already parsed value.
///
/// # Errors
/// As [`decode_envelope`], JSON parsing aside.
pub fn decode_value(
    value: Value,
    expect: Option<&Expect<'_>>,
) -> Result<Envelope, WorkerWireError> {
    // The order of the verdicts, the same in the Python worker's decoder: unknown kind,
    // wrong direction, object shapes, then typed decoding in document order (a field the type does not
    // define or a bad value where it stands, missing fields after), then version,
    // session, generation, bounds.
    if let Some(kind) = value
        .get("message")
        .and_then(|m| m.get("kind"))
        .and_then(Value::as_str)
    {
        match KINDS.iter().find(|(k, _)| *k == kind) {
            None => return Err(WorkerWireError::UnknownKind(kind.to_string())),
            Some((_, direction)) if expect.is_some_and(|e| e.direction != *direction) => {
                return Err(WorkerWireError::WrongDirection(kind.to_string()));
            }
            Some(_) => {}
        }
    }
    require_objects(&value)?;
    let envelope: Envelope = from_value_with_nulls(value)?;
    if envelope.version != PROTOCOL_VERSION {
        return Err(WorkerWireError::VersionMismatch(envelope.version));
    }
    if let Some(expect) = expect {
        if envelope.session_id.as_str() != expect.session_id {
            return Err(WorkerWireError::SessionMismatch {
                expected: expect.session_id.into(),
                got: envelope.session_id.to_string(),
            });
        }
        if envelope.generation.as_str() != expect.generation {
            return Err(WorkerWireError::GenerationMismatch {
                expected: expect.generation.into(),
                got: envelope.generation.to_string(),
            });
        }
    }
    check_bounds(&envelope.message)?;
    Ok(envelope)
}

/// serde reads a struct or a tagged enum from a JSON array too (`[1,"root","g-1",…]`);
/// the wire's are objects. Refuses an array (or any non-object) at every position a
/// typed struct or enum holds, where the type would otherwise take it.
///
/// # Errors
/// [`WireError::InvalidValue`] naming the position.
fn require_objects(value: &Value) -> Result<(), WorkerWireError> {
    fn object(value: Option<&Value>, path: &str) -> Result<(), WorkerWireError> {
        match value {
            None | Some(Value::Object(_)) => Ok(()),
            Some(_) => Err(WorkerWireError::Json(WireError::invalid(
                path,
                "expected an object",
            ))),
        }
    }
    object(Some(value), "$")?;
    let message = value.get("message");
    object(message, "$.message")?;
    let Some(message) = message else {
        return Ok(());
    };
    for key in ["reply", "result", "request"] {
        object(message.get(key), &format!("$.message.{key}"))?;
    }
    if let Some(scope) = message.get("request").and_then(|r| r.get("scope")) {
        object(Some(scope), "$.message.request.scope")?;
    }
    if let Some(Value::Array(records)) = message.get("result").and_then(|r| r.get("output")) {
        for (i, record) in records.iter().enumerate() {
            object(Some(record), &format!("$.message.result.output[{i}]"))?;
        }
    }
    Ok(())
}

/// The spec's bounds on one message that typed decoding cannot express.
///
/// # Errors
/// [`WorkerWireError::Bound`] naming the bound.
pub fn check_bounds(message: &Message) -> Result<(), WorkerWireError> {
    let bound = |m: String| Err(WorkerWireError::Bound(m));
    match message {
        Message::Hello {
            role,
            revision,
            slots,
            ..
        } => match role {
            // A workbench's revision is its skills set's, or null ("Skills").
            Role::Workbench if !slots.is_empty() => {
                bound("a workbench hello has no slots".into())
            }
            Role::Hooks if revision.as_ref().is_none() || slots.as_slice() != Slot::ALL => bound(
                "a hooks hello has a revision and exactly the slots attention.plan, delivery.review"
                    .into(),
            ),
            _ => Ok(()),
        },
        Message::Execute { code, .. } if code.len() > CELL_SOURCE_MAX_BYTES => bound(format!(
            "cell source of {} bytes exceeds {CELL_SOURCE_MAX_BYTES}",
            code.len()
        )),
        Message::HostRequest { request, .. } => {
            request.validate().map_err(WorkerWireError::Bound)
        }
        Message::Completed { result, .. } => match result {
            Completion::Cell { output, error, .. } => {
                if output.len() > OUTPUT_RECORDS_MAX {
                    return bound(format!(
                        "{} output records exceed {OUTPUT_RECORDS_MAX}",
                        output.len()
                    ));
                }
                let text: usize = output.iter().map(|r| r.text.len()).sum();
                if text > RETURNED_TEXT_MAX_BYTES {
                    return bound(format!(
                        "{text} bytes of returned text exceed {RETURNED_TEXT_MAX_BYTES}"
                    ));
                }
                match error.as_ref() {
                    Some(e) if e.len() > ERROR_TEXT_MAX_BYTES => bound(format!(
                        "error text of {} bytes exceeds {ERROR_TEXT_MAX_BYTES}",
                        e.len()
                    )),
                    _ => Ok(()),
                }
            }
            Completion::Failed { error } if error.len() > ERROR_TEXT_MAX_BYTES => bound(format!(
                "error text of {} bytes exceeds {ERROR_TEXT_MAX_BYTES}",
                error.len()
            )),
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Encodes an envelope as the payload of one frame (compact JSON; no length prefix).
/// `null` is written where the types hold it; a non-finite number (which serde_json
/// would write as `null`) can only sit in a typed `f64`, and [`check_bounds`] refuses it
/// first (`serde_json::Value` cannot hold one).
///
/// # Errors
/// A bound of [`check_bounds`] (a non-finite wait included), or a payload over the
/// frame bound.
pub fn encode_envelope(envelope: &Envelope) -> Result<Vec<u8>, WorkerWireError> {
    check_bounds(&envelope.message)?;
    let text = serde_json::to_string(envelope)
        .map_err(|e| WorkerWireError::Json(WireError::invalid("$", e.to_string())))?;
    if text.len() > limits::FRAME_MAX_BYTES {
        return Err(frame::FrameError::TooLong {
            len: text.len() as u64,
            max: limits::FRAME_MAX_BYTES,
        }
        .into());
    }
    Ok(text.into_bytes())
}

/// The JSON Schema of the envelope and every message (`contract-impl schema worker`).
pub fn json_schema() -> Value {
    serde_json::to_value(schemars::schema_for!(Envelope)).unwrap_or(Value::Null)
}

#[cfg(test)]
mod corpus_tests;
#[cfg(test)]
mod tests;
