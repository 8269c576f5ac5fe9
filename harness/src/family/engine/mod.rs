//! The engine family (`engine-protocol.md`, "RFC 0004: Local Engine Protocol"): its
//! codec and the peers the harness plays.
//!
//! * Side `daemon` ([`daemon_side`]): the daemon under test; the harness plays its
//!   client over the Unix socket with dynamic messages from `proto/`.
//! * Side `client` ([`client_side`]): the client under test; the harness plays its
//!   daemon on a Unix socket and drives the client over its control channel
//!   (`docs/engine-client-control.md`).
//!
//! Both run on the step engine ([`crate::drive`]); this module holds only what is the
//! engine protocol's. It never renders or compares goldens and never prints.

pub mod client_side;
pub mod codec;
pub mod daemon_side;

use serde_json::Value;

use crate::drive::{self, DriveOptions, DriveOutcome};
use crate::scenario::model::{Scenario, Side};

/// The family's name (scenario directory and `--family` value).
pub const FAMILY: &str = "engine";

/// Keys whose values the daemon generates (aliased in goldens): identities, plans, MACs
/// and snapshot state (which embeds them).
pub const GENERATED_KEYS: &[&str] = &["runId", "clientId", "planId", "mac", "scopeId", "state"];

/// Keys whose values the client generates on side `client` (aliased in goldens): the
/// harness's name of each call and the client's operation IDs.
pub const CLIENT_GENERATED_KEYS: &[&str] = &["call", "clientOperationId"];

/// The generated keys of `side`.
pub fn generated_keys(side: Side) -> &'static [&'static str] {
    match side {
        Side::Client => CLIENT_GENERATED_KEYS,
        _ => GENERATED_KEYS,
    }
}

/// Generated identifiers inside status messages, masked in goldens (`run-<32 hex>` →
/// `run-<id>`); the values of generated keys themselves are left to the golden's
/// placeholders and aliases.
pub fn normalize(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(mask_ids(s)),
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    // A generated value itself is named or aliased by the golden, one
                    // alias per value: masking it here would make every run the same.
                    let generated = GENERATED_KEYS.contains(&k.as_str())
                        || CLIENT_GENERATED_KEYS.contains(&k.as_str());
                    (k.clone(), if generated { v.clone() } else { normalize(v) })
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

fn mask_ids(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    'scan: while !rest.is_empty() {
        for prefix in ["run-", "client-", "op-"] {
            if let Some(tail) = rest.strip_prefix(prefix)
                && tail.len() >= 32
                && tail.as_bytes()[..32].iter().all(u8::is_ascii_hexdigit)
                && !tail
                    .as_bytes()
                    .get(32)
                    .is_some_and(u8::is_ascii_alphanumeric)
            {
                out.push_str(prefix);
                out.push_str("<id>");
                rest = &tail[32..];
                continue 'scan;
            }
        }
        let c = rest.chars().next().unwrap_or_default();
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Drives `scenario` with `side` as the target, on the step engine.
pub async fn drive(scenario: &Scenario, side: Side, opts: &DriveOptions) -> DriveOutcome {
    match side {
        Side::Daemon => drive::drive(scenario, opts, daemon_side::start(scenario, opts)).await,
        Side::Client => drive::drive(scenario, opts, client_side::start(opts)).await,
        other => DriveOutcome::failed(drive::Failure::outside(
            &scenario.id(),
            drive::Phase::Launch,
            drive::StepError::new(
                drive::FailureCode::UnsupportedStep,
                format!("the engine family has no side `{other}` in this harness yet"),
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_in_text_are_masked() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            mask_ids(&format!("unknown_run: no run run-{id}; client-{id}x ok")),
            format!("unknown_run: no run run-<id>; client-{id}x ok")
        );
        assert_eq!(mask_ids("run-short"), "run-short");
    }
}
