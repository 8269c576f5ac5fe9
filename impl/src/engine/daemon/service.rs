//! The engine service's handlers ("Initialization", "Operations"): `Initialize` and
//! `Health` here; the run operations delegate to [`super::operations`] and
//! [`super::streams`].

use std::pin::Pin;
use std::sync::Arc;

use sha2::Digest;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::state::Daemon;
use super::store::Claim;
use super::{limits, operations, streams};
use crate::engine::compat::{self, MINOR_MAX, MINOR_MIN, PROTOCOL_MAJOR, Refusal};
use crate::engine::proto::common::v1::{BuildIdentity, MessageLimits, ProtocolVersion};
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

/// The immutable plan of `definition` under the current dynamic generation ("The server
/// selects and leases the current dynamic generation, then returns [...] immutable
/// plan_id").
pub fn plan_id(definition: &pb::DefinitionRef) -> String {
    let digest = sha2::Sha256::digest(format!(
        "{}\n{}@{}\ngeneration {DYNAMIC_GENERATION}",
        definitions().set_id,
        definition.id,
        definition.revision
    ));
    format!("plan-{}", &hex::encode(digest)[..16])
}

/// The dynamic generation runs lease (one: this daemon has no plugin generations).
pub const DYNAMIC_GENERATION: u64 = 1;

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
    daemon: Arc<Daemon>,
}

impl Engine {
    /// Handlers over `daemon`.
    pub fn new(daemon: Arc<Daemon>) -> Self {
        Self { daemon }
    }

    /// `Initialize` ("Initialization"): negotiation, then the ownership claim.
    fn initialize_inner(
        &self,
        r: pb::InitializeRequest,
    ) -> Result<Response<pb::InitializeResponse>, Status> {
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
            Some(C::NewOwner(_)) => (self.daemon.clients.new_owner(negotiated.version.1), None),
            Some(C::Reconnect(rc)) => {
                if rc.client_id.is_empty() || rc.client_id.len() > 128 {
                    return Err(Status::invalid_argument("client_id must be 1..128 bytes"));
                }
                (
                    self.daemon.clients.reconnect(
                        &rc.client_id,
                        rc.expected_epoch,
                        negotiated.version.1,
                    ),
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
                limits: Some(MessageLimits {
                    max_page_bytes: self.daemon.page_bytes,
                    ..limits::message_limits()
                }),
                health: Some(self.health()),
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

    fn health(&self) -> pb::HealthResponse {
        pb::HealthResponse {
            readiness: pb::Readiness::Ready as i32,
            version: Some(build()),
            replay_limits: Some(pb::ReplayLimits {
                retained_events_per_run: self.daemon.log.retained(),
                max_page_events: limits::MAX_PAGE_EVENTS,
                max_page_bytes: self.daemon.page_bytes,
            }),
            active_runs: u32::try_from(self.daemon.runs.active()).unwrap_or(u32::MAX),
            degraded_reasons: Vec::new(),
        }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl EngineService for Engine {
    async fn initialize(
        &self,
        request: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::InitializeResponse>, Status> {
        self.initialize_inner(request.into_inner())
            .map_err(|s| self.daemon.profile.refusal(s))
    }

    async fn health(
        &self,
        _request: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        Ok(Response::new(self.health()))
    }

    async fn start_run(
        &self,
        request: Request<pb::StartRunRequest>,
    ) -> Result<Response<pb::StartRunResponse>, Status> {
        operations::start_run(&self.daemon, request.into_inner())
            .await
            .map(Response::new)
            .map_err(|s| self.daemon.profile.refusal(s))
    }

    type StreamEventsStream = BoxStream<pb::StreamEventsResponse>;

    async fn stream_events(
        &self,
        request: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let p = self.daemon.profile;
        let deadline = streams::deadline(request.metadata()).map_err(|s| p.refusal(s))?;
        let stream = streams::stream_events(&self.daemon, request.into_inner(), deadline)
            .await
            .map_err(|s| p.refusal(s))?;
        let stream = tokio_stream::StreamExt::map(stream, move |r| r.map_err(|s| p.refusal(s)));
        Ok(Response::new(Box::pin(stream)))
    }

    type StreamInteractionsStream = BoxStream<pb::StreamInteractionsResponse>;

    async fn stream_interactions(
        &self,
        request: Request<pb::StreamInteractionsRequest>,
    ) -> Result<Response<Self::StreamInteractionsStream>, Status> {
        let p = self.daemon.profile;
        let deadline = streams::deadline(request.metadata()).map_err(|s| p.refusal(s))?;
        let stream = streams::stream_interactions(&self.daemon, request.into_inner(), deadline)
            .await
            .map_err(|s| p.refusal(s))?;
        let stream = tokio_stream::StreamExt::map(stream, move |r| r.map_err(|s| p.refusal(s)));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn cancel_run(
        &self,
        request: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::CancelRunResponse>, Status> {
        operations::cancel_run(&self.daemon, request.into_inner())
            .await
            .map(Response::new)
            .map_err(|s| self.daemon.profile.refusal(s))
    }

    async fn respond_interaction(
        &self,
        request: Request<pb::RespondInteractionRequest>,
    ) -> Result<Response<pb::RespondInteractionResponse>, Status> {
        operations::respond_interaction(&self.daemon, request.into_inner())
            .await
            .map(Response::new)
            .map_err(|s| self.daemon.profile.refusal(s))
    }

    async fn suspend_run(
        &self,
        request: Request<pb::SuspendRunRequest>,
    ) -> Result<Response<pb::SuspendRunResponse>, Status> {
        operations::suspend_run(&self.daemon, request.into_inner())
            .await
            .map(Response::new)
            .map_err(|s| self.daemon.profile.refusal(s))
    }

    async fn resume_run(
        &self,
        request: Request<pb::ResumeRunRequest>,
    ) -> Result<Response<pb::ResumeRunResponse>, Status> {
        operations::resume_run(&self.daemon, request.into_inner())
            .await
            .map(Response::new)
            .map_err(|s| self.daemon.profile.refusal(s))
    }

    async fn export_snapshot(
        &self,
        request: Request<pb::ExportSnapshotRequest>,
    ) -> Result<Response<pb::ExportSnapshotResponse>, Status> {
        operations::export_snapshot(&self.daemon, request.into_inner())
            .await
            .map(Response::new)
            .map_err(|s| self.daemon.profile.refusal(s))
    }

    async fn import_snapshot(
        &self,
        request: Request<pb::ImportSnapshotRequest>,
    ) -> Result<Response<pb::ImportSnapshotResponse>, Status> {
        operations::import_snapshot(&self.daemon, request.into_inner())
            .await
            .map(Response::new)
            .map_err(|s| self.daemon.profile.refusal(s))
    }
}
