//! Wire side of the control channel (`docs/control-channel.md`, "Framing" and
//! "Operations"): the bounded line reader, strict request decoding into [`Request`],
//! and response encoding. No state, no tasks.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use super::ControlError;
use crate::core_runtime::adapter::NativeEvent;
use crate::core_runtime::wire::{
    FunctionCall, InputId, InteractionId, ItemId, NativeSessionId, Outcome, OutputMessage,
    PermissionRequest, PromptForUserChoice, RunId, ToolCall, Usage,
};
use crate::wire::bounded::BoundedString;
use crate::wire::strict::{WireError, from_value_strict, parse_strict};

/// Largest line, in bytes and without its `\n`, accepted or sent in either direction
/// ("Framing": at most 4 MiB per line).
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;

/// Wait bound of a request that carries no `timeout_ms` ("Framing": default 5000).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5_000);

/// Largest accepted `timeout_ms` (10 minutes); a larger value is a `bad_request`, so
/// no request can hold the adapter's resources longer than this.
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// Largest accepted `fail.times`.
pub const MAX_FAIL_TIMES: u32 = 10_000;

/// Bound of an `error` event's `message`, in bytes (the wire `error.message` bound).
pub const ERROR_MESSAGE_MAX_BYTES: usize = 8192;

/// The exact first line the adapter sends ("Framing" step 1), without its `\n`.
pub const HELLO_LINE: &str = r#"{"hello":{"adapter":"controlled","protocol":1}}"#;

/// A native call kind of the "Native calls" table; the `call` argument of
/// `fail`/`hold`/`release`/`await` and the `call` field of every call record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// `HarnessAdapter::prepare`.
    Prepare,
    /// `HarnessAdapter::start`.
    Start,
    /// `HarnessAdapter::write_input`.
    WriteInput,
    /// `HarnessAdapter::cancel`.
    Cancel,
    /// `HarnessAdapter::resolve_permission`.
    ResolvePermission,
    /// `HarnessAdapter::resolve_user_choice`.
    ResolveUserChoice,
    /// `HarnessAdapter::function_result`.
    FunctionResult,
    /// `HarnessAdapter::close_executor`.
    CloseExecutor,
}

impl CallKind {
    /// Number of call kinds.
    pub const COUNT: usize = 8;

    /// The wire name (the record's `call` value).
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::Prepare => "prepare",
            CallKind::Start => "start",
            CallKind::WriteInput => "write_input",
            CallKind::Cancel => "cancel",
            CallKind::ResolvePermission => "resolve_permission",
            CallKind::ResolveUserChoice => "resolve_user_choice",
            CallKind::FunctionResult => "function_result",
            CallKind::CloseExecutor => "close_executor",
        }
    }

    /// Dense index in `0..COUNT`, for per-kind tables.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// How a `fail`ed call fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailMode {
    /// `AdapterError::Refused`: nothing was applied.
    Refuse,
    /// `AdapterError::Unknown`: the outcome is unknown.
    Unknown,
    /// `AdapterError::Unsupported`.
    Unsupported,
    /// Never returns (until the control channel closes, then `AdapterError::Unknown`).
    Hang,
}

/// `emit.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum EmitType {
    Delta,
    Thinking,
    OutputMessage,
    ToolCall,
    Usage,
    Error,
    PermissionRequest,
    PermissionCancel,
    PromptForUserChoice,
    FunctionCall,
}

/// `emit` payload of `type: error`: `code` and `http_status` are raw JSON values that
/// the Runtime classifies ("Native failure classification").
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawErrorPayload {
    message: BoundedString<ERROR_MESSAGE_MAX_BYTES>,
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    http_status: Option<Value>,
}

/// `emit` payload of `type: permission_cancel`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PermissionCancelPayload {
    request_id: InteractionId,
}

