//! The Core ↔ Runtime family (`core-runtime-protocol`): its codec, the two peers the
//! harness plays and their launch contracts (`docs/launch-contract.md`).
//!
//! * Side `runtime` ([`runtime_side`]): the Runtime under test; the harness plays Core
//!   (the scripted Core of [`crate::transport::http`]) and drives the Runtime's
//!   controlled adapter over the control channel ([`crate::transport::control`]).
//! * Side `core` ([`core_side`], [`core_api`]): Core under test; the harness plays the
//!   Runtime and the user (`api:` steps).
//!
//! Both sides run on the step engine ([`crate::drive`]); this module holds only what is
//! Core ↔ Runtime: the Envelope codec ([`codec`]), the bootstrap/connect handshake, the
//! controlled adapter, Core's public API and the golden masks ([`masks`]). It never
//! renders or compares goldens and never prints.

pub mod codec;
pub mod core_api;
pub mod core_side;
pub mod link;
pub mod masks;
pub mod requires;
pub mod runtime_side;
pub mod steps;

use serde_json::{Map, Value, json};

use contract_impl::core_runtime::wire::limits::TRANSPORT_FRAME_MAX_BYTES;

use crate::drive::{self, DriveOptions, DriveOutcome};
use crate::scenario::model::{Scenario, Side};
use crate::transport::ws::WsLimits;

/// The family's name (scenario directory and `--family` value).
pub const FAMILY: &str = "core_runtime";

/// The machine-connection bootstrap route ("Machine connection" of the spec).
pub const BOOTSTRAP_PATH: &str = "/api/v1/agent-daemon/bootstrap";

/// The machine-connection WebSocket route.
pub const WS_PATH: &str = "/api/v1/agent-daemon/ws";

/// The bounds of every WebSocket of this family: incoming messages at the protocol's
/// transport bound; outgoing up to twice that, so a scenario can send an oversized
/// message on purpose.
pub const WS_LIMITS: WsLimits = WsLimits {
    max_message_bytes: TRANSPORT_FRAME_MAX_BYTES,
    max_outgoing_bytes: 2 * TRANSPORT_FRAME_MAX_BYTES,
};

/// The device ID every launched target presents or is told (`CONTRACT_DEVICE_ID`).
/// Fixed, so that goldens are stable; each run has its own peer, so runs never collide.
pub const DEVICE_ID: &str = "contract-device-1";

/// Default Environment ID of the launch configuration.
pub const ENVIRONMENT_ID: &str = "00000000-0000-4000-8000-000000000001";

/// Heartbeat interval the scripted Core announces by default (ms): long enough that no
/// periodic heartbeat interleaves with a scenario unless the scenario asks for one.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 3_600_000;

/// Keys whose values the target generates, per side: [`GENERATED_KEYS`] for a Runtime,
/// [`masks::CORE_GENERATED_KEYS`] for Core.
pub fn generated_keys(side: Side) -> &'static [&'static str] {
    match side {
        Side::Core => masks::CORE_GENERATED_KEYS,
        _ => GENERATED_KEYS,
    }
}

/// Keys whose values a target Runtime generates; goldens replace them by stable aliases.
pub const GENERATED_KEYS: &[&str] = &[
    "executor_id",
    "admission_handle",
    "runtime_version",
    "run_id",
    "session_id",
    "connection_id",
    "traceparent",
    "tracestate",
    // The spec names expiry a generated value; a Runtime may report the time left at
    // any instant, so its number is never a golden's (scenarios bound it instead).
    "expires_in_ms",
];

/// Drives `scenario` with `side` as the target, on the step engine.
pub async fn drive(scenario: &Scenario, side: Side, opts: &DriveOptions) -> DriveOutcome {
    let exit_first = drive::expects_exit_first(scenario);
    match side {
        Side::Runtime => {
            drive::drive(
                scenario,
                opts,
                runtime_side::start(scenario, opts, exit_first),
            )
            .await
        }
        Side::Core => drive::drive(scenario, opts, core_side::start(scenario, opts)).await,
        other => DriveOutcome::failed(drive::Failure::outside(
            &scenario.id(),
            drive::Phase::Launch,
            drive::StepError::new(
                drive::FailureCode::UnsupportedStep,
                format!("core_runtime has no side `{other}`"),
            ),
        )),
    }
}

/// Every capability field of `AgentKindCapabilities`, each `true`.
pub(crate) fn all_capabilities() -> Value {
    serde_json::to_value(contract_impl::core_runtime::wire::AgentKindCapabilities::all(true))
        .unwrap_or_else(|_| Value::Object(Map::new()))
}

