//! gRPC over a Unix socket for RPC families, with dynamic messages: the harness calls a
//! method by its full name with a request written in the proto3 JSON mapping, and sees
//! every response message (in the same mapping) and the final status with its trailers
//! as separate events, from any number of concurrent calls, in arrival order.
//!
//! Messages are encoded and decoded with `prost-reflect` from the family's descriptor
//! pool (built from the same `.proto` files the implementation compiles), so the harness
//! never hand-copies a schema. A raw payload (`request_base64`) goes out as it is:
//! unknown fields and malformed protobuf on purpose.
//!
//! [`poke_raw`] writes raw bytes on a fresh connection (malformed HTTP/2) and reports
//! how the server ended it.
//!
//! This module owns calls and their events; it never matches or records.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Buf, BufMut};
use hyper_util::rt::TokioIo;
use prost::Message;
use prost_reflect::{DescriptorPool, DeserializeOptions, DynamicMessage, MethodDescriptor};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

/// Events a channel may queue before calls wait for the harness to read.
pub const EVENT_QUEUE_MAX: usize = 4_096;

/// A raw-bytes codec: tonic frames and deframes, the harness does the protobuf.
#[derive(Debug, Clone, Default)]
pub struct RawCodec;

/// [`RawCodec`]'s two halves.
#[derive(Debug, Clone, Default)]
pub struct RawHalf;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawHalf;
    type Decoder = RawHalf;
    fn encoder(&mut self) -> RawHalf {
        RawHalf
    }
    fn decoder(&mut self) -> RawHalf {
        RawHalf
    }
}

impl Encoder for RawHalf {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawHalf {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let mut out = vec![0; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// One outgoing call.
#[derive(Debug, Clone)]
pub struct CallSpec {
    /// The scenario's name for the call (`c1`).
    pub call: String,
    /// The method, e.g. `engine.v1.EngineService/StartRun` resolved from its short name.
    pub method: MethodDescriptor,
    /// The encoded request.
    pub payload: Vec<u8>,
    /// Metadata to send (the authorization entry among them).
    pub metadata: Vec<(String, String)>,
    /// The call's deadline (`grpc-timeout`), if any.
    pub timeout: Option<Duration>,
    /// How its responses are read from the start ([`Reading::Paused`]: on a connection
    /// of its own, so the stall holds only this stream's flow-control window).
    pub reading: Reading,
}

/// How the harness reads a call's responses: a slow reader is scripted by pausing a
/// stream and later draining it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reading {
    /// Every message is an event, as it arrives.
    #[default]
    Read,
    /// Nothing is read: HTTP/2 flow control stops the server once the window is full.
    Paused,
    /// Messages are read and dropped; when the call ends, one
    /// [`CallEvent::Discarded`] names the last event sequence read, then its status.
    Discard,
}

/// What a call did.
#[derive(Debug, Clone, PartialEq)]
pub enum CallEvent {
    /// A [`Reading::Discard`] call ended: the last `event.sequence` among the messages
    /// read and dropped (`None`: no event message came).
    Discarded {
        /// The call.
        call: String,
        /// The last sequence read, in the JSON mapping (a string).
        last_sequence: Option<String>,
    },
    /// A response message in the proto3 JSON mapping.
    Message {
        /// The call.
        call: String,
        /// The message.
        message: Value,
    },
    /// The final status, with its trailers (reserved entries left out).
    Status {
        /// The call.
        call: String,
        /// `OK`, `NOT_FOUND`, … (the canonical upper-case name).
        code: String,
        /// The status message.
        message: String,
        /// Trailer entries (lower-case names, text values).
        trailers: serde_json::Map<String, Value>,
    },
}

impl CallEvent {
    /// The event as the frame a scenario writes: `{call, message}` or
    /// `{call, status: {code, message?, trailers?}}`.
    pub fn frame(&self) -> Value {
        match self {
            CallEvent::Discarded {
                call,
                last_sequence,
            } => json!({"call": call, "discarded": {"lastSequence": last_sequence}}),
            CallEvent::Message { call, message } => json!({"call": call, "message": message}),
            CallEvent::Status {
                call,
                code,
                message,
                trailers,
            } => {
                let mut status = serde_json::Map::new();
                status.insert("code".into(), json!(code));
                if !message.is_empty() {
                    status.insert("message".into(), json!(message));
                }
                if !trailers.is_empty() {
                    status.insert("trailers".into(), Value::Object(trailers.clone()));
                }
                json!({"call": call, "status": status})
            }
        }
    }
}

/// The canonical name of a status code.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Every canonical status code name.
pub const CODE_NAMES: &[&str] = &[
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// A message in the proto3 JSON mapping: the implementation's one converter.
pub use contract_impl::engine::json::bytes_to_json as to_json;

/// Encodes `value` (proto3 JSON) as `descriptor`'s message. Unknown JSON fields are
/// refused: a scenario sends unknown fields as a raw payload.
///
/// # Errors
/// The value does not fit the message.
pub fn from_json(
    descriptor: prost_reflect::MessageDescriptor,
    value: &Value,
) -> Result<Vec<u8>, String> {
    let text = value.to_string();
    let mut de = serde_json::Deserializer::from_str(&text);
    let message = DynamicMessage::deserialize_with_options(
        descriptor,
        &mut de,
        &DeserializeOptions::new().deny_unknown_fields(true),
    )
    .map_err(|e| e.to_string())?;
    Ok(message.encode_to_vec())
}

/// Finds `method` (`Initialize`, or `engine.v1.EngineService/Initialize`) in `service`.
pub fn method(pool: &DescriptorPool, service: &str, method: &str) -> Option<MethodDescriptor> {
    let name = method.rsplit('/').next().unwrap_or(method);
    pool.get_service_by_name(service)?
        .methods()
        .find(|m| m.name() == name)
}

/// A channel to a Unix socket and its calls.
pub struct GrpcLink {
    socket: PathBuf,
    channel: Option<Channel>,
    calls: HashMap<String, tokio::task::JoinHandle<()>>,
    readers: HashMap<String, tokio::sync::watch::Sender<Reading>>,
    tx: mpsc::Sender<CallEvent>,
    /// Events of every call, in arrival order.
    pub rx: mpsc::Receiver<CallEvent>,
}

impl std::fmt::Debug for GrpcLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GrpcLink({}, {} calls)",
            self.socket.display(),
            self.calls.len()
        )
    }
}

