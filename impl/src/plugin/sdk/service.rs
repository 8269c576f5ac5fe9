//! The SDK's `PluginService`: the host's proof on every call, one `Initialize`, the
//! immutable tool list, validated and bounded `Execute` streams, `Cancel` and `Drain`
//! (`plugin-protocol.md`, "Initial tool API", "Generation lifecycle").

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use super::{Call, Conventions, Launch, Plugin, ToolError, announce};
use crate::grpc::common::v1::ProtocolVersion;
use crate::grpc::size_status;
use crate::plugin::proto::v1::plugin_service_server::{PluginService, PluginServiceServer};
use crate::plugin::proto::v1::{
    CancelRequest, CancelResponse, DrainRequest, DrainResponse, ExecuteRequest, ExecuteResponse,
    FailureCode, InitializeRequest, InitializeResponse, ListToolsRequest, ListToolsResponse,
    PluginLimits, Progress, ToolFailure, ToolResult, execute_response,
};
use crate::plugin::wire::{
    AUTH_METADATA, MAX_CALL_ID_BYTES, MAX_CONCURRENT_CALLS, MAX_DRAIN_TIMEOUT_MS,
    MAX_FAILURE_TEXT_BYTES, MAX_MESSAGE_BYTES, MAX_PAYLOAD_BYTES, MAX_PROGRESS_MESSAGES,
    PROTOCOL_MAJOR, PROTOCOL_MINOR, check_call_id, clip, host_proof, is_secret_shaped,
    proofs_equal, secret_proof,
};
use crate::wire::strict::parse_strict;

/// Call IDs remembered for duplicate detection; the oldest is forgotten past it.
pub const REMEMBERED_CALL_IDS: usize = 65_536;

/// Progress messages buffered per call before the tool waits (backpressure).
const PROGRESS_BUFFER: usize = 16;

/// What `Initialize` settled.
#[derive(Debug, Clone, Copy)]
struct Negotiated {
    limits: PluginLimits,
}

struct InFlight {
    cancel: Arc<watch::Sender<bool>>,
}

struct State<P> {
    plugin: P,
    conventions: Conventions,
    secret: String,
    negotiated: Mutex<Option<Negotiated>>,
    calls: Mutex<HashMap<String, InFlight>>,
    used: Mutex<(HashSet<String>, VecDeque<String>)>,
    draining: watch::Sender<bool>,
    /// Signalled when the process should stop serving (drain complete or timed out).
    stop: watch::Sender<bool>,
}

/// The service.
pub struct Service<P> {
    state: Arc<State<P>>,
}

fn failure(call_id: &str, code: FailureCode, message: &str) -> ExecuteResponse {
    ExecuteResponse {
        call_id: call_id.to_string(),
        event: Some(execute_response::Event::Failure(ToolFailure {
            code: code as i32,
            message: clip(message, MAX_FAILURE_TEXT_BYTES).to_string(),
        })),
    }
}

type ExecuteStream = Pin<Box<dyn Stream<Item = Result<ExecuteResponse, Status>> + Send>>;

fn one(message: ExecuteResponse) -> Response<ExecuteStream> {
    Response::new(Box::pin(tokio_stream::once(Ok(message))))
}

impl<P: Plugin> State<P> {
    fn limits(&self) -> Result<PluginLimits, Status> {
        self.negotiated
            .lock()
            .map_err(|_| Status::internal("state lock poisoned"))?
            .map(|n| n.limits)
            .ok_or_else(|| {
                Status::new(
                    self.conventions.not_initialized,
                    "not_initialized: call Initialize first",
                )
            })
    }

    /// Whether `id` was already used by an accepted call.
    fn was_used(&self, id: &str) -> bool {
        self.used.lock().map(|u| u.0.contains(id)).unwrap_or(true)
    }

    /// Records `id` as used; `false` when it already was.
    fn claim(&self, id: &str) -> bool {
        let Ok(mut used) = self.used.lock() else {
            return false;
        };
        let (set, order) = &mut *used;
        if set.contains(id) {
            return false;
        }
        if order.len() == REMEMBERED_CALL_IDS
            && let Some(old) = order.pop_front()
        {
            set.remove(&old);
        }
        set.insert(id.to_string());
        order.push_back(id.to_string());
        true
    }

    fn in_flight(&self) -> usize {
        self.calls.lock().map(|c| c.len()).unwrap_or(0)
    }
}

