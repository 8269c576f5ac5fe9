//! What a cell of the controlled host may ask ("Message vocabulary", "Scope, waiting and
//! receipts"): `runtime.inspect`, `runtime.wait` recorded by the turn boundary,
//! `local.send` reviewed by the cell's pinned policy into the durable operator lane,
//! `hooks.list` and `hooks.describe` of that pinned policy ([`crate::worker::slots`]), and
//! the source work (`workspace.info`, `workspace.run`, `evidence.resolve`) of
//! [`crate::worker::workspace`], `maintenance.*`, `orientation.*` and `peer.*` from the
//! host's durable [`crate::worker::stores`], and `behavior.activate` through the host's
//! activation authority ([`Policies`]); a `workspace.run`, a waiting `peer.result` and an
//! activation are answered beside the cell's exchange ([`RequestHandler::start`]), so
//! that none of them holds up the cell's other requests, its interrupt or its end.
//! `runtime.instructions` and the skills requests are answered by the handlers in front
//! of this one; `frontier.select` and `remote.*` are answered `unsupported_method` (the
//! message names the method and why). This module never touches the worker connection.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;

use crate::worker::activation::Policies;
use crate::worker::host::{BasicServices, PendingReply, RequestHandler};
use crate::worker::lane::OperatorLane;
use crate::worker::policy::Policy;
use crate::worker::stores::HostStores;
use crate::worker::turns::TurnBoundary;
use crate::worker::wire::{HostRequest, Identifier, Reply};
use crate::worker::workspace::Workspace;

/// What a cell of the controlled host may ask (see the module docs).
pub(super) struct Services {
    pub(super) policy: Option<Arc<Policy>>,
    /// The host's activation authority (`behavior.activate`).
    pub(super) policies: Arc<Policies>,
    pub(super) lane: Arc<OperatorLane>,
    /// The test hook of `configure` (`crash_after_commit`): the host dies as SIGKILL
    /// would between the lane's commit of a send and its reply.
    pub(super) crash_after_commit: bool,
    pub(super) turns: Arc<TurnBoundary>,
    pub(super) session: String,
    pub(super) workspace: Arc<Workspace>,
    /// The priority the host wakes at where the attention hook does not decide.
    pub(super) host_priority: u32,
    /// The stores of `maintenance.*`, `orientation.*` and `peer.*`.
    pub(super) stores: Arc<HostStores>,
    /// The different profile ([`vary`]).
    pub(super) different: bool,
}

/// The different profile's spelling of what this module answers where the spec leaves it
/// free (the stores and the workspace vary their own): the value of an accepted wait and
/// of an activation, a held receipt's reason, and every error code (`host.` and the code
/// with hyphens) and message of a wait, a send, an activation and an unsupported method.
fn vary(request: &HostRequest, reply: Reply) -> Reply {
    let ours = matches!(
        request,
        HostRequest::RuntimeWait { .. }
            | HostRequest::LocalSend { .. }
            | HostRequest::BehaviorActivate { .. }
    ) || !served_elsewhere(request);
    if !ours {
        return reply;
    }
    match reply {
        Reply::Error { code, message } => Reply::Error {
            code: format!("host.{}", code.replace('_', "-")),
            message: format!("{}: {message}", request.method()),
        },
        Reply::Ok { mut value } => {
            match request {
                HostRequest::RuntimeWait { .. } => {
                    value = json!({
                        "waiting": true,
                        "id": value.get("wait_id").cloned().unwrap_or_default(),
                        "until_ms": value.get("deadline_ms").cloned().unwrap_or_default(),
                    });
                }
                HostRequest::BehaviorActivate { .. } => {
                    value = json!({
                        "source_identity": value.get("revision").cloned().unwrap_or_default(),
                        "active_epoch": value.get("epoch").cloned().unwrap_or_default(),
                    });
                }
                HostRequest::LocalSend { .. } => {
                    if let Some(reason) = value.get("reason").and_then(|r| r.as_str()) {
                        value["reason"] = json!(format!("the delivery review held it ({reason})"));
                    }
                }
                _ => {}
            }
            Reply::Ok { value }
        }
    }
}

