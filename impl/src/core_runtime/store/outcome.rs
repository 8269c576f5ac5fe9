//! The public Turn state projection ("Faults, retries and cleanup") and the
//! subordination rules of "Native failure classification". I/O-free.
//!
//! Observation reasons (`delivery_unknown`, `event_stream_incomplete`,
//! `cancel_unconfirmed`) are Core's [`CoreErrorCode`]; native evidence (the `done`
//! outcome, the error frame's `code`/`http_status`, usage, native Session ID) is kept
//! apart in [`TurnOutcome`]. The engine classification is exposed only for a `failed`
//! Turn whose Core error is `engine_failed`.

use serde::{Deserialize, Serialize};

use crate::core_runtime::wire::{EngineErrorCode, Outcome, Usage};

/// Lifecycle state of a Turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnState {
    /// Waiting for a Worker to claim it.
    Queued,
    /// Claimed on a device connection; `execution_prepare` may have been sent; no input
    /// was delivered.
    Claimed,
    /// `execution_start` may have been sent (the input may have been delivered).
    Starting,
    /// `started` received: the admission was transferred to this Turn.
    Running,
    /// `done` with outcome `completed`.
    Completed,
    /// Unsuccessful: see the Core error code.
    Failed,
    /// The cancel receipt (`applied=true`) confirmed the cancellation, or the Turn was
    /// cancelled before anything was delivered.
    Cancelled,
}

impl TurnState {
    /// The public name.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnState::Queued => "queued",
            TurnState::Claimed => "claimed",
            TurnState::Starting => "starting",
            TurnState::Running => "running",
            TurnState::Completed => "completed",
            TurnState::Failed => "failed",
            TurnState::Cancelled => "cancelled",
        }
    }

    /// Parses a stored name.
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "queued" => TurnState::Queued,
            "claimed" => TurnState::Claimed,
            "starting" => TurnState::Starting,
            "running" => TurnState::Running,
            "completed" => TurnState::Completed,
            "failed" => TurnState::Failed,
            "cancelled" => TurnState::Cancelled,
            _ => return None,
        })
    }

    /// Whether the state is final.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TurnState::Completed | TurnState::Failed | TurnState::Cancelled
        )
    }
}

/// Core's error code of a failed Turn (an orchestration/observation reason, or
/// `engine_failed` for a confirmed native failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoreErrorCode {
    /// A send whose receipt never came (start, or Core/connection lost before `started`).
    DeliveryUnknown,
    /// The Run subscription closed (disconnect, overflow, restart) before `done`.
    EventStreamIncomplete,
    /// A cancel was issued and no cancel receipt came within the confirmation budget.
    CancelUnconfirmed,
    /// `done` reported a failed native outcome.
    EngineFailed,
    /// Confirmed preparation or start failure (see `preparation_error_code`).
    PreparationFailed,
    /// The selected device's declaration lacks a required capability (see
    /// `missing_capability`); rejected before starting the operation.
    UnsupportedCapability,
}

impl CoreErrorCode {
    /// The public name.
    pub fn as_str(self) -> &'static str {
        match self {
            CoreErrorCode::DeliveryUnknown => "delivery_unknown",
            CoreErrorCode::EventStreamIncomplete => "event_stream_incomplete",
            CoreErrorCode::CancelUnconfirmed => "cancel_unconfirmed",
            CoreErrorCode::EngineFailed => "engine_failed",
            CoreErrorCode::PreparationFailed => "preparation_failed",
            CoreErrorCode::UnsupportedCapability => "unsupported_capability",
        }
    }
}

/// Facts of a Turn's outcome. Stored as JSON; every field is optional (absent =
/// not observed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnOutcome {
    /// Core's error code (failed Turns only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<CoreErrorCode>,
    /// The native outcome reported by `done`, if one was observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_outcome: Option<Outcome>,
    /// Accepted classification of the Run's `error` frame (native evidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_error_code: Option<EngineErrorCode>,
    /// Only with `connection_failed`, 100..=599.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_http_status: Option<u16>,
    /// The last `error` frame message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// Bounded preparation error category (`preparation_failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preparation_error_code: Option<String>,
    /// The capability the device lacked (`unsupported_capability`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_capability: Option<String>,
    /// The last cumulative usage snapshot (replaces, never adds up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Native Session identity (from `done` or the cancel receipt's snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_session_id: Option<String>,
    /// Partial text kept by a cancel receipt's continuity snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_text: Option<String>,
    /// Events of the Run that were not stored because the Turn's event bound
    /// ([`super::EVENTS_PER_TURN_MAX`]) was reached: the explicit truncation of the events
    /// API (the terminal `done` is always stored; room is reserved for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_dropped: Option<u64>,
}

impl TurnOutcome {
    /// The public projection: the engine classification only for a `failed` Turn whose
    /// Core error is `engine_failed` ("Session diagnostics expose the category only for
    /// failed Turns whose Core error is `engine_failed`").
    pub fn public(&self, state: TurnState) -> TurnOutcome {
        let mut out = self.clone();
        let engine =
            state == TurnState::Failed && self.error_code == Some(CoreErrorCode::EngineFailed);
        if !engine {
            out.engine_error_code = None;
            out.engine_http_status = None;
        }
        out
    }

