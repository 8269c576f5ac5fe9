//! The Envelope and the one table of message types ("Envelope and identity",
//! "Message families").
//!
//! [`Frame`] is a decoded Envelope: `id`, optional W3C `trace`, and a typed
//! [`Message`]. [`Frame::decode`] is strict (see [`crate::wire::strict`]) and checks
//! the direction; [`Frame::encode`] refuses non-finite numbers.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::limits::{TRACEPARENT_MAX_BYTES, TRACESTATE_MAX_BYTES, TRANSPORT_FRAME_MAX_BYTES};
use super::payloads::*;
use crate::wire::WireError;
use crate::wire::strict::{from_value_strict, parse_strict_with_nulls};

/// Which party sends a message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Core → Runtime.
    CoreToRuntime,
    /// Runtime → Core.
    RuntimeToCore,
}

/// W3C trace context. Diagnostic only: missing or invalid trace data creates a local
/// trace and never changes ownership, so decoding never fails on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    /// `traceparent` header value.
    pub traceparent: String,
    /// `tracestate` header value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl Trace {
    /// Accepts `value` as trace context only if it is well-formed and within the W3C
    /// bounds; anything else is dropped (a local trace is created instead).
    ///
    /// Well-formed is the W3C `traceparent` shape: `version-trace_id-parent_id-flags`,
    /// 2, 32, 16 and 2 lowercase hex digits ([`TRACEPARENT_MAX_BYTES`] in all), version
    /// not `ff`, neither ID all zeros; and a `tracestate` of at most
    /// [`TRACESTATE_MAX_BYTES`].
    pub fn lenient(value: &Value) -> Option<Trace> {
        let trace: Trace = serde_json::from_value(value.clone()).ok()?;
        let ok_state = trace
            .tracestate
            .as_ref()
            .is_none_or(|s| s.len() <= TRACESTATE_MAX_BYTES);
        (well_formed_traceparent(&trace.traceparent) && ok_state).then_some(trace)
    }
}

/// Whether `value` has the W3C `traceparent` shape (see [`Trace::lenient`]).
fn well_formed_traceparent(value: &str) -> bool {
    let fields: Vec<&str> = value.split('-').collect();
    let [version, trace_id, parent_id, flags] = fields.as_slice() else {
        return false;
    };
    let hex = |field: &str, len: usize| {
        field.len() == len
            && field
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let nonzero = |field: &str| field.bytes().any(|b| b != b'0');
    // The fields and their three dashes make up the whole bound.
    const _: () = assert!(2 + 32 + 16 + 2 + 3 == TRACEPARENT_MAX_BYTES);
    hex(version, 2)
        && *version != "ff"
        && hex(trace_id, 32)
        && nonzero(trace_id)
        && hex(parent_id, 16)
        && nonzero(parent_id)
        && hex(flags, 2)
}

/// The raw Envelope as it travels: every data frame is one of these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Message type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Identity whose meaning depends on the type.
    pub id: String,
    /// Typed payload.
    pub payload: Value,
    /// Optional W3C trace context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Value>,
}

macro_rules! messages {
    ($( $variant:ident($payload:ty) = $wire:literal, $dir:ident; )*) => {
        /// Every message type of the protocol.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum MessageType {
            $(
                #[doc = concat!("`", $wire, "`")]
                $variant,
            )*
        }

        impl MessageType {
            /// Every message type, in table order.
            pub const ALL: &'static [MessageType] = &[$(MessageType::$variant),*];

            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self { $(MessageType::$variant => $wire,)* }
            }

            /// Parses a wire name.
            pub fn parse(name: &str) -> Option<Self> {
                match name { $($wire => Some(MessageType::$variant),)* _ => None }
            }

            /// Who sends this type.
            pub fn direction(self) -> Direction {
                match self { $(MessageType::$variant => Direction::$dir,)* }
            }

            fn payload_schema(self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                match self { $(MessageType::$variant => generator.subschema_for::<$payload>(),)* }
            }
        }

        /// A typed message: one variant per Envelope `type`.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Message {
            $(
                #[doc = concat!("`", $wire, "`")]
                $variant($payload),
            )*
        }

        impl Message {
            /// The message type.
            pub fn message_type(&self) -> MessageType {
                match self { $(Message::$variant(_) => MessageType::$variant,)* }
            }

            fn decode_payload(kind: MessageType, payload: Value) -> Result<Self, WireError> {
                match kind {
                    $(MessageType::$variant => from_value_strict::<$payload>(payload).map(Message::$variant),)*
                }
            }

            fn payload_value(&self) -> Result<Value, WireError> {
                let value = match self {
                    $(Message::$variant(p) => serde_json::to_value(p),)*
                };
                value.map_err(|e| WireError::invalid("$.payload", e.to_string()))
            }
        }
    };
}

