//! The Runtime's launch configuration (`docs/launch-contract.md`, "Launch configuration").
//!
//! A JSON object whose keys are all optional; an absent key takes the spec's value
//! (the named constants of [`crate::core_runtime::wire::limits`]) or the daemon's own
//! policy bound below. Unknown keys, duplicate keys and `null` are errors that name the
//! offending key.
//!
//! Agent kind declarations are registered only after *every* one of them was decoded
//! strictly ("Capability declarations": "Registration validates the complete
//! declaration before changing the registry; there is no implicit base descriptor"): an
//! omitted, `null`, invalid or unknown capability field fails with
//! [`ConfigError::InvalidCapabilityDeclaration`] naming the field.

use std::collections::HashSet;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::core_runtime::wire::limits::{
    ADMISSION_EXPIRY, ADMISSION_RECORDS_MAX, AGENT_KINDS_MAX, CANCEL_CONFIRM_TIMEOUT,
    NATIVE_WRITE_TIMEOUT, RECEIPT_SEND_TIMEOUT,
};
use crate::core_runtime::wire::{
    AgentKind, AgentKindCapabilities, AgentKindDeclaration, EnvironmentType, LocalEnvironment, Uuid,
};
use crate::wire::WireError;
use crate::wire::strict::{from_value_strict, parse_strict};

/// Default Environment ID of a Runtime launched without an `environment` key.
pub const DEFAULT_ENVIRONMENT_ID: &str = "00000000-0000-4000-8000-000000000001";

/// Default agent kind registered when `agent_kinds` is absent.
pub const DEFAULT_AGENT_KIND: &str = "controlled";

/// Default first reconnect delay (daemon policy): 500 ms.
pub const DEFAULT_RECONNECT_INITIAL: Duration = Duration::from_millis(500);

/// Default reconnect delay ceiling (daemon policy): 30 s.
pub const DEFAULT_RECONNECT_MAX: Duration = Duration::from_secs(30);

/// Default time a connection must stay up before its loss resets the reconnect delay to
/// [`DEFAULT_RECONNECT_INITIAL`] (daemon policy): 10 s. A Core that accepts the upgrade
/// and drops it at once (a flapping Core) gets growing delays instead of a storm.
pub const DEFAULT_RECONNECT_HEALTHY: Duration = Duration::from_secs(10);

/// Default serial cleanup retry period (daemon policy): 1 s ("Preparation and
/// execution order": "allows a later serial retry").
pub const DEFAULT_CLEANUP_RETRY: Duration = Duration::from_secs(1);

/// Default expiry of an open `workspace_write` transfer (daemon policy): 5 minutes.
pub const DEFAULT_WRITE_TRANSFER_EXPIRY: Duration = Duration::from_secs(5 * 60);

/// Default bound on active preparations (daemon policy).
pub const DEFAULT_ACTIVE_PREPARATIONS: usize = 8;

/// Default bound on active executions (daemon policy).
pub const DEFAULT_ACTIVE_EXECUTIONS: usize = 8;

/// Default bound on retained idle Executors (daemon policy).
pub const DEFAULT_IDLE_EXECUTORS: usize = 8;

/// Hard ceiling on any configured limit, so a configuration cannot make a bounded
/// map effectively unbounded.
pub const LIMIT_CEILING: usize = 4096;

/// Hard ceiling on any configured timer: one day in milliseconds.
pub const TIMER_CEILING_MS: u64 = 24 * 60 * 60 * 1000;

/// Largest launch configuration file accepted, in bytes.
pub const CONFIG_FILE_MAX_BYTES: u64 = 1024 * 1024;