/// The request arguments after `seq` and `timeout_ms` were taken out.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum RequestBody {
    Emit {
        run_id: RunId,
        #[serde(rename = "type")]
        event_type: EmitType,
        payload: Value,
    },
    Settle {
        run_id: RunId,
        outcome: Outcome,
        #[serde(default)]
        native_session_id: Option<NativeSessionId>,
    },
    AcceptInput {
        run_id: RunId,
        input_id: InputId,
    },
    SettleCancel {
        run_id: RunId,
        done: bool,
    },
    Fail {
        call: CallKind,
        mode: FailMode,
        #[serde(default)]
        times: Option<u32>,
    },
    Hold {
        call: CallKind,
    },
    Release {
        call: CallKind,
    },
    Await {
        call: CallKind,
        #[serde(default, rename = "match")]
        matcher: Option<Map<String, Value>>,
        #[serde(default)]
        count: Option<u64>,
    },
    Report {},
}

/// One decoded operation.
#[derive(Debug)]
pub enum Op {
    /// `emit`, `settle` and `accept_input`: queue one native event on the Run.
    RunEvent {
        /// The Run.
        run_id: RunId,
        /// The event.
        event: NativeEvent,
    },
    /// `settle_cancel`.
    SettleCancel {
        /// The Run whose pending `cancel` resolves.
        run_id: RunId,
        /// `done`.
        done: bool,
    },
    /// `fail`.
    Fail {
        /// Call kind.
        call: CallKind,
        /// Failure mode.
        mode: FailMode,
        /// How many next calls fail (1..=[`MAX_FAIL_TIMES`]).
        times: u32,
    },
    /// `hold`.
    Hold {
        /// Call kind.
        call: CallKind,
    },
    /// `release`.
    Release {
        /// Call kind.
        call: CallKind,
    },
    /// `await`.
    Await {
        /// Call kind.
        call: CallKind,
        /// Fields a record must equal (top-level JSON equality).
        matcher: Map<String, Value>,
        /// 1-based index of the matching record to wait for.
        count: usize,
    },
    /// `report`.
    Report,
}

impl Op {
    /// Whether the op applies at once without waiting (`fail`, `hold`, `release`,
    /// `report`); such ops are applied by the reader in arrival order.
    pub fn is_immediate(&self) -> bool {
        matches!(
            self,
            Op::Fail { .. } | Op::Hold { .. } | Op::Release { .. } | Op::Report
        )
    }

    /// The Run whose ordered lane this op runs in: ops that act on one Run's native
    /// stream are applied in arrival order per Run.
    pub fn lane(&self) -> Option<&RunId> {
        match self {
            Op::RunEvent { run_id, .. } | Op::SettleCancel { run_id, .. } => Some(run_id),
            _ => None,
        }
    }
}

/// A decoded request.
#[derive(Debug)]
pub struct Request {
    /// `seq`, echoed in the response.
    pub seq: u64,
    /// Wait bound (`timeout_ms`, default [`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
    /// The operation.
    pub op: Op,
}

/// A request that could not be decoded: `seq` is `None` when it could not be read.
#[derive(Debug)]
pub struct Rejected {
    /// The request's `seq`, when readable.
    pub seq: Option<u64>,
    /// Always [`ControlError::BadRequest`].
    pub error: ControlError,
}

fn bad(reason: impl std::fmt::Display) -> ControlError {
    ControlError::BadRequest(reason.to_string())
}

/// Decodes one request line strictly (`crate::wire::parse_strict`: duplicate keys and
/// `null` are errors at any depth; unknown arguments are errors).
///
/// # Errors
/// [`Rejected`] with [`ControlError::BadRequest`]; its `seq` is recovered when the
/// line is a JSON object whose top-level `seq` is an unambiguous `u64`.
pub fn decode_request(line: &[u8]) -> Result<Request, Rejected> {
    let value = match parse_strict(line) {
        Ok(value) => value,
        Err(err) => {
            return Err(Rejected {
                seq: recover_seq(line, &err),
                error: bad(err),
            });
        }
    };
    let Value::Object(mut object) = value else {
        return Err(Rejected {
            seq: None,
            error: bad("a request is a JSON object"),
        });
    };
    let seq = match object.remove("seq") {
        Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64().unwrap_or_default(),
        Some(_) => {
            return Err(Rejected {
                seq: None,
                error: bad("`seq` must be an unsigned 64-bit integer"),
            });
        }
        None => {
            return Err(Rejected {
                seq: None,
                error: bad("missing field `seq`"),
            });
        }
    };
    let reject = |error: ControlError| Rejected {
        seq: Some(seq),
        error,
    };
    let timeout = match object.remove("timeout_ms") {
        None => DEFAULT_TIMEOUT,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(ms) if ms <= MAX_TIMEOUT_MS => Duration::from_millis(ms),
            _ => {
                return Err(reject(bad(format!(
                    "`timeout_ms` must be an integer in 0..={MAX_TIMEOUT_MS}"
                ))));
            }
        },
        Some(_) => return Err(reject(bad("`timeout_ms` must be an integer"))),
    };
    let body: RequestBody = from_value_strict(Value::Object(object)).map_err(|e| reject(bad(e)))?;
    let op = op_from_body(body).map_err(reject)?;
    Ok(Request { seq, timeout, op })
}

