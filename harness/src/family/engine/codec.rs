//! The engine wire for the step engine: the call frames of [`crate::rpc::frames`] on
//! `engine.v1.EngineService`, read on side `daemon` (the harness is the client) and on
//! side `client` (the harness is the daemon; the client's calls are the emitted frames).

use prost_reflect::DescriptorPool;
use serde_json::Value;

use crate::drive::Role;
use crate::rpc::frames::{self, RpcClientCodec, RpcServerCodec, RpcService};
use crate::scenario::model::Party;

/// The service every engine call names.
pub const SERVICE: &str = "engine.v1.EngineService";

/// The descriptor pool of the engine's `.proto` files.
pub fn pool() -> &'static DescriptorPool {
    contract_impl::engine::json::pool()
}

/// The engine service, for the shared call frames.
pub static ENGINE_SERVICE: RpcService = RpcService {
    name: SERVICE,
    pool,
};

/// Checks a client frame against the engine service ([`frames::check_call`]).
///
/// # Errors
/// What is wrong, naming the key.
pub fn check_call(frame: &Value) -> Result<(), String> {
    frames::check_call(&ENGINE_SERVICE, frame)
}

/// Checks a daemon frame's shape ([`frames::check_event`]).
///
/// # Errors
/// What is wrong.
pub fn check_event(frame: &Value) -> Result<(), String> {
    frames::check_event(frame)
}

/// The codec of side `client` (the harness is the daemon): the client's calls are
/// emitted frames, each presenting the endpoint token in its metadata (EN-CLIENT-010:
/// "Transport middleware authenticates the endpoint token from gRPC metadata"), naming
/// an `EngineService` method and carrying a request that decodes as its input; the
/// daemon's answers are sent.
pub static SERVER_CODEC: RpcServerCodec = RpcServerCodec {
    check_call,
    token_rule: Some("EN-CLIENT-010"),
    may_trail: |_| false,
    trailing_rule: "the client calls only when a control request asks it to: every call is a step",
};

/// The role on side `client`.
pub static CLIENT_ROLE: Role = Role {
    codec: &SERVER_CODEC,
    target: Party::Client,
    plays: &[Party::Daemon],
    emitted_label: "client call",
    target_name: "the client",
    refuses: &[
        (
            "send_bytes",
            "the harness is the daemon: malformed answers are `message_base64`",
        ),
        (
            "half_close",
            "a server does not half-close; `disconnect` drops the client's connections",
        ),
    ],
};

/// The role on side `daemon`.
pub static DAEMON_ROLE: Role = Role {
    codec: &RpcClientCodec {
        service: &ENGINE_SERVICE,
    },
    target: Party::Daemon,
    plays: &[Party::Client],
    emitted_label: "daemon frame",
    target_name: "the daemon",
    refuses: &[],
};

/// The scenario table's frame check.
///
/// # Errors
/// What is wrong with the frame.
pub fn check_frame(party: Party, frame: &Value) -> Result<(), String> {
    match party {
        Party::Client => check_call(frame),
        _ => check_event(frame),
    }
}