/// Connects lazily to `socket`, naming the authority `localhost`.
///
/// # Errors
/// The endpoint cannot be built.
pub fn channel(socket: &Path) -> Result<Channel, String> {
    connect_lazy(
        socket,
        Endpoint::try_from("http://localhost").map_err(|e| e.to_string())?,
    )
}

/// The HTTP/2 flow-control window of a stalled reader's connection, in bytes: the
/// protocol's initial window (RFC 9113, 6.9.2), not the megabytes an ordinary client
/// grants, so that a reader that reads nothing stops the sender after this much and a
/// scenario's stall does not depend on how fast the sender's events are small enough
/// to fit a large window.
pub const STALLED_WINDOW_BYTES: u32 = 65_535;

/// A channel whose connection and stream windows are [`STALLED_WINDOW_BYTES`] (a
/// `read: paused` call's connection of its own).
///
/// # Errors
/// The endpoint cannot be built.
pub fn stalled_channel(socket: &Path) -> Result<Channel, String> {
    let endpoint = Endpoint::try_from("http://localhost")
        .map_err(|e| e.to_string())?
        .initial_stream_window_size(STALLED_WINDOW_BYTES)
        .initial_connection_window_size(STALLED_WINDOW_BYTES);
    connect_lazy(socket, endpoint)
}

fn connect_lazy(socket: &Path, endpoint: Endpoint) -> Result<Channel, String> {
    let socket = socket.to_path_buf();
    Ok(
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        })),
    )
}

