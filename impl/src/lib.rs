//! Reference implementation of the runtime-contract wire protocols.
//!
//! * [`wire`]: strict JSON, identifiers and bounded types shared by every family.
//! * [`core_runtime`]: the Core ↔ Runtime daemon protocol.
//! * [`worker`]: the host ↔ Python worker protocol (wire and the Python worker).
//! * [`engine`]: the local engine protocol (its generated gRPC code and negotiation).
//! * [`plugin`]: the tool plugin protocol (its generated gRPC code, the SDK and the
//!   fixture plugin).
//! * [`process`]: process-group supervision and bounded output tails, for every host
//!   that runs programs.
//! * [`grpc`]: gRPC code shared by the gRPC families (the generated `common.v1` types,
//!   the rewrite of the decoder's refusals).
//! * [`profile`]: the `--profile` of the suite's vendor-mode trials.
//! * [`control`]: the line-oriented control channel through which a conformance harness
//!   drives our worker host and our engine client.

pub mod control;
pub mod core_runtime;
pub mod durable;
pub mod engine;
pub mod grpc;
pub mod plugin;
pub mod private_fs;
pub mod process;
pub mod profile;
pub mod wire;
pub mod worker;
