//! `contract-impl plugin bench`: a tool call's round trip through our host and our SDK
//! against the floor on this machine (never part of the tests):
//!
//! * **ours**: `Execute` of the fixture's `echo` through a leased generation of our host
//!   (the tool checked against the snapshot, the stream's every message checked) to the
//!   SDK plugin (host proof checked, call validated, arguments parsed strictly and checked
//!   against the schema), over its Unix socket;
//! * **floor**: a unary call to a bare tonic server of the same service over a Unix
//!   socket (no proof, no validation, a constant answer).
//!
//! Median microseconds per round trip. This module measures; it never asserts a speed.

use std::path::Path;
use std::pin::Pin;
use std::time::Instant;

use tokio_stream::Stream;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::host::{PluginConfig, PluginHost};
use super::proto::v1 as pb;
use pb::plugin_service_client::PluginServiceClient;
use pb::plugin_service_server::{PluginService, PluginServiceServer};

struct Bare;

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl PluginService for Bare {
    async fn initialize(
        &self,
        _: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::InitializeResponse>, Status> {
        Err(Status::unimplemented("bare bench server"))
    }
    async fn list_tools(
        &self,
        _: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        Err(Status::unimplemented("bare bench server"))
    }
    type ExecuteStream = BoxStream<pb::ExecuteResponse>;
    async fn execute(
        &self,
        _: Request<pb::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStream>, Status> {
        Err(Status::unimplemented("bare bench server"))
    }
    async fn cancel(
        &self,
        _: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        Ok(Response::new(pb::CancelResponse { in_flight: true }))
    }
    async fn drain(
        &self,
        _: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainResponse>, Status> {
        Err(Status::unimplemented("bare bench server"))
    }
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

async fn floor(dir: &Path, rounds: usize) -> Result<f64, String> {
    let socket = dir.join("bare.sock");
    let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| e.to_string())?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PluginServiceServer::new(Bare))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let channel = super::host::launch::unix_channel(&socket).await?;
    let mut client = PluginServiceClient::new(channel);
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        client
            .cancel(pb::CancelRequest {
                call_id: "c".into(),
            })
            .await
            .map_err(|e| e.to_string())?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(samples))
}

async fn ours(rounds: usize) -> Result<f64, String> {
    let exe = std::fs::canonicalize(std::env::current_exe().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let config = PluginConfig {
        name: super::fixture::NAME.into(),
        executable: exe.clone(),
        sha256: super::host::verify::sha256_of(&exe).map_err(|e| e.to_string())?,
        args: vec!["plugin".into(), "fixture".into()],
        env: std::collections::BTreeMap::new(),
        approved_capabilities: vec!["filesystem.write".into(), "process.spawn".into()],
        startup_timeout_ms: 20_000,
        call_timeout_ms: 20_000,
        drain_timeout_ms: 2_000,
    };
    let host = PluginHost::new(config, exe);
    host.activate().await.map_err(|e| e.to_string())?;
    let lease = host.lease().ok_or("no active generation")?;
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let t = Instant::now();
        lease
            .execute(
                &format!("c{i}"),
                "echo",
                r#"{"text":"ping"}"#,
                |_, _| {},
                std::future::pending(),
            )
            .await
            .map_err(|e| e.to_string())?;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(lease);
    host.shutdown().await;
    Ok(median(samples))
}

/// Runs both measurements (`rounds` calls each, after a warm-up) and prints them.
///
/// # Errors
/// A measurement could not run.
pub async fn run(rounds: usize) -> Result<(), String> {
    // The first connection and call of a process pay for setup; measure after them.
    let warm = tempfile::tempdir().map_err(|e| e.to_string())?;
    floor(warm.path(), rounds / 10 + 1).await?;
    let bare = tempfile::tempdir().map_err(|e| e.to_string())?;
    let floor = floor(bare.path(), rounds).await?;
    let ours = ours(rounds).await?;
    println!(
        "plugin Execute round trip: {ours:.1} µs median (host + SDK, validated, streamed) against {floor:.1} µs for a bare tonic unary call over a Unix socket: {:.2}× the floor",
        ours / floor
    );
    Ok(())
}
