//! The call frames of a gRPC family, as the harness writes and reads them when it is the
//! client of the target's service (engine side `daemon`, plugin side `plugin`). A frame is
//! one RPC event on a named call:
//!
//! * the client (the harness) writes `{call, method, request}` (the request in the proto3
//!   JSON mapping) or `{call, method, request_base64}` (raw payload bytes: unknown
//!   fields, malformed protobuf), with optional `auth` (`token`, default: the side's
//!   credential; `none`; `wrong`), `timeout_ms` (the call's deadline), `metadata` (extra
//!   entries), `request_size` (padded to exactly that many bytes) and `read`; or `{call,
//!   cancel: true}` (RST_STREAM CANCEL);
//! * the target emits `{call, message}` per response message (in the proto3 JSON
//!   mapping, decoded with the method's output type) and `{call, status: {code,
//!   message?, trailers?}}` once, at the call's end; raw bytes sent with `send_bytes`
//!   yield `{call: raw, raw: {goaway, closed}}`.
//!
//! Messages are checked against the family's descriptor pool, built from `proto/` (the
//! single definition the implementation compiles). This module never opens a socket.

use serde_json::Value;

use crate::drive::{Codec, WireFault};
use crate::transport::grpc::{self, CODE_NAMES};

/// A gRPC service a family's calls name.
#[derive(Debug)]
pub struct RpcService {
    /// Its full name (`engine.v1.EngineService`).
    pub name: &'static str,
    /// The descriptor pool holding it.
    pub pool: fn() -> &'static prost_reflect::DescriptorPool,
}

fn fault(code: &str, message: impl Into<String>) -> WireFault {
    WireFault {
        code: code.into(),
        message: message.into(),
    }
}

/// Whether `value` holds a placeholder or a `{$text: …}` anywhere (then it is encoded
/// only once bound and expanded).
pub fn has_placeholder(value: &Value) -> bool {
    match value {
        Value::String(s) => crate::bind::placeholder(s).is_some(),
        Value::Array(a) => a.iter().any(has_placeholder),
        Value::Object(o) if o.len() == 1 && o.contains_key("$text") => true,
        Value::Object(o) => o.values().any(has_placeholder),
        _ => false,
    }
}

/// Checks a client frame: its keys, the method, and (when no placeholder is left) that
/// the request encodes as the method's input.
///
/// # Errors
/// What is wrong, naming the key.
pub fn check_call(service: &RpcService, frame: &Value) -> Result<(), String> {
    let Value::Object(map) = frame else {
        return Err("a client frame is a mapping {call, method, request}".into());
    };
    match map.get("call") {
        Some(Value::String(c)) if !c.is_empty() => {}
        _ => return Err("`call` (the call's name) must be a non-empty string".into()),
    }
    if map.get("cancel").is_some() {
        if map.len() != 2 || map.get("cancel") != Some(&Value::Bool(true)) {
            return Err("a cancel frame is exactly {call, cancel: true}".into());
        }
        return Ok(());
    }
    let read = map.get("read");
    if let Some(r) = read
        && !matches!(r.as_str(), Some("read" | "paused" | "discard"))
    {
        return Err("`read` is `read`, `paused` or `discard`".into());
    }
    if read.is_some() && map.get("method").is_none() {
        if map.len() != 2 || read.and_then(Value::as_str) == Some("paused") {
            return Err(
                "a reading change is exactly {call, read: read|discard} on a call in flight".into(),
            );
        }
        return Ok(());
    }
    const KEYS: &[&str] = &[
        "call",
        "method",
        "request",
        "request_base64",
        "auth",
        "timeout_ms",
        "metadata",
        "request_size",
        "read",
    ];
    if let Some(k) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(format!("unknown key `{k}` (keys: {})", KEYS.join(", ")));
    }
    let Some(Value::String(name)) = map.get("method") else {
        return Err(format!(
            "`method` (a {} method) must be a string",
            service.name
        ));
    };
    let Some(method) = grpc::method((service.pool)(), service.name, name) else {
        let names: Vec<String> = (service.pool)()
            .get_service_by_name(service.name)
            .map(|s| s.methods().map(|m| m.name().to_string()).collect())
            .unwrap_or_default();
        return Err(format!(
            "unknown method `{name}` (methods: {})",
            names.join(", ")
        ));
    };
    match (map.get("request"), map.get("request_base64")) {
        (Some(_), Some(_)) => {
            return Err("`request` and `request_base64` exclude each other".into());
        }
        (Some(request), None) if !has_placeholder(request) => {
            grpc::from_json(method.input(), request)
                .map_err(|e| format!("`request` is not a {}: {e}", method.input().full_name()))?;
        }
        (None, Some(Value::String(_))) | (Some(_), None) | (None, None) => {}
        (None, Some(_)) => return Err("`request_base64` must be a string".into()),
    }
    match map.get("auth") {
        None => {}
        Some(Value::String(a)) if ["token", "none", "wrong"].contains(&a.as_str()) => {}
        // A pattern (`{$reference: token, …}`) where the frame is the target's call.
        Some(Value::Object(p)) if p.keys().all(|k| k.starts_with('$')) => {}
        Some(_) => return Err("`auth` is `token` (default), `none` or `wrong`".into()),
    }
    if let Some(n) = map.get("request_size")
        && n.as_u64().is_none()
    {
        return Err("`request_size` must be a byte count".into());
    }
    if let Some(t) = map.get("timeout_ms")
        && t.as_u64().is_none_or(|t| t == 0)
    {
        return Err("`timeout_ms` must be a positive integer".into());
    }
    if let Some(m) = map.get("metadata")
        && !m
            .as_object()
            .is_some_and(|m| m.values().all(Value::is_string))
    {
        return Err("`metadata` must map names to text".into());
    }
    Ok(())
}

