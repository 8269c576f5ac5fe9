//! The implemented decision slots ("Implemented decision slots"): `attention.plan` and
//! `delivery.review`, their inputs and their results.
//!
//! The spec names the fields of the inputs and results in prose; the names below are
//! our reading (`worker` catalog entries of level `reference`): `event_id`, `source`,
//! `received_at_ms`; `effect_id`, `destination`, `text`; results tagged by `action`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A decision slot. A hook worker implements exactly [`Slot::ALL`] ("exactly
/// `attention.plan`, `delivery.review` for this hook worker").
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum Slot {
    /// Whether and how urgently an event wakes the agent.
    #[serde(rename = "attention.plan")]
    AttentionPlan,
    /// Whether a local send may go out.
    #[serde(rename = "delivery.review")]
    DeliveryReview,
}

impl Slot {
    /// The implemented slots, in the spec's order.
    pub const ALL: [Slot; 2] = [Slot::AttentionPlan, Slot::DeliveryReview];

    /// The slot's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Slot::AttentionPlan => "attention.plan",
            Slot::DeliveryReview => "delivery.review",
        }
    }
}

/// Host-classified source of an event ("host-classified source (`operator`,
/// `discord.dm`, `discord.mention`, `discord.ambient`)").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AttentionSource {
    /// The operator.
    #[serde(rename = "operator")]
    Operator,
    /// A direct message.
    #[serde(rename = "discord.dm")]
    DiscordDm,
    /// A mention.
    #[serde(rename = "discord.mention")]
    DiscordMention,
    /// Ambient traffic.
    #[serde(rename = "discord.ambient")]
    DiscordAmbient,
}

/// `attention.plan` input ("positive event_id, host-classified source, nonnegative
/// receipt timestamp").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AttentionInput {
    /// The event, at least 1.
    pub event_id: u64,
    /// Who the event comes from.
    pub source: AttentionSource,
    /// When the host received it, in milliseconds since the Unix epoch.
    pub received_at_ms: u64,
}

/// `attention.plan` result ("wake with priority, defer with bounded seconds, or ignore
/// with reason").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum AttentionDecision {
    /// Wake the agent.
    Wake {
        /// Priority, 0 (lowest) upwards.
        priority: u32,
    },
    /// Look again later.
    Defer {
        /// Seconds, `> 0` and at most [`DEFER_SECONDS_MAX`].
        seconds: f64,
    },
    /// Do not wake.
    Ignore {
        /// Why.
        reason: String,
    },
}

/// Longest deferral, in seconds: the spec says only "bounded seconds"; we bound it like
/// a wait ([`super::limits::WAIT_SECONDS_MAX`]).
pub const DEFER_SECONDS_MAX: f64 = super::limits::WAIT_SECONDS_MAX;

/// The only destination of a reviewed delivery ("destination=`operator`").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Destination {
    /// The operator lane.
    Operator,
}

/// Longest message text a review sees ("bounded message text"): the returned-text bound.
pub const REVIEW_TEXT_MAX_BYTES: usize = super::limits::RETURNED_TEXT_MAX_BYTES;

/// `delivery.review` input ("effect_id, destination=`operator`, bounded message text").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeliveryInput {
    /// The send's effect ID.
    pub effect_id: String,
    /// Always `operator`.
    pub destination: Destination,
    /// The text, at most [`REVIEW_TEXT_MAX_BYTES`].
    pub text: String,
}

/// `delivery.review` result ("`allow` or `hold` with a reason").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum DeliveryDecision {
    /// The send goes out.
    Allow,
    /// The send is held.
    Hold {
        /// Why.
        reason: String,
    },
}

impl AttentionDecision {
    /// Checks the bounds typed decoding cannot: deferral seconds finite, `> 0`, at most
    /// [`DEFER_SECONDS_MAX`].
    ///
    /// # Errors
    /// The reason.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            AttentionDecision::Defer { seconds }
                if !(seconds.is_finite() && *seconds > 0.0 && *seconds <= DEFER_SECONDS_MAX) =>
            {
                Err(format!(
                    "defer seconds must be finite, > 0 and <= {DEFER_SECONDS_MAX}, got {seconds}"
                ))
            }
            _ => Ok(()),
        }
    }
}
