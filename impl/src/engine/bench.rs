//! `contract-impl engine bench`: the daemon's speed against the floor on this machine,
//! as ratios (never part of the tests). Three figures, each next to its floor:
//!
//! * **unary round trip**: an authenticated `Health` call to our daemon, against the same
//!   call to a bare tonic server of the same service over a Unix socket (no token check,
//!   a constant answer);
//! * **event replay**: `StreamEvents` pages of a stored run, events per second, against a
//!   bare tonic server streaming the same events from memory;
//! * **durable event writes**: a run that emits `N` deltas until they are all committed
//!   and it is suspended, against bare batched SQLite inserts of `N` rows (same pragmas,
//!   transactions of [`super::daemon::log::WRITE_BATCH_MAX`]).
//!
//! This module measures; it never asserts a speed.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::client::Ownership;
use super::daemon::{self, limits};
use super::proto::engine::v1 as pb;
use super::session::{Session, operation_id};
use pb::engine_service_server::{EngineService, EngineServiceServer};

/// One figure and its floor.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    /// Ours.
    pub ours: f64,
    /// The floor.
    pub floor: f64,
}

/// The three figures.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// Median µs per unary round trip.
    pub unary_us: Figure,
    /// Events per second replayed.
    pub replay_eps: Figure,
    /// Events per second made durable.
    pub write_eps: Figure,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The bare server: `Health` answers a constant, `StreamEvents` streams prebuilt events.
struct Bare {
    events: Arc<Vec<pb::StreamEventsResponse>>,
}

fn none<T>() -> Result<T, Status> {
    Err(Status::unimplemented("bare bench server"))
}

#[tonic::async_trait]
impl EngineService for Bare {
    async fn initialize(
        &self,
        _: Request<pb::InitializeRequest>,
    ) -> Result<Response<pb::InitializeResponse>, Status> {
        none()
    }
    async fn health(
        &self,
        _: Request<pb::HealthRequest>,
    ) -> Result<Response<pb::HealthResponse>, Status> {
        Ok(Response::new(pb::HealthResponse {
            readiness: pb::Readiness::Ready as i32,
            ..Default::default()
        }))
    }
    async fn start_run(
        &self,
        _: Request<pb::StartRunRequest>,
    ) -> Result<Response<pb::StartRunResponse>, Status> {
        none()
    }
    type StreamEventsStream = BoxStream<pb::StreamEventsResponse>;
    async fn stream_events(
        &self,
        request: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let r = request.into_inner();
        let page = r.cursor.map_or(limits::MAX_PAGE_EVENTS, |c| c.max_events) as usize;
        let start = usize::try_from(r.after_sequence)
            .unwrap_or(usize::MAX)
            .min(self.events.len());
        let end = (start + page).min(self.events.len());
        let slice: Vec<_> = self.events[start..end].iter().cloned().map(Ok).collect();
        Ok(Response::new(Box::pin(tokio_stream::iter(slice))))
    }
    type StreamInteractionsStream = BoxStream<pb::StreamInteractionsResponse>;
    async fn stream_interactions(
        &self,
        _: Request<pb::StreamInteractionsRequest>,
    ) -> Result<Response<Self::StreamInteractionsStream>, Status> {
        none()
    }
    async fn cancel_run(
        &self,
        _: Request<pb::CancelRunRequest>,
    ) -> Result<Response<pb::CancelRunResponse>, Status> {
        none()
    }
    async fn respond_interaction(
        &self,
        _: Request<pb::RespondInteractionRequest>,
    ) -> Result<Response<pb::RespondInteractionResponse>, Status> {
        none()
    }
    async fn suspend_run(
        &self,
        _: Request<pb::SuspendRunRequest>,
    ) -> Result<Response<pb::SuspendRunResponse>, Status> {
        none()
    }
    async fn resume_run(
        &self,
        _: Request<pb::ResumeRunRequest>,
    ) -> Result<Response<pb::ResumeRunResponse>, Status> {
        none()
    }
    async fn export_snapshot(
        &self,
        _: Request<pb::ExportSnapshotRequest>,
    ) -> Result<Response<pb::ExportSnapshotResponse>, Status> {
        none()
    }
    async fn import_snapshot(
        &self,
        _: Request<pb::ImportSnapshotRequest>,
    ) -> Result<Response<pb::ImportSnapshotResponse>, Status> {
        none()
    }
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

async fn wait_for(path: &Path) {
    while !path.exists() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs the three measurements: `rounds` unary calls, a run of `events` deltas.
///
/// # Errors
/// A server that does not start, a call that fails.
pub async fn run(rounds: usize, events: u64) -> Result<Report, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let run_dir = dir.path().join("run");
    let data = dir.path().join("data");
    let socket = run_dir.join("engine.sock");
    let serve = {
        let (socket, data) = (socket.clone(), data.clone());
        tokio::spawn(async move { daemon::serve(&socket, &data, &daemon::Config::default()).await })
    };
    let token = data.join(daemon::TOKEN_FILE);
    wait_for(&token).await;
    wait_for(&socket).await;
    let mut s = Session::open(&socket, &token, &Ownership::New, &[])
        .await
        .map_err(|e| e.to_string())?;
    // Unary.
    let mut ours = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        s.client
            .health(pb::HealthRequest {})
            .await
            .map_err(|e| e.to_string())?;
        ours.push(t.elapsed());
    }
    // Durable writes: the run is suspended once every delta is committed.
    let program = format!("#!script\nrepeat {events} output line of a build log\nturn\nhold");
    let definition = pb::DefinitionRef {
        id: "scripted".into(),
        revision: 1,
    };
    let t = Instant::now();
    let run = s
        .start_run(definition, &program, &operation_id())
        .await
        .map_err(|e| e.to_string())?
        .run_id;
    s.suspend(&run, &operation_id())
        .await
        .map_err(|e| e.to_string())?;
    let write_secs = t.elapsed().as_secs_f64();
    // Replay.
    let mut stored = Vec::new();
    let t = Instant::now();
    s.follow(&run, 0, limits::MAX_PAGE_EVENTS, false, |e| {
        stored.push(e.clone())
    })
    .await
    .map_err(|e| e.to_string())?;
    let replay_secs = t.elapsed().as_secs_f64();
    let replayed = stored.len() as f64;
    serve.abort();

