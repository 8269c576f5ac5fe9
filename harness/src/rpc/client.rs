//! The harness as the client of a target's gRPC service (engine side `daemon`, plugin
//! side `plugin`): the call frames of [`super::frames`] turned into calls on a
//! [`GrpcLink`] with the side's credential, raw bytes on a fresh connection, and the
//! events of every call as frames, in arrival order.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use serde_json::{Value, json};

use super::frames::RpcService;
use crate::drive::{Connection, Event, FailureCode, NoOther, Outgoing, StepError, StepResult};
use crate::transport::grpc::{self, CallSpec, GrpcLink};

/// How long a raw-bytes connection waits for the target to close it.
const RAW_WAIT: Duration = Duration::from_secs(5);

/// The harness as the client of the target's service: the channel, the credential every
/// call presents (`auth: token`), and raw-bytes outcomes not yet read.
pub struct ClientLink {
    /// The calls in flight.
    pub grpc: GrpcLink,
    /// The target's socket.
    pub socket: PathBuf,
    /// The service the calls name.
    pub service: &'static RpcService,
    /// The credential of `authorization: Bearer <credential>` (`auth: token`).
    pub credential: String,
    raw: std::collections::VecDeque<Value>,
    /// The run's end was signalled ([`Connection::send_close`]): once nothing is
    /// queued, the connection ends and reads as [`Event::Eof`].
    closing: bool,
}

impl ClientLink {
    /// A link to `socket` whose calls name `service` and present `credential`.
    pub fn new(socket: &Path, service: &'static RpcService, credential: String) -> Self {
        Self {
            grpc: GrpcLink::new(socket),
            socket: socket.to_path_buf(),
            service,
            credential,
            raw: VecDeque::new(),
            closing: false,
        }
    }

    /// The next event of any call within `timeout` ([`crate::drive::Peer::recv`]).
    pub async fn recv(&mut self, timeout: Duration) -> Option<Event<NoOther>> {
        if let Some(raw) = self.raw.pop_front() {
            return Some(Event::Text(raw.to_string()));
        }
        if self.closing {
            // Events already delivered to the queue are read; then the connection ends.
            tokio::task::yield_now().await;
            return Some(match self.grpc.rx.try_recv() {
                Ok(event) => Event::Text(event.frame().to_string()),
                Err(_) => {
                    self.grpc.abort();
                    self.closing = false;
                    Event::Eof
                }
            });
        }
        match tokio::time::timeout(timeout, self.grpc.next()).await {
            Ok(Some(event)) => Some(Event::Text(event.frame().to_string())),
            Err(_) | Ok(None) => None,
        }
    }

    /// Starts or changes a call; a paused call's receiver of [`grpc::GrpcLink::start`].
    fn call(&mut self, frame: &Value) -> StepResult<Option<tokio::sync::oneshot::Receiver<()>>> {
        let invalid = |m: String| StepError::new(FailureCode::ScenarioInvalid, m);
        let name = frame
            .get("call")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if frame.get("cancel").is_some() {
            self.grpc.cancel(&name);
            return Ok(None);
        }
        let reading = match frame.get("read").and_then(Value::as_str) {
            None | Some("read") => grpc::Reading::Read,
            Some("paused") => grpc::Reading::Paused,
            Some("discard") => grpc::Reading::Discard,
            Some(other) => return Err(invalid(format!("unknown `read: {other}`"))),
        };
        if frame.get("method").is_none() {
            // `{call, read}`: how an in-flight call is read from now on.
            return if self.grpc.set_reading(&name, reading) {
                Ok(None)
            } else {
                Err(StepError::new(
                    FailureCode::TransportFailed,
                    format!("call `{name}` is not in flight"),
                ))
            };
        }
        let method_name = frame
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let method = grpc::method((self.service.pool)(), self.service.name, method_name)
            .ok_or_else(|| invalid(format!("unknown method `{method_name}`")))?;
        let payload = match (frame.get("request"), frame.get("request_base64")) {
            (_, Some(Value::String(b64))) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| invalid(format!("`request_base64`: {e}")))?,
            (Some(request), _) => grpc::from_json(method.input(), request).map_err(|e| {
                invalid(format!(
                    "`request` is not a {}: {e}",
                    method.input().full_name()
                ))
            })?,
            _ => Vec::new(),
        };
        let payload = match frame.get("request_size") {
            None => payload,
            Some(size) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .ok_or_else(|| invalid("`request_size` must be a byte count".into()))?;
                pad_to(payload, size).map_err(invalid)?
            }
        };
        let mut metadata = Vec::new();
        match frame.get("auth").and_then(Value::as_str).unwrap_or("token") {
            "none" => {}
            "wrong" => metadata.push((
                "authorization".to_string(),
                format!("Bearer {}", "0".repeat(self.credential.len().max(1))),
            )),
            _ => metadata.push((
                "authorization".to_string(),
                format!("Bearer {}", self.credential),
            )),
        }
        if let Some(Value::Object(extra)) = frame.get("metadata") {
            for (k, v) in extra {
                metadata.push((k.clone(), v.as_str().unwrap_or_default().to_string()));
            }
        }
        let timeout = frame
            .get("timeout_ms")
            .and_then(Value::as_u64)
            .map(Duration::from_millis);
        self.grpc
            .start(CallSpec {
                call: name,
                method,
                payload,
                metadata,
                timeout,
                reading,
            })
            .map_err(|e| StepError::new(FailureCode::TransportFailed, e))
    }
}

