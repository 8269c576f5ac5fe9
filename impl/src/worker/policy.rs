//! The host's side of the decision slots ("Implemented decision slots"): one hook
//! worker generation behind one bounded actor, the two-second invocation budget that
//! includes queueing, and what the host makes of a decision.
//!
//! * [`Policy::attention`]: the `attention.plan` input is checked before it is sent; the
//!   decision is checked after; "operator attention cannot be suppressed or forged from
//!   an external source by returning a priority": an `operator` event always wakes, and
//!   only the host-classified source makes a plan `operator`.
//! * [`Policy::review`]: "any invalid/unavailable required review holds the send".
//! * The budget ([`INVOKE_BUDGET`]) runs from the call, so time spent waiting behind a
//!   hung call counts; the call that spends it invalidates the generation (the worker is
//!   stopped and every later call is unavailable: "no automatic hook restart").
//!
//! This module never decides what a send *does* (the host services'); it only answers
//! allow or hold, and never retries a hook.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::sync::Mutex;

use super::host::{HostConfig, HostError, Worker};
use super::wire::hooks::{
    AttentionDecision, AttentionInput, AttentionSource, DeliveryDecision, DeliveryInput,
    REVIEW_TEXT_MAX_BYTES,
};
use super::wire::limits::HOOK_BUDGET_MS;
use super::wire::{Completion, Slot};

/// "The host's two-second invocation budget includes queueing."
pub const INVOKE_BUDGET: Duration = Duration::from_millis(HOOK_BUDGET_MS);

/// The wake priority of an operator event whose policy did not wake it, and of any
/// event whose policy is unavailable (our reference: attention is never lost).
pub const HOST_WAKE_PRIORITY: u32 = 0;

/// Who made a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    /// The hook's decision, applied as it is.
    Hook,
    /// The host's own (the hook was unavailable, invalid, or not allowed to decide).
    Host,
}

/// The host's attention plan for one event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttentionPlan {
    /// The plan (`wake`, `defer`, `ignore` and their fields).
    #[serde(flatten)]
    pub decision: AttentionDecision,
    /// Whether this is operator attention: only the host-classified source says so.
    pub operator: bool,
    /// Who decided.
    pub decided_by: DecidedBy,
    /// The policy revision consulted (`None`: no policy).
    pub revision: Option<String>,
    /// Why the host decided itself (unavailable or invalid hook), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The host's review of one send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Review {
    /// `allow` or `hold` with its reason.
    #[serde(flatten)]
    pub decision: DeliveryDecision,
    /// Who decided.
    pub decided_by: DecidedBy,
    /// The policy revision consulted (`None`: no policy).
    pub revision: Option<String>,
}

/// Why a hook gave no usable decision (stable [`code`](Self::code)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// The budget ran out (queueing included); the generation was invalidated if the
    /// call was on the wire.
    #[error("the hook did not decide within {0:?}")]
    Budget(Duration),
    /// The generation is gone (invalidated earlier, or no policy is active).
    #[error("no hook generation is available")]
    NoGeneration,
    /// The worker failed the call (`completed` `failed`) or broke the protocol.
    #[error("the hook failed: {0}")]
    Failed(String),
    /// The decision is not one of the slot's.
    #[error("the hook's decision is invalid: {0}")]
    Invalid(String),
    /// The input is not the slot's (refused before the call).
    #[error("the input is invalid: {0}")]
    Input(String),
}

impl Unavailable {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            Unavailable::Budget(_) => "hook_budget",
            Unavailable::NoGeneration => "no_generation",
            Unavailable::Failed(_) => "hook_failed",
            Unavailable::Invalid(_) => "invalid_decision",
            Unavailable::Input(_) => "invalid_input",
        }
    }
}

/// One hook worker generation and its revision.
pub struct Policy {
    revision: String,
    budget: Duration,
    worker: Mutex<Option<Worker>>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("revision", &self.revision)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// Starts a hook worker for `config` (role `hooks`) and completes its handshake
    /// (the announced revision must be the snapshot's source identity).
    ///
    /// # Errors
    /// The [`HostError`] of the launch or handshake (the candidate is stopped).
    pub async fn start(config: HostConfig, budget: Duration) -> Result<Arc<Self>, HostError> {
        let worker = Worker::spawn(config).await?;
        let revision = worker.revision.clone().unwrap_or_default();
        Ok(Arc::new(Self {
            revision,
            budget,
            worker: Mutex::new(Some(worker)),
        }))
    }

