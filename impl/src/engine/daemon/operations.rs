//! The mutating operations ("Operations", "Failure semantics"): StartRun, CancelRun,
//! RespondInteraction, SuspendRun, ResumeRun, ImportSnapshot — each through the
//! idempotency ledger ([`super::ledger`]) — and ExportSnapshot.
//!
//! StartRun and ImportSnapshot follow the transactional preparation boundary: "It first
//! prepares the execution, uses the prepared immutable run ID to acquire daemon
//! ownership, and commits only after that ownership is durable. [...] If ownership cannot
//! be acquired, the adapter closes the prepared execution and releases its event log and
//! dynamic-plan lease." Here the prepared execution is the parsed program, the run ID,
//! the plan lease and the run's log; ownership is the `runs` row written in one
//! transaction with the ledger entry; commit registers the run and starts its executor on
//! the daemon's runtime.
//!
//! Errors are `Status`es whose message starts with a stable snake_case code
//! (`unknown_definition: …`).
//!
//! This module owns the operations' rules; streams are [`super::streams`]'.

use std::sync::Arc;

use prost::Message;
use sha2::{Digest, Sha256};
use tonic::Status;

use super::executor;
use super::ledger::{Done, Entry, check_operation_id};
use super::log::RunLog;
use super::runs::{self, Lifecycle, Progress, Run, RunRow};
use super::service::{definitions, plan_id};
use super::state::{Daemon, session_of};
use crate::engine::compat::{CAP_SNAPSHOTS, SNAPSHOT_FORMAT};
use crate::engine::kernel::script;
use crate::engine::proto::common::v1::Outcome;
use crate::engine::proto::engine::v1 as pb;

/// Longest initial message, bytes.
pub const INITIAL_MESSAGE_MAX_BYTES: usize = 64 * 1024;

/// Longest interaction response, bytes.
pub const RESPONSE_MAX_BYTES: usize = 64 * 1024;

fn digest<M: Message + Clone>(request: &M, strip: impl FnOnce(&mut M)) -> [u8; 32] {
    let mut m = request.clone();
    strip(&mut m);
    Sha256::digest(m.encode_to_vec()).into()
}

fn entry(session: &pb::ClientSession, op: &str, method: &'static str, digest: [u8; 32]) -> Entry {
    Entry {
        client_id: session.client_id.clone(),
        operation_id: op.to_string(),
        method,
        digest,
    }
}

fn decode<M: Message + Default>(bytes: &[u8]) -> Result<M, Status> {
    M::decode(bytes).map_err(|e| Status::internal(format!("ledger: a stored response: {e}")))
}

fn unavailable(e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("store_unavailable: {e}"))
}

