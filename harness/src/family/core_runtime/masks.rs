//! What goldens of side `core` mask: values Core generates (IDs aliased by the golden
//! renderer), its clock readings and its listening address. Pure functions.

use serde_json::Value;

/// Keys whose values Core generates (IDs, clocks, its own address); goldens replace them
/// by stable aliases unless a placeholder bound them.
pub const CORE_GENERATED_KEYS: &[&str] = &[
    "id",
    "agent_id",
    "session_id",
    "turn_id",
    "run_id",
    "input_id",
    "delivery_id",
    "interaction_id",
    "traceparent",
    "tracestate",
];

/// Keys whose values are clock readings of Core (ms since the epoch): recorded as
/// [`CLOCK_MASK`], since two readings may or may not coincide from run to run (aliasing
/// them by value would make goldens flaky).
pub const CLOCK_KEYS: &[&str] = &[
    "created_at_ms",
    "updated_at_ms",
    "recorded_at_ms",
    "revoked_at_ms",
];

/// What a clock reading is recorded as.
pub const CLOCK_MASK: &str = "<clock>";

/// What the address part of a `connection_url` is recorded as: Core listens on a port
/// the OS picks (a new one after each `crash`), and only the rest of the URL is Core's
/// choice.
pub const ADDRESS_MASK: &str = "<core-address>";

/// `url` with its `host:port` replaced by [`ADDRESS_MASK`] (`ws://<core-address>/…`).
pub fn mask_address(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let path = rest.find('/').map_or("", |i| &rest[i..]);
            format!("{scheme}://{ADDRESS_MASK}{path}")
        }
        None => url.to_string(),
    }
}

/// `value` with every number under a [`CLOCK_KEYS`] key replaced by [`CLOCK_MASK`] and
/// the address in every `connection_url` string masked ([`mask_address`]).
pub fn mask_clocks(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let masked = match v {
                        Value::Number(_) if CLOCK_KEYS.contains(&k.as_str()) => {
                            Value::String(CLOCK_MASK.into())
                        }
                        Value::String(url) if k == "connection_url" => {
                            Value::String(mask_address(url))
                        }
                        _ => mask_clocks(v),
                    };
                    (k.clone(), masked)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(mask_clocks).collect()),
        other => other.clone(),
    }
}

/// What the capability declaration of each kind in a Runtime's heartbeat is recorded as
/// (side `runtime`). The declaration follows the target's features (`--features` or its
/// heartbeat), and the steps assert it wherever it is the contract (`handshake`: exactly
/// the launch configuration's; `$declared_capabilities`; a literal declaration), so the
/// golden leaves it out and a target lacking a capability does not differ from the
/// reference in every heartbeat.
pub const DECLARATION_MASK: &str = "<declared capabilities>";

/// `frame` with every `capabilities` object of a heartbeat's `supported_agent_kinds`
/// replaced by [`DECLARATION_MASK`]; any other frame unchanged.
pub fn mask_declarations(frame: &Value) -> Value {
    let mut frame = frame.clone();
    if frame.get("type").and_then(Value::as_str) == Some("heartbeat")
        && let Some(kinds) = frame
            .pointer_mut("/payload/supported_agent_kinds")
            .and_then(Value::as_array_mut)
    {
        for kind in kinds {
            if let Some(caps) = kind.get_mut("capabilities")
                && caps.is_object()
            {
                *caps = Value::String(DECLARATION_MASK.into());
            }
        }
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clocks_are_masked_at_any_depth() {
        let v = json!({"created_at_ms": 5, "events": [{"recorded_at_ms": 7, "sequence": 1}], "updated_at_ms": "x"});
        assert_eq!(
            mask_clocks(&v),
            json!({"created_at_ms": CLOCK_MASK, "events": [{"recorded_at_ms": CLOCK_MASK, "sequence": 1}], "updated_at_ms": "x"})
        );
    }

    #[test]
    fn addresses_are_masked() {
        assert_eq!(
            mask_address("ws://127.0.0.1:4711/api/v1/agent-daemon/ws"),
            "ws://<core-address>/api/v1/agent-daemon/ws"
        );
        assert_eq!(mask_address("ws://h:1"), "ws://<core-address>");
        assert_eq!(mask_address("nonsense"), "nonsense");
        assert_eq!(
            mask_clocks(&json!({"body": {"connection_url": "ws://a:1/x"}})),
            json!({"body": {"connection_url": "ws://<core-address>/x"}})
        );
    }

    #[test]
    fn heartbeat_declarations_are_masked_and_nothing_else() {
        let hb = serde_json::json!({"type": "heartbeat", "id": "hb-1", "payload": {
            "runtime_version": "v",
            "supported_agent_kinds": [{"agent_kind": "k", "available": true,
                "capabilities": {"usage": false}}]}});
        let masked = mask_declarations(&hb);
        assert_eq!(
            masked["payload"]["supported_agent_kinds"][0]["capabilities"],
            DECLARATION_MASK
        );
        assert_eq!(
            masked["payload"]["supported_agent_kinds"][0]["available"],
            true
        );
        let other = serde_json::json!({"type": "done", "payload": {"capabilities": {"a": 1}}});
        assert_eq!(mask_declarations(&other), other);
    }
}