/// The field number of the padding [`pad_to`] appends: one no message of ours defines.
pub const PADDING_FIELD: u32 = 15_000;

fn varint_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

/// `payload` with one unknown length-delimited field ([`PADDING_FIELD`]) appended so the
/// encoded message is exactly `size` bytes: a request at a byte bound, and one past it,
/// whatever its fields ("Additive optional fields are tolerated").
///
/// # Errors
/// `size` leaves no room for the padding field after `payload`.
pub fn pad_to(mut payload: Vec<u8>, size: usize) -> Result<Vec<u8>, String> {
    let tag = (PADDING_FIELD << 3 | 2) as usize;
    let room = size
        .checked_sub(payload.len() + varint_len(tag))
        .ok_or_else(|| {
            format!(
                "`request_size` {size} is below the request's own {} bytes plus padding",
                payload.len()
            )
        })?;
    let len = (0..=room)
        .rev()
        .find(|len| len + varint_len(*len) == room)
        .ok_or_else(|| format!("`request_size` {size} cannot be reached with one padding field"))?;
    for mut n in [tag, len] {
        while n >= 0x80 {
            payload.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        payload.push(n as u8);
    }
    payload.resize(payload.len() + len, b'p');
    Ok(payload)
}

#[async_trait]
impl Connection for ClientLink {
    fn is_open(&self) -> bool {
        self.grpc.is_open()
    }

    fn abort(&mut self) -> bool {
        self.grpc.abort()
    }

    async fn send(&mut self, message: Outgoing, timeout: Duration) -> StepResult {
        match message {
            Outgoing::Text(text) => {
                let frame: Value = serde_json::from_str(&text).map_err(|e| {
                    StepError::new(FailureCode::ScenarioInvalid, format!("a client frame: {e}"))
                })?;
                let Some(answered) = self.call(&frame)? else {
                    return Ok(());
                };
                // A stalled reader's call is on a connection of its own: the next step
                // must not reach the target before this request did.
                match tokio::time::timeout(timeout, answered).await {
                    Ok(_) => Ok(()),
                    Err(_) => Err(StepError::new(
                        FailureCode::Timeout,
                        "the paused call was not answered (no headers, no status) within the step deadline",
                    )),
                }
            }
            Outgoing::Binary(bytes) | Outgoing::TextBytes(bytes) => {
                let outcome = grpc::poke_raw(&self.socket, &bytes, RAW_WAIT)
                    .await
                    .map_err(|e| StepError::new(FailureCode::TransportFailed, e))?;
                self.raw.push_back(json!({
                    "call": "raw",
                    "raw": {"goaway": outcome.goaway, "closed": outcome.closed},
                }));
                Ok(())
            }
        }
    }

    /// Every call's request is complete when it is sent (unary and server-streaming
    /// methods), so the end of the run ends the connection: what is still queued is read
    /// first (and fails the run as trailing output), then the channel is dropped.
    async fn send_close(&mut self, _code: u16, _reason: &str, _timeout: Duration) -> StepResult {
        self.closing = true;
        Ok(())
    }

    async fn end(&mut self, _timeout: Duration) {
        self.grpc.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::engine::codec::{SERVICE, pool};

    #[test]
    fn padding_reaches_exactly_the_size_asked_and_decodes_as_an_unknown_field() {
        let health = grpc::method(pool(), SERVICE, "Health").unwrap();
        let start = grpc::method(pool(), SERVICE, "StartRun").unwrap();
        let request = grpc::from_json(start.input(), &json!({"initialMessage": "hi"})).unwrap();
        // Every size across the varint boundaries of the padding's length.
        for size in [10, 127, 128, 129, 130, 16_384, 16_389, 4_194_304, 4_194_305] {
            let padded = pad_to(request.clone(), size).unwrap();
            assert_eq!(padded.len(), size, "{size}");
            let back = grpc::to_json(start.input(), &padded).unwrap();
            assert_eq!(back, json!({"initialMessage": "hi"}), "{size}");
        }
        let empty = pad_to(Vec::new(), 4_194_304).unwrap();
        assert_eq!(empty.len(), 4_194_304);
        assert_eq!(grpc::to_json(health.input(), &empty).unwrap(), json!({}));
        assert!(pad_to(request, 3).is_err());
    }
}