/// `StartRun`.
///
/// # Errors
/// `unknown_definition` (`NOT_FOUND`), `invalid_program`, `message_too_large`
/// (`INVALID_ARGUMENT`), the fence's and the ledger's.
pub async fn start_run(
    daemon: &Arc<Daemon>,
    request: pb::StartRunRequest,
) -> Result<pb::StartRunResponse, Status> {
    let session = session_of(request.session.as_ref())?.clone();
    check_operation_id(&request.client_operation_id)?;
    let definition = request.definition.clone().ok_or_else(|| {
        Status::invalid_argument("definition_required: definition { id, revision }")
    })?;
    let set = definitions();
    if !set
        .definitions
        .iter()
        .any(|d| d.id == definition.id && d.revision == definition.revision)
    {
        let advertised: Vec<String> = set
            .definitions
            .iter()
            .map(|d| format!("{}@{}", d.id, d.revision))
            .collect();
        return Err(Status::not_found(format!(
            "unknown_definition: {}@{} is not advertised (advertised: {})",
            definition.id,
            definition.revision,
            advertised.join(", ")
        )));
    }
    if request.initial_message.len() > INITIAL_MESSAGE_MAX_BYTES {
        return Err(Status::invalid_argument(format!(
            "message_too_large: initial_message is {} bytes, over {INITIAL_MESSAGE_MAX_BYTES}",
            request.initial_message.len()
        )));
    }
    let program = script::parse(&request.initial_message)
        .map_err(|e| Status::invalid_argument(format!("invalid_program: {e}")))?;
    let d = digest(&request, |r| r.session = None);
    let e = entry(&session, &request.client_operation_id, "StartRun", d);
    let owner = daemon.clone();
    let answer = daemon
        .ledger
        .once(
            e,
            || daemon.fence(Some(&session)).map(|_| ()),
            move |entry| async move {
                // Prepare: the immutable run ID, the plan lease, the run's log.
                let run_id = owner.profile.run_id();
                let plan = plan_id(&definition);
                let base = owner.profile.sequence_origin() - 1;
                let log = RunLog::new(&run_id, base, base + 1, false);
                let response = pb::StartRunResponse {
                    run_id: run_id.clone(),
                    initial_sequence: base + 1,
                    plan_id: plan.clone(),
                };
                let progress = Progress {
                    program,
                    position: 0,
                    turns: 0,
                };
                let row = RunRow {
                    run_id: run_id.clone(),
                    client_id: entry.client_id.clone(),
                    definition: definition.clone(),
                    plan_id: plan.clone(),
                    progress: progress.clone(),
                    state: "running".into(),
                    boundary: 0,
                    outcome: 0,
                    base_sequence: base,
                };
                // Ownership: the run row and the ledger entry in one transaction.
                {
                    let mut conn = owner.db.lock().map_err(|_| Status::internal("poisoned"))?;
                    let tx = conn.transaction().map_err(unavailable)?;
                    runs::insert(&tx, &row).map_err(unavailable)?;
                    entry
                        .record(&tx, &response.encode_to_vec())
                        .map_err(unavailable)?;
                    // On failure the prepared run (its ID and log) is dropped here.
                    tx.commit().map_err(unavailable)?;
                }
                // Commit: the daemon owns the execution from here.
                let run = Run::new(run_id, definition, plan, log, Lifecycle::Running);
                run.interactions().revision = owner.profile.interaction_revision_origin();
                owner.runs.insert(run.clone());
                executor::spawn(owner.deps(), run, progress, true);
                Ok(Done {
                    response: response.encode_to_vec(),
                    recorded: true,
                })
            },
        )
        .await?;
    decode(&answer.response)
}

/// `CancelRun`: idempotent; reports whether the run was already terminal.
///
/// # Errors
/// `unknown_run`, the fence's and the ledger's.
pub async fn cancel_run(
    daemon: &Arc<Daemon>,
    request: pb::CancelRunRequest,
) -> Result<pb::CancelRunResponse, Status> {
    let session = session_of(request.session.as_ref())?.clone();
    check_operation_id(&request.client_operation_id)?;
    let run = daemon.run(&request.run_id)?;
    let d = digest(&request, |r| r.session = None);
    let e = entry(&session, &request.client_operation_id, "CancelRun", d);
    let answer = daemon
        .ledger
        .once(
            e,
            || daemon.fence(Some(&session)).map(|_| ()),
            move |_| async move {
                let response = match run.lifecycle() {
                    Lifecycle::Terminal { outcome } => pb::CancelRunResponse {
                        already_terminal: true,
                        outcome: outcome as i32,
                    },
                    _ => {
                        run.signal(&run.signals.cancel);
                        // "terminal events remain authoritative": the answer is the outcome
                        // the run actually ended with; a run that ended otherwise than
                        // canceled had ended before this cancellation could act.
                        let outcome = match run.until(|_| false).await {
                            Lifecycle::Terminal { outcome } => outcome,
                            _ => Outcome::Unspecified,
                        };
                        pb::CancelRunResponse {
                            already_terminal: outcome != Outcome::Canceled,
                            outcome: outcome as i32,
                        }
                    }
                };
                Ok(Done {
                    response: response.encode_to_vec(),
                    recorded: false,
                })
            },
        )
        .await?;
    decode(&answer.response)
}

