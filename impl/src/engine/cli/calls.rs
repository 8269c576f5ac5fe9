//! The client subcommands' calls and their output (see the parent module for exit
//! statuses and the client-state file).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use prost::Message;
use serde_json::json;

use super::state::{ClientState, StateError, write_private};
use super::{ClientCommand, Endpoint};
use crate::engine::client::{self, ClientError, Ownership};
use crate::engine::json::to_json;
use crate::engine::proto::common::v1::{Outcome, ProtocolVersion};
use crate::engine::proto::engine::v1 as pb;
use crate::engine::session::{Session, SessionError, operation_id};
use pb::initialize_response::Result as R;
use pb::run_event::Kind;

/// How a command failed.
enum Failure {
    /// The daemon answered no (exit 1).
    Refused(String),
    /// The daemon could not be reached, or a local file failed (exit 2).
    Unreachable(String),
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Failure::Refused(format!("{:?}: {}", s.code(), s.message()))
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Status(s) => s.into(),
            other => Failure::Unreachable(format!("{other} ({})", other.code())),
        }
    }
}

impl From<SessionError> for Failure {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Client(c) => c.into(),
            SessionError::Refused(r) => Failure::Refused(describe_refusal(&r)),
            other @ SessionError::CapabilityNotNegotiated { .. } => {
                Failure::Refused(format!("{other} ({})", other.code()))
            }
        }
    }
}

impl From<StateError> for Failure {
    fn from(e: StateError) -> Self {
        Failure::Unreachable(format!("{e} ({})", e.code()))
    }
}

fn version(v: Option<&ProtocolVersion>) -> String {
    v.map_or_else(|| "?".into(), |v| format!("{}.{}", v.major, v.minor))
}

fn describe_refusal(r: &R) -> String {
    match r {
        R::Initialized(i) => format!("initialized as {} at epoch {}", i.client_id, i.epoch),
        R::StaleClaim(s) => format!(
            "stale claim: {} expected epoch {}, the daemon holds {}",
            s.client_id, s.expected_epoch, s.current_epoch
        ),
        R::IncompatibleVersion(v) => format!(
            "incompatible version {}: the daemon supports {}..{}",
            version(v.observed.as_ref()),
            version(v.supported_min.as_ref()),
            version(v.supported_max.as_ref())
        ),
        R::MissingCapability(m) => format!(
            "missing capabilities {:?} at protocol {} (offered: {:?})",
            m.missing,
            version(m.negotiated.as_ref()),
            m.offered
        ),
    }
}

/// Prints `value` (with `--json`) or `text`.
fn say(endpoint: &Endpoint, value: serde_json::Value, text: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = if endpoint.json {
        writeln!(out, "{value}")
    } else {
        writeln!(out, "{text}")
    };
}

/// Opens a session: a reconnect as the recorded client (then the new epoch recorded), or
/// a new owner.
async fn open(endpoint: &Endpoint, required: &[String]) -> Result<Session, Failure> {
    let recorded = match &endpoint.client_state {
        Some(path) => ClientState::load(path)?,
        None => None,
    };
    let ownership = ClientState::ownership(recorded);
    let session =
        Session::open(&endpoint.socket, &endpoint.token_file, &ownership, required).await?;
    if let Some(path) = &endpoint.client_state {
        ClientState::of(&session).store(path)?;
    }
    Ok(session)
}

fn outcome_name(outcome: i32) -> String {
    Outcome::try_from(outcome).map_or_else(
        |_| format!("unknown outcome {outcome}"),
        |o| {
            o.as_str_name()
                .trim_start_matches("OUTCOME_")
                .to_lowercase()
        },
    )
}

