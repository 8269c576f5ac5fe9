//! The worker wire for the step engine. A scenario writes **messages** (`{kind, …}`);
//! the connection's envelope identity (`version`, `session_id`, `generation`) is fixed
//! at launch ([`super::SESSION_ID`], [`super::GENERATION`]), so the codec wraps what the
//! harness sends and unwraps what the target emits after checking that identity, and
//! schema-checks both against the single definition in `contract_impl::worker::wire`.
//! Malformed envelopes are sent on purpose with `send_bytes`.

use contract_impl::wire::parse_strict_with_nulls;
use contract_impl::worker::wire::{Direction, Expect, WorkerWireError, decode_value};
use serde_json::{Value, json};

use super::{GENERATION, SESSION_ID};
use crate::drive::{Codec, Role, WireFault};
use crate::scenario::model::Party;

fn fault(e: &WorkerWireError) -> WireFault {
    WireFault {
        code: e.code().to_string(),
        message: e.to_string(),
    }
}

/// The envelope the connection carries `message` in.
pub fn envelope(message: &Value) -> Value {
    json!({"version": 1, "session_id": SESSION_ID, "generation": GENERATION, "message": message})
}

/// The codec of one side: `emitted` is the direction of the target's messages.
#[derive(Debug, Clone, Copy)]
pub struct MessageCodec {
    /// Direction of what the target emits.
    pub emitted: Direction,
    /// Direction of what the harness sends.
    pub outgoing: Direction,
}

impl MessageCodec {
    /// The worker is the target.
    pub const WORKER_TARGET: Self = Self {
        emitted: Direction::WorkerToHost,
        outgoing: Direction::HostToWorker,
    };

    /// The host is the target.
    pub const HOST_TARGET: Self = Self {
        emitted: Direction::HostToWorker,
        outgoing: Direction::WorkerToHost,
    };

    fn check(&self, message: &Value, direction: Direction) -> Result<(), WireFault> {
        let expect = Expect {
            session_id: SESSION_ID,
            generation: GENERATION,
            direction,
        };
        decode_value(envelope(message), Some(&expect))
            .map(|_| ())
            .map_err(|e| fault(&e))
    }
}

impl Codec for MessageCodec {
    /// Strict JSON (duplicate keys at any depth, NaN/Infinity refused), the envelope's
    /// fields and identity; returns the message.
    fn decode(&self, text: &str) -> Result<Value, WireFault> {
        let value = parse_strict_with_nulls(text.as_bytes())
            .map_err(|e| fault(&WorkerWireError::Json(e)))?;
        let expect = Expect {
            session_id: SESSION_ID,
            generation: GENERATION,
            direction: self.emitted,
        };
        decode_value(value.clone(), Some(&expect)).map_err(|e| fault(&e))?;
        Ok(value.get("message").cloned().unwrap_or(Value::Null))
    }

    fn check_emitted(&self, frame: &Value) -> Result<(), WireFault> {
        self.check(frame, self.emitted)
    }

    fn check_outgoing(&self, frame: &Value) -> Result<(), WireFault> {
        self.check(frame, self.outgoing)
    }

    fn encode(&self, frame: &Value) -> Result<String, WireFault> {
        let value = envelope(frame);
        contract_impl::worker::wire::encode_envelope(
            &decode_value(value, None).map_err(|e| fault(&e))?,
        )
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .map_err(|e| fault(&e))
    }

    /// The message inside the connection's envelope, unchecked.
    fn encode_unchecked(&self, frame: &Value) -> Result<String, WireFault> {
        serde_json::to_string(&envelope(frame)).map_err(|e| WireFault {
            code: "invalid_value".into(),
            message: e.to_string(),
        })
    }

    /// Nothing is periodic in this protocol.
    fn may_trail(&self, _frame: &Value) -> bool {
        false
    }

    fn trailing_rule(&self) -> &'static str {
        "nothing may follow the last step"
    }
}

/// Side `worker`: the harness plays the host.
pub static WORKER_ROLE: Role = Role {
    codec: &MessageCodec::WORKER_TARGET,
    target: Party::Worker,
    plays: &[Party::Host],
    emitted_label: "worker message",
    target_name: "the worker",
    refuses: &[(
        "crash",
        "crash restarts a target host (side host); on side worker the harness is the host",
    )],
};

/// Side `host`: the harness plays the workers.
pub static HOST_ROLE: Role = Role {
    codec: &MessageCodec::HOST_TARGET,
    target: Party::Host,
    plays: &[Party::Worker],
    emitted_label: "host message",
    target_name: "the host",
    refuses: &[],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_wrapped_and_unwrapped_with_the_connections_identity() {
        let codec = MessageCodec::WORKER_TARGET;
        let text = codec.encode(&json!({"kind": "shutdown"})).unwrap();
        assert_eq!(
            text,
            r#"{"version":1,"session_id":"root","generation":"g-1","message":{"kind":"shutdown"}}"#
        );
        let hello = r#"{"version":1,"session_id":"root","generation":"g-1","message":{"kind":"hello","token":"t","role":"workbench","revision":null,"slots":[]}}"#;
        assert_eq!(codec.decode(hello).unwrap()["kind"], "hello");
        let other = hello.replace("g-1", "g-2");
        assert_eq!(
            codec.decode(&other).unwrap_err().code,
            "generation_mismatch"
        );
        assert_eq!(
            codec
                .decode(r#"{"version":1,"version":1}"#)
                .unwrap_err()
                .code,
            "duplicate_key"
        );
        assert_eq!(
            codec.check_outgoing(&json!({"kind": "hello", "token": "t", "role": "workbench", "revision": null, "slots": []})).unwrap_err().code,
            "wrong_direction"
        );
        assert!(
            codec
                .check_outgoing(&json!({"kind": "execute", "id": "c1", "code": "1"}))
                .is_ok()
        );
    }
}