/// `RespondInteraction`: answers a pending prompt once.
///
/// # Errors
/// `stale_interaction` (`FAILED_PRECONDITION`) when the interaction is not pending or
/// already answered; `invalid_response` (`INVALID_ARGUMENT`); the fence's and the
/// ledger's.
pub async fn respond_interaction(
    daemon: &Arc<Daemon>,
    request: pb::RespondInteractionRequest,
) -> Result<pb::RespondInteractionResponse, Status> {
    let session = session_of(request.session.as_ref())?.clone();
    check_operation_id(&request.client_operation_id)?;
    let run = daemon.run(&request.run_id)?;
    if request.interaction_id.is_empty()
        || request.interaction_id.len() > script::INTERACTION_ID_MAX_BYTES
    {
        return Err(Status::invalid_argument(format!(
            "invalid_interaction_id: interaction_id must be 1..={} bytes",
            script::INTERACTION_ID_MAX_BYTES
        )));
    }
    if request.response_json.len() > RESPONSE_MAX_BYTES {
        return Err(Status::invalid_argument(format!(
            "invalid_response: response_json is over {RESPONSE_MAX_BYTES} bytes"
        )));
    }
    match serde_json::from_str::<serde_json::Value>(&request.response_json) {
        Ok(serde_json::Value::String(_)) => {}
        Ok(_) => {
            return Err(Status::invalid_argument(
                r#"invalid_response: the response does not match the schema {"type":"string"}"#,
            ));
        }
        Err(e) => {
            return Err(Status::invalid_argument(format!(
                "invalid_response: response_json is not JSON: {e}"
            )));
        }
    }
    let d = digest(&request, |r| r.session = None);
    let e = entry(
        &session,
        &request.client_operation_id,
        "RespondInteraction",
        d,
    );
    let id = request.interaction_id.clone();
    let answer = daemon
        .ledger
        .once(
            e,
            || daemon.fence(Some(&session)).map(|_| ()),
            move |_| async move {
                {
                    let mut interactions = run.interactions();
                    let pending = interactions.pending.iter().any(|p| p.interaction_id == id);
                    if !pending || interactions.answered.contains(&id) {
                        return Err(Status::failed_precondition(format!(
                            "stale_interaction: interaction {id} of run {} is not pending",
                            run.id
                        )));
                    }
                    interactions.answered.push(id.clone());
                }
                run.signals.wake.notify_one();
                Ok(Done {
                    response: pb::RespondInteractionResponse {
                        deduplicated: false,
                    }
                    .encode_to_vec(),
                    recorded: false,
                })
            },
        )
        .await?;
    let mut response: pb::RespondInteractionResponse = decode(&answer.response)?;
    response.deduplicated = answer.deduplicated;
    Ok(response)
}

/// `SuspendRun`: waits for the next completed-turn boundary.
///
/// # Errors
/// `run_terminal`, `run_ended_before_boundary` (`FAILED_PRECONDITION`); the fence's and
/// the ledger's.
pub async fn suspend_run(
    daemon: &Arc<Daemon>,
    request: pb::SuspendRunRequest,
) -> Result<pb::SuspendRunResponse, Status> {
    let session = session_of(request.session.as_ref())?.clone();
    check_operation_id(&request.client_operation_id)?;
    let run = daemon.run(&request.run_id)?;
    let d = digest(&request, |r| r.session = None);
    let e = entry(&session, &request.client_operation_id, "SuspendRun", d);
    let answer = daemon
        .ledger
        .once(e, || daemon.fence(Some(&session)).map(|_| ()), move |_| async move {
            let boundary = match run.lifecycle() {
                Lifecycle::Terminal { .. } => {
                    return Err(Status::failed_precondition(format!(
                        "run_terminal: run {} has ended",
                        run.id
                    )));
                }
                Lifecycle::Suspended { boundary } => boundary,
                Lifecycle::Running => {
                    run.signal(&run.signals.suspend);
                    match run.until(|l| matches!(l, Lifecycle::Suspended { .. })).await {
                        Lifecycle::Suspended { boundary } => boundary,
                        _ => {
                            return Err(Status::failed_precondition(format!(
                                "run_ended_before_boundary: run {} ended before a completed turn",
                                run.id
                            )));
                        }
                    }
                }
            };
            Ok(Done {
                response: pb::SuspendRunResponse {
                    boundary_sequence: boundary,
                }
                .encode_to_vec(),
                recorded: false,
            })
        })
        .await?;
    decode(&answer.response)
}