#[tonic::async_trait]
impl<P: Plugin> PluginService for Service<P> {
    async fn initialize(
        &self,
        request: Request<InitializeRequest>,
    ) -> Result<Response<InitializeResponse>, Status> {
        let request = request.into_inner();
        let protocol = request.protocol.unwrap_or_default();
        if protocol.major != PROTOCOL_MAJOR {
            return Err(Status::new(
                self.state.conventions.incompatible_protocol,
                format!(
                    "incompatible_protocol: this plugin speaks major {PROTOCOL_MAJOR}, not {}",
                    protocol.major
                ),
            ));
        }
        if !is_secret_shaped(&request.challenge) {
            return Err(Status::invalid_argument(
                "invalid_challenge: the challenge is 64 lowercase hexadecimal characters",
            ));
        }
        let host = request.host_limits.unwrap_or_default();
        let bound = |host: u64, ours: u64| if host == 0 { ours } else { host.min(ours) };
        let limits = PluginLimits {
            max_payload_bytes: bound(host.max_payload_bytes, MAX_PAYLOAD_BYTES),
            max_progress_messages: bound(
                host.max_progress_messages.into(),
                MAX_PROGRESS_MESSAGES.into(),
            ) as u32,
            max_concurrent_calls: bound(
                host.max_concurrent_calls.into(),
                MAX_CONCURRENT_CALLS.into(),
            ) as u32,
        };
        {
            let mut negotiated = self
                .state
                .negotiated
                .lock()
                .map_err(|_| Status::internal("state lock poisoned"))?;
            if negotiated.is_some() {
                return Err(Status::new(
                    self.state.conventions.already_initialized,
                    "already_initialized: Initialize is accepted once per process",
                ));
            }
            *negotiated = Some(Negotiated { limits });
        }
        let plugin = &self.state.plugin;
        Ok(Response::new(InitializeResponse {
            protocol: Some(ProtocolVersion {
                major: PROTOCOL_MAJOR,
                // The lower of the two minors (ours is the lowest there is today).
                #[allow(clippy::unnecessary_min_or_max)]
                minor: protocol.minor.min(PROTOCOL_MINOR),
            }),
            plugin_build: Some(plugin.build()),
            manifest: Some(plugin.manifest()),
            tools: plugin.tools(),
            capabilities: plugin.capabilities(),
            limits: Some(limits),
            secret_proof: secret_proof(&self.state.secret, &request.challenge),
        }))
    }

    async fn list_tools(
        &self,
        _request: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        self.state.limits()?;
        Ok(Response::new(ListToolsResponse {
            tools: self.state.plugin.tools(),
        }))
    }

    type ExecuteStream = ExecuteStream;