messages! {
    RuntimePrepare(RuntimePrepare) = "runtime_prepare", CoreToRuntime;
    RuntimePrepareResult(RuntimePrepareResult) = "runtime_prepare_result", RuntimeToCore;
    ExecutionPrepare(ExecutionPrepare) = "execution_prepare", CoreToRuntime;
    ExecutionStart(ExecutionStart) = "execution_start", CoreToRuntime;
    ExecutionRelease(ExecutionRelease) = "execution_release", CoreToRuntime;
    PreparationStatus(PreparationStatus) = "preparation_status", RuntimeToCore;
    PromptCancel(PromptCancel) = "prompt_cancel", CoreToRuntime;
    DeviceShutdown(DeviceShutdown) = "device_shutdown", CoreToRuntime;
    Delta(Delta) = "delta", RuntimeToCore;
    Thinking(Thinking) = "thinking", RuntimeToCore;
    OutputMessage(OutputMessage) = "output_message", RuntimeToCore;
    ToolCall(ToolCall) = "tool_call", RuntimeToCore;
    Usage(Usage) = "usage", RuntimeToCore;
    Error(RunError) = "error", RuntimeToCore;
    Done(Done) = "done", RuntimeToCore;
    Heartbeat(Heartbeat) = "heartbeat", RuntimeToCore;
    PermissionDecision(PermissionDecision) = "permission_decision", CoreToRuntime;
    PromptForUserChoiceDecision(PromptForUserChoiceDecision) = "prompt_for_user_choice_decision", CoreToRuntime;
    PermissionRequest(PermissionRequest) = "permission_request", RuntimeToCore;
    PermissionCancel(PermissionCancel) = "permission_cancel", RuntimeToCore;
    PromptForUserChoice(PromptForUserChoice) = "prompt_for_user_choice", RuntimeToCore;
    InteractionDecisionAck(InteractionDecisionAck) = "interaction_decision_ack", RuntimeToCore;
    PromptSteer(PromptSteer) = "prompt_steer", CoreToRuntime;
    PromptSteerAck(PromptSteerAck) = "prompt_steer_ack", RuntimeToCore;
    FunctionResult(FunctionResult) = "function_result", CoreToRuntime;
    FunctionCall(FunctionCall) = "function_call", RuntimeToCore;
    WorkspaceRead(WorkspaceRead) = "workspace_read", CoreToRuntime;
    WorkspaceReadResult(WorkspaceReadResult) = "workspace_read_result", RuntimeToCore;
    WorkspaceWrite(WorkspaceWrite) = "workspace_write", CoreToRuntime;
    WorkspaceWriteResult(WorkspaceWriteResult) = "workspace_write_result", RuntimeToCore;
    WorkspaceExport(WorkspaceExport) = "workspace_export", CoreToRuntime;
    WorkspaceExportResult(WorkspaceExportResult) = "workspace_export_result", RuntimeToCore;
    EnvironmentQuiesce(EnvironmentFence) = "environment_quiesce", CoreToRuntime;
    EnvironmentResume(EnvironmentFence) = "environment_resume", CoreToRuntime;
    EnvironmentQuiesced(EnvironmentFenceResult) = "environment_quiesced", RuntimeToCore;
    EnvironmentResumed(EnvironmentFenceResult) = "environment_resumed", RuntimeToCore;
}

/// A decoded, typed Envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// `Envelope.id`; its meaning depends on the type.
    pub id: String,
    /// Trace context, when the peer sent a valid one.
    pub trace: Option<Trace>,
    /// The typed message.
    pub message: Message,
}

impl Frame {
    /// Builds a frame without trace context.
    pub fn new(id: impl Into<String>, message: Message) -> Self {
        Self {
            id: id.into(),
            trace: None,
            message,
        }
    }

    /// Decodes one WebSocket text message sent by the party `from`.
    ///
    /// # Errors
    /// [`WireError::FrameTooLarge`] over [`TRANSPORT_FRAME_MAX_BYTES`]; any strict-JSON
    /// error; [`WireError::UnknownType`]; [`WireError::WrongDirection`] when `from` may
    /// not send this type; payload errors with paths under `$.payload`.
    pub fn decode(bytes: &[u8], from: Direction) -> Result<Self, WireError> {
        let envelope = decode_envelope(bytes)?;
        let kind = MessageType::parse(&envelope.kind)
            .ok_or_else(|| WireError::UnknownType(envelope.kind.clone()))?;
        if kind.direction() != from {
            return Err(WireError::WrongDirection(envelope.kind));
        }
        let message =
            Message::decode_payload(kind, envelope.payload).map_err(|e| e.under("payload"))?;
        Ok(Self {
            id: envelope.id,
            trace: envelope.trace.as_ref().and_then(Trace::lenient),
            message,
        })
    }