    // The floors.
    let bare_dir = dir.path().join("bare");
    std::fs::create_dir_all(&bare_dir).map_err(|e| e.to_string())?;
    let bare_socket = bare_dir.join("bare.sock");
    let listener = tokio::net::UnixListener::bind(&bare_socket).map_err(|e| e.to_string())?;
    let frames: Vec<pb::StreamEventsResponse> = stored
        .iter()
        .cloned()
        .map(|e| pb::StreamEventsResponse {
            frame: Some(pb::stream_events_response::Frame::Event(e)),
        })
        .collect();
    let bare = EngineServiceServer::new(Bare {
        events: Arc::new(frames),
    })
    .max_encoding_message_size(limits::MAX_RESPONSE_BYTES);
    let bare_server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(bare)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::try_from("http://localhost")
        .map_err(|e| e.to_string())?
        .connect_with_connector(tower::service_fn(move |_| {
            let p = bare_socket.clone();
            async move {
                tokio::net::UnixStream::connect(p)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .map_err(|e| e.to_string())?;
    let mut c = pb::engine_service_client::EngineServiceClient::new(channel);
    let mut floor = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        c.health(pb::HealthRequest {})
            .await
            .map_err(|e| e.to_string())?;
        floor.push(t.elapsed());
    }
    let t = Instant::now();
    let mut after = 0u64;
    while (after as usize) < stored.len() {
        let mut stream = c
            .stream_events(pb::StreamEventsRequest {
                run_id: run.clone(),
                after_sequence: after,
                cursor: Some(pb::PageCursor {
                    max_events: limits::MAX_PAGE_EVENTS,
                    tail: false,
                }),
            })
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        while let Some(m) = stream.message().await.map_err(|e| e.to_string())? {
            if let Some(pb::stream_events_response::Frame::Event(e)) = m.frame {
                after = e.sequence;
            }
        }
    }
    let bare_replay_secs = t.elapsed().as_secs_f64();
    bare_server.abort();
    // Batched SQLite.
    let conn = crate::durable::open(&dir.path().join("bare.db"))?;
    conn.execute_batch("CREATE TABLE e (run_id TEXT, sequence INTEGER, event BLOB, PRIMARY KEY (run_id, sequence)) WITHOUT ROWID;")
        .map_err(|e| e.to_string())?;
    let blob = prost::Message::encode_to_vec(&stored[1]);
    let t = Instant::now();
    let mut conn = conn;
    let mut seq = 0i64;
    while seq < stored.len() as i64 {
        let tx = conn.transaction().map_err(|e| e.to_string())?;
        {
            let mut insert = tx
                .prepare_cached("INSERT INTO e VALUES (?1, ?2, ?3)")
                .map_err(|e| e.to_string())?;
            for _ in 0..daemon::log::WRITE_BATCH_MAX {
                seq += 1;
                insert
                    .execute(rusqlite::params![run, seq, blob])
                    .map_err(|e| e.to_string())?;
                if seq >= stored.len() as i64 {
                    break;
                }
            }
        }
        tx.commit().map_err(|e| e.to_string())?;
    }
    let bare_write_secs = t.elapsed().as_secs_f64();
    Ok(Report {
        unary_us: Figure {
            ours: median(ours),
            floor: median(floor),
        },
        replay_eps: Figure {
            ours: replayed / replay_secs,
            floor: replayed / bare_replay_secs,
        },
        write_eps: Figure {
            ours: replayed / write_secs,
            floor: replayed / bare_write_secs,
        },
    })
}