/// One event as a line a person reads.
fn event_line(e: &pb::RunEvent) -> String {
    let what = match &e.kind {
        Some(Kind::Started(s)) => format!(
            "started {}@{} (plan {})",
            s.definition_id, s.definition_revision, s.plan_id
        ),
        Some(Kind::Message(m)) => format!("message: {}", m.text),
        Some(Kind::TurnCompleted(t)) => format!("turn {} completed", t.turn),
        Some(Kind::ToolOutcome(t)) => format!(
            "tool {}: {}{}",
            t.tool,
            outcome_name(t.outcome),
            t.uncertain
                .as_ref()
                .map(|u| format!(" ({})", u.sentinel))
                .unwrap_or_default()
        ),
        Some(Kind::InteractionOpened(i)) => format!("interaction {} opened", i.interaction_id),
        Some(Kind::InteractionClosed(i)) => format!("interaction {} closed", i.interaction_id),
        Some(Kind::Suspended(_)) => "suspended".into(),
        Some(Kind::Resumed(_)) => "resumed".into(),
        Some(Kind::Terminal(t)) => format!(
            "run ended: {}{}",
            outcome_name(t.outcome),
            t.uncertain
                .as_ref()
                .map(|u| format!(" ({}: {})", u.sentinel, u.summary))
                .unwrap_or_default()
        ),
        None => "unknown event".into(),
    };
    format!("#{} {what}", e.sequence)
}