/// A launch configuration error. [`ConfigError::code`] is stable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the launch configuration: {0}")]
    Unreadable(String),
    /// A key the launch contract does not define.
    #[error("unknown configuration key `{key}` at {path}")]
    UnknownKey {
        /// JSON path of the object holding the key.
        path: String,
        /// The unknown key.
        key: String,
    },
    /// Malformed JSON, duplicate key, `null`, or a value of the wrong type.
    #[error("invalid launch configuration ({code}): {detail}")]
    Invalid {
        /// The strict-JSON error code (`duplicate_key`, `null_value`, …).
        code: &'static str,
        /// What is wrong, with its JSON path.
        detail: String,
    },
    /// A timer or limit outside its allowed range.
    #[error("invalid value for `{key}`: {reason}")]
    OutOfRange {
        /// Dotted key, e.g. `timers.admission_expiry_ms`.
        key: String,
        /// Why.
        reason: String,
    },
    /// An agent kind declaration is incomplete or invalid.
    #[error("invalid_capability_declaration: agent_kinds[{index}] field `{field}`: {reason}")]
    InvalidCapabilityDeclaration {
        /// Index in `agent_kinds`.
        index: usize,
        /// The offending field (a capability name, `agent_kind`, `available` or
        /// `capabilities`).
        field: String,
        /// Why.
        reason: String,
    },
}

impl ConfigError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ConfigError::Unreadable(_) => "unreadable_configuration",
            ConfigError::UnknownKey { .. } => "unknown_configuration_key",
            ConfigError::Invalid { .. } => "invalid_configuration",
            ConfigError::OutOfRange { .. } => "invalid_configuration",
            ConfigError::InvalidCapabilityDeclaration { .. } => "invalid_capability_declaration",
        }
    }

    fn from_wire(err: WireError) -> Self {
        match err {
            WireError::UnknownField { path, field } => ConfigError::UnknownKey { path, key: field },
            other => ConfigError::Invalid {
                code: other.code(),
                detail: other.to_string(),
            },
        }
    }
}

/// Timers (`timers` key), all in milliseconds on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// Admission expiry after `ready` (spec: five minutes; not extended by retries).
    pub admission_expiry: Duration,
    /// Bound on one native active-input write (spec: 10 s). Also bounds native
    /// decision and function-result calls.
    pub native_write: Duration,
    /// Budget of one receipt send (spec: 5 s).
    pub receipt_send: Duration,
    /// Bound on a native cancel confirmation (spec: 15 s). Also bounds one native
    /// Executor close attempt.
    pub cancel_settle: Duration,
    /// First reconnect delay; doubles up to [`Timers::reconnect_max`].
    pub reconnect_initial: Duration,
    /// Reconnect delay ceiling.
    pub reconnect_max: Duration,
    /// How long a connection must have stayed up for its loss to reset the delay.
    pub reconnect_healthy: Duration,
    /// Period of the serial cleanup retry.
    pub cleanup_retry: Duration,
    /// Expiry of an open `workspace_write` transfer.
    pub write_transfer_expiry: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            admission_expiry: ADMISSION_EXPIRY,
            native_write: NATIVE_WRITE_TIMEOUT,
            receipt_send: RECEIPT_SEND_TIMEOUT,
            cancel_settle: CANCEL_CONFIRM_TIMEOUT,
            reconnect_initial: DEFAULT_RECONNECT_INITIAL,
            reconnect_max: DEFAULT_RECONNECT_MAX,
            reconnect_healthy: DEFAULT_RECONNECT_HEALTHY,
            cleanup_retry: DEFAULT_CLEANUP_RETRY,
            write_transfer_expiry: DEFAULT_WRITE_TRANSFER_EXPIRY,
        }
    }
}

/// Resource bounds (`limits` key). "The Runtime separately bounds active
/// preparations, executions and retained idle resources" ("Preparation and
/// execution order").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Admission records per connection (spec: 64).
    pub admission_records: usize,
    /// Preparations (preparing or ready reservations, read-only profiles included).
    pub active_preparations: usize,
    /// Executions (starting or running Runs).
    pub active_executions: usize,
    /// Retained idle Executors.
    pub idle_executors: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            admission_records: ADMISSION_RECORDS_MAX,
            active_preparations: DEFAULT_ACTIVE_PREPARATIONS,
            active_executions: DEFAULT_ACTIVE_EXECUTIONS,
            idle_executors: DEFAULT_IDLE_EXECUTORS,
        }
    }
}

