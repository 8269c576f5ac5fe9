//! What a cell reads of the decision slots ("Message vocabulary": `{"method":"hooks.list"}`,
//! `{"method":"hooks.describe","slot":"delivery.review"}`), answered from the policy the
//! cell pinned ("Each executing cell pins its policy object") and the slots' single wire
//! definition ([`crate::worker::wire::hooks`]).
//!
//! Our reading (catalog entry WK-HOST-013): the spec shows the two requests and nothing of
//! their replies; the slots are "exactly `attention.plan`, `delivery.review`" and
//! "Implemented decision slots" says what each takes and returns, so that is what these
//! answer:
//!
//! * `hooks.list`: `{revision, slots: [{slot, served_by}, …]}`, every implemented slot in
//!   the spec's order; `revision` is the pinned policy's (`null` without one) and
//!   `served_by` says who decides a call made now: `hook` while the pinned generation is
//!   live, else `host`.
//! * `hooks.describe`: `{slot, revision, served_by, input, result, without_hook}`: the JSON
//!   Schemas of the slot's input and result (generated from the wire types, so they never
//!   drift from what the host sends and accepts) and the decision the host makes itself
//!   when the hook does not decide ("Any invalid/unavailable required review holds the
//!   send"; attention wakes at the host's priority).
//!
//! A slot outside the implemented two is not a request the wire can carry (the slot is
//! typed), so neither answer can fail. This module only reads; it never calls a hook.

use serde_json::{Value, json};

use super::policy::Policy;
use super::wire::Slot;
use super::wire::hooks::{AttentionDecision, AttentionInput, DeliveryDecision, DeliveryInput};

/// Who decides a call of the slot made now.
async fn served_by(policy: Option<&Policy>) -> &'static str {
    match policy {
        Some(policy) if policy.is_live().await => "hook",
        _ => "host",
    }
}

/// The `hooks.list` value for a cell that pinned `policy`.
pub async fn list(policy: Option<&Policy>) -> Value {
    let served_by = served_by(policy).await;
    json!({
        "revision": policy.map(Policy::revision),
        "slots": Slot::ALL
            .iter()
            .map(|slot| json!({"slot": slot.as_str(), "served_by": served_by}))
            .collect::<Vec<_>>(),
    })
}

/// The `hooks.describe` value of `slot` for a cell that pinned `policy`; the host wakes
/// at `host_priority` where the attention hook does not decide.
pub async fn describe(policy: Option<&Policy>, slot: Slot, host_priority: u32) -> Value {
    let (input, result, without_hook) = match slot {
        Slot::AttentionPlan => (
            schemars::schema_for!(AttentionInput),
            schemars::schema_for!(AttentionDecision),
            json!({"action": "wake", "priority": host_priority}),
        ),
        Slot::DeliveryReview => (
            schemars::schema_for!(DeliveryInput),
            schemars::schema_for!(DeliveryDecision),
            json!({"action": "hold"}),
        ),
    };
    json!({
        "slot": slot.as_str(),
        "revision": policy.map(Policy::revision),
        "served_by": served_by(policy).await,
        "input": input,
        "result": result,
        "without_hook": without_hook,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_policy_every_slot_is_listed_and_served_by_the_host() {
        assert_eq!(
            list(None).await,
            json!({"revision": null, "slots": [
                {"slot": "attention.plan", "served_by": "host"},
                {"slot": "delivery.review", "served_by": "host"},
            ]})
        );
    }

    #[tokio::test]
    async fn a_description_holds_the_wire_schemas_and_the_hosts_own_decision() {
        let review = describe(None, Slot::DeliveryReview, 0).await;
        assert_eq!(review["slot"], "delivery.review");
        assert_eq!(review["without_hook"], json!({"action": "hold"}));
        let required = review["input"]["required"].as_array().unwrap();
        for field in ["effect_id", "destination", "text"] {
            assert!(required.contains(&json!(field)), "{field}");
        }
        assert_eq!(review["input"]["additionalProperties"], false);
        let attention = describe(None, Slot::AttentionPlan, 7).await;
        assert_eq!(
            attention["without_hook"],
            json!({"action": "wake", "priority": 7})
        );
        assert_eq!(attention["served_by"], "host");
        assert_eq!(attention["revision"], Value::Null);
        // The result schema names every action of the slot.
        let text = attention["result"].to_string();
        for action in ["wake", "defer", "ignore"] {
            assert!(text.contains(action), "{action}");
        }
        // What the description says the host sends, it does send: a valid input decodes.
        let input: AttentionInput = serde_json::from_value(
            json!({"event_id": 1, "source": "operator", "received_at_ms": 0}),
        )
        .unwrap();
        assert_eq!(input.event_id, 1);
    }
}
