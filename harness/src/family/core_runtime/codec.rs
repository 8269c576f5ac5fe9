//! The Core ↔ Runtime wire for the step engine: strict JSON Envelopes, schema-checked
//! against the single definition in `contract_impl::core_runtime::wire`, one codec per
//! direction the harness reads.

use contract_impl::core_runtime::wire::Direction;
use contract_impl::core_runtime::wire::frame::validate_value;
use contract_impl::wire::{WireError, encode_strict, parse_strict};
use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::drive::{Codec, Role, WireFault};
use crate::scenario::model::Party;

/// The one frame type a target may emit after the last step without failing the
/// scenario: heartbeats are periodic by design (still schema- and credential-checked,
/// never recorded).
pub const TRAILING_ALLOWED_TYPE: &str = "heartbeat";

/// Checks a frame against the core-runtime wire schema, as sent by the party
/// `direction` names (strict JSON, known type, right direction, typed payload).
///
/// # Errors
/// The [`WireError`] of [`validate_value`].
pub fn schema_check(frame: &Value, direction: Direction) -> Result<(), WireError> {
    validate_value(frame, direction).map(|_| ())
}

fn fault(e: &WireError) -> WireFault {
    WireFault {
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

/// The codec of one side: `emitted` is the direction of the target's frames.
#[derive(Debug, Clone, Copy)]
pub struct EnvelopeCodec {
    /// Direction of what the target emits.
    pub emitted: Direction,
    /// Direction of what the harness sends.
    pub outgoing: Direction,
}

impl EnvelopeCodec {
    /// The Runtime is the target: it emits Runtime → Core, the harness sends as Core.
    pub const RUNTIME_TARGET: Self = Self {
        emitted: Direction::RuntimeToCore,
        outgoing: Direction::CoreToRuntime,
    };
    /// Core is the target: it emits Core → Runtime, the harness sends as the Runtime.
    pub const CORE_TARGET: Self = Self {
        emitted: Direction::CoreToRuntime,
        outgoing: Direction::RuntimeToCore,
    };
}

impl Codec for EnvelopeCodec {
    fn decode(&self, text: &str) -> Result<Value, WireFault> {
        parse_strict(text.as_bytes()).map_err(|e| fault(&e))
    }

    fn check_emitted(&self, frame: &Value) -> Result<(), WireFault> {
        schema_check(frame, self.emitted).map_err(|e| fault(&e))
    }

    fn check_outgoing(&self, frame: &Value) -> Result<(), WireFault> {
        schema_check(frame, self.outgoing).map_err(|e| fault(&e))
    }

    fn encode(&self, frame: &Value) -> Result<String, WireFault> {
        encode_strict(frame).map_err(|e| fault(&e))
    }

    fn may_trail(&self, frame: &Value) -> bool {
        frame.get("type").and_then(Value::as_str) == Some(TRAILING_ALLOWED_TYPE)
    }

    fn trailing_rule(&self) -> &'static str {
        "only heartbeats may follow the last step"
    }

    /// A Runtime's heartbeat declares, for kind `controlled` (the kind scenarios
    /// prepare), each optional capability ([`crate::scenario::families::CORE_RUNTIME_FEATURES`])
    /// supported or not ("Capability declarations").
    fn declared_features(&self, frame: &Value) -> Option<BTreeMap<String, bool>> {
        if self.emitted != Direction::RuntimeToCore
            || frame.get("type").and_then(Value::as_str) != Some(TRAILING_ALLOWED_TYPE)
        {
            return None;
        }
        let capabilities = super::declared_capabilities(
            &json!({"agent_kinds": frame.pointer("/payload/supported_agent_kinds")?}),
        );
        let capabilities = capabilities.as_object()?;
        Some(
            crate::scenario::families::CORE_RUNTIME_FEATURES
                .iter()
                .filter_map(|f| Some(((*f).to_string(), capabilities.get(*f)?.as_bool()?)))
                .collect(),
        )
    }
}

/// Side `runtime`: the harness plays Core.
pub static RUNTIME_ROLE: Role = Role {
    codec: &EnvelopeCodec::RUNTIME_TARGET,
    target: Party::Runtime,
    plays: &[Party::Core],
    emitted_label: "runtime frame",
    target_name: "the target",
    refuses: &[(
        "crash",
        "crash restarts a target Core; the Runtime is the target here",
    )],
};

/// Side `core`: the harness plays the Runtime.
pub static CORE_ROLE: Role = Role {
    codec: &EnvelopeCodec::CORE_TARGET,
    target: Party::Core,
    plays: &[Party::Runtime],
    emitted_label: "core frame",
    target_name: "Core",
    refuses: &[(
        "expect_exit",
        "expect_exit checks the exit of a target Runtime process; with Core as the target \
         it has no meaning (give the scenario `sides: [runtime]`)",
    )],
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_check_rejects_wrong_direction_and_unknown_type() {
        let codec = EnvelopeCodec::RUNTIME_TARGET;
        let delta = json!({"type": "delta", "id": "r", "payload": {"text": "t"}});
        assert!(codec.check_emitted(&delta).is_ok());
        let err = codec.check_outgoing(&delta).unwrap_err();
        assert_eq!(err.code, "wrong_direction");
        assert!(
            codec
                .check_emitted(&json!({"type": "nope", "id": "r", "payload": {}}))
                .is_err()
        );
        assert!(codec.may_trail(&json!({"type": "heartbeat"})));
        assert!(!codec.may_trail(&delta));
        assert_eq!(
            codec.decode("{\"a\":1,\"a\":2}").unwrap_err().code,
            "duplicate_key"
        );
    }
}
