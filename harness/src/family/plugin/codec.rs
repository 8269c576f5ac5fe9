//! The plugin wire for the step engine: the call frames of [`crate::rpc::frames`] on
//! `plugin.v1.PluginService`, plus the host's frames that are not calls:
//! `{lifeline: close}` (side `plugin`: the harness, as the host, closes the plugin's
//! stdin: the host is gone) and `{stopped: true}` (side `host`: the host ended the
//! plugin's process without the plugin exiting on its own). On side `host` every host frame names the plugin
//! process it concerns: `process: N`, the N-th process the host launched in the run.

use prost_reflect::DescriptorPool;
use serde_json::Value;

use crate::drive::{Codec, Role, WireFault};
use crate::rpc::frames::{self, RpcClientCodec, RpcServerCodec, RpcService};
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

/// Whether `frame` is the side-host frame `{stopped: true, process}`.
pub fn is_stopped(frame: &Value) -> bool {
    frame.get("stopped") == Some(&Value::Bool(true))
}

/// Checks a host frame: `{lifeline: close}`, `{stopped: true}` or a call
/// ([`frames::check_call`]), each with an optional `process` (a launch number from 1, or
/// a placeholder).
///
/// # Errors
/// What is wrong, naming the key.
pub fn check_host(frame: &Value) -> Result<(), String> {
    if let Some(Value::Object(map)) = Some(frame)
        && let Some(process) = map.get("process")
    {
        let fits = process.as_u64().is_some_and(|n| n >= 1) || frames::has_placeholder(process);
        if !fits {
            return Err("`process` is the launch's number, from 1".into());
        }
        let mut rest = map.clone();
        rest.remove("process");
        return check_host(&Value::Object(rest));
    }
    if frame.get("stopped").is_some() {
        return if frame.as_object().is_some_and(|m| m.len() == 1) && is_stopped(frame) {
            Ok(())
        } else {
            Err("a stop frame is exactly {stopped: true, process}".into())
        };
    }
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

/// The codec of side `host` (the harness is the plugin, the server of the host's calls):
/// the host's calls arrive as `{call, method, auth, request, process}` (`auth`: `token`
/// when the call carries this launch's host proof, else `wrong` or `none`: the proof is
/// our encoding, PL-AUTH-001, so scenarios assert it as a `reference` value), the end of a
/// plugin process the host killed as `{stopped: true, process}`, which may also follow
/// the last step (the end of a run ends the plugin processes); the harness answers
/// `{call, message | message_base64 | status}`.
pub static PLUGIN_CODEC: RpcServerCodec = RpcServerCodec {
    check_call: check_host,
    token_rule: None,
    may_trail: |frame| {
        let mut rest = frame.clone();
        if let Some(map) = rest.as_object_mut() {
            map.remove("process");
        }
        is_stopped(&rest)
    },
    trailing_rule: "the host calls its plugin only when a control request asks it to: every call is a step",
};

/// The role on side `host`.
pub static HOST_ROLE: Role = Role {
    codec: &PLUGIN_CODEC,
    target: Party::Host,
    plays: &[Party::Plugin],
    emitted_label: "host frame",
    target_name: "the host",
    refuses: &[
        (
            "send_bytes",
            "the harness is the plugin: malformed answers are `message_base64`",
        ),
        (
            "half_close",
            "a server does not half-close; `disconnect` ends the plugin process",
        ),
        (
            "expect_close",
            "the host's end of a plugin is the frame {lifeline: close} or {stopped: true}",
        ),
    ],
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
        assert!(check_host(&json!({"lifeline": "close", "process": 2})).is_ok());
        assert!(check_host(&json!({"stopped": true, "process": "$p"})).is_ok());
        assert!(check_host(&json!({"stopped": true, "process": 0})).is_err());
        assert!(check_host(&json!({"stopped": false})).is_err());
        assert!(check_host(&json!({"call": "l", "method": "ListTools", "request": {}})).is_ok());
        let err = check_host(&json!({"call": "l", "method": "Nope"})).unwrap_err();
        assert!(err.contains("Initialize"), "{err}");
    }
}
