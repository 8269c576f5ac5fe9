//! Core's launch configuration (`CONTRACT_CORE_CONFIG`, `docs/launch-contract.md`
//! "Core under test"; shape in `docs/core-api.md`).
//!
//! ```json
//! { "timers": { "written_receipt_ms": 30000, "cancel_confirm_ms": 15000,
//!               "heartbeat_interval_ms": 30000, "preparation_retry_ms": 1000,
//!               "credential_recheck_ms": 1000, "http_write_stall_ms": 30000 },
//!   "engine_profiles": { "controlled": { "web_search_control": false, "text_verbosity": false } },
//!   "limits": { "events_per_turn": 100000, "response_bytes_in_flight": 67108864 } }
//! ```
//!
//! Every key is optional; unknown keys, duplicate keys and `null` are errors naming
//! the key.

use crate::core_runtime::store::EVENTS_PER_TURN_MAX;
use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::admission::EngineProfile;
use super::http::RESPONSE_BYTES_IN_FLIGHT_MAX;
use crate::core_runtime::daemon::config::TIMER_CEILING_MS;
use crate::core_runtime::wire::limits::{CANCEL_CONFIRM_TIMEOUT, WRITTEN_RECEIPT_TIMEOUT};
use crate::wire::WireError;

/// Default heartbeat interval announced by bootstrap (Core policy): 30 s.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// Default delay before a Turn left queued by `preparation_capacity` is retried
/// ("Preparation and execution order": "leaves the queued Turn unclaimed for a Worker
/// to retry"): 1 s.
pub const DEFAULT_PREPARATION_RETRY: Duration = Duration::from_secs(1);

/// Default interval at which Core re-reads the revocation state of every live daemon
/// connection's credential (Core policy): 1 s. A credential revoked through the public
/// API ends its connections at once; one revoked by `core credential revoke` (another
/// process writing the same database) ends them within this interval.
pub const DEFAULT_CREDENTIAL_RECHECK: Duration = Duration::from_secs(1);

/// Bound on engine profiles in one configuration.
pub const ENGINE_PROFILES_MAX: usize = 64;

/// Core timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreTimers {
    /// Wait for `written` from delivery start ("Active-input receipts": 30 s).
    pub written_receipt: Duration,
    /// Wait for the cancel receipt ("Active-input receipts": 15 s → `cancel_unconfirmed`).
    pub cancel_confirm: Duration,
    /// Heartbeat interval announced by bootstrap.
    pub heartbeat_interval: Duration,
    /// Retry delay after `preparation_capacity`.
    pub preparation_retry: Duration,
    /// Interval of the revocation re-check of live daemon connections
    /// ([`DEFAULT_CREDENTIAL_RECHECK`]).
    pub credential_recheck: Duration,
    /// How long an HTTP answer may wait for its reader to accept any byte before the
    /// connection is dropped ([`super::HTTP_WRITE_STALL_TIMEOUT`]).
    pub http_write_stall: Duration,
}

impl Default for CoreTimers {
    fn default() -> Self {
        Self {
            written_receipt: WRITTEN_RECEIPT_TIMEOUT,
            cancel_confirm: CANCEL_CONFIRM_TIMEOUT,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            preparation_retry: DEFAULT_PREPARATION_RETRY,
            credential_recheck: DEFAULT_CREDENTIAL_RECHECK,
            http_write_stall: super::HTTP_WRITE_STALL_TIMEOUT,
        }
    }
}

/// The validated Core configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoreConfig {
    /// Timers.
    pub timers: CoreTimers,
    /// `limits.events_per_turn`: the Turn event bound, 1..=[`EVENTS_PER_TURN_MAX`]
    /// (lowered by tests of the bound); `None` is [`EVENTS_PER_TURN_MAX`].
    pub events_per_turn: Option<u64>,
    /// `limits.response_bytes_in_flight`: the budget of answer bytes held for readers,
    /// 1..=[`RESPONSE_BYTES_IN_FLIGHT_MAX`] (lowered by tests of the bound); `None` is
    /// [`RESPONSE_BYTES_IN_FLIGHT_MAX`].
    pub response_bytes_in_flight: Option<usize>,
    /// Engine profile per agent kind (absent = no optional control declared).
    pub engine_profiles: BTreeMap<String, EngineProfile>,
}