    /// The revision (source identity) of this generation.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// Whether the generation can still take calls.
    pub async fn is_live(&self) -> bool {
        self.worker
            .lock()
            .await
            .as_ref()
            .is_some_and(Worker::is_valid)
    }

    /// One call within the budget, counted from now.
    async fn call(&self, slot: Slot, input: Value) -> Result<Value, Unavailable> {
        let deadline = tokio::time::Instant::now() + self.budget;
        let mut guard = tokio::time::timeout_at(deadline, self.worker.lock())
            .await
            .map_err(|_| Unavailable::Budget(self.budget))?;
        let Some(worker) = guard.as_mut().filter(|w| w.is_valid()) else {
            return Err(Unavailable::NoGeneration);
        };
        match tokio::time::timeout_at(deadline, worker.invoke(slot, input)).await {
            Err(_) => {
                // "a hung callback can delay other calls until timeout invalidates that
                // generation."
                worker.hard_stop().await;
                Err(Unavailable::Budget(self.budget))
            }
            Ok(Err(e)) => Err(Unavailable::Failed(format!("{e} ({})", e.code()))),
            Ok(Ok(Completion::Hook { value })) => Ok(value),
            Ok(Ok(Completion::Failed { error })) => Err(Unavailable::Failed(error)),
            Ok(Ok(Completion::Cell { .. })) => Err(Unavailable::Failed("a cell completion".into())),
        }
    }

    /// Stops the generation (clean `shutdown`, then the hard stop).
    pub async fn shutdown(&self) {
        if let Some(mut worker) = self.worker.lock().await.take() {
            worker.shutdown(super::host::SHUTDOWN_GRACE).await;
        }
    }

    /// The attention plan for `input` (a JSON object, checked here first); where the
    /// host decides itself it wakes at `host_priority` ([`HOST_WAKE_PRIORITY`] in ours).
    pub async fn attention(
        policy: Option<&Self>,
        input: &Value,
        host_priority: u32,
    ) -> Result<AttentionPlan, Unavailable> {
        let typed = check_attention_input(input)?;
        let operator = typed.source == AttentionSource::Operator;
        let host = |detail: String, revision: Option<String>| AttentionPlan {
            decision: AttentionDecision::Wake {
                priority: host_priority,
            },
            operator,
            decided_by: DecidedBy::Host,
            revision,
            detail: Some(detail),
        };
        let Some(policy) = policy else {
            return Ok(host(Unavailable::NoGeneration.to_string(), None));
        };
        let revision = Some(policy.revision.clone());
        let decided = match policy.call(Slot::AttentionPlan, input.clone()).await {
            Err(e) => return Ok(host(format!("{} ({})", e, e.code()), revision)),
            Ok(value) => serde_json::from_value::<AttentionDecision>(value.clone())
                .map_err(|e| format!("{e}: {value}"))
                .and_then(|d| d.validate().map(|()| d)),
        };
        Ok(match decided {
            Err(e) => host(
                format!(
                    "{} ({})",
                    Unavailable::Invalid(e.clone()),
                    "invalid_decision"
                ),
                revision,
            ),
            Ok(AttentionDecision::Wake { priority }) => AttentionPlan {
                decision: AttentionDecision::Wake { priority },
                operator,
                decided_by: DecidedBy::Hook,
                revision,
                detail: None,
            },
            // Operator attention cannot be suppressed.
            Ok(other) if operator => AttentionPlan {
                decision: AttentionDecision::Wake {
                    priority: host_priority,
                },
                operator,
                decided_by: DecidedBy::Host,
                revision,
                detail: Some(format!(
                    "operator attention cannot be suppressed (the hook said {})",
                    serde_json::to_string(&other).unwrap_or_default()
                )),
            },
            Ok(other) => AttentionPlan {
                decision: other,
                operator,
                decided_by: DecidedBy::Hook,
                revision,
                detail: None,
            },
        })
    }