/// The validated launch configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    /// The Runtime's own Environment binding.
    pub environment: LocalEnvironment,
    /// Registered declarations, validated completely.
    pub agent_kinds: Vec<AgentKindDeclaration>,
    /// Timers.
    pub timers: Timers,
    /// Limits.
    pub limits: Limits,
    /// The choices the spec leaves free, as this Runtime makes them.
    pub profile: WireProfile,
}

/// Values the spec leaves to the Runtime. "Preparation and execution order": revision
/// decides the order of status observations, nothing fixes its start or step; the
/// transitions preparing → ready → starting → started are only the typical ones; reusing
/// a healthy Executor is allowed, not required; an admission expires five minutes after
/// it is granted, and `expires_in_ms` reports what remains. Heartbeats have no identity
/// rule, and the spec fixes no close code or reason. [`WireProfile::default`] is our
/// reference implementation's choice; [`WireProfile::different`] is another conformant
/// one, for checking that the conformance suite demands no more than the spec
/// (`contract-impl runtime --wire-profile different`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireProfile {
    /// The first revision of every admission handle.
    pub revision_start: u64,
    /// The step between two revisions of a handle (at least 1).
    pub revision_step: u64,
    /// Prefix of the heartbeat `Envelope.id`, followed by the count on the connection.
    pub heartbeat_id_prefix: &'static str,
    /// Publish `preparing` when a native preparation begins (else the first status of
    /// the handle is `ready`, or how the preparation ended).
    pub publish_preparing: bool,
    /// Publish `starting` when `execution_start` is accepted (else the next status is
    /// `started`, or how the start ended).
    pub publish_starting: bool,
    /// Reuse a healthy idle Executor of the same Session and configuration (else an
    /// Executor is closed as soon as its Run settled: "Executor idle expiry is the
    /// Runtime's resource policy").
    pub reuse_executors: bool,
    /// Milliseconds `expires_in_ms` understates the time left (a Runtime that measures
    /// the five minutes from an earlier instant of the grant reports less), in ms.
    pub expiry_understated_ms: u64,
    /// Text put before the wire error code in the reason of a Close the Runtime sends
    /// for a frame it rejects (the spec fixes no close reason).
    pub close_reason_prefix: &'static str,
    /// Double the reconnect delay after each failed connection, up to
    /// `timers.reconnect_max` (else every reconnect waits `timers.reconnect_initial`):
    /// "any spacing is conformant" (CR-CONN-023).
    pub reconnect_growth: bool,
    /// Retry failed Executor closes oldest failure first (else newest first): the spec
    /// fixes no order of the serial retries (CR-PREP-038).
    pub close_retry_oldest_first: bool,
    /// Keep the WebSocket open while a stop signal's Executor closes run, then close it
    /// 1001 `process_shutdown` (else close it at the signal): the spec says nothing of
    /// the connection during that wait (CR-CONN-025).
    pub keep_connection_on_signal: bool,
    /// Send `rejected` `expired` when an open workspace write transfer expires (else
    /// forget it silently): the spec fixes no notice of the expiry (CR-WS-041).
    pub announce_write_expiry: bool,
}

impl Default for WireProfile {
    fn default() -> Self {
        Self {
            revision_start: 1,
            revision_step: 1,
            heartbeat_id_prefix: "hb-",
            publish_preparing: true,
            publish_starting: true,
            reuse_executors: true,
            expiry_understated_ms: 0,
            close_reason_prefix: "",
            reconnect_growth: true,
            close_retry_oldest_first: true,
            keep_connection_on_signal: true,
            announce_write_expiry: true,
        }
    }
}