    async fn execute(
        &self,
        request: Request<ExecuteRequest>,
    ) -> Result<Response<ExecuteStream>, Status> {
        let limits = self.state.limits()?;
        let request = request.into_inner();
        // An invalid call ID is echoed cut to its bound, so the refusal always fits.
        let id = clip(&request.call_id, MAX_CALL_ID_BYTES).to_string();
        for (field, value) in [
            ("call_id", &request.call_id),
            ("progress_token", &request.progress_token),
        ] {
            if let Err(e) = check_call_id(field, value) {
                let code = self.state.conventions.invalid_call;
                return Ok(one(failure(&id, code, &e.to_string())));
            }
        }
        if *self.state.draining.borrow() {
            return Ok(one(failure(
                &id,
                FailureCode::Draining,
                "draining: this process accepts no new call",
            )));
        }
        if self.state.was_used(&id) {
            return Ok(one(failure(
                &id,
                FailureCode::DuplicateCall,
                "duplicate_call: this call_id was already used in this process",
            )));
        }
        let Some(tool) = self
            .state
            .plugin
            .tools()
            .into_iter()
            .find(|t| t.name == request.tool)
        else {
            return Ok(one(failure(
                &id,
                FailureCode::UnknownTool,
                &format!("unknown_tool: no tool {:?}", clip(&request.tool, 80)),
            )));
        };
        if request.arguments_json.len() as u64 > limits.max_payload_bytes {
            return Ok(one(failure(
                &id,
                FailureCode::PayloadTooLarge,
                &format!(
                    "payload_too_large: the arguments are {} bytes; the bound is {}",
                    request.arguments_json.len(),
                    limits.max_payload_bytes
                ),
            )));
        }
        let arguments = match parse_strict(request.arguments_json.as_bytes()) {
            Ok(v) => v,
            Err(e) => {
                return Ok(one(failure(
                    &id,
                    FailureCode::InvalidArguments,
                    &format!("invalid_arguments: {e}"),
                )));
            }
        };
        let schema: serde_json::Value =
            serde_json::from_str(&tool.input_schema_json).unwrap_or_default();
        if let Err(e) = super::check_arguments(&schema, &arguments) {
            return Ok(one(failure(
                &id,
                FailureCode::InvalidArguments,
                &format!("invalid_arguments: {e}"),
            )));
        }
        let (cancel, cancel_rx) = watch::channel(false);
        let cancel = Arc::new(cancel);
        let cancel_on_drop = cancel.clone();
        {
            let mut calls = self
                .state
                .calls
                .lock()
                .map_err(|_| Status::internal("state lock poisoned"))?;
            // A drain that began while this call was validated counts the calls under
            // this lock: the call is refused rather than outliving the drain's bound.
            if *self.state.draining.borrow() {
                return Ok(one(failure(
                    &id,
                    FailureCode::Draining,
                    "draining: this process accepts no new call",
                )));
            }
            if calls.len() >= limits.max_concurrent_calls as usize {
                return Ok(one(failure(
                    &id,
                    FailureCode::Busy,
                    &format!(
                        "busy: {} calls are in flight (max_concurrent_calls)",
                        calls.len()
                    ),
                )));
            }
            // Only an accepted call uses up its ID: a host may retry a refused one.
            if !self.state.claim(&id) {
                return Ok(one(failure(
                    &id,
                    FailureCode::DuplicateCall,
                    "duplicate_call: this call_id was already used in this process",
                )));
            }
            calls.insert(id.clone(), InFlight { cancel });
        }
        let (tx, rx) = mpsc::channel(PROGRESS_BUFFER);
        let (progress_tx, mut progress_rx) = mpsc::channel::<(u64, String)>(PROGRESS_BUFFER);
        let call = Call {
            tool: tool.name.clone(),
            call_id: id.clone(),
            arguments,
            progress: progress_tx,
            sent: 0,
            max_progress: limits.max_progress_messages.into(),
            cancel: cancel_rx,
        };
        let state = self.state.clone();
        let tool_name = tool.name.clone();
        let token = request.progress_token;
        let max_output = limits.max_payload_bytes;
        tokio::spawn(async move {
            let run = state.plugin.execute(call);
            tokio::pin!(run);
            let mut dropped = false;
            // Progress is forwarded as it comes; the stream's reader paces the tool.
            let outcome = loop {
                tokio::select! {
                    biased;
                    () = tx.closed(), if !dropped => {
                        // The host dropped the stream (RST_STREAM): that cancels the call.
                        dropped = true;
                        cancel_on_drop.send_replace(true);
                    }
                    Some((sequence, message)) = progress_rx.recv() => {
                        let progress = ExecuteResponse {
                            call_id: id.clone(),
                            event: Some(execute_response::Event::Progress(Progress {
                                progress_token: token.clone(),
                                sequence,
                                message,
                            })),
                        };
                        if tx.send(Ok(progress)).await.is_err() {
                            dropped = true;
                            cancel_on_drop.send_replace(true);
                        }
                    }
                    outcome = &mut run => break outcome,
                }
            };
            // Progress sent before the outcome is delivered before the terminal message.
            while let Ok((sequence, message)) = progress_rx.try_recv() {
                let _ = tx
                    .send(Ok(ExecuteResponse {
                        call_id: id.clone(),
                        event: Some(execute_response::Event::Progress(Progress {
                            progress_token: token.clone(),
                            sequence,
                            message,
                        })),
                    }))
                    .await;
            }
            let terminal = match outcome {
                Ok(output) => {
                    let text = state.plugin.spell(&tool_name, &output);
                    if text.len() as u64 > max_output {
                        failure(
                            &id,
                            FailureCode::PayloadTooLarge,
                            &format!(
                                "payload_too_large: the output is {} bytes; the bound is {max_output}",
                                text.len()
                            ),
                        )
                    } else {
                        ExecuteResponse {
                            call_id: id.clone(),
                            event: Some(execute_response::Event::Result(ToolResult {
                                output_json: text,
                            })),
                        }
                    }
                }
                Err(ToolError { code, message }) => failure(&id, code, &message),
            };
            // The slot is free before the host can see the terminal message, so a host
            // that waited for it never meets `BUSY` from this call.
            if let Ok(mut calls) = state.calls.lock() {
                calls.remove(&id);
            }
            let _ = tx.send(Ok(terminal)).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn cancel(
        &self,
        request: Request<CancelRequest>,
    ) -> Result<Response<CancelResponse>, Status> {
        self.state.limits()?;
        let id = request.into_inner().call_id;
        let in_flight = self
            .state
            .calls
            .lock()
            .map_err(|_| Status::internal("state lock poisoned"))?
            .get(&id)
            .map(|c| c.cancel.send_replace(true))
            .is_some();
        Ok(Response::new(CancelResponse { in_flight }))
    }

    async fn drain(
        &self,
        request: Request<DrainRequest>,
    ) -> Result<Response<DrainResponse>, Status> {
        self.state.limits()?;
        let timeout_ms = request.into_inner().timeout_ms;
        if !(1..=MAX_DRAIN_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(Status::new(
                self.state.conventions.invalid_drain_timeout,
                format!(
                    "invalid_timeout: timeout_ms is 1 to {MAX_DRAIN_TIMEOUT_MS}, not {timeout_ms}"
                ),
            ));
        }
        // Counted and flagged under the calls lock, so no call slips in between.
        let (in_flight, first) = {
            let calls = self
                .state
                .calls
                .lock()
                .map_err(|_| Status::internal("state lock poisoned"))?;
            (calls.len(), !self.state.draining.send_replace(true))
        };
        if first {
            let state = self.state.clone();
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
                while state.in_flight() > 0 && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                // Past the timeout the calls still in flight are cancelled; their
                // streams end with their one terminal message before the process exits.
                if let Ok(calls) = state.calls.lock() {
                    for c in calls.values() {
                        c.cancel.send_replace(true);
                    }
                }
                state.stop.send_replace(true);
            });
        }
        Ok(Response::new(DrainResponse {
            in_flight: u32::try_from(in_flight).unwrap_or(u32::MAX),
        }))
    }
}

/// Checks the host's proof on every call before its payload is decoded.
#[derive(Clone)]
struct HostProof(Arc<String>, tonic::Code);

impl tonic::service::Interceptor for HostProof {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let presented = request
            .metadata()
            .get(AUTH_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::wire::bearer::bearer_credential_str);
        match presented {
            Some(proof) if proofs_equal(proof, &self.0) => Ok(request),
            Some(_) => Err(Status::new(
                self.1,
                "proof_mismatch: the call's host proof is not this launch's",
            )),
            None => Err(Status::new(
                self.1,
                "proof_missing: the call carries no host proof (`authorization: Bearer <proof>`)",
            )),
        }
    }
}