/// `ResumeRun`: continues a suspended run with the same identity.
///
/// # Errors
/// `run_not_suspended` (`FAILED_PRECONDITION`); the fence's and the ledger's.
pub async fn resume_run(
    daemon: &Arc<Daemon>,
    request: pb::ResumeRunRequest,
) -> Result<pb::ResumeRunResponse, Status> {
    let session = session_of(request.session.as_ref())?.clone();
    check_operation_id(&request.client_operation_id)?;
    let run = daemon.run(&request.run_id)?;
    let d = digest(&request, |r| r.session = None);
    let e = entry(&session, &request.client_operation_id, "ResumeRun", d);
    let answer = daemon
        .ledger
        .once(
            e,
            || daemon.fence(Some(&session)).map(|_| ()),
            move |_| async move {
                if !matches!(run.lifecycle(), Lifecycle::Suspended { .. }) {
                    return Err(Status::failed_precondition(format!(
                        "run_not_suspended: run {} is not suspended",
                        run.id
                    )));
                }
                run.signal(&run.signals.resume);
                run.until(|l| matches!(l, Lifecycle::Running)).await;
                Ok(Done {
                    response: pb::ResumeRunResponse {
                        run_id: run.id.clone(),
                    }
                    .encode_to_vec(),
                    recorded: false,
                })
            },
        )
        .await?;
    decode(&answer.response)
}

/// The state a snapshot carries (provider-neutral: the definition reference, the plan,
/// the program and where it stands; no history, no provider configuration).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotState {
    definition_id: String,
    definition_revision: u64,
    plan_id: String,
    progress: Progress,
    boundary: u64,
    last_sequence: u64,
}

fn require_snapshots(daemon: &Daemon, session: &pb::ClientSession) -> Result<(), Status> {
    let standing = daemon.fence(Some(session))?;
    if standing.minor < 1 {
        return Err(Status::failed_precondition(format!(
            "capability_not_negotiated: {CAP_SNAPSHOTS} needs protocol minor 1 (negotiated minor {})",
            standing.minor
        )));
    }
    Ok(())
}

/// `ExportSnapshot`: a signed snapshot of a suspended run.
///
/// # Errors
/// `capability_not_negotiated`, `run_not_suspended` (`FAILED_PRECONDITION`).
pub async fn export_snapshot(
    daemon: &Arc<Daemon>,
    request: pb::ExportSnapshotRequest,
) -> Result<pb::ExportSnapshotResponse, Status> {
    let session = session_of(request.session.as_ref())?.clone();
    require_snapshots(daemon, &session)?;
    let run = daemon.run(&request.run_id)?;
    let Lifecycle::Suspended { boundary } = run.lifecycle() else {
        return Err(Status::failed_precondition(format!(
            "run_not_suspended: run {} is not at a suspended boundary",
            run.id
        )));
    };
    let progress = {
        let conn = daemon.db.lock().map_err(|_| Status::internal("poisoned"))?;
        runs::progress(&conn, &run.id)
            .map_err(unavailable)?
            .ok_or_else(|| Status::internal("the run's row is missing"))?
    };
    let state = SnapshotState {
        definition_id: run.definition.id.clone(),
        definition_revision: run.definition.revision,
        plan_id: run.plan_id.clone(),
        progress,
        boundary,
        last_sequence: run.log.latest(),
    };
    let mut snapshot = pb::Snapshot {
        format_version: SNAPSHOT_FORMAT.into(),
        run_id: run.id.clone(),
        suspended: true,
        state: serde_json::to_vec(&state).map_err(|e| Status::internal(e.to_string()))?,
        authority: None,
    };
    daemon.authority.sign(&mut snapshot)?;
    Ok(pb::ExportSnapshotResponse {
        snapshot: Some(snapshot),
    })
}