impl WireProfile {
    /// A conformant profile unlike the reference in every free choice: revisions from
    /// 100 in steps of 7, heartbeat IDs `beat-<n>`, no `preparing` or `starting`, no
    /// Executor reuse (each closed once idle), `expires_in_ms` 37 ms short of the full
    /// five minutes, close reasons `rejected: <code>`, reconnects all spaced
    /// `reconnect_initial`, failed closes retried newest failure first, the connection
    /// closed at a stop signal, and write transfers that expire silently.
    pub fn different() -> Self {
        Self {
            revision_start: 100,
            revision_step: 7,
            heartbeat_id_prefix: "beat-",
            publish_preparing: false,
            publish_starting: false,
            reuse_executors: false,
            expiry_understated_ms: 37,
            close_reason_prefix: "rejected: ",
            reconnect_growth: false,
            close_retry_oldest_first: false,
            keep_connection_on_signal: false,
            announce_write_expiry: false,
        }
    }

    /// The reason of a Close for a rejected frame whose wire error code is `code`.
    pub fn close_reason(&self, code: &str) -> String {
        format!("{}{code}", self.close_reason_prefix)
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            environment: default_environment(),
            agent_kinds: default_agent_kinds(),
            timers: Timers::default(),
            limits: Limits::default(),
            profile: WireProfile::default(),
        }
    }
}

fn default_environment() -> LocalEnvironment {
    LocalEnvironment {
        environment_id: Uuid::new(DEFAULT_ENVIRONMENT_ID).expect("constant is a canonical UUID"),
        environment_type: EnvironmentType::SelfHosted,
    }
}

fn default_agent_kinds() -> Vec<AgentKindDeclaration> {
    vec![AgentKindDeclaration {
        agent_kind: AgentKind::new(DEFAULT_AGENT_KIND).expect("constant is a valid agent kind"),
        available: true,
        capabilities: AgentKindCapabilities::all(true),
    }]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    environment: Option<LocalEnvironment>,
    #[serde(default)]
    agent_kinds: Option<Vec<Value>>,
    #[serde(default)]
    timers: Option<RawTimers>,
    #[serde(default)]
    limits: Option<RawLimits>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTimers {
    admission_expiry_ms: Option<u64>,
    native_write_ms: Option<u64>,
    receipt_send_ms: Option<u64>,
    cancel_settle_ms: Option<u64>,
    reconnect_initial_ms: Option<u64>,
    reconnect_max_ms: Option<u64>,
    reconnect_healthy_ms: Option<u64>,
    cleanup_retry_ms: Option<u64>,
    write_transfer_expiry_ms: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    admission_records: Option<usize>,
    active_preparations: Option<usize>,
    active_executions: Option<usize>,
    idle_executors: Option<usize>,
}

fn timer(key: &str, value: Option<u64>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(ms) if (1..=TIMER_CEILING_MS).contains(&ms) => Ok(Duration::from_millis(ms)),
        Some(ms) => Err(ConfigError::OutOfRange {
            key: format!("timers.{key}"),
            reason: format!("{ms} is outside 1..={TIMER_CEILING_MS} ms"),
        }),
    }
}

fn limit(key: &str, value: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match value {
        None => Ok(default),
        Some(n) if (1..=LIMIT_CEILING).contains(&n) => Ok(n),
        Some(n) => Err(ConfigError::OutOfRange {
            key: format!("limits.{key}"),
            reason: format!("{n} is outside 1..={LIMIT_CEILING}"),
        }),
    }
}

/// Validates one declaration completely (strict decoding: every capability present,
/// a boolean, and no unknown field).
///
/// # Errors
/// [`ConfigError::InvalidCapabilityDeclaration`] naming the offending field.
pub fn validate_declaration(
    index: usize,
    value: Value,
) -> Result<AgentKindDeclaration, ConfigError> {
    let invalid = |field: String, reason: String| ConfigError::InvalidCapabilityDeclaration {
        index,
        field,
        reason,
    };
    from_value_strict::<AgentKindDeclaration>(value).map_err(|err| match err {
        WireError::MissingField { field, .. } => invalid(field, "missing".into()),
        WireError::UnknownField { field, .. } => invalid(field, "unknown field".into()),
        WireError::NullValue { path } => invalid(last_segment(&path), "null".into()),
        WireError::InvalidValue { path, reason } => invalid(last_segment(&path), reason),
        other => invalid("capabilities".into(), other.to_string()),
    })
}