async fn follow(
    session: &mut Session,
    endpoint: &Endpoint,
    run: &str,
    after: u64,
    page: u32,
    tail: bool,
) -> Result<(), Failure> {
    let progress = !endpoint.json && std::io::stderr().is_terminal();
    let mut count = 0u64;
    let mut missed = 0u64;
    let followed = session
        .follow_across_gaps(
            run,
            after,
            page,
            tail,
            |e| {
                count += 1;
                let value = to_json(e, "engine.v1.RunEvent").unwrap_or_default();
                say(endpoint, value, event_line(e));
                if progress && count.is_multiple_of(256) {
                    eprint!("\rfollowing {run}: {count} events, at #{}", e.sequence);
                }
            },
            |from, to| {
                missed += to + 1 - from;
                say(
                    endpoint,
                    json!({"gap": {"first": from, "last": to}}),
                    format!("#{from}..#{to} were pruned before this reader read them (the daemon's retention)"),
                );
            },
        )
        .await?;
    if progress && count >= 256 {
        eprintln!();
    }
    if !endpoint.json {
        let end = followed
            .terminal
            .as_ref()
            .map_or_else(|| "still running".to_string(), |t| outcome_name(t.outcome));
        eprintln!(
            "run {run}: {end}; {count} events followed, last #{}{}{}",
            followed.last_sequence,
            if followed.reopened > 0 {
                format!(", {} streams reopened", followed.reopened)
            } else {
                String::new()
            },
            if missed > 0 {
                format!(", {missed} events missed (pruned before they were read)")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

fn definition(session: &Session, asked: Option<&str>) -> Result<pb::DefinitionRef, Failure> {
    let advertised = session
        .initialized
        .definitions
        .clone()
        .unwrap_or_default()
        .definitions;
    match asked {
        None => advertised
            .first()
            .map(|d| pb::DefinitionRef {
                id: d.id.clone(),
                revision: d.revision,
            })
            .ok_or_else(|| Failure::Refused("the daemon advertises no definition".into())),
        Some(text) => {
            let (id, revision) = text
                .rsplit_once('@')
                .and_then(|(id, r)| r.parse().ok().map(|r| (id, r)))
                .ok_or_else(|| {
                    Failure::Unreachable(format!("--definition {text}: expected ID@REVISION"))
                })?;
            Ok(pb::DefinitionRef {
                id: id.to_string(),
                revision,
            })
        }
    }
}

async fn call(command: ClientCommand) -> Result<(), Failure> {
    match command {
        ClientCommand::Initialize {
            endpoint,
            client_id,
            epoch,
            required,
        } => {
            let mut c = client::connect(&endpoint.socket, &endpoint.token_file).await?;
            let ownership = match (client_id, epoch) {
                (Some(client_id), Some(epoch)) => Ownership::Reconnect { client_id, epoch },
                _ => Ownership::New,
            };
            let result = client::initialize(
                &mut c,
                &ownership,
                &required,
                crate::engine::compat::MINOR_MAX,
            )
            .await?;
            let value = to_json(
                &pb::InitializeResponse {
                    result: Some(result.clone()),
                },
                "engine.v1.InitializeResponse",
            )
            .unwrap_or_default();
            let (value, text) = match &result {
                R::Initialized(i) => (
                    json!({"result": "initialized", "client_id": i.client_id, "epoch": i.epoch,
                        "negotiated": version(i.negotiated.as_ref()), "capabilities": i.capabilities,
                        "definitions": i.definitions.as_ref().map(|d| d.definitions.iter().map(|d| format!("{}@{}", d.id, d.revision)).collect::<Vec<_>>()).unwrap_or_default(),
                        "response": value}),
                    format!(
                        "client {} at epoch {} (protocol {})",
                        i.client_id,
                        i.epoch,
                        version(i.negotiated.as_ref())
                    ),
                ),
                R::StaleClaim(_) => (
                    json!({"result": "stale_claim", "response": value}),
                    describe_refusal(&result),
                ),
                R::IncompatibleVersion(_) => (
                    json!({"result": "incompatible_version", "response": value}),
                    describe_refusal(&result),
                ),
                R::MissingCapability(_) => (
                    json!({"result": "missing_capability", "response": value}),
                    describe_refusal(&result),
                ),
            };
            say(&endpoint, value, &text);
            if matches!(result, R::Initialized(_)) {
                Ok(())
            } else {
                Err(Failure::Refused(String::new()))
            }
        }
        ClientCommand::Health { endpoint } => {
            let mut c = client::connect(&endpoint.socket, &endpoint.token_file).await?;
            let h = c
                .health(pb::HealthRequest {})
                .await
                .map_err(Failure::from)?
                .into_inner();
            let readiness =
                pb::Readiness::try_from(h.readiness).map_or("unknown".to_string(), |r| {
                    r.as_str_name()
                        .trim_start_matches("READINESS_")
                        .to_lowercase()
                });
            let mut text = format!("{readiness}, {} active runs", h.active_runs);
            for reason in &h.degraded_reasons {
                text.push_str(&format!("\n  degraded: {reason}"));
            }
            say(
                &endpoint,
                json!({"readiness": readiness, "active_runs": h.active_runs, "degraded_reasons": h.degraded_reasons}),
                text,
            );
            Ok(())
        }
        ClientCommand::Run {
            endpoint,
            message,
            definition: asked,
            operation_id: op,
            detach,
        } => {
            let mut s = open(&endpoint, &[]).await?;
            let def = definition(&s, asked.as_deref())?;
            let op = op.unwrap_or_else(operation_id);
            let started = s.start_run(def, &message, &op).await?;
            say(
                &endpoint,
                json!({"run_id": started.run_id, "initial_sequence": started.initial_sequence, "plan_id": started.plan_id, "operation_id": op}),
                format!("run {} (plan {})", started.run_id, started.plan_id),
            );
            if detach {
                return Ok(());
            }
            follow(
                &mut s,
                &endpoint,
                &started.run_id,
                0,
                crate::engine::daemon::limits::MAX_PAGE_EVENTS,
                true,
            )
            .await
        }
        ClientCommand::Follow {
            endpoint,
            run,
            after,
            page,
            no_tail,
        } => {
            let mut s = open(&endpoint, &[]).await?;
            follow(&mut s, &endpoint, &run, after, page, !no_tail).await
        }
        ClientCommand::Interactions { endpoint, run } => {
            let mut s = open(&endpoint, &[]).await?;
            let snapshot = s.interactions(&run).await?;
            let mut text = format!(
                "revision {}: {} pending",
                snapshot.revision,
                snapshot.pending.len()
            );
            for p in &snapshot.pending {
                text.push_str(&format!(
                    "\n  {}: {} (schema {})",
                    p.interaction_id, p.prompt, p.response_schema_json
                ));
            }
            say(
                &endpoint,
                to_json(&snapshot, "engine.v1.InteractionSnapshot").unwrap_or_default(),
                text,
            );
            Ok(())
        }
        ClientCommand::Respond {
            endpoint,
            run,
            interaction,
            response,
            operation_id: op,
        } => {
            let mut s = open(&endpoint, &[]).await?;
            let op = op.unwrap_or_else(operation_id);
            let r = s.respond(&run, &interaction, &response, &op).await?;
            say(
                &endpoint,
                json!({"deduplicated": r.deduplicated, "operation_id": op}),
                if r.deduplicated {
                    format!("{interaction}: answered before (operation {op})")
                } else {
                    format!("{interaction}: answered")
                },
            );
            Ok(())
        }
        ClientCommand::Cancel {
            endpoint,
            run,
            operation_id: op,
        } => {
            let mut s = open(&endpoint, &[]).await?;
            let r = s.cancel(&run, &op.unwrap_or_else(operation_id)).await?;
            say(
                &endpoint,
                json!({"already_terminal": r.already_terminal, "outcome": outcome_name(r.outcome)}),
                if r.already_terminal {
                    format!("run {run} had already ended: {}", outcome_name(r.outcome))
                } else {
                    format!("run {run} ended: {}", outcome_name(r.outcome))
                },
            );
            Ok(())
        }
        ClientCommand::Suspend {
            endpoint,
            run,
            operation_id: op,
        } => {
            let mut s = open(&endpoint, &[]).await?;
            let r = s.suspend(&run, &op.unwrap_or_else(operation_id)).await?;
            say(
                &endpoint,
                json!({"boundary_sequence": r.boundary_sequence}),
                format!("run {run} suspended after #{}", r.boundary_sequence),
            );
            Ok(())
        }
        ClientCommand::Resume {
            endpoint,
            run,
            operation_id: op,
        } => {
            let mut s = open(&endpoint, &[]).await?;
            let r = s.resume(&run, &op.unwrap_or_else(operation_id)).await?;
            say(
                &endpoint,
                json!({"run_id": r.run_id}),
                format!("run {} resumed", r.run_id),
            );
            Ok(())
        }
        ClientCommand::Export { endpoint, run, out } => {
            let mut s = open(
                &endpoint,
                &[crate::engine::compat::CAP_SNAPSHOT_AUTHORITY_V1.to_string()],
            )
            .await?;
            let snapshot = s.export(&run).await?;
            write_private(&out, &snapshot.encode_to_vec())?;
            say(
                &endpoint,
                json!({"run_id": snapshot.run_id, "format_version": snapshot.format_version, "file": out}),
                format!(
                    "run {} exported to {} ({})",
                    snapshot.run_id,
                    out.display(),
                    snapshot.format_version
                ),
            );
            Ok(())
        }
        ClientCommand::Import {
            endpoint,
            file,
            operation_id: op,
        } => {
            let bytes = std::fs::read(&file)
                .map_err(|e| Failure::Unreachable(format!("{}: {e}", file.display())))?;
            let snapshot = pb::Snapshot::decode(bytes.as_slice()).map_err(|e| {
                Failure::Unreachable(format!("{}: not a snapshot: {e}", file.display()))
            })?;
            let mut s = open(
                &endpoint,
                &[crate::engine::compat::CAP_SNAPSHOT_AUTHORITY_V1.to_string()],
            )
            .await?;
            let r = s.import(snapshot, &op.unwrap_or_else(operation_id)).await?;
            say(
                &endpoint,
                json!({"run_id": r.run_id, "deduplicated": r.deduplicated}),
                format!(
                    "run {} imported (suspended){}",
                    r.run_id,
                    if r.deduplicated { ", as before" } else { "" }
                ),
            );
            Ok(())
        }
    }
}

/// Runs one client subcommand.
pub async fn run(command: ClientCommand) -> ExitCode {
    match call(command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Refused(why)) => {
            if !why.is_empty() {
                eprintln!("contract-impl engine: {why}");
            }
            ExitCode::from(1)
        }
        Err(Failure::Unreachable(why)) => {
            eprintln!("contract-impl engine: {why}");
            ExitCode::from(2)
        }
    }
}