    /// Encodes the frame as one compact JSON text.
    ///
    /// # Errors
    /// [`WireError::NonFinite`] if any number is not finite.
    pub fn encode(&self) -> Result<String, WireError> {
        let envelope = self.to_envelope()?;
        crate::wire::encode_strict(&envelope)
    }

    /// The frame as a raw [`Envelope`].
    ///
    /// # Errors
    /// Serialization failures of the payload.
    pub fn to_envelope(&self) -> Result<Envelope, WireError> {
        Ok(Envelope {
            kind: self.message.message_type().as_str().to_string(),
            id: self.id.clone(),
            payload: self.message.payload_value()?,
            trace: self
                .trace
                .as_ref()
                .map(|t| serde_json::to_value(t).unwrap_or(Value::Object(Map::new()))),
        })
    }
}

/// Decodes only the Envelope layer (bounded, strict), leaving the payload untyped.
///
/// # Errors
/// As [`Frame::decode`], minus payload errors.
pub fn decode_envelope(bytes: &[u8]) -> Result<Envelope, WireError> {
    if bytes.len() > TRANSPORT_FRAME_MAX_BYTES {
        return Err(WireError::FrameTooLarge {
            size: bytes.len(),
            limit: TRANSPORT_FRAME_MAX_BYTES,
        });
    }
    let mut value = parse_strict_with_nulls(bytes)?;
    drop_null_error_metadata(&mut value);
    from_value_strict::<Envelope>(value)
}

/// "A missing, malformed or unknown value stays an unclassified error" ("Native failure
/// classification"): a `null` `code` or `http_status` of an `error` payload is read as
/// missing, the one exception to refusing `null` at any depth (CR-FAM-006).
fn drop_null_error_metadata(value: &mut Value) {
    if value.get("type").and_then(Value::as_str) != Some(MessageType::Error.as_str()) {
        return;
    }
    if let Some(payload) = value.get_mut("payload").and_then(Value::as_object_mut) {
        for key in ["code", "http_status"] {
            if payload.get(key).is_some_and(Value::is_null) {
                payload.remove(key);
            }
        }
    }
}

/// Validates a raw JSON value as a frame sent by `from` (used by the harness's schema
/// check of every emitted frame).
///
/// # Errors
/// As [`Frame::decode`].
pub fn validate_value(value: &Value, from: Direction) -> Result<Frame, WireError> {
    let text = serde_json::to_vec(value).map_err(|e| WireError::Malformed(e.to_string()))?;
    Frame::decode(&text, from)
}