/// Best-effort `seq` of a request the strict parser refused: read leniently, unless the
/// refusal concerns the top-level `seq` itself (a duplicated or `null` `seq` has no
/// single value to echo).
fn recover_seq(line: &[u8], err: &WireError) -> Option<u64> {
    match err {
        WireError::DuplicateKey { path, key } if path == "$" && key == "seq" => return None,
        WireError::NullValue { path } if path == "$.seq" => return None,
        WireError::Malformed(_) => return None,
        _ => {}
    }
    let value: Value = serde_json::from_slice(line).ok()?;
    value.get("seq")?.as_u64()
}

fn op_from_body(body: RequestBody) -> Result<Op, ControlError> {
    Ok(match body {
        RequestBody::Emit {
            run_id,
            event_type,
            payload,
        } => Op::RunEvent {
            run_id,
            event: decode_event(event_type, payload)
                .map_err(|e| bad(format!("payload: {}", e.under("payload"))))?,
        },
        RequestBody::Settle {
            run_id,
            outcome,
            native_session_id,
        } => Op::RunEvent {
            run_id,
            event: NativeEvent::Settled {
                outcome,
                native_session_id,
            },
        },
        RequestBody::AcceptInput { run_id, input_id } => Op::RunEvent {
            run_id,
            event: NativeEvent::InputAccepted { input_id },
        },
        RequestBody::SettleCancel { run_id, done } => Op::SettleCancel { run_id, done },
        RequestBody::Fail { call, mode, times } => {
            let times = times.unwrap_or(1);
            if !(1..=MAX_FAIL_TIMES).contains(&times) {
                return Err(bad(format!("`times` must be in 1..={MAX_FAIL_TIMES}")));
            }
            Op::Fail { call, mode, times }
        }
        RequestBody::Hold { call } => Op::Hold { call },
        RequestBody::Release { call } => Op::Release { call },
        RequestBody::Await {
            call,
            matcher,
            count,
        } => {
            let count = count.unwrap_or(1);
            let max = super::state::MAX_CALL_RECORDS as u64;
            if !(1..=max).contains(&count) {
                return Err(bad(format!("`count` must be in 1..={max}")));
            }
            Op::Await {
                call,
                matcher: matcher.unwrap_or_default(),
                count: usize::try_from(count).map_err(bad)?,
            }
        }
        RequestBody::Report {} => Op::Report,
    })
}

/// An emitted `delta`'s payload: the wire payload's fields, the text unbounded by a
/// frame field's bound (a Harness's output is not bounded by it: the Runtime splits a
/// longer text, catalog CR-FAM-011); the control line's bound still applies.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeDelta {
    text: String,
    #[serde(default)]
    item_id: Option<ItemId>,
}

/// An emitted `thinking`'s payload, its text unbounded like [`NativeDelta`]'s.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeThinking {
    text: String,
}