/// Longest a drained process waits for its streams to flush before it exits.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// Serves `plugin` on `launch.socket`: binds it (0600), announces readiness, and serves
/// until stdin ends (the host is gone) or a drain ends.
///
/// # Errors
/// The socket cannot be bound or the handshake line cannot be written.
pub async fn serve_on(plugin: impl Plugin, launch: Launch) -> Result<(), String> {
    let socket = launch.socket.clone();
    // Created 0600 (no window with the umask's mode), then set again for certainty.
    let previous = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(&socket);
    nix::sys::stat::umask(previous);
    let listener = bound.map_err(|e| format!("binding {}: {e}", socket.display()))?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let (stop, mut stopped) = watch::channel(false);
    let conventions = plugin.conventions();
    let state = Arc::new(State {
        plugin,
        conventions,
        negotiated: Mutex::new(None),
        calls: Mutex::new(HashMap::new()),
        used: Mutex::new((HashSet::new(), VecDeque::new())),
        draining: watch::channel(false).0,
        stop,
        secret: launch.secret.clone(),
    });
    let service = PluginServiceServer::new(Service {
        state: state.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let authenticated = InterceptedService::new(
        service,
        HostProof(
            Arc::new(host_proof(&launch.secret)),
            conventions.unauthenticated,
        ),
    );
    // Handled from before readiness: a host may stop the plugin as soon as it is ready.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("installing the SIGTERM handler: {e}"))?;
    announce()?;
    // The host's end of stdin closes when the host dies or drops us: exit, never spin.
    let (host_gone_tx, host_gone) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let mut sink = [0u8; 256];
        let mut stdin = std::io::stdin().lock();
        while std::io::Read::read(&mut stdin, &mut sink).is_ok_and(|n| n > 0) {}
        let _ = host_gone_tx.send(());
    });
    let drained = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    let server = tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(size_status))
        .add_service(authenticated)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), drained);
    let outcome = tokio::select! {
        served = server => served.map_err(|e| e.to_string()),
        _ = host_gone => {
            // The host is gone: nobody reads the streams any more; exit at once.
            let _ = std::fs::remove_file(&socket);
            return Ok(());
        }
        _ = term.recv() => {
            // Stopped by its host (or its supervisor): the socket goes with it.
            let _ = std::fs::remove_file(&socket);
            return Ok(());
        }
    };
    // A drain's streams had their terminal messages queued; give them a moment to flush.
    let flush = async {
        while state.in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let _ = tokio::time::timeout(FLUSH_GRACE, flush).await;
    let _ = std::fs::remove_file(&socket);
    outcome
}
