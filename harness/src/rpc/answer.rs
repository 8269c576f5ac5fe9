//! Answers the harness gives as the **server** of a gRPC family (engine side `client`,
//! plugin side `host`): a scenario frame `{call, message}` (the proto3 JSON mapping of the
//! method's output), `{call, message_base64}` (raw payload bytes: unknown fields or a
//! malformed message on purpose) or `{call, status: {code, message?, trailers?}}` (the
//! call's end), sent on a call of a [`GrpcServer`](crate::transport::grpc_server::GrpcServer).
//!
//! This module only encodes and sends; the server owns the calls and the driver decides
//! every answer.

use base64::Engine as _;
use prost_reflect::MethodDescriptor;
use serde_json::Value;

use crate::drive::{FailureCode, Outgoing, StepError, StepResult, fail};
use crate::transport::grpc::{self, CODE_NAMES};
use crate::transport::grpc_server::Answerer;

fn code_named(name: &str) -> Option<tonic::Code> {
    (0..CODE_NAMES.len() as i32)
        .map(tonic::Code::from_i32)
        .find(|c| grpc::code_name(*c) == name)
}

/// The status of a `{call, status}` frame (`None`: `OK` without trailers).
///
/// # Errors
/// An unknown code name, or trailers that are not printable ASCII text.
pub fn status_of(status: &Value) -> Result<Option<tonic::Status>, String> {
    let name = status.get("code").and_then(Value::as_str).unwrap_or("OK");
    let code = code_named(name).ok_or_else(|| format!("unknown status code `{name}`"))?;
    let message = status.get("message").and_then(Value::as_str).unwrap_or("");
    let mut metadata = tonic::metadata::MetadataMap::new();
    if let Some(trailers) = status.get("trailers") {
        let Value::Object(map) = trailers else {
            return Err("`trailers` must map names to text".into());
        };
        for (k, v) in map {
            let key = tonic::metadata::AsciiMetadataKey::from_bytes(k.as_bytes())
                .map_err(|_| format!("`{k}` is not a metadata name"))?;
            let value = v
                .as_str()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("trailer `{k}` must be printable ASCII text"))?;
            metadata.insert(key, value);
        }
    }
    if code == tonic::Code::Ok && metadata.is_empty() {
        return Ok(None);
    }
    Ok(Some(tonic::Status::with_metadata(code, message, metadata)))
}

/// Sends the answer `frame` on its call, through `server`. `adjust` may complete a `message`
/// (in the JSON mapping) before it is encoded, given the call's method.
///
/// # Errors
/// A frame of another shape or a message that does not encode (`scenario_invalid`); a
/// call that is not in flight (`transport_failed`).
pub async fn answer(
    server: &Answerer,
    frame: &Value,
    adjust: impl FnOnce(&MethodDescriptor, &mut Value),
) -> StepResult {
    let invalid = |m: String| StepError::new(FailureCode::ScenarioInvalid, m);
    let call = frame
        .get("call")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("an answer names its `call`".into()))?;
    let in_flight = |e: String| StepError::new(FailureCode::TransportFailed, e);
    if let Some(status) = frame.get("status") {
        let status = status_of(status).map_err(invalid)?;
        return server.finish(call, status).await.map_err(in_flight);
    }
    let payload = match (frame.get("message"), frame.get("message_base64")) {
        (_, Some(Value::String(b64))) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| invalid(format!("`message_base64`: {e}")))?,
        (Some(message), _) => {
            let method = server.method(call).ok_or_else(|| {
                in_flight(format!(
                    "call `{call}` is not in flight (it ended, or was never made)"
                ))
            })?;
            let mut message = message.clone();
            adjust(&method, &mut message);
            grpc::from_json(method.output(), &message).map_err(|e| {
                invalid(format!(
                    "`message` is not a {}: {e}",
                    method.output().full_name()
                ))
            })?
        }
        _ => {
            return Err(invalid(
                "an answer is {call, message}, {call, message_base64} or {call, status}".into(),
            ));
        }
    };
    server.message(call, payload).await.map_err(in_flight)
}

/// The answer frame a scripted party sends (`Outgoing::Text`); `party` names it in
/// errors (`a daemon frame`).
///
/// # Errors
/// Text that is not JSON (`scenario_invalid`); raw bytes (`send_bytes` is not a step of a
/// server: malformed answers are `message_base64`).
pub fn answer_frame(message: Outgoing, party: &str) -> Result<Value, StepError> {
    match message {
        Outgoing::Text(text) => serde_json::from_str(&text)
            .map_err(|e| StepError::new(FailureCode::ScenarioInvalid, format!("{party}: {e}"))),
        Outgoing::Binary(_) | Outgoing::TextBytes(_) => Err(fail::unsupported(format!(
            "`send_bytes` is not a step where the harness answers calls ({party}: answer with `message_base64`)"
        ))),
    }
}