/// The default launch configuration (`docs/launch-contract.md`): Environment
/// [`ENVIRONMENT_ID`] / `self_hosted`, one available agent kind `controlled` with every
/// capability `true`. Timers and limits are left to the target's defaults.
pub fn default_launch_config() -> Value {
    json!({
        "environment": { "environment_id": ENVIRONMENT_ID, "environment_type": "self_hosted" },
        "agent_kinds": [
            { "agent_kind": "controlled", "available": true, "capabilities": all_capabilities() }
        ]
    })
}

/// The launch configuration of a target Runtime that declares `features` (`--features`
/// or its heartbeat): [`default_launch_config`] deep-merged with the scenario's
/// `config.runtime`, then every capability the target lacks declared `false` in every
/// kind where the configuration says `true`, so the target is never asked to declare
/// what it lacks (a scenario that needs it `true` says so in `requires:` and does not
/// run). Other values (a `null`, an omitted field of a `declaration_invalid_*` scenario)
/// stay as written.
pub fn launch_config_for(
    features: &std::collections::BTreeMap<String, bool>,
    overlay: Option<&Value>,
) -> Value {
    let mut config = default_launch_config();
    if let Some(overlay) = overlay {
        deep_merge(&mut config, overlay);
    }
    let kinds = config
        .get_mut("agent_kinds")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten();
    for kind in kinds {
        let Some(caps) = kind.get_mut("capabilities").and_then(Value::as_object_mut) else {
            continue;
        };
        for (name, _) in features.iter().filter(|(_, supported)| !**supported) {
            if caps.get(name) == Some(&Value::Bool(true)) {
                caps.insert(name.clone(), Value::Bool(false));
            }
        }
    }
    config
}

/// The placeholder bound before the first step to the capabilities the launch
/// configuration declares for kind `controlled` (side runtime: what the target must
/// declare; side core: what the harness declares), so a scenario on the default
/// declaration asserts a complete heartbeat without spelling out its values.
pub const DECLARED_CAPABILITIES: &str = "declared_capabilities";

/// The capabilities `launch` (a launch configuration) declares for kind `controlled`
/// (`null` when it declares no such kind).
pub fn declared_capabilities(launch: &Value) -> Value {
    launch
        .get("agent_kinds")
        .and_then(Value::as_array)
        .and_then(|kinds| {
            kinds
                .iter()
                .find(|k| k.get("agent_kind").and_then(Value::as_str) == Some("controlled"))
        })
        .and_then(|k| k.get("capabilities"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Deep-merges `overlay` into `base`: objects merge key by key, recursively; any other
/// value (arrays included) replaces the base value.
pub fn deep_merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(base), Value::Object(overlay)) => {
            for (key, value) in overlay {
                match base.get_mut(key) {
                    Some(existing) => deep_merge(existing, value),
                    None => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, overlay) => *base = overlay.clone(),
    }
}

/// Drive options whose target is this very test executable running only the test
/// `test_path` with `env` set (how the side tests start a fake peer process).
#[cfg(test)]
pub(crate) fn self_as_target(env: &str, test_path: &str) -> DriveOptions {
    let exe = std::env::current_exe().unwrap();
    DriveOptions {
        target_cmd: format!(
            "env {env} {} --exact {test_path} --nocapture --test-threads 1",
            shell_words::quote(&exe.display().to_string())
        ),
        step_timeout: std::time::Duration::from_millis(1500),
        startup_timeout: std::time::Duration::from_secs(20),
        vendor: false,
        peer_exe: None,
        features: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_deep_and_arrays_replace() {
        let mut base = default_launch_config();
        deep_merge(
            &mut base,
            &json!({"timers": {"admission_expiry_ms": 200}, "environment": {"environment_type": "none"}}),
        );
        assert_eq!(base["environment"]["environment_id"], ENVIRONMENT_ID);
        assert_eq!(base["environment"]["environment_type"], "none");
        assert_eq!(base["timers"]["admission_expiry_ms"], 200);
        deep_merge(&mut base, &json!({"agent_kinds": []}));
        assert_eq!(base["agent_kinds"], json!([]));
    }

    #[test]
    fn merge_passes_nulls_through() {
        let mut base = default_launch_config();
        deep_merge(
            &mut base,
            &json!({"agent_kinds": [{"agent_kind": "k", "available": true, "capabilities": {"resume": null}}], "timers": null}),
        );
        assert_eq!(
            base["agent_kinds"][0]["capabilities"]["resume"],
            Value::Null
        );
        assert_eq!(base["timers"], Value::Null);
        let text = serde_json::to_string(&base).unwrap();
        assert!(text.contains("\"resume\":null"), "{text}");
    }

    #[test]
    fn default_capabilities_are_complete() {
        let config = default_launch_config();
        let caps = config["agent_kinds"][0]["capabilities"]
            .as_object()
            .unwrap();
        assert!(caps.len() >= 10, "{caps:?}");
        assert!(caps.values().all(|v| v == &Value::Bool(true)));
        assert!(caps.contains_key("streaming"));
    }
}
