//! The engine service's handlers ("Initialization", "Operations"). `Initialize` and
//! `Health` are implemented; the run operations answer `UNIMPLEMENTED` until the kernel
//! slice lands (the engine-family issue lists them), never a made-up result.

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::limits;
use super::store::{Claim, ClientStore};
use crate::engine::compat::{self, MINOR_MAX, MINOR_MIN, PROTOCOL_MAJOR, Refusal};
use crate::engine::proto::common::v1::{BuildIdentity, ProtocolVersion};
use crate::engine::proto::engine::v1 as pb;
use pb::engine_service_server::EngineService;

/// The definitions this daemon runs (its immutable catalog).
pub fn definitions() -> pb::DefinitionSet {
    let definitions = vec![pb::Definition {
        id: "scripted".into(),
        revision: 1,
        display_name: "Scripted kernel".into(),
    }];
    let mut digest = sha2::Sha256::default();
    for d in &definitions {
        sha2::Digest::update(&mut digest, format!("{}:{}\n", d.id, d.revision));
    }
    pb::DefinitionSet {
        set_id: format!(
            "defs-{}",
            &hex::encode(sha2::Digest::finalize(digest))[..16]
        ),
        definitions,
    }
}

/// This daemon's build identity.
pub fn build() -> BuildIdentity {
    BuildIdentity {
        name: "contract-impl".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        revision: String::new(),
    }
}

/// The handlers.
#[derive(Debug, Clone)]
pub struct Engine {
    store: Arc<ClientStore>,
}

impl Engine {
    /// Handlers over `store`.
    pub fn new(store: Arc<ClientStore>) -> Self {
        Self { store }
    }

    fn health() -> pb::HealthResponse {
        pb::HealthResponse {
            readiness: pb::Readiness::Ready as i32,
            version: Some(build()),
            replay_limits: Some(pb::ReplayLimits {
                retained_events_per_run: limits::RETAINED_EVENTS_PER_RUN,
                max_page_events: limits::MAX_PAGE_EVENTS,
                max_page_bytes: limits::MAX_PAGE_BYTES,
            }),
            active_runs: 0,
            degraded_reasons: Vec::new(),
        }
    }
}