impl GrpcLink {
    /// A link to `socket` (not connected yet).
    pub fn new(socket: &Path) -> Self {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE_MAX);
        Self {
            socket: socket.to_path_buf(),
            channel: None,
            calls: HashMap::new(),
            readers: HashMap::new(),
            tx,
            rx,
        }
    }

    /// Whether a channel is open.
    pub fn is_open(&self) -> bool {
        self.channel.is_some()
    }

    /// Drops the channel and every call in flight (the server sees the connection end).
    pub fn abort(&mut self) -> bool {
        for (_, task) in self.calls.drain() {
            task.abort();
        }
        self.channel.take().is_some()
    }

    /// Cancels call `call` (RST_STREAM CANCEL); `false` when it is not in flight.
    pub fn cancel(&mut self, call: &str) -> bool {
        match self.calls.remove(call) {
            Some(task) => {
                let running = !task.is_finished();
                task.abort();
                running
            }
            None => false,
        }
    }

    /// Forgets call `call` once its final status was read (its name may be used again).
    pub fn finished(&mut self, call: &str) {
        self.calls.remove(call);
        self.readers.remove(call);
    }

    /// Changes how call `call`'s responses are read; `false` when it is not in flight.
    pub fn set_reading(&mut self, call: &str, reading: Reading) -> bool {
        match self.readers.get(call) {
            Some(tx) if self.calls.get(call).is_some_and(|t| !t.is_finished()) => {
                tx.send_replace(reading);
                true
            }
            _ => false,
        }
    }

    /// Reads the next event, forgetting a call whose final status it is.
    pub async fn next(&mut self) -> Option<CallEvent> {
        let event = self.rx.recv().await?;
        if let CallEvent::Status { call, .. } = &event {
            self.calls.remove(call);
            self.readers.remove(call);
        }
        Some(event)
    }

    /// Starts `spec`; its events arrive on [`Self::rx`].
    ///
    /// # Errors
    /// The channel cannot be built, or the call name is in flight already.
    /// A `read: paused` call also returns a receiver that fires once the target answered
    /// the call's headers (or the call ended): the target has taken the request, so the
    /// scenario's next step cannot overtake it on the other connection.
    pub fn start(
        &mut self,
        spec: CallSpec,
    ) -> Result<Option<tokio::sync::oneshot::Receiver<()>>, String> {
        if self.calls.contains_key(&spec.call) {
            return Err(format!("call `{}` is still in flight", spec.call));
        }
        let channel = if spec.reading == Reading::Paused {
            // Its stalled window must not hold the other calls' connection.
            stalled_channel(&self.socket)?
        } else {
            if self.channel.is_none() {
                self.channel = Some(channel(&self.socket)?);
            }
            self.channel.clone().ok_or("no channel")?
        };
        let tx = self.tx.clone();
        let name = spec.call.clone();
        let (answered_tx, answered) = tokio::sync::oneshot::channel();
        let answered = (spec.reading == Reading::Paused).then_some(answered);
        let (reading, mode) = tokio::sync::watch::channel(spec.reading);
        let task = tokio::spawn(run_call(channel, spec, tx, mode, answered_tx));
        self.calls.insert(name.clone(), task);
        self.readers.insert(name, reading);
        Ok(answered)
    }
}

fn trailers(meta: &tonic::metadata::MetadataMap) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for kv in meta.iter() {
        if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = kv {
            let k = k.as_str();
            if k.starts_with("grpc-") || k == "content-type" || k == "date" {
                continue;
            }
            out.insert(k.to_string(), json!(v.to_str().unwrap_or_default()));
        }
    }
    out
}

fn status_event(call: &str, status: &tonic::Status) -> CallEvent {
    CallEvent::Status {
        call: call.to_string(),
        code: code_name(status.code()).to_string(),
        message: status.message().to_string(),
        trailers: trailers(status.metadata()),
    }
}