/// A configuration error; [`CoreConfigError::code`] is stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreConfigError {
    /// Unreadable file.
    #[error("cannot read the Core configuration: {0}")]
    Unreadable(String),
    /// Unknown key.
    #[error("unknown configuration key `{key}` at {path}")]
    UnknownKey {
        /// Path of the object.
        path: String,
        /// The key.
        key: String,
    },
    /// Malformed, wrong type, duplicate key, null, out of range.
    #[error("invalid Core configuration: {0}")]
    Invalid(String),
}

impl CoreConfigError {
    /// Stable code.
    pub fn code(&self) -> &'static str {
        match self {
            CoreConfigError::Unreadable(_) => "unreadable_configuration",
            CoreConfigError::UnknownKey { .. } => "unknown_configuration_key",
            CoreConfigError::Invalid(_) => "invalid_configuration",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    timers: Option<RawTimers>,
    #[serde(default)]
    engine_profiles: Option<BTreeMap<String, EngineProfile>>,
    #[serde(default)]
    limits: Option<RawLimits>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    events_per_turn: Option<u64>,
    response_bytes_in_flight: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTimers {
    written_receipt_ms: Option<u64>,
    cancel_confirm_ms: Option<u64>,
    heartbeat_interval_ms: Option<u64>,
    preparation_retry_ms: Option<u64>,
    credential_recheck_ms: Option<u64>,
    http_write_stall_ms: Option<u64>,
}

fn timer(key: &str, value: Option<u64>, default: Duration) -> Result<Duration, CoreConfigError> {
    match value {
        None => Ok(default),
        Some(ms) if (1..=TIMER_CEILING_MS).contains(&ms) => Ok(Duration::from_millis(ms)),
        Some(ms) => Err(CoreConfigError::Invalid(format!(
            "timers.{key}: {ms} is outside 1..={TIMER_CEILING_MS} ms"
        ))),
    }
}

impl CoreConfig {
    /// Parses a configuration document.
    ///
    /// # Errors
    /// Any [`CoreConfigError`].
    pub fn parse(bytes: &[u8]) -> Result<Self, CoreConfigError> {
        let raw: Raw = crate::wire::decode_strict(bytes).map_err(|e| match e {
            WireError::UnknownField { path, field } => {
                CoreConfigError::UnknownKey { path, key: field }
            }
            other => CoreConfigError::Invalid(other.to_string()),
        })?;
        let d = CoreTimers::default();
        let t = raw.timers.unwrap_or_default();
        let limits = raw.limits.unwrap_or_default();
        let profiles = raw.engine_profiles.unwrap_or_default();
        if profiles.len() > ENGINE_PROFILES_MAX {
            return Err(CoreConfigError::Invalid(format!(
                "engine_profiles: more than {ENGINE_PROFILES_MAX}"
            )));
        }
        Ok(Self {
            timers: CoreTimers {
                written_receipt: timer(
                    "written_receipt_ms",
                    t.written_receipt_ms,
                    d.written_receipt,
                )?,
                cancel_confirm: timer("cancel_confirm_ms", t.cancel_confirm_ms, d.cancel_confirm)?,
                heartbeat_interval: timer(
                    "heartbeat_interval_ms",
                    t.heartbeat_interval_ms,
                    d.heartbeat_interval,
                )?,
                preparation_retry: timer(
                    "preparation_retry_ms",
                    t.preparation_retry_ms,
                    d.preparation_retry,
                )?,
                credential_recheck: timer(
                    "credential_recheck_ms",
                    t.credential_recheck_ms,
                    d.credential_recheck,
                )?,
                http_write_stall: timer(
                    "http_write_stall_ms",
                    t.http_write_stall_ms,
                    d.http_write_stall,
                )?,
            },
            engine_profiles: profiles,
            response_bytes_in_flight: match limits.response_bytes_in_flight {
                None => None,
                Some(n) if (1..=RESPONSE_BYTES_IN_FLIGHT_MAX as u64).contains(&n) => {
                    usize::try_from(n).ok()
                }
                Some(n) => {
                    return Err(CoreConfigError::Invalid(format!(
                        "limits.response_bytes_in_flight: {n} is outside \
                         1..={RESPONSE_BYTES_IN_FLIGHT_MAX}"
                    )));
                }
            },
            events_per_turn: match limits.events_per_turn {
                None => None,
                Some(n) if (1..=EVENTS_PER_TURN_MAX).contains(&n) => Some(n),
                Some(n) => {
                    return Err(CoreConfigError::Invalid(format!(
                        "limits.events_per_turn: {n} is outside 1..={EVENTS_PER_TURN_MAX}"
                    )));
                }
            },
        })
    }

    /// Reads and parses a configuration file.
    ///
    /// # Errors
    /// Any [`CoreConfigError`].
    pub fn load(path: &std::path::Path) -> Result<Self, CoreConfigError> {
        let bytes = std::fs::read(path)
            .map_err(|e| CoreConfigError::Unreadable(format!("{}: {e}", path.display())))?;
        Self::parse(&bytes)
    }

    /// The engine profile of an agent kind.
    pub fn profile(&self, agent_kind: &str) -> EngineProfile {
        self.engine_profiles
            .get(agent_kind)
            .copied()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_bound_is_lowered_within_its_range() {
        let parse = |n: u64| {
            CoreConfig::parse(format!(r#"{{"limits":{{"events_per_turn":{n}}}}}"#).as_bytes())
        };
        assert_eq!(parse(3).unwrap().events_per_turn, Some(3));
        assert_eq!(
            parse(EVENTS_PER_TURN_MAX).unwrap().events_per_turn,
            Some(EVENTS_PER_TURN_MAX)
        );
        assert!(parse(0).is_err());
        assert!(parse(EVENTS_PER_TURN_MAX + 1).is_err());
        assert_eq!(CoreConfig::parse(b"{}").unwrap().events_per_turn, None);
    }

    #[test]
    fn the_answer_budget_is_lowered_within_its_range() {
        let parse = |n: u64| {
            CoreConfig::parse(
                format!(r#"{{"limits":{{"response_bytes_in_flight":{n}}}}}"#).as_bytes(),
            )
        };
        let max = RESPONSE_BYTES_IN_FLIGHT_MAX as u64;
        assert_eq!(
            parse(4 * 1024 * 1024).unwrap().response_bytes_in_flight,
            Some(4 * 1024 * 1024)
        );
        assert_eq!(
            parse(max).unwrap().response_bytes_in_flight,
            Some(RESPONSE_BYTES_IN_FLIGHT_MAX)
        );
        assert_eq!(parse(0).unwrap_err().code(), "invalid_configuration");
        assert_eq!(parse(max + 1).unwrap_err().code(), "invalid_configuration");
        assert_eq!(
            CoreConfig::parse(b"{}").unwrap().response_bytes_in_flight,
            None
        );
    }

    #[test]
    fn defaults_overrides_and_unknown_keys() {
        assert_eq!(CoreConfig::parse(b"{}").unwrap(), CoreConfig::default());
        let c = CoreConfig::parse(
            br#"{"timers":{"written_receipt_ms":50,"cancel_confirm_ms":60,"heartbeat_interval_ms":70,"preparation_retry_ms":80,"credential_recheck_ms":90},
                "engine_profiles":{"controlled":{"text_verbosity":true}}}"#,
        )
        .unwrap();
        assert_eq!(c.timers.written_receipt, Duration::from_millis(50));
        assert_eq!(c.timers.preparation_retry, Duration::from_millis(80));
        assert_eq!(c.timers.credential_recheck, Duration::from_millis(90));
        assert!(c.profile("controlled").text_verbosity);
        assert!(!c.profile("other").text_verbosity);
        let err = CoreConfig::parse(br#"{"timers":{"nope":1}}"#).unwrap_err();
        assert_eq!(
            err,
            CoreConfigError::UnknownKey {
                path: "$.timers".into(),
                key: "nope".into()
            }
        );
        assert_eq!(
            CoreConfig::parse(br#"{"x":1}"#).unwrap_err().code(),
            "unknown_configuration_key"
        );
        assert_eq!(
            CoreConfig::parse(br#"{"timers":{"written_receipt_ms":0}}"#)
                .unwrap_err()
                .code(),
            "invalid_configuration"
        );
        assert_eq!(
            CoreConfig::parse(br#"{"timers":null}"#).unwrap_err().code(),
            "invalid_configuration"
        );
    }
}
