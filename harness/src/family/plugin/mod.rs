//! The plugin family (`plugin-protocol.md`, "RFC 0005: Runtime Tool Plugin Protocol"):
//! its codec and the peers the harness plays.
//!
//! * Side `plugin` ([`plugin_side`]): the plugin under test; the harness plays its host
//!   (launch environment, handshake line, calls with the host's proof).
//! * Side `host` ([`host_side`]): the host under test; the harness plays every plugin
//!   process it launches (through the relay) and drives the host's control channel.
//!
//! Runs on the step engine ([`crate::drive`]); this module holds only what is the plugin
//! protocol's. It never renders or compares goldens and never prints.

pub mod codec;
pub mod host_side;
pub mod plugin_side;

use serde_json::Value;

use crate::drive::{self, DriveOptions, DriveOutcome};
use crate::scenario::model::{Scenario, Side};

/// The family's name (scenario directory and `--family` value).
pub const FAMILY: &str = "plugin";

/// Keys whose values the plugin chooses freely (aliased in goldens): the PIDs it reports.
pub const GENERATED_KEYS: &[&str] = &["pid"];

/// What a golden shows for a build identity (the plugin's or the host's: each
/// implementation's own).
pub const BUILD_MASK: &str = "<plugin build>";

/// Fields of JSON carried as text: goldens show them canonical (keys sorted, compact), so
/// spacing, key order and escapes, which the contract leaves free, never differ.
pub const JSON_TEXT_KEYS: &[&str] = &["outputJson", "inputSchemaJson", "argumentsJson"];

/// Free texts the contract does not fix, masked in goldens ([`TEXT_MASK`]): descriptions,
/// the manifest's version, progress and failure messages.
const FREE_TEXT_KEYS: &[&str] = &["description", "version"];

/// Goldens hold what the contract fixes, not each implementation's free choices: a
/// status `message` keeps only its leading snake_case code (`already_initialized: …`)
/// or is masked; progress and failure messages, descriptions and the manifest's version
/// are masked ([`TEXT_MASK`]); JSON carried as text is canonical ([`JSON_TEXT_KEYS`]);
/// the plugin's build identity is masked ([`BUILD_MASK`]).
pub fn normalize(value: &Value) -> Value {
    normalize_in(value, "")
}

fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&o[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// `parent`: the key `value` sits under.
fn normalize_in(value: &Value, parent: &str) -> Value {
    match value {
        Value::Array(a) => Value::Array(a.iter().map(|v| normalize_in(v, parent)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    let out = match (k.as_str(), v) {
                        ("pluginBuild" | "hostBuild", _) => Value::String(BUILD_MASK.into()),
                        ("message", Value::String(text)) if parent == "status" => {
                            Value::String(message_code(text))
                        }
                        ("message", Value::String(_))
                            if matches!(parent, "progress" | "failure") =>
                        {
                            Value::String(TEXT_MASK.into())
                        }
                        (key, Value::String(_)) if FREE_TEXT_KEYS.contains(&key) => {
                            Value::String(TEXT_MASK.into())
                        }
                        (key, Value::String(text)) if JSON_TEXT_KEYS.contains(&key) => {
                            match serde_json::from_str::<Value>(text) {
                                Ok(parsed) => Value::String(sorted(&parsed).to_string()),
                                Err(_) => v.clone(),
                            }
                        }
                        _ => normalize_in(v, k),
                    };
                    (k.clone(), out)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// What a golden shows for a free text without a code: the implementation's (or its
/// gRPC library's) own wording.
pub const TEXT_MASK: &str = "<text>";

/// Prefixes gRPC libraries put before their own wording, which are no contract codes
/// (grpc-go: `grpc: received message larger than max (…)`, `transport: …`): a message
/// that starts with one is masked like any other free text.
const LIBRARY_PREFIXES: &[&str] = &["grpc", "transport"];

fn message_code(text: &str) -> String {
    match text.split_once(':') {
        Some((code, _))
            if !code.is_empty()
                && !LIBRARY_PREFIXES.contains(&code)
                && code
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') =>
        {
            format!("{code}: …")
        }
        _ => TEXT_MASK.to_string(),
    }
}

/// Drives `scenario` with `side` as the target, on the step engine.
pub async fn drive(scenario: &Scenario, side: Side, opts: &DriveOptions) -> DriveOutcome {
    match side {
        Side::Plugin => drive::drive(scenario, opts, plugin_side::start(scenario, opts)).await,
        Side::Host => drive::drive(scenario, opts, host_side::start(opts)).await,
        other => DriveOutcome::failed(drive::Failure::outside(
            &scenario.id(),
            drive::Phase::Launch,
            drive::StepError::new(
                drive::FailureCode::UnsupportedStep,
                format!("the plugin family has no side `{other}` in this harness yet"),
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_keep_their_code_only() {
        let v = json!({"status": {"code": "FAILED_PRECONDITION", "message": "already_initialized: once"},
                       "progress": {"message": "step 1 of 3"}});
        assert_eq!(
            normalize(&v),
            json!({"status": {"code": "FAILED_PRECONDITION", "message": "already_initialized: …"},
                   "progress": {"message": TEXT_MASK}})
        );
        assert_eq!(
            normalize(&json!({"failure": {"message": "invalid_arguments: x"}})),
            json!({"failure": {"message": TEXT_MASK}})
        );
        // A gRPC library's own wording carries no contract code.
        for library in [
            "grpc: received message larger than max (524289 vs. 524288)",
            "transport: the stream is done",
            "Received message larger than max (524289 vs. 524288)",
        ] {
            assert_eq!(
                normalize(&json!({"status": {"code": "RESOURCE_EXHAUSTED", "message": library}})),
                json!({"status": {"code": "RESOURCE_EXHAUSTED", "message": TEXT_MASK}})
            );
        }
        assert_eq!(
            normalize(&json!({"result": {"outputJson": "{ \"b\": 1, \"a\": \"\\u0041\" }"}})),
            json!({"result": {"outputJson": "{\"a\":\"A\",\"b\":1}"}})
        );
    }
}
