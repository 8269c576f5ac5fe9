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
pub const CLOCK_KEYS: &[&str] = &["created_at_ms", "updated_at_ms", "recorded_at_ms"];

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
}
