//! The engine client library: a channel to the daemon's Unix socket that presents the
//! endpoint token on every call (engine-protocol.md, "Initialization", "Security
//! boundary"), and the client side of ownership: claim as a new owner, or reconnect
//! with the stable client ID and the epoch last held ("the daemon performs a
//! compare-and-swap and returns the same ID at exactly the next epoch").
//!
//! The token is read from the daemon's 0600 token file and kept in memory only; it is
//! never printed. This module never decides negotiation (the daemon does).

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::compat::PROTOCOL_MAJOR;
use super::proto::common::v1::{BuildIdentity, ProtocolVersion};
use super::proto::engine::v1 as pb;
use pb::engine_service_client::EngineServiceClient;

/// Why the client cannot reach the daemon (stable [`code`](Self::code)).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The token file cannot be read.
    #[error("cannot read the endpoint token at {path}: {reason}")]
    Token {
        /// The file.
        path: PathBuf,
        /// The OS error.
        reason: String,
    },
    /// The socket cannot be connected.
    #[error("cannot connect to {path}: {reason}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A call failed with a gRPC status.
    #[error("{0}")]
    Status(#[from] tonic::Status),
}

impl ClientError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ClientError::Token { .. } => "token_unreadable",
            ClientError::Connect { .. } => "connect_failed",
            ClientError::Status(_) => "rpc_failed",
        }
    }
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(<redacted>)")
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert(super::daemon::auth::AUTHORIZATION, self.0.clone());
        Ok(request)
    }
}

/// A connected, authenticated client.
pub type Client = EngineServiceClient<InterceptedService<Channel, Bearer>>;

/// The endpoint token in `token_file` (one line; surrounding white space dropped). It is
/// a secret: the caller keeps it in memory only and never prints it.
///
/// # Errors
/// [`ClientError::Token`] when the file cannot be read (the error never holds the token).
pub fn read_token(token_file: &Path) -> Result<String, ClientError> {
    std::fs::read_to_string(token_file)
        .map(|token| token.trim().to_string())
        .map_err(|e| ClientError::Token {
            path: token_file.to_path_buf(),
            reason: e.to_string(),
        })
}

/// How long connecting to the daemon's socket may take.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The client's HTTP/2 keepalive: a ping this often, while a call is open or not.
pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a keepalive ping may go unanswered before the connection is dropped.
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Connects to the daemon at `socket` with the token in `token_file`.
///
/// The channel names the authority `localhost`: the socket path is not an authority (a
/// percent-encoded path is refused by HTTP/2 servers).
///
/// # Errors
/// [`ClientError::Token`], [`ClientError::Connect`].
pub async fn connect(socket: &Path, token_file: &Path) -> Result<Client, ClientError> {
    let token = read_token(token_file)?;
    let value = format!("Bearer {token}")
        .parse()
        .map_err(|_| ClientError::Token {
            path: token_file.to_path_buf(),
            reason: "the token is not printable ASCII".into(),
        })?;
    let path = socket.to_path_buf();
    let connect_err = |reason: String| ClientError::Connect {
        path: socket.to_path_buf(),
        reason,
    };
    let channel = Endpoint::try_from("http://localhost")
        .map_err(|e| connect_err(e.to_string()))?
        // A daemon that stops answering is noticed on an idle tail too; one that never
        // completes the connection is given up.
        .connect_timeout(CONNECT_TIMEOUT)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .map_err(|e| connect_err(format!("{e}: {:?}", std::error::Error::source(&e))))?;
    Ok(EngineServiceClient::with_interceptor(
        channel,
        Bearer(value),
    ))
}

/// Who this client claims to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// A new owner.
    New,
    /// A reconnect with the stable ID and the epoch last held.
    Reconnect {
        /// The stable client ID.
        client_id: String,
        /// The epoch last held.
        epoch: u64,
    },
}

/// `Initialize` presenting protocol `1.minor` (ours is [`super::compat::MINOR_MAX`]) and the
/// capabilities of that minor, requiring `required`.
///
/// # Errors
/// [`ClientError::Status`] when the call fails (typed refusals are results, not errors).
pub async fn initialize(
    client: &mut Client,
    ownership: &Ownership,
    required: &[String],
    minor: u32,
) -> Result<pb::initialize_response::Result, ClientError> {
    use pb::ownership_claim::Claim;
    let claim = match ownership {
        Ownership::New => Claim::NewOwner(pb::NewOwner {}),
        Ownership::Reconnect { client_id, epoch } => Claim::Reconnect(pb::Reconnect {
            client_id: client_id.clone(),
            expected_epoch: *epoch,
        }),
    };
    let request = pb::InitializeRequest {
        protocol: Some(ProtocolVersion {
            major: PROTOCOL_MAJOR,
            minor,
        }),
        client_build: Some(BuildIdentity {
            name: "contract-impl engine".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            revision: String::new(),
        }),
        supported_capabilities: super::compat::capabilities(minor)
            .iter()
            .map(|c| (*c).to_string())
            .collect(),
        required_capabilities: required.to_vec(),
        client_limits: Some(super::daemon::limits::message_limits()),
        claim: Some(pb::OwnershipClaim { claim: Some(claim) }),
    };
    let response = crate::engine::session::bounded(client.initialize(request))
        .await?
        .into_inner();
    response.result.ok_or_else(|| {
        ClientError::Status(tonic::Status::internal("Initialize answered no result"))
    })
}