    /// Records the classification of an `error` frame. `http_status` is kept only for
    /// `connection_failed` in 100..=599 (the wire type already enforces the range).
    pub fn record_error(
        &mut self,
        message: &str,
        code: Option<EngineErrorCode>,
        http_status: Option<u16>,
    ) {
        self.error_message = Some(message.to_string());
        self.engine_error_code = code;
        self.engine_http_status = match code {
            Some(EngineErrorCode::ConnectionFailed) => {
                http_status.filter(|s| (100..=599).contains(s))
            }
            _ => None,
        };
    }
}

impl TurnOutcome {
    /// Applies one recorded event of the Turn's journal to the outcome with the same
    /// extraction live delivery uses ([`TurnOutcome::record_error`] for `error`, the
    /// latest snapshot for `usage`): how a Turn settled from its records after a restart
    /// gets the classification of the errors it recorded ("Normal delivery and terminal
    /// journal draining use the same extraction logic"). Other kinds, and payloads that
    /// do not decode, change nothing.
    pub fn apply_recorded(&mut self, kind: &str, payload: &serde_json::Value) {
        match kind {
            "error" => {
                if let Ok(err) =
                    serde_json::from_value::<crate::core_runtime::wire::RunError>(payload.clone())
                {
                    self.record_error(err.message.as_str(), err.code, err.http_status);
                }
            }
            "usage" => {
                if let Ok(usage) = serde_json::from_value::<Usage>(payload.clone()) {
                    self.usage = Some(usage);
                }
            }
            _ => {}
        }
    }
}

/// The terminal state a `done` frame yields when no cancel was issued. A failed native
/// outcome is `failed`/`engine_failed`; the classification never turns `completed` or
/// `cancelled` into a failure.
pub fn state_from_done(outcome: Outcome) -> (TurnState, Option<CoreErrorCode>) {
    match outcome {
        Outcome::Completed => (TurnState::Completed, None),
        Outcome::Cancelled => (TurnState::Cancelled, None),
        Outcome::Failed => (TurnState::Failed, Some(CoreErrorCode::EngineFailed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification_is_exposed_only_for_engine_failures() {
        let mut o = TurnOutcome::default();
        o.record_error("boom", Some(EngineErrorCode::ConnectionFailed), Some(503));
        o.error_code = Some(CoreErrorCode::EngineFailed);
        let p = o.public(TurnState::Failed);
        assert_eq!(p.engine_error_code, Some(EngineErrorCode::ConnectionFailed));
        assert_eq!(p.engine_http_status, Some(503));
        // Cannot turn a completed Turn into a failure, nor show through another reason.
        assert_eq!(o.public(TurnState::Completed).engine_error_code, None);
        assert_eq!(o.public(TurnState::Cancelled).engine_error_code, None);
        o.error_code = Some(CoreErrorCode::EventStreamIncomplete);
        assert_eq!(o.public(TurnState::Failed).engine_error_code, None);
        o.error_code = Some(CoreErrorCode::CancelUnconfirmed);
        assert_eq!(o.public(TurnState::Failed).engine_http_status, None);
    }

    #[test]
    fn the_journal_drain_extracts_like_live_delivery() {
        let payload = serde_json::json!({"message": "upstream refused", "code": "connection_failed", "http_status": 502});
        let mut live = TurnOutcome::default();
        let err: crate::core_runtime::wire::RunError =
            serde_json::from_value(payload.clone()).unwrap();
        live.record_error(err.message.as_str(), err.code, err.http_status);
        let mut drained = TurnOutcome::default();
        drained.apply_recorded("delta", &serde_json::json!({"text": "x"}));
        drained.apply_recorded("error", &payload);
        assert_eq!(live, drained);
        assert_eq!(drained.engine_http_status, Some(502));
    }

    #[test]
    fn http_status_only_with_connection_failed() {
        let mut o = TurnOutcome::default();
        o.record_error("x", Some(EngineErrorCode::ServerError), Some(500));
        assert_eq!(o.engine_http_status, None);
        o.record_error("x", Some(EngineErrorCode::ConnectionFailed), Some(700));
        assert_eq!(o.engine_http_status, None);
        o.record_error("x", None, Some(500));
        assert_eq!((o.engine_error_code, o.engine_http_status), (None, None));
    }

    #[test]
    fn done_outcomes_map_without_classification() {
        assert_eq!(
            state_from_done(Outcome::Completed),
            (TurnState::Completed, None)
        );
        assert_eq!(
            state_from_done(Outcome::Cancelled),
            (TurnState::Cancelled, None)
        );
        assert_eq!(
            state_from_done(Outcome::Failed),
            (TurnState::Failed, Some(CoreErrorCode::EngineFailed))
        );
    }
}