/// The index `i` of a path under `$.agent_kinds[i]`.
fn declaration_index(path: &str) -> Option<usize> {
    let rest = path.strip_prefix("$.agent_kinds[")?;
    rest.split(']').next()?.parse().ok()
}

fn last_segment(path: &str) -> String {
    path.rsplit('.').next().unwrap_or(path).to_string()
}

impl RuntimeConfig {
    /// Parses and validates a launch configuration document.
    ///
    /// # Errors
    /// Any [`ConfigError`].
    pub fn parse(bytes: &[u8]) -> Result<Self, ConfigError> {
        let value = parse_strict(bytes).map_err(|err| match &err {
            WireError::NullValue { path } | WireError::DuplicateKey { path, .. } => {
                match declaration_index(path) {
                    Some(index) => ConfigError::InvalidCapabilityDeclaration {
                        index,
                        field: match &err {
                            WireError::DuplicateKey { key, .. } => key.clone(),
                            _ => last_segment(path),
                        },
                        reason: err.to_string(),
                    },
                    None => ConfigError::from_wire(err),
                }
            }
            _ => ConfigError::from_wire(err),
        })?;
        let raw: RawConfig = from_value_strict(value).map_err(ConfigError::from_wire)?;
        let defaults = Timers::default();
        let t = raw.timers.unwrap_or_default();
        let timers = Timers {
            admission_expiry: timer(
                "admission_expiry_ms",
                t.admission_expiry_ms,
                defaults.admission_expiry,
            )?,
            native_write: timer("native_write_ms", t.native_write_ms, defaults.native_write)?,
            receipt_send: timer("receipt_send_ms", t.receipt_send_ms, defaults.receipt_send)?,
            cancel_settle: timer(
                "cancel_settle_ms",
                t.cancel_settle_ms,
                defaults.cancel_settle,
            )?,
            reconnect_initial: timer(
                "reconnect_initial_ms",
                t.reconnect_initial_ms,
                defaults.reconnect_initial,
            )?,
            reconnect_max: timer(
                "reconnect_max_ms",
                t.reconnect_max_ms,
                defaults.reconnect_max,
            )?,
            reconnect_healthy: timer(
                "reconnect_healthy_ms",
                t.reconnect_healthy_ms,
                defaults.reconnect_healthy,
            )?,
            cleanup_retry: timer(
                "cleanup_retry_ms",
                t.cleanup_retry_ms,
                defaults.cleanup_retry,
            )?,
            write_transfer_expiry: timer(
                "write_transfer_expiry_ms",
                t.write_transfer_expiry_ms,
                defaults.write_transfer_expiry,
            )?,
        };
        if timers.reconnect_initial > timers.reconnect_max {
            return Err(ConfigError::OutOfRange {
                key: "timers.reconnect_initial_ms".into(),
                reason: "must not exceed timers.reconnect_max_ms".into(),
            });
        }
        let d = Limits::default();
        let l = raw.limits.unwrap_or_default();
        let limits = Limits {
            admission_records: limit(
                "admission_records",
                l.admission_records,
                d.admission_records,
            )?,
            active_preparations: limit(
                "active_preparations",
                l.active_preparations,
                d.active_preparations,
            )?,
            active_executions: limit(
                "active_executions",
                l.active_executions,
                d.active_executions,
            )?,
            idle_executors: limit("idle_executors", l.idle_executors, d.idle_executors)?,
        };
        let agent_kinds = match raw.agent_kinds {
            None => default_agent_kinds(),
            Some(values) => register(values)?,
        };
        Ok(Self {
            environment: raw.environment.unwrap_or_else(default_environment),
            agent_kinds,
            timers,
            limits,
            profile: WireProfile::default(),
        })
    }