/// `ImportSnapshot`: verify first, then prepare → own → commit a suspended run with the
/// snapshot's run ID.
///
/// # Errors
/// The authority's (before anything else), `snapshot_version_unsupported`,
/// `snapshot_not_suspended`, `unknown_definition`, `run_exists` (`ALREADY_EXISTS`),
/// `invalid_snapshot`, the fence's and the ledger's.
pub async fn import_snapshot(
    daemon: &Arc<Daemon>,
    request: pb::ImportSnapshotRequest,
) -> Result<pb::ImportSnapshotResponse, Status> {
    let session = session_of(request.session.as_ref())?.clone();
    check_operation_id(&request.client_operation_id)?;
    let snapshot = request
        .snapshot
        .clone()
        .ok_or_else(|| Status::invalid_argument("invalid_snapshot: snapshot is required"))?;
    let d = digest(&request, |r| r.session = None);
    let e = entry(&session, &request.client_operation_id, "ImportSnapshot", d);
    let owner = daemon.clone();
    let answer = daemon
        .ledger
        .once(e, || require_snapshots(daemon, &session), move |entry| async move {
            // "import requires keyed HMAC verification before state mutation"
            owner.authority.verify(&snapshot)?;
            if snapshot.format_version != SNAPSHOT_FORMAT {
                return Err(Status::failed_precondition(format!(
                    "snapshot_version_unsupported: format {:?}, this daemon imports {SNAPSHOT_FORMAT:?}",
                    snapshot.format_version
                )));
            }
            if !snapshot.suspended {
                return Err(Status::failed_precondition(
                    "snapshot_not_suspended: only suspended snapshots are imported",
                ));
            }
            if snapshot.state.len() > super::snapshot::STATE_MAX_BYTES {
                return Err(Status::invalid_argument("invalid_snapshot: state is too large"));
            }
            let state: SnapshotState = serde_json::from_slice(&snapshot.state)
                .map_err(|e| Status::invalid_argument(format!("invalid_snapshot: state: {e}")))?;
            let definition = pb::DefinitionRef {
                id: state.definition_id.clone(),
                revision: state.definition_revision,
            };
            if !definitions()
                .definitions
                .iter()
                .any(|d| d.id == definition.id && d.revision == definition.revision)
            {
                return Err(Status::failed_precondition(format!(
                    "unknown_definition: the snapshot's definition {}@{} is not advertised here",
                    definition.id, definition.revision
                )));
            }
            let run_id = snapshot.run_id.clone();
            if run_id.is_empty() || run_id.len() > runs::RUN_ID_MAX_BYTES {
                return Err(Status::invalid_argument("invalid_snapshot: run_id"));
            }
            let response = pb::ImportSnapshotResponse {
                run_id: run_id.clone(),
                deduplicated: false,
            };
            let base = owner.profile.imported_base(state.last_sequence);
            let log = RunLog::new(&run_id, base, base + 1, false);
            {
                let mut conn = owner.db.lock().map_err(|_| Status::internal("poisoned"))?;
                if runs::exists(&conn, &run_id).map_err(unavailable)? {
                    return Err(Status::already_exists(format!(
                        "run_exists: run {run_id} already exists on this daemon"
                    )));
                }
                let tx = conn.transaction().map_err(unavailable)?;
                runs::insert(
                    &tx,
                    &RunRow {
                        run_id: run_id.clone(),
                        client_id: entry.client_id.clone(),
                        definition: definition.clone(),
                        plan_id: state.plan_id.clone(),
                        progress: state.progress.clone(),
                        state: "suspended".into(),
                        boundary: state.boundary,
                        outcome: 0,
                        base_sequence: base,
                    },
                )
                .map_err(unavailable)?;
                entry
                    .record(&tx, &response.encode_to_vec())
                    .map_err(unavailable)?;
                tx.commit().map_err(unavailable)?;
            }
            let run = Run::new(
                run_id,
                definition,
                state.plan_id,
                log,
                Lifecycle::Suspended {
                    boundary: state.boundary,
                },
            );
            run.interactions().revision = owner.profile.interaction_revision_origin();
            owner.runs.insert(run.clone());
            executor::spawn(owner.deps(), run, state.progress, false);
            Ok(Done {
                response: response.encode_to_vec(),
                recorded: true,
            })
        })
        .await?;
    let mut response: pb::ImportSnapshotResponse = decode(&answer.response)?;
    response.deduplicated = answer.deduplicated;
    Ok(response)
}