    /// The review of a send (`input` checked here first); any invalid or unavailable
    /// review is `hold`.
    pub async fn review(policy: Option<&Self>, input: &Value) -> Result<Review, Unavailable> {
        check_delivery_input(input)?;
        let hold = |reason: String, revision: Option<String>| Review {
            decision: DeliveryDecision::Hold { reason },
            decided_by: DecidedBy::Host,
            revision,
        };
        let Some(policy) = policy else {
            return Ok(hold(
                format!("review unavailable: {}", Unavailable::NoGeneration.code()),
                None,
            ));
        };
        let revision = Some(policy.revision.clone());
        Ok(
            match policy.call(Slot::DeliveryReview, input.clone()).await {
                Err(e) => hold(format!("review unavailable: {}", e.code()), revision),
                Ok(value) => match serde_json::from_value::<DeliveryDecision>(value) {
                    Ok(decision) => Review {
                        decision,
                        decided_by: DecidedBy::Hook,
                        revision,
                    },
                    Err(_) => hold("review unavailable: invalid_decision".into(), revision),
                },
            },
        )
    }
}

/// The `attention.plan` input: typed, `event_id >= 1`.
///
/// # Errors
/// [`Unavailable::Input`].
pub fn check_attention_input(input: &Value) -> Result<AttentionInput, Unavailable> {
    let typed: AttentionInput =
        serde_json::from_value(input.clone()).map_err(|e| Unavailable::Input(e.to_string()))?;
    if typed.event_id == 0 {
        return Err(Unavailable::Input("event_id must be positive".into()));
    }
    Ok(typed)
}

/// The `delivery.review` input: typed, text at most [`REVIEW_TEXT_MAX_BYTES`].
///
/// # Errors
/// [`Unavailable::Input`].
pub fn check_delivery_input(input: &Value) -> Result<DeliveryInput, Unavailable> {
    let typed: DeliveryInput =
        serde_json::from_value(input.clone()).map_err(|e| Unavailable::Input(e.to_string()))?;
    if typed.text.len() > REVIEW_TEXT_MAX_BYTES {
        return Err(Unavailable::Input(format!(
            "text of {} bytes exceeds {REVIEW_TEXT_MAX_BYTES}",
            typed.text.len()
        )));
    }
    if typed.effect_id.is_empty() {
        return Err(Unavailable::Input("effect_id must not be empty".into()));
    }
    Ok(typed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn without_a_policy_operator_attention_wakes_and_a_review_holds() {
        let plan = Policy::attention(
            None,
            &json!({"event_id": 1, "source": "operator", "received_at_ms": 0}),
            HOST_WAKE_PRIORITY,
        )
        .await
        .unwrap();
        assert_eq!(plan.decision, AttentionDecision::Wake { priority: 0 });
        assert!(plan.operator);
        assert_eq!(plan.decided_by, DecidedBy::Host);
        let review = Policy::review(
            None,
            &json!({"effect_id": "e1", "destination": "operator", "text": "hi"}),
        )
        .await
        .unwrap();
        assert!(matches!(review.decision, DeliveryDecision::Hold { .. }));
    }

    #[tokio::test]
    async fn inputs_are_checked_before_any_call() {
        for bad in [
            json!({"event_id": 0, "source": "operator", "received_at_ms": 0}),
            json!({"event_id": 1, "source": "email", "received_at_ms": 0}),
            json!({"event_id": 1, "source": "operator", "received_at_ms": -1}),
            json!({"event_id": 1, "source": "operator", "received_at_ms": 0, "x": 1}),
        ] {
            assert_eq!(
                Policy::attention(None, &bad, 0).await.unwrap_err().code(),
                "invalid_input",
                "{bad}"
            );
        }
        let long = "x".repeat(REVIEW_TEXT_MAX_BYTES + 1);
        let at = "x".repeat(REVIEW_TEXT_MAX_BYTES);
        let input = |text: &str| json!({"effect_id": "e", "destination": "operator", "text": text});
        assert!(Policy::review(None, &input(&at)).await.is_ok());
        assert_eq!(
            Policy::review(None, &input(&long))
                .await
                .unwrap_err()
                .code(),
            "invalid_input"
        );
        assert!(
            Policy::review(
                None,
                &json!({"effect_id": "e", "destination": "peer", "text": ""})
            )
            .await
            .is_err()
        );
    }
}