/// Runs one call, sending each event as it happens (a streaming call's messages never
/// wait for its end).
async fn run_call(
    channel: Channel,
    spec: CallSpec,
    tx: mpsc::Sender<CallEvent>,
    mut mode: tokio::sync::watch::Receiver<Reading>,
    answered: tokio::sync::oneshot::Sender<()>,
) {
    let call = spec.call.clone();
    let mut grpc = tonic::client::Grpc::new(channel);
    if let Err(e) = grpc.ready().await {
        let _ = tx
            .send(CallEvent::Status {
                call,
                code: "UNAVAILABLE".into(),
                message: format!("the connection failed: {e}"),
                trailers: serde_json::Map::new(),
            })
            .await;
        return;
    }
    let mut request = tonic::Request::new(spec.payload);
    for (k, v) in &spec.metadata {
        if let (Ok(k), Ok(v)) = (
            k.parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>(),
            v.parse(),
        ) {
            request.metadata_mut().insert(k, v);
        }
    }
    if let Some(t) = spec.timeout {
        request.set_timeout(t);
    }
    let path = format!(
        "/{}/{}",
        spec.method.parent_service().full_name(),
        spec.method.name()
    );
    let Ok(path) = path.parse::<http::uri::PathAndQuery>() else {
        return;
    };
    let output = spec.method.output();
    let response = grpc.server_streaming(request, path, RawCodec).await;
    // The headers (or the status) came: the target has taken the request.
    let _ = answered.send(());
    let mut stream = match response {
        Ok(r) => r.into_inner(),
        Err(status) => {
            let _ = tx.send(status_event(&call, &status)).await;
            return;
        }
    };
    let mut last_sequence: Option<String> = None;
    loop {
        // A paused call reads nothing until the scenario resumes or drains it.
        let discard = match mode.wait_for(|m| *m != Reading::Paused).await {
            Ok(m) => *m == Reading::Discard,
            Err(_) => return,
        };
        let received = stream.message().await;
        if discard && matches!(received, Ok(None) | Err(_)) {
            let summary = CallEvent::Discarded {
                call: call.clone(),
                last_sequence: last_sequence.take(),
            };
            if tx.send(summary).await.is_err() {
                return;
            }
        }
        let event = match received {
            Ok(Some(bytes)) => match to_json(output.clone(), &bytes) {
                Ok(message) if discard => {
                    if let Some(seq) = message.pointer("/event/sequence").and_then(Value::as_str) {
                        last_sequence = Some(seq.to_string());
                    }
                    continue;
                }
                Ok(message) => CallEvent::Message {
                    call: call.clone(),
                    message,
                },
                Err(e) => {
                    let _ = tx
                        .send(CallEvent::Status {
                            call: call.clone(),
                            code: "HARNESS_DECODE_FAILED".into(),
                            message: format!(
                                "a response that is not a {}: {e}",
                                output.full_name()
                            ),
                            trailers: serde_json::Map::new(),
                        })
                        .await;
                    return;
                }
            },
            Ok(None) => {
                let trailers = match stream.trailers().await {
                    Ok(Some(t)) => trailers(&t),
                    _ => serde_json::Map::new(),
                };
                let _ = tx
                    .send(CallEvent::Status {
                        call: call.clone(),
                        code: "OK".into(),
                        message: String::new(),
                        trailers,
                    })
                    .await;
                return;
            }
            Err(status) => {
                let _ = tx.send(status_event(&call, &status)).await;
                return;
            }
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
}

/// How a server ended a connection that carried raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawOutcome {
    /// The GOAWAY error code name, if the server sent one.
    pub goaway: Option<String>,
    /// Whether the server closed the connection within the time allowed.
    pub closed: bool,
}

fn h2_error_name(code: u32) -> String {
    match code {
        0 => "NO_ERROR",
        1 => "PROTOCOL_ERROR",
        2 => "INTERNAL_ERROR",
        3 => "FLOW_CONTROL_ERROR",
        4 => "SETTINGS_TIMEOUT",
        5 => "STREAM_CLOSED",
        6 => "FRAME_SIZE_ERROR",
        7 => "REFUSED_STREAM",
        8 => "CANCEL",
        9 => "COMPRESSION_ERROR",
        10 => "CONNECT_ERROR",
        11 => "ENHANCE_YOUR_CALM",
        12 => "INADEQUATE_SECURITY",
        13 => "HTTP_1_1_REQUIRED",
        _ => return format!("0x{code:x}"),
    }
    .to_string()
}

/// Writes `bytes` on a fresh connection to `socket`, then reads until the server closes
/// it (at most `timeout`), noting a GOAWAY frame.
///
/// # Errors
/// The socket cannot be connected or written.
pub async fn poke_raw(
    socket: &Path,
    bytes: &[u8],
    timeout: Duration,
) -> Result<RawOutcome, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    stream.write_all(bytes).await.map_err(|e| e.to_string())?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let closed = tokio::time::timeout(timeout, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if seen.len() < 1 << 20 {
                        seen.extend_from_slice(&buf[..n]);
                    }
                }
            }
        }
    })
    .await
    .is_ok();
    // Frames: 3-byte length, type, flags, 4-byte stream ID, payload.
    let mut goaway = None;
    let mut at = 0;
    while at + 9 <= seen.len() {
        let len = (usize::from(seen[at]) << 16)
            | (usize::from(seen[at + 1]) << 8)
            | usize::from(seen[at + 2]);
        let kind = seen[at + 3];
        let payload = at + 9;
        if payload + len > seen.len() {
            break;
        }
        if kind == 0x7 && len >= 8 {
            let code = u32::from_be_bytes([
                seen[payload + 4],
                seen[payload + 5],
                seen[payload + 6],
                seen[payload + 7],
            ]);
            goaway = Some(h2_error_name(code));
        }
        at = payload + len;
    }
    Ok(RawOutcome { goaway, closed })
}