/// Whether a request is answered by a module that spells its own replies (the stores, the
/// workspace, the slots, the clock).
fn served_elsewhere(request: &HostRequest) -> bool {
    matches!(
        request,
        HostRequest::RuntimeInspect {}
            | HostRequest::HooksList {}
            | HostRequest::HooksDescribe { .. }
            | HostRequest::WorkspaceInfo {}
            | HostRequest::WorkspaceRun { .. }
            | HostRequest::EvidenceResolve { .. }
    ) || ["maintenance.", "orientation.", "peer."]
        .iter()
        .any(|prefix| request.method().starts_with(prefix))
}

#[async_trait]
impl RequestHandler for Services {
    async fn handle(
        &mut self,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Reply {
        let reply = self.answer(execution_id, request_id, request).await;
        if self.different {
            vary(request, reply)
        } else {
            reply
        }
    }

    fn start(
        &mut self,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Option<PendingReply> {
        let pending = self.begin(execution_id, request_id, request)?;
        if !self.different {
            return Some(pending);
        }
        let request = request.clone();
        Some(Box::pin(async move { vary(&request, pending.await) }))
    }
}

impl Services {
    /// A request answered in line (ours; [`vary`] spells the different profile's).
    async fn answer(
        &mut self,
        execution_id: &Identifier,
        request_id: &Identifier,
        request: &HostRequest,
    ) -> Reply {
        if let Some(reply) = self
            .stores
            .handle(&self.session, execution_id, request_id, request)
        {
            return reply;
        }
        let text = match request {
            HostRequest::LocalSend { text } => text,
            HostRequest::RuntimeWait { seconds, reason } => {
                return self.wait(execution_id, request_id, seconds.0, reason);
            }
            HostRequest::HooksList {} => {
                return Reply::Ok {
                    value: crate::worker::slots::list(self.policy.as_deref()).await,
                };
            }
            HostRequest::HooksDescribe { slot } => {
                let value = crate::worker::slots::describe(
                    self.policy.as_deref(),
                    *slot,
                    self.host_priority,
                )
                .await;
                return Reply::Ok { value };
            }
            HostRequest::WorkspaceInfo {} => return self.workspace.info(),
            // The cell's exchange takes a run through `start`; this is the same run
            // answered in line.
            HostRequest::WorkspaceRun {
                argv,
                cwd,
                env,
                timeout_ms,
                max_output_bytes,
            } => {
                return self
                    .workspace
                    .run(argv, cwd, env, *timeout_ms, *max_output_bytes)
                    .await;
            }
            HostRequest::EvidenceResolve { refs } => return self.workspace.resolve(refs),
            // The cell's exchange takes an activation through `start`; this is the same
            // activation answered in line.
            HostRequest::BehaviorActivate {
                path,
                expected_epoch,
            } => return activate(self.policies.clone(), path, *expected_epoch).await,
            _ => {
                return BasicServices
                    .handle(execution_id, request_id, request)
                    .await;
            }
        };
        // The effect is the request's identity (not the generation's): a retry of it
        // returns its receipt, also from the same execution run again after a restart.
        let effect_id = crate::worker::lane::effect_id(
            &self.session,
            execution_id.as_str(),
            request_id.as_str(),
        );
        let lane_error = |e: String| Reply::Error {
            code: "lane_failed".into(),
            message: e,
        };
        match self.lane.existing(&effect_id) {
            Ok(Some(receipt)) => {
                return Reply::Ok {
                    value: serde_json::to_value(receipt).unwrap_or_default(),
                };
            }
            Ok(None) => {}
            Err(e) => return lane_error(e),
        }
        let input = json!({"effect_id": effect_id, "destination": "operator", "text": text});
        let held = match Policy::review(self.policy.as_deref(), &input).await {
            Ok(review) => match review.decision {
                crate::worker::wire::hooks::DeliveryDecision::Allow => None,
                crate::worker::wire::hooks::DeliveryDecision::Hold { reason } => Some(reason),
            },
            Err(e) => Some(format!("review unavailable: {}", e.code())),
        };
        match self.lane.record(&effect_id, text, held.as_deref()) {
            Ok(_) if self.crash_after_commit => crash_now(),
            Ok(receipt) => Reply::Ok {
                value: serde_json::to_value(receipt).unwrap_or_default(),
            },
            Err(e) => lane_error(e),
        }
    }

    /// A request answered beside the cell's exchange (ours).
    fn begin(
        &mut self,
        _execution_id: &Identifier,
        _request_id: &Identifier,
        request: &HostRequest,
    ) -> Option<PendingReply> {
        if let HostRequest::BehaviorActivate {
            path,
            expected_epoch,
        } = request
        {
            return Some(Box::pin(activate(
                self.policies.clone(),
                path,
                *expected_epoch,
            )));
        }
        if let Some(reply) = self.stores.start(request) {
            return Some(reply);
        }
        let HostRequest::WorkspaceRun {
            argv,
            cwd,
            env,
            timeout_ms,
            max_output_bytes,
        } = request
        else {
            return None;
        };
        let workspace = self.workspace.clone();
        let (argv, cwd, env) = (argv.clone(), cwd.clone(), env.clone());
        let (timeout_ms, max_output_bytes) = (*timeout_ms, *max_output_bytes);
        Some(Box::pin(async move {
            workspace
                .run(&argv, &cwd, &env, timeout_ms, max_output_bytes)
                .await
        }))
    }

    /// `runtime.wait`: the turn boundary records the wait (or refuses it over pending
    /// input) in one transaction; an accepted wait is what lets the cell end yielded.
    fn wait(
        &self,
        execution_id: &Identifier,
        request_id: &Identifier,
        seconds: Option<f64>,
        reason: &str,
    ) -> Reply {
        // Keyed like a send's receipt (the request's identity, not the generation's): the
        // same request retried, also by the execution run again after a restart, gets the
        // wait already recorded.
        let identity = crate::worker::lane::effect_id(
            &self.session,
            execution_id.as_str(),
            request_id.as_str(),
        );
        let now_ms = crate::worker::host::now_since_epoch().as_millis() as u64;
        match self
            .turns
            .wait(&self.session, &identity, seconds, reason, now_ms)
        {
            Ok(wait) => Reply::Ok {
                value: serde_json::to_value(wait).unwrap_or_default(),
            },
            Err(e) => Reply::Error {
                code: e.code().into(),
                message: e.to_string(),
            },
        }
    }
}

/// `behavior.activate` ("Source revisions and activation"): the same activation as the
/// control channel's `activate` (source identity, epoch check, candidate handshake, then
/// the compare-and-swap), answered `{epoch, revision}` or an error with the activation's
/// code (`not_absolute`, `source_refused`, `stale_epoch`, `candidate_failed`,
/// `store_failed`). It runs as a task of its own: a cell that ends first abandons the
/// reply, never an activation half done. The cell that asked keeps the policy it pinned
/// ("Each executing cell pins its policy object").
fn activate(
    policies: Arc<Policies>,
    path: &str,
    expected_epoch: u64,
) -> impl std::future::Future<Output = Reply> + Send + 'static {
    let path = std::path::PathBuf::from(path);
    let task = tokio::spawn(async move { policies.activate(&path, expected_epoch).await });
    async move {
        match task.await {
            Ok(Ok(activated)) => Reply::Ok {
                value: json!({"epoch": activated.epoch, "revision": activated.revision}),
            },
            Ok(Err(e)) => Reply::Error {
                code: e.code().into(),
                message: e.to_string(),
            },
            Err(e) => Reply::Error {
                code: "store_failed".into(),
                message: format!("the activation did not finish: {e}"),
            },
        }
    }
}

/// The host dies at once, as SIGKILL would (no destructor, no reply, no flush): the
/// `crash_after_commit` test hook, so that a scenario sees a send committed and never
/// answered. The supervisor of each worker stops it when the host's watch connection ends.
fn crash_now() -> ! {
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    std::process::abort()
}