/// The JSON Schema (draft 2020-12) of every Envelope of this protocol: one `oneOf`
/// branch per message type with its `type` constant, its payload schema and the
/// direction it travels in (`x-direction`).
pub fn json_schema() -> Value {
    let mut generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let trace = generator.subschema_for::<Trace>();
    let mut branches = Vec::new();
    for kind in MessageType::ALL {
        let payload = kind.payload_schema(&mut generator);
        branches.push(serde_json::json!({
            "title": kind.as_str(),
            "x-direction": kind.direction(),
            "type": "object",
            "additionalProperties": false,
            "required": ["type", "id", "payload"],
            "properties": {
                "type": { "const": kind.as_str() },
                "id": { "type": "string" },
                "payload": payload,
                "trace": trace,
            }
        }));
    }
    let defs: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Core ↔ Runtime Envelope",
        "description": format!("Wire version {}. Strict: duplicate keys, null values and unknown fields are rejected.", super::limits::WIRE_VERSION),
        "oneOf": branches,
        "$defs": defs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_direction() {
        let text = r#"{"type":"prompt_cancel","id":"run-1","payload":{"delivery_id":"d1"}}"#;
        let frame = Frame::decode(text.as_bytes(), Direction::CoreToRuntime).unwrap();
        assert_eq!(frame.encode().unwrap(), text);
        let err = Frame::decode(text.as_bytes(), Direction::RuntimeToCore).unwrap_err();
        assert_eq!(err.code(), "wrong_direction");
    }

    #[test]
    fn payload_errors_are_reported_under_payload() {
        let text = r#"{"type":"prompt_cancel","id":"r","payload":{"delivery_id":"d","x":1}}"#;
        let err = Frame::decode(text.as_bytes(), Direction::CoreToRuntime).unwrap_err();
        assert_eq!(
            err,
            WireError::UnknownField {
                path: "$.payload".into(),
                field: "x".into()
            }
        );
        let dup = r#"{"type":"prompt_cancel","id":"r","id":"s","payload":{}}"#;
        assert_eq!(
            Frame::decode(dup.as_bytes(), Direction::CoreToRuntime)
                .unwrap_err()
                .code(),
            "duplicate_key"
        );
        let unknown = r#"{"type":"teleport","id":"r","payload":{}}"#;
        assert_eq!(
            Frame::decode(unknown.as_bytes(), Direction::CoreToRuntime)
                .unwrap_err()
                .code(),
            "unknown_type"
        );
    }

    #[test]
    fn unknown_or_malformed_error_metadata_stays_unclassified() {
        let error = |payload: &str| {
            let text = format!(r#"{{"type":"error","id":"run-1","payload":{payload}}}"#);
            match Frame::decode(text.as_bytes(), Direction::RuntimeToCore) {
                Ok(Frame {
                    message: Message::Error(e),
                    ..
                }) => Ok((
                    e.code.map(|c| serde_json::to_value(c).unwrap()),
                    e.http_status,
                )),
                Ok(other) => panic!("not an error: {other:?}"),
                Err(e) => Err(e.code()),
            }
        };
        let cf = Some(serde_json::json!("connection_failed"));
        for (payload, expected) in [
            (r#"{"message":"m","code":"quota_gone"}"#, Ok((None, None))),
            (
                r#"{"message":"m","code":42,"http_status":503}"#,
                Ok((None, None)),
            ),
            (
                r#"{"message":"m","code":null,"http_status":null}"#,
                Ok((None, None)),
            ),
            (r#"{"message":null}"#, Err("null_value")),
            (
                r#"{"message":"m","code":"connection_failed","http_status":"503"}"#,
                Ok((cf.clone(), None)),
            ),
            (
                r#"{"message":"m","code":"connection_failed","http_status":-1}"#,
                Ok((cf.clone(), None)),
            ),
            (
                r#"{"message":"m","code":"connection_failed","http_status":65536}"#,
                Ok((cf.clone(), None)),
            ),
            (
                r#"{"message":"m","code":"connection_failed","http_status":600}"#,
                Ok((cf.clone(), None)),
            ),
            (
                r#"{"message":"m","code":"connection_failed","http_status":599}"#,
                Ok((cf.clone(), Some(599))),
            ),
            (
                r#"{"message":"m","code":"server_error","http_status":500}"#,
                Ok((Some(serde_json::json!("server_error")), None)),
            ),
            // Only the message and unknown fields refuse the frame.
            (r#"{"code":"server_error"}"#, Err("missing_field")),
            (r#"{"message":"m","extra":1}"#, Err("unknown_field")),
        ] {
            assert_eq!(error(payload), expected, "{payload}");
        }
    }

    #[test]
    fn invalid_trace_is_dropped_not_fatal() {
        let text = r#"{"type":"prompt_cancel","id":"r","payload":{"delivery_id":"d"},"trace":{"traceparent":"nope"}}"#;
        let frame = Frame::decode(text.as_bytes(), Direction::CoreToRuntime).unwrap();
        assert!(frame.trace.is_none());
    }

    /// The W3C shape at each of its edges: a valid context is kept; one character short
    /// or long, a field of the wrong length, upper case, a non-hex digit, version `ff`,
    /// an all-zero ID, and a `tracestate` one byte over its bound are each dropped.
    #[test]
    fn traceparent_is_kept_only_in_its_exact_shape() {
        const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let kept = |parent: &str, state: Option<String>| {
            let mut value = serde_json::json!({ "traceparent": parent });
            if let Some(state) = state {
                value["tracestate"] = Value::String(state);
            }
            Trace::lenient(&value).is_some()
        };
        assert_eq!(VALID.len(), TRACEPARENT_MAX_BYTES);
        assert!(kept(VALID, None));
        assert!(kept(VALID, Some("k=".to_string() + &"v".repeat(510))));
        assert!(!kept(VALID, Some("k=".to_string() + &"v".repeat(511))));
        for dropped in [
            &VALID[..54],
            &format!("{VALID}0"),
            "000-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b701-",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "-------------------------------------------------------",
        ] {
            assert!(!kept(dropped, None), "{dropped}");
        }
        assert!(Trace::lenient(&serde_json::json!({ "traceparent": 7 })).is_none());
    }

    #[test]
    fn schema_covers_every_type() {
        let schema = json_schema();
        let branches = schema["oneOf"].as_array().unwrap();
        assert_eq!(branches.len(), MessageType::ALL.len());
        assert!(schema["$defs"]["AgentKindCapabilities"].is_object());
    }

    #[test]
    fn tagged_payloads_deny_unknown_fields() {
        let text = r#"{"type":"runtime_prepare","id":"t","payload":{"phase":"commit","x":1}}"#;
        let err = Frame::decode(text.as_bytes(), Direction::CoreToRuntime).unwrap_err();
        assert_eq!(err.code(), "unknown_field");
    }
}