/// Checks a daemon frame's shape.
///
/// # Errors
/// What is wrong.
pub fn check_event(frame: &Value) -> Result<(), String> {
    let Value::Object(map) = frame else {
        return Err("a daemon frame is a mapping {call, message} or {call, status}".into());
    };
    if !matches!(map.get("call"), Some(Value::String(_))) {
        return Err("`call` must be a string".into());
    }
    let kinds = ["message", "message_base64", "status", "raw", "discarded"]
        .iter()
        .filter(|k| map.contains_key(**k))
        .count();
    if kinds != 1 || map.len() != 2 {
        return Err(
            "a daemon frame is exactly {call, message}, {call, message_base64}, {call, status}, {call, raw} or {call, discarded}".into(),
        );
    }
    if let Some(b64) = map.get("message_base64")
        && !b64.is_string()
    {
        return Err("`message_base64` must be a string".into());
    }
    if let Some(status) = map.get("status") {
        let code = status.get("code").and_then(Value::as_str);
        match code {
            Some(c) if CODE_NAMES.contains(&c) => {}
            Some(c) if crate::bind::placeholder(c).is_some() => {}
            Some(c) => return Err(format!("unknown status code `{c}`")),
            None if status.is_object() => {}
            None => return Err("`status` must be a mapping {code, message?, trailers?}".into()),
        }
    }
    Ok(())
}

/// The codec of a side where the harness is the client of the target's service.
#[derive(Debug, Clone, Copy)]
pub struct RpcClientCodec {
    /// The service the calls name.
    pub service: &'static RpcService,
}

impl Codec for RpcClientCodec {
    fn decode(&self, text: &str) -> Result<Value, WireFault> {
        serde_json::from_str(text).map_err(|e| fault("invalid_json", e.to_string()))
    }

    fn check_emitted(&self, frame: &Value) -> Result<(), WireFault> {
        if frame.pointer("/status/code").and_then(Value::as_str) == Some("HARNESS_DECODE_FAILED") {
            return Err(fault(
                "undecodable_message",
                frame
                    .pointer("/status/message")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            ));
        }
        check_event(frame).map_err(|e| fault("invalid_frame", e))
    }

    fn check_outgoing(&self, frame: &Value) -> Result<(), WireFault> {
        check_call(self.service, frame).map_err(|e| fault("invalid_call", e))
    }

    fn encode(&self, frame: &Value) -> Result<String, WireFault> {
        serde_json::to_string(frame).map_err(|e| fault("invalid_value", e.to_string()))
    }

    fn may_trail(&self, _frame: &Value) -> bool {
        false
    }

    fn trailing_rule(&self) -> &'static str {
        "nothing may follow the last step: every message and status of every call is a step"
    }
}

/// The codec of a side where the harness is the **server** of the target's calls (engine
/// side `client`, plugin side `host`): the target's calls are the emitted frames
/// `{call, method, auth, request}`, the harness's answers are `{call, message |
/// message_base64 | status}`.
#[derive(Debug, Clone, Copy)]
pub struct RpcServerCodec {
    /// Checks an emitted call (keys, method, request) against the family's service.
    pub check_call: fn(&Value) -> Result<(), String>,
    /// When every call must present the target's credential (`auth: token`), the
    /// requirement that says so; `None` where the credential is the family's own
    /// encoding, asserted by scenarios as a reference value instead.
    pub token_rule: Option<&'static str>,
    /// Frames the target may emit after the last step.
    pub may_trail: fn(&Value) -> bool,
    /// Why nothing else may follow the last step.
    pub trailing_rule: &'static str,
}

impl Codec for RpcServerCodec {
    fn decode(&self, text: &str) -> Result<Value, WireFault> {
        serde_json::from_str(text).map_err(|e| fault("invalid_json", e.to_string()))
    }

    fn check_emitted(&self, frame: &Value) -> Result<(), WireFault> {
        if let Some(why) = frame.get("undecodable").and_then(Value::as_str) {
            return Err(fault(
                "undecodable_message",
                format!("the target's call cannot be read: {why}"),
            ));
        }
        if let Some(rule) = self.token_rule {
            match frame.get("auth").and_then(Value::as_str) {
                Some("token") => {}
                other => {
                    return Err(fault(
                        "unauthenticated_call",
                        format!(
                            "the call does not present the endpoint token in its gRPC \
                             metadata (auth: {}; {rule})",
                            other.unwrap_or("none")
                        ),
                    ));
                }
            }
        }
        (self.check_call)(frame).map_err(|e| fault("invalid_call", e))
    }

    fn check_outgoing(&self, frame: &Value) -> Result<(), WireFault> {
        check_event(frame).map_err(|e| fault("invalid_frame", e))
    }

    fn encode(&self, frame: &Value) -> Result<String, WireFault> {
        serde_json::to_string(frame).map_err(|e| fault("invalid_value", e.to_string()))
    }

    fn may_trail(&self, frame: &Value) -> bool {
        (self.may_trail)(frame)
    }

    fn trailing_rule(&self) -> &'static str {
        self.trailing_rule
    }
}