    /// Reads and parses the configuration file at `path`.
    ///
    /// # Errors
    /// [`ConfigError::Unreadable`] for I/O errors and files over
    /// [`CONFIG_FILE_MAX_BYTES`]; otherwise as [`RuntimeConfig::parse`].
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| ConfigError::Unreadable(format!("{}: {e}", path.display())))?;
        if meta.len() > CONFIG_FILE_MAX_BYTES {
            return Err(ConfigError::Unreadable(format!(
                "{}: {} bytes exceed the {CONFIG_FILE_MAX_BYTES}-byte bound",
                path.display(),
                meta.len()
            )));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| ConfigError::Unreadable(format!("{}: {e}", path.display())))?;
        Self::parse(&bytes)
    }

    /// The declaration of `kind`, if registered.
    pub fn declaration(&self, kind: &AgentKind) -> Option<&AgentKindDeclaration> {
        self.agent_kinds.iter().find(|d| &d.agent_kind == kind)
    }
}

/// Registration: validates every declaration before any is used.
fn register(values: Vec<Value>) -> Result<Vec<AgentKindDeclaration>, ConfigError> {
    if values.len() > AGENT_KINDS_MAX {
        return Err(ConfigError::OutOfRange {
            key: "agent_kinds".into(),
            reason: format!(
                "{} declarations exceed the bound of {AGENT_KINDS_MAX}",
                values.len()
            ),
        });
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(values.len());
    for (index, value) in values.into_iter().enumerate() {
        let declaration = validate_declaration(index, value)?;
        if !seen.insert(declaration.agent_kind.clone()) {
            return Err(ConfigError::InvalidCapabilityDeclaration {
                index,
                field: "agent_kind".into(),
                reason: format!("`{}` is declared twice", declaration.agent_kind),
            });
        }
        out.push(declaration);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps_json(skip: Option<&str>, extra: Option<&str>) -> String {
        let mut parts: Vec<String> = AgentKindCapabilities::FIELDS
            .iter()
            .filter(|f| Some(**f) != skip)
            .map(|f| format!("\"{f}\":true"))
            .collect();
        if let Some(e) = extra {
            parts.push(e.to_string());
        }
        format!("{{{}}}", parts.join(","))
    }

    #[test]
    fn empty_object_gives_spec_defaults() {
        let config = RuntimeConfig::parse(b"{}").unwrap();
        assert_eq!(config, RuntimeConfig::default());
        assert_eq!(config.timers.admission_expiry, Duration::from_secs(300));
        assert_eq!(config.timers.native_write, Duration::from_secs(10));
        assert_eq!(config.timers.receipt_send, Duration::from_secs(5));
        assert_eq!(config.timers.cancel_settle, Duration::from_secs(15));
        assert_eq!(config.limits.admission_records, 64);
        assert_eq!(
            config.environment.environment_id.as_str(),
            DEFAULT_ENVIRONMENT_ID
        );
        assert_eq!(config.agent_kinds.len(), 1);
        assert!(
            AgentKindCapabilities::FIELDS
                .iter()
                .all(|f| config.agent_kinds[0].capabilities.get(f) == Some(true))
        );
    }

    #[test]
    fn overrides_are_applied() {
        let config = RuntimeConfig::parse(
            br#"{"timers":{"admission_expiry_ms":200,"cleanup_retry_ms":50},"limits":{"admission_records":3}}"#,
        )
        .unwrap();
        assert_eq!(config.timers.admission_expiry, Duration::from_millis(200));
        assert_eq!(config.timers.cleanup_retry, Duration::from_millis(50));
        assert_eq!(config.timers.native_write, NATIVE_WRITE_TIMEOUT);
        assert_eq!(config.limits.admission_records, 3);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = RuntimeConfig::parse(br#"{"timers":{"teleport_ms":1}}"#).unwrap_err();
        assert_eq!(
            err,
            ConfigError::UnknownKey {
                path: "$.timers".into(),
                key: "teleport_ms".into()
            }
        );
        let err = RuntimeConfig::parse(br#"{"bogus":1}"#).unwrap_err();
        assert!(err.to_string().contains("bogus"));
        assert_eq!(
            RuntimeConfig::parse(br#"{"limits":null}"#)
                .unwrap_err()
                .code(),
            "invalid_configuration"
        );
        assert_eq!(
            RuntimeConfig::parse(br#"{"limits":{},"limits":{}}"#)
                .unwrap_err()
                .code(),
            "invalid_configuration"
        );
    }

    #[test]
    fn out_of_range_values_are_refused() {
        assert!(matches!(
            RuntimeConfig::parse(br#"{"timers":{"native_write_ms":0}}"#),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(matches!(
            RuntimeConfig::parse(br#"{"limits":{"idle_executors":0}}"#),
            Err(ConfigError::OutOfRange { .. })
        ));
        assert!(matches!(
            RuntimeConfig::parse(
                br#"{"timers":{"reconnect_initial_ms":5000,"reconnect_max_ms":100}}"#
            ),
            Err(ConfigError::OutOfRange { .. })
        ));
    }

    #[test]
    fn every_missing_or_null_capability_is_named() {
        for field in AgentKindCapabilities::FIELDS {
            let doc = format!(
                r#"{{"agent_kinds":[{{"agent_kind":"k","available":false,"capabilities":{}}}]}}"#,
                caps_json(Some(field), None)
            );
            let err = RuntimeConfig::parse(doc.as_bytes()).unwrap_err();
            assert_eq!(err.code(), "invalid_capability_declaration");
            assert!(
                matches!(&err, ConfigError::InvalidCapabilityDeclaration { field: f, .. } if f == field),
                "{err}"
            );
            let doc = format!(
                r#"{{"agent_kinds":[{{"agent_kind":"k","available":true,"capabilities":{}}}]}}"#,
                caps_json(Some(field), Some(&format!("\"{field}\":null")))
            );
            let err = RuntimeConfig::parse(doc.as_bytes()).unwrap_err();
            assert_eq!(err.code(), "invalid_capability_declaration", "{field}");
        }
    }

    #[test]
    fn unknown_capability_and_missing_object_are_rejected() {
        let doc = format!(
            r#"{{"agent_kinds":[{{"agent_kind":"k","available":true,"capabilities":{}}}]}}"#,
            caps_json(None, Some("\"teleport\":true"))
        );
        let err = RuntimeConfig::parse(doc.as_bytes()).unwrap_err();
        assert!(
            matches!(&err, ConfigError::InvalidCapabilityDeclaration { field, .. } if field == "teleport")
        );
        let err = RuntimeConfig::parse(br#"{"agent_kinds":[{"agent_kind":"k","available":true}]}"#)
            .unwrap_err();
        assert!(
            matches!(&err, ConfigError::InvalidCapabilityDeclaration { field, .. } if field == "capabilities")
        );
        let doc = format!(
            r#"{{"agent_kinds":[{{"agent_kind":"k","available":true,"capabilities":{}}}]}}"#,
            caps_json(None, None).replacen("true", "\"yes\"", 1)
        );
        assert_eq!(
            RuntimeConfig::parse(doc.as_bytes()).unwrap_err().code(),
            "invalid_capability_declaration"
        );
    }

    #[test]
    fn duplicate_kinds_are_rejected() {
        let one = format!(
            r#"{{"agent_kind":"k","available":true,"capabilities":{}}}"#,
            caps_json(None, None)
        );
        let doc = format!(r#"{{"agent_kinds":[{one},{one}]}}"#);
        let err = RuntimeConfig::parse(doc.as_bytes()).unwrap_err();
        assert!(
            matches!(&err, ConfigError::InvalidCapabilityDeclaration { index: 1, field, .. } if field == "agent_kind")
        );
    }
}
