//! The plugin wire for the step engine: the call frames of [`crate::rpc::frames`] on
//! `plugin.v1.PluginService`, plus the host's one frame that is not a call,
//! `{lifeline: close}` (the host's end of the plugin's stdin closes: the host is gone).

use prost_reflect::DescriptorPool;
use serde_json::Value;

use crate::drive::{Codec, Role, WireFault};
use crate::rpc::frames::{self, RpcClientCodec, RpcService};
use crate::scenario::model::Party;

/// The service every plugin call names.
pub const SERVICE: &str = "plugin.v1.PluginService";

/// The descriptor pool holding the plugin's `.proto` files (built from `proto/`).
pub fn pool() -> &'static DescriptorPool {
    contract_impl::engine::json::pool()
}

/// The plugin service, for the shared call frames.
pub static PLUGIN_SERVICE: RpcService = RpcService {
    name: SERVICE,
    pool,
};

/// Whether `frame` is the host's `{lifeline: close}`.
pub fn is_lifeline(frame: &Value) -> bool {
    frame
        .as_object()
        .is_some_and(|m| m.len() == 1 && m.get("lifeline").and_then(Value::as_str) == Some("close"))
}

/// Checks a host frame: `{lifeline: close}` or a call ([`frames::check_call`]).
///
/// # Errors
/// What is wrong, naming the key.
pub fn check_host(frame: &Value) -> Result<(), String> {
    if frame.get("lifeline").is_some() {
        return if is_lifeline(frame) {
            Ok(())
        } else {
            Err("a lifeline frame is exactly {lifeline: close}".into())
        };
    }
    frames::check_call(&PLUGIN_SERVICE, frame)
}

/// The codec of side `plugin` (the harness is the host, the client of the plugin).
#[derive(Debug, Clone, Copy)]
pub struct HostCodec;

static CALLS: RpcClientCodec = RpcClientCodec {
    service: &PLUGIN_SERVICE,
};

impl Codec for HostCodec {
    fn decode(&self, text: &str) -> Result<Value, WireFault> {
        CALLS.decode(text)
    }

    fn check_emitted(&self, frame: &Value) -> Result<(), WireFault> {
        CALLS.check_emitted(frame)
    }

    fn check_outgoing(&self, frame: &Value) -> Result<(), WireFault> {
        check_host(frame).map_err(|message| WireFault {
            code: "invalid_call".into(),
            message,
        })
    }

    fn encode(&self, frame: &Value) -> Result<String, WireFault> {
        CALLS.encode(frame)
    }

    fn may_trail(&self, _frame: &Value) -> bool {
        false
    }

    fn trailing_rule(&self) -> &'static str {
        "nothing may follow the last step: every message and status of every call is a step"
    }
}

/// The role on side `plugin`.
pub static PLUGIN_ROLE: Role = Role {
    codec: &HostCodec,
    target: Party::Plugin,
    plays: &[Party::Host],
    emitted_label: "plugin frame",
    target_name: "the plugin",
    refuses: &[(
        "crash",
        "the harness is the plugin's host: a plugin that dies is the `crash` tool, then `expect_exit`",
    )],
};

/// The scenario table's frame check.
///
/// # Errors
/// What is wrong with the frame.
pub fn check_frame(party: Party, frame: &Value) -> Result<(), String> {
    match party {
        Party::Host => check_host(frame),
        _ => frames::check_event(frame),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn host_frames_are_calls_or_the_lifeline() {
        assert!(check_host(&json!({"lifeline": "close"})).is_ok());
        assert!(check_host(&json!({"lifeline": "open"})).is_err());
        assert!(check_host(&json!({"lifeline": "close", "call": "x"})).is_err());
        assert!(check_host(&json!({"call": "l", "method": "ListTools", "request": {}})).is_ok());
        let err = check_host(&json!({"call": "l", "method": "Nope"})).unwrap_err();
        assert!(err.contains("Initialize"), "{err}");
    }
}