/// Decodes an `emit` payload with the wire payload type of `event_type` (a delta's or
/// thinking's text may exceed a frame field's bound).
fn decode_event(event_type: EmitType, payload: Value) -> Result<NativeEvent, WireError> {
    Ok(match event_type {
        EmitType::Delta => {
            let delta: NativeDelta = from_value_strict(payload)?;
            NativeEvent::Delta {
                text: delta.text,
                item_id: delta.item_id.map(|id| id.as_str().to_string()),
            }
        }
        EmitType::Thinking => {
            let thinking: NativeThinking = from_value_strict(payload)?;
            NativeEvent::Thinking {
                text: thinking.text,
            }
        }
        EmitType::OutputMessage => {
            NativeEvent::OutputMessage(from_value_strict::<OutputMessage>(payload)?)
        }
        EmitType::ToolCall => NativeEvent::ToolCall(from_value_strict::<ToolCall>(payload)?),
        EmitType::Usage => NativeEvent::Usage(from_value_strict::<Usage>(payload)?),
        EmitType::Error => {
            let raw: RawErrorPayload = from_value_strict(payload)?;
            NativeEvent::Error {
                message: raw.message.as_str().to_string(),
                code: raw.code,
                http_status: raw.http_status,
            }
        }
        EmitType::PermissionRequest => {
            NativeEvent::PermissionRequest(from_value_strict::<PermissionRequest>(payload)?)
        }
        EmitType::PermissionCancel => {
            let cancel: PermissionCancelPayload = from_value_strict(payload)?;
            NativeEvent::PermissionCancel {
                request_id: cancel.request_id,
            }
        }
        EmitType::PromptForUserChoice => {
            NativeEvent::PromptForUserChoice(from_value_strict::<PromptForUserChoice>(payload)?)
        }
        EmitType::FunctionCall => {
            NativeEvent::FunctionCall(from_value_strict::<FunctionCall>(payload)?)
        }
    })
}

#[derive(Serialize)]
struct OkResponse<'a> {
    seq: u64,
    ok: bool,
    result: &'a Value,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: String,
}

#[derive(Serialize)]
struct ErrResponse<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    ok: bool,
    error: ErrorBody<'a>,
}

/// Encodes an error response (without `\n`). `seq` is omitted only when the request's
/// `seq` could not be read.
pub fn encode_error(seq: Option<u64>, error: &ControlError) -> String {
    let response = ErrResponse {
        seq,
        ok: false,
        error: ErrorBody {
            code: error.code(),
            message: error.to_string(),
        },
    };
    // A struct of integers, booleans and strings always serializes.
    serde_json::to_string(&response).unwrap_or_default()
}

/// Encodes a response (without `\n`). A result that cannot be encoded strictly or
/// whose line would exceed [`MAX_LINE_BYTES`] becomes a `bad_request` error response.
pub fn encode_response(seq: u64, result: Result<Value, ControlError>) -> String {
    let value = match result {
        Ok(value) => value,
        Err(error) => return encode_error(Some(seq), &error),
    };
    let line = crate::wire::encode_strict(&OkResponse {
        seq,
        ok: true,
        result: &value,
    });
    match line {
        Ok(line) if line.len() <= MAX_LINE_BYTES => line,
        Ok(line) => encode_error(
            Some(seq),
            &bad(format!(
                "response of {} bytes exceeds the {MAX_LINE_BYTES}-byte line bound",
                line.len()
            )),
        ),
        Err(err) => encode_error(Some(seq), &bad(format!("result cannot be encoded: {err}"))),
    }
}

/// One line read by [`read_line`].
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A complete line is in the buffer (without its `\n`).
    Complete,
    /// A line longer than [`MAX_LINE_BYTES`] was read and discarded up to its `\n`.
    TooLong,
    /// End of stream (a final line without `\n` is discarded).
    Eof,
}

/// Reads one `\n`-terminated line into `buf` (cleared first) without ever holding more
/// than [`MAX_LINE_BYTES`] of it: an over-long line is consumed and dropped.
///
/// # Errors
/// The reader's I/O errors.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<Line> {
    buf.clear();
    let mut too_long = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(Line::Eof);
        }
        let (chunk, used, complete) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        if !too_long {
            if buf.len() + chunk.len() > MAX_LINE_BYTES {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        reader.consume(used);
        if complete {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Complete
            });
        }
    }
}