fn not_yet(what: &str) -> Status {
    Status::unimplemented(format!(
        "{what} is not served by this daemon yet (the run kernel is not implemented)"
    ))
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl EngineService for Engine {
    async fn initialize(
        &self,
        request: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::InitializeResponse>, Status> {
        let r = request.into_inner();
        if r.required_capabilities.len() > limits::MAX_COLLECTION_COUNT as usize
            || r.supported_capabilities.len() > limits::MAX_COLLECTION_COUNT as usize
        {
            return Err(Status::invalid_argument(format!(
                "at most {} capabilities",
                limits::MAX_COLLECTION_COUNT
            )));
        }
        use pb::initialize_response::Result as R;
        let negotiated = match compat::negotiate(r.protocol.as_ref(), &r.required_capabilities) {
            Ok(n) => n,
            // "fail before a run is created, with both observed and required values"
            Err(Refusal::IncompatibleVersion { observed }) => {
                return Ok(Response::new(pb::InitializeResponse {
                    result: Some(R::IncompatibleVersion(pb::IncompatibleVersion {
                        observed: Some(ProtocolVersion {
                            major: observed.0,
                            minor: observed.1,
                        }),
                        supported_min: Some(ProtocolVersion {
                            major: PROTOCOL_MAJOR,
                            minor: MINOR_MIN,
                        }),
                        supported_max: Some(ProtocolVersion {
                            major: PROTOCOL_MAJOR,
                            minor: MINOR_MAX,
                        }),
                    })),
                }));
            }
            Err(Refusal::MissingCapability {
                missing,
                offered,
                negotiated,
            }) => {
                return Ok(Response::new(pb::InitializeResponse {
                    result: Some(R::MissingCapability(pb::MissingCapability {
                        missing,
                        offered,
                        negotiated: Some(ProtocolVersion {
                            major: negotiated.0,
                            minor: negotiated.1,
                        }),
                    })),
                }));
            }
        };
        use pb::ownership_claim::Claim as C;
        let (claim, reconnect) = match r.claim.and_then(|c| c.claim) {
            Some(C::NewOwner(_)) => (self.store.new_owner(), None),
            Some(C::Reconnect(rc)) => {
                if rc.client_id.is_empty() || rc.client_id.len() > 128 {
                    return Err(Status::invalid_argument("client_id must be 1..128 bytes"));
                }
                (
                    self.store.reconnect(&rc.client_id, rc.expected_epoch),
                    Some(rc),
                )
            }
            None => {
                return Err(Status::invalid_argument(
                    "claim is required: new_owner or reconnect",
                ));
            }
        };
        let claim =
            claim.map_err(|e| Status::unavailable(format!("the client store failed: {e}")))?;
        let result = match claim {
            Claim::Won { client_id, epoch } => R::Initialized(pb::Initialized {
                negotiated: Some(ProtocolVersion {
                    major: negotiated.version.0,
                    minor: negotiated.version.1,
                }),
                server_build: Some(build()),
                capabilities: negotiated.capabilities,
                limits: Some(limits::message_limits()),
                health: Some(Self::health()),
                definitions: Some(definitions()),
                client_id,
                epoch,
            }),
            // "A stale claim fails without changing ownership."
            Claim::Stale { current } => {
                let rc = reconnect.unwrap_or_default();
                R::StaleClaim(pb::StaleClaim {
                    client_id: rc.client_id,
                    expected_epoch: rc.expected_epoch,
                    current_epoch: current,
                })
            }
        };
        Ok(Response::new(pb::InitializeResponse {
            result: Some(result),
        }))
    }

    async fn health(
        &self,
        _request: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        Ok(Response::new(Self::health()))
    }

    async fn start_run(
        &self,
        _request: Request<pb::StartRunRequest>,
    ) -> Result<Response<pb::StartRunResponse>, Status> {
        Err(not_yet("StartRun"))
    }

    type StreamEventsStream = BoxStream<pb::StreamEventsResponse>;

    async fn stream_events(
        &self,
        _request: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        Err(not_yet("StreamEvents"))
    }

    type StreamInteractionsStream = BoxStream<pb::StreamInteractionsResponse>;

    async fn stream_interactions(
        &self,
        _request: Request<pb::StreamInteractionsRequest>,
    ) -> Result<Response<Self::StreamInteractionsStream>, Status> {
        Err(not_yet("StreamInteractions"))
    }

    async fn cancel_run(
        &self,
        _request: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::CancelRunResponse>, Status> {
        Err(not_yet("CancelRun"))
    }

    async fn respond_interaction(
        &self,
        _request: Request<pb::RespondInteractionRequest>,
    ) -> Result<Response<pb::RespondInteractionResponse>, Status> {
        Err(not_yet("RespondInteraction"))
    }

    async fn suspend_run(
        &self,
        _request: Request<pb::SuspendRunRequest>,
    ) -> Result<Response<pb::SuspendRunResponse>, Status> {
        Err(not_yet("SuspendRun"))
    }

    async fn resume_run(
        &self,
        _request: Request<pb::ResumeRunRequest>,
    ) -> Result<Response<pb::ResumeRunResponse>, Status> {
        Err(not_yet("ResumeRun"))
    }

    async fn export_snapshot(
        &self,
        _request: Request<pb::ExportSnapshotRequest>,
    ) -> Result<Response<pb::ExportSnapshotResponse>, Status> {
        Err(not_yet("ExportSnapshot"))
    }

    async fn import_snapshot(
        &self,
        _request: Request<pb::ImportSnapshotRequest>,
    ) -> Result<Response<pb::ImportSnapshotResponse>, Status> {
        Err(not_yet("ImportSnapshot"))
    }
}
