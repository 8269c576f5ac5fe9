//! The plugin family (`plugin-protocol.md`, "RFC 0005: Runtime Tool Plugin Protocol"):
//! its codec and the peers the harness plays.
//!
//! * Side `plugin` ([`plugin_side`]): the plugin under test; the harness plays its host
//!   (launch environment, handshake line, calls with the host's proof).
//!
//! Runs on the step engine ([`crate::drive`]); this module holds only what is the plugin
//! protocol's. It never renders or compares goldens and never prints.

pub mod codec;
pub mod plugin_side;

use serde_json::Value;

use crate::drive::{self, DriveOptions, DriveOutcome};
use crate::scenario::model::{Scenario, Side};

/// The family's name (scenario directory and `--family` value).
pub const FAMILY: &str = "plugin";

/// Keys whose values the plugin chooses freely (aliased in goldens): the PIDs it reports.
pub const GENERATED_KEYS: &[&str] = &["pid"];

/// What a golden shows for the plugin's build identity (each implementation's own).
pub const BUILD_MASK: &str = "<plugin build>";

/// Free texts reduced to their stable code in goldens: a status or failure `message`
/// that starts with a snake_case code and `:` keeps the code (`already_initialized: …`),
/// any other is masked ([`TEXT_MASK`]): the rest is the implementation's own wording. The plugin's build identity
/// is masked ([`BUILD_MASK`]).
pub fn normalize(value: &Value) -> Value {
    normalize_in(value, false)
}

/// `free`: `value` is a status or a failure, whose `message` is free text.
fn normalize_in(value: &Value, free: bool) -> Value {
    match value {
        Value::Array(a) => Value::Array(a.iter().map(|v| normalize_in(v, false)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("message", Value::String(text)) if free => {
                        (k.clone(), Value::String(message_code(text)))
                    }
                    ("pluginBuild", _) => (k.clone(), Value::String(BUILD_MASK.into())),
                    _ => (
                        k.clone(),
                        normalize_in(v, matches!(k.as_str(), "status" | "failure")),
                    ),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// What a golden shows for a free text without a code: the implementation's (or its
/// gRPC library's) own wording.
pub const TEXT_MASK: &str = "<text>";

fn message_code(text: &str) -> String {
    match text.split_once(':') {
        Some((code, _))
            if !code.is_empty()
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
                   "progress": {"message": "step 1 of 3"}})
        );
        assert_eq!(
            normalize(&json!({"failure": {"message": "failed to decode Protobuf message: x"}})),
            json!({"failure": {"message": TEXT_MASK}})
        );
    }
}
